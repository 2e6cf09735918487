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
"""

from __future__ import annotations

import bisect
import itertools
import random
from typing import NamedTuple

from tidewater.broker.storage.epoch_cache import LeaderEpochCache
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

    def __repr__(self) -> str:
        return (f"Batch({self.base_offset}..{self.last_offset} epoch {self.epoch} payload "
                f"{self.payload_id} of {_id_text(self.topic_id)})")


class LogInvariantError(AssertionError):
    """The log broke its own format invariants (a bug in the caller)."""


class SimLog:
    _serials = itertools.count()

    def __init__(self, topic_id: bytes | None = b"") -> None:
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

    # The LogView the replication core reads (tidewater.broker.replication.replica): the
    # simulation has no retention, so the log always starts at 0.
    log_start_offset = 0

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self.cache

    @property
    def log_end_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    @property
    def latest_epoch(self) -> int:
        return self.cache.latest_epoch

    def append_as_leader(self, record_count: int, epoch: int, payload_id: int,
                         topic_id: bytes | None = None) -> Batch:
        """``topic_id``: the incarnation the leader appends to (default: the log's)."""
        base = self.log_end_offset
        tag = self.topic_id if topic_id is None else topic_id
        batch = Batch(base, base + record_count - 1, epoch, payload_id, tag or b"")
        self.cache.assign(epoch, base)
        self.batches.append(batch)
        return batch

    def append_as_follower(self, batches: tuple[Batch, ...]) -> None:
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
        keep = self._index_of_batch_containing(offset)
        if keep < len(self.batches):
            del self.batches[keep:]
            self.truncations += 1
        self.cache.truncate_from_end(offset)
        self.cache.truncate_from_end(self.log_end_offset)
        self.flushed_offset = min(self.flushed_offset, self.log_end_offset)

    def flush(self) -> None:
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
        expected = self.batches[self._checked_count - 1].next_offset if self._checked_count else 0
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
