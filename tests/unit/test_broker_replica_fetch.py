"""ReplicaFetch over real gRPC: the stream, a changed assignment set cutting a long-poll short
(by cancelling the stream), and a leader without the stream (parked with a clear error)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from tests.unit.test_broker_fetcher import seeded_log, wait_until
from tests.unit.test_broker_replica_manager import TP, lai, make_manager, produce, serve
from tidewater.broker.servicers.grpc_server import BrokerControlServicer, BrokerServicer
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


class _CountingClientServicer(BrokerServicer):
    def __init__(self, rm, calls):
        super().__init__(rm, rm.metadata_cache, rm.metrics, "INTERNAL")
        self.calls = calls

    async def Fetch(self, request, context):
        self.calls["Fetch"] += 1
        return await super().Fetch(request, context)


class CountingServicer(BrokerControlServicer):
    """The real servicers, counting which fetch RPC the follower used."""

    def __init__(self, rm):
        super().__init__(rm, rm.metrics)
        self.calls = {"Fetch": 0, "ReplicaFetch": 0}
        self.client = _CountingClientServicer(rm, self.calls)

    async def ReplicaFetch(self, request_iterator, context):
        self.calls["ReplicaFetch"] += 1
        return await super().ReplicaFetch(request_iterator, context)


class StreamlessServicer(CountingServicer):
    """A server without ReplicaFetch (not a broker of this release): the generated base
    answers UNIMPLEMENTED."""

    ReplicaFetch = pb_grpc.BrokerControlServicer.ReplicaFetch


async def start_leader(rm, servicer):
    server, port = await serve(rm, servicer.client, servicer)
    await rm.leader_and_isr(lai(leader=1, leader_epoch=0, isr=(1,)))
    return server, port


def follow(port: int, leader_epoch: int = 0) -> pb.LeaderAndIsrRequest:
    request = lai(leader=1, leader_epoch=leader_epoch, isr=(1,))
    request.leaders[0].broker_id, request.leaders[0].port = 1, port
    return request


def make_follower(tmp_path, **settings):
    rm, _ = make_manager(tmp_path, broker_id=2, **settings)
    rm.log_manager._logs[TP] = seeded_log([])
    return rm


async def test_follower_replicates_over_one_stream(tmp_path):
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = seeded_log([(0, 4)])
    servicer = CountingServicer(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    follower_rm = make_follower(tmp_path / "f")
    try:
        assert (await follower_rm.leader_and_isr(follow(port))).partitions[0].error_code == pb.NONE
        follower_log = follower_rm.log_manager.get(TP)
        await wait_until(lambda: follower_log.log_end_offset == 4)
        assert servicer.calls == {"Fetch": 0, "ReplicaFetch": 1}  # one long-lived stream
        # Later appends reach the follower the same way.
        assert (await leader_rm.produce(produce(acks=1))).partitions[0].error_code == pb.NONE
        await wait_until(lambda: follower_log.log_end_offset == 5)
        assert follower_log.log_end_offset == 5
        assert servicer.calls == {"Fetch": 0, "ReplicaFetch": 1}
    finally:
        await follower_rm.stop()
        await server.stop(0)


async def test_leader_without_the_stream_parks_the_partition_with_a_clear_error(tmp_path, caplog):
    # No other way to fetch is tried: the typed error is logged at ERROR and the partition
    # waits for the next LeaderAndIsr, which tries the stream again.
    caplog.set_level(logging.INFO, logger="tidewater.broker.following.fetcher")
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = seeded_log([(0, 4)])
    servicer = StreamlessServicer(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    follower_rm = make_follower(tmp_path / "f")
    try:
        assert (await follower_rm.leader_and_isr(follow(port))).partitions[0].error_code == pb.NONE
        await wait_until(lambda: follower_rm.partitions[TP].replica.follower.parked)

        def errors():
            return [r.getMessage() for r in caplog.records
                    if r.name == "tidewater.broker.following.fetcher" and r.levelno == logging.ERROR]

        assert len(errors()) == 1
        assert "UNSUPPORTED_VERSION" in errors()[0]
        assert "does not implement ReplicaFetch" in errors()[0]
        assert servicer.calls["Fetch"] == 0  # no unary Fetch instead
        assert follower_rm.log_manager.get(TP).log_end_offset == 0
        # The same state again (a controller resync) unparks it: one more try, parked again.
        await follower_rm.leader_and_isr(follow(port))
        await wait_until(lambda: len(errors()) == 2 and follower_rm.partitions[TP].replica.follower.parked)
        assert servicer.calls["Fetch"] == 0
    finally:
        await follower_rm.stop()
        await server.stop(0)


def for_partition(request: pb.LeaderAndIsrRequest, tp: TopicPartition) -> pb.LeaderAndIsrRequest:
    request.partitions[0].state.topic, request.partitions[0].state.partition = tp
    return request


async def test_new_partition_cuts_the_pending_long_poll_short(tmp_path):
    # The follower long-polls TP for up to 60 s. A second partition assigned meanwhile must
    # not wait for it: the follower cancels the stream (the leader drops the long-poll) and
    # opens another whose first request covers both partitions.
    tp2 = TopicPartition("orders", 1)
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = seeded_log([(0, 2)])
    servicer = CountingServicer(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    await leader_rm.leader_and_isr(for_partition(lai(leader=1, leader_epoch=0, isr=(1,)), tp2))
    assert (await leader_rm.produce(produce(acks=1, topic=tp2.topic, partition=1))
            ).partitions[0].error_code == pb.NONE
    follower_rm = make_follower(tmp_path / "f", **{"replica.fetch.wait.max.ms": "60000"})
    try:
        await follower_rm.leader_and_isr(follow(port))
        follower_log = follower_rm.log_manager.get(TP)
        await wait_until(lambda: follower_log.log_end_offset == 2)
        await wait_until(lambda: leader_rm.fetch_waiters.waiting() == 1)  # parked long-poll
        assert leader_rm.fetch_waiters.waiting() == 1
        await follower_rm.leader_and_isr(for_partition(follow(port), tp2))
        await wait_until(lambda: tp2 in follower_rm.partitions
                         and follower_rm.partitions[tp2].log_end_offset == 1, timeout_s=20)
        assert follower_rm.partitions[tp2].log_end_offset == 1
        assert servicer.calls == {"Fetch": 0, "ReplicaFetch": 2}
        # The new stream's next fetch parks once the answer with tp2's record is read (not
        # at once: a CI run asserted before it had); the old one's is gone.
        await wait_until(lambda: leader_rm.fetch_waiters.waiting() == 1)
        assert servicer.calls == {"Fetch": 0, "ReplicaFetch": 2}
    finally:
        await follower_rm.stop()
        await server.stop(0)


async def test_stream_answers_each_request_once_in_order(tmp_path):
    rm, _ = make_manager(tmp_path)
    rm.log_manager._logs[TP] = seeded_log([(0, 3)])
    server, port = await start_leader(rm, CountingServicer(rm))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = pb_grpc.BrokerControlStub(channel).ReplicaFetch()

        def request(offset, max_wait_ms):
            r = pb.FetchRequest(replica_id=2, replica_broker_epoch=7, max_wait_ms=max_wait_ms,
                                min_bytes=1, max_bytes=1 << 20)
            r.partitions.add(topic=TP.topic, partition=0, current_leader_epoch=0,
                             fetch_offset=offset, last_fetched_epoch=0, partition_max_bytes=1 << 20)
            return r

        await call.write(request(0, 0))
        first = await call.read()
        assert first.partitions[0].records and first.partitions[0].log_end_offset == 3
        await call.write(request(3, 60_000))  # at the LEO: long-polls until the next append
        await wait_until(lambda: rm.fetch_waiters.waiting() == 1)
        assert (await rm.produce(produce(acks=1))).partitions[0].error_code == pb.NONE
        second = await asyncio.wait_for(call.read(), 20)
        assert second.partitions[0].records and second.partitions[0].log_end_offset == 4
        # A fenced epoch is answered per partition, and the stream goes on.
        await rm.leader_and_isr(lai(leader=1, leader_epoch=1, isr=(1,)))
        await call.write(request(4, 0))  # still in epoch 0
        third = await asyncio.wait_for(call.read(), 20)
        assert third.partitions[0].error_code == pb.FENCED_LEADER_EPOCH
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        # Cancelling a stream drops the leader's pending long-poll.
        call = pb_grpc.BrokerControlStub(channel).ReplicaFetch()
        waiting = request(4, 60_000)
        waiting.partitions[0].current_leader_epoch = 1
        waiting.partitions[0].last_fetched_epoch = 1
        await call.write(waiting)
        await wait_until(lambda: rm.fetch_waiters.waiting() == 1)
        assert rm.fetch_waiters.waiting() == 1
        call.cancel()
        await wait_until(lambda: rm.fetch_waiters.waiting() == 0)
        assert rm.fetch_waiters.waiting() == 0
    finally:
        await channel.close()
        await rm.stop()
        await server.stop(0)


async def test_shutdown_ends_replica_streams_and_long_polls(tmp_path):
    # A stream never ends by itself: without this a server's stop() would wait out its grace.
    rm, _ = make_manager(tmp_path)
    rm.log_manager._logs[TP] = seeded_log([(0, 1)])
    server, port = await start_leader(rm, CountingServicer(rm))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb_grpc.BrokerStub(channel)
        call = pb_grpc.BrokerControlStub(channel).ReplicaFetch()
        request = pb.FetchRequest(replica_id=2, replica_broker_epoch=7, max_wait_ms=60_000,
                                  min_bytes=1, max_bytes=1 << 20)
        request.partitions.add(topic=TP.topic, partition=0, current_leader_epoch=0,
                               fetch_offset=1, last_fetched_epoch=0, partition_max_bytes=1 << 20)
        await call.write(request)
        consumer = asyncio.ensure_future(stub.Fetch(pb.FetchRequest(
            replica_id=-1, max_wait_ms=60_000, min_bytes=1, partitions=[pb.FetchPartition(
                topic=TP.topic, partition=0, current_leader_epoch=-1, fetch_offset=1)])))
        await wait_until(lambda: rm.fetch_waiters.waiting() == 2)
        assert rm.fetch_waiters.waiting() == 2
        rm.answer_long_polls()
        answer = await asyncio.wait_for(call.read(), 20)  # the pending request, answered empty
        assert answer.partitions[0].error_code == pb.NONE and not answer.partitions[0].records
        assert await asyncio.wait_for(call.read(), 20) is grpc.aio.EOF  # then the stream ends
        consumed = await asyncio.wait_for(consumer, 20)
        assert consumed.partitions[0].error_code == pb.NONE
        assert rm.fetch_waiters.waiting() == 0
    finally:
        await channel.close()
        await rm.stop()
        await server.stop(0)
