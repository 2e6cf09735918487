"""Shared fixtures for the audit tests: ONE SparkSession for the whole test session.

Tests that need Spark skip with a clear reason when pyspark, pyarrow or a
Java runtime is missing. Fixture dumps (fixtures.py) are built once per
session; each audit run is made once and shared by the tests that read its
report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# `tests.spark.fixtures` must import however pytest was started (script or -m).
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.spark.fixtures import build_dump  # noqa: E402


def _spark_missing_reason() -> str | None:
    try:
        from tidewater.audit.session import SparkUnavailableError, check_spark_available
    except ImportError as e:
        return f"audit package not importable: {e}"
    try:
        check_spark_available()
    except SparkUnavailableError as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def spark():
    reason = _spark_missing_reason()
    if reason:
        pytest.skip(f"Spark tests need pyspark, pyarrow and Java: {reason}")
    from pyspark.errors import PySparkRuntimeError

    from tidewater.audit.session import local_session

    try:
        session = local_session("local[2]")
    except PySparkRuntimeError as e:
        # pyspark starts its JVM with fork + preexec_fn; this pytest worker ran gRPC tests
        # before and has gRPC's threads ("skipping fork() handlers"), and once in a CI run
        # the child never reached exec (JAVA_GATEWAY_EXITED, no JVM output). `tide audit`
        # runs in a process of its own and never meets this; the tests start it again once.
        if e.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        print(f"the Spark JVM exited before it started ({e}); starting it again")
        session = local_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def clean_dump(tmp_path_factory):
    return build_dump(tmp_path_factory.mktemp("clean"))


@pytest.fixture(scope="session")
def damaged_dump(tmp_path_factory):
    return build_dump(tmp_path_factory.mktemp("damaged"), damaged=True)


def run_tide_audit(dump, out: Path, extra: list[str] = ()) -> tuple[int, dict | None]:
    """``tide audit`` through the CLI entry point, in this process (reusing the session)."""
    from tidewater.tools.cli import main

    code = main(["audit", str(dump.root), "--metrics", str(dump.metrics_dir),
                 "--ack-log", str(dump.ack_log), "--out", str(out), *extra])
    report = out / "report.json"
    return code, (json.loads(report.read_text()) if report.exists() else None)


@pytest.fixture(scope="session")
def clean_audit(spark, clean_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean-report")
    code, report = run_tide_audit(clean_dump, out)
    return code, report, out


@pytest.fixture(scope="session")
def damaged_audit(spark, damaged_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("damaged-report")
    code, report = run_tide_audit(damaged_dump, out)
    return code, report, out
