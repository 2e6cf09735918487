"""Carries the replication core's requests to the controller: AlterPartition, ReportCorruptReplica.

``ReplicaState`` decides when to propose an ISR change, keeps at most one in
flight, and decides what each answer proves (module docstring of
``broker/replication/replica.py``). This sender only does the I/O: the
``AlterPartitionRequest``s the core emits in one turn of the event loop go in one
AlterPartition (a supervised task; at most ``ALTER_PARTITION_ITEMS_MAX`` items),
and each partition's answer goes back to its core (``on_alter_partition_answer``),
or the report that there was none it can trust (``on_alter_partition_unsure``: a
transport error, a timeout, a request-level error), then its ``Ready`` is carried
out. One request for many partitions, as Kafka's AlterPartitionManager batches:
after a broker returns, hundreds of partitions propose to expand their ISR at once,
and one request each made as many controller commands, each waiting for its own
quorum commit in the controller's single queue, with the brokers' heartbeats queued
behind them (at 1,000 partitions long enough to fence the brokers again). A corrupt replica's report (``CorruptReport``) travels the
same way (``ReportCorruptReplica``; ``on_corrupt_report_answer`` / ``..._unsure``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tidewater.broker.clock import mono_ms
from tidewater.broker.replicas.control import partition_state
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.ready import AlterPartitionRequest, CorruptReport, Ready
from tidewater.broker.replication.replica import LeaderAndIsrState
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.isr")
# Items of one AlterPartition at most (the controller takes up to 10,000).
ALTER_PARTITION_ITEMS_MAX = 1000

AlterPartitionRpc = Callable[[list[pb.AlterPartitionItem]], Awaitable[pb.AlterPartitionResponse]]
CorruptReportRpc = Callable[[list[pb.CorruptReplica]],
                            Awaitable[pb.ReportCorruptReplicaResponse]]
# The controller's answers that ``_round_trip`` hands to the core, and one item of each.
_Response = TypeVar("_Response", pb.AlterPartitionResponse, pb.ReportCorruptReplicaResponse)
_Result = pb.AlterPartitionResult | pb.CorruptReplicaResult


def alter_partition_item(partition: Partition, request: AlterPartitionRequest
                         ) -> pb.AlterPartitionItem:
    """The core's ISR proposal as the controller's AlterPartition takes it."""
    return pb.AlterPartitionItem(
        topic=partition.tp.topic, partition=partition.tp.partition,
        leader_epoch=request.leader_epoch, partition_epoch=request.partition_epoch,
        new_isr=list(request.new_isr), new_isr_broker_epochs=list(request.broker_epochs))


def corrupt_replica_item(partition: Partition, report: CorruptReport) -> pb.CorruptReplica:
    return pb.CorruptReplica(topic=partition.tp.topic, partition=partition.tp.partition,
                             leader_epoch=report.leader_epoch,
                             partition_epoch=report.partition_epoch,
                             corrupt_offset=report.corrupt_offset)


def answer_to_core(results: Sequence[Any], on_answer: Callable[..., Ready],
                   on_unsure: Callable[[int], Ready], now_ms: int) -> Ready:
    """What came back from the controller, for the core: ``on_answer(error, state, now_ms)``
    with the first result, or ``on_unsure(now_ms)`` when there is none to trust (a
    transport error or timeout, a request-level error, no result: ``results`` empty).
    The broker's sender and the simulation's broker both answer the core through here."""
    if not results:
        return on_unsure(now_ms)
    answer = results[0]
    state = partition_state(answer.state) if answer.HasField("state") else None
    return on_answer(answer.error_code, state, now_ms)


async def _no_controller(replicas: list[pb.CorruptReplica]) -> pb.ReportCorruptReplicaResponse:
    raise ConnectionError("no controller to report to")


class AlterPartitionSender:
    def __init__(self, *, rpc: AlterPartitionRpc, carrier: ReadyCarrier,
                 supervisor: TaskSupervisor, report_rpc: CorruptReportRpc = _no_controller):
        self._rpc = rpc
        self._report_rpc = report_rpc
        self._carrier = carrier
        self._supervisor = supervisor
        # Proposals made since the last request left: (partition, request), in order.
        self._pending: list[tuple[Partition, AlterPartitionRequest]] = []

    def send(self, partition: Partition, request: AlterPartitionRequest) -> None:
        log.info("proposing ISR %s for %s (partition epoch %d)", list(request.new_isr),
                 partition.tp, request.partition_epoch)
        self._pending.append((partition, request))
        if len(self._pending) == 1:  # the first of this turn: one task sends them all
            self._supervisor.spawn(self._send_pending(), name="alter-partition")

    async def _send_pending(self) -> None:
        await asyncio.sleep(0)  # the proposals of this turn of the loop join the request
        batch = self._pending[:ALTER_PARTITION_ITEMS_MAX]
        del self._pending[:ALTER_PARTITION_ITEMS_MAX]
        if self._pending:  # the rest in the next request, by another task
            self._supervisor.spawn(self._send_pending(), name="alter-partition")
        await self._send_batch(batch)

    async def _send_batch(self, batch: list[tuple[Partition, AlterPartitionRequest]]) -> None:
        items = [alter_partition_item(partition, request) for partition, request in batch]
        try:
            response: pb.AlterPartitionResponse | None = await self._rpc(items)
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # the controller may be gone: not an answer
            log.info("AlterPartition of %d partition(s): no answer (%s)", len(batch),
                     type(e).__name__)
            response = None
        results: Sequence[pb.AlterPartitionResult] = ()
        if response is not None and response.error_code == pb.NONE:
            if len(response.items) == len(batch):  # one per item, in order
                results = response.items
            else:
                log.warning("AlterPartition answered %d results for %d items: treated as "
                            "no answer", len(response.items), len(batch))
        now_ms = mono_ms()
        for i, (partition, request) in enumerate(batch):
            replica = partition.replica
            mine = results[i:i + 1]
            if mine:
                log.info("AlterPartition %s answered %s", partition.tp,
                         pb.ErrorCode.Name(mine[0].error_code))
            self._carrier.apply(partition, answer_to_core(
                mine, functools.partial(replica.on_alter_partition_answer, request.alter_id),
                functools.partial(replica.on_alter_partition_unsure, request.alter_id),
                now_ms))

    def report_corrupt(self, partition: Partition, report: CorruptReport) -> None:
        self._supervisor.spawn(self._report(partition, report),
                               name=f"report-corrupt-{partition.tp}-{report.report_id}")

    async def _report(self, partition: Partition, report: CorruptReport) -> None:
        item = corrupt_replica_item(partition, report)
        log.warning("reporting %s corrupt from offset %d to the controller", partition.tp,
                    report.corrupt_offset)
        replica = partition.replica
        await self._round_trip(
            partition, "ReportCorruptReplica", lambda: self._report_rpc([item]),
            lambda response: response.results,
            functools.partial(replica.on_corrupt_report_answer, report.report_id),
            functools.partial(replica.on_corrupt_report_unsure, report.report_id))

    async def _round_trip(self, partition: Partition, rpc_name: str,
                          call: Callable[[], Awaitable[_Response]],
                          results_of: Callable[[_Response], Sequence[_Result]],
                          on_answer: Callable[[int, LeaderAndIsrState | None, int], Ready],
                          on_unsure: Callable[[int], Ready]) -> None:
        """One request to the controller, what came back handed to the core
        (``answer_to_core``), then the core's Ready carried out."""
        try:
            response = await call()
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # the controller may be gone: not an answer
            log.info("%s %s: no answer (%s)", rpc_name, partition.tp, type(e).__name__)
            response = None
        results = (results_of(response) if response is not None
                   and response.error_code == pb.NONE else ())
        if results:
            log.info("%s %s answered %s", rpc_name, partition.tp,
                     pb.ErrorCode.Name(results[0].error_code))
        self._carrier.apply(partition, answer_to_core(results, on_answer, on_unsure, mono_ms()))
