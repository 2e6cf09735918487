"""Snappy end to end: `tide produce --compression snappy` to a real RF=3 cluster, `tide
consume` reads it back, and `tide dump-log --verify` finds snappy batches on every replica."""

from __future__ import annotations

import json
import time

import pytest
from cluster_fixtures import cluster, run_tide  # noqa: F401

pytestmark = pytest.mark.integration


def wait_for_full_isr(cluster, topic: str) -> None:  # noqa: F811
    deadline = time.monotonic() + 15
    while True:
        info = json.loads(cluster.tide("topics", "describe", topic, "--json").stdout)["topics"][0]
        if all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in info["partitions"]):
            return
        assert time.monotonic() < deadline, info
        time.sleep(0.2)


def test_snappy_produce_consume_and_dump_log(cluster, tmp_path):  # noqa: F811
    topic = "snappy"
    created = cluster.tide("topics", "create", topic, "--partitions", "1", "--replication-factor", "3",
                           "--config", "min.insync.replicas=2")
    assert created.returncode == 0, created.stderr
    wait_for_full_isr(cluster, topic)

    # Enough bytes per batch for several xerial blocks (32 KiB each) in some batches.
    lines = [f"user-{i % 5}:event-{i}-" + "abcdefgh" * (i % 40) for i in range(2000)]
    ack_log = tmp_path / "acks.jsonl"
    produced = cluster.tide("produce", topic, "--acks", "all", "--compression", "snappy",
                            "--key-separator", ":", "--batch-size", "100000", "--linger-ms", "20",
                            "--ack-log", str(ack_log), input="\n".join(lines) + "\n")
    assert produced.returncode == 0, produced.stderr
    acks = [json.loads(line) for line in ack_log.read_text().splitlines()]
    assert sorted(a["offset"] for a in acks) == list(range(len(lines)))

    consumed = cluster.tide("consume", topic, "--from-beginning", "--json", "--timeout-ms", "3000")
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [r["offset"] for r in records] == list(range(len(lines)))
    by_offset = {a["offset"]: f"{a['key']}:{a['value']}" for a in acks}
    assert [f"{r['key']}:{r['value']}" for r in records] == [by_offset[r["offset"]] for r in records]
    assert sorted(by_offset.values()) == sorted(lines)

    # Every replica wrote the producer's snappy batches as they came (Kafka keeps the
    # producer's codec); dump-log decodes and verifies them offline.
    replica_dirs = sorted(cluster.data_dir.glob(f"*/**/{topic}-0"))
    assert len(replica_dirs) == 3, replica_dirs
    for directory in replica_dirs:
        dumped = run_tide("dump-log", str(directory), "--json", "--print-data", "--verify")
        assert dumped.returncode == 0, dumped.stdout[-2000:] + dumped.stderr
        events = [json.loads(line) for line in dumped.stdout.splitlines()]
        assert [e for e in events if e["type"] == "problem"] == []
        batches = [e for e in events if e["type"] == "batch"]
        assert batches and {b["compression"] for b in batches} == {"snappy"}
        assert all(b["crc_valid"] for b in batches)
        assert any(b["count"] > 100 for b in batches)  # really batched, so really compressed
        values = [e["value"] for e in events if e["type"] == "record"]
        assert len(values) == len(lines)
        assert sorted(f"{e['key']}:{e['value']}" for e in events if e["type"] == "record") == sorted(lines)
