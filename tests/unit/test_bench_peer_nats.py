"""The benchmark's peer against real nats-server processes (skipped when not installed):
a 3-node JetStream cluster forms, R3 publishes are acknowledged, a pull consumer reads
them all back, paced latency samples arrive, a killed leader is replaced, restarted
servers catch up, and every server is stopped by pid."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import peer_nats
from bench.bench_common import OwnedProcesses

pytestmark = pytest.mark.integration


def _require_peer() -> None:
    if peer_nats.nats_server_path() is None:
        pytest.skip("nats-server not installed")
    pytest.importorskip("nats")


@pytest.mark.timeout(90)
def test_nats_peer_round_trip(tmp_path):
    _require_peer()
    processes = OwnedProcesses()
    cluster = peer_nats.NatsCluster(tmp_path / "nats", processes)
    try:
        cluster.start()
        assert len(cluster.nodes) == 3
        produced = asyncio.run(peer_nats.throughput(cluster, "T", 100, duration_s=0.3))
        assert produced.records >= 200 and produced.payload_bytes == produced.records * 100
        consumed = asyncio.run(peer_nats.consume(cluster, "T", produced.records, 100))
        assert consumed.records == produced.records
        assert consumed.payload_bytes == produced.payload_bytes
        paced = asyncio.run(peer_nats.paced_latency(cluster, "P", 64, 100, 1000))
        assert paced["ack"].count == 100
        assert paced["received"] == 100
        assert paced["e2e"].p50_ms > 0
        failover = asyncio.run(peer_nats.failover(cluster, "F", 1))
        assert len(failover["samples_s"]) == 1 and failover["median_s"] > 0
        restarted = asyncio.run(peer_nats.restart(cluster, ["T", "F"], "n1"))
        assert restarted["store_bytes"] > 0
        assert 0 < restarted["after_kill_serving_s"] <= restarted["after_kill_current_s"]
        assert 0 < restarted["after_term_serving_s"] <= restarted["after_term_current_s"]
        pids = processes.pids()
        assert len(pids) == 3 + 1 + 2  # servers, the failed-over leader, n1 twice
    finally:
        processes.stop_all()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_peer_unavailable_is_typed(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_nats, "nats_server_path", lambda: None)
    cluster = peer_nats.NatsCluster(tmp_path, OwnedProcesses())
    with pytest.raises(peer_nats.PeerUnavailable, match="nats-server not installed"):
        cluster.start()
