"""The leader's produce path: the acks pre-check, the local append, the acks=all waits.

=====================================  =========================================================
event                                  decision
=====================================  =========================================================
``check_append(acks)``                 raises: not the leader; acks=all with the ISR below
                                       the minimum (nothing written)
``on_local_append(leo, waiter)``       HW (acks=all waits complete); the wait is bound to
                                       this leadership
``on_leader_append_failure``           the log dir failed under the append: no role
``on_wait_deadline(waiter)``           REQUEST_TIMED_OUT if it still waits and is due
``withdraw_wait(waiter)``              forgotten, answered never
=====================================  =========================================================

The minimum ISR is one rule everywhere: ``min(min.insync.replicas, replication
factor)`` gates the acks=all pre-check, the HW and NOT_ENOUGH_REPLICAS_AFTER_APPEND
(``LeadershipState.effective_min_insync_replicas``). A wait lives in the
leadership it was opened in: a LeaderAndIsr that ends it fails the wait
(``replica_control``), whatever happens to the records later.
"""

from __future__ import annotations

import heapq

from tidewater.broker.replication.ready import APPENDED, EMPTY, Ready, ReadyBuilder
from tidewater.broker.replication.replica_base import ReplicaBase
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    InvariantViolation,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)

# How long an acks=all request may wait for the HW at most, whatever it asks: 2 minutes
# (Kafka's producer gives up at delivery.timeout.ms, 120 s by default).
ACKS_ALL_WAIT_MS_MAX = 120_000


def acks_all_wait_ms(timeout_ms: int) -> int:
    """How long an acks=all wait asking for ``timeout_ms`` lasts: that, from 0 (due at
    once) to ``ACKS_ALL_WAIT_MS_MAX``. The shell arms its timer with this, and
    ``on_local_append`` sets the wait's deadline by it."""
    return min(max(timeout_ms, 0), ACKS_ALL_WAIT_MS_MAX)


class ProduceEvents(ReplicaBase):
    """The leader's produce path and acks=all waits (module docstring)."""

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
        (``acks_all_wait_ms(timeout_ms)``)."""
        leader = self.leader
        if leader is None:
            raise InvariantViolation(
                f"{self.topic}-{self.partition}: an append as leader while {self.role}")
        moved = leader.on_local_append(log_end_offset, now_ms)
        if waiter_id >= 0:
            self._deadlines[waiter_id] = now_ms + acks_all_wait_ms(timeout_ms)
            heapq.heappush(self._waits, [required_offset, waiter_id])
        elif not moved:
            return APPENDED
        out = ReadyBuilder()
        out.appended = True
        out.high_watermark_moved = moved
        self._complete_waits(out)
        return out.build()

    def on_leader_append_failure(self, now_ms: int) -> Ready:
        """The log could not take a produce's append (a storage error: the log dir failed;
        nothing of it is acknowledged): no role until the next LeaderAndIsr, and every
        acks=all wait of this leadership fails (NOT_LEADER_OR_FOLLOWER: clients refresh
        their metadata and retry with the next leader)."""
        if self.leader is None:
            return EMPTY
        return self._stop_on_storage_failure("appending as leader failed", now_ms)

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

    def _complete_waits(self, out: ReadyBuilder) -> None:
        """Answer every acks=all wait whose outcome the HW and ISR now decide."""
        waits = self._waits
        if not waits:
            return
        leader = self.leader
        if leader is None:
            raise InvariantViolation(f"{self.topic}-{self.partition}: acks=all waits outlived "
                                     f"their leadership (_end_leadership fails them)")
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
