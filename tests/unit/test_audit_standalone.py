"""The pure parts of the audit's Spark plumbing: cluster plan and state, environments."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tidewater.audit import session, standalone, submit


def test_plan_starts_a_master_and_workers_on_loopback(tmp_path):
    plan = standalone.ClusterPlan(Path("/spark"), tmp_path, 7177,
                                  {"master": 1, "worker-1": 2, "worker-2": 3})
    commands = plan.commands()
    assert list(commands) == ["master", "worker-1", "worker-2"]
    assert commands["master"][:2] == ["/spark/bin/spark-class",
                                      "org.apache.spark.deploy.master.Master"]
    assert commands["master"][commands["master"].index("--host") + 1] == "127.0.0.1"
    worker = commands["worker-2"]
    assert worker[-1] == plan.master_url == "spark://127.0.0.1:7177"
    assert worker[worker.index("--work-dir") + 1] == str(tmp_path / "work-2")
    assert worker[worker.index("--webui-port") + 1] == "3"


def test_state_round_trips_and_garbage_is_a_typed_error():
    state = standalone.ClusterState("spark://127.0.0.1:7177", {"master": 10, "worker-1": 11},
                                    {"master": 8080})
    assert standalone.ClusterState.from_json(state.to_json()) == state
    for text in ("", "[]", '{"master_url": "x"}', '{"master_url": "x", "pids": {"m": "a"}}'):
        with pytest.raises(standalone.StandaloneError):
            standalone.ClusterState.from_json(text)


def test_environment_points_into_the_venv():
    env = standalone.spark_environment({"PATH": "/usr/bin", "SPARK_HOME": "/elsewhere"},
                                       python="/venv/bin/python")
    assert env["SPARK_HOME"] == str(standalone.pyspark_home())
    assert (Path(env["SPARK_HOME"]) / "bin" / "spark-class").exists()
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/venv/bin/python"
    assert env["PATH"].split(":")[0] == "/venv/bin"


def test_submit_wrapper_adds_the_log_config_and_keeps_the_arguments(tmp_path):
    argv, env = submit.submit_command(
        ["--master", "spark://h:1", "job.py", "--out", "x"],
        {"PATH": "/usr/bin", "TIDE_AUDIT_SPARK_LOG": str(tmp_path / "s.log"),
         "SPARK_SUBMIT_OPTS": "-Dmine=1"})
    assert argv[0] == str(standalone.pyspark_home() / "bin" / "spark-submit")
    assert argv[-5:] == ["--master", "spark://h:1", "job.py", "--out", "x"]
    assert f"-Dlog4j2.configurationFile=file:{session.LOG4J2_PATH}" in env["SPARK_SUBMIT_OPTS"]
    assert f"-Dtidewater.audit.spark_log={tmp_path / 's.log'}" in env["SPARK_SUBMIT_OPTS"]
    assert env["SPARK_SUBMIT_OPTS"].endswith("-Dmine=1")


@pytest.mark.parametrize(("master", "loopback"), [
    ("local[*]", True), ("local[2]", True), ("spark://127.0.0.1:7177", True),
    ("spark://localhost:7077", True), ("spark://spark-master:7077", False),
])
def test_driver_listens_on_loopback_only_for_local_clusters(master, loopback):
    assert session.driver_on_loopback(master) is loopback
