"""`tide cluster up|status|kill|start|down` manage real processes by the pids in cluster.json."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pytest
from cluster_fixtures import assert_one_line_error, run_tide, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def status(data_dir: Path) -> dict:
    result = run_tide("cluster", "status", "--data-dir", str(data_dir), "--json")
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)["processes"]}


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("lc"), 2, "min.insync.replicas=1", "num.partitions=2")
    yield c
    stop_cluster(c)


def test_up_records_manifest_and_everything_serves(two_brokers):
    m = two_brokers.manifest()
    assert set(m["processes"]) == {"controller", "broker-1", "broker-2"}
    assert m["bootstrap"] == two_brokers.bootstrap
    for name, proc in m["processes"].items():
        assert pid_alive(proc["pid"]), name
        assert proc["listen"].startswith("127.0.0.1:")
        assert proc["metrics_port"] > 0
        assert Path(proc["data_dir"]) == two_brokers.data_dir / name
        assert (two_brokers.data_dir / f"{name}.log").exists()
        assert proc["command"][1:3] == ["-m", f"tidewater.{proc['kind']}"]
    # --set is routed: num.partitions only to the controller, min.insync.replicas to all.
    assert "num.partitions=2" in m["processes"]["controller"]["command"]
    assert "num.partitions=2" not in m["processes"]["broker-1"]["command"]
    assert "min.insync.replicas=1" in m["processes"]["broker-1"]["command"]
    st = status(two_brokers.data_dir)
    assert all(p["alive"] and p["serving"] for p in st.values()), st
    text = run_tide("cluster", "status", "--data-dir", str(two_brokers.data_dir))
    assert "broker-2" in text.stdout and two_brokers.bootstrap in text.stdout


def test_kill_and_start_a_broker(two_brokers):
    old_pid = two_brokers.manifest()["processes"]["broker-2"]["pid"]
    result = run_tide("cluster", "kill", "2", "--data-dir", str(two_brokers.data_dir))
    assert result.returncode == 0, result.stderr
    assert not pid_alive(old_pid)
    st = status(two_brokers.data_dir)
    assert not st["broker-2"]["alive"] and not st["broker-2"]["serving"]
    assert st["broker-1"]["serving"]
    # Killing it again is an error: it is not running.
    assert_one_line_error(run_tide("cluster", "kill", "2", "--data-dir", str(two_brokers.data_dir)),
                          "not running")
    started = run_tide("cluster", "start", "2", "--data-dir", str(two_brokers.data_dir), timeout_s=60)
    assert started.returncode == 0, started.stderr
    new_pid = two_brokers.manifest()["processes"]["broker-2"]["pid"]
    assert new_pid != old_pid and pid_alive(new_pid)
    assert status(two_brokers.data_dir)["broker-2"]["serving"]
    assert_one_line_error(run_tide("cluster", "start", "2", "--data-dir", str(two_brokers.data_dir)),
                          "already running")


def test_kill_and_start_the_controller(two_brokers):
    d = str(two_brokers.data_dir)
    old_pid = two_brokers.manifest()["processes"]["controller"]["pid"]
    assert run_tide("cluster", "kill", "controller", "--signal", "TERM", "--data-dir", d).returncode == 0
    started = run_tide("cluster", "start", "controller", "--data-dir", d, timeout_s=60)
    assert started.returncode == 0, started.stderr + started.stdout
    assert not pid_alive(old_pid)
    st = status(two_brokers.data_dir)
    assert st["controller"]["serving"] and st["controller"]["pid"] != old_pid
    # The brokers are still members of the cluster the restarted controller serves.
    described = two_brokers.tide("cluster", "describe", "--json")
    assert described.returncode == 0, described.stderr
    assert [b["id"] for b in json.loads(described.stdout)["brokers"]] == [1, 2]


def test_stop_and_continue(two_brokers):
    d = str(two_brokers.data_dir)
    assert run_tide("cluster", "kill", "1", "--signal", "STOP", "--data-dir", d).returncode == 0
    st = status(two_brokers.data_dir)["broker-1"]
    assert st["alive"] and st["stopped"] and not st["serving"]
    assert run_tide("cluster", "kill", "1", "--signal", "CONT", "--data-dir", d).returncode == 0
    st = status(two_brokers.data_dir)["broker-1"]
    assert st["alive"] and not st["stopped"]


def test_unknown_ids_and_missing_cluster(two_brokers, tmp_path):
    d = str(two_brokers.data_dir)
    assert_one_line_error(run_tide("cluster", "kill", "7", "--data-dir", d), "no process")
    assert_one_line_error(run_tide("cluster", "status", "--data-dir", str(tmp_path / "none")), "no cluster")
    assert_one_line_error(run_tide("cluster", "up", "--brokers", "1", "--data-dir", d, "--base-port", "0"),
                          "already running")


def test_up_with_port_in_use_fails_cleanly(tmp_path):
    with socket.socket() as s:
        # A base port whose whole plan fits below 65536 (Kafka ports are base+10000+i-1).
        for port in random.sample(range(20_000, 50_000), 200):
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        s.listen()
        port = s.getsockname()[1]
        result = run_tide("cluster", "up", "--brokers", "1", "--data-dir", str(tmp_path),
                          "--base-port", str(port))
    assert_one_line_error(result, "in use", str(port))


def test_up_refuses_an_empty_rack_name_and_starts_nothing(tmp_path):
    result = run_tide("cluster", "up", "--brokers", "2", "--data-dir", str(tmp_path),
                      "--base-port", "0", "--rack", "a,,b")
    assert_one_line_error(result, "cluster up failed:", "rack name is empty")
    assert not (tmp_path / "cluster.json").exists()


def test_failing_process_reports_its_log(tmp_path):
    result = run_tide("cluster", "up", "--brokers", "1", "--data-dir", str(tmp_path), "--base-port", "0",
                      "--controllers", "1", "--set", "no.such.setting=1", "--ready-timeout-s", "60", timeout_s=120)
    assert result.returncode != 0
    assert_one_line_error(result, "cluster up failed:", "broker-1")
    assert "no.such.setting" in result.stdout  # the log tail of the failing process
    m = json.loads((tmp_path / "cluster.json").read_text())
    assert not any(pid_alive(p["pid"]) for p in m["processes"].values())


def test_zz_down_stops_every_process(two_brokers):
    """Runs last in this module (file order): stops the shared cluster."""
    pids = [p["pid"] for p in two_brokers.manifest()["processes"].values()]
    assert all(pid_alive(pid) for pid in pids)
    result = run_tide("cluster", "down", "--data-dir", str(two_brokers.data_dir))
    assert result.returncode == 0, result.stderr
    assert not any(pid_alive(pid) for pid in pids)
    st = status(two_brokers.data_dir)
    assert not any(p["alive"] for p in st.values())
    assert (two_brokers.data_dir / "broker-1").is_dir()  # data stays for a later `up`


def test_foreground_streams_logs_and_stops_everything_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from cluster_fixtures import PROJECT_DIR

    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewater.tools", "cluster", "up", "--brokers", "1", "--data-dir", str(tmp_path),
         "--base-port", "0", "--controllers", "1", "--foreground"],
        cwd=PROJECT_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else bootstrap
        pids = [p["pid"] for p in json.loads((tmp_path / "cluster.json").read_text())["processes"].values()]
        assert all(pid_alive(pid) for pid in pids)
        # Logs stream with a name prefix until the signal.
        deadline = time.monotonic() + 30
        seen = set()
        while seen != {"[controller]", "[broker-1]"} and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("["):
                seen.add(line.split()[0])
        assert seen == {"[controller]", "[broker-1]"}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            run_tide("cluster", "down", "--data-dir", str(tmp_path), "--timeout-s", "5")
    assert proc.returncode == 0, err
    assert "cluster stopped" in out
    assert not any(pid_alive(pid) for pid in pids)


def test_demo_passes(tmp_path):
    """`make demo` end to end, with fewer records: kill a leader under acks=all, lose nothing."""
    import subprocess
    import sys

    from cluster_fixtures import PROJECT_DIR

    proc = subprocess.run([sys.executable, "-m", "tidewater.tools.demo", "--data-dir", str(tmp_path / "demo"),
                           "--records", "600"], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: 600 acknowledged records, 0 missing, 0 duplicated" in proc.stdout
    assert "SIGKILLed broker" in proc.stdout and "cluster stopped" in proc.stdout
    assert "live consumer saw all of them" in proc.stdout
    m = json.loads((tmp_path / "demo" / "cluster.json").read_text())
    # make demo runs the default quorum of 3 controllers (issue 26)
    assert "starting 3 controllers and 3 brokers" in proc.stdout
    assert len(m["controllers"]) == 3
    assert sorted(n for n, p in m["processes"].items() if p["kind"] == "controller") == [
        "controller-1", "controller-2", "controller-3"]
    assert not any(pid_alive(p["pid"]) for p in m["processes"].values())
