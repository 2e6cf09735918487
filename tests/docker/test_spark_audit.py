"""The audit on the compose `spark` profile (master, 2 workers, driver) against a chaos run.

Runs after test_compose.py (file order) and reads its chaos run; run alone, it
makes a short chaos run of its own. The Spark image is built by `make
image-spark` (debootstrap base with a Java runtime, wheels from the host). The
verdict on the compose cluster must equal the host's `tide audit` on local[*],
rule by rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"

SPARK_IMAGE = os.environ.get("TIDE_SPARK_IMAGE") or "tidewater-spark:latest"
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")

pytestmark = pytest.mark.timeout(2400)


def run(cmd, *, env=None, timeout_s=120, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout_s)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n"
                    f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def spark_image(image):
    run(["make", "image-spark", f"SPARK_IMAGE={SPARK_IMAGE}"], timeout_s=1800)
    return SPARK_IMAGE


def _verdict(report: dict) -> list[tuple]:
    return [(r["name"], r["passed"], r["skipped"], r["violations"], r["checked"])
            for r in report["rules"]]


def test_audit_on_the_compose_spark_profile_equals_local(compose_cluster, chaos_run_dir,
                                                         spark_image, tmp_path):
    c = compose_cluster
    run_dir = chaos_run_dir
    if not (run_dir / "faults.jsonl").exists():  # test_compose's chaos run did not run
        r = c.tide("chaos", "--compose", "--compose-project", c.project, "--duration", "30",
                   "--seed", "6", "--out", str(run_dir), "--hold", "2,4", "--gap", "1,3",
                   "--scrape-interval-ms", "1000", timeout_s=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "compose-report"
    out.mkdir()
    env = dict(c.env, TIDE_SPARK_IMAGE=spark_image, TIDE_AUDIT_INPUT=str(run_dir),
               TIDE_AUDIT_OUT=str(out))

    def compose(*args, **kw):
        return run(["docker-compose", "-p", c.project, "-f", str(COMPOSE_FILE),
                    "--profile", "spark", *args], env=env, **kw)

    try:
        compose("up", "-d", *SPARK_SERVICES, timeout_s=300)
        deadline = time.monotonic() + 180
        while True:  # both workers registered with the master
            logs = compose("logs", "--no-color", "spark-master", timeout_s=60).stdout
            if logs.count("Registering worker") >= 2:
                break
            assert time.monotonic() < deadline, logs[-3000:]
            time.sleep(2)
        audit = compose("run", "--rm", "spark-audit", "tide", "audit", "/audit-input/data",
                        "--metrics", "/audit-input/metrics",
                        "--ack-log", "/audit-input/acks.jsonl",
                        "--faults", "/audit-input/faults.jsonl",
                        "--out", "/audit-out", "--master", "spark://spark-master:7077",
                        timeout_s=1200, check=False)
        console = audit.stdout + audit.stderr
        assert audit.returncode in (0, 1), console[-3000:]
        assert "audit: PASS" in console or "audit: FAIL" in console, console[-3000:]
        # The executors ran on the workers (one application, an executor on each).
        for worker in ("spark-worker-1", "spark-worker-2"):
            logs = compose("logs", "--no-color", worker, timeout_s=60).stdout
            assert "Asked to launch executor" in logs, logs[-2000:]
    finally:
        compose("rm", "-s", "-f", *SPARK_SERVICES, "spark-audit", timeout_s=180, check=False)
    on_cluster = json.loads((out / "report.json").read_text())
    local_out = tmp_path / "local-report"
    local = run([str(Path(sys.executable).with_name("tide")), "audit", str(run_dir / "data"),
                 "--metrics", str(run_dir / "metrics"), "--ack-log", str(run_dir / "acks.jsonl"),
                 "--faults", str(run_dir / "faults.jsonl"), "--out", str(local_out),
                 "--master", "local[*]"], timeout_s=1200, check=False)
    assert local.returncode in (0, 1), local.stderr[-3000:]
    on_local = json.loads((local_out / "report.json").read_text())
    assert _verdict(on_cluster) == _verdict(on_local)
    assert on_cluster["passed"] == (audit.returncode == 0)
    # A chaos run: the report says so and shows its faults.
    assert "Chaos timeline" in (out / "report.html").read_text()
