# Docker image, compose cluster and chaos targets (included by the Makefile).
#
#   make image        wheelhouse on the host, then docker build (cached layers)
#   make up           image if needed, start the compose cluster, create `demo`
#                     (TLS=1: certificates made in ./tls on the host, each container
#                     mounting only the CA certificate and its own; TLS on every port,
#                     see deploy/compose-tls.yml. TLS=1 SASL=1: also SASL_SSL Kafka
#                     listeners and ACLs, users in ./tls/sasl, deploy/compose-sasl.yml)
#   make down         stop and remove containers (./data kept)
#   make clean        down, remove volumes, wipe ./data and the wheelhouse
#   make chaos        a seeded chaos run against the compose cluster
#   make test-docker  tests/docker (skipped when no Docker engine answers; the Kafka
#                     test needs kcat, installed from Debian where apt works)
#   make image-spark  the Spark image: debootstrap base with a Java runtime
#                     (SPARK=1 deploy/base-image.sh) + the spark wheels built on the host
#   make spark-compose-up / spark-compose-down   the compose `spark` profile: a master
#                     and 2 workers reading AUDIT_INPUT (default ./data) read-only
#   make spark-compose-audit  the audit on them (report in build/audit-compose)

# TIDE_IMAGE (what the compose file and tests/docker read) names it too.
IMAGE ?= $(or $(TIDE_IMAGE),tidewater:latest)
# Empty: pick one (local python:3.11-slim, local debootstrap base, pull
# python:3.11-slim, else build the debootstrap base).
BASE_IMAGE ?=
DEBOOTSTRAP_IMAGE := tidewater-base:bookworm
COMPOSE ?= docker-compose
COMPOSE_PROJECT ?= tidewater
COMPOSE_FILE_PATH := $(CURDIR)/docker-compose.yml
# TLS=1: the TLS override on top (each process's own files from ./tls, mounted at /tls).
# Not under ./data: the spark profile mounts ./data whole, and no container may see
# ca.key. SASL=1 (with TLS=1): the SASL and ACL override too (users in ./tls/sasl).
TLS ?=
SASL ?=
TLS_DIR ?= $(CURDIR)/tls
SASL_DIR ?= $(TLS_DIR)/sasl
TLS_ON := $(filter 1 yes true,$(TLS))
SASL_ON := $(filter 1 yes true,$(SASL))
COMPOSE_FILES := -f $(COMPOSE_FILE_PATH)$(if $(TLS_ON), -f $(CURDIR)/deploy/compose-tls.yml)$(if $(SASL_ON), -f $(CURDIR)/deploy/compose-sasl.yml)
# The compose file reads the image name from TIDE_IMAGE.
COMPOSE_CMD = TIDE_IMAGE=$(IMAGE) TIDE_TLS_DIR=$(TLS_DIR) TIDE_SASL_DIR=$(SASL_DIR) $(COMPOSE) -p $(COMPOSE_PROJECT) $(COMPOSE_FILES)
TOPIC ?= demo
CHAOS_DURATION_S ?= 120
CHAOS_SEED ?= 1
# A new folder per run: tide chaos refuses to mix two runs in one folder.
CHAOS_OUT ?= $(CURDIR)/build/chaos/seed$(CHAOS_SEED)-$(shell date +%Y%m%d-%H%M%S)
WHEELHOUSE := build/wheelhouse
PROJECT_SOURCES := pyproject.toml $(shell find broker controller client audit proto \
	\( -name '*.py' -o -name '*.proto' \) -not -path '*/__pycache__/*' 2>/dev/null)

SPARK_IMAGE ?= $(or $(TIDE_SPARK_IMAGE),tidewater-spark:latest)
SPARK_BASE_IMAGE := tidewater-base-spark:bookworm
AUDIT_INPUT ?= $(CURDIR)/data
AUDIT_COMPOSE_OUT ?= $(CURDIR)/build/audit-compose
SPARK_COMPOSE_CMD = TIDE_IMAGE=$(IMAGE) TIDE_SPARK_IMAGE=$(SPARK_IMAGE) \
	TIDE_AUDIT_INPUT=$(AUDIT_INPUT) TIDE_AUDIT_OUT=$(AUDIT_COMPOSE_OUT) \
	$(COMPOSE) -p $(COMPOSE_PROJECT) -f $(COMPOSE_FILE_PATH) --profile spark

.PHONY: image wheelhouse up down clean chaos test-docker image-spark spark-compose-up \
	spark-compose-down spark-compose-audit

# Runtime dependencies (kio among them: the Kafka listener's codec), the
# kafka-client extra (kafka-python, pure Python: a Kafka client inside the
# network) and the console extra (the `console` service), no dev/spark extras:
# `pip wheel '.[kafka-client,console]'` resolves them;
# the project's own wheel goes in a separate folder.
$(WHEELHOUSE)/deps/.stamp: pyproject.toml | venv
	rm -rf $(WHEELHOUSE)/deps
	$(PY) -m pip wheel -q --no-build-isolation --wheel-dir $(WHEELHOUSE)/deps '.[kafka-client,console]'
	rm -f $(WHEELHOUSE)/deps/tidewater-*.whl
	touch $@

# build/lib is cleared first: setuptools would otherwise ship modules deleted
# from the tree since the last build.
$(WHEELHOUSE)/project/.stamp: $(PROJECT_SOURCES) | venv
	rm -rf $(WHEELHOUSE)/project build/lib build/bdist.*
	$(PY) -m pip wheel -q --no-deps --no-build-isolation --wheel-dir $(WHEELHOUSE)/project .
	touch $@

wheelhouse: $(WHEELHOUSE)/deps/.stamp $(WHEELHOUSE)/project/.stamp

# pyspark, pyarrow and py4j at the venv's versions (pip's cache has them after make venv).
$(WHEELHOUSE)/spark/.stamp: pyproject.toml | venv
	rm -rf $(WHEELHOUSE)/spark
	$(PY) -m pip wheel -q --no-build-isolation --wheel-dir $(WHEELHOUSE)/spark \
	  "pyspark==$$($(PY) -c 'import pyspark; print(pyspark.__version__)')" \
	  "pyarrow==$$($(PY) -c 'import pyarrow; print(pyarrow.__version__)')"
	touch $@

# The Spark image: the same Dockerfile on a base with a Java runtime, plus the spark
# wheels (no registry: the base comes from debootstrap, the wheels from the host).
image-spark: wheelhouse $(WHEELHOUSE)/spark/.stamp
	SPARK=1 deploy/base-image.sh
	docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE=$(SPARK_BASE_IMAGE) \
	  --build-arg EXTRA_WHEELS=spark -t $(SPARK_IMAGE) . >/dev/null
	docker run --rm $(SPARK_IMAGE) python -c "import pyspark, pyarrow, tidewater.audit.datasource"
	@echo "image-spark: built $(SPARK_IMAGE)"

spark-compose-up: image-spark
	mkdir -p $(AUDIT_COMPOSE_OUT)
	$(SPARK_COMPOSE_CMD) up -d spark-master spark-worker-1 spark-worker-2

spark-compose-down:
	$(SPARK_COMPOSE_CMD) rm -s -f spark-master spark-worker-1 spark-worker-2 spark-audit

# AUDIT_INPUT=build/chaos/<run> audits a chaos run (data, metrics, acks, faults).
spark-compose-audit:
	@if [ -d "$(AUDIT_INPUT)/data" ]; then \
	  args="/audit-input/data --metrics /audit-input/metrics --ack-log /audit-input/acks.jsonl --faults /audit-input/faults.jsonl"; \
	else args="/audit-input"; fi; \
	$(SPARK_COMPOSE_CMD) run --rm spark-audit tide audit $$args --out /audit-out \
	  --master spark://spark-master:7077

image: wheelhouse
	@base="$(BASE_IMAGE)"; \
	if [ -z "$$base" ]; then \
	  if docker image inspect python:3.11-slim >/dev/null 2>&1; then base=python:3.11-slim; \
	  elif docker image inspect $(DEBOOTSTRAP_IMAGE) >/dev/null 2>&1; then base=$(DEBOOTSTRAP_IMAGE); \
	  elif timeout 60 docker pull -q python:3.11-slim >/dev/null 2>&1; then base=python:3.11-slim; \
	  else echo "image: python:3.11-slim cannot be pulled; building $(DEBOOTSTRAP_IMAGE) with debootstrap"; \
	    deploy/base-image.sh && base=$(DEBOOTSTRAP_IMAGE) || exit 1; fi; \
	fi; \
	echo "image: building $(IMAGE) on $$base"; \
	docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE=$$base -t $(IMAGE) . >/dev/null

up: image
	mkdir -p data/controller data/controller-2 data/controller-3 data/broker-1 data/broker-2 data/broker-3
ifneq ($(SASL_ON),)
ifeq ($(TLS_ON),)
	$(error SASL=1 needs TLS=1: the SASL passwords travel over TLS only)
endif
endif
ifneq ($(TLS_ON),)
	$(PY) -m tidewater.tools certs cluster --dir $(TLS_DIR) --brokers 3 --controllers 3 --names-as-hosts >/dev/null
endif
ifneq ($(SASL_ON),)
	$(PY) deploy/sasl_users.py --dir $(TLS_DIR) >/dev/null
endif
	$(COMPOSE_CMD) up -d
	$(PY) deploy/up.py --compose-project $(COMPOSE_PROJECT) --compose-file $(COMPOSE_FILE_PATH) --topic $(TOPIC)

down:
	$(COMPOSE_CMD) down --remove-orphans

clean:
	-$(COMPOSE_CMD) down -v --remove-orphans
	rm -rf data $(TLS_DIR) $(WHEELHOUSE) build/chaos build/lib build/bdist.* || docker run --rm -v $(CURDIR):/w $(IMAGE) rm -rf /w/data

# The chaos run ends with the Spark audit of what it collected; either failing fails.
chaos: venv
	@out="$(CHAOS_OUT)"; rc=0; \
	$(PY) -m tidewater.tools chaos --compose --compose-project $(COMPOSE_PROJECT) \
	  --compose-file $(COMPOSE_FILE_PATH) --topic $(TOPIC) \
	  --duration $(CHAOS_DURATION_S) --seed $(CHAOS_SEED) --out "$$out" || rc=$$?; \
	if [ -d "$$out/data" ]; then \
	  $(PY) -m tidewater.tools audit "$$out/data" --metrics "$$out/metrics" --ack-log "$$out/acks.jsonl" \
	    --faults "$$out/faults.jsonl" \
	    --out "$$out/audit" || { arc=$$?; [ $$rc -ne 0 ] || rc=$$arc; }; \
	fi; \
	exit $$rc

test-docker: venv kcat
	$(PY) -m pytest -q -p no:cacheprovider --durations=20 $(PYTEST_ARGS) tests/docker
