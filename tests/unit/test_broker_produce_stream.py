"""BrokerServicer.ProduceStream driven with a fake stream context and a real ReplicaManager."""

from __future__ import annotations

import asyncio

import grpc

from tests.unit.test_broker_replica_manager import (
    TP,
    follower_fetch,
    lai,
    make_manager,
    produce,
    wait_until,
)
from tidewater.broker.servicers.grpc_server import BrokerServicer
from tidewater.proto import tidewater_pb2 as pb


class FakeStreamContext:
    """The read/write half of a grpc.aio servicer context."""

    def __init__(self):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.written: list[pb.ProduceResponse] = []

    async def read(self):
        return await self.inbox.get()

    async def write(self, response) -> None:
        await asyncio.sleep(0)  # a write suspends, as grpc.aio's does
        self.written.append(response)

    def invocation_metadata(self):
        return ()


def request(correlation_id: int, acks: int) -> pb.ProduceRequest:
    r = produce(acks=acks, timeout_ms=5000)
    r.correlation_id = correlation_id
    return r


async def started_stream(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    servicer = BrokerServicer(rm, rm.metadata_cache, rm.metrics, "INTERNAL")
    context = FakeStreamContext()
    handler = asyncio.create_task(servicer.ProduceStream(None, context))
    return rm, context, handler


async def test_half_close_sends_pending_acks_all_answers_then_ends(tmp_path):
    rm, context, handler = await started_stream(tmp_path)
    for r in (request(1, -1), request(2, 1), request(3, 0), request(4, -1)):
        context.inbox.put_nowait(r)
    context.inbox.put_nowait(grpc.aio.EOF)
    await wait_until(lambda: len(context.written) == 1)
    assert [r.correlation_id for r in context.written] == [2]  # acks=1 at once, acks=0 never
    assert not handler.done() and rm.partitions[TP].replica.waiting == 2
    await rm.fetch(follower_fetch(0))
    await rm.fetch(follower_fetch(4))  # the HW passes both acks=all appends
    await asyncio.wait_for(handler, 2)
    assert [r.correlation_id for r in context.written] == [2, 1, 4]
    assert [r.partitions[0].base_offset for r in context.written] == [1, 0, 3]
    assert all(r.partitions[0].error_code == pb.NONE for r in context.written)
    assert rm.acks_waits.pending() == 0


async def test_acks_all_answers_its_outcome_error(tmp_path):
    rm, context, handler = await started_stream(tmp_path)
    context.inbox.put_nowait(request(1, -1))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)
    # Leadership lost while waiting: NOT_LEADER_OR_FOLLOWER, not acknowledged.
    await rm.leader_and_isr(lai(leader=2, leader_epoch=1))
    await wait_until(lambda: len(context.written) == 1)
    answer = context.written[0].partitions[0]
    assert (answer.error_code, answer.base_offset) == (pb.NOT_LEADER_OR_FOLLOWER, -1)
    context.inbox.put_nowait(grpc.aio.EOF)
    await asyncio.wait_for(handler, 2)
    await rm.fetchers.shutdown()


async def test_client_cancel_withdraws_pending_waits(tmp_path):
    rm, context, handler = await started_stream(tmp_path)
    context.inbox.put_nowait(request(1, -1))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)
    handler.cancel()
    await asyncio.gather(handler, return_exceptions=True)
    assert handler.cancelled()
    assert rm.acks_waits.pending() == 0
    await rm.fetch(follower_fetch(0))
    await rm.fetch(follower_fetch(1))
    await asyncio.sleep(0.05)
    assert context.written == []
