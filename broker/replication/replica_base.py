"""The state every protocol of one replica shares, and the types its events take.

``ReplicaState`` (``replica.py``) combines one mixin per protocol
(``replica_control``, ``replica_produce``, ``replica_leading``,
``replica_corruption``, ``replica_following``); each subclasses ``ReplicaBase``,
which owns every attribute they read and write, so one replica's state is in one
place. Where a protocol's decision takes a step of another (a LeaderAndIsr
answers acks=all waits, a tick resends an AlterPartition), it calls that step by
the name ``ReplicaBase`` declares for it below; the module that owns the step
defines it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidewater.broker.replication.leader_state import LeadershipState, PendingIsrChange

if TYPE_CHECKING:
    from tidewater.broker.replication.ready import Persist, Ready, ReadyBuilder

UNDEFINED = -1

ALTER_PARTITION_BACKOFF_MS = 200
ALTER_PARTITION_BACKOFF_MS_MAX = 2_000
# A replica whose write failed takes its role again after this long, doubling up to the max.
STORAGE_RETRY_MS = 500
STORAGE_RETRY_MS_MAX = 30_000


class EpochCacheView(Protocol):
    latest_epoch: int

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]: ...


class LogView(Protocol):
    """What the decisions read of the replica's log (memory only)."""

    log_start_offset: int
    log_end_offset: int
    leader_epoch_cache: EpochCacheView


@dataclass(frozen=True, slots=True)
class LeaderAndIsrState:
    """The controller's state of one partition as the core takes it (from a LeaderAndIsr,
    or an AlterPartition or ReportCorruptReplica answer): the wire's ``pb.PartitionState``
    without what replication does not decide by (topic ID, offline flag)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class Role:
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class FollowerPhase:
    TRUNCATING = "truncating"  # ask OffsetForLeaderEpoch, truncate
    FETCHING = "fetching"


@dataclass(slots=True)
class FollowerCycle:
    """Where a follower is in one leader epoch's truncate-then-fetch cycle."""

    leader_id: int
    leader_epoch: int
    phase: str
    parked: bool = False  # FENCED_LEADER_EPOCH: wait for the next LeaderAndIsr
    retry_at_ms: int = 0  # backoff after an error


@dataclass(frozen=True, slots=True)
class FollowerOptions:
    """How a follower paces itself. (It always asks OffsetForLeaderEpoch before the first
    fetch of a new leader epoch, KIP-101/279, and sends its last fetched epoch, KIP-320;
    the simulation's older protocol generations are subclasses in tests/sim.)"""

    fetch_backoff_ms: int = 1000


class ReplicaBase:
    """One replica's state (every attribute), its views, and the steps its protocols share."""

    def __init__(self, topic: str, partition: int, *, local_broker_id: int, log: LogView,
                 high_watermark: int, min_insync_replicas: int, replica_lag_time_max_ms: int,
                 follower_options: FollowerOptions | None = None):
        self.topic = topic
        self.partition = partition
        self.local_broker_id = local_broker_id
        self.log = log
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.options = follower_options or FollowerOptions()
        self.role = Role.NONE
        self.leader_id = UNDEFINED
        self.leader_epoch = UNDEFINED
        self.partition_epoch = UNDEFINED
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.leader: LeadershipState | None = None
        self.follower: FollowerCycle | None = None
        # The HW a follower (or a replica with no role) exposes is min(this, its LEO); a
        # checkpointed HW can exceed the LEO after a crash lost an unflushed tail.
        self._high_watermark_seen = max(0, high_watermark)
        # acks=all waits of the current leadership: heap of [required_offset, waiter_id],
        # their deadlines by id (a wait is live while its id is in _deadlines).
        self._waits: list[list[int]] = []
        self._deadlines: dict[int, int] = {}
        # DeleteRecords waits (Kafka's DelayedDeleteRecords), in the same _deadlines: heap
        # of [required low watermark, waiter_id].
        self._low_watermark_waits: list[list[int]] = []
        # The AlterPartition proposal being carried to the controller.
        self._alter_id = 0
        self._alter_for: PendingIsrChange | None = None  # the proposal alter_id names
        self._alter_in_flight = False  # sent, no answer yet (or waiting for LeaderAndIsr)
        self._alter_next_send_ms = 0
        self._alter_backoff_ms = ALTER_PARTITION_BACKOFF_MS
        self._alter_waits_for_leader_and_isr = False  # answered "this leadership is ending"
        # A batch failing its CRC found in this replica's log (issue 14, bug 6): the base
        # offset of the first bad one, and the report that takes the replica out of the ISR.
        self.corrupt_from: int | None = None
        self._report_id = 0
        self._report_in_flight = False
        self._report_next_send_ms = 0
        self._report_refused = False  # no healthy ISR member could take over (yet)
        # After a failed write stopped this replica's role: the state it held, taken again
        # at ``_storage_retry_at_ms`` (a disk that failed once may work again).
        self._storage_retry_state: LeaderAndIsrState | None = None
        self._storage_retry_at_ms: int | None = None
        # The ISR expansion the leader had in flight when its write failed: the controller
        # may have committed it, so the same leadership taken again holds the HW for the
        # joiner and asks again. Kept only with ``_storage_retry_state``: any other state
        # from the controller drops both (``_record``).
        self._storage_retry_expansion: PendingIsrChange | None = None
        self._storage_retry_backoff_ms = STORAGE_RETRY_MS

    # ================================================================== views

    @property
    def is_leader(self) -> bool:
        return self.leader is not None

    @property
    def high_watermark(self) -> int:
        if self.leader is not None:
            return self.leader.high_watermark
        return min(self._high_watermark_seen, self.log.log_end_offset)

    @property
    def leader_isr(self) -> tuple[int, ...]:
        """The ISR this broker uses as leader (committed by the controller); () otherwise."""
        return self.leader.isr if self.leader is not None else ()

    @property
    def waiting(self) -> int:
        return len(self._deadlines)

    def __repr__(self) -> str:
        return (f"ReplicaState({self.topic}-{self.partition} on {self.local_broker_id}: "
                f"{self.role} epoch {self.leader_epoch}/{self.partition_epoch} leader "
                f"{self.leader_id} HW {self.high_watermark} LEO {self.log.log_end_offset})")

    # ================================================================== shared steps
    # Defined by the module named; declared here so each protocol's module type-checks alone.

    if TYPE_CHECKING:
        # replica_control
        def check_epoch(self, current_leader_epoch: int, *, require_leader: bool) -> None: ...

        def _apply_state(self, state: LeaderAndIsrState, now_ms: int, out: ReadyBuilder) -> None: ...

        def _stop_on_storage_failure(self, why: str, now_ms: int) -> Ready: ...

        def _maybe_retry_after_storage_failure(self, now_ms: int, out: ReadyBuilder) -> None: ...

        # replica_produce
        def _complete_waits(self, out: ReadyBuilder) -> None: ...

        # replica_leading
        def _maybe_send_alter(self, now_ms: int, out: ReadyBuilder) -> None: ...

        def _note_isr_change(self, old_isr: tuple[int, ...], out: ReadyBuilder,
                             by: str = "AlterPartition") -> None: ...

        # replica_corruption
        def _react_to_corruption(self, now_ms: int, out: ReadyBuilder) -> None: ...

        def _on_corrupt_cut_failed(self, offset: int) -> None: ...

        # replica_following
        def _first_phase(self) -> str: ...

        def _truncate(self, offset: int, why: str, out: ReadyBuilder, *,
                      below_corrupt_batch: bool = False) -> None: ...

        def _on_follower_persist_failure(self, op: Persist, now_ms: int,
                                         out: ReadyBuilder) -> None: ...
