"""The audit on a Spark standalone cluster: master and 2 workers as processes (make spark-up).

The cluster is started and stopped through audit/standalone.py's command line,
as `make spark-up` / `make spark-down` do, on a free port with its own state dir;
the audit runs through `tide audit --master spark://...` in its own process and
must reach the same verdict, rule by rule, as on local[*].
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.audit import standalone

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def _spark_cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidewater.audit.standalone", *args],
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


@pytest.fixture(scope="module")
def cluster(spark, tmp_path_factory):
    """(master URL, state dir); ``spark`` only for its skip when Spark cannot run here."""
    state_dir = tmp_path_factory.mktemp("spark-state")
    port = standalone.free_port()
    up = _spark_cli("up", "--state-dir", str(state_dir), "--port", str(port))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert up.stdout.strip() == f"spark://127.0.0.1:{port}"
        yield up.stdout.strip(), state_dir
    finally:
        _spark_cli("down", "--state-dir", str(state_dir))


def _tide_audit(dump, out: Path, master: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("tide")), "audit", str(dump.root),
         "--metrics", str(dump.metrics_dir), "--ack-log", str(dump.ack_log),
         "--out", str(out), "--master", master],
        capture_output=True, text=True, timeout=600, cwd=out.parent,
        env={k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"})
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() \
        else {}
    return proc.returncode, report, proc.stdout + proc.stderr


def _verdict(report: dict) -> list[tuple]:
    return [(r["name"], r["passed"], r["skipped"], r["violations"], r["checked"])
            for r in report["rules"]]


def test_audit_on_the_standalone_cluster_equals_local(cluster, damaged_dump, tmp_path):
    master, state_dir = cluster
    code, on_cluster, console = _tide_audit(damaged_dump, tmp_path / "cluster", master)
    assert code == 1, console[-3000:]
    local_code, on_local, local_console = _tide_audit(damaged_dump, tmp_path / "local",
                                                      "local[*]")
    assert local_code == 1, local_console[-3000:]
    assert _verdict(on_cluster) == _verdict(on_local)
    assert not on_cluster["passed"]
    # The work ran on the workers: each one started an executor for this application.
    executor_dirs = [p for p in state_dir.glob("work-*/app-*/*") if p.is_dir()]
    assert {p.parts[-3] for p in executor_dirs} == {"work-1", "work-2"}, executor_dirs
    # The driver's Spark INFO lines went to the report folder, not the console.
    assert " INFO " not in console
    assert "spark://" in (tmp_path / "cluster" / "spark.log").read_text()


def listening_pids(port: int) -> set[int]:
    """The pids holding a TCP socket that listens on ``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    holders = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                holders.add(int(fd_dir.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return holders


def is_spark_of(pid: int, port: int) -> bool:
    """``pid`` is a Spark master or worker of the cluster on ``port``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (any(b"org.apache.spark.deploy" in a for a in argv)
            and (str(port).encode() in argv or f"spark://127.0.0.1:{port}".encode() in argv))


def test_listening_pids_finds_this_process_listening():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert os.getpid() in listening_pids(port)
        assert not is_spark_of(os.getpid(), port)
    assert os.getpid() not in listening_pids(port)


def test_spark_down_stops_every_recorded_process(spark, tmp_path):
    state_dir = tmp_path / "state"
    port = standalone.free_port()
    up = _spark_cli("up", "--state-dir", str(state_dir), "--port", str(port), "--workers", "1")
    assert up.returncode == 0, up.stderr[-3000:]
    pids = json.loads((state_dir / "state.json").read_text())["pids"]
    assert set(pids) == {"master", "worker-1"}
    again = _spark_cli("up", "--state-dir", str(state_dir), "--port", str(port))
    assert again.returncode == 1 and "is running" in again.stderr
    assert _spark_cli("url", "--state-dir", str(state_dir)).stdout.strip() == \
        f"spark://127.0.0.1:{port}"
    down = _spark_cli("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert not any(standalone.pid_alive(pid) for pid in pids.values())
    # Nothing of this cluster listens on its port. Whether anything does is no test: the
    # port came from free_port(), an ephemeral one, and another test's server binding port
    # 0 may be given it the moment the master lets it go (seen in CI).
    holders = listening_pids(port)
    assert not [pid for pid in holders if is_spark_of(pid, port)], holders
    assert _spark_cli("url", "--state-dir", str(state_dir)).returncode == 1
