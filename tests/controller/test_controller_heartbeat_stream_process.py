"""BrokerHeartbeats streams against the real controller process (fake brokers in the test).

The session timeout is far longer than every wait here, so only a stream's
end can explain a fence.
"""

import asyncio
import signal
import urllib.request

import grpc
import pytest
from controller_process import ControllerProcess, FakeBroker, eventually, free_port

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SESSION_MS = 120_000
WAIT_S = 20
assert WAIT_S * 1000 < SESSION_MS


class StreamHeartbeats:
    """Heartbeats for a FakeBroker (its own loop silenced) on one stream of its own channel."""

    def __init__(self, broker: FakeBroker, controller_address: str):
        broker.heartbeating = False
        self.broker = broker
        self.channel = grpc.aio.insecure_channel(controller_address)
        self.call = pb_grpc.ControllerStub(self.channel).BrokerHeartbeats()

    async def beat(self, *, want_shutdown=False, epoch=None) -> pb.BrokerHeartbeatResponse:
        await self.call.write(pb.BrokerHeartbeatRequest(
            broker_id=self.broker.broker_id,
            broker_epoch=self.broker.broker_epoch if epoch is None else epoch,
            want_shutdown=want_shutdown, control_token=self.broker.control_token))
        return await asyncio.wait_for(self.call.read(), 10)

    async def half_close(self) -> None:
        await self.call.done_writing()
        assert await asyncio.wait_for(self.call.read(), 10) is grpc.aio.EOF

    async def drop(self) -> None:
        """What a dying process does to its stream: the connection goes away."""
        await self.channel.close()


@pytest.fixture
async def setup(tmp_path):
    metrics_port = free_port()
    controller = ControllerProcess(tmp_path / "controller", [
        f"broker.session.timeout.ms={SESSION_MS}"], metrics_port=metrics_port).start()
    channel = grpc.aio.insecure_channel(controller.address)
    brokers = {}
    try:
        for broker_id in (1, 2, 3):
            brokers[broker_id] = await FakeBroker(broker_id, controller.address).start()
        yield controller, brokers, pb_grpc.ControllerStub(channel), metrics_port
    finally:
        for broker in brokers.values():
            await broker.stop()
        await channel.close()
        controller.stop()


async def describe(stub):
    return await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)


async def fenced_ids(stub):
    return {b.broker_id for b in (await describe(stub)).brokers if b.fenced}


async def leader_of(stub, topic):
    described = await describe(stub)
    return next(t for t in described.topics if t.name == topic).partitions[0].leader


async def create(stub, name):
    response = await stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name=name, num_partitions=1, replication_factor=3)], timeout_ms=5000), timeout=10)
    assert response.topics[0].error_code == pb.NONE


async def test_dropped_stream_fences_at_once_and_is_counted(setup):
    controller, brokers, stub, metrics_port = setup
    await create(stub, "t")
    victim = await leader_of(stub, "t")
    stream = StreamHeartbeats(brokers[victim], controller.address)
    assert (await stream.beat()).error_code == pb.NONE
    await stream.drop()

    await eventually(lambda: _contains(fenced_ids(stub), victim), timeout_s=WAIT_S)
    new_leader = await leader_of(stub, "t")
    assert new_leader not in (victim, -1)
    await eventually(lambda: brokers[new_leader].latest_states()[("t", 0)].leader == new_leader,
                     timeout_s=WAIT_S)
    text = await asyncio.to_thread(_scrape, metrics_port)
    assert 'tidewater_controller_brokers_fenced_total{reason="heartbeat_stream_closed"} 1.0' in text
    assert f"broker {victim} fenced: heartbeat stream closed" in controller.stderr()
    # a live broker whose stream broke (a blip) is back with its next heartbeat
    again = StreamHeartbeats(brokers[victim], controller.address)
    response = await again.beat()
    assert response.error_code == pb.NONE and not response.is_fenced
    assert victim not in await fenced_ids(stub)
    assert f"broker {victim} unfenced: heartbeating again" in controller.stderr()
    await again.drop()


async def test_stale_superseded_and_shut_down_streams_fence_nobody(setup):
    controller, brokers, stub, _ = setup
    await create(stub, "t")
    # an old incarnation's stream ends after the new process registered (which it may once
    # the old one finished its controlled shutdown)
    old = StreamHeartbeats(brokers[1], controller.address)
    assert (await old.beat(want_shutdown=True)).should_shutdown
    brokers[1].incarnation_id = "restarted"
    await brokers[1].register()
    fresh = StreamHeartbeats(brokers[1], controller.address)
    assert (await fresh.beat()).error_code == pb.NONE
    await old.drop()
    # a stream re-opened after a blip; the first one's end arrives late
    first = StreamHeartbeats(brokers[2], controller.address)
    assert (await first.beat()).error_code == pb.NONE
    second = StreamHeartbeats(brokers[2], controller.address)
    assert (await second.beat()).error_code == pb.NONE
    await first.drop()
    # a finished controlled shutdown, then the broker closes its stream
    leaving = StreamHeartbeats(brokers[3], controller.address)
    assert (await leaving.beat(want_shutdown=True)).should_shutdown
    await leaving.half_close()
    await leaving.drop()

    # a probe whose end is processed after the three above (the owner runs commands in order)
    probe = StreamHeartbeats(brokers[2], controller.address)
    assert (await probe.beat()).error_code == pb.NONE
    await probe.drop()
    await eventually(lambda: _contains(fenced_ids(stub), 2), timeout_s=WAIT_S)
    assert await fenced_ids(stub) == {2}
    assert (await fresh.beat()).error_code == pb.NONE  # broker 1 still on its live stream
    await fresh.drop()
    await second.drop()


async def test_controller_stop_ends_streams_without_fencing(setup):
    controller, brokers, stub, _ = setup
    streams = [StreamHeartbeats(b, controller.address) for b in brokers.values()]
    for s in streams:
        assert (await s.beat()).error_code == pb.NONE
    controller.signal(signal.SIGTERM)
    for s in streams:
        # ended cleanly by the stopping controller (not cut by its server's shutdown),
        # so no broker waits for an answer that never comes
        assert await asyncio.wait_for(s.call.read(), 10) is grpc.aio.EOF
        assert await s.call.code() == grpc.StatusCode.OK
    assert controller.wait(timeout_s=10) == 0
    # read before the restart: the restarted process appends to the same file, and its
    # own fence of the dropped `again` stream below is expected
    stopped_controller_log = controller.stderr()
    for s in streams:
        await s.drop()
    restarted = ControllerProcess(controller.data_dir, controller.settings,
                                  port=controller.port).start()
    try:
        assert not await fenced_ids(stub)  # nothing durable says "fenced"
        again = StreamHeartbeats(brokers[1], restarted.address)
        response = await again.beat()
        assert response.error_code == pb.NONE and not response.is_fenced
        assert response.controller_epoch == 2
        await again.drop()
    finally:
        restarted.stop()
    assert "heartbeat stream closed" not in stopped_controller_log


async def _contains(awaitable, item):
    return item in await awaitable


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
