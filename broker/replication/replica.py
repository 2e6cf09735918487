"""One partition replica on one broker: every replication decision, as a pure state machine.

Theory of operation
-------------------
A ``ReplicaState`` is what a broker knows and decides about its replica of one
partition: its role (nothing yet, leader, follower), the controller's state it
last accepted (leader, leader epoch, partition epoch, replicas, ISR), the high
watermark, the leader's view of its followers (``LeaderPartitionState``, HW and
ISR rules), the AlterPartition proposal in flight, the acks=all requests
waiting for the HW, and, as a follower, where it is in the truncate-then-fetch
cycle. It reads the replica's log through ``LogView`` (offsets and the epoch
cache, all in memory) and never writes it: every event returns a ``Ready``
(``ready.py``) telling the shell what to persist, send, answer and wake.

The broker's shell (``tidewater.broker``) and the simulation's fake broker
(``tests/sim``) both feed this class the same events and carry out its
``Ready``; neither decides anything about replication itself. Time is passed
in as ``now_ms``; nothing here sleeps, reads a clock, opens a file or a socket.

Events and decisions
--------------------
=====================================  =========================================================
event                                  decision
=====================================  =========================================================
``on_leader_and_isr(state)``           invalid state: INVALID_REQUEST; older epochs:
                                       FENCED_LEADER_EPOCH; the same state again: no-op
                                       (a parked follower resumes); the same leader
                                       epoch with another leader: refused loudly (an
                                       impossible state, never followed); same leader epoch,
                                       newer partition epoch: ISR change; newer leader epoch:
                                       become leader (assign the epoch at the LEO, fsynced,
                                       before anything else), follower or offline. Either
                                       way the acks=all waits of the old leadership fail.
``on_stop_replica(leader_epoch)``      older epoch: FENCED_LEADER_EPOCH; else no role
``check_append(acks)``                 raises: not the leader; acks=all with the ISR below
                                       the minimum (nothing written)
``on_local_append(leo, waiter)``       HW (acks=all waits complete); the wait is bound to
                                       this leadership
``on_follower_fetch(...)``             fencing, divergence, range; the follower's progress
                                       moves the HW and may propose an ISR expansion
``on_alter_partition_answer/unsure``   apply what the answer proves (see below)
``tick(now)``                          time-driven HW, ISR shrink, AlterPartition resends,
                                       acks=all deadlines
``set_min_insync_replicas(n)``         the rule changed: HW and waits re-checked
follower answers                       truncation steps (KIP-101/279), divergence (KIP-320),
                                       appends, HW = min(leader HW, LEO), error backoff/park
``on_corrupt_batch(offset)``           leave the ISR through the controller
                                       (ReportCorruptReplica), then truncate below the bad
                                       batch and fetch the rest again (see below)
=====================================  =========================================================

Fencing of a request's ``current_leader_epoch`` follows Kafka's order
(``Partition.getLocalLog``): the epoch first (older: FENCED_LEADER_EPOCH,
newer: UNKNOWN_LEADER_EPOCH, -1: not checked), then leadership
(NOT_LEADER_OR_FOLLOWER).

The minimum ISR is one rule everywhere: ``min(min.insync.replicas, replication
factor)`` gates the acks=all pre-check, the HW and NOT_ENOUGH_REPLICAS_AFTER_APPEND
(``LeaderPartitionState.effective_min_insync_replicas``).

AlterPartition answers (one proposal in flight; ``alter_id`` names it):

* NONE: the committed state is applied. INVALID_UPDATE_VERSION: not applied;
  the controller's current state (it may hold an earlier proposal whose
  answer was lost) is applied.
* unsure (no answer, transport error, request-level error): resent after a
  backoff; a duplicate is answered INVALID_UPDATE_VERSION with the state.
* FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, STALE_BROKER_EPOCH: this
  leadership is ending; the proposal stays pending, not resent, until a
  LeaderAndIsr: a newer one replaces it, a resend of the same state (a
  controller resync that still names this leadership) releases it to go again.
* anything else (INELIGIBLE_REPLICA, INVALID_REQUEST, ...): certainly not
  applied; dropped, proposed again by a later event after the backoff.

Follower cycle (a new ``Follow``)::

    TRUNCATING --OffsetForLeaderEpoch answer, done--> FETCHING
        ^------------ not done: ask again -----------'
    FETCHING: fetch(last_fetched_epoch) -> records | diverging_epoch (truncate, fetch
              again with the new last epoch) | error

FENCED_LEADER_EPOCH (and UNSUPPORTED_VERSION: a leader without the RPC)
parks the follower until the next LeaderAndIsr;
OFFSET_OUT_OF_RANGE truncates again (or starts the log at the leader's log
start offset when the leader deleted what we would fetch); other errors back
off. An answer to a request of another leader epoch, or for a log end offset
the log no longer has, is dropped.

A corrupt batch (issue 14, bug 6; beyond Kafka): a batch of this replica's log
that fails its CRC or framing (found by a consumer or follower read, or the
scrub) is remembered (``corrupt_from``). While the replica is in the ISR it
truncates nothing (a committed record must not rest on fewer copies than
promised): it reports itself (``ReportCorruptReplica``, one at a time) and the
controller takes it out of the ISR and, if it leads, elects a healthy ISR
member. Out of the ISR, a follower truncates below the bad batch and fetches the
rest again, and rejoins the ISR like any follower that caught up. When no healthy
member can take over (ELIGIBLE_LEADERS_NOT_AVAILABLE) it keeps serving the
records before the bad batch and asks again every ``CORRUPT_REPORT_RETRY_MS``
and on every new state.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

from tidewater.broker.replication.follower import (
    TruncationStep,
    check_diverging,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.replication.leader_state import LeaderPartitionState, PendingIsrChange
from tidewater.broker.replication.ready import (
    APPEND_FETCHED,
    APPENDED,
    EMPTY,
    STOP_FETCHING,
    AlterPartitionRequest,
    AssignEpoch,
    CorruptReport,
    Follow,
    Ready,
    ReadyBuilder,
    Truncate,
    TruncateFully,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FencedLeaderEpochError,
    InvariantViolation,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)

UNDEFINED = -1

# How long an acks=all request may wait for the HW at most, whatever it asks: 2 minutes
# (Kafka's producer gives up at delivery.timeout.ms, 120 s by default).
ACKS_ALL_WAIT_MS_MAX = 120_000
ALTER_PARTITION_BACKOFF_MS = 200
ALTER_PARTITION_BACKOFF_MS_MAX = 2_000
# A corrupt replica that no healthy ISR member can take over asks again this often.
CORRUPT_REPORT_RETRY_MS = 5_000
_WAIT_FOR_LEADER_AND_ISR = frozenset({pb.FENCED_LEADER_EPOCH, pb.NOT_LEADER_OR_FOLLOWER,
                                      pb.STALE_BROKER_EPOCH})


class EpochCacheView(Protocol):
    latest_epoch: int

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]: ...


class LogView(Protocol):
    """What the decisions read of the replica's log (memory only)."""

    log_start_offset: int
    log_end_offset: int
    leader_epoch_cache: EpochCacheView


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The controller's state of one partition, as LeaderAndIsr carries it."""

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
    """How a follower finds its truncation point (the broker uses the defaults).

    ``truncate_first``: ask OffsetForLeaderEpoch before the first fetch of a new
    leader epoch (else rely on the fetch's ``diverging_epoch`` alone, KIP-320);
    ``send_last_fetched_epoch``: False sends pre-KIP-320 fetches (no divergence
    check by the leader). The simulation varies both across seeds.
    """

    truncate_first: bool = True
    send_last_fetched_epoch: bool = True
    fetch_backoff_ms: int = 1000


class ReplicaState:
    """Every replication decision for one partition replica on this broker."""

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
        self.leader: LeaderPartitionState | None = None
        self.follower: FollowerCycle | None = None
        # The HW a follower (or a replica with no role) exposes is min(this, its LEO); a
        # checkpointed HW can exceed the LEO after a crash lost an unflushed tail.
        self._high_watermark_seen = max(0, high_watermark)
        # acks=all waits of the current leadership: heap of [required_offset, waiter_id],
        # their deadlines by id (a wait is live while its id is in _deadlines).
        self._waits: list[list[int]] = []
        self._deadlines: dict[int, int] = {}
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

    # ================================================================== fencing

    def check_epoch(self, current_leader_epoch: int, *, require_leader: bool) -> None:
        """KIP-320 fencing of a request's ``current_leader_epoch`` (-1: not checked), then
        leadership, in Kafka's order. Raises the typed error to answer."""
        if current_leader_epoch != UNDEFINED:
            if current_leader_epoch < self.leader_epoch:
                raise FencedLeaderEpochError(
                    f"request epoch {current_leader_epoch} is older than {self.leader_epoch} "
                    f"for {self.topic}-{self.partition}")
            if current_leader_epoch > self.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"request epoch {current_leader_epoch} is newer than {self.leader_epoch} "
                    f"for {self.topic}-{self.partition}")
        if require_leader and self.leader is None:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} does not lead {self.topic}-{self.partition} "
                f"(leader {self.leader_id}, epoch {self.leader_epoch})")

    # ================================================================== controller

    def on_leader_and_isr(self, state: PartitionState, now_ms: int) -> Ready:
        out = ReadyBuilder()
        self._apply_state(state, now_ms, out)
        return out.build()

    def _apply_state(self, state: PartitionState, now_ms: int, out: ReadyBuilder) -> None:
        """A controller's state of this partition (LeaderAndIsr, or an answer carrying the
        committed state); a refusal is ``out.error``."""
        problem = self._invalid(state)
        if problem is not None:
            code = (pb.UNKNOWN_TOPIC_OR_PARTITION if self.local_broker_id not in state.replicas
                    else pb.INVALID_REQUEST)
            out.refuse(code, problem)
            return
        ours = (self.leader_epoch, self.partition_epoch)
        theirs = (state.leader_epoch, state.partition_epoch)
        if theirs < ours:
            out.refuse(pb.FENCED_LEADER_EPOCH, (
                f"state epoch {theirs} is not newer than {ours} for "
                f"{self.topic}-{self.partition}"))
            return
        if (state.leader_epoch == self.leader_epoch and state.leader != self.leader_id
                and self.leader_id != UNDEFINED):
            # Two leaders in one epoch: epoch-based truncation could not tell their records
            # apart. A correct controller never does this; refuse, keep what we have.
            message = (f"{self.topic}-{self.partition}: refused LeaderAndIsr naming leader "
                       f"{state.leader} in epoch {state.leader_epoch}, whose leader is "
                       f"{self.leader_id}: one epoch cannot have two leaders")
            out.alarms.append(message)
            out.counters.append("refused_impossible_states")
            out.refuse(pb.INVALID_REQUEST, message)
            return
        if self._plays(state):
            if theirs == ours:
                # A resend (a broker re-registered, a controller failed over): already
                # applied; a parked follower tries again, and so does a proposal the
                # controller answered "wait for LeaderAndIsr" (this is one).
                cycle = self.follower
                if cycle is not None and cycle.parked:
                    cycle.parked = False
                    cycle.phase = self._first_phase()
                    out.fetch = Follow(cycle.leader_id, cycle.leader_epoch)
                if self.leader is not None and self._alter_waits_for_leader_and_isr:
                    self._alter_in_flight = self._alter_waits_for_leader_and_isr = False
                    self._maybe_send_alter(now_ms, out)
            else:
                self._on_isr_change(state, now_ms, out)
            self._react_to_corruption(now_ms, out)
            return
        self._end_leadership(pb.NOT_LEADER_OR_FOLLOWER, out)
        self._record(state)
        out.leadership_changed = True
        if state.leader == self.local_broker_id:
            self._become_leader(state, now_ms, out)
        elif state.leader >= 0:
            self.role = Role.FOLLOWER
            self.follower = FollowerCycle(state.leader, state.leader_epoch, self._first_phase())
            out.fetch = Follow(state.leader, state.leader_epoch)
            out.notes.append(f"follower of {self.topic}-{self.partition} in epoch "
                             f"{state.leader_epoch} (leader {state.leader}) at LEO "
                             f"{self.log.log_end_offset}")
        else:
            self.role = Role.NONE
            self.follower = None
            out.fetch = STOP_FETCHING
            out.notes.append(f"{self.topic}-{self.partition} is offline in epoch "
                             f"{state.leader_epoch}")
        self._report_next_send_ms = 0  # a new state: a refused report may succeed now
        self._react_to_corruption(now_ms, out)

    def on_stop_replica(self, leader_epoch: int, now_ms: int) -> Ready:
        """StopReplica: this broker no longer plays any part (``leader_epoch`` -1: any)."""
        out = ReadyBuilder()
        if 0 <= leader_epoch < self.leader_epoch:
            return out.refuse(pb.FENCED_LEADER_EPOCH, (
                f"StopReplica epoch {leader_epoch} is older than {self.leader_epoch} for "
                f"{self.topic}-{self.partition}")).build()
        self._end_leadership(pb.NOT_LEADER_OR_FOLLOWER, out)
        self.role = Role.NONE
        self.follower = None
        if leader_epoch > self.leader_epoch:
            # Fences older LeaderAndIsr; who leads that epoch is not known here.
            self.leader_epoch, self.leader_id = leader_epoch, UNDEFINED
        out.fetch = STOP_FETCHING
        out.leadership_changed = True
        return out.build()

    def on_storage_failure(self, now_ms: int) -> Ready:
        """The shell could not persist a decision (the log dir failed): play no part."""
        out = ReadyBuilder()
        self._end_leadership(pb.NOT_LEADER_OR_FOLLOWER, out)
        self.role = Role.NONE
        self.follower = None
        out.fetch = STOP_FETCHING
        out.leadership_changed = True
        out.alarms.append(f"{self.topic}-{self.partition}: storage failed; no role until the "
                          f"next LeaderAndIsr")
        return out.build()

    def set_min_insync_replicas(self, min_insync_replicas: int, now_ms: int) -> Ready:
        """``min.insync.replicas`` changed: the HW and the waiting acks=all requests are
        judged by the new rule at once."""
        self.min_insync_replicas = min_insync_replicas
        leader = self.leader
        if leader is None or leader.min_insync_replicas == min_insync_replicas:
            return EMPTY
        leader.min_insync_replicas = min_insync_replicas
        out = ReadyBuilder()
        out.high_watermark_moved = leader.maybe_advance_high_watermark(now_ms)
        self._complete_waits(out)
        return out.build()

    # ================================================================== leader: produce

    def check_append(self, acks: int) -> int:
        """Before a produce's append: raises if it must be refused (nothing written);
        returns the leader epoch to stamp the batches with."""
        leader = self.leader
        if leader is None:
            raise NotLeaderOrFollowerError(
                f"broker {self.local_broker_id} does not lead {self.topic}-{self.partition} "
                f"(leader {self.leader_id})")
        if acks == -1 and leader.is_under_min_isr:
            raise NotEnoughReplicasError(
                f"ISR {leader.isr} has {len(leader.isr)} members, acks=all needs "
                f"{leader.effective_min_insync_replicas} (min(min.insync.replicas "
                f"{leader.min_insync_replicas}, replication factor {leader.replication_factor}))")
        return leader.leader_epoch

    def on_local_append(self, log_end_offset: int, now_ms: int, *, waiter_id: int = -1,
                        required_offset: int = 0, timeout_ms: int = 0) -> Ready:
        """The leader appended up to ``log_end_offset``; with ``waiter_id`` >= 0 an acks=all
        request waits, bound to this leadership, until the HW reaches ``required_offset``
        (at most ``timeout_ms``, itself at most ``ACKS_ALL_WAIT_MS_MAX``)."""
        leader = self.leader
        if leader is None:
            raise InvariantViolation(
                f"{self.topic}-{self.partition}: an append as leader while {self.role}")
        moved = leader.on_local_append(log_end_offset, now_ms)
        if waiter_id >= 0:
            timeout_ms = min(max(timeout_ms, 0), ACKS_ALL_WAIT_MS_MAX)
            self._deadlines[waiter_id] = now_ms + timeout_ms
            heapq.heappush(self._waits, [required_offset, waiter_id])
        elif not moved:
            return APPENDED
        out = ReadyBuilder()
        out.appended = True
        out.high_watermark_moved = moved
        self._complete_waits(out)
        return out.build()

    def on_wait_deadline(self, waiter_id: int, now_ms: int) -> Ready:
        """A wait's timer fired: pb.REQUEST_TIMED_OUT if it is still waiting and due."""
        deadline = self._deadlines.get(waiter_id)
        if deadline is None or now_ms < deadline:
            return EMPTY
        del self._deadlines[waiter_id]
        return Ready(completed=((waiter_id, pb.REQUEST_TIMED_OUT),))

    def withdraw_wait(self, waiter_id: int) -> None:
        """The request went away (a closed stream): forget its wait, answer nothing."""
        self._deadlines.pop(waiter_id, None)

    # ================================================================== leader: replication

    def on_follower_fetch(self, replica_id: int, current_leader_epoch: int, fetch_offset: int,
                          last_fetched_epoch: int, now_ms: int, *, isr_eligible: bool = True,
                          record: bool = True, broker_epoch: int = -1
                          ) -> tuple[tuple[int, int] | None, Ready]:
        """A follower's fetch of this partition: ``(diverging_epoch, ready)``.

        Raises the typed error to answer (fencing, out of range). ``diverging_epoch`` not
        None: answer it and no records (KIP-320). Else serve records from
        ``fetch_offset``. ``record`` False (a long-poll's later passes) checks without
        counting the fetch again. ``isr_eligible`` False (KIP-903: not the live
        incarnation of that broker) still serves but never adds it to the ISR; the
        fetch's ``broker_epoch`` goes with an expansion it leads to, and the controller
        admits the joiner only with its registered epoch.
        """
        self.check_epoch(current_leader_epoch, require_leader=True)
        leader = self.leader
        assert leader is not None  # check_epoch(require_leader=True) passed
        log = self.log
        log_end_offset = log.log_end_offset
        diverging = check_diverging(last_fetched_epoch, fetch_offset, log.leader_epoch_cache,
                                    log_end_offset)
        if diverging is not None:
            return diverging, EMPTY
        if not log.log_start_offset <= fetch_offset <= log_end_offset:
            raise OffsetOutOfRangeError(
                f"follower {replica_id} fetch offset {fetch_offset} outside "
                f"[{log.log_start_offset}, {log_end_offset}] for {self.topic}-{self.partition}")
        if not record:
            return None, EMPTY
        decision = leader.on_follower_fetch(replica_id, fetch_offset, now_ms, isr_eligible,
                                            broker_epoch)
        if not decision.high_watermark_changed and decision.propose_isr is None:
            return None, EMPTY
        out = ReadyBuilder()
        out.high_watermark_moved = decision.high_watermark_changed
        self._complete_waits(out)
        self._maybe_send_alter(now_ms, out)
        return None, out.build()

    def answer_offset_for_leader_epoch(self, current_leader_epoch: int,
                                       requested_epoch: int) -> tuple[int, int]:
        """The leader's ``(epoch, end_offset)`` for a follower's epoch (KIP-279), even (-1, -1)."""
        self.check_epoch(current_leader_epoch, require_leader=True)
        return self.log.leader_epoch_cache.end_offset_for(requested_epoch,
                                                          self.log.log_end_offset)

    def check_consumer_fetch(self, current_leader_epoch: int, fetch_offset: int) -> int:
        """A consumer's fetch: raises the typed error; returns the HW to read below."""
        self.check_epoch(current_leader_epoch, require_leader=True)
        log = self.log
        if not log.log_start_offset <= fetch_offset <= log.log_end_offset:
            raise OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} outside [{log.log_start_offset}, "
                f"{log.log_end_offset}] for {self.topic}-{self.partition}")
        assert self.leader is not None  # check_epoch(require_leader=True) passed
        return self.leader.high_watermark

    def on_alter_partition_answer(self, alter_id: int, error: int, state: PartitionState | None,
                                  now_ms: int) -> Ready:
        """The controller's answer to proposal ``alter_id`` (module docstring)."""
        leader = self.leader
        proposal = self._alter_for
        if leader is None or alter_id != self._alter_id or proposal is None:
            return EMPTY  # an answer for an earlier leadership or proposal
        out = ReadyBuilder()
        if error in _WAIT_FOR_LEADER_AND_ISR:
            out.notes.append(f"AlterPartition {self.topic}-{self.partition} answered "
                             f"{pb.ErrorCode.Name(error)}: waiting for LeaderAndIsr")
            # Stays in flight: no resend until a LeaderAndIsr replaces it (or repeats it).
            self._alter_waits_for_leader_and_isr = True
            return out.build()
        self._alter_in_flight = False
        old_isr = leader.isr
        moved = False
        if (state is not None and state.leader_epoch == leader.leader_epoch
                and error in (pb.NONE, pb.INVALID_UPDATE_VERSION)):
            if error == pb.NONE and leader.pending_isr is proposal:
                moved = leader.on_alter_partition_committed(state.isr, state.partition_epoch,
                                                            now_ms)
            else:
                moved = leader.on_leader_and_isr_update(state.isr, state.partition_epoch, now_ms)
            self.partition_epoch = leader.partition_epoch
            self.isr = leader.isr
        if error != pb.NONE and leader.pending_isr is proposal:
            leader.on_alter_partition_failed()  # certainly not applied (module docstring)
            # A dropped expansion's joiner no longer holds the HW (the maximal ISR shrank).
            moved = leader.maybe_advance_high_watermark(now_ms) or moved
        if error == pb.NONE:
            self._alter_backoff_ms = ALTER_PARTITION_BACKOFF_MS
        else:
            self._alter_next_send_ms = now_ms + self._alter_backoff_ms
            out.notes.append(f"AlterPartition {self.topic}-{self.partition} ISR "
                             f"{proposal.proposed_isr} refused: {error}")
        self._note_isr_change(old_isr, out)
        out.high_watermark_moved = moved
        self._complete_waits(out)
        self._maybe_send_alter(now_ms, out)
        return out.build()

    def on_alter_partition_unsure(self, alter_id: int, now_ms: int) -> Ready:
        """No answer to proposal ``alter_id`` (timeout, lost connection, request-level
        error): it may or may not have been applied, so it is sent again after a backoff."""
        if self.leader is None or alter_id != self._alter_id or not self._alter_in_flight:
            return EMPTY
        self._alter_in_flight = False
        self._alter_next_send_ms = now_ms + self._alter_backoff_ms
        self._alter_backoff_ms = min(self._alter_backoff_ms * 2, ALTER_PARTITION_BACKOFF_MS_MAX)
        return EMPTY

    def tick(self, now_ms: int) -> Ready:
        """Time passed: the HW (a joiner stopped being caught up), ISR shrink proposals,
        AlterPartition resends, acks=all deadlines."""
        leader = self.leader
        if leader is None:
            if self.corrupt_from is None:
                return EMPTY
            out = ReadyBuilder()
            self._react_to_corruption(now_ms, out)
            return out.build()
        out = ReadyBuilder()
        if self.corrupt_from is not None:
            self._react_to_corruption(now_ms, out)
        out.high_watermark_moved = leader.maybe_advance_high_watermark(now_ms)
        if leader.pending_isr is None and now_ms >= self._alter_next_send_ms:
            proposal = leader.maybe_shrink_isr(now_ms)
            if proposal is not None:
                out.notes.append(f"proposing ISR shrink of {self.topic}-{self.partition} to "
                                 f"{list(proposal)}")
        self._maybe_send_alter(now_ms, out)
        self._complete_waits(out)
        if self._deadlines:
            expired = [w for w, deadline in self._deadlines.items() if deadline <= now_ms]
            for waiter_id in expired:
                del self._deadlines[waiter_id]
                out.completed.append((waiter_id, pb.REQUEST_TIMED_OUT))
        return out.build()

    # ================================================================== corruption

    @property
    def corruption_handover_expected(self) -> bool:
        """A corrupt batch is known and another in-sync replica is expected to serve its
        records (reported, not refused for want of a healthy ISR member): a read that
        meets the bad batch is a retriable storage error here, not a lost record."""
        return (self.corrupt_from is not None and not self._report_refused
                and any(r != self.local_broker_id for r in self.isr))

    def on_corrupt_batch(self, base_offset: int, now_ms: int) -> Ready:
        """A batch at ``base_offset`` of this replica's log failed its CRC or framing (found
        by a read or the scrub). Beyond Kafka: the replica leaves the ISR (and hands its
        leadership to a healthy ISR member) through the controller, then truncates below
        the bad batch and fetches the rest again. Until it is out of the ISR it truncates
        nothing: a committed record must never rest on fewer in-sync copies than promised."""
        if self.corrupt_from is not None and self.corrupt_from <= base_offset:
            return EMPTY  # known: its reaction is under way
        self.corrupt_from = base_offset
        self._report_refused = False
        out = ReadyBuilder()
        out.counters.append("corrupt_batches")
        out.alarms.append(f"{self.topic}-{self.partition}: the batch at offset {base_offset} of "
                          f"this replica is corrupt; leaving the ISR, then truncating below it "
                          f"and fetching the rest again")
        self._react_to_corruption(now_ms, out)
        return out.build()

    def on_corrupt_report_answer(self, report_id: int, error: int, state: PartitionState | None,
                                 now_ms: int) -> Ready:
        """The controller's answer to report ``report_id`` (NONE: out of the ISR, and its
        committed state comes with it; ELIGIBLE_LEADERS_NOT_AVAILABLE: no healthy ISR member
        can take over, tried again later; anything else: our view was stale)."""
        if report_id != self._report_id or not self._report_in_flight:
            return EMPTY
        self._report_in_flight = False
        out = ReadyBuilder()
        if state is not None and (state.leader_epoch, state.partition_epoch) > (
                self.leader_epoch, self.partition_epoch):
            self._apply_state(state, now_ms, out)
            out.error, out.error_message = pb.NONE, ""  # the report's answer, not a request's
        if error == pb.ELIGIBLE_LEADERS_NOT_AVAILABLE:
            self._report_refused = True
            self._report_next_send_ms = now_ms + CORRUPT_REPORT_RETRY_MS
            out.alarms.append(f"{self.topic}-{self.partition}: no healthy in-sync replica can "
                              f"take over the corrupt replica here; serving the records before "
                              f"offset {self.corrupt_from} only")
        elif error != pb.NONE:
            self._report_next_send_ms = now_ms + ALTER_PARTITION_BACKOFF_MS
        self._react_to_corruption(now_ms, out)
        return out.build()

    def on_corrupt_report_unsure(self, report_id: int, now_ms: int) -> Ready:
        """No answer to report ``report_id``: sent again after a backoff."""
        if report_id == self._report_id and self._report_in_flight:
            self._report_in_flight = False
            self._report_next_send_ms = now_ms + ALTER_PARTITION_BACKOFF_MS
        return EMPTY

    def _react_to_corruption(self, now_ms: int, out: ReadyBuilder) -> None:
        """What a known corrupt batch asks for now: out of the ISR, a follower truncates
        below it (and fetches the rest again); in it, the report goes (one at a time)."""
        offset = self.corrupt_from
        if offset is None:
            return
        if offset >= self.log.log_end_offset:
            self.corrupt_from = None  # already cut away (a truncation got there first)
            return
        in_isr = self.local_broker_id in self.isr
        if not in_isr and self.follower is not None:
            self._truncate(offset, "below the corrupt batch", out)
            self.corrupt_from = None
            self._report_refused = False
            return
        if (not in_isr or self._report_in_flight or now_ms < self._report_next_send_ms
                or self.leader_epoch < 0):
            return
        self._report_id += 1
        self._report_in_flight = True
        out.report_corrupt = CorruptReport(self._report_id, self.leader_epoch,
                                           self.partition_epoch, offset)

    # ================================================================== follower

    def fetch_position(self) -> tuple[int, int, int]:
        """``(fetch_offset, last_fetched_epoch, log_start_offset)`` for this follower's next
        fetch (last_fetched_epoch -1 when the options send none)."""
        log = self.log
        last_epoch = (log.leader_epoch_cache.latest_epoch if self.options.send_last_fetched_epoch
                      else UNDEFINED)
        return log.log_end_offset, last_epoch, log.log_start_offset

    def follower_wants(self, now_ms: int) -> str | None:
        """What this follower would send now: ``FollowerPhase.TRUNCATING`` (an
        OffsetForLeaderEpoch for ``log.leader_epoch_cache.latest_epoch``),
        ``FollowerPhase.FETCHING`` (a fetch at ``fetch_position()``), or None (not a
        follower, parked, or backing off)."""
        cycle = self.follower
        if cycle is None or cycle.parked or now_ms < cycle.retry_at_ms:
            return None
        return cycle.phase

    def on_offset_for_leader_epoch_answer(self, leader_epoch: int, error: int,
                                          answer: tuple[int, int], now_ms: int) -> Ready:
        """The leader's answer to an OffsetForLeaderEpoch sent in ``leader_epoch``."""
        cycle = self.follower
        if (cycle is None or cycle.leader_epoch != leader_epoch
                or cycle.phase != FollowerPhase.TRUNCATING):
            return EMPTY  # the leader epoch changed while it was in flight: dropped
        out = ReadyBuilder()
        if error != pb.NONE:
            self._on_follower_error(cycle, error, now_ms, out)
            return out.build()
        step = self._truncation_step(answer)
        self._truncate(step.truncate_to, f"leader answered {answer}", out)
        out.counters.append("truncation_" + ("done" if step.done else "ask_again"))
        if answer[1] == UNDEFINED:
            out.counters.append("truncation_to_high_watermark")
        if step.done:
            cycle.phase = FollowerPhase.FETCHING
        return out.build()

    def on_fetch_answer(self, leader_epoch: int, fetch_offset: int, error: int, *,
                        high_watermark: int, leader_log_start_offset: int,
                        diverging_epoch: tuple[int, int] | None, now_ms: int) -> Ready:
        """The leader's answer for this partition to a fetch sent in ``leader_epoch`` at
        ``fetch_offset``. With no error and no divergence the Ready asks the shell to
        append the answer's records (``AppendFetched``)."""
        cycle = self.follower
        if (cycle is None or cycle.leader_epoch != leader_epoch
                or cycle.phase != FollowerPhase.FETCHING):
            return EMPTY  # another leader epoch, or truncating again: dropped
        log_end_offset = self.log.log_end_offset
        if fetch_offset != log_end_offset:
            return EMPTY  # the log moved meanwhile (truncated): fetch again from its LEO
        out = ReadyBuilder()
        if error == pb.OFFSET_OUT_OF_RANGE and leader_log_start_offset > log_end_offset:
            # The leader deleted what we would fetch next (retention): start over there.
            out.persist.append(TruncateFully(leader_log_start_offset))
            out.notes.append(f"{self.topic}-{self.partition}: leader log starts at "
                             f"{leader_log_start_offset} past our LEO {log_end_offset}: "
                             f"truncating fully")
            self._high_watermark_seen = leader_log_start_offset
            return out.build()
        if error != pb.NONE:
            self._on_follower_error(cycle, error, now_ms, out)
            return out.build()
        if diverging_epoch is not None:
            step = self._diverging_step(diverging_epoch)
            self._truncate(step.truncate_to, f"diverging epoch {diverging_epoch}", out)
            out.counters.append("diverging_" + ("done" if step.done else "not_done"))
            return out.build()  # the next fetch carries the new last epoch
        self._high_watermark_seen = high_watermark
        return _APPEND_FETCHED

    def on_follower_storage_error(self, now_ms: int) -> None:
        """Appending or truncating failed in the shell: back off, try again."""
        if self.follower is not None:
            self.follower.retry_at_ms = now_ms + self.options.fetch_backoff_ms

    # ================================================================== internals

    def _invalid(self, state: PartitionState) -> str | None:
        """Why ``state`` cannot be a controller's state of this partition, or None."""
        replicas, isr = state.replicas, state.isr
        where = f"{state.topic}-{state.partition}"
        if self.local_broker_id not in replicas:
            return f"broker {self.local_broker_id} is not a replica of {where}: {list(replicas)}"
        if len(set(replicas)) != len(replicas) or any(r < 0 for r in replicas):
            return f"{where}: replicas {list(replicas)} repeat or are negative"
        if not isr or not set(isr) <= set(replicas) or len(set(isr)) != len(isr):
            return f"{where}: ISR {list(isr)} is empty, repeats or is not within the replicas"
        if state.leader != UNDEFINED and state.leader not in isr:
            return f"{where}: leader {state.leader} is not in the ISR {list(isr)}"
        if state.leader < UNDEFINED or state.leader_epoch < 0 or state.partition_epoch < 0:
            return f"{where}: negative leader or epochs in {state}"
        return None

    def _plays(self, state: PartitionState) -> bool:
        """Does this replica already play the part ``state`` gives it in its leader epoch?
        (Not after a StopReplica or a storage failure: then the part is taken anew.)"""
        if state.leader_epoch != self.leader_epoch:
            return False
        if state.leader == self.local_broker_id:
            return self.leader is not None
        if state.leader >= 0:
            return self.follower is not None and self.follower.leader_id == state.leader
        return self.role == Role.NONE

    def _first_phase(self) -> str:
        return FollowerPhase.TRUNCATING if self.options.truncate_first else FollowerPhase.FETCHING

    def _record(self, state: PartitionState) -> None:
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = state.replicas
        self.isr = state.isr

    def _become_leader(self, state: PartitionState, now_ms: int, out: ReadyBuilder) -> None:
        log_end_offset = self.log.log_end_offset
        # The epoch is in the cache (fsynced) before anything is served in it: the shell
        # persists before it carries out the rest of this Ready.
        out.persist.append(AssignEpoch(state.leader_epoch, log_end_offset))
        self.leader = self._new_leader_state(state, now_ms)
        self.role = Role.LEADER
        self.follower = None
        self._alter_for = None
        self._alter_in_flight = self._alter_waits_for_leader_and_isr = False
        self._alter_next_send_ms = 0
        self._alter_backoff_ms = ALTER_PARTITION_BACKOFF_MS
        out.fetch = STOP_FETCHING
        out.counters.append("leader_elections")
        out.notes.append(f"leader of {self.topic}-{self.partition} in epoch "
                         f"{state.leader_epoch} at LEO {log_end_offset}, HW "
                         f"{self.leader.high_watermark}, ISR {list(state.isr)}")

    def _new_leader_state(self, state: PartitionState, now_ms: int) -> LeaderPartitionState:
        """The leader's view of one leadership, starting at the LEO with the HW this replica
        exposed until now."""
        log_end_offset = self.log.log_end_offset
        return LeaderPartitionState(
            local_broker_id=self.local_broker_id, replicas=state.replicas, isr=state.isr,
            leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
            high_watermark=self.high_watermark, log_end_offset=log_end_offset,
            epoch_start_offset=log_end_offset, min_insync_replicas=self.min_insync_replicas,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms, now_ms=now_ms)

    def _end_leadership(self, code: int, out: ReadyBuilder) -> None:
        """Fail every acks=all wait of the leadership that ends (they may never commit)."""
        if self.leader is not None:
            self._high_watermark_seen = self.leader.high_watermark
        for waiter_id in self._deadlines:
            out.completed.append((waiter_id, code))
        self._deadlines.clear()
        self._waits.clear()
        self.leader = None
        self._alter_for = None
        self._alter_in_flight = self._alter_waits_for_leader_and_isr = False

    def _on_isr_change(self, state: PartitionState, now_ms: int, out: ReadyBuilder) -> None:
        """Same leader epoch, newer partition epoch: the controller changed the ISR."""
        leader = self.leader
        self._record(state)
        if leader is None:
            return
        old_isr = leader.isr
        out.high_watermark_moved = leader.on_leader_and_isr_update(state.isr,
                                                                   state.partition_epoch, now_ms)
        if leader.pending_isr is None:
            self._alter_for = None  # the controller's state superseded the proposal
            self._alter_in_flight = self._alter_waits_for_leader_and_isr = False
        self._note_isr_change(old_isr, out, by="the controller")
        self._complete_waits(out)
        self._maybe_send_alter(now_ms, out)

    def _note_isr_change(self, old_isr: tuple[int, ...], out: ReadyBuilder,
                         by: str = "AlterPartition") -> None:
        assert self.leader is not None  # only a leader's ISR changes
        isr = self.leader.isr
        if isr == old_isr:
            return
        out.counters.append("isr_shrinks" if len(isr) < len(old_isr) else "isr_expands")
        out.notes.append(f"ISR of {self.topic}-{self.partition} is now {list(isr)} (partition "
                         f"epoch {self.leader.partition_epoch}, {by})")

    def _maybe_send_alter(self, now_ms: int, out: ReadyBuilder) -> None:
        """Carry the leader's pending ISR proposal to the controller, one at a time."""
        assert self.leader is not None  # called on a leader's paths only
        pending = self.leader.pending_isr
        if pending is None:
            return
        if pending is not self._alter_for:
            self._alter_id += 1
            self._alter_for = pending
            self._alter_in_flight = self._alter_waits_for_leader_and_isr = False
        if self._alter_in_flight or now_ms < self._alter_next_send_ms:
            return
        self._alter_in_flight = True
        leader = self.leader
        out.alter_partition = AlterPartitionRequest(self._alter_id, leader.leader_epoch,
                                                    leader.partition_epoch, pending.proposed_isr,
                                                    pending.broker_epochs)
        out.counters.append("isr_proposals_" + ("expand" if pending.is_expansion else "shrink"))

    def _complete_waits(self, out: ReadyBuilder) -> None:
        """Answer every acks=all wait whose outcome the HW and ISR now decide."""
        waits = self._waits
        if not waits:
            return
        leader = self.leader
        assert leader is not None  # a leadership's waits end with it (_end_leadership)
        deadlines = self._deadlines
        while waits:
            required_offset, waiter_id = waits[0]
            if waiter_id not in deadlines:
                heapq.heappop(waits)  # timed out or withdrawn
                continue
            result = leader.acks_all_result(required_offset)
            if result is None:
                break  # the smallest required offset is not committed: none after it is
            heapq.heappop(waits)
            del deadlines[waiter_id]
            out.completed.append((waiter_id, result))

    def _truncation_step(self, answer: tuple[int, int]) -> TruncationStep:
        return follower_truncation(answer, self.log.leader_epoch_cache, self.log.log_end_offset,
                                   self.high_watermark)

    def _diverging_step(self, diverging_epoch: tuple[int, int]) -> TruncationStep:
        return truncation_for_diverging_epoch(diverging_epoch, self.log.leader_epoch_cache,
                                              self.log.log_end_offset, self.high_watermark)

    def _truncate(self, offset: int, why: str, out: ReadyBuilder) -> None:
        log_end_offset = self.log.log_end_offset
        out.persist.append(Truncate(offset))
        if offset < log_end_offset:
            out.counters.append("follower_truncations")
            out.notes.append(f"{self.topic}-{self.partition}: {why}: truncating to {offset} "
                             f"(LEO was {log_end_offset})")

    def _on_follower_error(self, cycle: FollowerCycle, error: int, now_ms: int,
                           out: ReadyBuilder) -> None:
        if error in (pb.FENCED_LEADER_EPOCH, pb.UNSUPPORTED_VERSION):
            # We are behind the leader, or it cannot serve us: the controller will tell us more.
            cycle.parked = True
        else:
            if error == pb.OFFSET_OUT_OF_RANGE:
                cycle.phase = FollowerPhase.TRUNCATING
            cycle.retry_at_ms = now_ms + self.options.fetch_backoff_ms
        out.counters.append(f"follower_error_{error}")


_APPEND_FETCHED = Ready(persist=(APPEND_FETCHED,))

