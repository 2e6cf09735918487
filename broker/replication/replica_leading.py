"""The leader's side of replication: follower fetches, OffsetForLeaderEpoch and consumer
fetch checks, AlterPartition proposals and answers, ticks.

=====================================  =========================================================
event                                  decision
=====================================  =========================================================
``on_follower_fetch(...)``             fencing, divergence (KIP-320), range; the follower's
                                       progress moves the HW and may propose an ISR expansion
``answer_offset_for_leader_epoch``     ``end_offset_for(epoch, LEO)`` (KIP-279), even (-1, -1)
``check_consumer_fetch(...)``          fencing, range; the HW to read below
``check_list_offsets(...)``            fencing; the end of what the asker sees (a consumer:
                                       the HW; a replica: the LEO)
``check_delete_records(offset)``       leader only; the new log start (-1: the HW), at most
                                       the HW (OFFSET_OUT_OF_RANGE beyond)
``watch_low_watermark(offset, ...)``   a DeleteRecords answer waits until the leader's and
                                       every ISR follower's log start (from its fetches)
                                       reached it; leadership end, deadline: the error
``on_alter_partition_answer/unsure``   apply what the answer proves (below)
``tick(now)``                          time-driven HW, ISR shrink, AlterPartition resends,
                                       acks=all deadlines (and the corruption reaction's
                                       retries)
=====================================  =========================================================

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
"""

from __future__ import annotations

import heapq

from tidewater.broker.replication.follower import check_diverging
from tidewater.broker.replication.ready import (
    EMPTY,
    AlterPartitionRequest,
    Ready,
    ReadyBuilder,
)
from tidewater.broker.replication.replica_base import (
    ALTER_PARTITION_BACKOFF_MS,
    ALTER_PARTITION_BACKOFF_MS_MAX,
    UNDEFINED,
    LeaderAndIsrState,
    ReplicaBase,
)
from tidewater.broker.replication.replica_produce import acks_all_wait_ms
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation, OffsetOutOfRangeError

_WAIT_FOR_LEADER_AND_ISR = frozenset({pb.FENCED_LEADER_EPOCH, pb.NOT_LEADER_OR_FOLLOWER,
                                      pb.STALE_BROKER_EPOCH})


class LeadingEvents(ReplicaBase):
    """The leader's side of replication (module docstring)."""

    # ================================================================== fetches

    def on_follower_fetch(self, replica_id: int, current_leader_epoch: int, fetch_offset: int,
                          last_fetched_epoch: int, now_ms: int, *, isr_eligible: bool = True,
                          record: bool = True, broker_epoch: int = -1,
                          log_start_offset: int = UNDEFINED
                          ) -> tuple[tuple[int, int] | None, Ready]:
        """A follower's fetch of this partition: ``(diverging_epoch, ready)``.

        Raises the typed error to answer (fencing, out of range). ``diverging_epoch`` not
        None: answer it and no records (KIP-320). Else serve records from
        ``fetch_offset``. ``record`` False (a long-poll's later passes) checks without
        counting the fetch again. ``isr_eligible`` False (KIP-903: not the live
        incarnation of that broker) still serves but never adds it to the ISR; the
        fetch's ``broker_epoch`` goes with an expansion it leads to, and the controller
        admits the joiner only with its registered epoch. ``log_start_offset``: the
        follower's, which may complete DeleteRecords waits (``watch_low_watermark``).
        """
        self.check_epoch(current_leader_epoch, require_leader=True)
        leader = self.leader
        if leader is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: check_epoch let a "
                                     f"follower fetch reach a replica that does not lead")
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
        start_moved = (leader.on_follower_log_start(replica_id, log_start_offset)
                       and bool(self._low_watermark_waits))
        if (not decision.high_watermark_changed and decision.propose_isr is None
                and not start_moved):
            return None, EMPTY
        out = ReadyBuilder()
        out.high_watermark_moved = decision.high_watermark_changed
        self._complete_waits(out)
        self._complete_low_watermark_waits(out)
        self._maybe_send_alter(now_ms, out)
        return None, out.build()

    def on_follower_fetch_at_end(self, replica_id: int, current_leader_epoch: int,
                                 fetch_offset: int, last_fetched_epoch: int, now_ms: int, *,
                                 broker_epoch: int, log_start_offset: int) -> bool:
        """``on_follower_fetch`` of an ISR follower at the log end while the HW is there
        too, where that fetch would only tell that the follower is still caught up now:
        True when that is the case (and it is recorded), False when not (serve it with
        ``on_follower_fetch``). The leader's fetch path asks it for the partitions a
        fetch session's request did not name: most of them idle, every round."""
        leader = self.leader
        if leader is None or current_leader_epoch != self.leader_epoch:
            return False
        log = self.log
        log_end_offset = log.log_end_offset
        if fetch_offset != log_end_offset or not log.log_start_offset <= fetch_offset:
            return False
        if check_diverging(last_fetched_epoch, fetch_offset, log.leader_epoch_cache,
                           log_end_offset) is not None:
            return False
        return leader.on_follower_fetch_at_end(replica_id, fetch_offset, now_ms, broker_epoch,
                                               log_start_offset)

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
        if self.leader is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: check_epoch let a "
                                     f"consumer fetch reach a replica that does not lead")
        return self.leader.high_watermark

    def check_list_offsets(self, current_leader_epoch: int, *, consumer: bool) -> int:
        """A ListOffsets asker: raises the typed error (fencing; a consumer asks the leader
        only); returns the end of what it may see: no offset at or above it exists for it.
        A consumer sees below the HW (LATEST is the HW; a record found by timestamp at or
        above it is not there yet); a replica sees the whole log (LATEST is the LEO)."""
        self.check_epoch(current_leader_epoch, require_leader=consumer)
        return self.high_watermark if consumer else self.log.log_end_offset

    def check_delete_records(self, offset: int) -> int:
        """DeleteRecords on this leader (Kafka's ``deleteRecordsOnLeader`` and
        ``maybeIncrementLogStartOffset``): raises the typed error (not the leader;
        OFFSET_OUT_OF_RANGE below 0 or past the HW); returns the new log start offset
        (-1 asks for the HW). The records below it stay committed on every replica: a
        follower takes the leader's log start from its fetch answers."""
        self.check_epoch(UNDEFINED, require_leader=True)
        high_watermark = self.high_watermark
        target = high_watermark if offset == UNDEFINED else offset
        if not 0 <= target <= high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot delete records of {self.topic}-{self.partition} before {offset}: "
                f"the high watermark is {high_watermark}")
        return max(target, self.log.log_start_offset)

    @property
    def low_watermark(self) -> int:
        """The leader's and its ISR followers' smallest log start offset (-1 unknown, or
        not the leader)."""
        leader = self.leader
        return UNDEFINED if leader is None else leader.low_watermark(self.log.log_start_offset)

    def watch_low_watermark(self, required_offset: int, now_ms: int, *, waiter_id: int,
                            timeout_ms: int) -> Ready:
        """DeleteRecords moved this leader's log start to ``required_offset``: the answer
        waits (Kafka's DelayedDeleteRecords) until every ISR member's log start reached
        it (NONE), the leadership ends (NOT_LEADER_OR_FOLLOWER) or the deadline passes
        (REQUEST_TIMED_OUT). Followers' long-polls wake to carry the new start."""
        if self.leader is None:
            return Ready(completed=((waiter_id, pb.NOT_LEADER_OR_FOLLOWER),))
        self._deadlines[waiter_id] = now_ms + acks_all_wait_ms(timeout_ms)
        heapq.heappush(self._low_watermark_waits, [required_offset, waiter_id])
        out = ReadyBuilder()
        out.appended = True  # wake the followers' parked fetches: their answers carry it
        self._complete_low_watermark_waits(out)
        return out.build()

    def _complete_low_watermark_waits(self, out: ReadyBuilder) -> None:
        waits = self._low_watermark_waits
        if not waits:
            return
        low = self.low_watermark
        deadlines = self._deadlines
        while waits:
            required_offset, waiter_id = waits[0]
            if waiter_id not in deadlines:
                heapq.heappop(waits)  # timed out or withdrawn
                continue
            if low < required_offset:
                break
            heapq.heappop(waits)
            del deadlines[waiter_id]
            out.completed.append((waiter_id, pb.NONE))

    # ================================================================== AlterPartition

    def on_alter_partition_answer(self, alter_id: int, error: int, state: LeaderAndIsrState | None,
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
                moved = leader.on_leader_and_isr_update(state.isr, state.partition_epoch, now_ms,
                                                        replicas=state.replicas)
            self.partition_epoch = leader.partition_epoch
            self.isr = leader.isr
            self.replicas = leader.replicas
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

    def _note_isr_change(self, old_isr: tuple[int, ...], out: ReadyBuilder,
                         by: str = "AlterPartition") -> None:
        if self.leader is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: an ISR change noted "
                                     f"while {self.role}: only a leader's ISR changes")
        isr = self.leader.isr
        if isr == old_isr:
            return
        out.counters.append("isr_shrinks" if len(isr) < len(old_isr) else "isr_expands")
        out.notes.append(f"ISR of {self.topic}-{self.partition} is now {list(isr)} (partition "
                         f"epoch {self.leader.partition_epoch}, {by})")

    def _maybe_send_alter(self, now_ms: int, out: ReadyBuilder) -> None:
        """Carry the leader's pending ISR proposal to the controller, one at a time."""
        if self.leader is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: an AlterPartition to "
                                     f"send while {self.role}: only a leader proposes")
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

    # ================================================================== time

    def tick(self, now_ms: int) -> Ready:
        """Time passed: the HW (a joiner stopped being caught up), ISR shrink proposals,
        AlterPartition resends, acks=all deadlines; a corrupt replica's report and cut.

        The shell ticks every replica; which ones have something to do is decided here.
        A follower, or a replica with no role, no corrupt batch and no retry after a failed
        write, returns ``EMPTY`` after three attribute reads (the shell's carrier returns on ``EMPTY`` at once), so
        ticking thousands of followers stays cheap."""
        leader = self.leader
        if leader is None:
            if self.corrupt_from is None and self._storage_retry_at_ms is None:
                return EMPTY
            out = ReadyBuilder()
            self._maybe_retry_after_storage_failure(now_ms, out)
            if self.corrupt_from is not None:
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
