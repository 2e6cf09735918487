"""A broker given several controllers (``--controller 1@H:P,...``): calls follow a
standby's NOT_CONTROLLER leader hint, else go round the list (in-process fakes)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidewater.broker.config import ConfigError, parse_controllers
from tidewater.broker.controller_link.channel import LEADER_HINT_KEY, ControllerChannel
from tidewater.controller.quorum import owner as quorum_owner
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


class Controller(pb_grpc.ControllerServicer):
    def __init__(self, leader_hint: int | None):
        self.leader_hint = leader_hint  # None: the active controller
        self.calls = 0

    async def AllocateProducerIds(self, request, context):
        self.calls += 1
        if self.leader_hint is not None:
            if self.leader_hint >= 0:
                context.set_trailing_metadata(((LEADER_HINT_KEY, str(self.leader_hint)),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER: a standby")
        return pb.AllocateProducerIdsResponse(producer_id_start=1000, producer_id_len=10)


async def serve(servicer: Controller) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def channel(controllers: list[tuple[int, int]]) -> ControllerChannel:
    bootstrap = [(node_id, "127.0.0.1", port) for node_id, port in controllers]
    return ControllerChannel(broker_id=1, controller_address=bootstrap[0][1:],
                             listeners=[], heartbeat_interval_ms=100, session_timeout_ms=1000,
                             controller_bootstrap=bootstrap)


def test_the_hint_key_is_the_one_the_controller_sends():
    assert LEADER_HINT_KEY == quorum_owner.LEADER_HINT_KEY


async def test_a_standby_hint_leads_straight_to_the_active_controller():
    standby, silent, active = Controller(leader_hint=2), Controller(-1), Controller(None)
    servers = [await serve(c) for c in (standby, silent, active)]
    link = channel([(1, servers[0][1]), (3, servers[1][1]), (2, servers[2][1])])
    try:
        answer = await link.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest(), timeout=5)
        assert answer.producer_id_start == 1000
        assert (standby.calls, silent.calls, active.calls) == (1, 0, 1)  # the hint, not the list
        assert link.controller_address == ("127.0.0.1", servers[2][1])
        await link.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest(), timeout=5)
        assert (standby.calls, active.calls) == (1, 2)  # it stays with the active one
    finally:
        await link.close()
        for server, _ in servers:
            await server.stop(None)


async def test_without_a_hint_the_next_controller_is_tried_and_all_failing_raises():
    first, second = Controller(-1), Controller(-1)
    servers = [await serve(c) for c in (first, second)]
    link = channel([(-1, servers[0][1]), (-1, servers[1][1])])
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await link.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest(), timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (first.calls, second.calls) == (1, 1)  # each once, no loop
    finally:
        await link.close()
        for server, _ in servers:
            await server.stop(None)


def test_controller_bootstrap_servers_parse():
    assert parse_controllers("1@a:1, 2@b:2", "--controller") == ((1, "a", 1), (2, "b", 2))
    assert parse_controllers("a:1,b:2", "--controller") == ((-1, "a", 1), (-1, "b", 2))
    for bad in ("", "1@a:1,1@b:2", "x@a:1", "a:99999", "a"):
        with pytest.raises(ConfigError):
            parse_controllers(bad, "--controller")


class Heartbeats(pb_grpc.ControllerServicer):
    """A controller's heartbeat stream: ``answers`` False is one cut off from the network
    (the connection stays up, nothing comes back)."""

    def __init__(self, answers: bool):
        self.answers = answers
        self.seen = 0

    async def BrokerHeartbeats(self, request_iterator, context):
        async for _request in request_iterator:
            self.seen += 1
            if not self.answers:
                await asyncio.Event().wait()  # never answers
            await context.write(pb.BrokerHeartbeatResponse(error_code=pb.NONE))


async def _until(condition, what: str) -> None:
    for _ in range(300):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {what}")


async def test_the_new_active_controllers_resync_moves_the_heartbeats_to_it():
    """A cut-off active controller leaves its broker's heartbeat unanswered; the new
    active controller's resync (follow_active, from a LeaderAndIsr of a newer controller
    epoch) moves the heartbeats to it at once, before the hung stream would time out
    (after which the link would ask the cut-off controller again)."""
    cut_off, active = Heartbeats(answers=False), Heartbeats(answers=True)
    servers = [await serve_heartbeats(c) for c in (cut_off, active)]
    link = channel([(1, servers[0][1]), (2, servers[1][1])])
    try:
        hung = asyncio.ensure_future(link.heartbeat())
        await _until(lambda: cut_off.seen == 1, "heartbeat on the cut-off controller")
        link.follow_active(2, 7)
        assert await asyncio.wait_for(hung, 30) is None  # dropped, not answered
        assert link.controller_address == ("127.0.0.1", servers[1][1])
        answer = await asyncio.wait_for(link.heartbeat(), 30)
        assert answer is not None and answer.error_code == pb.NONE
        assert (cut_off.seen, active.seen) == (1, 1)
        link.follow_active(9, 8)  # a node id it was not given: it stays
        link.follow_active(2, 9)  # the current one: nothing changes
        assert link.controller_address == ("127.0.0.1", servers[1][1])
    finally:
        await link.close()
        for server, _ in servers:
            await server.stop(None)


async def serve_heartbeats(servicer: Heartbeats) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_an_unanswered_heartbeat_moves_to_the_next_controller():
    """Without a resync (say it was lost), a heartbeat stream that times out on a cut-off
    controller is not re-opened there: the next heartbeat asks the next controller."""
    cut_off, active = Heartbeats(answers=False), Heartbeats(answers=True)
    servers = [await serve_heartbeats(c) for c in (cut_off, active)]
    link = channel([(1, servers[0][1]), (2, servers[1][1])])
    link.heartbeat_timeout_s = 0.5
    try:
        assert await asyncio.wait_for(link.heartbeat(), 30) is None
        answer = await asyncio.wait_for(link.heartbeat(), 30)
        assert answer is not None and (cut_off.seen, active.seen) == (1, 1)
    finally:
        await link.close()
        for server, _ in servers:
            await server.stop(None)
