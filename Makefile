# Tidewater's build. Every target works from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: venv kcat librdkafka-suite fuzz test test-integration proto lint typecheck demo bench bench-cluster bench-controllers bench-fetch-session bench-cli bench-log bench-cleaner sim sim-long audit \
	audit-zip spark-up spark-down bench-audit chromium

# The project's bytecode, compiled for every start: an editable install has none, and
# with PYTHONDONTWRITEBYTECODE=1 (the Dockerfile's, and some shells') each process
# compiled every module it imports anew (measured: 0.3-0.4 s of CPU per broker start).
venv: $(STAMP)
	@$(PY) -m compileall -q broker client controller proto tools audit >/dev/null

# $(call apt_tool,PACKAGE,WHAT IS SKIPPED WITHOUT IT): install a Debian package whose
# command is missing (apt-get update only when the first try fails).
apt_tool = command -v $(1) >/dev/null 2>&1 || { \
	  (apt-get install -y -q $(1) >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(1) >/dev/null 2>&1)) \
	  && echo "installed $(1) from Debian" \
	  || echo "$(1) not installed (no apt here): $(2)"; }

# kcat (Debian's, librdkafka 2.0.2) for the Kafka-client tests; where apt cannot install
# it those tests are skipped, and say so.
kcat:
	@$(call apt_tool,kcat,the kcat tests will be skipped)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel setuptools
	$(PY) -m pip install -q -e '.[dev,spark,console]'
	touch $(STAMP)

# Files are spread over TEST_WORKERS pytest-xdist workers (2; 1 runs them in one process):
# most tests wait on the real processes they start, so two at a time halve the wall time.
TEST_WORKERS ?= 2
test: venv kcat chromium librdkafka-suite
	$(PY) -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) \
	  --durations=25 $(PYTEST_ARGS) --ignore=tests/docker tests

# Only the tests that start real controller and broker processes.
test-integration: venv
	$(PY) -m pytest -q -m integration $(PYTEST_ARGS) tests/integration

# The stubs import each other as tidewater.proto.*: protoc must see the file at that path.
PROTOC_DIR := build/protoc
proto: venv
	rm -rf $(PROTOC_DIR) && mkdir -p $(PROTOC_DIR)/tidewater/proto
	cp proto/tidewater.proto $(PROTOC_DIR)/tidewater/proto/
	cd $(PROTOC_DIR) && $(CURDIR)/$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
	  --grpc_python_out=. tidewater/proto/tidewater.proto
	cp $(addprefix $(PROTOC_DIR)/tidewater/proto/,tidewater_pb2.py tidewater_pb2.pyi tidewater_pb2_grpc.py) proto/

lint: venv
	$(PY) -m ruff check .

# mypy, strict, over the packages [tool.mypy] lists in pyproject.toml. The script
# lays the folders out as tidewater/* for mypy (its docstring says why).
typecheck: venv
	$(PY) .ci/typecheck.py

demo: venv
	$(PY) -m tidewater.tools.demo --data-dir $(DEMO_DIR)

# The issue's benchmark: a 3-broker RF=3 cluster against NATS JetStream (3 nodes, R3)
# in one run. BENCH_ARGS="--quick" for ~2 minutes, "--only produce,consume" for some rows.
# Then the controller quorum benchmark (1 vs 3 controllers) and the fetch-session benchmark
# (KIP-227, docs/benchmarks.md), each on its own cluster: FETCH_SESSION_BENCH_ARGS="--polls
# 100 --rounds 2" for a quick run.
bench: bench-cluster bench-controllers bench-fetch-session bench-cli

bench-cluster: venv
	@command -v nats-server >/dev/null 2>&1 || apt-get install -y nats-server || echo "nats-server not installed: the peer will be skipped"
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/cluster_bench.py $(BENCH_ARGS)

# One controller against a quorum of three: topic creations/s, CreateTopics p50/p99, Raft
# commit latency, controller failover alone and with a partition leader (bench/controller_bench.py).
bench-controllers: venv
	$(PY) bench/controller_bench.py $(CONTROLLER_BENCH_ARGS)

FETCH_SESSION_BENCH_ARGS ?=
bench-fetch-session: venv
	$(PY) bench/fetch_session_bench.py $(FETCH_SESSION_BENCH_ARGS)

# `tide produce --acks all`, 300 MB piped, idempotent and not (bench/cli_produce_bench.py);
# CLI_BENCH_ARGS="--tide old=/other/checkout/.venv/bin/tide" adds an A/B.
CLI_BENCH_ARGS ?=
bench-cli: venv
	$(PY) bench/cli_produce_bench.py $(CLI_BENCH_ARGS)

bench-log: venv
	$(PY) bench/log_bench.py

bench-cleaner: venv
	$(PY) bench/cleaner_bench.py $(BENCH_ARGS)

# Audit the local cluster's data (make demo's .demo, else compose's ./data) with Spark.
AUDIT_DATA ?= $(if $(wildcard $(DEMO_DIR)/broker-*),$(DEMO_DIR),$(CURDIR)/data)
AUDIT_OUT ?= $(CURDIR)/build/audit
AUDIT_ARGS ?=
# SPARK_MASTER=spark://127.0.0.1:7177 (make spark-up) runs it on a standalone cluster.
SPARK_MASTER ?= local[*]
audit: venv
	$(PY) -m tidewater.tools audit $(AUDIT_DATA) --out $(AUDIT_OUT) --master '$(SPARK_MASTER)' $(AUDIT_ARGS)

# A Spark standalone cluster from the venv's pyspark: a master on 127.0.0.1:$(SPARK_PORT)
# and 2 workers (1 core, 2 GiB each) as processes; pids and logs in $(SPARK_STATE_DIR),
# stopped by those pids. `make audit SPARK_MASTER=spark://127.0.0.1:$(SPARK_PORT)`.
SPARK_STATE_DIR ?= $(CURDIR)/build/spark
SPARK_PORT ?= 7177
spark-up: venv
	$(PY) -m tidewater.audit.standalone up --state-dir $(SPARK_STATE_DIR) --port $(SPARK_PORT)

spark-down: venv
	$(PY) -m tidewater.audit.standalone down --state-dir $(SPARK_STATE_DIR)

# The audit at scale: >= 10 GiB of segments on local[2] and on a 2-worker cluster
# (BENCH_ARGS="--size-gib 1" for a quick run; see docs/benchmarks.md).
bench-audit: venv
	$(PY) bench/audit_scale_bench.py $(BENCH_ARGS)

# Headless Chromium (Debian's) for the report's screenshot test, and its WebDriver for
# the console's browser tests (tests/console); where apt cannot install them those
# tests are skipped, and say so.
chromium:
	@$(call apt_tool,chromium,the report screenshot and console browser tests will be skipped)
	@command -v chromedriver >/dev/null 2>&1 || { \
	  (apt-get install -y -q chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium-driver >/dev/null 2>&1)) \
	  && echo "installed chromium-driver from Debian" \
	  || echo "chromium-driver not installed (no apt here): the console browser tests will be skipped"; }

# librdkafka's own test suite (tests/cli/test_librdkafka_suite.py), built from Debian's
# source package of librdkafka into build/librdkafka. Where apt cannot fetch it, the
# suite's test is skipped (under CI it fails).
librdkafka-suite:
	@sh tests/librdkafka/build.sh build/librdkafka || \
	  echo "librdkafka suite not built: tests/cli/test_librdkafka_suite.py will be skipped"

# The audit package for spark-submit --py-files (README).
audit-zip: venv
	$(PY) -m tidewater.audit.pyfiles build/audit.zip

# Sweep seeds of the deterministic cluster simulation (tests/sim).
# atheris over the parsers of bytes others wrote (tests/fuzz/targets.py), FUZZ_SECONDS
# per target; what it finds is saved in tests/fuzz/corpus and replayed by make test.
fuzz: venv
	cd tests && $(CURDIR)/$(PY) -m fuzz.run --seconds $(or $(FUZZ_SECONDS),60)

# SIM_COUNT seeds of 3,000 steps each; the step count is asserted (a sweep that ran nothing
# fails). .ci/run runs `make sim`; `make sim-long` sweeps 400 other seeds (1,200,000 steps).
SIM_COUNT ?= 100
# The controller quorum's Raft simulation (tests/sim/raft_cluster.py) follows: RAFT_SIM_COUNT
# seeds of >= 3,000 steps each (20 to 45 s here, by load); sim-long sweeps 340 other seeds
# (>= 1,000,000 steps).
RAFT_SIM_COUNT ?= 60
# After the one-controller sweep, the same cluster with a quorum of 3 controllers (tests/sim/sim_quorum.py: the
# product's QuorumOwner and Raft, controller crashes, cuts and failed Raft writes):
# QUORUM_SIM_COUNT seeds of 3,000 steps (about 1 s of CPU each); sim-long sweeps 340 others.
QUORUM_SIM_COUNT ?= 20
sim: venv
	cd tests && $(CURDIR)/$(PY) -m sim.run --first $(or $(SIM_FIRST),0) --count $(SIM_COUNT) \
	  --min-steps $$(( $(SIM_COUNT) * 3000 ))
	cd tests && $(CURDIR)/$(PY) -m sim.run --controllers 3 --first $(or $(SIM_FIRST),0) \
	  --count $(QUORUM_SIM_COUNT) --min-steps $$(( $(QUORUM_SIM_COUNT) * 3000 ))
	cd tests && $(CURDIR)/$(PY) -m sim.raft_run --first $(or $(SIM_FIRST),0) \
	  --count $(RAFT_SIM_COUNT) --min-steps $$(( $(RAFT_SIM_COUNT) * 3000 ))

sim-long: venv
	cd tests && $(CURDIR)/$(PY) -m sim.run --first 100000 --count 400 --min-steps 1200000
	cd tests && $(CURDIR)/$(PY) -m sim.raft_run --first 100000 --count 340 --min-steps 1000000
	cd tests && $(CURDIR)/$(PY) -m sim.run --controllers 3 --first 100000 --count 340 \
	  --min-steps 1020000

# Docker image, compose cluster and chaos targets live beside the Dockerfile.
-include deploy/docker.mk
