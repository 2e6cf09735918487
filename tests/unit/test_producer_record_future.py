"""RecordFuture (one per record, one completion per batch) keeps concurrent.futures.Future's API."""

import concurrent.futures
import logging
import threading

import pytest
from test_client_fake_cluster import consume_all, fake_cluster  # noqa: F401 - the fixture

from tidewater.client.accumulator import (
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    RecordMetadata,
)
from tidewater.client.metadata import TopicPartition
from tidewater.client.producer import Producer
from tidewater.proto.errors import RequestTimedOutError, UnsupportedCompressionError

TP = TopicPartition("t", 0)


def queued(n: int = 3, ts: int = 100):
    acc = RecordAccumulator(batch_size_bytes=1 << 20, linger_ms=0)
    futs = [acc.add(TP, None, i.to_bytes(2, "big"), (), ts + i, 0) for i in range(n)]
    (batch,) = acc.drain_many(TP, bytes_max=1 << 20)
    return batch, futs


def test_callbacks_run_once_at_completion_or_at_once_when_done():
    batch, futs = queued()
    seen = []
    futs[0].add_done_callback(lambda f: seen.append(("a", f.result().offset)))
    futs[2].add_done_callback(lambda f: seen.append(("b", f.result().offset)))
    assert not any(f.done() for f in futs) and seen == []
    batch.complete(base_offset=7)
    assert seen == [("a", 7), ("b", 9)]
    futs[1].add_done_callback(lambda f: seen.append(("c", f.result().offset)))
    assert seen[-1] == ("c", 8)
    assert [f.result() for f in futs] == [RecordMetadata("t", 0, 7 + i, 100 + i) for i in range(3)]
    assert all(f.done() and f.exception() is None and not f.cancelled() for f in futs)
    batch.fail(RuntimeError("late"))  # a settled batch stays settled
    assert futs[0].exception() is None


def test_failure_reaches_result_exception_and_callbacks():
    batch, futs = queued(2)
    errors = []
    futs[1].add_done_callback(lambda f: errors.append(f.exception()))
    boom = OSError("disk")
    batch.fail(boom)
    assert errors == [boom] and futs[0].exception() is boom
    with pytest.raises(OSError):
        futs[0].result()


def test_result_times_out_then_wakes_when_another_thread_completes():
    batch, futs = queued(1)
    with pytest.raises(TimeoutError):
        futs[0].result(timeout=0.01)
    with pytest.raises(TimeoutError):
        futs[0].exception(timeout=0)
    threading.Timer(0.05, batch.complete, args=(40,)).start()
    assert futs[0].result(timeout=10).offset == 40


def test_cancel_is_per_record_and_runs_that_records_callbacks():
    batch, futs = queued(2)
    seen = []
    futs[0].add_done_callback(lambda f: seen.append(("first", f.cancelled())))
    futs[1].add_done_callback(lambda f: seen.append(("second", f.cancelled())))
    waiter_error = []
    waiter = threading.Thread(target=lambda: waiter_error.append(
        pytest.raises(concurrent.futures.CancelledError, futs[0].result, 10)))
    waiter.start()
    assert futs[0].cancel() and futs[0].cancel()  # True again, callbacks not again
    waiter.join(10)
    assert waiter_error and seen == [("first", True)]
    assert futs[0].done() and not futs[1].done()
    with pytest.raises(concurrent.futures.CancelledError):
        futs[0].exception()
    batch.complete(0)
    assert seen == [("first", True), ("second", False)]
    assert not futs[1].cancel() and futs[1].result().offset == 1
    with pytest.raises(concurrent.futures.CancelledError):
        futs[0].result()


def test_a_raising_callback_is_logged_and_the_others_still_run(caplog):
    batch, futs = queued(2)
    ran = []
    futs[0].add_done_callback(lambda f: 1 / 0)
    futs[1].add_done_callback(ran.append)
    with caplog.at_level(logging.ERROR, logger="tidewater.client.accumulator"):
        batch.complete(0)
    assert ran == [futs[1]] and "ZeroDivisionError" in caplog.text


def test_callbacks_added_from_many_threads_all_run_once():
    batch, futs = queued(400)
    counts = [0] * len(futs)
    lock = threading.Lock()

    def bump(f: RecordFuture) -> None:
        with lock:
            counts[f.result().offset] += 1

    def add(part):
        for f in part:
            f.add_done_callback(bump)

    threads = [threading.Thread(target=add, args=(futs[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    batch.complete(0)
    for t in threads:
        t.join(10)
    assert counts == [1] * len(futs)


def test_producer_sends_headers_and_timestamps_and_rejects_unencodable_records(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        with pytest.raises(TypeError):
            producer.send("t", "a str, not bytes", partition=0)
        with pytest.raises(ValueError):
            producer.send("t", b"x", partition=0, timestamp_ms=1 << 64)
        futs = [producer.send("t", f"v{i}".encode(), key=b"k" if i % 2 else None, partition=0,
                              headers=[("h", bytes([i]))], timestamp_ms=1_000 + i) for i in range(5)]
        metas = [f.result(5) for f in futs]
    assert [m.offset for m in metas] == list(range(5))
    got = consume_all(bootstrap, 5, partitions=(0,))
    assert [(r.value, r.key, r.headers, r.timestamp) for r in got] == [
        (f"v{i}".encode(), b"k" if i % 2 else None, (("h", bytes([i])),), 1_000 + i) for i in range(5)]


def test_linger_zero_sends_from_callers_without_passing_the_in_flight_limit(fake_cluster):  # noqa: F811
    # With linger 0 a send() on an idle partition sends from the caller's thread; with
    # several callers and the sender thread racing, one request per partition stays the limit
    # and every record lands once, in the order of its offsets.
    state, bootstrap = fake_cluster
    state.produce_delay_s = 0.02
    per_thread = 40
    with Producer(bootstrap, acks=1, linger_ms=0, max_in_flight_per_partition=1) as producer:
        futs: dict[bytes, RecordFuture] = {}

        def run(t: int) -> None:
            for i in range(per_thread):
                value = f"{t}-{i:03d}".encode()
                futs[value] = producer.send("t", value, partition=0)

        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        producer.flush(20)
    assert state.produce_calls_max == 1
    stored = {r.offset: r.value for r in consume_all(bootstrap, 4 * per_thread, partitions=(0,))}
    assert sorted(stored) == list(range(4 * per_thread))
    assert {f.result().offset: value for value, f in futs.items()} == stored
    for t in range(4):  # one thread's records keep their order
        offsets = [futs[f"{t}-{i:03d}".encode()].result().offset for i in range(per_thread)]
        assert offsets == sorted(offsets)


def test_unsupported_compression_is_refused_at_construction(fake_cluster):  # noqa: F811
    _state, bootstrap = fake_cluster
    with pytest.raises(UnsupportedCompressionError):
        Producer(bootstrap, compression=7)  # no such codec


def test_a_batch_that_cannot_be_built_fails_its_records_and_the_partition_goes_on(fake_cluster, monkeypatch):  # noqa: F811
    state, bootstrap = fake_cluster
    real_close = ProducerBatch.close
    calls = []

    def close_failing_once(batch, compression):
        calls.append(batch)
        if len(calls) == 1:
            raise RuntimeError("codec broke")
        return real_close(batch, compression)

    monkeypatch.setattr(ProducerBatch, "close", close_failing_once)
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        first = producer.send("t", b"lost", partition=0)
        with pytest.raises(RuntimeError, match="codec broke"):
            first.result(5)
        assert producer.send("t", b"kept", partition=0).result(5).offset == 0
        producer.flush(5)
    assert [r.value for r in consume_all(bootstrap, 1, partitions=(0,))] == [b"kept"]


def test_a_full_buffer_blocks_send_for_max_block_ms_then_frees_as_answers_come(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    state.produce_delay_s = 0.3  # the first request holds the buffer this long
    value = b"v" * 200
    with Producer(bootstrap, acks=1, linger_ms=0, buffer_memory_bytes=500, max_block_ms=50) as producer:
        futs = [producer.send("t", value, partition=0) for _ in range(3)]  # 3 x ~221 bytes: full
        with pytest.raises(RequestTimedOutError):
            producer.send("t", value, partition=0)
        producer.max_block_ms = 10_000
        futs.append(producer.send("t", value, partition=0))  # waits until the first answer
        assert [f.result(10).offset for f in futs] == [0, 1, 2, 3]
