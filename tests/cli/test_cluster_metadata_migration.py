"""Issue 26, plan step 5: a cluster run with one controller, restarted as a quorum of
three (``tide cluster up --controllers 3`` in its folder), keeps its metadata. Every
controller's Raft directory is formatted holding the single controller's metadata.log
as a snapshot (``controller.quorum.migration``); topics, their configs and their
records are all there, the brokers register again, and a new topic can be created."""

from __future__ import annotations

import json

import pytest
from cluster_fixtures import RunningCluster, run_tide, start_cluster, stop_cluster, wait_for

from tidewater.controller.metadata_log import read_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

VALUES = [f"value-{i}" for i in range(20)]


def registered_brokers(c: RunningCluster) -> int:
    result = c.tide("cluster", "describe", "--json")
    if result.returncode != 0:
        return 0
    return sum(not b["fenced"] for b in json.loads(result.stdout)["brokers"])


def read_back(c: RunningCluster, topic: str) -> list[str]:
    consumed = c.tide("consume", topic, "--from-beginning", "--timeout-ms", "3000")
    return sorted(consumed.stdout.splitlines()) if consumed.returncode == 0 else []


def test_one_controller_cluster_restarted_as_a_quorum_keeps_its_metadata(tmp_path):
    data_dir = tmp_path / "cluster"
    single = start_cluster(data_dir, 3, "min.insync.replicas=2",
                           up_flags=("--controllers", "1"))
    try:
        for topic, extra in (("plain", ()), ("configured", ("--config", "retention.ms=3600000"))):
            created = single.tide("topics", "create", topic, "--partitions", "2",
                                  "--replication-factor", "3", *extra)
            assert created.returncode == 0, created.stderr
            produced = single.tide("produce", topic, "--acks", "all",
                                   input="".join(f"{topic}-{v}\n" for v in VALUES))
            assert produced.returncode == 0, produced.stderr
    finally:
        stop_cluster(single)
    metadata_log = data_dir / "controller" / "metadata.log"
    assert metadata_log.stat().st_size > 0

    up = run_tide("cluster", "up", "--brokers", "3", "--data-dir", str(data_dir),
                  "--base-port", "0", "--ready-timeout-s", "90", "--controllers", "3",
                  timeout_s=180)
    quorum = RunningCluster(data_dir, up.stdout.strip().splitlines()[-1] if up.stdout else "")
    try:
        assert up.returncode == 0, up.stderr
        assert "migrated" in up.stderr and str(metadata_log) in up.stderr
        assert not metadata_log.exists()
        assert (data_dir / "controller" / "metadata.log.migrated").exists()
        assert len(quorum.manifest()["controllers"]) == 3

        wait_for(lambda: registered_brokers(quorum) == 3, "3 brokers registered", 90)
        listed = quorum.tide("topics", "list")
        assert {"plain", "configured"} <= set(listed.stdout.split()), listed.stdout
        described = quorum.tide("configs", "describe", "--entity-type", "topics",
                                "--entity-name", "configured")
        assert "retention.ms=3600000" in described.stdout, described.stdout
        for topic in ("plain", "configured"):
            expected = sorted(f"{topic}-{v}" for v in VALUES)
            assert wait_for(lambda t=topic, e=expected: read_back(quorum, t) == e,
                            f"{topic}'s records read back", 60)
        assert wait_for(lambda: quorum.tide("topics", "create", "after", "--partitions", "2",
                                            "--replication-factor", "3").returncode == 0,
                        "a topic created in the quorum", 60)
        produced = quorum.tide("produce", "after", "--acks", "all", input="new\n")
        assert produced.returncode == 0, produced.stderr
        assert read_back(quorum, "after") == ["new"]
    finally:
        stop_cluster(quorum)

    # dump-log shows the migrated snapshot in every controller's Raft directory: it ends
    # at the single controller's next offset, in epoch 1 (too few records since for a
    # controller to have taken a snapshot of its own).
    start_offset, records = read_records(data_dir / "controller" / "metadata.log.migrated")
    for name in ("controller-1", "controller-2", "controller-3"):
        dumped = run_tide("dump-log", "--json", "--print-data", str(data_dir / name / "raft"))
        assert dumped.returncode == 0, dumped.stderr
        events = [json.loads(line) for line in dumped.stdout.splitlines()]
        snapshots = [e for e in events if e["type"] == "raft_snapshot"]
        assert len(snapshots) == 1, name
        assert (snapshots[0]["end_offset"], snapshots[0]["epoch"]) == (
            start_offset + len(records), 1)
        assert "configured" in snapshots[0]["data"] and "retention.ms" in snapshots[0]["data"]


def test_an_unreadable_metadata_log_stops_cluster_up_with_one_line(tmp_path):
    """A corrupt single-controller log cannot be migrated: `cluster up` says so in one
    line and starts nothing (before: a traceback from the migration)."""
    data_dir = tmp_path / "cluster"
    (data_dir / "controller").mkdir(parents=True)
    (data_dir / "controller" / "metadata.log").write_bytes(b"\xff" * 4096)
    result = run_tide("cluster", "up", "--controllers", "3", "--brokers", "1", "--base-port",
                      "0", "--data-dir", str(data_dir))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "cluster up failed: cannot format the controllers' directories" in result.stderr
    assert "metadata.log" in result.stderr
    assert not (data_dir / "controller-1" / "raft").exists()
