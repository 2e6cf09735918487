"""Carries out a replication decision: the broker's side of a ``Ready``.

Every decision about a replica comes out of ``ReplicaState`` as a ``Ready``
(``broker/replication/ready.py`` lists its parts and their order). The
produce, fetch and control paths, the fetchers, the AlterPartition sender and
the background ticks all hand theirs to ``ReadyCarrier.apply``, synchronously
on the event loop right after the decision, so a rule has one place and its
effects one order:

1. persist (epoch cache assign with fsync, truncations, follower appends); a
   storage failure here makes the replica play no part
   (``ReplicaState.on_storage_failure``) and is raised to the caller;
2. fetcher transitions (follow a leader in an epoch, stop);
3. the AlterPartition, and the ReportCorruptReplica, to send;
4. long-polls woken (consumers before produce answers, as Kafka's
   ``checkAndCompleteAll`` does: newly committed records reach readers one
   write sooner), then acks=all waits answered;
5. metrics, log lines (alarms at ERROR).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replication.ready import EMPTY, Follow, Ready, StopFetching
from tidewater.broker.serving.purgatory import AcksWaits, FetchWaiters
from tidewater.proto.batch import BytesLike
from tidewater.proto.errors import TidewaterError

log = logging.getLogger("tidewater.broker.replication")

_NAMED_COUNTERS = {"leader_elections", "isr_shrinks", "isr_expands"}


class ReadyCarrier:
    def __init__(self, *, metrics: BrokerMetrics, fetch_waiters: FetchWaiters,
                 acks_waits: AcksWaits | None = None):
        self.metrics = metrics
        self.fetch_waiters = fetch_waiters
        self.acks_waits = acks_waits
        # Set by the owner once built (they need the carrier themselves).
        self.follow: Callable[[Partition, int, int], None] = _unset
        self.stop_following: Callable[[Partition], None] = _unset
        self.send_alter_partition: Callable[[Partition, object], None] = _unset
        self.send_corrupt_report: Callable[[Partition, object], None] = _unset
        self._named = {name: getattr(metrics, name) for name in _NAMED_COUNTERS}
        self._decisions = metrics.replication_decisions
        self._replication_bytes_in = metrics.replication_bytes_in

    def apply(self, partition: Partition, ready: Ready, *, fetched: BytesLike = b"") -> None:
        if ready is EMPTY:
            return
        failure = self._persist(partition, ready, fetched) if ready.persist else None
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
        tp = partition.tp
        if ready.leadership_changed:
            self.fetch_waiters.notify(tp)
        else:
            if ready.high_watermark_moved:
                self.fetch_waiters.notify_high_watermark(tp)
            if ready.appended:
                self.fetch_waiters.notify_append(tp)
        if ready.completed:
            complete = self.acks_waits.complete
            for waiter_id, code in ready.completed:
                complete(waiter_id, code)
        for name in ready.counters:
            counter = self._named.get(name)
            if counter is not None:
                counter.inc()
            self._decisions.labels(name).inc()
        for line in ready.notes:
            log.info("%s", line)
        for line in ready.alarms:
            log.error("%s", line)
        if failure is not None:
            raise failure

    def _persist(self, partition: Partition, ready: Ready,
                 fetched: BytesLike) -> TidewaterError | None:
        """Carry out ``ready.persist``; on a storage failure the replica is told (and the
        rest of ``ready`` still carried out: it answers the old leadership's waits), and
        the error returned for ``apply`` to raise at the end."""
        now = wall_ms()
        try:
            for op in ready.persist:
                appended = partition.persist(op, fetched, now)
                if appended:
                    self._replication_bytes_in.inc(appended)
        except TidewaterError as e:
            replica = partition.replica
            if replica.follower is not None and replica.leader is None:
                # A follower's append or truncation: its log dir may be offline; try later.
                log.warning("%s: follower write failed: %s", partition.tp, e)
                replica.on_follower_storage_error(mono_ms())
            else:
                log.error("%s: persisting %s failed: %s", partition.tp, ready.persist, e)
                self.apply(partition, replica.on_storage_failure(mono_ms()))
            return e
        return None


def _unset(*args) -> None:
    raise AssertionError("ReadyCarrier used before its owner wired it")
