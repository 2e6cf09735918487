"""Issue 14's replication bugs 3-5, through the broker's request handlers (what gRPC calls).

Each test failed on the broker before the replication core took the decisions:
- bug 3: the same leader epoch with another leader was taken as an "ISR-only change";
- bug 4: a multi-partition acks=all request registered its waits after every append, so a
  partition whose leadership changed meanwhile was judged against the new leadership;
- bug 5: the acks=all pre-check and the HW gate used two minimum-ISR rules, a changed
  min.insync.replicas did not re-check waiting requests, and a wait had no upper bound.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.unit.test_broker_fakes import make_batch
from tests.unit.test_broker_replica_manager import TOPIC_ID, TP, make_manager, serve, wait_until
from tidewater.broker.serving.produce import acks_timeout_ms
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import set_base_offset_and_epoch

TP1 = TopicPartition(TP.topic, 1)


def state(tp=TP, *, leader, leader_epoch, partition_epoch, replicas=(1, 2), isr=(1, 2),
          configs=None) -> pb.LeaderAndIsrRequest:
    return pb.LeaderAndIsrRequest(
        controller_id=0, controller_epoch=1, broker_epoch=7,
        partitions=[pb.LeaderAndIsrPartition(
            state=pb.PartitionState(topic=tp.topic, partition=tp.partition, leader=leader,
                                    leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                                    replicas=list(replicas), isr=list(isr), topic_id=TOPIC_ID),
            topic_configs=configs or {})],
        leaders=[pb.BrokerEndpoint(broker_id=b, host="127.0.0.1", port=1) for b in (1, 2, 3)])


async def test_controller_requests_without_the_registrations_token_change_nothing(tmp_path):
    """Issue 18: anyone who reaches the INTERNAL port can send a LeaderAndIsr, StopReplica
    or UpdateMetadata. Without the control token the controller handed this registration
    each is CLUSTER_AUTHORIZATION_FAILED: no replica is made or deleted, and the forged
    controller epoch is not believed, so the real controller is not locked out."""
    import grpc

    from tidewater.proto import tidewater_pb2_grpc as pb_grpc

    rm, _ = make_manager(tmp_path)
    token = bytes(range(16))
    rm.control._control_token = lambda: token
    server, port = await serve(rm)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.BrokerControlStub(channel)
            real = state(leader=1, leader_epoch=0, partition_epoch=0)
            real.control_token = token
            assert (await stub.LeaderAndIsr(real, timeout=5)).error_code == pb.NONE
            assert rm.partitions[TP].is_leader
            for forged_token in (b"", token[:-1], token + b"x", bytes(16)):
                forged = state(leader=2, leader_epoch=5, partition_epoch=5)
                forged.controller_epoch, forged.control_token = 1000, forged_token
                assert (await stub.LeaderAndIsr(forged, timeout=5)).error_code == \
                    pb.CLUSTER_AUTHORIZATION_FAILED
                stop = await stub.StopReplica(pb.StopReplicaRequest(
                    controller_epoch=1000, broker_epoch=7, delete_partitions=True,
                    partitions=[real.partitions[0].state], control_token=forged_token), timeout=5)
                assert stop.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
                update = await stub.UpdateMetadata(pb.UpdateMetadataRequest(
                    controller_epoch=1000, control_token=forged_token), timeout=5)
                assert update.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
            assert rm.control.controller_epoch == 1
            assert rm.partitions[TP].is_leader and rm.log_manager.get(TP) is not None
            # The real controller (epoch 1) is still believed.
            moved = state(leader=1, leader_epoch=1, partition_epoch=1)
            moved.control_token = token
            assert (await stub.LeaderAndIsr(moved, timeout=5)).error_code == pb.NONE
    finally:
        await server.stop(0)
        await rm.stop()


async def test_the_client_service_has_no_control_requests_and_takes_no_follower_fetch(tmp_path):
    """Issue 18: the client-facing ``Broker`` service (every listener, the only one on
    EXTERNAL) cannot pose as the controller, and a fetch claiming a replica id there,
    which could move the high watermark past what followers hold, is refused."""
    import grpc

    from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
    from tidewater.broker.servicers.grpc_server import BrokerServicer, build_server
    from tidewater.proto import tidewater_pb2_grpc as pb_grpc

    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(state(leader=1, leader_epoch=0, partition_epoch=0))
    assert (await rm.produce(produce(TP, acks=1))).partitions[0].error_code == pb.NONE
    hw = rm.partitions[TP].high_watermark
    server, port = build_server(
        host="127.0.0.1", port=0,
        servicer=BrokerServicer(rm, rm.metadata_cache, rm.metrics, "EXTERNAL"),
        controller_servicer=ControllerForwarder(None), max_message_bytes=1 << 20)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            control = pb_grpc.BrokerControlStub(channel)
            for call in (control.LeaderAndIsr(pb.LeaderAndIsrRequest(), timeout=5),
                         control.StopReplica(pb.StopReplicaRequest(), timeout=5),
                         control.UpdateMetadata(pb.UpdateMetadataRequest(), timeout=5)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            replica_fetch = control.ReplicaFetch()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                # The refusal may end the stream before the write is done.
                await replica_fetch.write(pb.FetchRequest(replica_id=2))
                await replica_fetch.read()
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            client = pb_grpc.BrokerStub(channel)
            forged = pb.FetchRequest(replica_id=2, replica_broker_epoch=7, partitions=[
                pb.FetchPartition(topic=TP.topic, partition=0, current_leader_epoch=0,
                                  fetch_offset=1, last_fetched_epoch=0)])
            assert (await client.Fetch(forged, timeout=5)).error_code == \
                pb.CLUSTER_AUTHORIZATION_FAILED
            stream = client.FetchStream()
            await stream.write(forged)
            assert (await stream.read()).error_code == pb.CLUSTER_AUTHORIZATION_FAILED
            stream.cancel()
            # Nothing moved: follower 2 never counted as caught up.
            assert rm.partitions[TP].high_watermark == hw
            consumer = pb.FetchRequest(replica_id=-1, partitions=[pb.FetchPartition(
                topic=TP.topic, partition=0, current_leader_epoch=-1, fetch_offset=0)])
            answer = await client.Fetch(consumer, timeout=5)
            assert answer.error_code == pb.NONE and answer.partitions[0].error_code == pb.NONE
    finally:
        await server.stop(0)
        await rm.stop()


def produce(*tps, acks=-1, timeout_ms=5000) -> pb.ProduceRequest:
    return pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
        pb.ProducePartitionData(topic=tp.topic, partition=tp.partition, records=make_batch(1))
        for tp in tps])


# ---------------------------------------------------------------- bug 3

async def test_the_same_leader_epoch_with_another_leader_is_refused_loudly(tmp_path, caplog):
    rm, _ = make_manager(tmp_path, broker_id=3)
    try:
        replicas = (1, 2, 3)
        resp = await rm.leader_and_isr(state(leader=1, leader_epoch=5, partition_epoch=5,
                                             replicas=replicas, isr=replicas))
        assert resp.partitions[0].error_code == pb.NONE
        assert rm.fetchers.following(TP) == 1
        caplog.set_level(logging.ERROR)
        # Leader 2 in the same epoch 5: impossible from a correct controller.
        resp = await rm.leader_and_isr(state(leader=2, leader_epoch=5, partition_epoch=6,
                                             replicas=replicas, isr=(2, 3)))
        assert resp.partitions[0].error_code == pb.INVALID_REQUEST
        assert "two leaders" in resp.partitions[0].error_message
        assert rm.fetchers.following(TP) == 1  # never follows it
        replica = rm.partitions[TP].replica
        assert (replica.leader_id, replica.partition_epoch, replica.isr) == (1, 5, replicas)
        assert any(r.levelno == logging.ERROR and "two leaders" in r.getMessage()
                   for r in caplog.records)
        decisions = rm.metrics.replication_decisions.labels("refused_impossible_states")
        assert decisions.value == 1
    finally:
        await rm.stop()


# ---------------------------------------------------------------- bug 4

async def test_an_acks_all_wait_is_bound_to_the_leadership_it_was_appended_under(tmp_path):
    rm, _ = make_manager(tmp_path)
    try:
        for tp in (TP, TP1):
            await rm.leader_and_isr(state(tp, leader=1, leader_epoch=0, partition_epoch=0))
        # The request appends to both partitions and waits for their HWs...
        second = rm.partitions[TP1]
        request = asyncio.create_task(rm.produce(produce(TP, TP1)))
        first_log = rm.partitions[TP].log
        await wait_until(lambda: first_log.log_end_offset == 1)
        # ... while the first partition's leadership moves to broker 2 (epoch 1), whose log
        # replaces the uncommitted record (the follower truncates and copies, as its fetcher
        # would), and back to broker 1 in epoch 2 with an ISR of one: its HW reaches 1.
        await rm.leader_and_isr(state(leader=2, leader_epoch=1, partition_epoch=1))
        first_log.truncate_to(0)
        theirs = bytearray(make_batch(1, b"broker 2's record"))
        set_base_offset_and_epoch(theirs, 0, 0, 1)
        first_log.append_as_follower(bytes(theirs), 0)
        await rm.leader_and_isr(state(leader=1, leader_epoch=2, partition_epoch=2, isr=(1,)))
        assert rm.partitions[TP].high_watermark == 1
        await wait_until(lambda: second.log.log_end_offset == 1)
        await rm.fetch(pb.FetchRequest(replica_id=2, min_bytes=1, partitions=[
            pb.FetchPartition(topic=TP1.topic, partition=1, current_leader_epoch=0,
                              fetch_offset=1)]))  # the follower has the second partition's record
        response = await asyncio.wait_for(request, 5)
        first, other = response.partitions
        # Offset 0 holds broker 2's record now: the request's record there was never committed.
        assert (first.error_code, first.base_offset) == (pb.NOT_LEADER_OR_FOLLOWER, -1)
        assert (other.error_code, other.base_offset) == (pb.NONE, 0)
    finally:
        await rm.stop()


# ---------------------------------------------------------------- bug 5

async def test_one_minimum_isr_rule_for_the_precheck_and_the_high_watermark(tmp_path):
    # Replication factor 1 under min.insync.replicas 2: the HW advances (the gate is
    # min(min.insync.replicas, RF)), so the pre-check must not refuse what would commit.
    rm, _ = make_manager(tmp_path, **{"min.insync.replicas": "2"})
    try:
        await rm.leader_and_isr(state(leader=1, leader_epoch=0, partition_epoch=0,
                                      replicas=(1,), isr=(1,)))
        out = await rm.produce(produce(TP))
        assert (out.partitions[0].error_code, out.partitions[0].base_offset) == (pb.NONE, 0)
        # RF 2 with one replica in sync: below min(2, 2), refused before anything is written.
        await rm.leader_and_isr(state(TP1, leader=1, leader_epoch=0, partition_epoch=0,
                                      isr=(1,)))
        out = await rm.produce(produce(TP1))
        assert out.partitions[0].error_code == pb.NOT_ENOUGH_REPLICAS
        assert rm.partitions[TP1].log.log_end_offset == 0
    finally:
        await rm.stop()


async def test_a_changed_min_insync_replicas_rechecks_waiting_requests(tmp_path):
    rm, _ = make_manager(tmp_path)
    try:
        configs = {"min.insync.replicas": "2"}
        await rm.leader_and_isr(state(leader=1, leader_epoch=0, partition_epoch=0,
                                      configs=configs))
        request = asyncio.create_task(rm.produce(produce(TP, timeout_ms=10_000)))
        await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)
        # The controller drops the silent follower: one in sync, below the minimum of 2.
        await rm.leader_and_isr(state(leader=1, leader_epoch=0, partition_epoch=1, isr=(1,),
                                      configs=configs))
        await asyncio.sleep(0.05)
        assert not request.done() and rm.partitions[TP].high_watermark == 0
        # min.insync.replicas lowered to 1 (the topic config rides on LeaderAndIsr): the HW
        # and the waiting request are judged by the new rule at once.
        await rm.leader_and_isr(state(leader=1, leader_epoch=0, partition_epoch=1, isr=(1,),
                                      configs={"min.insync.replicas": "1"}))
        out = await asyncio.wait_for(request, 1)
        assert (out.partitions[0].error_code, out.partitions[0].base_offset) == (pb.NONE, 0)
    finally:
        await rm.stop()


def test_an_acks_all_wait_has_an_upper_bound():
    assert acks_timeout_ms(pb.ProduceRequest(timeout_ms=2**31 - 1)) == 120_000
    assert acks_timeout_ms(pb.ProduceRequest(timeout_ms=1500)) == 1500
    assert acks_timeout_ms(pb.ProduceRequest()) == 30_000


# ---------------------------------------------------------------- controller requests and epochs

async def test_controller_requests_wait_for_the_registration_and_name_it(tmp_path):
    # Found by the simulation (seeds 157, 172): a restarted broker (epoch -1 until its
    # registration is answered) applied a LeaderAndIsr meant for its previous process and
    # led with a log that had lost records in the crash.
    import grpc

    from tidewater.proto import tidewater_pb2_grpc as pb_grpc

    rm, _ = make_manager(tmp_path)
    registered = {"epoch": -1}
    rm.control._broker_epoch = lambda: registered["epoch"]
    server, port = await serve(rm)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.BrokerControlStub(channel)
            request = state(leader=1, leader_epoch=0, partition_epoch=0)
            for call in (stub.LeaderAndIsr(request, timeout=5),
                         stub.StopReplica(pb.StopReplicaRequest(controller_epoch=1, broker_epoch=7),
                                          timeout=5),
                         stub.UpdateMetadata(pb.UpdateMetadataRequest(controller_epoch=1),
                                             timeout=5)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                # A transport-level "try again": the controller's sender retries it.
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert rm.partitions == {}
            registered["epoch"] = 7
            for wrong in (-1, 6, 8):  # -1 is not a wildcard
                request.broker_epoch = wrong
                resp = await stub.LeaderAndIsr(request, timeout=5)
                assert resp.error_code == pb.STALE_BROKER_EPOCH
                stop = await stub.StopReplica(pb.StopReplicaRequest(
                    controller_epoch=1, broker_epoch=wrong), timeout=5)
                assert stop.error_code == pb.STALE_BROKER_EPOCH
            assert rm.partitions == {}
            request.broker_epoch = 7
            assert (await stub.LeaderAndIsr(request, timeout=5)).error_code == pb.NONE
            assert rm.partitions[TP].is_leader
    finally:
        await server.stop(0)
        await rm.stop()
