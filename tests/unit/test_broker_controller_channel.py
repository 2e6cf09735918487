"""ControllerChannel against an in-process fake controller (grpc.aio on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidewater.broker.controller_link.channel import ControllerChannel
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings, open_security
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.servicers.guarded_admin_forwarding import GuardedControllerForwarder
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.forwarded_principal import forwarded_of
from tidewater.proto.scram import make_credential, plain_metadata


class FakeController(pb_grpc.ControllerServicer):
    def __init__(self):
        self.registrations = 0
        self.epoch = 10
        self.stale_next = False
        self.shutdown_after = 2
        self.shutdown_asks = 0

    async def RegisterBroker(self, request, context):
        self.registrations += 1
        self.epoch += 1
        return pb.RegisterBrokerResponse(error_code=pb.NONE, broker_epoch=self.epoch,
                                         cluster_id="c")

    async def BrokerHeartbeats(self, request_iterator, context):
        async for request in request_iterator:
            await context.write(self._heartbeat(request))

    def _heartbeat(self, request) -> pb.BrokerHeartbeatResponse:
        if request.want_shutdown:
            self.shutdown_asks += 1
            return pb.BrokerHeartbeatResponse(should_shutdown=self.shutdown_asks >= self.shutdown_after)
        if self.stale_next or request.broker_epoch != self.epoch:
            self.stale_next = False
            return pb.BrokerHeartbeatResponse(error_code=pb.STALE_BROKER_EPOCH)
        return pb.BrokerHeartbeatResponse(error_code=pb.NONE)

    async def CreateTopics(self, request, context):
        return pb.CreateTopicsResponse(topics=[pb.TopicResult(name=t.name, error_code=pb.NONE)
                                               for t in request.topics])


@pytest.fixture
async def controller():
    fake = FakeController()
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield fake, port, server
    await server.stop(0)


def channel_to(port: int) -> ControllerChannel:
    return ControllerChannel(broker_id=1, controller_address=("127.0.0.1", port),
                             listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=1)],
                             heartbeat_interval_ms=20, session_timeout_ms=200)


async def test_register_then_reregister_on_stale_epoch(controller):
    fake, port, _ = controller
    channel = channel_to(port)
    try:
        assert await asyncio.wait_for(channel.register(), 5) == 11
        beats = asyncio.create_task(channel.run_heartbeats())
        fake.stale_next = True
        deadline = asyncio.get_running_loop().time() + 10
        # The fake counts a registration before its answer reaches the channel:
        # wait for the channel to hold the new epoch, not for the count.
        while channel.broker_epoch != 12 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert fake.registrations == 2 and channel.broker_epoch == 12
        beats.cancel()
        assert await channel.controlled_shutdown(2000) is True
        assert fake.shutdown_asks == 2
    finally:
        await channel.close()


async def test_register_retries_until_the_controller_is_up():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = channel_to(port)
    fake = FakeController()
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(fake, server)
    try:
        registering = asyncio.create_task(channel.register())
        await asyncio.sleep(0.5)
        assert not registering.done()
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        assert await asyncio.wait_for(registering, 10) == 11
    finally:
        await channel.close()
        await server.stop(0)


async def test_forwarder_passes_through_and_reports_unreachable(controller):
    _fake, port, server = controller
    channel = channel_to(port)
    forwarder = ControllerForwarder(channel.stub, margin_s=0.5)
    request = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="t")], timeout_ms=100)
    resp = await forwarder.CreateTopics(request, None)
    assert resp.topics[0].error_code == pb.NONE
    await server.stop(0)
    resp = await forwarder.CreateTopics(request, None)
    assert resp.topics[0].error_code == pb.NOT_CONTROLLER
    assert (await forwarder.DescribeCluster(pb.DescribeClusterRequest(), None)).error_code == \
        pb.NOT_CONTROLLER
    # broker-to-controller calls are not a broker's to answer
    assert (await forwarder.ReportCorruptReplica(pb.ReportCorruptReplicaRequest(), None)
            ).error_code == pb.NOT_CONTROLLER
    await channel.close()


class QuorumMember(pb_grpc.ControllerServicer):
    """One of a quorum's controllers, sharing ``state`` with the others: every CreateTopics
    is refused NOT_CONTROLLER (UNAVAILABLE, as a standby answers) until ``state["refusals"]``
    ran out (an election ended), then taken; with ``state["hang"]`` taken and never
    answered (a controller whose commands wait behind a slow commit)."""

    def __init__(self, state: dict):
        self.state = state

    async def CreateTopics(self, request, context):
        self.state["calls"] += 1
        if self.state["hang"]:
            await asyncio.Event().wait()
        if self.state["refusals"] > 0:
            self.state["refusals"] -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER: no leader yet")
        return pb.CreateTopicsResponse(topics=[pb.TopicResult(name=t.name)
                                               for t in request.topics])


@pytest.fixture
async def quorum_link():
    """A broker's ControllerChannel to two quorum members, and their shared state."""
    state = {"calls": 0, "refusals": 0, "hang": False}
    servers, bootstrap = [], []
    for node_id in (1, 2):
        server = grpc.aio.server()
        pb_grpc.add_ControllerServicer_to_server(QuorumMember(state), server)
        bootstrap.append((node_id, "127.0.0.1", server.add_insecure_port("127.0.0.1:0")))
        await server.start()
        servers.append(server)
    channel = ControllerChannel(broker_id=1, controller_address=bootstrap[0][1:],
                                listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1",
                                                       port=1)],
                                heartbeat_interval_ms=20, session_timeout_ms=200,
                                controller_bootstrap=bootstrap)
    yield channel, state
    await channel.close()
    for server in servers:
        await server.stop(0)


async def test_a_forwarded_create_waits_out_an_election_within_its_timeout(quorum_link):
    """No controller active yet (each refuses): the broker asks again within the
    request's timeout, so the client's CreateTopics succeeds once a leader is active
    instead of failing NOT_CONTROLLER after one round of the controllers."""
    channel, state = quorum_link
    state["refusals"] = 5  # two rounds of both controllers, and one more
    forwarder = ControllerForwarder(channel.stub)
    request = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="t")], timeout_ms=30_000)
    resp = await forwarder.CreateTopics(request, None)
    assert [(t.name, t.error_code) for t in resp.topics] == [("t", pb.NONE)]
    assert state["calls"] == 6


async def test_a_forwarded_create_is_answered_by_its_timeout_however_many_controllers(
        quorum_link):
    """Controllers that take the call and do not answer: one deadline (the request's
    timeout) for the whole forward, not a timeout plus margin per controller tried. The
    hang guard is far below one old per-controller wait (timeout + 60 s margin)."""
    channel, state = quorum_link
    state["hang"] = True
    forwarder = ControllerForwarder(channel.stub, margin_s=60)
    request = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="t")], timeout_ms=300)
    async with asyncio.timeout(30):
        resp = await forwarder.CreateTopics(request, None)
    assert [(t.name, t.error_code) for t in resp.topics] == [("t", pb.NOT_CONTROLLER)]
    assert "DEADLINE_EXCEEDED" in resp.topics[0].error_message


async def test_a_broker_answers_heartbeats_not_controller():
    # A broker's address given as the controller's: its forwarder takes the stream and
    # answers every heartbeat NOT_CONTROLLER (the broker-to-controller RPCs are not its own).
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(ControllerForwarder(None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = channel_to(port)
    try:
        for _ in range(2):
            resp = await asyncio.wait_for(channel.heartbeat(), 10)
            assert resp is not None and resp.error_code == pb.NOT_CONTROLLER
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.parametrize("guarded", [False, True], ids=["open", "guarded"])
async def test_a_broker_answers_every_broker_to_controller_call_not_controller(guarded):
    # With security on, the guarded forwarder is the broker's Controller service: it must
    # pass every broker-to-controller call to the forwarder (AllocateProducerIds was
    # missing and answered UNIMPLEMENTED).
    forwarder = ControllerForwarder(None)
    servicer = GuardedControllerForwarder(forwarder, open_security()) if guarded else forwarder
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ControllerStub(channel)
            for call, request in [(stub.RegisterBroker, pb.RegisterBrokerRequest()),
                                  (stub.AlterPartition, pb.AlterPartitionRequest()),
                                  (stub.ReportCorruptReplica, pb.ReportCorruptReplicaRequest()),
                                  (stub.AllocateProducerIds, pb.AllocateProducerIdsRequest())]:
                assert (await call(request, timeout=10)).error_code == pb.NOT_CONTROLLER
    finally:
        await server.stop(0)


class _Alice:
    """Users and ACLs of a broker whose only user is alice (password "pw")."""

    credential = make_credential("SCRAM-SHA-512", "pw")

    def scram_credential(self, user, mechanism):
        return self.credential if (user, mechanism) == ("alice", "SCRAM-SHA-512") else None

    def user_credentials(self, user):
        return [self.credential] if user == "alice" else []

    def scram_iterations(self, mechanism):
        return [self.credential.iterations] if mechanism == "SCRAM-SHA-512" else []

    def acls(self):
        return ()


class RecordingController(FakeController):
    def __init__(self):
        super().__init__()
        self.forwarded_for = []

    async def CreateTopics(self, request, context):
        self.forwarded_for.append(forwarded_of(context.invocation_metadata()))
        return pb.CreateTopicsResponse(topics=[pb.TopicResult(name=t.name) for t in request.topics])


async def test_a_forwarded_admin_call_names_the_client_it_is_made_for():
    """The controller checks the client's ACLs, not the forwarding broker's: the broker's
    guard authenticates alice and its forwarder names her in the call."""
    controller = RecordingController()
    controller_server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(controller, controller_server)
    controller_port = controller_server.add_insecure_port("127.0.0.1:0")
    await controller_server.start()
    security = BrokerSecurity(SecuritySettings(sasl_mechanisms=("PLAIN",)), _Alice())
    to_controller = grpc.aio.insecure_channel(f"127.0.0.1:{controller_port}")
    broker_server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(GuardedControllerForwarder(
        ControllerForwarder(pb_grpc.ControllerStub(to_controller)), security), broker_server)
    broker_port = broker_server.add_insecure_port("127.0.0.1:0")
    await broker_server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker_port}") as channel:
            created = await pb_grpc.ControllerStub(channel).CreateTopics(
                pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="t")]),
                metadata=(plain_metadata("alice", "pw"),), timeout=10)
        assert [t.name for t in created.topics] == ["t"]
        assert controller.forwarded_for == [("User:alice", "127.0.0.1")]
    finally:
        await broker_server.stop(0)
        await to_controller.close()
        await controller_server.stop(0)
