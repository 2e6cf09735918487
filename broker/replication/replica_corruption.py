"""A corrupt batch in this replica's log: out of the ISR first, then cut and fetched again.

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

=====================================  =========================================================
event                                  decision
=====================================  =========================================================
``on_corrupt_batch(offset)``           remember it; react (above)
``on_corrupt_report_answer/unsure``    out of the ISR (its committed state applied), refused
                                       (no healthy member: ask again later), or resent
=====================================  =========================================================
"""

from __future__ import annotations

from tidewater.broker.replication.ready import EMPTY, CorruptReport, Ready, ReadyBuilder
from tidewater.broker.replication.replica_base import (
    ALTER_PARTITION_BACKOFF_MS,
    LeaderAndIsrState,
    ReplicaBase,
)
from tidewater.proto import tidewater_pb2 as pb

# A corrupt replica that no healthy ISR member can take over asks again this often.
CORRUPT_REPORT_RETRY_MS = 5_000


class CorruptionEvents(ReplicaBase):
    """The corruption handover (module docstring)."""

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

    def on_corrupt_report_answer(self, report_id: int, error: int, state: LeaderAndIsrState | None,
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

    def _on_corrupt_cut_failed(self, offset: int) -> None:
        """The cut below the corrupt batch at ``offset`` did not happen: it is owed again."""
        if self.corrupt_from is None or offset < self.corrupt_from:
            self.corrupt_from = offset

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
            if now_ms < self.follower.retry_at_ms:
                return  # a failed cut (or fetch) backs off first
            self._truncate(offset, "below the corrupt batch", out, below_corrupt_batch=True)
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
