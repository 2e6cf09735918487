"""Batching by size and linger, muting, retries and expiry of the producer's accumulator.

Records go in and batches come out by the producer's own paths: ``add``, then
``drain_many`` and ``close`` (the bytes the sender sends, decoded here).
"""

import pytest

from tidewater.client.accumulator import (
    BATCH_OVERHEAD_BYTES,
    ProducerBatch,
    RecordAccumulator,
    RecordMetadata,
    estimate_record_bytes,
)
from tidewater.client.metadata import TopicPartition
from tidewater.proto.records import COMPRESSION_NONE, decode_batch

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def add(acc: RecordAccumulator, tp: TopicPartition, value: bytes, now_ms: int = 0, *,
        key: bytes | None = None, ts: int = 1000):
    return acc.add(tp, key, value, (), ts, now_ms)


def take(acc: RecordAccumulator, tp: TopicPartition) -> ProducerBatch | None:
    """The first queued batch of ``tp`` (a budget below one batch takes exactly one)."""
    batches = acc.drain_many(tp, bytes_max=1)
    assert len(batches) <= 1
    return batches[0] if batches else None


def values(batch: ProducerBatch) -> list[bytes]:
    """The values of a drained batch, from the bytes the sender would send."""
    return [r.value for r in decode_batch(batch.close(COMPRESSION_NONE))[1]]


def test_record_joins_batch_until_size_then_new_batch():
    size = BATCH_OVERHEAD_BYTES + 2 * estimate_record_bytes(None, b"x" * 10)
    acc = RecordAccumulator(batch_size_bytes=size, linger_ms=1000)
    for _ in range(3):
        add(acc, TP0, b"x" * 10)
    first = take(acc, TP0)
    assert values(first) == [b"x" * 10] * 2
    second = take(acc, TP0)
    assert values(second) == [b"x" * 10]
    assert take(acc, TP0) is None


def test_oversized_record_gets_its_own_batch():
    acc = RecordAccumulator(batch_size_bytes=100, linger_ms=0)
    add(acc, TP0, b"a")
    add(acc, TP0, b"b" * 500)
    add(acc, TP0, b"c")
    assert [values(take(acc, TP0)) for _ in range(3)] == [[b"a"], [b"b" * 500], [b"c"]]


def test_linger_holds_a_partial_batch_until_due():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=50)
    add(acc, TP0, b"v", now_ms=100)
    ready, next_ms = acc.ready(now_ms=120)
    assert ready == [] and next_ms == 150
    ready, _ = acc.ready(now_ms=150)
    assert ready == [TP0]


def test_full_batch_is_ready_before_linger():
    acc = RecordAccumulator(batch_size_bytes=BATCH_OVERHEAD_BYTES + 40, linger_ms=10_000)
    add(acc, TP0, b"x" * 30)
    add(acc, TP0, b"y" * 30)  # starts a second batch: the first is full
    ready, _ = acc.ready(now_ms=1)
    assert ready == [TP0]


def test_flush_makes_everything_ready_and_muting_holds_a_partition():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=10_000)
    add(acc, TP0, b"a")
    add(acc, TP1, b"b")
    acc.begin_flush()
    ready, _ = acc.ready(1, muted={TP1})
    assert ready == [TP0]
    acc.end_flush()
    assert acc.ready(1)[0] == []


def test_retry_goes_first_after_backoff_and_keeps_order():
    acc = RecordAccumulator(batch_size_bytes=BATCH_OVERHEAD_BYTES + 30, linger_ms=0)
    add(acc, TP0, b"1" * 20)
    first = take(acc, TP0)
    sent = first.close(COMPRESSION_NONE)
    add(acc, TP0, b"2" * 20)
    acc.reenqueue(first, now_ms=10, backoff_ms=100)
    assert acc.ready(50)[0] == []  # the retried batch at the head waits out its backoff
    assert acc.ready(110)[0] == [TP0]
    again = take(acc, TP0)
    assert again is first and again.attempts == 2
    assert again.close(COMPRESSION_NONE) is sent  # resent as it was
    assert values(take(acc, TP0)) == [b"2" * 20]


def test_complete_gives_offsets_base_plus_index_and_minus_one_for_acks0():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    futs = [add(acc, TP0, bytes([i]), ts=500 + i) for i in range(3)]
    batch = take(acc, TP0)
    batch.complete(base_offset=40)
    assert [f.result() for f in futs] == [RecordMetadata("t", 0, 40 + i, 500 + i) for i in range(3)]
    fut = add(acc, TP1, b"z")
    take(acc, TP1).complete(base_offset=-1, log_append_time_ms=777)
    assert fut.result() == RecordMetadata("t", 1, -1, 777)


def test_expire_removes_old_batches_and_fail_sets_exceptions():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    fut = add(acc, TP0, b"a", now_ms=0)
    add(acc, TP1, b"b", now_ms=900)
    expired = acc.expire(now_ms=1000, delivery_timeout_ms=1000)
    assert [b.tp for b in expired] == [TP0]
    expired[0].fail(TimeoutError("late"))
    with pytest.raises(TimeoutError):
        fut.result()
    assert acc.ready(1000)[0] == [TP1] and take(acc, TP0) is None


def test_buffer_accounting_returns_to_zero():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    for i in range(5):
        add(acc, TP0, b"v" * i, key=b"k")
    assert acc.buffered_records == 5 and acc.buffered_bytes > 0
    acc.release(take(acc, TP0))
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
        add(acc, TP0, bytes([i]) * 30)
    first = acc.drain_many(TP0, bytes_max=3 * one)
    assert [values(b)[0][0] for b in first] == [0, 1, 2]
    assert all(b.attempts == 1 for b in first)
    # A budget below one batch still takes one.
    assert len(acc.drain_many(TP0, bytes_max=1)) == 1
    acc.reenqueue_many(first, now_ms=0, backoff_ms=0)
    again = acc.drain_many(TP0, bytes_max=10 * one)
    assert [values(b)[0][0] for b in again] == [0, 1, 2, 4]
    assert acc.drain_many(TP0, bytes_max=one) == []


def test_postponed_partition_waits_without_counting_an_attempt():
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    add(acc, TP0, b"a")
    acc.postpone(TP0, until_ms=100)
    assert acc.ready(50)[0] == []
    assert acc.ready(100)[0] == [TP0]
    assert acc.drain_many(TP0, 1 << 20)[0].attempts == 1


def test_header_names_may_be_bytes_as_the_batch_builder_takes_them():
    """A header's name is str or UTF-8 bytes (proto.batch_builder's Headers); the size
    estimate once called .encode() on it and failed on bytes."""
    assert (estimate_record_bytes(None, b"v", ((b"name", b"x"),))
            == estimate_record_bytes(None, b"v", (("name", b"x"),)))
    acc = RecordAccumulator(batch_size_bytes=16384, linger_ms=0)
    acc.add(TP0, None, b"v", ((b"h\xc3\xa9", b"x"), ("h", None)), 1000, 0)
    (record,) = decode_batch(take(acc, TP0).close(COMPRESSION_NONE))[1]
    assert record.value == b"v"
    assert [name for name, _ in record.headers] == ["hé", "h"]


def test_a_backlogged_batch_grows_up_to_the_given_bound_and_never_past_it():
    """``grow_bytes_max`` (an idempotent producer's backlogged partition): the last batch
    takes records past batch_size_bytes up to the bound (estimated, an upper bound of
    its encoded size), then a new batch starts; without it batches stay at batch size."""
    acc = RecordAccumulator(batch_size_bytes=1000)
    value = b"x" * 100
    record_bytes = estimate_record_bytes(None, value)
    grow = 5000
    acc.grow_bytes_for = lambda tp: grow
    for _ in range(100):
        add(acc, TP0, value)
    batches = acc.drain_many(TP0, bytes_max=10**9)
    per_batch = (grow - BATCH_OVERHEAD_BYTES) // record_bytes
    assert [b.record_count for b in batches] == [per_batch] * (100 // per_batch) + (
        [100 % per_batch] if 100 % per_batch else [])
    for b in batches:
        assert b.size_bytes <= grow and len(b.close(COMPRESSION_NONE)) <= b.size_bytes
        assert values(b) == [value] * b.record_count
    acc.grow_bytes_for = lambda tp: 0
    for _ in range(20):
        add(acc, TP0, value)  # no growth: batch size
    assert all(b.size_bytes <= 1000 for b in acc.drain_many(TP0, bytes_max=10**9))
