"""The leader's view of one partition: follower progress, ISR, high watermark, acks=all.

Theory of operation
-------------------
One ``LeadershipState`` lives for one leadership (one ``leader_epoch``) of
one partition on the leader broker. It is pure: no sockets, no files, no
clock; the broker's shell feeds it events with the time (``now_ms``) and acts
on what it returns (answer a produce request, send AlterPartition). A new
leader epoch means a new object.

Inputs and what they return:

==================================  ==========================================
event                               result
==================================  ==========================================
``on_local_append(leo, now)``       HW moved? (acks=all waiters may complete)
``on_follower_fetch(id, off, now)`` ``FetchDecision``: HW moved? ISR expansion
                                    to propose (AlterPartition)?
``maybe_shrink_isr(now)``           ISR shrink to propose, or ``None``
``on_alter_partition_committed``    the controller accepted: HW moved?
``on_alter_partition_failed``       certainly not applied: dropped, retry later
``on_leader_and_isr_update``        controller changed the ISR, same epoch
``maybe_advance_high_watermark``    time passed (a joiner stopped being caught
                                    up): HW moved?
``acks_all_result(offset)``         ``None`` (wait) or an ``ErrorCode``
==================================  ==========================================

Follower state (per remote replica, Kafka's ``ReplicaState``):

* ``log_end_offset``: the follower's fetch offset, ``-1`` (unknown) until it
  has fetched in this leadership. An unknown LEO of an ISR member holds the HW
  where it is, which is how "a new leader does not advance the HW until its
  ISR followers have fetched in its epoch" is enforced.
* ``last_caught_up_ms``: the last time the follower was caught up: its fetch
  offset reached the leader's LEO at the time of that fetch (then it is caught
  up as of now) or of the previous fetch (then as of the previous fetch time).
  ISR members start caught up as of the start of the leadership (as if they
  had fetched at the leader's LEO then), other replicas never (``-1``).
* ``last_fetch_leader_log_end_offset`` / ``last_fetch_time_ms``: the leader's
  LEO and the time at the previous fetch, for the rule above.

High watermark:
``HW = min(leader LEO, LEO of every member of the maximal ISR, LEO of every
caught-up follower about to join)``, where "about to join" is a replica
outside the maximal ISR that fetched in this leadership and is caught up (at
the leader's LEO, or caught up within ``replica_lag_time_max_ms``). It moves
only forward, and not at all while the committed ISR is smaller than
``min(min_insync_replicas, RF)`` (a pending expansion does not count until
the controller accepts it).

acks=all: refused before the append when the committed ISR is below the
minimum; answered once the HW reaches the last offset + 1, with
NOT_ENOUGH_REPLICAS_AFTER_APPEND when the maximal ISR is below the minimum by
then (Kafka's ``checkEnoughReplicasReachOffset``).

The minimum is one rule for all three (the acks=all pre-check, the HW, the
answer): ``effective_min_insync_replicas = min(min_insync_replicas,
replication factor)``. A topic whose replication factor is below
``min.insync.replicas`` thus accepts acks=all once all its replicas are in
sync, where Kafka would refuse every acks=all write (and still advance the HW
for acks=1 writes, which is the gate the replication reference gives).

ISR changes go through the controller, at most one in flight:

* shrink: ISR followers with ``now - last_caught_up_ms > replica_lag_time_max_ms``
  (never the leader itself). While the shrink is pending the old, larger ISR
  still counts for the HW (the shrink is not committed yet).
* expand: a follower whose LEO >= HW and >= the start offset of this leader's
  epoch. While the expansion is pending the joiner already counts for the HW
  (the "maximal ISR"), so the HW never passes what the joiner has.

The caller must only report fetches it served: a fetch fenced by epoch, out
of range, or answered with a ``diverging_epoch`` must not reach
``on_follower_fetch`` (its fetch offset is not a valid LEO of the follower).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    InvariantViolation,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)

UNKNOWN_OFFSET = -1
NEVER_MS = -1  # a time that has not happened (never caught up, never fetched)


@dataclass(slots=True)
class FollowerState:
    """What the leader knows about one remote replica in this leadership."""

    replica_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = NEVER_MS
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = NEVER_MS
    has_fetched: bool = False  # fetched at least once in this leadership
    broker_epoch: int = -1  # the broker epoch its last fetch carried (KIP-903)
    log_start_offset: int = UNKNOWN_OFFSET  # its log start, from its last fetch

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int,
                     replica_lag_time_max_ms: int) -> bool:
        """Caught up now, or recently enough (Kafka ``ReplicaState.isCaughtUp``)."""
        if self.log_end_offset == leader_log_end_offset:
            return True
        return (self.last_caught_up_ms != NEVER_MS
                and now_ms - self.last_caught_up_ms <= replica_lag_time_max_ms)


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """What the shell does after a follower fetch was served."""

    high_watermark_changed: bool
    propose_isr: tuple[int, ...] | None  # send AlterPartition with this ISR


# The decisions of almost every fetch, made once (frozen: sharing them is safe).
_NOTHING_TO_DO = FetchDecision(high_watermark_changed=False, propose_isr=None)
_HIGH_WATERMARK_MOVED = FetchDecision(high_watermark_changed=True, propose_isr=None)


@dataclass(frozen=True, slots=True)
class PendingIsrChange:
    """The one AlterPartition in flight."""

    proposed_isr: tuple[int, ...]
    is_expansion: bool
    # The broker epoch each proposed member fetched with, in proposed_isr's order (-1 not
    # known): the controller admits a joiner only with its registered epoch (KIP-903).
    broker_epochs: tuple[int, ...] = ()


class LeadershipState:
    """HW, ISR and acks=all decisions for one partition while this broker leads it."""

    def __init__(self, *, local_broker_id: int, replicas: Iterable[int], isr: Iterable[int],
                 leader_epoch: int, partition_epoch: int, high_watermark: int,
                 log_end_offset: int, epoch_start_offset: int, min_insync_replicas: int,
                 replica_lag_time_max_ms: int, now_ms: int,
                 pending_expansion: PendingIsrChange | None = None):
        """``pending_expansion``: one proposed in an earlier run of this same leadership
        (same leader and partition epochs) before a failed write stopped it, never
        answered. The controller may have committed it, so it is pending again from the
        first HW on: the joiner holds the HW until the controller answers."""
        self.local_broker_id = local_broker_id
        self.replicas: tuple[int, ...] = tuple(replicas)
        self.isr: tuple[int, ...] = tuple(isr)
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.log_end_offset = log_end_offset
        self.epoch_start_offset = epoch_start_offset
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.pending_isr: PendingIsrChange | None = None
        if local_broker_id not in self.replicas:
            raise InvariantViolation(f"leader {local_broker_id} is not a replica {self.replicas}")
        self._check_isr(self.isr)
        if pending_expansion is not None:
            if not pending_expansion.is_expansion:
                raise InvariantViolation(f"{pending_expansion} resumed is not an expansion")
            self._check_isr(pending_expansion.proposed_isr)
            self.pending_isr = pending_expansion
        if not 0 <= epoch_start_offset <= log_end_offset:
            raise InvariantViolation(f"epoch start {epoch_start_offset} outside [0, LEO {log_end_offset}]")
        # A checkpointed HW can exceed the LEO after an unclean crash lost the
        # tail; the HW never points past the log.
        self.high_watermark = max(0, min(high_watermark, log_end_offset))
        self.followers: dict[int, FollowerState] = {}
        for replica_id in self.replicas:
            if replica_id == local_broker_id:
                continue
            if replica_id in self.isr:
                # ISR members get the benefit of the doubt for one lag period.
                self.followers[replica_id] = FollowerState(
                    replica_id, last_caught_up_ms=now_ms,
                    last_fetch_leader_log_end_offset=log_end_offset, last_fetch_time_ms=now_ms)
            else:
                self.followers[replica_id] = FollowerState(replica_id)
        self.maybe_advance_high_watermark(now_ms)

    # ------------------------------------------------------------------ views

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus a pending joiner: what the HW must wait for."""
        if self.pending_isr is not None and self.pending_isr.is_expansion:
            return self.pending_isr.proposed_isr
        return self.isr

    @property
    def replication_factor(self) -> int:
        return len(self.replicas)

    @property
    def effective_min_insync_replicas(self) -> int:
        """The one minimum ISR size (module docstring)."""
        return min(self.min_insync_replicas, len(self.replicas))

    @property
    def is_under_min_isr(self) -> bool:
        return len(self.isr) < self.effective_min_insync_replicas

    def low_watermark(self, leader_log_start_offset: int) -> int:
        """The smallest log start offset of the leader and its ISR followers (Kafka's
        ``lowWatermarkIfLeader``, over the ISR: a replica outside it cannot lead in a
        clean election); UNKNOWN_OFFSET while an ISR follower has not told its start."""
        low = leader_log_start_offset
        for replica_id in self.isr:
            follower = self.followers.get(replica_id)
            if follower is not None:
                low = min(low, follower.log_start_offset)
        return low

    def on_follower_log_start(self, replica_id: int, log_start_offset: int) -> bool:
        """A follower's fetch told its log start offset: True when it moved up."""
        follower = self.followers.get(replica_id)
        if follower is None or log_start_offset <= follower.log_start_offset:
            return False
        follower.log_start_offset = log_start_offset
        return True

    # ------------------------------------------------------------------ events

    def on_local_append(self, log_end_offset: int, now_ms: int) -> bool:
        """The leader appended up to ``log_end_offset``. True when the HW moved."""
        if log_end_offset < self.log_end_offset:
            raise InvariantViolation(f"leader LEO went back: {self.log_end_offset} -> {log_end_offset}")
        self.log_end_offset = log_end_offset
        return self.maybe_advance_high_watermark(now_ms)

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int,
                          isr_eligible: bool = True, broker_epoch: int = -1) -> FetchDecision:
        """A fetch from ``replica_id`` at ``fetch_offset`` was served (see the module notes).

        ``isr_eligible`` False (KIP-903: the fetch came from a broker incarnation that is not
        the live registered one, or from a fenced or shutting-down broker) still serves the
        fetch and records the offset, but never proposes adding the replica to the ISR.
        """
        follower = self.followers.get(replica_id)
        if follower is None:
            raise NotLeaderOrFollowerError(
                f"replica {replica_id} is not a follower of this partition {self.replicas}")
        if not 0 <= fetch_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"follower {replica_id} fetch offset {fetch_offset} outside [0, {self.log_end_offset}]")
        if fetch_offset >= self.log_end_offset:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        elif (follower.last_fetch_leader_log_end_offset != UNKNOWN_OFFSET
              and fetch_offset >= follower.last_fetch_leader_log_end_offset):
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_time_ms)
        follower.last_fetch_leader_log_end_offset = self.log_end_offset
        follower.last_fetch_time_ms = now_ms
        follower.log_end_offset = fetch_offset
        follower.has_fetched = True
        follower.broker_epoch = broker_epoch
        propose = self._maybe_expand_isr(follower) if isr_eligible else None
        moved = self.maybe_advance_high_watermark(now_ms)
        if propose is None:
            return _HIGH_WATERMARK_MOVED if moved else _NOTHING_TO_DO
        return FetchDecision(moved, propose)

    def on_follower_fetch_at_end(self, replica_id: int, fetch_offset: int, now_ms: int,
                                 broker_epoch: int, log_start_offset: int) -> bool:
        """``on_follower_fetch`` where it changes nothing but the follower's fetch time: an
        ISR member that has fetched, at the log end, which is the HW, with its broker
        epoch and log start as its last fetch told (so no expansion, no HW move, no log
        start move). True when so, and recorded as that call would; else False."""
        follower = self.followers.get(replica_id)
        if (follower is None or not follower.has_fetched
                or follower.log_end_offset != fetch_offset
                or fetch_offset != self.log_end_offset or self.high_watermark != fetch_offset
                or follower.broker_epoch != broker_epoch
                or log_start_offset > follower.log_start_offset
                or replica_id not in self.isr):
            return False
        follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        follower.last_fetch_leader_log_end_offset = fetch_offset
        follower.last_fetch_time_ms = now_ms
        return True

    def maybe_shrink_isr(self, now_ms: int) -> tuple[int, ...] | None:
        """Propose dropping ISR followers that lag too long; ``None`` when none do."""
        if self.pending_isr is not None:
            return None
        lagging = {r for r in self.isr
                   if r != self.local_broker_id
                   and now_ms - self.followers[r].last_caught_up_ms > self.replica_lag_time_max_ms}
        if not lagging:
            return None
        proposed = tuple(r for r in self.isr if r not in lagging)
        self.pending_isr = PendingIsrChange(proposed, is_expansion=False)
        return proposed

    def on_alter_partition_committed(self, isr: Iterable[int], partition_epoch: int,
                                     now_ms: int) -> bool:
        """The controller answered the in-flight AlterPartition with its committed state."""
        self.pending_isr = None
        return self._apply_isr(tuple(isr), partition_epoch, now_ms)

    def on_alter_partition_failed(self) -> None:
        """The controller certainly did not apply the proposal: forget it, propose again later.

        Only for answers that prove it was not applied (INELIGIBLE_REPLICA,
        INVALID_REQUEST). When unsure (timeout, lost
        answer) resend the same proposal; on INVALID_UPDATE_VERSION apply the
        committed state the controller returns with ``on_leader_and_isr_update``;
        on FENCED_LEADER_EPOCH keep waiting for the LeaderAndIsr that ends this
        leadership. Dropping a pending expansion the controller did apply would
        let the HW pass a replica the controller counts as in sync.
        """
        self.pending_isr = None

    def on_leader_and_isr_update(self, isr: Iterable[int], partition_epoch: int,
                                 now_ms: int, replicas: Iterable[int] | None = None) -> bool:
        """The controller changed the ISR itself (same leader epoch, e.g. a fenced follower),
        and maybe the replicas (a reassignment, KIP-455: new replicas are followers that
        start unknown and out of the ISR; removed ones are forgotten).

        Stale updates (partition epoch not newer) are ignored. The controller's
        state supersedes a proposal in flight. True when the HW moved.
        """
        if partition_epoch <= self.partition_epoch:
            return False
        self.pending_isr = None
        if replicas is not None:
            self._set_replicas(tuple(replicas))
        return self._apply_isr(tuple(isr), partition_epoch, now_ms)

    def _set_replicas(self, replicas: tuple[int, ...]) -> None:
        if replicas == self.replicas:
            return
        if self.local_broker_id not in replicas:
            raise InvariantViolation(f"leader {self.local_broker_id} is not a replica {replicas}")
        self.replicas = replicas
        for replica_id in replicas:
            if replica_id != self.local_broker_id and replica_id not in self.followers:
                self.followers[replica_id] = FollowerState(replica_id)
        for replica_id in [r for r in self.followers if r not in replicas]:
            del self.followers[replica_id]

    # ------------------------------------------------------------------ acks=all

    def acks_all_result(self, required_offset: int) -> int | None:
        """``None`` while the HW is below ``required_offset`` (last offset + 1), else an ErrorCode.

        NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below the minimum
        after the append: the records are committed but less redundant than asked.
        """
        if self.high_watermark < required_offset:
            return None
        if len(self.maximal_isr) < self.effective_min_insync_replicas:
            return pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return pb.NONE

    # ------------------------------------------------------------------ HW

    def maybe_advance_high_watermark(self, now_ms: int) -> bool:
        """Recompute the HW from what is known; True when it moved (only ever forward)."""
        if len(self.isr) < self.effective_min_insync_replicas:
            return False
        candidate = self.log_end_offset
        maximal_isr = self.maximal_isr
        for follower in self.followers.values():
            if follower.log_end_offset >= candidate:
                continue
            # An ISR member holds the HW; else one about to join does (``is_caught_up`` is
            # pure: not asked for a member, as this runs on every append and fetch).
            if follower.replica_id in maximal_isr or (follower.has_fetched and follower.is_caught_up(
                    self.log_end_offset, now_ms, self.replica_lag_time_max_ms)):
                candidate = follower.log_end_offset
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # ------------------------------------------------------------------ internals

    def _check_isr(self, isr: tuple[int, ...]) -> None:
        if self.local_broker_id not in isr:
            raise InvariantViolation(f"leader {self.local_broker_id} not in ISR {isr}")
        if not set(isr) <= set(self.replicas):
            raise InvariantViolation(f"ISR {isr} not within replicas {self.replicas}")

    def _maybe_expand_isr(self, follower: FollowerState) -> tuple[int, ...] | None:
        if self.pending_isr is not None or follower.replica_id in self.isr:
            return None
        if (follower.log_end_offset < self.high_watermark
                or follower.log_end_offset < self.epoch_start_offset):
            return None
        proposed = self.isr + (follower.replica_id,)
        epochs = tuple(self.followers[r].broker_epoch if r in self.followers else -1
                       for r in proposed)
        self.pending_isr = PendingIsrChange(proposed, is_expansion=True, broker_epochs=epochs)
        return proposed

    def _apply_isr(self, isr: tuple[int, ...], partition_epoch: int, now_ms: int) -> bool:
        if partition_epoch < self.partition_epoch:
            return False
        self._check_isr(isr)
        self.isr = isr
        self.partition_epoch = partition_epoch
        return self.maybe_advance_high_watermark(now_ms)
