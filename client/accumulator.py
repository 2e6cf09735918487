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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

from client.metadata import TopicPartition

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


class PendingRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def estimate_record_bytes(key: bytes | None, value: bytes | None,
                          headers: tuple[tuple[str, bytes | None], ...] = ()) -> int:
    """Upper bound of a record's encoded size (uncompressed)."""
    size = RECORD_OVERHEAD_BYTES_MAX + (len(key) if key else 0) + (len(value) if value else 0)
    for name, hvalue in headers:
        size += 10 + len(name.encode()) + (len(hvalue) if hvalue else 0)
    return size


@dataclass(eq=False)
class ProducerBatch:
    tp: TopicPartition
    created_ms: int
    records: list[PendingRecord] = field(default_factory=list)
    futures: list[Future] = field(default_factory=list)
    size_bytes: int = BATCH_OVERHEAD_BYTES
    attempts: int = 0
    retry_after_ms: int = 0
    encoded: bytes | None = None  # filled once by the sender, resent as-is on retries
    postponed: bool = False  # held back (no leader known) until retry_after_ms
    last_error: BaseException | None = None  # why the last attempt failed (for the expiry message)

    def try_append(self, record: PendingRecord, record_bytes: int, future: Future,
                   batch_size_bytes: int) -> bool:
        if self.records and self.size_bytes + record_bytes > batch_size_bytes:
            return False
        self.records.append(record)
        self.futures.append(future)
        self.size_bytes += record_bytes
        return True

    def is_full(self, batch_size_bytes: int) -> bool:
        return self.size_bytes >= batch_size_bytes

    def complete(self, base_offset: int, log_append_time_ms: int = -1) -> None:
        """Resolve every record's future: offset = base offset + index (-1 stays -1)."""
        topic, partition = self.tp
        # Per record: one set_result (a done future, e.g. cancelled, refuses it) and no done()
        # check first: each of them takes the future's lock.
        offset_step = 1 if base_offset >= 0 else 0
        offset = base_offset
        if log_append_time_ms >= 0:
            for fut in self.futures:
                try:
                    fut.set_result(RecordMetadata(topic, partition, offset, log_append_time_ms))
                except _FUTURE_DONE_ERRORS:
                    pass
                offset += offset_step
        else:
            for record, fut in zip(self.records, self.futures, strict=True):
                try:
                    fut.set_result(RecordMetadata(topic, partition, offset, record.timestamp_ms))
                except _FUTURE_DONE_ERRORS:
                    pass
                offset += offset_step

    def fail(self, exc: BaseException) -> None:
        for fut in self.futures:
            try:
                fut.set_exception(exc)
            except _FUTURE_DONE_ERRORS:
                pass


class RecordAccumulator:
    def __init__(self, *, batch_size_bytes: int = 16384, linger_ms: int = 0,
                 future_factory: Callable[[], Future] = Future):
        """``future_factory`` makes each record's future: concurrent.futures.Future for the
        threaded producer, ``loop.create_future`` for the asyncio one (same result API)."""
        if batch_size_bytes <= 0 or linger_ms < 0:
            raise ValueError("batch_size_bytes must be positive and linger_ms >= 0")
        self.future_factory = future_factory
        self.batch_size_bytes = batch_size_bytes
        self.linger_ms = linger_ms
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._flushing = 0
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.batches_created = 0  # the sender only needs waking when this moves (or linger is 0)

    def append(self, tp: TopicPartition, record: PendingRecord, now_ms: int) -> Future:
        """Queue a record; return the future of its RecordMetadata."""
        fut = self.future_factory()
        key, value, headers, _ = record
        if headers:
            record_bytes = estimate_record_bytes(key, value, headers)
        else:  # the common case, inline: this runs once per record
            record_bytes = (RECORD_OVERHEAD_BYTES_MAX + (len(key) if key else 0)
                            + (len(value) if value else 0))
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        last = queue[-1] if queue else None
        if (last is None or last.encoded is not None
                or not last.try_append(record, record_bytes, fut, self.batch_size_bytes)):
            batch = ProducerBatch(tp=tp, created_ms=now_ms)
            batch.try_append(record, record_bytes, fut, self.batch_size_bytes)
            queue.append(batch)
            self.batches_created += 1
        self.buffered_bytes += record_bytes
        self.buffered_records += 1
        return fut

    def ready(self, now_ms: int, muted: set[TopicPartition] | frozenset = frozenset()
              ) -> tuple[list[TopicPartition], int | None]:
        """Partitions whose first batch can be sent now, and when the next one will be (ms)."""
        ready = []
        next_ms: int | None = None
        for tp, queue in self._queues.items():
            if not queue or tp in muted:
                continue
            batch = queue[0]
            if batch.attempts > 0 or batch.postponed:
                due = batch.retry_after_ms
            elif self._flushing or len(queue) > 1 or batch.is_full(self.batch_size_bytes):
                due = now_ms
            else:
                due = batch.created_ms + self.linger_ms
            if due <= now_ms:
                ready.append(tp)
            elif next_ms is None or due < next_ms:
                next_ms = due
        return ready, next_ms

    def drain(self, tp: TopicPartition) -> ProducerBatch | None:
        """Take the first batch of ``tp`` for sending."""
        queue = self._queues.get(tp)
        if not queue:
            return None
        batch = queue.popleft()
        if not queue:
            del self._queues[tp]
        batch.attempts += 1
        return batch

    def drain_many(self, tp: TopicPartition, bytes_max: int) -> list[ProducerBatch]:
        """Take the queued batches of ``tp`` in order, at least one, while their estimated
        sizes stay within ``bytes_max`` (one request carries them all)."""
        queue = self._queues.get(tp)
        out: list[ProducerBatch] = []
        total = 0
        while queue and (not out or total + queue[0].size_bytes <= bytes_max):
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
        """Put a batch to retry back at the front of its partition's queue."""
        batch.retry_after_ms = now_ms + backoff_ms
        self._queues.setdefault(batch.tp, deque()).appendleft(batch)

    def release(self, batch: ProducerBatch) -> None:
        """A batch left the producer for good (delivered or failed): free its budget."""
        self.buffered_bytes -= batch.size_bytes - BATCH_OVERHEAD_BYTES
        self.buffered_records -= len(batch.records)

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

    def has_queued(self) -> bool:
        return any(self._queues.values())

    def queued_partitions(self) -> list[TopicPartition]:
        return [tp for tp, q in self._queues.items() if q]
