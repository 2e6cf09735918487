"""ReplicaManager driven directly (no sockets): LeaderAndIsr, produce, fetch, fencing, acks=all."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests.unit.test_broker_fakes import FakeLogManager, make_batch
from tidewater.broker.config import BrokerConfig
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.supervisor import TaskSupervisor

TP = TopicPartition("orders", 0)


class FakeController:
    """Commits every AlterPartition proposal with the next partition epoch."""

    def __init__(self):
        self.items: list[pb.AlterPartitionItem] = []
        self.accept = True

    async def alter_partition(self, items):
        self.items.extend(items)
        resp = pb.AlterPartitionResponse(error_code=pb.NONE)
        for it in items:
            if not self.accept:
                resp.items.add(error_code=pb.INVALID_UPDATE_VERSION)
                continue
            resp.items.add(error_code=pb.NONE, state=pb.PartitionState(
                topic=it.topic, partition=it.partition, leader=1, leader_epoch=it.leader_epoch,
                partition_epoch=it.partition_epoch + 1, replicas=[1, 2], isr=list(it.new_isr)))
        return resp


def make_manager(tmp_path: Path, broker_id: int = 1, log_manager=None,
                 **settings) -> tuple[ReplicaManager, FakeController]:
    tmp_path.mkdir(parents=True, exist_ok=True)  # meta.properties goes there
    config = BrokerConfig(broker_id=broker_id, listen=("127.0.0.1", 0),
                          controller=("127.0.0.1", 1), data_dir=tmp_path)
    config.apply_settings(settings)
    controller = FakeController()
    # A death is logged at CRITICAL and kept in ``rm.supervisor.failure`` for the test to see.
    supervisor = TaskSupervisor(on_fatal=lambda error: None)
    rm = ReplicaManager(config=config, log_manager=log_manager or FakeLogManager(),
                        metadata_cache=MetadataCache(), metrics=BrokerMetrics(1),
                        alter_partition=controller.alter_partition, broker_epoch=lambda: 7,
                        supervisor=supervisor)
    return rm, controller


async def wait_until(predicate, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline and not predicate():
        await asyncio.sleep(0.01)


TOPIC_ID = bytes(range(1, 17))
CLUSTER_ID = "cluster-1"


def lai(leader=1, leader_epoch=0, partition_epoch=0, isr=(1, 2), replicas=(1, 2),
        controller_epoch=1, configs=None, topic_id=TOPIC_ID) -> pb.LeaderAndIsrRequest:
    return pb.LeaderAndIsrRequest(
        controller_id=0, controller_epoch=controller_epoch, broker_epoch=7, cluster_id=CLUSTER_ID,
        partitions=[pb.LeaderAndIsrPartition(
            state=pb.PartitionState(topic=TP.topic, partition=TP.partition, leader=leader,
                                    leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                                    replicas=list(replicas), isr=list(isr), topic_id=topic_id),
            topic_configs=configs or {}, is_new=True)],
        leaders=[pb.BrokerEndpoint(broker_id=2, host="127.0.0.1", port=1)])


def produce(acks=1, records=None, topic=TP.topic, partition=0, timeout_ms=2000):
    return pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[pb.ProducePartitionData(
        topic=topic, partition=partition, records=make_batch(1) if records is None else records)])


def follower_fetch(offset, epoch=0, last_fetched_epoch=-1, max_wait_ms=0):
    return pb.FetchRequest(replica_id=2, max_wait_ms=max_wait_ms, min_bytes=1, partitions=[
        pb.FetchPartition(topic=TP.topic, partition=0, current_leader_epoch=epoch,
                          fetch_offset=offset, last_fetched_epoch=last_fetched_epoch)])


def consumer_fetch(offset, max_wait_ms=0):
    return pb.FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, partitions=[
        pb.FetchPartition(topic=TP.topic, partition=0, current_leader_epoch=-1,
                          fetch_offset=offset)])


async def test_become_leader_assigns_epoch_and_acks1_appends(tmp_path):
    rm, _ = make_manager(tmp_path)
    resp = await rm.leader_and_isr(lai(leader_epoch=3))
    assert [p.error_code for p in resp.partitions] == [pb.NONE]
    log = rm.partitions[TP].log
    assert log.leader_epoch_cache.entries() == [(3, 0)]
    out = await rm.produce(produce(acks=1, records=make_batch(4)))
    assert out.partitions[0].error_code == pb.NONE and out.partitions[0].base_offset == 0
    assert log.log_end_offset == 4
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].base_offset == 4


async def test_acks_all_waits_for_follower_fetch(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    task = asyncio.create_task(rm.produce(produce(acks=-1, records=make_batch(2))))
    await asyncio.sleep(0.05)
    assert not task.done() and rm.partitions[TP].replica.waiting == 1
    # The follower fetches the records (offset 0), then fetches at 2: the HW reaches 2.
    first = await rm.fetch(follower_fetch(0))
    assert first.partitions[0].records and first.partitions[0].high_watermark == 0
    assert not task.done()
    second = await rm.fetch(follower_fetch(2))
    assert second.partitions[0].high_watermark == 2
    out = await asyncio.wait_for(task, 1)
    assert out.partitions[0].error_code == pb.NONE and out.partitions[0].base_offset == 0


async def test_high_watermark_move_wakes_consumers_not_parked_followers(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(replicas=(1, 2, 3), isr=(1, 2, 3)))

    def fetch_from(replica_id, offset, max_wait_ms=0):
        return pb.FetchRequest(replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=1,
                               partitions=[pb.FetchPartition(topic=TP.topic, partition=0,
                                                             current_leader_epoch=0,
                                                             fetch_offset=offset)])

    acked = asyncio.create_task(rm.produce(produce(acks=-1)))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)
    for replica_id in (2, 3):
        assert (await rm.fetch(fetch_from(replica_id, 0))).partitions[0].records
    parked_follower = asyncio.create_task(rm.fetch(fetch_from(2, 1, max_wait_ms=5000)))
    parked_consumer = asyncio.create_task(rm.fetch(consumer_fetch(0, max_wait_ms=5000)))
    await wait_until(lambda: rm.fetch_waiters.waiting() == 2)
    # Follower 3 at offset 1 moves the HW to 1: the produce and the consumer are answered,
    # follower 2 (nothing new for it) stays parked.
    third = await rm.fetch(fetch_from(3, 1))
    assert third.partitions[0].high_watermark == 1
    assert (await asyncio.wait_for(acked, 1)).partitions[0].error_code == pb.NONE
    consumer = await asyncio.wait_for(parked_consumer, 1)
    assert consumer.partitions[0].records and consumer.partitions[0].high_watermark == 1
    await asyncio.sleep(0.05)
    assert not parked_follower.done() and rm.fetch_waiters.waiting() == 1
    # The next append answers it, with the HW it has now.
    await rm.produce(produce(acks=1))
    follower = (await asyncio.wait_for(parked_follower, 1)).partitions[0]
    assert follower.records and follower.high_watermark == 1 and follower.log_end_offset == 2


def lai_of_two(leader_epoch=0):
    """``lai`` for partitions 0 and 1 of TP's topic, both led here, replicas 1-3."""
    request = lai(replicas=(1, 2, 3), isr=(1, 2, 3), leader_epoch=leader_epoch)
    second = request.partitions.add()
    second.CopyFrom(request.partitions[0])
    second.state.partition = 1
    return request


def fetch_both(replica_id, offsets, epoch=0, max_wait_ms=0):
    return pb.FetchRequest(replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=1,
                           partitions=[pb.FetchPartition(topic=TP.topic, partition=p,
                                                         current_leader_epoch=epoch,
                                                         fetch_offset=offset)
                                       for p, offset in enumerate(offsets)])


async def test_a_parked_follower_fetch_answers_its_idle_partitions_as_they_are_now(tmp_path):
    # A follower's long-poll names every partition it follows; after its wake-up the
    # partitions that did not move keep the first pass's answer (not served again), with
    # the HW of now, and one whose leader epoch moved is served again (fenced).
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai_of_two())
    await rm.produce(produce(acks=1, partition=0))
    for replica_id in (2, 3):
        await rm.fetch(fetch_both(replica_id, (0, 0)))
    assert [rm.partitions[TopicPartition(TP.topic, p)].replica.high_watermark
            for p in (0, 1)] == [0, 0]
    parked = asyncio.create_task(rm.fetch(fetch_both(2, (1, 0), max_wait_ms=5000)))
    await wait_until(lambda: rm.fetch_waiters.waiting() == 1)
    # Follower 3 at 1 moves partition 0's HW to 1 (its LEO stays 1): no wake-up for 2 ...
    await rm.fetch(fetch_both(3, (1, 0)))
    await asyncio.sleep(0.05)
    assert not parked.done()
    # ... an append to partition 1 is one: partition 0 answered with the HW moved meanwhile.
    await rm.produce(produce(acks=1, partition=1))
    zero, one = (await asyncio.wait_for(parked, 1)).partitions
    assert (zero.error_code, zero.records, zero.high_watermark, zero.log_end_offset) == (
        pb.NONE, b"", 1, 1)
    assert one.error_code == pb.NONE and one.records and one.log_end_offset == 1

    parked = asyncio.create_task(rm.fetch(fetch_both(2, (1, 1), max_wait_ms=5000)))
    await wait_until(lambda: rm.fetch_waiters.waiting() == 1)
    await rm.leader_and_isr(lai_of_two(leader_epoch=1))  # still the leader, a new epoch
    zero, one = (await asyncio.wait_for(parked, 1)).partitions
    assert (zero.error_code, one.error_code) == (pb.FENCED_LEADER_EPOCH,
                                                 pb.FENCED_LEADER_EPOCH)


async def test_acks_all_times_out_without_follower(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    out = await rm.produce(produce(acks=-1, timeout_ms=100))
    assert out.partitions[0].error_code == pb.REQUEST_TIMED_OUT
    assert rm.acks_waits.pending() == 0


async def test_min_insync_replicas_rejects_before_append(tmp_path):
    rm, _ = make_manager(tmp_path, **{"min.insync.replicas": "2"})
    await rm.leader_and_isr(lai(isr=(1,)))
    out = await rm.produce(produce(acks=-1))
    assert out.partitions[0].error_code == pb.NOT_ENOUGH_REPLICAS
    assert rm.partitions[TP].log.log_end_offset == 0
    # acks=1 is not subject to min.insync.replicas
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].error_code == pb.NONE


async def test_leadership_loss_fails_waiters(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    task = asyncio.create_task(rm.produce(produce(acks=-1)))
    await asyncio.sleep(0.02)
    resp = await rm.leader_and_isr(lai(leader=2, leader_epoch=1, partition_epoch=1))
    assert resp.partitions[0].error_code == pb.NONE
    out = await asyncio.wait_for(task, 1)
    assert out.partitions[0].error_code == pb.NOT_LEADER_OR_FOLLOWER
    assert not rm.partitions[TP].is_leader
    await rm.stop()


@pytest.mark.parametrize("topic,code", [
    ("../etc", pb.INVALID_TOPIC_EXCEPTION), ("nope", pb.UNKNOWN_TOPIC_OR_PARTITION)])
async def test_produce_bad_topic(tmp_path, topic, code):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    out = await rm.produce(produce(topic=topic))
    assert out.partitions[0].error_code == code
    assert not (tmp_path / "etc").exists()


async def test_produce_invalid_acks_and_corrupt(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    out = await rm.produce(produce(acks=2))
    assert out.partitions[0].error_code == pb.INVALID_REQUIRED_ACKS
    bad = bytearray(make_batch(1))
    bad[-1] ^= 0xFF
    out = await rm.produce(produce(records=bytes(bad)))
    assert out.partitions[0].error_code == pb.CORRUPT_MESSAGE
    out = await rm.produce(produce(records=b""))
    assert out.partitions[0].error_code == pb.CORRUPT_MESSAGE
    assert rm.partitions[TP].log.log_end_offset == 0


async def test_message_too_large(tmp_path):
    rm, _ = make_manager(tmp_path, **{"max.message.bytes": "200"})
    await rm.leader_and_isr(lai())
    out = await rm.produce(produce(records=make_batch(1, b"y" * 500)))
    assert out.partitions[0].error_code == pb.MESSAGE_TOO_LARGE


async def test_acks0_returns_empty_response(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    out = await rm.produce(produce(acks=0))
    assert len(out.partitions) == 0
    assert rm.partitions[TP].log.log_end_offset == 1


async def test_consumer_never_reads_above_high_watermark(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    await rm.produce(produce(acks=1, records=make_batch(3)))
    resp = await rm.fetch(consumer_fetch(0))
    p = resp.partitions[0]
    assert p.error_code == pb.NONE and p.records == b"" and p.high_watermark == 0
    assert p.log_end_offset == 3
    await rm.fetch(follower_fetch(3))
    resp = await rm.fetch(consumer_fetch(0))
    assert resp.partitions[0].high_watermark == 3 and len(resp.partitions[0].records) > 0


async def test_consumer_long_poll_woken_by_high_watermark(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    poll = asyncio.create_task(rm.fetch(consumer_fetch(0, max_wait_ms=5000)))
    await asyncio.sleep(0.02)
    await rm.produce(produce(acks=1))
    await asyncio.sleep(0.02)
    assert not poll.done()  # appended but not committed
    await rm.fetch(follower_fetch(1))
    resp = await asyncio.wait_for(poll, 1)
    assert resp.partitions[0].records


async def test_follower_fetch_fencing_and_divergence(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(leader_epoch=2))
    await rm.produce(produce(acks=1, records=make_batch(5)))
    resp = await rm.fetch(follower_fetch(0, epoch=1))
    assert resp.partitions[0].error_code == pb.FENCED_LEADER_EPOCH
    resp = await rm.fetch(follower_fetch(0, epoch=3))
    assert resp.partitions[0].error_code == pb.UNKNOWN_LEADER_EPOCH
    # Follower claims epoch 1 up to offset 3; the leader has epoch 2 from 0: diverged.
    resp = await rm.fetch(follower_fetch(3, epoch=2, last_fetched_epoch=1))
    p = resp.partitions[0]
    assert p.HasField("diverging_epoch") and p.records == b""
    assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (1, 0)
    resp = await rm.fetch(follower_fetch(9, epoch=2))
    assert resp.partitions[0].error_code == pb.OFFSET_OUT_OF_RANGE


async def test_offset_for_leader_epoch_and_list_offsets(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(leader_epoch=0))
    await rm.produce(produce(acks=1, records=make_batch(2)))
    await rm.leader_and_isr(lai(leader_epoch=2, partition_epoch=1))
    await rm.produce(produce(acks=1, records=make_batch(3)))
    resp = rm.offset_for_leader_epoch(pb.OffsetForLeaderEpochRequest(replica_id=2, partitions=[
        pb.OffsetForLeaderEpochPartition(topic=TP.topic, partition=0, current_leader_epoch=2,
                                         leader_epoch=1)]))
    p = resp.partitions[0]
    assert (p.error_code, p.leader_epoch, p.end_offset) == (pb.NONE, 0, 2)
    await rm.fetch(follower_fetch(5, epoch=2))
    lo = rm.list_offsets(pb.ListOffsetsRequest(replica_id=-1, partitions=[
        pb.ListOffsetsPartition(topic=TP.topic, partition=0, current_leader_epoch=-1,
                                timestamp=t) for t in (-2, -1)]))
    assert [p.offset for p in lo.partitions] == [0, 5]


async def test_stale_controller_and_leader_epochs(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(leader_epoch=5, partition_epoch=5, controller_epoch=3))
    resp = await rm.leader_and_isr(lai(leader_epoch=6, controller_epoch=2))
    assert resp.error_code == pb.STALE_CONTROLLER_EPOCH
    resp = await rm.leader_and_isr(lai(leader_epoch=4, partition_epoch=9, controller_epoch=3))
    assert resp.partitions[0].error_code == pb.FENCED_LEADER_EPOCH
    resp = await rm.leader_and_isr(lai(leader_epoch=5, partition_epoch=5, controller_epoch=3))
    assert resp.partitions[0].error_code == pb.NONE  # a resend of the applied state
    assert rm.partitions[TP].leader_epoch == 5


async def test_isr_shrink_goes_through_controller(tmp_path):
    rm, controller = make_manager(tmp_path, **{"replica.lag.time.max.ms": "100"})
    await rm.leader_and_isr(lai())
    rm.start()
    try:
        await wait_until(lambda: rm.partitions[TP].replica.leader_isr == (1,))
        assert rm.partitions[TP].replica.leader_isr == (1,)
        assert list(controller.items[0].new_isr) == [1]
        assert rm.metrics.isr_shrinks.value == 1
        # The follower catches up and is proposed back.
        await rm.fetch(follower_fetch(0))
        await wait_until(lambda: rm.partitions[TP].replica.leader_isr == (1, 2))
        assert rm.partitions[TP].replica.leader_isr == (1, 2)
    finally:
        await rm.stop()


async def test_topic_configs_apply_to_existing_logs(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(isr=(1,), configs={"max.message.bytes": "100000"}))
    assert rm.partitions[TP].log.config.max_message_bytes == 100000
    await rm.leader_and_isr(lai(isr=(1,), partition_epoch=1,
                                configs={"max.message.bytes": "150", "min.insync.replicas": "2"}))
    assert rm.partitions[TP].log.config.max_message_bytes == 150
    out = await rm.produce(produce(acks=-1))
    assert out.partitions[0].error_code == pb.NOT_ENOUGH_REPLICAS


async def test_alter_partition_lost_answer_is_resent_and_state_applied(tmp_path):
    """The controller applies an expansion but the answer is lost: the resend's
    INVALID_UPDATE_VERSION carries the committed state, which the leader adopts."""
    rm, controller = make_manager(tmp_path)
    committed = {}

    async def flaky(items):
        it = items[0]
        controller.items.append(it)
        if not committed:
            committed["state"] = pb.PartitionState(
                topic=it.topic, partition=it.partition, leader=1, leader_epoch=it.leader_epoch,
                partition_epoch=it.partition_epoch + 1, replicas=[1, 2], isr=list(it.new_isr))
            raise ConnectionError("answer lost")
        return pb.AlterPartitionResponse(error_code=pb.NONE, items=[pb.AlterPartitionResult(
            error_code=pb.INVALID_UPDATE_VERSION, state=committed["state"])])

    rm.alter_partitions._rpc = flaky
    rm.start()  # the replication ticks resend an unanswered proposal after its backoff
    await rm.leader_and_isr(lai(isr=(1,)))
    await rm.fetch(follower_fetch(0))  # caught up: expansion proposed
    await wait_until(lambda: rm.partitions[TP].replica.leader_isr == (1, 2))
    assert rm.partitions[TP].replica.leader_isr == (1, 2)
    assert len(controller.items) == 2
    assert rm.partitions[TP].replica.leader.pending_isr is None
    assert rm.partitions[TP].replica.partition_epoch == 1
    await rm.stop()


async def test_alter_partition_fenced_keeps_proposal_until_leader_and_isr(tmp_path):
    rm, controller = make_manager(tmp_path)

    async def fenced(items):
        controller.items.extend(items)
        return pb.AlterPartitionResponse(error_code=pb.NONE, items=[pb.AlterPartitionResult(
            error_code=pb.FENCED_LEADER_EPOCH)])

    rm.alter_partitions._rpc = fenced
    await rm.leader_and_isr(lai(isr=(1,)))
    await rm.fetch(follower_fetch(0))
    await wait_until(lambda: len(controller.items) == 1)
    await asyncio.sleep(0.1)
    assert len(controller.items) == 1  # not resent, not dropped
    assert rm.partitions[TP].replica.leader.pending_isr is not None
    await rm.leader_and_isr(lai(leader=2, leader_epoch=1, partition_epoch=1))
    assert not rm.partitions[TP].is_leader
    await rm.stop()


async def test_stray_logs_deleted_only_when_the_snapshot_excludes_them(tmp_path):
    from tests.unit.test_broker_fakes import FakeLog
    from tidewater.broker.storage.log_config import LogConfig
    from tidewater.broker.storage.meta_properties import MetaProperties, write_meta_properties

    write_meta_properties(tmp_path, MetaProperties(1, CLUSTER_ID))  # its cluster, from before
    rm, _ = make_manager(tmp_path)
    kept, gone, other = TP, TopicPartition("deleted", 0), TopicPartition("elsewhere", 0)
    old_incarnation, legacy = TopicPartition("orders", 1), TopicPartition("legacy", 0)
    other_id = bytes(range(2, 18))
    for tp, topic_id in ((kept, TOPIC_ID), (gone, bytes(range(3, 19))), (other, other_id),
                         (old_incarnation, bytes(range(4, 20))), (legacy, None)):
        rm.log_manager.add_loaded(tp, FakeLog(tp, LogConfig()), topic_id)
    rm.load()

    def snapshot(partitions, cluster_id=CLUSTER_ID):
        return pb.UpdateMetadataRequest(controller_epoch=1, partitions=partitions,
                                        cluster_id=cluster_id, metadata_offset=10)

    here = [pb.PartitionState(topic=TP.topic, partition=n, leader=1, replicas=[1, 2], isr=[1, 2],
                              topic_id=TOPIC_ID) for n in (0, 1)]
    elsewhere = pb.PartitionState(topic="elsewhere", partition=0, leader=2, replicas=[2, 3],
                                  topic_id=other_id)
    legacy_here = pb.PartitionState(topic="legacy", partition=0, leader=1, replicas=[1],
                                    topic_id=bytes(range(5, 21)))
    # Another cluster's controller (its metadata wiped, say) deletes nothing, even empty.
    await rm.update_metadata(snapshot([], cluster_id="someone-else"))
    assert len(rm.log_manager.logs()) == 5
    await rm.update_metadata(snapshot([*here, elsewhere, legacy_here]))
    # Gone: a deleted topic, a replica placed elsewhere, an older incarnation of orders-1.
    # A log without an ID is judged by placement only.
    assert set(rm.log_manager.logs()) == {kept, legacy}
    assert {tp for tp, _, _ in rm.log_manager.deleted} == {gone, other, old_incarnation}
    # An empty snapshot of this cluster places nothing here.
    await rm.update_metadata(snapshot([]))
    assert rm.log_manager.logs() == {}


async def test_a_snapshot_older_than_the_leader_and_isr_never_sweeps_its_replica(tmp_path):
    rm, _ = make_manager(tmp_path)
    request = lai()
    request.metadata_offset = 20
    await rm.leader_and_isr(request)
    stale = pb.UpdateMetadataRequest(controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=19)
    await rm.update_metadata(stale)  # built before the topic existed
    assert TP in rm.partitions and rm.log_manager.deleted == []
    await rm.update_metadata(pb.UpdateMetadataRequest(controller_epoch=1, cluster_id=CLUSTER_ID,
                                                      metadata_offset=20))
    assert TP not in rm.partitions and [tp for tp, _, _ in rm.log_manager.deleted] == [TP]
    await rm.stop()


async def test_storage_error_is_answered_per_partition(tmp_path):
    from tidewater.proto.errors import KafkaStorageError

    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(isr=(1,)))
    log = rm.partitions[TP].log

    def broken(*args, **kwargs):
        raise KafkaStorageError("disk gone", path="/nowhere")

    log.read = broken
    resp = await rm.fetch(consumer_fetch(0))
    assert resp.partitions[0].error_code == pb.NONE  # nothing below the HW to read yet
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].error_code == pb.NONE
    assert rm.partitions[TP].replica.high_watermark == 1  # RF 1
    resp = await rm.fetch(consumer_fetch(0))
    assert resp.partitions[0].error_code == pb.KAFKA_STORAGE_ERROR
    log.append_as_leader = broken
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].error_code == pb.KAFKA_STORAGE_ERROR
    assert "disk gone" in out.partitions[0].error_message


async def test_a_failed_leader_append_ends_the_leadership_and_its_waits(tmp_path):
    from tidewater.proto.errors import KafkaStorageError

    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())  # ISR 1, 2: an acks=all wait needs the follower
    waiting = asyncio.create_task(rm.produce(produce(acks=-1, timeout_ms=10_000)))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)

    def broken(*args, **kwargs):
        raise KafkaStorageError("disk gone", path="/nowhere")

    rm.partitions[TP].log.append_as_leader = broken
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].error_code == pb.KAFKA_STORAGE_ERROR
    # The core decided: no role until the next LeaderAndIsr; the leadership's wait failed.
    replica = rm.partitions[TP].replica
    assert replica.leader is None and replica.follower is None
    assert (await waiting).partitions[0].error_code == pb.NOT_LEADER_OR_FOLLOWER
    resp = await rm.fetch(consumer_fetch(0))
    assert resp.partitions[0].error_code == pb.NOT_LEADER_OR_FOLLOWER


async def test_a_vanished_producer_leaves_no_waiter_behind(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())
    task = asyncio.create_task(rm.produce(produce(acks=-1, timeout_ms=10_000)))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)
    task.cancel()  # what grpc.aio does when the client goes away
    await asyncio.gather(task, return_exceptions=True)
    assert rm.acks_waits.pending() == 0
    # The record stays appended (not acknowledged); the partition keeps working.
    assert rm.partitions[TP].log.log_end_offset == 1
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].base_offset == 1


async def test_hw_checkpoint_writes_off_the_loop_and_stop_waits_for_them(tmp_path):
    rm, _ = make_manager(tmp_path, **{"log.flush.offset.checkpoint.interval.ms": "10"})
    await rm.leader_and_isr(lai())
    loop_thread = threading.get_ident()
    started, release = threading.Event(), threading.Event()
    writes = []

    def slow_checkpoint(hws):  # an fsync on a busy disk
        started.set()
        release.wait(5)
        writes.append((threading.get_ident(), dict(hws)))

    rm.log_manager.checkpoint_high_watermarks = slow_checkpoint
    rm.start()
    await asyncio.to_thread(started.wait, 5)
    # The loop still answers while the checkpoint is being written.
    response = await rm.produce(produce(acks=1))
    assert response.partitions[0].error_code == pb.NONE
    stopping = asyncio.ensure_future(rm.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()  # stop waits for the write in flight
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert writes and writes[0][0] != loop_thread
    assert writes[0][1] == {TP: 0}


async def test_rolls_and_retention_run_off_the_loop_on_snapshots_and_stop_waits(tmp_path):
    rm, _ = make_manager(tmp_path, **{"log.flush.offset.checkpoint.interval.ms": "10",
                                      "log.retention.check.interval.ms": "10"})
    await rm.leader_and_isr(lai())
    await rm.produce(produce(acks=1))
    loop_thread = threading.get_ident()
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(name):
        def run(now_ms, *snapshots):  # fsyncs and renames on a busy disk
            calls.append((name, threading.get_ident(), snapshots))
            started.set()
            release.wait(5)
            return 0
        return run

    rm.log_manager.maybe_roll_and_flush = slow("roll")
    rm.log_manager.delete_old_segments = slow("retention")
    rm.start()
    await asyncio.to_thread(started.wait, 5)
    response = await rm.produce(produce(acks=1))  # the loop still answers
    assert response.partitions[0].error_code == pb.NONE
    await wait_until(lambda: {name for name, _, _ in calls} == {"roll", "retention"})
    stopping = asyncio.ensure_future(rm.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()  # stop waits for both runs in flight
    release.set()
    await asyncio.wait_for(stopping, 5)
    by_name = {name: (thread, snapshots) for name, thread, snapshots in calls}
    assert loop_thread not in {thread for thread, _ in by_name.values()}
    log_ = rm.partitions[TP].log
    assert by_name["roll"][1] == ({TP: log_},)  # the logs, snapshotted on the loop
    hws = {TP: rm.partitions[TP].high_watermark}
    assert by_name["retention"][1] == (hws, {TP: log_})  # the HWs with their own logs


def test_record_count_matches_the_batch_framing():
    from tidewater.broker.serving.fetch import record_count
    from tidewater.proto.batch import iter_batches
    from tidewater.proto.errors import CorruptRecordError
    from tidewater.proto.records import encode_batch

    def by_headers(records: bytes) -> int:
        try:
            return sum(h.record_count for _, h in iter_batches(records, validate=False))
        except CorruptRecordError:
            return 0

    batches = b"".join(encode_batch([(None, bytes(i))] * (i % 5 + 1)) for i in range(20))
    assert record_count(batches) == sum(i % 5 + 1 for i in range(20))
    for cut in range(0, len(batches) + 1, 7):  # torn tails and short headers count 0
        assert record_count(batches[:cut]) == by_headers(batches[:cut])
    assert record_count(batches + bytes(61)) == 0  # a zero batchLength is broken framing


async def test_a_failed_epoch_checkpoint_write_leaves_no_leader_behind(tmp_path):
    # A new leader's epoch must be in the (fsynced) epoch cache before it serves anything:
    # when that write fails the partition answers KAFKA_STORAGE_ERROR and plays no part.
    from tidewater.proto.errors import KafkaStorageError

    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(leader=2, leader_epoch=0))  # a follower first
    log = rm.partitions[TP].log
    cache = log.leader_epoch_cache
    assign = cache.assign

    def disk_full(epoch, start_offset):
        raise KafkaStorageError("no space left on device", path="/data/leader-epoch-checkpoint")

    cache.assign = disk_full
    resp = await rm.leader_and_isr(lai(leader=1, leader_epoch=1, partition_epoch=1))
    assert resp.partitions[0].error_code == pb.KAFKA_STORAGE_ERROR
    assert not rm.partitions[TP].is_leader and rm.fetchers.following(TP) is None
    out = await rm.produce(produce(acks=1))
    assert out.partitions[0].error_code == pb.NOT_LEADER_OR_FOLLOWER
    assert log.log_end_offset == 0
    # The disk is back: the controller's next state (a resend) makes it the leader.
    cache.assign = assign
    resp = await rm.leader_and_isr(lai(leader=1, leader_epoch=1, partition_epoch=1))
    assert resp.partitions[0].error_code == pb.NONE and rm.partitions[TP].is_leader
    assert cache.entries()[-1] == (1, 0)
    await rm.stop()


async def serve(rm, servicer=None, control=None):
    """``rm`` behind a real gRPC server on a free port, as an INTERNAL listener (the
    broker's own servicers unless ``servicer`` / ``control``); returns (server, port):
    stop it with ``await server.stop(0)``."""
    from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
    from tidewater.broker.servicers.grpc_server import (
        BrokerControlServicer,
        BrokerServicer,
        build_server,
    )

    server, port = build_server(
        host="127.0.0.1", port=0,
        servicer=servicer or BrokerServicer(rm, rm.metadata_cache, rm.metrics, "INTERNAL"),
        controller_servicer=ControllerForwarder(None), max_message_bytes=1 << 20,
        control_servicer=control or BrokerControlServicer(rm, rm.metrics))
    await server.start()
    return server, port


async def test_delete_records_moves_the_leaders_log_start_once_checkpointed(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai(isr=(1,)))  # alone in the ISR: the HW is the LEO
    await rm.produce(produce(acks=1, records=make_batch(4)))
    log_manager = rm.log_manager
    results = await rm.delete_records([(TP.topic, 0, 2), (TP.topic, 0, 5), ("nowhere", 0, 1)],
                                   1000)
    assert [(r.low_watermark, r.error_code) for r in results] == [
        (2, pb.NONE), (-1, pb.OFFSET_OUT_OF_RANGE), (-1, pb.UNKNOWN_TOPIC_OR_PARTITION)]
    assert log_manager.log_starts_checkpointed == {TP: 2}  # durable before the answer
    [result] = await rm.delete_records([(TP.topic, 0, -1)], 1000)  # the HW
    assert (result.low_watermark, result.error_code) == (4, pb.NONE)
    out = await rm.fetch(consumer_fetch(1))
    assert out.partitions[0].error_code == pb.OFFSET_OUT_OF_RANGE

    await rm.leader_and_isr(lai(isr=(1,), leader_epoch=1, partition_epoch=1,
                                configs={"cleanup.policy": "compact"}))
    [result] = await rm.delete_records([(TP.topic, 0, 4)], 1000)
    assert result.error_code == pb.POLICY_VIOLATION

    await rm.leader_and_isr(lai(leader=2, leader_epoch=2, partition_epoch=2))
    [result] = await rm.delete_records([(TP.topic, 0, 4)], 1000)
    assert result.error_code == pb.NOT_LEADER_OR_FOLLOWER
    await rm.stop()


async def test_delete_records_answers_once_the_isr_followers_log_starts_reached_it(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(lai())  # follower 2 in the ISR
    await rm.produce(produce(acks=1, records=make_batch(4)))
    await rm.fetch(follower_fetch(4))  # the HW is 4
    answer = asyncio.ensure_future(rm.delete_records([(TP.topic, 0, 3)], 5000))
    await asyncio.sleep(0.05)
    assert not answer.done()  # follower 2's log start is not known to be 3 yet
    request = follower_fetch(4)
    request.partitions[0].log_start_offset = 3
    await rm.fetch(request)
    [result] = await asyncio.wait_for(answer, 5)
    assert (result.low_watermark, result.error_code) == (3, pb.NONE)
    [late] = await rm.delete_records([(TP.topic, 0, 4)], 50)  # never reached: timed out
    assert late.error_code == pb.REQUEST_TIMED_OUT
    await rm.stop()


async def test_a_large_leader_and_isr_lets_the_event_loop_run_between_slices(tmp_path):
    """Hosting hundreds of partitions at once must not hold the event loop (heartbeats
    would stop and the broker be fenced, and every other request wait): the new logs are
    made in a worker thread while a task runs, then the request is applied a slice at a
    time, and every partition is answered and hosted, in order."""
    from tidewater.broker.replicas.replica_manager import LEADER_AND_ISR_SLICE_PARTITIONS
    rm, _ = make_manager(tmp_path)
    count = 3 * LEADER_AND_ISR_SLICE_PARTITIONS + 5
    request = lai()
    template = request.partitions[0]
    del request.partitions[:]
    for p in range(count):
        item = request.partitions.add()
        item.CopyFrom(template)
        item.state.partition = p
    hosted_when_ticked: list[int] = []
    logs_when_ticked: list[int] = []
    create_log = rm.log_manager.get_or_create

    def slow_create(*args, **kwargs):  # a real log's files and fsyncs take milliseconds
        time.sleep(0.002)
        return create_log(*args, **kwargs)

    rm.log_manager.get_or_create = slow_create

    async def ticker():
        while True:
            hosted_when_ticked.append(len(rm.partitions))
            logs_when_ticked.append(len(rm.log_manager.logs()))
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    response = await rm.leader_and_isr(request)
    ticking.cancel()
    assert response.error_code == pb.NONE
    assert [p.partition for p in response.partitions] == list(range(count))
    assert all(p.error_code == pb.NONE for p in response.partitions)
    assert len(rm.partitions) == count
    # The ticker ran while the logs were made, before any partition was hosted.
    made_between = {logs for hosted, logs in zip(hosted_when_ticked, logs_when_ticked,
                                                  strict=True) if hosted == 0 and 0 < logs < count}
    assert len(made_between) >= 3
    # And between the slices that host them, at most LEADER_AND_ISR_SLICE_PARTITIONS new
    # ones in each, although their logs exist by then.
    hosted_between = sorted({hosted for hosted in hosted_when_ticked if 0 < hosted < count})
    assert hosted_between == [LEADER_AND_ISR_SLICE_PARTITIONS * k for k in (1, 2, 3)]
    # New epochs for partitions already hosted (a restart's) cost one epoch write each:
    # up to LEADER_AND_ISR_SLICE_COST of them go in one slice.
    from tidewater.broker.replicas.replica_manager import LEADER_AND_ISR_SLICE_COST
    again = pb.LeaderAndIsrRequest()
    again.CopyFrom(request)
    for item in again.partitions:
        item.state.leader_epoch += 1
        item.is_new = False
    assert count <= LEADER_AND_ISR_SLICE_COST
    assert rm._leader_and_isr_slices(again) == [(0, count)]
    response = await rm.leader_and_isr(again)
    assert response.error_code == pb.NONE and len(response.partitions) == count
    assert all(p.error_code == pb.NONE for p in response.partitions)
    assert all(rm.partitions[TopicPartition(TP.topic, p)].leader_epoch == 1
               for p in range(count))
    # Mixed: a new partition costs as much as four hosted ones; slices follow each other,
    # each within the cost, at most LEADER_AND_ISR_SLICE_PARTITIONS new ones in one.
    mixed = pb.LeaderAndIsrRequest()
    mixed.CopyFrom(again)
    for p in range(count, count + 40):
        item = mixed.partitions.add()
        item.CopyFrom(template)
        item.state.partition = p
    bounds = rm._leader_and_isr_slices(mixed)
    assert bounds[0][0] == 0 and bounds[-1][1] == count + 40
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    for start, end in bounds:
        new = sum(1 for i in range(start, end) if i >= count)
        assert new <= LEADER_AND_ISR_SLICE_PARTITIONS
        assert (end - start - new) + 4 * new <= LEADER_AND_ISR_SLICE_COST
    assert bounds[:2] == [(0, count + 2), (count + 2, count + 18)]
    # A refused request is refused whole, before anything is applied.
    stale = pb.LeaderAndIsrRequest()
    stale.CopyFrom(request)
    stale.controller_epoch = 0
    for item in stale.partitions:
        item.state.topic = "other"
    refused = await rm.leader_and_isr(stale)
    assert refused.error_code != pb.NONE and not refused.partitions
    assert not any(tp.topic == "other" for tp in rm.partitions)
    assert not any(tp.topic == "other" for tp in rm.log_manager.logs())  # no file made



async def test_a_log_the_full_disk_cannot_make_is_answered_and_made_on_the_next_request(
        tmp_path, caplog):
    """The worker thread's creation fails (ENOSPC on every fsync), the apply tries once
    more and answers the partition KAFKA_STORAGE_ERROR; nothing is hosted. With room
    again, the controller's next LeaderAndIsr hosts it, in the directory left behind."""
    import errno
    from unittest import mock

    from tidewater.broker.storage.log_config import LogConfig
    from tidewater.broker.storage.log_manager import LogManager

    log_manager = LogManager(tmp_path / "data", LogConfig())
    log_manager.load(0)
    rm, _ = make_manager(tmp_path, log_manager=log_manager)
    create_log = log_manager.get_or_create
    attempts: list[TopicPartition] = []

    def counted(tp, *args, **kwargs):
        attempts.append(tp)
        return create_log(tp, *args, **kwargs)

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    log_manager.get_or_create = counted
    with mock.patch("os.fsync", disk_full):
        out = await rm.leader_and_isr(lai())
    assert out.error_code == pb.NONE
    assert out.partitions[0].error_code == pb.KAFKA_STORAGE_ERROR
    assert "No space left" in out.partitions[0].error_message
    assert attempts == [TP, TP]  # ahead, in the worker thread; then in the apply
    assert TP not in rm.partitions and log_manager.get(TP) is None
    assert "ahead of its LeaderAndIsr" in caplog.text
    out = await rm.leader_and_isr(lai())
    assert out.partitions[0].error_code == pb.NONE
    assert len(attempts) == 3 and rm.partitions[TP].replica.leader_epoch == 0
    assert (await rm.produce(produce(acks=1))).partitions[0].error_code == pb.NONE
    await rm.stop()
    log_manager.shutdown()


async def test_a_topics_deletion_is_made_durable_once_and_its_failure_answered(
        tmp_path, monkeypatch):
    """A StopReplica deleting a topic's partitions fsyncs the data dir once for them all,
    in a worker thread while the loop serves; when that fsync fails, every partition it
    moved is answered KAFKA_STORAGE_ERROR."""
    from tidewater.broker.storage import log_manager as log_manager_module
    from tidewater.broker.storage.log_config import LogConfig
    from tidewater.broker.storage.log_manager import LogManager
    from tidewater.proto.errors import KafkaStorageError

    log_manager = LogManager(tmp_path / "data", LogConfig())
    log_manager.load(0)
    rm, _ = make_manager(tmp_path, log_manager=log_manager)
    request = lai()
    template = request.partitions[0]
    del request.partitions[:]
    for p in range(6):
        item = request.partitions.add()
        item.CopyFrom(template)
        item.state.partition = p
    assert all(p.error_code == pb.NONE for p in (await rm.leader_and_isr(request)).partitions)

    def stop(partitions):
        return pb.StopReplicaRequest(
            controller_epoch=1, broker_epoch=7, delete_partitions=True, cluster_id=CLUSTER_ID,
            partitions=[pb.PartitionState(topic=TP.topic, partition=p, leader_epoch=-1,
                                          topic_id=TOPIC_ID) for p in partitions])

    fsyncs: list = []
    real_fsync_dir = log_manager_module.fsync_dir
    loop_thread = threading.current_thread()

    def slow_fsync_dir(directory):  # a slow disk's, off the loop: the loop serves meanwhile
        fsyncs.append((directory, threading.current_thread() is loop_thread))
        time.sleep(0.05)
        real_fsync_dir(directory)

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(log_manager_module, "fsync_dir", slow_fsync_dir)
    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ticks_before = ticks
    out = await rm.stop_replica(stop(range(3)))
    ticking.cancel()
    assert [p.error_code for p in out.partitions] == [pb.NONE] * 3
    assert fsyncs == [(tmp_path / "data", False)]
    assert ticks - ticks_before > 5  # it ran while the data dir was fsynced
    assert sorted(tp.partition for tp in rm.partitions) == [3, 4, 5]

    def broken_fsync_dir(directory):
        raise KafkaStorageError("cannot fsync directory: Input/output error", path=str(directory))

    monkeypatch.setattr(log_manager_module, "fsync_dir", broken_fsync_dir)
    out = await rm.stop_replica(stop(range(3, 6)))
    assert [p.error_code for p in out.partitions] == [pb.KAFKA_STORAGE_ERROR] * 3
    assert all("Input/output error" in p.error_message for p in out.partitions)
    assert rm.partitions == {} and log_manager.logs() == {}
    await rm.stop()
    log_manager.shutdown()


async def test_the_cleaner_is_made_in_a_worker_thread_not_on_the_loop(tmp_path, monkeypatch):
    """The cleaner's modules are imported and it is made in a worker thread: by
    ``make_cleaner`` (the broker calls it once settled after serving) or else by the
    first pass. On the loop, at the first pass, every broker started together stopped
    serving for that long at once, one log.cleaner.backoff.ms after its start."""
    from tidewater.broker.storage import cleaner as cleaner_module
    from tidewater.broker.storage.log_config import LogConfig
    from tidewater.broker.storage.log_manager import LogManager

    made_in: list[threading.Thread] = []
    real_init = cleaner_module.LogCleaner.__init__

    def recorded_init(self, *args, **kwargs):
        made_in.append(threading.current_thread())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(cleaner_module.LogCleaner, "__init__", recorded_init)
    log_manager = LogManager(tmp_path / "data", LogConfig())
    log_manager.load(0)
    rm, _ = make_manager(tmp_path, log_manager=log_manager, **{"log.cleaner.backoff.ms": "20"})
    await rm.leader_and_isr(lai(isr=(1,), configs={"cleanup.policy": "compact"}))
    rm.start()
    await wait_until(lambda: rm.background.cleaner is not None)
    first = rm.background.cleaner
    await rm.background.make_cleaner()  # made already: the same one
    assert rm.background.cleaner is first
    await rm.stop()
    log_manager.shutdown()
    assert rm.supervisor.failure is None
    assert len(made_in) == 1 and made_in[0] is not threading.current_thread()
    # What the broker does once it has settled after serving: made before the first pass,
    # in a worker thread too.
    rm, _ = make_manager(tmp_path / "b", **{"log.cleaner.backoff.ms": "60000"})
    await rm.background.make_cleaner()
    assert rm.background.cleaner is not None
    assert len(made_in) == 2 and made_in[1] is not threading.current_thread()
    await rm.stop()
