"""``max.connections`` and ``connections.max.idle.ms`` on a real controller process's gRPC
port and on its Raft port (``broker.servicers.grpc_limits``, ``controller.config``):

- controller port, max.connections=5: a broker's heartbeat stream, opened first, is
  answered throughout; of 12 more connections at most 4 are served (the stream's is
  the fifth); once they closed a new one is served. (The cap holds at each moment: with
  a short idle time, served connections closed for idleness free their places, so
  that is a process of its own.)
- controller port, connections.max.idle.ms=2000: the heartbeat stream outlives the
  idle time (a call open is not idle), while a connection with no call open is sent
  GOAWAY (its channel falls back to IDLE).
- Raft port of a one-voter quorum, max.connections=5: a connection opened first keeps
  being answered; of 12 more at most 4 are served; once they closed a new one is.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
import pytest
from controller_process import ControllerProcess, eventually, free_port

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.tools.local_cluster import format_new_quorum

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONNECTIONS_MAX = 5
CONNECTIONS_TRIED = 12
IDLE_MS = 2_000
# Each channel its own TCP connection: grpc shares one between channels of equal
# arguments unless each keeps its own subchannel pool.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def own_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=OWN_CONNECTION)


async def served_of(channels: list[grpc.aio.Channel], timeout_s: float = 10
                    ) -> list[grpc.aio.Channel]:
    """The channels whose connection got through within ``timeout_s``."""
    async def ready(channel: grpc.aio.Channel) -> bool:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout_s)
        except TimeoutError:
            return False
        return True
    results = await asyncio.gather(*(ready(ch) for ch in channels))
    return [ch for ch, ok in zip(channels, results, strict=True) if ok]


async def answers(call: Callable[[], Awaitable[object]]) -> bool:
    try:
        await call()
    except grpc.aio.AioRpcError:
        return False
    return True


class HeartbeatStream:
    """A broker's session: registered, then heartbeats every 200 ms on one stream that
    must never fail (an error ends the task and the test sees it)."""

    def __init__(self, address: str) -> None:
        self.channel = own_channel(address)
        self.stub = pb_grpc.ControllerStub(self.channel)
        self.responses: list[pb.BrokerHeartbeatResponse] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        registered = await self.stub.RegisterBroker(pb.RegisterBrokerRequest(
            broker_id=1, incarnation_id=uuid.uuid4().hex,
            listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=free_port())]),
            timeout=10)
        assert registered.error_code == pb.NONE, registered
        self.task = asyncio.get_running_loop().create_task(self._beat(registered))
        await eventually(lambda: self.responses)

    async def _beat(self, registered: pb.RegisterBrokerResponse) -> None:
        call = self.stub.BrokerHeartbeats()
        while True:
            await call.write(pb.BrokerHeartbeatRequest(
                broker_id=1, broker_epoch=registered.broker_epoch,
                control_token=registered.control_token))
            response = await call.read()
            assert response is not grpc.aio.EOF, "the heartbeat stream ended"
            assert response.error_code == pb.NONE and not response.is_fenced, response
            self.responses.append(response)
            await asyncio.sleep(0.2)

    async def still_answered(self) -> None:
        """A new answer arrives, and the stream has not failed."""
        seen = len(self.responses)
        await eventually(lambda: len(self.responses) > seen or (self.task and self.task.done()))
        assert self.task is not None and not self.task.done(), self.task.exception()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.channel.close()


async def flood_within_cap(address: str, held_before: int,
                           call: Callable[[grpc.aio.Channel], Awaitable[object]]) -> None:
    """Of CONNECTIONS_TRIED new connections at most the cap's rest are served, and each
    served one is answered; once they closed, a new connection is served again."""
    flood = [own_channel(address) for _ in range(CONNECTIONS_TRIED)]
    try:
        served = await served_of(flood)
        print(f"{len(served)} of {CONNECTIONS_TRIED} connections served")
        assert 1 <= len(served) <= CONNECTIONS_MAX - held_before, len(served)
        for ch in served:
            assert await answers(lambda ch=ch: call(ch))
    finally:
        for ch in flood:
            await ch.close()
    # Its retries back off after the refusals, hence waited for.
    again = own_channel(address)
    try:
        await eventually(lambda: answers(lambda: call(again)), timeout_s=30, interval_s=0.5)
    finally:
        await again.close()


def describe_cluster(channel: grpc.aio.Channel) -> Awaitable[object]:
    return pb_grpc.ControllerStub(channel).DescribeCluster(pb.DescribeClusterRequest(),
                                                           timeout=5)


def describe_quorum(channel: grpc.aio.Channel) -> Awaitable[object]:
    return pb_grpc.ControllerQuorumStub(channel).DescribeQuorum(pb.DescribeQuorumRequest(),
                                                                timeout=5)


async def test_controller_port_caps_connections(tmp_path):
    # The default idle time: a served connection keeps its place while the test counts.
    proc = ControllerProcess(tmp_path / "data", settings=[
        f"max.connections={CONNECTIONS_MAX}", "broker.session.timeout.ms=30000"]).start()
    broker = HeartbeatStream(proc.address)
    try:
        await broker.start()
        await flood_within_cap(proc.address, 1, describe_cluster)
        await broker.still_answered()
    finally:
        await broker.stop()
        proc.stop()


async def test_controller_port_expires_idle_connections_not_live_streams(tmp_path):
    proc = ControllerProcess(tmp_path / "data", settings=[
        f"connections.max.idle.ms={IDLE_MS}", "broker.session.timeout.ms=30000"]).start()
    broker = HeartbeatStream(proc.address)
    idle = own_channel(proc.address)
    try:
        await broker.start()
        started = time.monotonic()
        # A connection with no call open for connections.max.idle.ms is sent GOAWAY.
        assert await answers(lambda: describe_cluster(idle))
        assert idle.get_state() == grpc.ChannelConnectivity.READY
        await asyncio.wait_for(idle.wait_for_state_change(grpc.ChannelConnectivity.READY),
                               IDLE_MS / 1000 + 15)
        assert idle.get_state() == grpc.ChannelConnectivity.IDLE
        # The heartbeat stream's connection, older than the idle time, was never cut.
        assert time.monotonic() - started > IDLE_MS / 1000
        await broker.still_answered()
    finally:
        await idle.close()
        await broker.stop()
        proc.stop()


async def test_raft_port_caps_connections(tmp_path):
    data_dir = tmp_path / "data"
    format_new_quorum({1: data_dir})
    raft_port = free_port()
    proc = ControllerProcess(data_dir, settings=[
        "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{raft_port}",
        f"max.connections={CONNECTIONS_MAX}"]).start()
    raft_address = f"127.0.0.1:{raft_port}"
    first = own_channel(raft_address)
    try:
        await eventually(lambda: answers(lambda: describe_quorum(first)), timeout_s=30)
        await flood_within_cap(raft_address, 1, describe_quorum)
        assert await answers(lambda: describe_quorum(first))
    finally:
        await first.close()
        proc.stop()
