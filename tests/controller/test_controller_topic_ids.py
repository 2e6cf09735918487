"""Topic IDs on the controller: made at creation, durable, carried in every request."""

import pytest
from controller_harness import Harness

from tidewater.controller import requests
from tidewater.controller.metadata import ClusterMetadata, legacy_topic_id
from tidewater.controller.metadata_log import MetadataLog
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import CorruptFileError
from tidewater.proto.topic_id import topic_id_to_text


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    for b in (1, 2, 3):
        assert harness.register(b).error_code == pb.NONE
    yield harness
    harness.log.close()


def restarted(h):
    epochs = h.epochs
    h = h.restart()
    h.epochs = epochs
    return h


def ids_by_topic(h) -> dict[str, bytes]:
    return {name: info.topic_id for name, info in h.metadata.topics.items()}


def test_each_incarnation_gets_its_own_id_in_every_request(h):
    first = h.create("orders", partitions=2, rf=3)
    assert first.error_code == pb.NONE and len(first.topic_id) == 16
    assert {p.topic_id for p in h.metadata.topics["orders"].partitions.values()} == {
        first.topic_id}
    p = h.partition("orders")
    lai = requests.leader_and_isr(h.metadata, 0, 1, [(p, True)])
    assert lai.partitions[0].state.topic_id == first.topic_id
    assert lai.cluster_id == h.metadata.cluster_id and lai.metadata_offset == h.metadata.last_offset
    um = requests.update_metadata(h.metadata, 0, 1)
    assert {s.topic_id for s in um.partitions} == {first.topic_id}
    assert um.metadata_offset == h.metadata.last_offset
    described = h.run(h.machine.describe_cluster, pb.DescribeClusterRequest())
    assert described.topics[0].topic_id == first.topic_id
    # An ISR change keeps the ID.
    leader = p.leader
    h.alter(leader, p, [leader])
    assert h.partition("orders").topic_id == first.topic_id

    deleted = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["orders"]))
    assert deleted.topics[0].topic_id == first.topic_id
    second = h.create("orders", partitions=2, rf=3)
    assert len(second.topic_id) == 16 and second.topic_id != first.topic_id


def test_validate_only_makes_no_id(h):
    assert h.create("dry", validate_only=True).topic_id == b""
    assert "dry" not in h.metadata.topics


def test_ids_survive_restart_and_compaction(h):
    for name in ("a", "b", "c"):
        h.create(name, partitions=2, rf=2)
    before = ids_by_topic(h)
    h = restarted(h)
    assert ids_by_topic(h) == before
    h.log.rewrite(h.metadata.snapshot_records())  # what compaction writes
    h = restarted(h)
    assert ids_by_topic(h) == before
    assert {p.topic_id for p in h.metadata.all_partitions()} == set(before.values())
    h.create("d")
    assert len(set(ids_by_topic(h).values())) == 4


def test_legacy_topic_created_record_gets_a_stable_id(tmp_path):
    """A log written before topic IDs: replay gives the topic the same ID every time,
    unique per incarnation, and compaction then writes it down."""
    log = MetadataLog.open(tmp_path / "ctl")
    legacy = {"type": "topic_created", "name": "old", "configs": {},
              "partitions": [{"partition": 0, "replicas": [1], "isr": [1], "leader": 1}]}
    log.append([{"type": "cluster", "cluster_id": "c1"}, legacy,
                {"type": "topic_deleted", "name": "old"}, legacy])
    log.close()
    h = Harness(tmp_path / "ctl")
    expected = legacy_topic_id("c1", "old", 3)  # the second incarnation's record offset
    assert ids_by_topic(h) == {"old": expected}
    assert expected != legacy_topic_id("c1", "old", 1)  # the deleted incarnation's
    h = h.restart()
    assert ids_by_topic(h) == {"old": expected}
    h.log.rewrite(h.metadata.snapshot_records())
    h = h.restart()
    assert ids_by_topic(h) == {"old": expected}
    h.log.close()


@pytest.mark.parametrize("topic_id", ["short", "AAAAAAAAAAAAAAAAAAAAAA", "!" * 22])
def test_bad_or_reserved_id_in_a_record_is_corruption(topic_id):
    metadata = ClusterMetadata()
    metadata.apply(0, {"type": "cluster", "cluster_id": "c1"})
    with pytest.raises(CorruptFileError):
        metadata.apply(1, {"type": "topic_created", "name": "t", "topic_id": topic_id,
                           "configs": {}, "partitions": []})


def test_two_topics_with_one_id_is_corruption():
    metadata = ClusterMetadata()
    record = {"type": "topic_created", "name": "t", "topic_id": topic_id_to_text(b"x" * 16),
              "configs": {}, "partitions": []}
    metadata.apply(0, record)
    with pytest.raises(CorruptFileError, match="taken"):
        metadata.apply(1, {**record, "name": "u"})


def test_ids_come_from_the_machines_uuid_source():
    """The simulation's seam: cluster and topic IDs from an injected uuid4 (one seed, one
    run), never a reserved topic ID (the all-zero one is skipped)."""
    import random
    import uuid

    from tidewater.controller.config import ControllerConfig
    from tidewater.controller.state_machine import ControllerStateMachine, Tx

    def run(command, m, *args):
        return command(Tx(m.metadata, m.metadata.last_offset + 1), 0, *args)

    def source(rng, uuids):
        return lambda: uuids.pop(0) if uuids else uuid.UUID(int=rng.getrandbits(128), version=4)

    made = []
    for _ in range(2):
        rng = random.Random(7)
        uuids = [uuid.UUID(int=rng.getrandbits(128), version=4), uuid.UUID(int=0)]
        m = ControllerStateMachine(ControllerConfig(), uuid4=source(rng, uuids))
        run(m.start, m)  # the cluster ID takes the first
        run(m.register_broker, m, pb.RegisterBrokerRequest(
            broker_id=1, incarnation_id="a", listeners=[pb.Listener(name="I", host="h", port=1)]))
        created = run(m.create_topics, m, pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name="t", num_partitions=1, replication_factor=1)]))
        assert not uuids  # the reserved one was drawn, and skipped
        made.append((m.metadata.cluster_id, created.topics[0].topic_id))
    assert made[0] == made[1]
    assert len(made[0][1]) == 16 and made[0][1] != bytes(16)


def test_delete_by_id_deletes_only_the_incarnation_it_names(h):
    """DeleteTopics v6 names a topic by ID: the broker sends name -> ID, and the controller
    deletes the name only while it has that ID (a recreated topic is not the one meant)."""
    first = h.create("orders", partitions=1, rf=3)
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["orders"]))
    second = h.create("orders", partitions=1, rf=3)
    stale = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(
        names=["orders"], topic_ids={"orders": first.topic_id}))
    [result] = stale.topics
    assert (result.name, result.topic_id, result.error_code) == (
        "", first.topic_id, pb.UNKNOWN_TOPIC_ID)
    assert h.metadata.topics["orders"].topic_id == second.topic_id  # still there
    current = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(
        names=["orders"], topic_ids={"orders": second.topic_id}))
    [result] = current.topics
    assert (result.name, result.topic_id, result.error_code) == (
        "orders", second.topic_id, pb.NONE)
    assert "orders" not in h.metadata.topics
