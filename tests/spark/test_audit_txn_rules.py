"""The audit's transaction rules through Spark (audit/rules.py wiring of
audit/transactions.py): three brokers' replicas of one partition written by the broker's
own storage code (follower appends, which also write the ``.txnindex``), holding a
committed, an aborted and an open transaction; then each rule is broken on purpose."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

TP = TopicPartition("txn", 0)
NOW_MS = 1_700_000_000_000
TRANSACTIONAL, CONTROL = 0x10, 0x20
TXN_RULES = ("transactions_end_with_markers", "transaction_markers_agree",
             "read_committed_excludes_aborted")


def data(offset: int, pid: int, epoch: int, seq: int) -> bytes:
    return encode_batch([(b"k", b"v%d" % offset)], base_offset=offset, partition_leader_epoch=0,
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        attributes=TRANSACTIONAL, base_timestamp_ms=NOW_MS)


def marker(offset: int, pid: int, epoch: int, kind: int) -> bytes:
    return encode_batch([(struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0))],
                        base_offset=offset, partition_leader_epoch=0, producer_id=pid,
                        producer_epoch=epoch, attributes=TRANSACTIONAL | CONTROL,
                        base_timestamp_ms=NOW_MS)


def history(*, unmarked: bool = False) -> list[bytes]:
    """Producer 7 commits (0-1, COMMIT at 2); producer 8 aborts (3-4, ABORT at 5);
    producer 9's transaction at 6 is open at the log end. ``unmarked``: producer 7's
    epoch 1 writes at 3 with no marker ending its epoch-0 transaction."""
    if unmarked:
        return [data(0, 7, 0, 0), data(1, 7, 0, 1), data(2, 7, 1, 0), marker(3, 7, 1, 1),
                data(4, 9, 0, 0)]
    return [data(0, 7, 0, 0), data(1, 7, 0, 1), marker(2, 7, 0, 1), data(3, 8, 0, 0),
            data(4, 8, 0, 1), marker(5, 8, 0, 0), data(6, 9, 0, 0)]


def write_dump(root: Path, batches: dict[int, list[bytes]]) -> None:
    for broker, log_batches in batches.items():
        manager = LogManager(root / f"broker-{broker}", LogConfig())
        manager.load(NOW_MS)
        log = manager.get_or_create(TP, LogConfig(), NOW_MS, b"\x02" * 16)
        for batch in log_batches:
            log.append_as_follower(batch, NOW_MS)
        manager.checkpoint_high_watermarks({TP: log.log_end_offset})
        manager.shutdown()


def audit(spark, root: Path) -> dict[str, tuple[int, dict]]:
    from tidewater.audit.job import load_inputs
    from tidewater.audit.rules import run_rules

    inputs, _inventory = load_inputs(spark, [str(root)], [], [])
    return {r.name: (r.violation_count, r.info) for r in run_rules(inputs).rules}


def test_ended_and_open_transactions_pass_and_are_counted(spark, tmp_path):
    write_dump(tmp_path, {b: history() for b in (1, 2, 3)})
    assert list((tmp_path / "broker-1" / "txn-0").glob("*.txnindex"))  # the broker wrote it
    results = audit(spark, tmp_path)
    assert {name: results[name][0] for name in TXN_RULES} == dict.fromkeys(TXN_RULES, 0)
    info = results["transactions_end_with_markers"][1]
    assert (info["committed"], info["aborted"], info["open"]) == (3, 3, 3)  # per replica
    assert "producer 9 epoch 0 from offset 6" in info["open_examples"][0]


def test_each_transaction_rule_catches_its_breakage(spark, tmp_path):
    # Broker 3 holds COMMIT where the others hold producer 8's ABORT; every replica
    # misses a marker between producer 7's epochs (a second partition folder set).
    flipped = history()
    flipped[5] = marker(5, 8, 0, 1)
    write_dump(tmp_path, {1: history(), 2: history(), 3: flipped})
    # Broker 2's .txnindex is lost: its read_committed view would show producer 8's records.
    for index in (tmp_path / "broker-2" / "txn-0").glob("*.txnindex"):
        index.unlink()
    results = audit(spark, tmp_path)
    assert results["transaction_markers_agree"][0] == 1
    assert results["read_committed_excludes_aborted"][0] == 2  # batches 3 and 4
    assert results["transactions_end_with_markers"][0] == 0

    unmarked = tmp_path / "unmarked"
    write_dump(unmarked, {b: history(unmarked=True) for b in (1, 2)})
    assert audit(spark, unmarked)["transactions_end_with_markers"][0] == 2  # one per replica
