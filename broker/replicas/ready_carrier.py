"""Carries out a replication decision: the broker's side of a ``Ready``.

Every decision about a replica comes out of ``ReplicaState`` as a ``Ready``
(``broker/replication/ready.py`` lists its parts and their order). The
produce, fetch and control paths, the fetchers, the AlterPartition sender and
the background ticks all hand theirs to ``ReadyCarrier.apply``, synchronously
on the event loop right after the decision, so a rule has one place and its
effects one order:

1. persist (epoch cache assign with fsync, truncations, follower appends), in
   order; an operation that fails stops the rest, goes to the core
   (``ReplicaState.on_persist_failure``, which decides what it becomes) and is
   raised to the caller once the rest of the Ready is carried out;
2. fetcher transitions (follow a leader in an epoch, stop);
3. the AlterPartition, and the ReportCorruptReplica, to send;
4. long-polls woken (consumers before produce answers, as Kafka's
   ``checkAndCompleteAll`` does: newly committed records reach readers one
   write sooner), then acks=all waits answered;
5. metrics, log lines (alarms at ERROR).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tidewater.broker.clock import mono_ms as _mono_ms
from tidewater.broker.clock import wall_ms as _wall_ms
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replication.ready import (
    EMPTY,
    AlterPartitionRequest,
    AssignEpoch,
    CorruptReport,
    Follow,
    Persist,
    Ready,
    StopFetching,
    describe_persist,
)
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import TidewaterError

log = logging.getLogger("tidewater.broker.replication")

# Epoch-checkpoint writes of one request at once: the disk joins concurrent fsyncs
# (bench/probes/epoch_fsync_probe.py, 60 partitions: 206-444 ms in turn, 33-71 ms from 8).
PERSIST_THREADS = 8

_T = TypeVar("_T")
# How ``apply_all`` runs its writes: ``write(i)`` for each index, results in order.
RunAll = Callable[[Callable[[int], Any], Iterable[int]], list[Any]]


def in_turn(write: Callable[[int], _T], indexes: Iterable[int]) -> list[_T]:
    """One write after another (the simulation's: its disk is one deterministic object)."""
    return [write(i) for i in indexes]


_persist_pool: ThreadPoolExecutor | None = None


def from_threads(write: Callable[[int], _T], indexes: Iterable[int]) -> list[_T]:
    """Up to ``PERSIST_THREADS`` writes at once (the broker's), each started as soon as
    ``indexes`` yields it (``map`` submits while it reads); returns when all ended. The
    pool starts a thread only for a write that finds none idle, and keeps it: a large
    LeaderAndIsr is applied a slice at a time, each slice's writes here, and starting
    the threads again for each took a tenth of a new topic's apply."""
    global _persist_pool
    if _persist_pool is None:
        _persist_pool = ThreadPoolExecutor(PERSIST_THREADS, thread_name_prefix="epoch-persist")
    return list(_persist_pool.map(write, indexes))


def _log_note(line: str) -> None:
    log.info("%s", line)


def _log_alarm(line: str) -> None:
    log.error("%s", line)


class ReadyCarrier:
    """Carries out ``Ready``s for one host. The host (the broker's ``ReplicaManager``, the
    simulation's broker) gives the effects' ends: the clocks, who wakes readers, who
    answers acks=all waits, the counters, and (set once built, they need the carrier
    themselves) who follows a leader and who sends to the controller."""

    def __init__(self, *, notify_readers: Callable[[TopicPartition, bool, bool, bool], None],
                 complete_wait: Callable[[int, int], None],
                 count_decision: Callable[[str], None],
                 count_replicated_bytes: Callable[[int], None],
                 mono_ms: Callable[[], int] = _mono_ms, wall_ms: Callable[[], int] = _wall_ms,
                 note: Callable[[str], None] = _log_note,
                 alarm: Callable[[str], None] = _log_alarm,
                 run_all: RunAll = in_turn):
        self.notify_readers = notify_readers  # (tp, leadership changed, HW moved, appended)
        self.complete_wait = complete_wait  # (waiter id, ErrorCode)
        self.count_decision = count_decision
        self.count_replicated_bytes = count_replicated_bytes
        self.mono_ms = mono_ms
        self.wall_ms = wall_ms
        self.note = note
        self.alarm = alarm
        self.run_all = run_all  # how apply_all's epoch writes run: in turn or from threads
        self.follow: Callable[[Partition, int, int], None] = _unset
        self.stop_following: Callable[[Partition], None] = _unset
        self.send_alter_partition: Callable[[Partition, AlterPartitionRequest], None] = _unset
        self.send_corrupt_report: Callable[[Partition, CorruptReport], None] = _unset

    def apply(self, partition: Partition, ready: Ready, *, fetched: Any = b"") -> None:
        try:
            if ready is EMPTY:
                return
            failure = self._persist(partition, ready, fetched) if ready.persist else None
            self._carry_out_rest(partition, ready, failure)
        finally:
            self.carried_out(partition, ready)

    def carried_out(self, partition: Partition, ready: Ready) -> None:
        """Called after each Ready was carried out (or failed to be); the simulation looks
        here (checks only). Nothing in the broker."""

    def apply_all(self, items: Iterable[tuple[Partition, Ready]]) -> list[Exception | None]:
        """``apply`` for the Readies of one request (a LeaderAndIsr), of distinct
        partitions; what ``apply`` would raise for each is returned in its place.

        Readies whose persist is only epoch assigns (a restart's new leader epochs) have
        them written from threads at once, each partition's in order, each as soon as
        ``items`` yields it: a caller that decides the next partition while ``items`` is
        read overlaps its decisions with the earlier writes (issue 30's restart time).
        All are written (fsynced) before any Ready's rest is carried out, on this thread,
        in order, and before this returns, so nothing is served in an epoch before it is
        durable. A failed write goes to the core as in ``apply``."""
        taken: list[tuple[Partition, Ready]] = []
        indexes: list[int] = []  # in ``taken``, of the Readies written here, in order
        seen: set[int] = set()
        now = self.wall_ms()

        def epoch_writes() -> Iterator[int]:
            for partition, ready in items:
                if id(partition) in seen:
                    raise ValueError("apply_all takes one Ready per partition")
                seen.add(id(partition))
                taken.append((partition, ready))
                if (ready is not EMPTY and ready.persist
                        and all(isinstance(op, AssignEpoch) for op in ready.persist)):
                    indexes.append(len(taken) - 1)
                    yield indexes[-1]

        def write(i: int) -> tuple[Persist, Exception] | None:
            partition, ready = taken[i]
            for op in ready.persist:
                try:
                    partition.persist(op, b"", now)
                except Exception as e:  # handed back to this thread, below
                    return op, e
            return None

        results = self.run_all(write, epoch_writes())
        written = dict(zip(indexes, results, strict=True))
        errors: list[Exception | None] = []
        for i, (partition, ready) in enumerate(taken):
            try:
                if i not in written:
                    self.apply(partition, ready)
                else:
                    self._apply_written(partition, ready, written[i])
            except Exception as e:  # the caller's boundary answers it per partition
                errors.append(e)
            else:
                errors.append(None)
        return errors

    def _apply_written(self, partition: Partition, ready: Ready,
                       failed: tuple[Persist, Exception] | None) -> None:
        """``apply`` for a Ready whose persist ``apply_all`` has run (``failed``: the
        write that failed, and how)."""
        try:
            failure = None
            if failed is not None:
                op, error = failed
                if not isinstance(error, TidewaterError):
                    raise error  # as from apply: the rest is not carried out
                failure = self._persist_failed(partition, op, error)
            self._carry_out_rest(partition, ready, failure)
        finally:
            self.carried_out(partition, ready)

    def _carry_out_rest(self, partition: Partition, ready: Ready,
                        failure: TidewaterError | None) -> None:
        fetch = ready.fetch
        if fetch is not None:
            if isinstance(fetch, Follow):
                self.follow(partition, fetch.leader_id, fetch.leader_epoch)
            elif isinstance(fetch, StopFetching):
                self.stop_following(partition)
        if ready.alter_partition is not None:
            self.send_alter_partition(partition, ready.alter_partition)
        if ready.report_corrupt is not None:
            self.send_corrupt_report(partition, ready.report_corrupt)
        if ready.leadership_changed or ready.high_watermark_moved or ready.appended:
            self.notify_readers(partition.tp, ready.leadership_changed,
                                ready.high_watermark_moved, ready.appended)
        for waiter_id, code in ready.completed:
            self.complete_wait(waiter_id, code)
        for name in ready.counters:
            self.count_decision(name)
        for line in ready.notes:
            self.note(line)
        for line in ready.alarms:
            self.alarm(line)
        if failure is not None:
            raise failure

    def _persist(self, partition: Partition, ready: Ready,
                 fetched: Any) -> TidewaterError | None:
        """Carry out ``ready.persist``; on a storage failure the replica is told (and the
        rest of ``ready`` still carried out: it answers the old leadership's waits), and
        the error returned for ``apply`` to raise at the end."""
        now = self.wall_ms()
        for op in ready.persist:
            try:
                appended = partition.persist(op, fetched, now)
            except TidewaterError as e:
                return self._persist_failed(partition, op, e)
            if appended:
                self.count_replicated_bytes(appended)
        return None

    def _persist_failed(self, partition: Partition, op: Any,
                        error: TidewaterError) -> TidewaterError:
        # The core hears of it and decides (etcd raft's Advance, for a failure); it
        # never acts as if the operation had happened.
        log.warning("%s: %s failed: %s", partition.tp, describe_persist(op), error)
        self.apply(partition, partition.replica.on_persist_failure(op, self.mono_ms()))
        return error


def _unset(*args: object) -> None:
    raise AssertionError("ReadyCarrier used before its owner wired it")
