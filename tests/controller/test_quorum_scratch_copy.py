"""The quorum owner's scratch copy shares the frozen partition records, nothing mutable."""

from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import (
    ClusterMetadata,
    Listener,
    broker_fenced_record,
    broker_registered_record,
    partition_changed_record,
    partitions_created_record,
    topic_created_record,
)
from tidewater.controller.quorum.owner import scratch_copy

TOPIC_ID = b"t" * 16


def image_with_topic() -> ClusterMetadata:
    image = ClusterMetadata()
    image.apply(0, {"type": "cluster", "cluster_id": "c1"})
    image.apply(1, broker_registered_record(1, "i1", [Listener("PLAINTEXT", "h", 1)]))
    partitions = [PartitionRecord("t", n, (1,), (1,), 1, 0, 0, TOPIC_ID) for n in range(3)]
    image.apply(2, topic_created_record("t", {"retention.ms": "1"}, partitions,
                                        topic_id=TOPIC_ID))
    return image


def test_partition_records_are_shared_and_containers_are_not():
    image = image_with_topic()
    scratch = scratch_copy(image)
    assert scratch.topics["t"].partitions[0] is image.topics["t"].partitions[0]
    assert scratch.topics["t"] is not image.topics["t"]
    assert scratch.topics["t"].partitions is not image.topics["t"].partitions
    assert scratch.brokers[1] is not image.brokers[1]


def test_records_applied_to_the_scratch_leave_the_image_as_it_was():
    image = image_with_topic()
    before = repr((image.brokers, image.topics, image.topic_names_by_id, image.last_offset))
    scratch = scratch_copy(image)
    p0 = scratch.topics["t"].partitions[0]
    changed = PartitionRecord("t", 0, (1,), (1,), 1, 1, 1, TOPIC_ID)
    scratch.apply(3, partition_changed_record(changed))
    scratch.apply(4, partitions_created_record(
        "t", [PartitionRecord("t", 3, (1,), (1,), 1, 0, 0, TOPIC_ID)]))
    scratch.apply(5, broker_fenced_record(1))
    scratch.topics["t"].configs["retention.ms"] = "2"
    assert scratch.topics["t"].partitions[0].leader_epoch == 1
    assert p0.leader_epoch == 0  # replaced, not changed: the image's record is the same one
    assert len(scratch.topics["t"].partitions) == 4 and scratch.brokers[1].fenced
    assert repr((image.brokers, image.topics, image.topic_names_by_id,
                 image.last_offset)) == before
