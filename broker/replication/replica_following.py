"""The follower's cycle: truncate (KIP-101/279), then fetch and append (KIP-320).

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

=====================================  =========================================================
event                                  decision
=====================================  =========================================================
``follower_wants(now)``                truncating, fetching, or nothing (parked, backing off)
``fetch_position()``                   the next fetch's (LEO, last fetched epoch, log start)
``offset_for_leader_epoch_request()``  the next OffsetForLeaderEpoch's (current leader epoch,
                                       latest epoch of the own log)
``on_offset_for_leader_epoch_answer``  truncate (``follower_truncation``); done: fetch
``on_fetch_answer``                    append, or truncate (diverging epoch, the leader's log
                                       starting past ours), or back off / park;
                                       HW = min(leader HW, own LEO); the leader's log
                                       start (DeleteRecords) taken once it is at most
                                       our HW and LEO
=====================================  =========================================================

Where to truncate is ``follower.py``'s (``follower_truncation``); this module
decides when, and what the shell does with each answer.
"""

from __future__ import annotations

from tidewater.broker.replication.follower import (
    TruncationStep,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.replication.ready import (
    APPEND_FETCHED,
    EMPTY,
    AppendFetched,
    IncrementLogStartOffset,
    Persist,
    Ready,
    ReadyBuilder,
    Truncate,
    TruncateFully,
    describe_persist,
)
from tidewater.broker.replication.replica_base import (
    UNDEFINED,
    FollowerCycle,
    FollowerPhase,
    ReplicaBase,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

_APPEND_FETCHED = Ready(persist=(APPEND_FETCHED,))


class FollowingEvents(ReplicaBase):
    """The follower's truncate-then-fetch cycle (module docstring)."""

    def fetch_position(self) -> tuple[int, int, int]:
        """``(fetch_offset, last_fetched_epoch, log_start_offset)`` for this follower's next
        fetch."""
        log = self.log
        return log.log_end_offset, log.leader_epoch_cache.latest_epoch, log.log_start_offset

    def follower_wants(self, now_ms: int) -> str | None:
        """What this follower would send now: ``FollowerPhase.TRUNCATING`` (an
        OffsetForLeaderEpoch for ``log.leader_epoch_cache.latest_epoch``),
        ``FollowerPhase.FETCHING`` (a fetch at ``fetch_position()``), or None (not a
        follower, parked, or backing off)."""
        cycle = self.follower
        if cycle is None or cycle.parked or now_ms < cycle.retry_at_ms:
            return None
        return cycle.phase

    def offset_for_leader_epoch_request(self) -> tuple[int, int] | None:
        """``(current_leader_epoch, leader_epoch)`` of this follower's next
        OffsetForLeaderEpoch: the epoch it follows in (the leader fences by it, KIP-320)
        and the latest epoch of its own log (the leader answers where that epoch ends on
        its side, KIP-279); None when it follows nobody."""
        cycle = self.follower
        if cycle is None:
            return None
        return cycle.leader_epoch, self.log.leader_epoch_cache.latest_epoch

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
        if self.log.log_start_offset < leader_log_start_offset <= min(high_watermark,
                                                                       log_end_offset):
            # The leader's log start moved (DeleteRecords): follow it once we hold it.
            # It is at most the leader's HW and our LEO, so at most our HW (Kafka's
            # maybeIncrementLogStartOffset bound).
            return Ready(persist=(APPEND_FETCHED,
                                  IncrementLogStartOffset(leader_log_start_offset)))
        return _APPEND_FETCHED

    def _on_follower_persist_failure(self, op: Persist, now_ms: int, out: ReadyBuilder) -> None:
        """A follower's truncation or append failed (``on_persist_failure``'s table)."""
        cycle = self.follower
        if cycle is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: a follower's persist "
                                     f"failure while {self.role}")
        cycle.retry_at_ms = now_ms + self.options.fetch_backoff_ms
        if isinstance(op, AppendFetched | IncrementLogStartOffset):
            out.counters.append("follower_append_failures")
            return
        # Never fetch as if the cut happened: truncate again, from the log as it is.
        cycle.phase = FollowerPhase.TRUNCATING
        if isinstance(op, TruncateFully):
            # The HW taken from the leader's log start came with the cut that did not happen.
            self._high_watermark_seen = min(self._high_watermark_seen, self.log.log_start_offset)
        elif isinstance(op, Truncate) and op.below_corrupt_batch:
            self._on_corrupt_cut_failed(op.offset)
        out.counters.append("follower_truncation_failures")
        out.notes.append(f"{self.topic}-{self.partition}: {describe_persist(op)} failed; "
                         f"truncating again from LEO {self.log.log_end_offset} after the backoff")

    def _first_phase(self) -> str:
        """A follower of a new leader epoch truncates first (OffsetForLeaderEpoch)."""
        return FollowerPhase.TRUNCATING

    def _truncation_step(self, answer: tuple[int, int]) -> TruncationStep:
        return follower_truncation(answer, self.log.leader_epoch_cache, self.log.log_end_offset,
                                   self.high_watermark)

    def _diverging_step(self, diverging_epoch: tuple[int, int]) -> TruncationStep:
        return truncation_for_diverging_epoch(diverging_epoch, self.log.leader_epoch_cache,
                                              self.log.log_end_offset, self.high_watermark)

    def _truncate(self, offset: int, why: str, out: ReadyBuilder, *,
                  below_corrupt_batch: bool = False) -> None:
        log_end_offset = self.log.log_end_offset
        out.persist.append(Truncate(offset, below_corrupt_batch))
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
