"""The audit's transaction checks (audit/transactions.py) on hand-made logs: markers read
from real control batches, transactions ended or open, replicas' markers compared, and
the read_committed view a broker's .txnindex gives."""

from __future__ import annotations

import struct

import pytest

from tidewater.audit.transactions import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    AbortedTransaction,
    ControlKeyError,
    OpenTransaction,
    TxnBatch,
    control_type,
    markers_disagree,
    read_committed_leaks,
    read_control_type,
    read_txn_index,
    replica_transactions,
)
from tidewater.proto.records import encode_batch

pytestmark = pytest.mark.timeout(30)


def data(offset: int, pid: int = 7, epoch: int = 0, count: int = 1) -> TxnBatch:
    return TxnBatch(offset, offset + count - 1, pid, epoch)


def marker(offset: int, kind: int, pid: int = 7, epoch: int = 0) -> TxnBatch:
    return TxnBatch(offset, offset, pid, epoch, kind)


def test_control_batches_are_read_from_the_segment_bytes(tmp_path):
    segment = tmp_path / "00000000000000000000.log"
    plain = encode_batch([(b"k", b"v")], base_offset=0, producer_id=7, producer_epoch=0,
                         attributes=ATTR_TRANSACTIONAL)
    commit = encode_batch([(struct.pack(">hh", 0, CONTROL_COMMIT), struct.pack(">hi", 0, 3))],
                          base_offset=1, producer_id=7, producer_epoch=0,
                          attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL)
    abort = encode_batch([(struct.pack(">hh", 0, CONTROL_ABORT), struct.pack(">hi", 0, 3))],
                         base_offset=2, producer_id=7, producer_epoch=1,
                         attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL)
    segment.write_bytes(plain + commit + abort)
    assert read_control_type(str(segment), len(plain), len(commit)) == CONTROL_COMMIT
    assert read_control_type(str(segment), len(plain) + len(commit), len(abort)) == CONTROL_ABORT


@pytest.mark.parametrize("key", [None, b"\x00", struct.pack(">hh", 1, 0)])
def test_a_malformed_control_key_is_an_error(key):
    with pytest.raises(ControlKeyError):
        control_type(key)


def test_committed_and_aborted_transactions_end_and_an_open_one_is_reported_as_open():
    t = replica_transactions([
        data(0), data(1, pid=8), data(2, count=3), marker(5, CONTROL_COMMIT),
        marker(6, CONTROL_ABORT, pid=8), data(7), marker(8, CONTROL_ABORT, epoch=1),
        data(9, pid=9, epoch=4)])
    assert t.violations == []
    assert t.committed == 1
    assert t.aborted == [AbortedTransaction(8, 1, 6), AbortedTransaction(7, 7, 8)]
    assert t.open == [OpenTransaction(9, 4, 9)]
    assert t.markers == {5: (7, CONTROL_COMMIT), 6: (8, CONTROL_ABORT), 8: (7, CONTROL_ABORT)}


def test_a_transaction_without_a_marker_before_the_next_epoch_is_a_violation():
    t = replica_transactions([data(0, epoch=0), data(1, epoch=1), marker(2, CONTROL_COMMIT,
                                                                          epoch=1)])
    assert [offset for offset, _ in t.violations] == [0]
    assert "has no COMMIT or ABORT before epoch 1" in t.violations[0][1]
    assert t.open == []


def test_a_marker_of_an_older_epoch_or_an_unknown_type_is_a_violation():
    t = replica_transactions([data(0, epoch=3), marker(1, CONTROL_COMMIT, epoch=2),
                              marker(2, 5)])
    assert [offset for offset, _ in t.violations] == [1, 2]
    assert "marker of epoch 2 ends a transaction of epoch 3" in t.violations[0][1]
    assert "unknown type 5" in t.violations[1][1]


def test_replicas_markers_are_compared_over_the_offsets_all_hold():
    leader = {3: (7, CONTROL_COMMIT), 9: (7, CONTROL_ABORT), 20: (8, CONTROL_COMMIT)}
    same = {3: (7, CONTROL_COMMIT), 9: (7, CONTROL_ABORT)}  # ends at 15: 20 not compared
    other = {3: (7, CONTROL_ABORT), 9: (7, CONTROL_ABORT), 11: (8, CONTROL_COMMIT)}
    assert markers_disagree({1: (0, 25, leader), 2: (0, 15, same)}) == []
    problems = markers_disagree({1: (0, 25, leader), 2: (0, 15, same), 3: (0, 15, other)})
    assert [(b, o) for b, o, _ in problems] == [(3, 3), (3, 11)]
    assert "broker 3 holds ABORT of producer 7, broker 1 COMMIT of producer 7" in problems[0][2]
    assert "broker 3 holds COMMIT of producer 8, broker 1 none" in problems[1][2]


def test_the_txnindex_is_read_and_its_torn_tail_ignored(tmp_path):
    path = tmp_path / "00000000000000000000.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 7, 0, 4, 5) + struct.pack(">hqqqq", 0, 8, 6, 9, 10)
                     + b"\x00\x00\x00")
    assert read_txn_index(path) == [AbortedTransaction(7, 0, 4), AbortedTransaction(8, 6, 9)]


def test_an_aborted_batch_no_txnindex_entry_skips_leaks_into_read_committed():
    batches = [data(0), data(1, pid=8), data(2), marker(3, CONTROL_ABORT),
               marker(4, CONTROL_COMMIT, pid=8)]
    aborted = replica_transactions(batches).aborted
    assert aborted == [AbortedTransaction(7, 0, 3)]
    assert read_committed_leaks(batches, aborted, [AbortedTransaction(7, 0, 3)]) == []
    # An entry that starts too late (or none at all) leaves aborted records visible;
    # producer 8's committed batch is never counted.
    leaks = read_committed_leaks(batches, aborted, [AbortedTransaction(7, 2, 3)])
    assert [offset for offset, _ in leaks] == [0]
    assert [offset for offset, _ in read_committed_leaks(batches, aborted, [])] == [0, 2]


def test_the_markdown_report_lists_open_transactions_as_information():
    from tidewater.audit.report import render_markdown

    rule = {"name": "transactions_end_with_markers", "description": "d", "passed": True,
            "skipped": None, "checked": 9, "violations": 0, "parquet": None, "sample": [],
            "info": {"committed": 3, "aborted": 3, "open": 1,
                     "open_examples": ["txn-0 broker 1: producer 9 epoch 0 from offset 6"]}}
    text = render_markdown({"passed": True, "rules": [rule], "partition_health": []})
    assert "| transactions_end_with_markers | pass | 0 | 9 |" in text
    assert "- committed 3, aborted 3, open at the log end 1 (information" in text
    assert "  - open: txn-0 broker 1: producer 9 epoch 0 from offset 6" in text
