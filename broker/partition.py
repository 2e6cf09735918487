"""One local replica of a partition: its Log plus whether and how this broker leads it.

A ``Partition`` is the shell around the pure ``LeaderPartitionState``: it
applies the controller's LeaderAndIsr decisions to the local log and keeps the
follower-side HW. Every state change and every append happens under
``lock`` (one owner of the partition's log); the broker's single event loop
makes the synchronous parts atomic, the lock covers sequences with awaits in
between (follower truncation, AlterPartition round trips).

Ordering rules enforced here:
- become leader: the epoch cache gets ``(new leader epoch, LEO)`` and is
  fsynced (``LeaderEpochCache.assign``) BEFORE the leader state exists, so no
  append or answer in the new epoch can precede it;
- become follower: the leader state is dropped first, so no later acks=all
  waiter can complete in the old epoch (the caller fails the pending ones).
"""

from __future__ import annotations

import asyncio

from tidewater.broker.replication import LeaderPartitionState, follower_high_watermark
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)

UNDEFINED = -1


def state_is_newer(state: pb.PartitionState, leader_epoch: int, partition_epoch: int) -> bool:
    """The controller's rule: a newer leader epoch, or the same one with a newer partition epoch."""
    return state.leader_epoch > leader_epoch or (
        state.leader_epoch == leader_epoch and state.partition_epoch > partition_epoch)


class Partition:
    def __init__(self, tp: TopicPartition, log, *, local_broker_id: int, high_watermark: int,
                 min_insync_replicas: int, replica_lag_time_max_ms: int, topic_id: bytes = b""):
        self.tp = tp
        self.log = log
        # The topic incarnation this replica (and its log's partition.metadata) belongs to.
        self.topic_id = topic_id
        # The controller's metadata offset of the newest LeaderAndIsr for it: only a snapshot
        # at least as new may sweep it (topic_identity).
        self.metadata_offset = -1
        self.local_broker_id = local_broker_id
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.lock = asyncio.Lock()
        self.leader_id = UNDEFINED
        self.leader_epoch = UNDEFINED
        self.partition_epoch = UNDEFINED
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.leader_state: LeaderPartitionState | None = None
        # A checkpointed HW can exceed the LEO after a crash lost an unflushed tail.
        self._follower_high_watermark = max(0, min(high_watermark, log.log_end_offset))
        # The task sending this leadership's ISR proposals (replica manager's).
        self.alter_partition_task: asyncio.Task | None = None
        self.alter_partition_leader: LeaderPartitionState | None = None

    # ---------------------------------------------------------------- views

    @property
    def is_leader(self) -> bool:
        return self.leader_state is not None

    @property
    def high_watermark(self) -> int:
        if self.leader_state is not None:
            return self.leader_state.high_watermark
        return self._follower_high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def leader_isr(self) -> tuple[int, ...]:
        return self.leader_state.isr if self.leader_state is not None else ()

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """KIP-320 fencing of a request's ``current_leader_epoch`` (-1: not checked)."""
        if current_leader_epoch == UNDEFINED:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"request epoch {current_leader_epoch} is older than {self.leader_epoch} for {self.tp}")
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"request epoch {current_leader_epoch} is newer than {self.leader_epoch} for {self.tp}")

    def require_leader(self) -> LeaderPartitionState:
        if self.leader_state is None:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} does not lead {self.tp} (leader {self.leader_id})")
        return self.leader_state

    # ---------------------------------------------------------------- transitions

    def become_leader(self, state: pb.PartitionState, now_ms: int) -> None:
        """Apply a LeaderAndIsr that makes this broker the leader (new leader epoch)."""
        log_end_offset = self.log.log_end_offset
        high_watermark = self.high_watermark
        # fsynced before anything is served in the new epoch (module docstring).
        self.log.leader_epoch_cache.assign(state.leader_epoch, log_end_offset)
        self.leader_state = LeaderPartitionState(
            local_broker_id=self.local_broker_id,
            replicas=tuple(state.replicas),
            isr=tuple(state.isr),
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
            high_watermark=high_watermark,
            log_end_offset=log_end_offset,
            epoch_start_offset=log_end_offset,
            min_insync_replicas=self.min_insync_replicas,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            now_ms=now_ms,
        )
        self._record(state)

    def update_isr(self, state: pb.PartitionState, now_ms: int) -> bool:
        """Same leader epoch, newer partition epoch: only the ISR changed. True: HW moved."""
        moved = False
        if self.leader_state is not None:
            moved = self.leader_state.on_leader_and_isr_update(
                tuple(state.isr), state.partition_epoch, now_ms)
        self._record(state)
        return moved

    def become_follower(self, state: pb.PartitionState) -> bool:
        """Apply a LeaderAndIsr that makes another broker (or nobody) the leader.

        Returns True when this broker led the partition until now.
        """
        was_leader = self.leader_state is not None
        if was_leader:
            self._follower_high_watermark = self.leader_state.high_watermark
        self.leader_state = None
        self._follower_high_watermark = min(self._follower_high_watermark,
                                            self.log.log_end_offset)
        self._record(state)
        return was_leader

    def _record(self, state: pb.PartitionState) -> None:
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = tuple(state.replicas)
        self.isr = tuple(state.isr)

    # ---------------------------------------------------------------- follower side

    def set_follower_high_watermark(self, leader_high_watermark: int) -> None:
        self._follower_high_watermark = follower_high_watermark(
            leader_high_watermark, self.log.log_end_offset)

    def truncate_to(self, offset: int) -> None:
        """Follower truncation; the HW never points past the log afterwards."""
        self.log.truncate_to(offset)
        self._follower_high_watermark = min(self._follower_high_watermark,
                                            self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset)
        self._follower_high_watermark = offset

    # ---------------------------------------------------------------- acks=all

    def acks_all_result(self, required_offset: int) -> int | None:
        """For the purgatory: None (wait) or the ErrorCode to answer an acks=all produce."""
        if self.leader_state is None:
            return pb.NOT_LEADER_OR_FOLLOWER
        return self.leader_state.acks_all_result(required_offset)
