"""`tide chaos --data-dir` against a real `tide cluster up` cluster (3 brokers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.tools.scrape import read_snapshots

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def tide(*args, timeout_s=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidewater.tools", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def up(tmp_path, *settings, controllers=1):
    data = tmp_path / "cluster"
    args = ["--set", "broker.session.timeout.ms=2000"]
    for setting in settings:
        args += ["--set", setting]
    r = tide("cluster", "up", "--brokers", "3", "--data-dir", str(data), "--base-port", "0",
             "--controllers", str(controllers),
             *args, timeout_s=120)
    try:
        assert r.returncode == 0, r.stderr
        yield data
    finally:
        tide("cluster", "down", "--data-dir", str(data), "--timeout-s", "10", timeout_s=90)


@pytest.fixture
def cluster_dir(tmp_path):
    yield from up(tmp_path)


@pytest.fixture
def quorum_cluster_dir(tmp_path):
    """Three controllers (the default of `tide cluster up`)."""
    yield from up(tmp_path, controllers=3)


@pytest.fixture
def cleaning_cluster_dir(tmp_path):
    """The cleaner looks for work every second instead of every 15."""
    yield from up(tmp_path, "log.cleaner.backoff.ms=1000")


def test_chaos_run_on_a_local_cluster_passes_and_keeps_evidence(cluster_dir, tmp_path):
    out = tmp_path / "out"
    r = tide("chaos", "--data-dir", str(cluster_dir), "--duration", "18", "--seed", "7",
             "--out", str(out), "--hold", "1.5,3", "--gap", "0.5,1", "--warmup", "3",
             "--rate", "150", "--scrape-interval-ms", "500",
             "--faults", "kill_leader,kill_broker,kill_controller,pause_broker,isolate_broker")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VERDICT: PASS" in r.stdout
    # A consumer group read during the faults (tools/chaos/group_reader.py).
    assert ("every acknowledged record consumed by the group; commits never went backwards"
            in r.stdout)

    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == 7 and run["cluster"] == "local" and run["plan"]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and verdict["notes"] == []
    assert verdict["group"]["not_consumed"] == 0 and verdict["group"]["backwards"] == []
    assert verdict["group"]["commits_seen"] > 0
    acked = sum(p["acked"] for p in verdict["partitions"])
    assert acked > 500
    assert all(p["lost"] == p["duplicates"] == 0 and p["replicas_identical"]
               for p in verdict["partitions"])

    # Every planned fault was applied and undone, with timestamps.
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    applied = [f for f in faults if f["action"] in ("kill", "pause", "isolate") and f["ok"]]
    undone = [f for f in faults if f["action"] in ("start", "unpause", "heal") and f["ok"]]
    assert len(applied) == len(run["plan"]) and len(undone) >= len(applied)
    assert {f["fault"] for f in applied} == {f["kind"] for f in run["plan"]}
    assert {"kill_controller", "kill_leader", "isolate_broker"} <= {f["kind"] for f in run["plan"]}
    assert all(f["unix_ms"] > run["started_unix_ms"] for f in faults)

    # The ack log matches what the verdict counted, in `tide produce --ack-log` form.
    acks = [json.loads(line) for line in (out / "acks.jsonl").read_text().splitlines()]
    assert len(acks) == acked
    assert set(acks[0]) == {"topic", "partition", "offset", "key", "value", "acks"}

    # Metrics history for every process and copies of every data folder.
    for node in ("controller", "broker-1", "broker-2", "broker-3"):
        assert any(s.ok for s in read_snapshots(out / "metrics" / f"{node}.prom"))
        assert (out / "data" / node).is_dir()
    assert (out / "data" / "broker-1" / "chaos-0").is_dir()

    # The cluster is whole again afterwards: every process serves.
    status = json.loads(tide("cluster", "status", "--data-dir", str(cluster_dir), "--json").stdout)
    entries = status if isinstance(status, list) else status.get("processes", status)
    assert all(p["serving"] for p in entries)


def test_chaos_run_on_a_controller_quorum_kills_pauses_and_isolates_controllers(
        quorum_cluster_dir, tmp_path):
    """Controllers (the active one and standbys) are killed or cut off while partition
    leaders are killed: nothing acknowledged is lost and the verdict counts failovers."""
    out = tmp_path / "out"
    r = tide("chaos", "--data-dir", str(quorum_cluster_dir), "--duration", "24", "--seed", "11",
             "--out", str(out), "--hold", "2,4", "--gap", "0.5,1", "--warmup", "3",
             "--rate", "150", "--scrape-interval-ms", "500",
             "--faults", "kill_controller=2,pause_controller,isolate_controller,kill_leader")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "VERDICT: PASS" in r.stdout
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and verdict["notes"] == []
    assert all(p["lost"] == p["duplicates"] == 0 and p["replicas_identical"]
               for p in verdict["partitions"])
    assert sum(p["acked"] for p in verdict["partitions"]) > 500
    run = json.loads((out / "run.json").read_text())
    # Seed 11's plan: cut a standby off, kill partition leaders, kill the active
    # controller (so the verdict must count a failover).
    planned = [{"kind": f["kind"], "target": f["target"]} for f in run["plan"]]
    assert {"kind": "kill_controller", "target": "active"} in planned
    assert {"isolate_controller", "kill_leader"} <= {f["kind"] for f in run["plan"]}
    controllers = verdict["controllers"]
    assert controllers["names"] == ["controller-1", "controller-2", "controller-3"]
    assert controllers["failovers"] >= 1, controllers
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    applied = {f["fault"] for f in faults if f["action"] in ("kill", "pause", "isolate") and f["ok"]}
    assert applied == {f["kind"] for f in run["plan"]}


def test_idempotent_chaos_run_writes_nothing_twice_and_keeps_send_order(cluster_dir, tmp_path):
    """Issue 17: idempotent producers, 5 requests in flight, retrying through leader kills."""
    out = tmp_path / "out"
    r = tide("chaos", "--data-dir", str(cluster_dir), "--duration", "15", "--seed", "3",
             "--out", str(out), "--hold", "1.5,3", "--gap", "0.5,1", "--warmup", "3",
             "--rate", "300", "--idempotent", "--faults", "kill_leader,kill_broker,pause_broker")
    assert r.returncode == 0, r.stdout + r.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and sum(p["acked"] for p in verdict["partitions"]) > 1000
    assert all(p["duplicates"] == p["out_of_order"] == p["lost"] == 0
               for p in verdict["partitions"])
    assert " order " in r.stdout.splitlines()[0] + " "


def test_compacted_chaos_run_loses_no_key_while_the_cleaner_runs(cleaning_cluster_dir, tmp_path):
    """Issue 16: a compacted topic (segments rolled every 2 s and cleaned once 2 s old)
    through leader kills and pauses: the latest acknowledged record of every key is there,
    older ones were cleaned during the run, and replicas agree offset by offset."""
    out = tmp_path / "out"
    r = tide("chaos", "--data-dir", str(cleaning_cluster_dir), "--duration", "18", "--seed", "5",
             "--out", str(out), "--hold", "1.5,3", "--gap", "0.5,1", "--warmup", "3",
             "--rate", "300", "--compacted", "20",
             "--faults", "kill_leader,kill_broker,pause_broker")
    assert r.returncode == 0, r.stdout + r.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and verdict["compacted"], r.stdout
    partitions = verdict["partitions"]
    assert all(p["lost"] == p["moved"] == p["duplicates"] == 0 and p["replicas_identical"]
               for p in partitions)
    assert sum(p["compacted"] for p in partitions) > 100  # the cleaner ran during the run
    assert " compacted " in r.stdout.splitlines()[0] + " "
    acks = [json.loads(line) for line in (out / "acks.jsonl").read_text().splitlines()]
    assert {a["key"] for a in acks} == {f"k{i}" for i in range(20)}


def test_chaos_refuses_an_output_folder_holding_a_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text("{}")
    r = tide("chaos", "--data-dir", str(tmp_path), "--duration", "5", "--out", str(out))
    assert r.returncode == 1 and "already holds a chaos run" in r.stderr
    assert (out / "run.json").read_text() == "{}"


def test_chaos_needs_a_cluster(tmp_path):
    r = tide("chaos", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert r.returncode == 1
    assert r.stderr.strip().startswith("tide: ") and "no cluster in" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--faults", "meteor"], "unknown fault kind 'meteor'"),
    (["--hold", "5,1"], "expected 0 < MIN <= MAX"),
    (["--duration", "0"], "must be positive"),
])
def test_bad_chaos_arguments(tmp_path, args, message):
    r = tide("chaos", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


# 72 s on a quiet machine; several minutes on a loaded 2-core one (the app must then
# finish its input after healing, and the output is read back).
@pytest.mark.timeout(720)
def test_transactional_chaos_run_loses_and_duplicates_no_output(cluster_dir, tmp_path):
    """Issue 27: an exactly-once consume-transform-produce app (confluent-kafka,
    read_committed input, offsets sent in its transactions) through broker kills and
    pauses, which move its transaction coordinator and partition leaders: the
    read_committed output holds each acknowledged input's output exactly once."""
    out = tmp_path / "out"
    r = tide("chaos", "--data-dir", str(cluster_dir), "--duration", "20", "--seed", "11",
             "--out", str(out), "--hold", "1.5,3", "--gap", "0.5,1", "--warmup", "3",
             "--rate", "50", "--transactional", "40",
             "--faults", "kill_leader,kill_broker,pause_broker", timeout_s=600)
    assert r.returncode == 0, r.stdout + r.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    txn = verdict["transactional"]
    assert verdict["ok"] and txn is not None, r.stdout
    assert txn["lost"] == 0 and txn["duplicated"] == 0 and txn["unknown"] == 0
    assert txn["inputs_acked"] > 200
    # Each input record once: an input the feeder's client wrote twice has two outputs.
    assert txn["outputs"] == txn["inputs_acked"] + txn["inputs_written_twice"]
    assert txn["transactions_committed"] > 20
    assert "transactional: " in r.stdout and "lost 0, duplicated 0" in r.stdout

    # The faults happened while the app ran: brokers were killed or paused between its
    # first and last committed transaction (on a loaded machine the app may commit its
    # first transaction only after the first fault).
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    applied = [f for f in faults if f["action"] in ("kill", "pause") and f["ok"]
               and f["fault"] != "heal-all"]
    assert len(applied) >= 3 and {f["action"] for f in applied} >= {"kill"}
    assert verdict["faults_applied"] == len(applied)
    first_commit_ms, last_commit_ms = verdict["transactional_commits_unix_ms"]
    during = [f for f in applied if first_commit_ms < f["unix_ms"] < last_commit_ms]
    assert len(during) >= 2 and any(f["action"] == "kill" for f in during), (applied, txn)
