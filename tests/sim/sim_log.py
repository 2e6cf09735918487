"""An in-memory replica log with a flush point, for the simulation.

A log is a list of ``Batch(base_offset, last_offset, epoch, payload_id,
topic_id)`` starting at offset 0, plus the real ``LeaderEpochCache`` in memory,
the topic ID of the incarnation it was made for (Kafka's ``partition.metadata``,
written when the log is created) and its entry in the HW checkpoint file. A
batch carries the topic ID of the incarnation its leader appended it to, so a
log holding another incarnation's records is visible (``check``). Appends
land "in the page cache"; ``flush()`` makes everything so far durable. A crash
keeps the flushed prefix and a random part of the unflushed tail (whole
batches), like a torn write after power loss; the epoch cache, which the real
broker fsyncs on every change, survives and is truncated to the recovered LEO
as log recovery does. Truncation is durable (Kafka truncates files and
fsyncs the epoch checkpoint).

The broker's own shell writes to it (``Partition.persist``, ``append_as_leader``):
it offers the operations of ``storage.Log`` that those use, with batches in
place of bytes. A ``DiskFaults`` makes them fail as a failing disk does
(``KafkaStorageError``, nothing changed): appends, truncations, epoch-cache
writes and flushes.
"""

from __future__ import annotations

import bisect
import itertools
import random
from typing import NamedTuple

from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.proto.errors import KafkaStorageError
from tidewater.proto.topic_id import topic_id_to_text


class Batch(NamedTuple):
    base_offset: int
    last_offset: int
    epoch: int
    payload_id: int  # unique per produce request: tells two records at one offset apart
    topic_id: bytes = b""  # the topic incarnation the batch was produced to

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    # what the produce path reads of an append (storage.Log's AppendInfo)
    @property
    def first_offset(self) -> int:
        return self.base_offset

    @property
    def record_count(self) -> int:
        return self.next_offset - self.base_offset

    duplicate = False

    def __repr__(self) -> str:
        return (f"Batch({self.base_offset}..{self.last_offset} epoch {self.epoch} payload "
                f"{self.payload_id} of {_id_text(self.topic_id)})")


class LogInvariantError(AssertionError):
    """The log broke its own format invariants (a bug in the caller)."""


class SimRecords(NamedTuple):
    """What a produce request carries, for the simulation's log."""

    record_count: int
    payload_id: int
    topic_id: bytes  # the incarnation the producer meant (the leader's)

    def __len__(self) -> int:
        return self.record_count


class DiskFaults:
    """A disk that sometimes fails a write: each kind of write fails with its probability,
    before anything of it is written (``KafkaStorageError``)."""

    KINDS = ("append", "truncate", "epoch", "flush", "checkpoint")

    def __init__(self, rng: random.Random, probabilities: dict[str, float]):
        self.rng = rng
        self.probabilities = probabilities
        self.failed: dict[str, int] = dict.fromkeys(self.KINDS, 0)

    def check(self, kind: str) -> None:
        p = self.probabilities.get(kind, 0.0)
        if p and self.rng.random() < p:
            self.failed[kind] += 1
            raise KafkaStorageError(f"simulated I/O error: {kind}")


class _EpochCacheOnDisk:
    """The log's epoch cache as the shell writes it: an assign may fail like a write."""

    def __init__(self, log: SimLog):
        self._log = log

    def assign(self, epoch: int, start_offset: int) -> None:
        self._log._fail("epoch")
        self._log.cache.assign(epoch, start_offset)

    def __getattr__(self, name: str):
        return getattr(self._log.cache, name)


class SimLog:
    _serials = itertools.count()

    def __init__(self, topic_id: bytes | None = b"", faults: DiskFaults | None = None) -> None:
        self.serial = next(self._serials)  # tells log objects apart (ids get reused)
        self.topic_id = topic_id  # partition.metadata (None: a log made before topic IDs)
        self.hw_checkpoint = 0  # this log's line in replication-offset-checkpoint
        self.batches: list[Batch] = []
        self.cache = LeaderEpochCache(None)
        self.flushed_offset = 0  # everything below is durable
        self.truncations = 0  # bumped whenever batches are removed (truncation or crash)
        self._checked_truncations = 0
        self._checked_count = 0
        self._checked_topic_id: bytes | None = None
        self._epoch_changes: list[tuple[int, int]] = []
        self.faults = faults
        self.config = None  # the LogConfig the shell gave it (the simulation reads none)

    # The LogView the replication core reads (tidewater.broker.replication.replica): the
    # simulation has no retention, so the log always starts at 0.
    log_start_offset = 0

    @property
    def leader_epoch_cache(self) -> _EpochCacheOnDisk:
        return _EpochCacheOnDisk(self)

    def _fail(self, kind: str) -> None:
        if self.faults is not None:
            self.faults.check(kind)

    _empty_end_offset = 0  # the LEO of an empty log

    @property
    def log_end_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self._empty_end_offset

    @property
    def latest_epoch(self) -> int:
        return self.cache.latest_epoch

    # The simulation writes no transactions: nothing holds the last stable offset back.
    first_unstable_offset = None

    def append_as_leader(self, records: SimRecords, leader_epoch: int, now_ms: int, *,
                         markers_allowed: bool = False, coordinator_origin: bool = False
                         ) -> Batch:
        """``records.topic_id``: the incarnation the leader appends to (the simulation
        writes no markers nor transactions: ``markers_allowed`` and ``coordinator_origin``
        change nothing)."""
        self._fail("append")
        base = self.log_end_offset
        batch = Batch(base, base + records.record_count - 1, leader_epoch, records.payload_id,
                      records.topic_id or b"")
        self.cache.assign(leader_epoch, base)
        self.batches.append(batch)
        return batch

    @staticmethod
    def batch_bounds(batches: tuple[Batch, ...]) -> list[tuple[int, int, int]]:
        """(position, base offset, next offset) of each batch of a fetched chunk."""
        return [(i, b.base_offset, b.next_offset) for i, b in enumerate(batches)]

    def append_as_follower(self, batches: tuple[Batch, ...], now_ms: int = 0) -> None:
        self._fail("append")
        for batch in batches:
            if batch.base_offset != self.log_end_offset:
                raise LogInvariantError(
                    f"follower append at {batch.base_offset}, LEO is {self.log_end_offset}")
            self.cache.assign(batch.epoch, batch.base_offset)
            self.batches.append(batch)

    def read(self, start_offset: int, max_batches: int) -> tuple[Batch, ...]:
        """Whole batches from the one containing ``start_offset``."""
        index = self._index_of_batch_containing(start_offset)
        return tuple(self.batches[index:index + max_batches])

    def truncate_to(self, offset: int) -> None:
        """Drop every batch holding an offset >= ``offset`` (a batch is never split)."""
        self._fail("truncate")
        keep = self._index_of_batch_containing(offset)
        if keep < len(self.batches):
            del self.batches[keep:]
            self.truncations += 1
        self.cache.truncate_from_end(offset)
        self.cache.truncate_from_end(self.log_end_offset)
        self.flushed_offset = min(self.flushed_offset, self.log_end_offset)

    def truncate_fully_and_start_at(self, start_offset: int) -> None:
        """Drop everything and start at ``start_offset`` (a follower behind a leader's log
        start: storage.Log's rule). The simulation has no retention, so the core asks for
        it only if it breaks."""
        self._fail("truncate")
        if self.batches:
            self.batches.clear()
            self.truncations += 1
        self.log_start_offset = start_offset
        self._empty_end_offset = start_offset
        self.cache.clear()
        self.flushed_offset = start_offset

    def flush(self) -> None:
        self._fail("flush")
        self.flushed_offset = self.log_end_offset

    def crash(self, rng: random.Random) -> int:
        """Lose a random part of the unflushed tail; returns the first offset lost (or the LEO)."""
        unflushed = [i for i, b in enumerate(self.batches) if b.next_offset > self.flushed_offset]
        if unflushed:
            cut_index = rng.randint(unflushed[0], len(self.batches))
            if cut_index < len(self.batches):
                del self.batches[cut_index:]
                self.truncations += 1
        leo = self.log_end_offset
        self.cache.truncate_from_end(leo)  # log recovery
        self.flushed_offset = leo
        return leo

    def batch_at(self, offset: int) -> Batch | None:
        index = self._index_of_batch_containing(offset)
        if index < len(self.batches) and self.batches[index].base_offset <= offset:
            return self.batches[index]
        return None

    def check(self, topic_id: bytes | None = None) -> None:
        """Offsets contiguous from 0, epochs non-decreasing, the cache agrees with the batches,
        and every batch was produced to incarnation ``topic_id`` (default: the log's own).

        Incremental: batches checked before are only re-checked after a truncation or
        for another ``topic_id``.
        The cache must list exactly the epoch changes of the batches, plus at most
        one newer epoch starting at the LEO (a leader that has not appended yet).
        """
        expected_topic_id = (self.topic_id if topic_id is None else topic_id) or b""
        if (self._checked_truncations != self.truncations
                or self._checked_topic_id != expected_topic_id):
            self._checked_truncations = self.truncations
            self._checked_topic_id = expected_topic_id
            self._checked_count, self._epoch_changes = 0, []
        expected = (self.batches[self._checked_count - 1].next_offset if self._checked_count
                    else self.log_start_offset)
        last_epoch = self._epoch_changes[-1][0] if self._epoch_changes else -1
        for batch in self.batches[self._checked_count:]:
            if batch.base_offset != expected or batch.last_offset < batch.base_offset:
                raise LogInvariantError(f"offsets not contiguous at {batch}, expected {expected}")
            if batch.epoch < last_epoch:
                raise LogInvariantError(f"epoch went down at {batch} after epoch {last_epoch}")
            if batch.topic_id != expected_topic_id:
                raise LogInvariantError(
                    f"a replica of incarnation {_id_text(expected_topic_id)} holds {batch}, "
                    f"produced to incarnation {_id_text(batch.topic_id)}")
            if batch.epoch != last_epoch:
                self._epoch_changes.append((batch.epoch, batch.base_offset))
            expected, last_epoch = batch.next_offset, batch.epoch
        self._checked_count = len(self.batches)
        entries = self.cache.entries()
        if entries == self._epoch_changes:
            return
        if (entries[:-1] == self._epoch_changes and entries[-1][0] > last_epoch
                and entries[-1][1] == self.log_end_offset):
            return
        raise LogInvariantError(f"epoch cache {entries} disagrees with the batches' epoch "
                                f"changes {self._epoch_changes}")

    def _index_of_batch_containing(self, offset: int) -> int:
        """Index of the first batch whose last offset >= ``offset`` (len when none)."""
        return bisect.bisect_left(self.batches, offset, key=lambda b: b.last_offset)


def _id_text(topic_id: bytes | None) -> str:
    """A topic ID as traces show it: the first 6 characters of Kafka's text form."""
    if not topic_id:
        return "(no id)"
    return topic_id_to_text(topic_id)[:6] if len(topic_id) == 16 else repr(topic_id)
