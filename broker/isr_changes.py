"""ISR changes of the partitions this broker leads: shrink checks and AlterPartition.

The leader proposes (``LeaderPartitionState.maybe_shrink_isr`` or an
expansion decided on a follower fetch); this module carries the proposal to
the controller and applies only what the controller answers, with one sender
task per leadership and partition so at most one proposal is in flight. It
also re-checks each leader's HW on a timer: the HW may count a caught-up
follower outside the ISR for up to replica.lag.time.max.ms after its last
fetch, and when that follower is gone only the passing of time moves the HW.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from tidewater.broker.clock import mono_ms
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.partition import Partition
from tidewater.broker.replication import LeaderPartitionState
from tidewater.proto import tidewater_pb2 as pb

log = logging.getLogger("tidewater.broker.isr")

ALTER_PARTITION_RETRY_BACKOFF_S = 0.2
ALTER_PARTITION_RETRY_BACKOFF_MAX_S = 2.0


class IsrChanges:
    def __init__(self, *, alter_partition: Callable[[list[pb.AlterPartitionItem]],
                                                   Awaitable[pb.AlterPartitionResponse]],
                 metrics: BrokerMetrics, replica_lag_time_max_ms: int,
                 on_change: Callable[[Partition], None]):
        """``on_change(partition)`` runs after an ISR change (acks=all answers depend on it)."""
        self.alter_partition_rpc = alter_partition
        self.metrics = metrics
        self._replica_lag_time_max_ms = replica_lag_time_max_ms
        self._on_change = on_change
        self._tasks: set[asyncio.Task] = set()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def send(self, partition: Partition) -> None:
        """Make sure the leader's pending ISR proposal reaches the controller.

        One sender task per leadership and partition: a proposal made while
        another is in flight is sent by the same task after it.
        """
        leader = partition.leader_state
        if leader is None or leader.pending_isr is None:
            return
        running = partition.alter_partition_task
        if running is not None and not running.done() and partition.alter_partition_leader is leader:
            return
        task = asyncio.create_task(self._sender(partition, leader),
                                   name=f"alter-partition-{partition.tp}")
        partition.alter_partition_task = task
        partition.alter_partition_leader = leader
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sender(self, partition: Partition, leader: LeaderPartitionState) -> None:
        """Send pending proposals until none is left, honouring what each answer proves.

        - NONE: apply the committed state.
        - INVALID_UPDATE_VERSION: not applied; apply the controller's current
          state (it may contain an earlier proposal whose answer was lost).
        - transport error, timeout, request-level error: unknown whether it
          was applied, so resend the same proposal after a backoff (a
          duplicate is answered INVALID_UPDATE_VERSION with the state).
        - FENCED_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER: this leadership is
          ending; keep the proposal pending until LeaderAndIsr replaces it.
        - anything else (INELIGIBLE_REPLICA, INVALID_REQUEST, ...): certainly
          not applied; drop it, a later event proposes again.
        """
        backoff_s = ALTER_PARTITION_RETRY_BACKOFF_S
        while partition.leader_state is leader and leader.pending_isr is not None:
            proposal = leader.pending_isr
            item = pb.AlterPartitionItem(
                topic=partition.tp.topic, partition=partition.tp.partition,
                leader_epoch=leader.leader_epoch, partition_epoch=leader.partition_epoch,
                new_isr=list(proposal.proposed_isr))
            try:
                resp = await self.alter_partition_rpc([item])
                code = resp.error_code if resp.error_code != pb.NONE else (
                    resp.items[0].error_code if resp.items else pb.UNKNOWN_SERVER_ERROR)
                state = resp.items[0].state if resp.items else None
                unsure = resp.error_code != pb.NONE or not resp.items
            except Exception as e:  # noqa: BLE001 - the controller may be gone
                code, state, unsure = pb.REQUEST_TIMED_OUT, None, True
                log.info("AlterPartition %s ISR %s: no answer (%s), resending", partition.tp,
                         list(item.new_isr), type(e).__name__)
            if unsure:
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, ALTER_PARTITION_RETRY_BACKOFF_MAX_S)
                continue
            async with partition.lock:
                if partition.leader_state is not leader:
                    return  # the leadership ended meanwhile: the answer belongs to the past
                if code in (pb.FENCED_LEADER_EPOCH, pb.NOT_LEADER_OR_FOLLOWER):
                    log.info("AlterPartition %s answered %s: waiting for LeaderAndIsr",
                             partition.tp, pb.ErrorCode.Name(code))
                    return
                old_isr = leader.isr
                if state is not None and state.leader_epoch == leader.leader_epoch and code in (
                        pb.NONE, pb.INVALID_UPDATE_VERSION):
                    if code == pb.NONE and leader.pending_isr is proposal:
                        leader.on_alter_partition_committed(
                            tuple(state.isr), state.partition_epoch, mono_ms())
                    else:
                        leader.on_leader_and_isr_update(
                            tuple(state.isr), state.partition_epoch, mono_ms())
                    partition.partition_epoch = leader.partition_epoch
                    partition.isr = leader.isr
                if code != pb.NONE and leader.pending_isr is proposal:
                    leader.on_alter_partition_failed()  # certainly not applied (see above)
                if leader.isr != old_isr:
                    (self.metrics.isr_shrinks if len(leader.isr) < len(old_isr)
                     else self.metrics.isr_expands).inc()
                    log.info("ISR of %s is now %s (partition epoch %d)", partition.tp,
                             list(leader.isr), leader.partition_epoch)
                elif code != pb.NONE:
                    log.info("AlterPartition %s ISR %s refused: %s", partition.tp,
                             list(item.new_isr), pb.ErrorCode.Name(code))
                # acks=all answers depend on the ISR as well as on the HW.
                self._on_change(partition)
            if code != pb.NONE:
                await asyncio.sleep(backoff_s)

    async def run_maintenance(self, partitions: Callable[[], Iterable[Partition]]) -> None:
        """ISR shrink proposals, and the time-driven HW re-check.

        The HW counts a caught-up follower outside the ISR for up to
        replica.lag.time.max.ms after its last fetch; when that runs out
        without any append or fetch (the follower is gone) only the passing
        of time can move the HW, so it is re-evaluated here.
        """
        interval_s = min(self._replica_lag_time_max_ms / 4, 250) / 1000
        while True:
            await asyncio.sleep(interval_s)
            now = mono_ms()
            for partition in list(partitions()):
                leader = partition.leader_state
                if leader is None:
                    continue
                if leader.maybe_advance_high_watermark(now):
                    self._on_change(partition)
                proposal = leader.maybe_shrink_isr(now)
                if proposal is not None:
                    log.info("proposing ISR shrink of %s to %s", partition.tp, list(proposal))
                    self.send(partition)
