"""Topic IDs on the broker: the pure decisions (tables) and the ReplicaManager performing them."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_broker_fakes import FakeLog, make_batch
from tests.unit.test_broker_replica_manager import (
    CLUSTER_ID,
    TOPIC_ID,
    TP,
    consumer_fetch,
    follower_fetch,
    lai,
    make_manager,
    produce,
    wait_until,
)
from tidewater.broker.replication.topic_identity import (
    ClusterCheck,
    IdentityAction,
    cluster_id_decision,
    fetch_topic_id_error,
    is_stray,
    log_identity_action,
    stop_replica_error,
    told_id_conflict,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.meta_properties import MetaProperties, write_meta_properties
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb

X, Y, Z = bytes(range(1, 17)), bytes(range(2, 18)), bytes(range(3, 19))
assert X == TOPIC_ID
OTHER_CLUSTER = "another-cluster"

# ---------------------------------------------------------------- pure decisions


@pytest.mark.parametrize("local,told,has_log,trusted,action", [
    (None, X, False, True, IdentityAction.CREATE),
    (None, X, False, False, IdentityAction.CREATE),  # nothing to lose: any cluster may create
    (X, X, True, True, IdentityAction.KEEP),
    (X, X, True, False, IdentityAction.KEEP),
    (None, X, True, True, IdentityAction.ADOPT),
    (None, X, True, False, IdentityAction.REFUSE),
    (Y, X, True, True, IdentityAction.REPLACE),
    (Y, X, True, False, IdentityAction.REFUSE),
])
def test_log_identity_action_table(local, told, has_log, trusted, action):
    assert log_identity_action(local, told, has_log=has_log, trusted=trusted) is action


@pytest.mark.parametrize("stored,told,check", [
    (None, "", ClusterCheck.UNKNOWN), ("c", "", ClusterCheck.UNKNOWN),
    (None, "c", ClusterCheck.ADOPT), ("c", "c", ClusterCheck.MATCH),
    ("c", "d", ClusterCheck.MISMATCH),
])
def test_cluster_id_decision_table(stored, told, check):
    assert cluster_id_decision(stored, told) is check


def test_told_id_conflict():
    names = {X: "orders", Y: "payments"}
    assert told_id_conflict("orders", X, names) is None
    assert told_id_conflict("orders", Z, names) is None  # unknown: a new incarnation
    assert told_id_conflict("orders", Y, names) == "payments"


@pytest.mark.parametrize("tp,local,stray", [
    (TopicPartition("orders", 0), X, False),
    (TopicPartition("orders", 0), Y, True),        # an older incarnation
    (TopicPartition("orders", 0), None, False),    # no ID: placement only
    (TopicPartition("orders", 1), X, True),        # not placed here
    (TopicPartition("orders", 1), None, True),
    (TopicPartition("deleted", 0), Z, True),
])
def test_is_stray_table(tp, local, stray):
    topic_ids = {"orders": X, "other": Y}
    placed_here = {("orders", 0), ("other", 0)}
    assert is_stray(tp, local, topic_ids=topic_ids, placed_here=placed_here) is stray


def test_is_stray_with_an_empty_snapshot_places_nothing_here():
    assert is_stray(TopicPartition("orders", 0), X, topic_ids={}, placed_here=set())


@pytest.mark.parametrize("local,told,trusted,code", [
    (X, X, True, None),
    (X, X, False, pb.INCONSISTENT_CLUSTER_ID),
    (X, Y, True, pb.INCONSISTENT_TOPIC_ID),
    (X, b"", True, pb.INCONSISTENT_TOPIC_ID),  # a stop recorded before IDs: not for this log
    (None, X, True, None),
    (None, b"", True, None),
])
def test_stop_replica_error_table(local, told, trusted, code):
    error = stop_replica_error(local, told, trusted=trusted)
    assert (error[0] if error else None) == code


@pytest.mark.parametrize("request_id,known,code", [
    (b"", False, None), (X, False, None),
    (Y, True, pb.INCONSISTENT_TOPIC_ID), (Y, False, pb.UNKNOWN_TOPIC_ID),
    (b"x" * 15, False, pb.INVALID_REQUEST), (b"x" * 17, True, pb.INVALID_REQUEST),
])
def test_fetch_topic_id_error_table(request_id, known, code):
    error = fetch_topic_id_error(request_id, X, lambda _: known)
    assert (error[0] if error else None) == code


# ---------------------------------------------------------------- the replica manager


def codes(response) -> list[int]:
    return [p.error_code for p in response.partitions]


def trusting(tmp_path):
    """A broker whose data dir already belongs to CLUSTER_ID."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_meta_properties(tmp_path, MetaProperties(1, CLUSTER_ID))
    return make_manager(tmp_path)[0]


def loaded(rm, tp, topic_id, records=3):
    log = FakeLog(tp, LogConfig())
    for _ in range(records):
        log.append_as_leader(make_batch(1), 0, 0)
    rm.log_manager.add_loaded(tp, log, topic_id)
    rm.log_manager.checkpointed[tp] = records
    return log


async def test_a_new_incarnation_replaces_the_hosted_replica_and_answers_its_waiters(tmp_path):
    rm = trusting(tmp_path)
    await rm.leader_and_isr(lai(leader_epoch=5, partition_epoch=7))
    old = rm.partitions[TP]
    assert (await rm.produce(produce(acks=1, records=make_batch(4)))).partitions[0].base_offset == 0
    waiting = asyncio.create_task(rm.produce(produce(acks=-1)))
    await wait_until(lambda: rm.partitions[TP].replica.waiting == 1)

    # Re-created: epochs start again at 0, the ID is new.
    response = await rm.leader_and_isr(lai(topic_id=Y))
    assert codes(response) == [pb.NONE]
    new = rm.partitions[TP]
    assert new is not old and new.topic_id == Y and new.is_leader
    assert new.log_end_offset == 0 and new.high_watermark == 0
    assert rm.log_manager.topic_id(TP) == Y
    assert [(tp, topic_id) for tp, _, topic_id in rm.log_manager.deleted] == [(TP, X)]
    assert not old.is_leader
    answer = await asyncio.wait_for(waiting, 5)
    assert answer.partitions[0].error_code == pb.NOT_LEADER_OR_FOLLOWER
    await rm.stop()


async def test_loaded_logs_are_kept_adopted_or_replaced_by_their_id(tmp_path):
    rm = trusting(tmp_path)
    same, legacy, older = TopicPartition("orders", 0), TopicPartition("legacy", 0), \
        TopicPartition("reborn", 0)
    loaded(rm, same, X)
    loaded(rm, legacy, None)
    loaded(rm, older, Z)
    rm.load()
    for tp, topic_id in ((same, X), (legacy, Y), (older, bytes(range(9, 25)))):
        request = lai(topic_id=topic_id)
        request.partitions[0].state.topic, request.partitions[0].state.partition = tp
        assert codes(await rm.leader_and_isr(request)) == [pb.NONE]
    assert rm.partitions[same].log_end_offset == 3 and rm.partitions[same].high_watermark == 3
    assert rm.partitions[legacy].log_end_offset == 3 and rm.log_manager.topic_id(legacy) == Y
    assert rm.partitions[older].log_end_offset == 0  # the old incarnation's records are gone
    assert rm.partitions[older].high_watermark == 0
    assert [tp for tp, _, _ in rm.log_manager.deleted] == [older]
    await rm.stop()


@pytest.mark.parametrize("topic_id", [b"", b"x" * 15, b"x" * 17, bytes(16), bytes(15) + b"\x01"])
async def test_a_malformed_topic_id_is_refused_and_changes_nothing(tmp_path, topic_id):
    rm = trusting(tmp_path)
    loaded(rm, TP, Z)
    rm.load()
    response = await rm.leader_and_isr(lai(topic_id=topic_id))
    assert codes(response) == [pb.INVALID_REQUEST]
    assert TP not in rm.partitions and rm.log_manager.deleted == []
    assert rm.log_manager.topic_id(TP) == Z


async def test_another_topics_id_is_refused_and_nothing_current_is_deleted(tmp_path):
    rm = trusting(tmp_path)
    await rm.leader_and_isr(lai())
    assert (await rm.produce(produce(acks=1, records=make_batch(2)))).partitions[0].base_offset == 0
    # payments' ID, known from a hosted replica ...
    payments = lai(topic_id=Y)
    payments.partitions[0].state.topic = "payments"
    assert codes(await rm.leader_and_isr(payments)) == [pb.NONE]
    forged = lai(leader_epoch=9, topic_id=Y)
    response = await rm.leader_and_isr(forged)
    assert codes(response) == [pb.INCONSISTENT_TOPIC_ID]
    assert "payments" in response.partitions[0].error_message
    # ... or from the last metadata snapshot only.
    await rm.update_metadata(pb.UpdateMetadataRequest(
        controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=0, partitions=[
            pb.PartitionState(topic=t, partition=0, leader=1, replicas=[1, 2], isr=[1, 2],
                              topic_id=i) for t, i in (("orders", X), ("payments", Y),
                                                       ("invoices", Z))]))
    assert codes(await rm.leader_and_isr(lai(leader_epoch=9, topic_id=Z))) == [
        pb.INCONSISTENT_TOPIC_ID]
    partition = rm.partitions[TP]
    assert partition.topic_id == X and partition.log_end_offset == 2 and partition.is_leader
    assert partition.leader_epoch == 0 and rm.log_manager.deleted == []
    await rm.stop()


async def test_another_clusters_controller_replaces_and_adopts_nothing(tmp_path):
    rm = trusting(tmp_path)
    loaded(rm, TP, Z)
    legacy = TopicPartition("legacy", 0)
    loaded(rm, legacy, None)
    rm.load()
    foreign = lai()
    foreign.cluster_id = OTHER_CLUSTER
    assert codes(await rm.leader_and_isr(foreign)) == [pb.INCONSISTENT_CLUSTER_ID]
    foreign.partitions[0].state.topic = "legacy"
    assert codes(await rm.leader_and_isr(foreign)) == [pb.INCONSISTENT_CLUSTER_ID]
    assert rm.log_manager.deleted == [] and rm.log_manager.topic_id(legacy) is None
    await rm.update_metadata(pb.UpdateMetadataRequest(controller_epoch=1, cluster_id=OTHER_CLUSTER,
                                                      metadata_offset=99))
    assert rm.log_manager.deleted == [] and len(rm.log_manager.logs()) == 2
    stop = pb.StopReplicaRequest(controller_epoch=1, broker_epoch=7, delete_partitions=True,
                                 cluster_id=OTHER_CLUSTER, partitions=[pb.PartitionState(
                                     topic=TP.topic, partition=0, leader_epoch=-1, topic_id=Z)])
    assert codes(await rm.stop_replica(stop)) == [pb.INCONSISTENT_CLUSTER_ID]
    # A partition it does not have yet is created: nothing is lost by that.
    new = lai()
    new.cluster_id = OTHER_CLUSTER
    new.partitions[0].state.topic = "brand-new"
    assert codes(await rm.leader_and_isr(new)) == [pb.NONE]
    assert rm.log_manager.deleted == []
    assert rm.cluster_identity.cluster_id == CLUSTER_ID  # meta.properties is not rewritten
    await rm.stop()


async def test_the_first_cluster_id_heard_is_recorded_in_meta_properties(tmp_path):
    from tidewater.broker.storage.meta_properties import read_meta_properties

    rm, _ = make_manager(tmp_path)
    assert read_meta_properties(tmp_path) is None
    await rm.leader_and_isr(lai())
    assert read_meta_properties(tmp_path) == MetaProperties(1, CLUSTER_ID)
    await rm.stop()


async def test_fetches_naming_another_incarnation_are_refused(tmp_path):
    rm = trusting(tmp_path)
    await rm.leader_and_isr(lai(isr=(1,)))
    await rm.produce(produce(acks=1, records=make_batch(2)))
    await rm.update_metadata(pb.UpdateMetadataRequest(
        controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=0, partitions=[
            pb.PartitionState(topic=t, partition=0, leader=1, replicas=[1, 2], isr=[1],
                              topic_id=i) for t, i in (("orders", X), ("payments", Y))]))

    async def fetch(request, topic_id):
        request.partitions[0].topic_id = topic_id
        return (await rm.fetch(request)).partitions[0]

    for make in (lambda: follower_fetch(0), lambda: consumer_fetch(0)):
        assert (await fetch(make(), X)).records  # its own ID, and none, are served
        assert (await fetch(make(), b"")).records
        for topic_id, code in ((Y, pb.INCONSISTENT_TOPIC_ID), (Z, pb.UNKNOWN_TOPIC_ID),
                               (b"x" * 15, pb.INVALID_REQUEST)):
            answer = await fetch(make(), topic_id)
            assert answer.error_code == code and answer.records == b"", (topic_id, answer)
    assert rm.partitions[TP].log_end_offset == 2 and rm.log_manager.deleted == []
    await rm.stop()


async def test_offset_for_leader_epoch_answers_only_for_the_incarnation_it_names(tmp_path):
    """A leader still holding another incarnation of the name must not answer the follower
    of the new one from the old one's epochs: FENCED_LEADER_EPOCH would park that follower
    until its next LeaderAndIsr, which may never come (simulation seed 48 found it)."""
    rm = trusting(tmp_path)
    await rm.leader_and_isr(lai(leader_epoch=5, isr=(1,)))
    await rm.produce(produce(acks=1, records=make_batch(2)))
    await rm.update_metadata(pb.UpdateMetadataRequest(
        controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=0, partitions=[
            pb.PartitionState(topic=t, partition=0, leader=1, replicas=[1, 2], isr=[1],
                              topic_id=i) for t, i in (("orders", X), ("payments", Y))]))

    def ask(topic_id):
        return rm.offset_for_leader_epoch(pb.OffsetForLeaderEpochRequest(
            replica_id=2, partitions=[pb.OffsetForLeaderEpochPartition(
                topic=TP.topic, partition=0, current_leader_epoch=0, leader_epoch=0,
                topic_id=topic_id)])).partitions[0].error_code

    # The follower of a new incarnation is in its epoch 0: the old one's epoch 5 fences it
    # only when no incarnation is named (older followers).
    assert ask(b"") == pb.FENCED_LEADER_EPOCH
    assert ask(X) == pb.FENCED_LEADER_EPOCH
    assert ask(Z) == pb.UNKNOWN_TOPIC_ID
    assert ask(Y) == pb.INCONSISTENT_TOPIC_ID
    await rm.stop()


async def test_stop_replica_deletes_only_the_incarnation_it_names(tmp_path):
    rm = trusting(tmp_path)
    await rm.leader_and_isr(lai())

    def stop(topic_id):
        return pb.StopReplicaRequest(controller_epoch=1, broker_epoch=7, delete_partitions=True,
                                     cluster_id=CLUSTER_ID, partitions=[pb.PartitionState(
                                         topic=TP.topic, partition=0, leader_epoch=-1,
                                         topic_id=topic_id)])

    for topic_id, code in ((Y, pb.INCONSISTENT_TOPIC_ID), (b"", pb.INCONSISTENT_TOPIC_ID),
                           (b"short", pb.INVALID_REQUEST)):
        assert codes(await rm.stop_replica(stop(topic_id))) == [code]
        assert TP in rm.partitions and rm.partitions[TP].is_leader
    assert rm.log_manager.deleted == []
    assert codes(await rm.stop_replica(stop(X))) == [pb.NONE]
    assert TP not in rm.partitions and [tp for tp, _, _ in rm.log_manager.deleted] == [TP]
    await rm.stop()


async def test_start_up_sweep_on_real_logs_whatever_the_snapshot_holds(tmp_path):
    """Logs on disk from an earlier life; the first snapshot after registering (here empty:
    the topic was deleted meanwhile) moves them aside, and they are removed in the
    background. Until then they are no partitions: nothing serves them."""
    data_dir = tmp_path / "broker"
    data_dir.mkdir()
    write_meta_properties(data_dir, MetaProperties(1, CLUSTER_ID))
    manager = LogManager(data_dir, LogConfig())
    manager.load(now_ms=0)
    log = manager.get_or_create(TP, LogConfig(), now_ms=0, topic_id=X)
    log.append_as_leader(make_batch(3), leader_epoch=0, now_ms=0)
    manager.shutdown()

    manager = LogManager(data_dir, LogConfig())
    manager.load(now_ms=0)
    rm, _ = make_manager(data_dir, log_manager=manager)
    rm.load()
    assert rm.partitions == {}
    assert (await rm.fetch(consumer_fetch(0))).partitions[0].error_code == \
        pb.UNKNOWN_TOPIC_OR_PARTITION
    await rm.update_metadata(pb.UpdateMetadataRequest(controller_epoch=1, cluster_id=CLUSTER_ID,
                                                      metadata_offset=50))
    assert manager.logs() == {}
    assert manager.deleter.wait_idle(10)
    assert [p.name for p in data_dir.iterdir() if p.is_dir()] == []
    # Re-created: a fresh, empty log with the new ID.
    assert codes(await rm.leader_and_isr(lai(topic_id=Y))) == [pb.NONE]
    assert rm.partitions[TP].log_end_offset == 0 and manager.topic_id(TP) == Y
    await rm.stop()
    manager.shutdown()


def test_metadata_answers_carry_the_topic_id():
    from tidewater.broker.replicas.metadata_cache import MetadataCache

    cache = MetadataCache()
    cache.update(pb.UpdateMetadataRequest(controller_epoch=1, partitions=[
        pb.PartitionState(topic="orders", partition=n, leader=1, replicas=[1], isr=[1],
                          topic_id=X) for n in (0, 1)]))
    response = cache.metadata_response(["orders", "missing"], "INTERNAL")
    assert [(t.name, t.topic_id) for t in response.topics] == [("orders", X), ("missing", b"")]
    assert cache.topic_id("orders") == X and cache.topic_names_by_id() == {X: "orders"}
