"""The producer's record accumulator: per-partition queues of batches being filled.

Pure bookkeeping, no I/O and no threads: time comes in as ``now_ms`` so the
batching rules are tested without sockets. The producer's sender thread owns
the calls (under the producer's lock).

Rules (Kafka's ``RecordAccumulator``):
- A record joins the last batch of its partition if the batch's estimated size
  stays within ``batch_size_bytes``; otherwise a new batch starts. A record
  larger than a batch gets a batch of its own.
- A partition is *ready* when its first batch is full (a second batch exists or
  it reached the size), its first batch waited ``linger_ms``, a retry backoff
  ended, or a flush is under way; and it is not *muted* (a request for it is in
  flight: one in-flight batch per partition keeps records in order across retries).
- Batches not delivered within ``delivery_timeout_ms`` of creation expire.

Each record is encoded into its batch when it is appended
(``proto.batch_builder``), so the sender only writes a batch's header and
CRC. A record's future is a ``RecordFuture``: its batch and its index, no
lock of its own; the batch holds the outcome all its records share and their
done-callbacks (Kafka's ``ProduceRequestResult`` and ``FutureRecordMetadata``),
so settling a batch costs one lock, not one per record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast, overload

from tidewater.client.metadata import TopicPartition
from tidewater.proto.batch import set_producer_fields
from tidewater.proto.batch_builder import BatchBuilder, Headers

LOGGER = logging.getLogger(__name__)

BATCH_OVERHEAD_BYTES = 61  # RecordBatch v2 header
# A future that is already done (cancelled by its caller) refuses a result with one of these.
_FUTURE_DONE_ERRORS = (concurrent.futures.InvalidStateError, asyncio.InvalidStateError)
RECORD_OVERHEAD_BYTES_MAX = 21  # attributes + worst-case varints of one record


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 with acks=0."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def estimate_record_bytes(key: bytes | None, value: bytes | None, headers: Headers = ()) -> int:
    """Upper bound of a record's encoded size (uncompressed); a header's name is str or
    UTF-8 bytes, as the batch builder takes it."""
    size = RECORD_OVERHEAD_BYTES_MAX + (len(key) if key else 0) + (len(value) if value else 0)
    for name, hvalue in headers:
        size += 10 + len(name.encode() if isinstance(name, str) else name) + (len(hvalue) if hvalue else 0)
    return size


class RecordFuture:
    """The future of one record (Kafka's ``FutureRecordMetadata``): its batch and its index.

    No lock or condition of its own: the batch's completion (``ProducerBatch``)
    is shared by all its records. The API is ``concurrent.futures.Future``'s
    as callers use it: ``result(timeout)``, ``exception(timeout)``, ``done()``,
    ``cancelled()``, ``running()``, ``add_done_callback(fn)``, ``cancel()``.
    It is not a ``concurrent.futures.Future`` (``concurrent.futures.wait`` does
    not take it). ``cancel()`` only stops this future from reporting: the record
    is sent anyway, as with a cancelled ``Future``.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int):
        self._batch = batch
        self._index = index

    def __repr__(self) -> str:
        b = self._batch
        state = ("cancelled" if self.cancelled() else "failed" if b._done and b._error is not None
                 else "done" if b._done else "pending")
        return f"<RecordFuture {b.tp.topic}-{b.tp.partition} #{self._index} {state}>"

    def cancelled(self) -> bool:
        cancelled = self._batch._cancelled
        return cancelled is not None and self._index in cancelled

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return self._batch._done or self.cancelled()

    def cancel(self) -> bool:
        """Like ``Future.cancel``: True (and done-callbacks run) unless already done."""
        return self._batch.cancel_record(self)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        if not batch._done or batch._cancelled is not None:
            batch.wait_record(self, timeout)
        return batch._error

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self._batch
        if not batch._done or batch._cancelled is not None:
            batch.wait_record(self, timeout)
        if batch._error is not None:
            raise batch._error
        return batch.metadata(self._index)

    def add_done_callback(self, fn: Callable[[RecordFuture], object]) -> None:
        """Call ``fn(self)`` once this future is done (now, if it is)."""
        batch = self._batch
        if not batch._done:
            with batch._lock:
                if not batch._done and not self.cancelled():
                    callbacks = batch._callbacks
                    assert callbacks is not None  # None only once done
                    callbacks.append(self)
                    callbacks.append(fn)
                    return
        _run_callback(fn, self)


class SettleableFuture(Protocol):
    """A per-record future of an external kind (the asyncio producer's ``asyncio.Future``)."""

    def set_result(self, result: RecordMetadata, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


_F = TypeVar("_F", covariant=True)  # the futures a RecordAccumulator hands out
_SF = TypeVar("_SF", bound=SettleableFuture)


def _run_callback(fn: Callable[[RecordFuture], object], future: RecordFuture) -> None:
    try:
        fn(future)
    except Exception:  # like concurrent.futures: a bad callback must not stop the others
        LOGGER.exception("exception calling callback for %r", future)


class ProducerBatch:
    """A batch of one partition: its records' bytes (``builder``) and, once settled, the
    outcome all its records share (Kafka's ``ProduceRequestResult``)."""

    __slots__ = ("tp", "created_ms", "builder", "timestamps", "futures", "size_bytes", "attempts",
                 "retry_after_ms", "encoded", "postponed", "last_error", "order", "producer_id",
                 "producer_epoch", "base_sequence", "_stamped", "attributes",
                 "_lock", "_cond", "_done", "_error", "_base_offset", "_log_append_time_ms",
                 "_callbacks", "_cancelled", "grow_limit_bytes")

    def __init__(self, tp: TopicPartition, created_ms: int, attributes: int = 0):
        self.tp = tp
        self.attributes = attributes  # header bits besides compression (transactional)
        self.created_ms = created_ms
        self.builder: BatchBuilder | None = BatchBuilder()  # None once closed
        self.timestamps: list[int] = []  # each record's timestamp, for its RecordMetadata
        self.futures: list[SettleableFuture] | None = None  # per-record futures of an external kind (asyncio)
        self.size_bytes = BATCH_OVERHEAD_BYTES  # estimated (upper bound), for sizing and the buffer
        self.attempts = 0
        self.retry_after_ms = 0
        self.encoded: bytes | None = None  # set by close(), resent as-is on retries
        self.postponed = False  # held back (no leader known) until retry_after_ms
        self.last_error: BaseException | None = None  # why the last attempt failed (for the expiry message)
        self.order = 0  # creation order in the accumulator: retries go back in this order
        # How far it may grow past batch_size_bytes, asked once when it first would (-1: not yet).
        self.grow_limit_bytes = -1
        # Idempotent producers (client/idempotence.py): the numbers it is sent with, -1: none.
        self.producer_id = self.producer_epoch = self.base_sequence = -1
        self._stamped = (-1, -1, -1)  # the producer fields ``encoded`` carries
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None  # made by the first waiter
        self._done = False
        self._error: BaseException | None = None
        self._base_offset = -1
        self._log_append_time_ms = -1
        # future, fn, future, fn, ...: one flat list (no tuple per callback), hence Any.
        self._callbacks: list[Any] | None = []
        self._cancelled: set[int] | None = None

    @property
    def record_count(self) -> int:
        return len(self.timestamps)

    def close(self, compression: int) -> bytes:
        """Finish the batch for sending (the sender, once: no record joins it after it left
        its queue); its builder's buffer is dropped, so it is held once, as ``encoded``.
        An idempotent batch carries its producer id, epoch and base sequence: restamped
        (and its CRC redone) when they changed since (an epoch bump renumbers it).
        The header carries ``attributes`` (a transactional producer's batches: the
        transactional bit)."""
        fields = (self.producer_id, self.producer_epoch, self.base_sequence)
        if self.encoded is None:
            assert self.builder is not None  # dropped only once encoded
            self.encoded = self.builder.build(compression, producer_id=fields[0],
                                              producer_epoch=fields[1], base_sequence=fields[2],
                                              attributes=self.attributes)
            self.builder = None
            self._stamped = fields
        elif fields != self._stamped:
            encoded = bytearray(self.encoded)
            set_producer_fields(encoded, *fields)
            self.encoded, self._stamped = bytes(encoded), fields
        return self.encoded

    def is_full(self, batch_size_bytes: int) -> bool:
        return self.size_bytes >= batch_size_bytes

    def metadata(self, index: int) -> RecordMetadata:
        """Where record ``index`` landed (the batch succeeded)."""
        base = self._base_offset
        log_append_time_ms = self._log_append_time_ms
        return RecordMetadata(self.tp.topic, self.tp.partition, base + index if base >= 0 else -1,
                              log_append_time_ms if log_append_time_ms >= 0 else self.timestamps[index])

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Every record succeeded: offset = base offset + index (-1 stays -1)."""
        self._settle(None, base_offset, log_append_time_ms)

    def fail(self, exc: BaseException) -> None:
        self._settle(exc, -1, -1)

    def _settle(self, error: BaseException | None, base_offset: int, log_append_time_ms: int) -> None:
        with self._lock:
            if self._done:
                return  # settled already (the first outcome stands)
            self._error = error
            self._base_offset = base_offset
            self._log_append_time_ms = log_append_time_ms
            self._done = True
            callbacks, self._callbacks = self._callbacks, None  # also breaks future<->batch cycles
            assert callbacks is not None  # None only once done
            if self._cond is not None:
                self._cond.notify_all()
        if self.futures is not None:
            self._settle_external_futures()
        for i in range(0, len(callbacks), 2):
            _run_callback(callbacks[i + 1], callbacks[i])

    def _settle_external_futures(self) -> None:
        error = self._error
        for index, fut in enumerate(self.futures or ()):
            try:
                if error is None:
                    fut.set_result(self.metadata(index))
                else:
                    fut.set_exception(error)
            except _FUTURE_DONE_ERRORS:
                pass  # the caller cancelled it

    def wait_record(self, future: RecordFuture, timeout: float | None) -> None:
        """Block until the batch is settled or ``future`` cancelled; raise CancelledError
        (cancelled) or TimeoutError (``timeout`` seconds passed first)."""
        index = future._index
        with self._lock:
            if not self._done and not (self._cancelled and index in self._cancelled):
                if self._cond is None:
                    self._cond = threading.Condition(self._lock)
                self._cond.wait_for(
                    lambda: self._done or (self._cancelled is not None and index in self._cancelled),
                    timeout)
            if self._cancelled is not None and index in self._cancelled:
                raise concurrent.futures.CancelledError()
            if not self._done:
                raise TimeoutError()

    def cancel_record(self, future: RecordFuture) -> bool:
        with self._lock:
            if self._done:
                return False
            if self._cancelled is not None and future._index in self._cancelled:
                return True  # cancelled before: its callbacks ran then
            if self._cancelled is None:
                self._cancelled = set()
            self._cancelled.add(future._index)
            callbacks = self._callbacks
            assert callbacks is not None  # None only once done
            mine = [callbacks[i + 1] for i in range(0, len(callbacks), 2) if callbacks[i] is future]
            self._callbacks = [x for i in range(0, len(callbacks), 2) if callbacks[i] is not future
                               for x in (callbacks[i], callbacks[i + 1])]
            if self._cond is not None:
                self._cond.notify_all()
        for fn in mine:
            _run_callback(fn, future)
        return True


class RecordAccumulator(Generic[_F]):
    @overload
    def __init__(self: RecordAccumulator[RecordFuture], *, batch_size_bytes: int = ...,
                 linger_ms: int = ..., future_factory: None = ...,
                 batch_attributes: int = ...) -> None: ...

    @overload
    def __init__(self: RecordAccumulator[_SF], *, batch_size_bytes: int = ..., linger_ms: int = ...,
                 future_factory: Callable[[], _SF], batch_attributes: int = ...) -> None: ...

    def __init__(self, *, batch_size_bytes: int = 16384, linger_ms: int = 0,
                 future_factory: Callable[[], SettleableFuture] | None = None,
                 batch_attributes: int = 0) -> None:
        """Each record's future is a RecordFuture on its batch; with ``future_factory`` (the
        asyncio producer's ``loop.create_future``) it is one of those, resolved with the batch.
        ``batch_attributes``: every batch's header bits besides compression (a
        transactional producer's ``TRANSACTIONAL_MASK``)."""
        self.batch_attributes = batch_attributes
        if batch_size_bytes <= 0 or linger_ms < 0:
            raise ValueError("batch_size_bytes must be positive and linger_ms >= 0")
        self.future_factory = future_factory
        # (batch, record index) -> the record's future: _F is RecordFuture without a factory
        # (the overloads above), else the factory's kind.
        self._new_future = cast("Callable[[ProducerBatch, int], _F]",
                                RecordFuture if future_factory is None else self._external_future)
        self.batch_size_bytes = batch_size_bytes
        # How far a partition's last batch may grow past batch_size_bytes (0: not at all);
        # an idempotent producer sets it (a backlogged partition, client/producer.py).
        self.grow_bytes_for: Callable[[TopicPartition], int] | None = None
        self.linger_ms = linger_ms
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._flushing = 0
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.batches_created = 0  # the sender only needs waking when this moves (or linger is 0)

    def add(self, tp: TopicPartition, key: bytes | None, value: bytes | None, headers: Headers,
            timestamp_ms: int, now_ms: int) -> _F:
        """Queue a record; return the future of its RecordMetadata. A record that cannot be
        encoded (not bytes, timestamp outside int64) raises and is not queued. A record
        that does not fit the partition's last batch within ``batch_size_bytes`` still
        joins it while the size stays within ``grow_bytes_for(tp)`` (estimated bytes;
        asked once per batch, when a record first does not fit)."""
        if headers:
            record_bytes = estimate_record_bytes(key, value, headers)
        else:  # the common case, inline: this runs once per record
            record_bytes = (RECORD_OVERHEAD_BYTES_MAX + (len(key) if key else 0)
                            + (len(value) if value else 0))
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        batch = queue[-1] if queue else None
        if (batch is None or batch.encoded is not None
                or (batch.size_bytes + record_bytes > self.batch_size_bytes
                    and batch.size_bytes + record_bytes > self._grow_limit(batch))):
            # A record larger than a batch still gets one (of its own).
            batch = ProducerBatch(tp, now_ms, self.batch_attributes)
            builder = batch.builder
            assert builder is not None  # a new batch
            builder.append(key, value, headers, timestamp_ms)
            queue.append(batch)  # only once the record is in it: a bad record leaves no empty batch
            self.batches_created += 1
            batch.order = self.batches_created
        else:
            builder = batch.builder
            assert builder is not None  # not encoded (checked above)
            builder.append(key, value, headers, timestamp_ms)
        batch.timestamps.append(timestamp_ms)
        batch.size_bytes += record_bytes
        self.buffered_bytes += record_bytes
        self.buffered_records += 1
        return self._new_future(batch, len(batch.timestamps) - 1)

    def _grow_limit(self, batch: ProducerBatch) -> int:
        """How far ``batch`` may grow: ``grow_bytes_for`` asked once, when a record first does
        not fit it (per record it cost the producer ~1 µs); a partition that can send again
        sends the batch soon, which ends its growth."""
        if batch.grow_limit_bytes < 0:
            grow = self.grow_bytes_for
            batch.grow_limit_bytes = 0 if grow is None else grow(batch.tp)
        return batch.grow_limit_bytes

    def _external_future(self, batch: ProducerBatch, index: int) -> SettleableFuture:
        """A record's future from ``future_factory``, resolved with its batch (``index``: its
        place among the batch's futures)."""
        assert self.future_factory is not None  # only made with one
        fut = self.future_factory()
        if batch.futures is None:
            batch.futures = []
        batch.futures.append(fut)
        return fut

    def ready(self, now_ms: int, muted: set[TopicPartition] | frozenset[TopicPartition] = frozenset()
              ) -> tuple[list[TopicPartition], int | None]:
        """Partitions whose first batch can be sent now, and when the next one will be (ms)."""
        ready: list[TopicPartition] = []
        next_ms: int | None = None
        for tp, queue in self._queues.items():
            if not queue or tp in muted:
                continue
            due = self._due_ms(queue, now_ms)
            if due <= now_ms:
                ready.append(tp)
            elif next_ms is None or due < next_ms:
                next_ms = due
        return ready, next_ms

    def partition_ready(self, tp: TopicPartition, now_ms: int) -> bool:
        """Whether ``tp``'s first batch can be sent now (``ready`` for one partition, unmuted)."""
        queue = self._queues.get(tp)
        return queue is not None and bool(queue) and self._due_ms(queue, now_ms) <= now_ms

    def _due_ms(self, queue: deque[ProducerBatch], now_ms: int) -> int:
        """When the first batch of a non-empty queue may be sent."""
        batch = queue[0]
        if batch.attempts > 0 or batch.postponed:
            return batch.retry_after_ms
        if self._flushing or len(queue) > 1 or batch.is_full(self.batch_size_bytes):
            return now_ms
        return batch.created_ms + self.linger_ms

    def drain_many(self, tp: TopicPartition, bytes_max: int,
                   count_max: int | None = None) -> list[ProducerBatch]:
        """Take the queued batches of ``tp`` in order, at least one, while their estimated
        sizes stay within ``bytes_max`` (one request carries them all), at most
        ``count_max`` of them (None: no limit)."""
        queue = self._queues.get(tp)
        out: list[ProducerBatch] = []
        total = 0
        while queue and (not out or (total + queue[0].size_bytes <= bytes_max
                                     and (count_max is None or len(out) < count_max))):
            batch = queue.popleft()
            batch.attempts += 1
            total += batch.size_bytes
            out.append(batch)
        if queue is not None and not queue:
            del self._queues[tp]
        return out

    def postpone(self, tp: TopicPartition, until_ms: int) -> None:
        """Hold ``tp`` back until ``until_ms`` (no leader known yet); not counted as an attempt."""
        queue = self._queues.get(tp)
        if queue:
            queue[0].retry_after_ms = until_ms
            queue[0].postponed = True

    def reenqueue_many(self, batches: list[ProducerBatch], now_ms: int, backoff_ms: int) -> None:
        """Put batches to retry back at the front of their partition's queue, in order."""
        for batch in reversed(batches):
            self.reenqueue(batch, now_ms, backoff_ms)

    def reenqueue(self, batch: ProducerBatch, now_ms: int, backoff_ms: int) -> None:
        """Put a batch to retry back in its partition's queue, before every batch created
        after it: with several requests in flight, the answers of later ones may have put
        their batches back first (Kafka's insertInSequenceOrder)."""
        batch.retry_after_ms = now_ms + backoff_ms
        queue = self._queues.setdefault(batch.tp, deque())
        i = 0
        while i < len(queue) and queue[i].order < batch.order:
            i += 1
        queue.insert(i, batch)

    def queued_batches(self, tp: TopicPartition) -> int:
        queue = self._queues.get(tp)
        return 0 if queue is None else len(queue)

    def first_is_retry(self, tp: TopicPartition) -> bool:
        """``tp``'s first queued batch was sent before (it waits for the requests in flight)."""
        queue = self._queues.get(tp)
        return queue is not None and bool(queue) and queue[0].attempts > 0

    def release(self, batch: ProducerBatch) -> None:
        """A batch left the producer for good (delivered or failed): free its budget."""
        self.buffered_bytes -= batch.size_bytes - BATCH_OVERHEAD_BYTES
        self.buffered_records -= batch.record_count

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch]:
        """Remove and return queued batches older than the delivery timeout."""
        expired = []
        for tp in list(self._queues):
            queue = self._queues[tp]
            while queue and now_ms - queue[0].created_ms >= delivery_timeout_ms:
                expired.append(queue.popleft())
            if not queue:
                del self._queues[tp]
        return expired

    def abort_all(self) -> list[ProducerBatch]:
        batches = [b for q in self._queues.values() for b in q]
        self._queues.clear()
        return batches

    def begin_flush(self) -> None:
        self._flushing += 1

    def end_flush(self) -> None:
        self._flushing -= 1
