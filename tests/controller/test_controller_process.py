"""The real controller process over gRPC, with fake brokers in the test process."""

import asyncio
import signal
import urllib.request

import grpc
import pytest
from controller_process import ControllerProcess, FakeBroker, eventually, free_port

from tidewater.broker.controller_link.channel import ControllerChannel
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SESSION_MS = 1500  # short, so fencing tests stay fast; not so short that load fences


@pytest.fixture
def controller_factory(tmp_path):
    started = []

    def make(settings=(), port=None, metrics_port=0):
        proc = ControllerProcess(tmp_path / "controller", [
            f"broker.session.timeout.ms={SESSION_MS}", *settings], port=port,
            metrics_port=metrics_port)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
async def cluster(controller_factory):
    """A controller and three fake brokers; yields (controller, brokers, stub)."""
    controller = controller_factory()
    brokers = {}
    channel = grpc.aio.insecure_channel(controller.address)
    try:
        for broker_id in (1, 2, 3):
            brokers[broker_id] = await FakeBroker(broker_id, controller.address).start()
        yield controller, brokers, pb_grpc.ControllerStub(channel)
    finally:
        for broker in brokers.values():
            await broker.stop()
        await channel.close()


async def create(stub, name, partitions=1, rf=1, configs=None, timeout_ms=0):
    response = await stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=rf, configs=configs or {})],
        timeout_ms=timeout_ms), timeout=10)
    return response.topics[0]


async def partitions_of(stub, topic):
    described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
    for t in described.topics:
        if t.name == topic:
            return {p.partition: p for p in t.partitions}
    return {}


async def test_create_topic_delivers_leader_and_isr_to_every_replica(cluster):
    controller, brokers, stub = cluster
    result = await create(stub, "orders", partitions=3, rf=2, configs={"retention.ms": "60000"})
    assert result.error_code == pb.NONE, result
    states = await partitions_of(stub, "orders")
    assert len(states) == 3 and {s.leader for s in states.values()} == {1, 2, 3}

    def delivered():
        for s in states.values():
            for replica in s.replicas:
                got = brokers[replica].latest_states().get(("orders", s.partition))
                if got is None or got.leader_epoch != 0:
                    return False
        return True

    await eventually(delivered)
    for s in states.values():
        assert s.leader == s.replicas[0] and list(s.isr) == list(s.replicas)
        for replica in s.replicas:
            broker = brokers[replica]
            request = next(r for r in broker.leader_and_isr
                           if any(i.state.topic == "orders" for i in r.partitions))
            item = next(i for i in request.partitions if i.state.partition == s.partition)
            assert item.state.leader == s.leader and item.is_new
            assert item.topic_configs["retention.ms"] == "60000"
            assert item.topic_configs["min.insync.replicas"] == "1"
            assert request.controller_epoch == 1 and request.broker_epoch == broker.broker_epoch
            leader_port = {e.broker_id: e.port for e in request.leaders}[s.leader]
            assert leader_port == brokers[s.leader].port
        # replicas that do not host it were not told about it
        for broker_id in set(brokers) - set(s.replicas):
            assert ("orders", s.partition) not in brokers[broker_id].latest_states()

    async def full_metadata():
        for broker in brokers.values():
            if not broker.update_metadata:
                return False
            last = broker.update_metadata[-1]
            if len(last.partitions) != 3 or len(last.brokers) != 3:
                return False
        return True

    await eventually(full_metadata)
    last = brokers[1].update_metadata[-1]
    assert last.cluster_id and [t.name for t in last.topics] == ["orders"]
    assert {x.name for b in last.brokers for x in b.listeners} == {"INTERNAL"}


async def test_create_and_delete_answer_after_brokers_have_the_change(cluster):
    controller, brokers, stub = cluster
    assert (await create(stub, "ready", partitions=3, rf=2, timeout_ms=5000)).error_code == pb.NONE
    hosted = 0
    for broker in brokers.values():  # no waiting: delivered before the answer
        hosted += len(broker.latest_states())
        assert {p.topic for p in broker.update_metadata[-1].partitions} == {"ready"}
    assert hosted == 6
    response = await stub.DeleteTopics(pb.DeleteTopicsRequest(names=["ready"], timeout_ms=5000),
                                       timeout=10)
    assert response.topics[0].error_code == pb.NONE
    assert sum(len(s.partitions) for b in brokers.values() for s in b.stop_replica) == 6
    assert all(not b.update_metadata[-1].partitions for b in brokers.values())


async def test_silent_broker_is_fenced_and_leadership_moves(cluster):
    controller, brokers, stub = cluster
    assert (await create(stub, "t", partitions=3, rf=3)).error_code == pb.NONE
    before = await partitions_of(stub, "t")
    victim = before[0].leader
    brokers[victim].heartbeating = False

    async def fenced():
        described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
        return {b.broker_id: b.fenced for b in described.brokers}[victim]

    await eventually(fenced, timeout_s=SESSION_MS / 1000 * 4)
    after = await partitions_of(stub, "t")
    for number, old in before.items():
        new = after[number]
        assert victim not in new.isr and new.leader != victim and new.leader != -1
        assert new.leader_epoch == old.leader_epoch + (1 if old.leader == victim else 0)
        assert new.partition_epoch == old.partition_epoch + 1
    new_leader = after[0].leader
    await eventually(lambda: brokers[new_leader].latest_states()[("t", 0)].leader == new_leader)
    assert brokers[new_leader].latest_states()[("t", 0)].leader_epoch == before[0].leader_epoch + 1
    # deleted while the victim is fenced: it learns when it is back
    response = await stub.DeleteTopics(pb.DeleteTopicsRequest(names=["t"]), timeout=5)
    assert response.topics[0].error_code == pb.NONE
    assert not brokers[victim].stop_replica
    # the same process heartbeating again (current epoch) is unfenced
    brokers[victim].heartbeating = True
    await eventually(lambda: brokers[victim].heartbeat_responses
                     and not brokers[victim].heartbeat_responses[-1].is_fenced)
    await eventually(lambda: brokers[victim].stop_replica)
    stopped = {(s.topic, s.partition) for r in brokers[victim].stop_replica for s in r.partitions}
    assert stopped == {("t", 0), ("t", 1), ("t", 2)}


async def test_sender_retries_until_the_broker_serves(controller_factory):
    controller = controller_factory()
    channel = grpc.aio.insecure_channel(controller.address)
    stub = pb_grpc.ControllerStub(channel)
    late = FakeBroker(1, controller.address)
    await late.start(serve=False)  # registered, but its Broker service is not up yet
    try:
        assert (await create(stub, "t", partitions=2)).error_code == pb.NONE
        await asyncio.sleep(0.3)  # a few failed deliveries
        await late.serve()
        await eventually(lambda: len(late.latest_states()) == 2)
        await eventually(lambda: late.update_metadata
                         and len(late.update_metadata[-1].partitions) == 2)
        assert "unreachable" in controller.stderr()
    finally:
        await late.stop()
        await channel.close()


async def test_zombie_epoch_refused_after_reregistration(cluster):
    controller, brokers, stub = cluster
    broker = brokers[2]
    old_epoch, old_token = broker.broker_epoch, broker.control_token
    # The old process finishes a controlled shutdown (else the new one's registration is
    # DUPLICATE_BROKER_REGISTRATION while its session lives).
    broker.heartbeating = False
    leaving = stub.BrokerHeartbeats()
    await leaving.write(pb.BrokerHeartbeatRequest(broker_id=2, broker_epoch=old_epoch,
                                                  control_token=old_token, want_shutdown=True))
    assert (await asyncio.wait_for(leaving.read(), 5)).should_shutdown
    leaving.cancel()
    broker.incarnation_id = "new-process"
    new_epoch = await broker.register()
    broker.heartbeating = True
    assert new_epoch > old_epoch
    heartbeats = stub.BrokerHeartbeats()
    await heartbeats.write(pb.BrokerHeartbeatRequest(broker_id=2, broker_epoch=old_epoch,
                                                     control_token=old_token))
    response = await asyncio.wait_for(heartbeats.read(), 5)
    heartbeats.cancel()
    assert response.error_code == pb.STALE_BROKER_EPOCH
    alter = await stub.AlterPartition(pb.AlterPartitionRequest(
        broker_id=2, broker_epoch=old_epoch, control_token=old_token), timeout=5)
    assert alter.error_code == pb.STALE_BROKER_EPOCH


async def test_broker_requests_without_the_registrations_token_are_refused(cluster):
    """Issue 18: the broker epoch is no secret (DescribeCluster lists it); a heartbeat,
    AlterPartition or ReportCorruptReplica without the registration's token changes
    nothing, and the broker's real requests keep working."""
    controller, brokers, stub = cluster
    await create(stub, "t", rf=3)
    p = (await partitions_of(stub, "t"))[0]
    leader = brokers[p.leader]
    described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
    epochs = {b.broker_id: b.broker_epoch for b in described.brokers}
    assert epochs[p.leader] == leader.broker_epoch
    shrink = [pb.AlterPartitionItem(topic="t", partition=0, leader_epoch=p.leader_epoch,
                                    partition_epoch=p.partition_epoch, new_isr=[p.leader])]
    for token in (b"", b"\0" * 16, leader.control_token[:-1] + b"x"):
        forged = await stub.AlterPartition(pb.AlterPartitionRequest(
            broker_id=p.leader, broker_epoch=epochs[p.leader], items=shrink,
            control_token=token), timeout=5)
        assert forged.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
        corrupt = await stub.ReportCorruptReplica(pb.ReportCorruptReplicaRequest(
            broker_id=p.leader, broker_epoch=epochs[p.leader], control_token=token,
            replicas=[pb.CorruptReplica(topic="t", partition=0, leader_epoch=p.leader_epoch,
                                        partition_epoch=p.partition_epoch)]), timeout=5)
        assert corrupt.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
        heartbeats = stub.BrokerHeartbeats()
        await heartbeats.write(pb.BrokerHeartbeatRequest(
            broker_id=p.leader, broker_epoch=epochs[p.leader], want_shutdown=True,
            control_token=token))
        beat = await asyncio.wait_for(heartbeats.read(), 5)
        heartbeats.cancel()
        assert beat.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    after = (await partitions_of(stub, "t"))[0]
    assert (after.leader, list(after.isr), after.partition_epoch) == \
        (p.leader, list(p.isr), p.partition_epoch)
    assert not any(b.fenced or b.in_controlled_shutdown for b in
                   (await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)).brokers)
    real = await stub.AlterPartition(pb.AlterPartitionRequest(
        broker_id=p.leader, broker_epoch=leader.broker_epoch, items=shrink,
        control_token=leader.control_token), timeout=5)
    assert real.items[0].error_code == pb.NONE


async def test_alter_partition_over_grpc(cluster):
    controller, brokers, stub = cluster
    await create(stub, "t", rf=3)
    p = (await partitions_of(stub, "t"))[0]
    leader = brokers[p.leader]
    shrunk = [p.leader, p.replicas[1]]
    request = pb.AlterPartitionRequest(broker_id=p.leader, broker_epoch=leader.broker_epoch,
                                       control_token=leader.control_token, items=[pb.AlterPartitionItem(
                                           topic="t", partition=0, leader_epoch=p.leader_epoch,
                                           partition_epoch=p.partition_epoch, new_isr=shrunk)])
    response = await stub.AlterPartition(request, timeout=5)
    assert response.items[0].error_code == pb.NONE
    assert list(response.items[0].state.isr) == shrunk
    assert response.items[0].state.partition_epoch == p.partition_epoch + 1
    stale = await stub.AlterPartition(request, timeout=5)  # same partition epoch again
    assert stale.items[0].error_code == pb.INVALID_UPDATE_VERSION
    # every replica hears about the committed ISR
    third = p.replicas[2]
    await eventually(lambda: list(brokers[third].latest_states()[("t", 0)].isr) == shrunk)


async def test_report_corrupt_replica_through_the_brokers_client(cluster):
    """Issue 14, bug 6 (controller side): a leader whose replica holds a bad batch hands
    leadership to another ISR member and leaves the ISR; every replica hears of it."""
    controller, brokers, stub = cluster
    await create(stub, "t", rf=3)
    p = (await partitions_of(stub, "t"))[0]
    host, port = controller.address.rsplit(":", 1)
    clients = {}
    for broker_id, broker in brokers.items():
        clients[broker_id] = ControllerChannel(
            broker_id=broker_id, controller_address=(host, int(port)), listeners=[],
            heartbeat_interval_ms=500, session_timeout_ms=SESSION_MS)
        clients[broker_id].registration.broker_epoch = broker.broker_epoch
        clients[broker_id].registration.control_token = broker.control_token
    try:
        report = pb.CorruptReplica(topic="t", partition=0, leader_epoch=p.leader_epoch,
                                   partition_epoch=p.partition_epoch, corrupt_offset=42)
        response = await clients[p.leader].report_corrupt_replica([report])
        assert response.error_code == pb.NONE
        [result] = response.results
        new_leader, third = p.replicas[1], p.replicas[2]
        assert result.error_code == pb.NONE, result
        assert (result.state.leader, list(result.state.isr)) == (new_leader, [new_leader, third])
        assert result.state.leader_epoch == p.leader_epoch + 1
        assert result.state.partition_epoch == p.partition_epoch + 1
        for broker_id in p.replicas:  # the old leader too: it now follows
            await eventually(lambda b=broker_id: brokers[b].latest_states()[("t", 0)].leader
                             == new_leader)
        assert "reports a batch failing its CRC" in controller.stderr()

        again = await clients[p.leader].report_corrupt_replica([report])  # a late duplicate
        assert again.results[0].error_code == pb.FENCED_LEADER_EPOCH
        assert again.results[0].state.leader == new_leader  # the current state, unchanged
        current = again.results[0].state
        follower = await clients[third].report_corrupt_replica([pb.CorruptReplica(
            topic="t", partition=0, leader_epoch=current.leader_epoch,
            partition_epoch=current.partition_epoch, corrupt_offset=-1)])
        assert follower.results[0].error_code == pb.NONE
        assert list(follower.results[0].state.isr) == [new_leader]
        last = follower.results[0].state
        alone = await clients[new_leader].report_corrupt_replica([pb.CorruptReplica(
            topic="t", partition=0, leader_epoch=last.leader_epoch,
            partition_epoch=last.partition_epoch)])
        assert alone.results[0].error_code == pb.ELIGIBLE_LEADERS_NOT_AVAILABLE
        assert (await partitions_of(stub, "t"))[0].leader == new_leader  # it keeps leading

        clients[third].registration.broker_epoch -= 1
        stale = await clients[third].report_corrupt_replica([report])
        assert stale.error_code == pb.STALE_BROKER_EPOCH and not stale.results
    finally:
        for client in clients.values():
            await client.close()


async def test_create_topics_errors(cluster):
    controller, brokers, stub = cluster
    response = await stub.CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name="../x", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name="", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name="big", num_partitions=1, replication_factor=4),
        pb.CreatableTopic(name="zero", num_partitions=0, replication_factor=1),
        pb.CreatableTopic(name="cfg", num_partitions=1, replication_factor=1,
                          configs={"retention.ms": "forever"}),
        pb.CreatableTopic(name="ok", num_partitions=2, replication_factor=3),
    ]), timeout=5)
    codes = {t.name: t.error_code for t in response.topics}
    assert codes == {"../x": pb.INVALID_TOPIC_EXCEPTION, "": pb.INVALID_TOPIC_EXCEPTION,
                     "big": pb.INVALID_REPLICATION_FACTOR, "zero": pb.INVALID_PARTITIONS,
                     "cfg": pb.INVALID_CONFIG, "ok": pb.NONE}
    assert all(t.error_message for t in response.topics if t.error_code != pb.NONE)
    again = await create(stub, "ok", partitions=2, rf=3)
    assert again.error_code == pb.TOPIC_ALREADY_EXISTS
    described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
    assert [t.name for t in described.topics] == ["ok"]


async def test_delete_topic_sends_stop_replica(cluster):
    controller, brokers, stub = cluster
    await create(stub, "gone", partitions=2, rf=2)
    hosted = {}
    for p in (await partitions_of(stub, "gone")).values():
        for replica in p.replicas:
            hosted.setdefault(replica, set()).add(p.partition)
    response = await stub.DeleteTopics(pb.DeleteTopicsRequest(names=["gone", "never"]), timeout=5)
    assert [t.error_code for t in response.topics] == [pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION]
    await eventually(lambda: all(brokers[b].stop_replica for b in hosted))
    for broker_id, broker in brokers.items():
        stopped = {(s.topic, s.partition) for r in broker.stop_replica for s in r.partitions}
        assert stopped == {("gone", n) for n in hosted.get(broker_id, ())}
        for request in broker.stop_replica:
            assert request.delete_partitions and request.broker_epoch == broker.broker_epoch
    assert await partitions_of(stub, "gone") == {}


async def test_controlled_shutdown(cluster):
    controller, brokers, stub = cluster
    await create(stub, "t", partitions=3, rf=2)
    before = await partitions_of(stub, "t")
    leaving = before[0].leader
    brokers[leaving].want_shutdown = True
    await eventually(lambda: any(r.should_shutdown for r in brokers[leaving].heartbeat_responses))
    after = await partitions_of(stub, "t")
    for p in after.values():
        assert p.leader != leaving and leaving not in p.isr and p.leader != -1
    described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
    assert {b.broker_id: b.in_controlled_shutdown for b in described.brokers}[leaving]


async def test_kill_and_restart_keeps_metadata_and_resyncs(controller_factory):
    controller = controller_factory()
    channel = grpc.aio.insecure_channel(controller.address)
    stub = pb_grpc.ControllerStub(channel)
    # Broker 1 in a rack, broker 2 in none.
    brokers = [await FakeBroker(b, controller.address, rack="r1" if b == 1 else "").start()
               for b in (1, 2)]
    try:
        await create(stub, "durable", partitions=2, rf=2, configs={"segment.bytes": "100000"})
        before = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
        assert before.controller_epoch == 1
        assert {b.broker_id: b.rack for b in before.brokers} == {1: "r1", 2: ""}
        controller.signal(signal.SIGKILL)
        controller.wait()
        restarted = controller_factory(port=controller.port)
        after = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5,
                                           wait_for_ready=True)
        assert after.controller_epoch == 2 and after.cluster_id == before.cluster_id
        assert list(after.topics) == list(before.topics)
        assert [(b.broker_id, b.broker_epoch, b.rack) for b in after.brokers] == \
            [(b.broker_id, b.broker_epoch, b.rack) for b in before.brokers]
        # both brokers keep their epochs (fresh session) and get a full resync at epoch 2
        for broker in brokers:
            await eventually(lambda b=broker: any(
                r.controller_epoch == 2 and len(r.partitions) == 2 for r in b.leader_and_isr))
            await eventually(lambda b=broker: any(r.controller_epoch == 2
                                                  for r in b.update_metadata))
            resync = next(r for r in broker.update_metadata if r.controller_epoch == 2)
            assert {b.broker_id: b.rack for b in resync.brokers} == {1: "r1", 2: ""}
        await asyncio.sleep(SESSION_MS * 2.2 / 1000)  # past the longer first session
        described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
        assert not any(b.fenced for b in described.brokers)
        assert "replayed" in restarted.stderr()
    finally:
        for broker in brokers:
            await broker.stop()
        await channel.close()


async def test_sigterm_stops_cleanly_and_metrics_are_served(controller_factory):
    metrics_port = free_port()
    controller = controller_factory(metrics_port=metrics_port)
    channel = grpc.aio.insecure_channel(controller.address)
    stub = pb_grpc.ControllerStub(channel)
    broker = await FakeBroker(1, controller.address).start()
    try:
        await create(stub, "m", partitions=2, rf=1)
        await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)

        def scrape():
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            return urllib.request.urlopen(url, timeout=5).read().decode()

        text = await asyncio.to_thread(scrape)
        assert "tidewater_controller_active_controller 1.0" in text
        assert "tidewater_controller_partitions 2.0" in text
        assert "tidewater_controller_offline_partitions 0.0" in text
        assert "tidewater_controller_under_replicated_partitions 0.0" in text
        assert 'tidewater_controller_request_latency_seconds_count{rpc="CreateTopics"} 1.0' in text
        assert "tidewater_controller_leader_elections_total" in text
        assert "tidewater_controller_unclean_leader_elections_total" in text
    finally:
        await broker.stop()
        await channel.close()
    controller.signal(signal.SIGTERM)
    assert controller.wait(timeout_s=10) == 0
    assert "shutting down" in controller.stderr()


def test_bad_arguments_exit_2(tmp_path):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "tidewater.controller", "--data-dir", str(tmp_path),
                             "--set", "no.such.setting=1"], capture_output=True, timeout=30)
    assert result.returncode == 2 and b"unknown setting" in result.stderr


def test_port_in_use_exits_1_without_writing(tmp_path):
    import socket
    import subprocess
    import sys
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "tidewater.controller", "--data-dir",
                                 str(tmp_path / "c"), "--listen", f"127.0.0.1:{port}"],
                                capture_output=True, timeout=30)
    assert result.returncode == 1 and b"cannot listen" in result.stderr
    assert (tmp_path / "c" / "metadata.log").read_bytes() == b""
