"""One local replica of a partition in the broker's shell: its log, its core, its incarnation.

``replica`` (``ReplicaState``) makes every replication decision; this class only
carries out the log operations a decision asks for (``persist``), against any
log that offers the ``PartitionLog`` operations: the broker's ``storage.Log``
and the simulation's in-memory log both do, so one implementation runs in
both. Every call into ``replica``, and the I/O its ``Ready`` asks for, happens
synchronously on the broker's one event loop: no other coroutine runs between a
decision and its effects, so no lock is needed around them (and none is held
across an ``await`` anywhere).

Ordering rules enforced here (with ``ReadyCarrier``): a new leader's epoch is
in the epoch cache, fsynced, before anything else of its Ready happens, so no
append or answer in the new epoch can precede it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from tidewater.broker.replication.follower import fetched_from_log_end
from tidewater.broker.replication.ready import (
    AppendFetched,
    AssignEpoch,
    IncrementLogStartOffset,
    Persist,
    Truncate,
    TruncateFully,
)
from tidewater.broker.replication.replica import ReplicaState
from tidewater.broker.storage.topics import TopicPartition

log = logging.getLogger("tidewater.broker.replicas.partition")


class PartitionLog(Protocol):
    """What ``Partition.persist`` needs of a log. ``Fetched`` chunks are what the leader
    sent: bytes for ``storage.Log``, whatever the simulation's log reads for its own."""

    @property
    def log_end_offset(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def leader_epoch_cache(self) -> Any: ...

    def truncate_to(self, offset: int) -> None: ...

    def truncate_fully_and_start_at(self, start_offset: int) -> None: ...

    def maybe_increment_log_start_offset(self, offset: int) -> bool: ...

    def append_as_follower(self, records: Any, now_ms: int) -> Any: ...

    def batch_bounds(self, records: Any) -> Iterable[tuple[int, int, int]]:
        """(position in ``records``, base offset, next offset) of each whole batch."""
        ...


class Partition:
    __slots__ = ("tp", "log", "replica", "topic_id", "metadata_offset", "has_topic_configs")

    def __init__(self, tp: TopicPartition, log_: Any, replica: ReplicaState,
                 topic_id: bytes = b""):
        self.tp = tp
        self.log = log_
        self.replica = replica
        # The topic incarnation this replica (and its log's partition.metadata) belongs to.
        self.topic_id = topic_id
        # The controller's metadata offset of the newest LeaderAndIsr for it: only a snapshot
        # at least as new may sweep it (topic_identity).
        self.metadata_offset = -1
        # Some LeaderAndIsr gave it topic configs: an empty map later means an AlterConfigs
        # removed them all (the defaults apply again), not "none were sent".
        self.has_topic_configs = False

    # views
    @property
    def high_watermark(self) -> int:
        return self.replica.high_watermark

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    @property
    def is_leader(self) -> bool:
        return self.replica.leader is not None

    @property
    def leader_epoch(self) -> int:
        return self.replica.leader_epoch

    def persist(self, op: Persist, fetched: Any, now_ms: int) -> int:
        """Carry out one ``Ready.persist`` operation; returns the bytes (or, for the
        simulation's log, batches) appended."""
        if isinstance(op, AppendFetched):
            if not fetched:
                return 0  # an idle partition's answer: nothing to cut or append
            records = self._from_log_end(fetched)
            if records:
                self.log.append_as_follower(records, now_ms)
            return len(records)
        if isinstance(op, AssignEpoch):
            self.log.leader_epoch_cache.assign(op.epoch, op.start_offset)  # fsynced
        elif isinstance(op, Truncate):
            self.log.truncate_to(op.offset)
        elif isinstance(op, TruncateFully):
            self.log.truncate_fully_and_start_at(op.start_offset)
        elif isinstance(op, IncrementLogStartOffset):
            self.log.maybe_increment_log_start_offset(op.offset)
        else:
            raise TypeError(f"unknown persist operation {op!r}")
        return 0

    def _from_log_end(self, fetched: Any) -> Any:
        """The part of a fetched chunk from our LEO on (the core's ``fetched_from_log_end``
        decides; a batch straddling the LEO cuts our log back to its base first)."""
        log_end_offset = self.log.log_end_offset
        cut = fetched_from_log_end(self.log.batch_bounds(fetched), log_end_offset)
        if cut.truncate_to is not None:
            log.warning("%s: a leader batch from %d straddles our LEO %d: truncating to %d",
                        self.tp, cut.truncate_to, log_end_offset, cut.truncate_to)
            self.log.truncate_to(cut.truncate_to)
        start = cut.append_from(self.log.log_end_offset)
        return fetched[:0] if start is None else fetched[start:]
