"""The audit on compacted partitions: replicas cleaned at different points (one not at all)
hold different subsets of the old records with offset gaps, and pass every rule; a
replica holding another value at an offset is caught by replicas_agree_below_hw.

The replicas are written by the broker's own storage code (LogManager, follower appends
of one history) and cleaned by its LogCleaner, which also writes the
``cleaner-offset-checkpoint`` the audit learns the compacted partitions from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidewater.broker.storage.cleaner import LogCleaner
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

TP = TopicPartition("kv", 0)
NOW_MS = 1_700_000_000_000
CONFIG = LogConfig.from_configs({"cleanup.policy": "compact", "segment.bytes": "400",
                                 "min.cleanable.dirty.ratio": "0",
                                 "delete.retention.ms": "1000"})


def history() -> list[tuple[int, int, list[tuple[bytes, bytes | None]]]]:
    """(base offset, epoch, records): 60 updates of 4 keys over epochs 0, 2, 5, a tombstone."""
    batches, offset = [], 0
    for i in range(30):
        epoch = 0 if i < 10 else 2 if i < 20 else 5
        records = [(b"k%d" % ((i + j) % 4), b"v%d-%d" % (i, j)) for j in range(2)]
        if i == 12:
            records = [(b"k1", None), (b"k2", b"after")]
        batches.append((offset, epoch, records))
        offset += len(records)
    return batches


def write_dump(root: Path, *, cleaned: dict[int, int | None], tamper: int | None = None) -> Path:
    """Three brokers' replicas of ``kv-0``; ``cleaned[broker]``: the HW that broker's
    cleaner ran with (None: never ran). ``tamper``: an offset whose value broker 3 holds
    differently."""
    ack_log = root / "acks.jsonl"
    with ack_log.open("w") as acks:
        for base, _epoch, records in history():
            for j, (key, value) in enumerate(records):
                acks.write(json.dumps({"topic": "kv", "partition": 0, "offset": base + j,
                                       "key": key.decode(), "value": None if value is None
                                       else value.decode(), "acks": "all"}) + "\n")
    for broker in (1, 2, 3):
        data_dir = root / f"broker-{broker}"
        manager = LogManager(data_dir, LogConfig())
        manager.load(NOW_MS)
        log = manager.get_or_create(TP, CONFIG, NOW_MS, b"\x01" * 16)
        for base, epoch, records in history():
            if broker == 3 and tamper is not None and base <= tamper < base + len(records):
                records = [(k, b"other" if base + j == tamper else v)
                           for j, (k, v) in enumerate(records)]
            log.append_as_follower(encode_batch(records, base_offset=base,
                                                partition_leader_epoch=epoch,
                                                base_timestamp_ms=NOW_MS - 60_000), NOW_MS)
        hw = log.log_end_offset
        if cleaned.get(broker) is not None:
            log.flush()
            results = LogCleaner(data_dir).clean_logs({TP: log}, {TP: cleaned[broker]}, NOW_MS)
            assert results, broker
        manager.checkpoint_high_watermarks({TP: hw})
        manager.shutdown()
    return ack_log


def audit(spark, root: Path, ack_log: Path) -> dict[str, int]:
    from tidewater.audit.job import load_inputs
    from tidewater.audit.rules import run_rules

    inputs, _inventory = load_inputs(spark, [str(root)], [], [str(ack_log)])
    assert inputs.compacted == {("kv", 0)}
    results = run_rules(inputs)
    return {r.name: r.violation_count for r in results.rules}


def test_replicas_compacted_differently_pass_every_rule(spark, tmp_path):
    ack_log = write_dump(tmp_path, cleaned={1: 60, 2: 30, 3: None})
    counts = audit(spark, tmp_path, ack_log)
    assert counts == {name: 0 for name in counts}, counts


def test_a_different_value_at_an_offset_is_caught(spark, tmp_path):
    ack_log = write_dump(tmp_path, cleaned={1: 60, 2: 60, 3: 60}, tamper=59)
    counts = audit(spark, tmp_path, ack_log)
    assert counts["replicas_agree_below_hw"] >= 1, counts
    assert counts["offsets_contiguous"] == 0 and counts["epoch_checkpoint_matches_log"] == 0
