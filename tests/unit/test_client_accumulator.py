"""Batching by size and linger, muting, retries and expiry of the producer's accumulator."""

import pytest

from client.accumulator import (
    BATCH_OVERHEAD_BYTES,
    PendingRecord,
    RecordAccumulator,
    RecordMetadata,
    estimate_record_bytes,
)
from client.metadata import TopicPartition

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def rec(value: bytes, key: bytes | None = None, ts: int = 1000) -> PendingRecord:
    return PendingRecord(key, value, (), ts)


def test_record_joins_batch_until_size_then_new_batch():
    size = BATCH_OVERHEAD_BYTES + 2 * estimate_record_bytes(None, b"x" * 10)
    acc = RecordAccumulator(batch_size_bytes=size, linger_ms=1000)
    for _ in range(3):
        acc.append(TP0, rec(b"x" * 10), now_ms=0)
    first = acc.drain(TP0)
    assert len(first.records) == 2
    second = acc.drain(TP0)
    assert len(second.records) == 1
    assert acc.drain(TP0) is None


def test_oversized_record_gets_its_own_batch():
    acc = RecordAccumulator(batch_size_bytes=100, linger_ms=0)
    acc.append(TP0, rec(b"a"), 0)
    acc.append(TP0, rec(b"b" * 500), 0)
    acc.append(TP0, rec(b"c"), 0)
    sizes = [len(acc.drain(TP0).records) for _ in range(3)]
    assert sizes == [1, 1, 1]


def test_linger_holds_a_partial_batch_until_due():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=50)
    acc.append(TP0, rec(b"v"), now_ms=100)
    ready, next_ms = acc.ready(now_ms=120)
    assert ready == [] and next_ms == 150
    ready, _ = acc.ready(now_ms=150)
    assert ready == [TP0]


def test_full_batch_is_ready_before_linger():
    acc = RecordAccumulator(batch_size_bytes=BATCH_OVERHEAD_BYTES + 40, linger_ms=10_000)
    acc.append(TP0, rec(b"x" * 30), now_ms=0)
    acc.append(TP0, rec(b"y" * 30), now_ms=0)  # starts a second batch: the first is full
    ready, _ = acc.ready(now_ms=1)
    assert ready == [TP0]


def test_flush_makes_everything_ready_and_muting_holds_a_partition():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=10_000)
    acc.append(TP0, rec(b"a"), 0)
    acc.append(TP1, rec(b"b"), 0)
    acc.begin_flush()
    ready, _ = acc.ready(1, muted={TP1})
    assert ready == [TP0]
    acc.end_flush()
    assert acc.ready(1)[0] == []


def test_retry_goes_first_after_backoff_and_keeps_order():
    acc = RecordAccumulator(batch_size_bytes=BATCH_OVERHEAD_BYTES + 30, linger_ms=0)
    acc.append(TP0, rec(b"1" * 20), 0)
    first = acc.drain(TP0)
    acc.append(TP0, rec(b"2" * 20), 0)
    acc.reenqueue(first, now_ms=10, backoff_ms=100)
    assert acc.ready(50)[0] == []  # the retried batch at the head waits out its backoff
    assert acc.ready(110)[0] == [TP0]
    again = acc.drain(TP0)
    assert again is first and again.attempts == 2
    assert acc.drain(TP0).records[0].value == b"2" * 20


def test_complete_gives_offsets_base_plus_index_and_minus_one_for_acks0():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    futs = [acc.append(TP0, rec(bytes([i]), ts=500 + i), 0) for i in range(3)]
    batch = acc.drain(TP0)
    batch.complete(base_offset=40)
    assert [f.result() for f in futs] == [RecordMetadata("t", 0, 40 + i, 500 + i) for i in range(3)]
    fut = acc.append(TP1, rec(b"z"), 0)
    acc.drain(TP1).complete(base_offset=-1, log_append_time_ms=777)
    assert fut.result() == RecordMetadata("t", 1, -1, 777)


def test_expire_removes_old_batches_and_fail_sets_exceptions():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    fut = acc.append(TP0, rec(b"a"), now_ms=0)
    acc.append(TP1, rec(b"b"), now_ms=900)
    expired = acc.expire(now_ms=1000, delivery_timeout_ms=1000)
    assert [b.tp for b in expired] == [TP0]
    expired[0].fail(TimeoutError("late"))
    with pytest.raises(TimeoutError):
        fut.result()
    assert acc.queued_partitions() == [TP1]


def test_buffer_accounting_returns_to_zero():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    for i in range(5):
        acc.append(TP0, rec(b"v" * i, key=b"k"), 0)
    assert acc.buffered_records == 5 and acc.buffered_bytes > 0
    acc.release(acc.drain(TP0))
    assert acc.buffered_records == 0 and acc.buffered_bytes == 0


def test_bad_settings_rejected():
    with pytest.raises(ValueError):
        RecordAccumulator(batch_size_bytes=0)
    with pytest.raises(ValueError):
        RecordAccumulator(linger_ms=-1)


def test_drain_many_takes_batches_in_order_within_a_byte_budget():
    one = BATCH_OVERHEAD_BYTES + estimate_record_bytes(None, b"x" * 30)
    acc = RecordAccumulator(batch_size_bytes=one, linger_ms=0)
    for i in range(5):
        acc.append(TP0, rec(bytes([i]) * 30), 0)
    first = acc.drain_many(TP0, bytes_max=3 * one)
    assert [b.records[0].value[0] for b in first] == [0, 1, 2]
    assert all(b.attempts == 1 for b in first)
    # A budget below one batch still takes one.
    assert len(acc.drain_many(TP0, bytes_max=1)) == 1
    acc.reenqueue_many(first, now_ms=0, backoff_ms=0)
    again = acc.drain_many(TP0, bytes_max=10 * one)
    assert [b.records[0].value[0] for b in again] == [0, 1, 2, 4]
    assert acc.drain_many(TP0, bytes_max=one) == []


def test_postponed_partition_waits_without_counting_an_attempt():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    acc.append(TP0, rec(b"a"), 0)
    acc.postpone(TP0, until_ms=100)
    assert acc.ready(50)[0] == []
    assert acc.ready(100)[0] == [TP0]
    assert acc.drain_many(TP0, 1 << 20)[0].attempts == 1
