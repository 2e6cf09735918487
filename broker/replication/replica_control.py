"""The controller's requests to one replica: LeaderAndIsr, StopReplica, the minimum ISR;
fencing by leader epoch; a failed disk.

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
``on_persist_failure(op)``             a persist operation of a Ready failed: no role
                                       (a leader's epoch), or a follower truncates or
                                       fetches again from its real log (the method's table)
``on_storage_failure``                 no role until the next LeaderAndIsr, or until
                                       ``tick`` takes the same state again after a
                                       backoff (500 ms doubling to 30 s)
``set_min_insync_replicas(n)``         the rule changed: HW and waits re-checked
=====================================  =========================================================

Fencing of a request's ``current_leader_epoch`` (``check_epoch``) follows Kafka's
order (``Partition.getLocalLog``): the epoch first (older: FENCED_LEADER_EPOCH,
newer: UNKNOWN_LEADER_EPOCH, -1: not checked), then leadership
(NOT_LEADER_OR_FOLLOWER).
"""

from __future__ import annotations

from tidewater.broker.replication.leader_state import LeadershipState, PendingIsrChange
from tidewater.broker.replication.ready import (
    EMPTY,
    STOP_FETCHING,
    AssignEpoch,
    Follow,
    Persist,
    Ready,
    ReadyBuilder,
    describe_persist,
)
from tidewater.broker.replication.replica_base import (
    ALTER_PARTITION_BACKOFF_MS,
    STORAGE_RETRY_MS,
    STORAGE_RETRY_MS_MAX,
    UNDEFINED,
    FollowerCycle,
    LeaderAndIsrState,
    ReplicaBase,
    Role,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FencedLeaderEpochError,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)


class ControlEvents(ReplicaBase):
    """The controller's requests and fencing (module docstring)."""

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

    # ================================================================== requests

    def on_leader_and_isr(self, state: LeaderAndIsrState, now_ms: int) -> Ready:
        out = ReadyBuilder()
        self._apply_state(state, now_ms, out)
        return out.build()

    def _apply_state(self, state: LeaderAndIsrState, now_ms: int, out: ReadyBuilder) -> None:
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

    # ================================================================== a failed disk

    def on_persist_failure(self, op: Persist, now_ms: int) -> Ready:
        """The shell could not carry out ``op``, a persist operation of the last ``Ready``
        (etcd raft's Advance, for a failure). The core never acts as if it happened:

        ===========================  ================================================
        failed operation             decision
        ===========================  ================================================
        ``AssignEpoch``              no role until the next LeaderAndIsr: a leader
                                     must not serve in an epoch its cache lacks
        ``Truncate``,                a follower truncates again (``TRUNCATING``)
        ``TruncateFully``            after the fetch backoff: where to, and then its
                                     fetch position, come from its real log; a cut
                                     below a corrupt batch is owed again
        ``AppendFetched``,           a follower fetches again from its real LEO
        ``IncrementLogStartOffset``  after the fetch backoff (the next answer
                                     carries the leader's log start again)
        anything, with no follower   no role (as ``AssignEpoch``)
        ===========================  ================================================
        """
        if isinstance(op, AssignEpoch) or self.follower is None:
            return self._stop_on_storage_failure(f"{describe_persist(op)} failed", now_ms)
        out = ReadyBuilder()
        self._on_follower_persist_failure(op, now_ms, out)
        return out.build()

    def on_storage_failure(self, now_ms: int) -> Ready:
        """The log dir failed, by the shell's word: play no part until the next
        LeaderAndIsr. (A failed operation of a Ready goes to ``on_persist_failure``.)"""
        return self._stop_on_storage_failure("storage failed", now_ms)

    def _stop_on_storage_failure(self, why: str, now_ms: int) -> Ready:
        """No role for now; the acks=all waits of a leadership fail. The role is taken again
        from the same state after a backoff (``tick``), or from the next LeaderAndIsr:
        without that a leader whose disk failed once would hold its partition offline
        until the controller happened to send it a new state. An ISR expansion in flight
        is kept for the same state: the controller may have committed it."""
        out = ReadyBuilder()
        self._storage_retry_state = LeaderAndIsrState(
            self.topic, self.partition, self.leader_id, self.leader_epoch,
            self.partition_epoch, self.replicas, self.isr)
        leader = self.leader
        pending = leader.pending_isr if leader is not None else None
        if pending is not None and pending.is_expansion:
            self._storage_retry_expansion = pending
        self._storage_retry_at_ms = now_ms + self._storage_retry_backoff_ms
        self._end_leadership(pb.NOT_LEADER_OR_FOLLOWER, out)
        self.role = Role.NONE
        self.follower = None
        out.fetch = STOP_FETCHING
        out.leadership_changed = True
        out.counters.append("storage_failures")
        out.alarms.append(f"{self.topic}-{self.partition}: {why}; no role for "
                          f"{self._storage_retry_backoff_ms} ms or until the next LeaderAndIsr")
        self._storage_retry_backoff_ms = min(2 * self._storage_retry_backoff_ms,
                                             STORAGE_RETRY_MS_MAX)
        return out.build()

    def _maybe_retry_after_storage_failure(self, now_ms: int, out: ReadyBuilder) -> None:
        """A stopped replica's backoff is over: take the state it held again (as a resent
        LeaderAndIsr would: a leader assigns its epoch again, a follower truncates first)."""
        at_ms = self._storage_retry_at_ms
        state = self._storage_retry_state
        if at_ms is None or state is None or now_ms < at_ms:
            return
        out.counters.append("storage_retries")
        out.notes.append(f"{self.topic}-{self.partition}: taking its role again after a "
                         f"failed write")
        self._apply_state(state, now_ms, out)  # the same state: the backoff is kept
        self._storage_retry_at_ms = self._storage_retry_state = None
        self._storage_retry_expansion = None

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

    # ================================================================== internals

    def _invalid(self, state: LeaderAndIsrState) -> str | None:
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

    def _plays(self, state: LeaderAndIsrState) -> bool:
        """Does this replica already play the part ``state`` gives it in its leader epoch?
        (Not after a StopReplica or a storage failure: then the part is taken anew.)"""
        if state.leader_epoch != self.leader_epoch:
            return False
        if state.leader == self.local_broker_id:
            return self.leader is not None
        if state.leader >= 0:
            return self.follower is not None and self.follower.leader_id == state.leader
        return self.role == Role.NONE

    def _record(self, state: LeaderAndIsrState) -> None:
        if state != self._storage_retry_state:
            # A new state from the controller: a retry pending for the old one is moot.
            self._storage_retry_at_ms = self._storage_retry_state = None
            self._storage_retry_expansion = None
            self._storage_retry_backoff_ms = STORAGE_RETRY_MS
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = state.replicas
        self.isr = state.isr

    def _become_leader(self, state: LeaderAndIsrState, now_ms: int, out: ReadyBuilder) -> None:
        log_end_offset = self.log.log_end_offset
        # The epoch is in the cache (fsynced) before anything is served in it: the shell
        # persists before it carries out the rest of this Ready.
        out.persist.append(AssignEpoch(state.leader_epoch, log_end_offset))
        # Held only for the state just recorded (``_record`` drops it for any other): this
        # leadership again after a failed write, its expansion never answered. The
        # controller may have committed it, so the joiner holds the HW (KIP-497's maximal
        # ISR) from the first HW on, and the proposal is sent again.
        resumed, self._storage_retry_expansion = self._storage_retry_expansion, None
        self.leader = self._new_leader_state(state, now_ms, pending_expansion=resumed)
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
        if self.leader.pending_isr is not None:
            self._maybe_send_alter(now_ms, out)

    def _new_leader_state(self, state: LeaderAndIsrState, now_ms: int, *,
                          pending_expansion: PendingIsrChange | None = None) -> LeadershipState:
        """The leader's view of one leadership, starting at the LEO with the HW this replica
        exposed until now."""
        log_end_offset = self.log.log_end_offset
        return LeadershipState(
            local_broker_id=self.local_broker_id, replicas=state.replicas, isr=state.isr,
            leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
            high_watermark=self.high_watermark, log_end_offset=log_end_offset,
            epoch_start_offset=log_end_offset, min_insync_replicas=self.min_insync_replicas,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms, now_ms=now_ms,
            pending_expansion=pending_expansion)

    def _end_leadership(self, code: int, out: ReadyBuilder) -> None:
        """Fail every acks=all and DeleteRecords wait of the leadership that ends (they may
        never commit, or the replicas' log starts never be known)."""
        if self.leader is not None:
            self._high_watermark_seen = self.leader.high_watermark
        for waiter_id in self._deadlines:
            out.completed.append((waiter_id, code))
        self._deadlines.clear()
        self._waits.clear()
        self._low_watermark_waits.clear()
        self.leader = None
        self._alter_for = None
        self._alter_in_flight = self._alter_waits_for_leader_and_isr = False

    def _on_isr_change(self, state: LeaderAndIsrState, now_ms: int, out: ReadyBuilder) -> None:
        """Same leader epoch, newer partition epoch: the controller changed the ISR, and
        maybe the replicas (a reassignment)."""
        leader = self.leader
        self._record(state)
        if leader is None:
            return
        old_isr = leader.isr
        out.high_watermark_moved = leader.on_leader_and_isr_update(
            state.isr, state.partition_epoch, now_ms, replicas=state.replicas)
        if leader.pending_isr is None:
            self._alter_for = None  # the controller's state superseded the proposal
            self._alter_in_flight = self._alter_waits_for_leader_and_isr = False
        self._note_isr_change(old_isr, out, by="the controller")
        self._complete_waits(out)
        self._maybe_send_alter(now_ms, out)
