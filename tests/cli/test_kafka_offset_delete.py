"""Issue 28: OffsetDelete (key 47) from Kafka's admin clients against a 3-broker cluster.

A confluent-kafka consumer group subscribed to one topic has committed offsets of
two topics: kafka-python's ``KafkaAdminClient.delete_group_offsets`` deletes those of
the topic it does not subscribe to and answers GROUP_SUBSCRIBED_TO_TOPIC for the
other while the consumer is live; once it has left, the rest. An unknown group is
GROUP_ID_NOT_FOUND. (confluent-kafka's Python AdminClient has no OffsetDelete.)
"""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import fully_replicated, kafka_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

try:
    from confluent_kafka import ConsumerGroupTopicPartitions
except ImportError:  # older confluent-kafka
    from confluent_kafka.admin import ConsumerGroupTopicPartitions

GROUP = "od-group"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from kafka_cluster(tmp_path_factory, "offset-delete")


def committed(c, topics: list[str]) -> dict[tuple[str, int], int]:
    admin = AdminClient({"bootstrap.servers": c.kafka})
    request = ConsumerGroupTopicPartitions(GROUP, [TopicPartition(t, 0) for t in topics])
    [future] = admin.list_consumer_group_offsets([request]).values()
    return {(tp.topic, tp.partition): tp.offset for tp in future.result(30).topic_partitions}


def test_offsets_of_unsubscribed_topics_are_deleted_subscribed_ones_kept(cluster):
    for topic in ("subscribed", "other"):
        assert cluster.tide("topics", "create", topic, "--partitions", "1",
                            "--replication-factor", "3").returncode == 0
        wait_for(lambda topic=topic: fully_replicated(cluster, topic), f"{topic} replicated")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka})
    for i in range(10):
        producer.produce("subscribed", value=b"%d" % i)
    assert producer.flush(30) == 0

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": cluster.kafka, "group.id": GROUP, "auto.offset.reset": "earliest",
        "enable.auto.commit": False})
    consumer.subscribe(["subscribed"])
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)
    consumer.commit(offsets=[TopicPartition("subscribed", 0, 4), TopicPartition("other", 0, 7)],
                    asynchronous=False)
    assert committed(cluster, ["subscribed", "other"]) == {("subscribed", 0): 4, ("other", 0): 7}

    from kafka.admin import KafkaAdminClient
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.kafka.split(","))
    try:
        # While the consumer is live: the subscribed topic's offset stays, the other goes.
        answer = kadmin.delete_group_offsets(GROUP, [kafka.TopicPartition("subscribed", 0),
                                                     kafka.TopicPartition("other", 0)])
        assert answer == {
            kafka.TopicPartition("subscribed", 0): kafka.errors.GroupSubscribedToTopicError,
            kafka.TopicPartition("other", 0): kafka.errors.NoError}
        assert committed(cluster, ["subscribed", "other"]) == {("subscribed", 0): 4,
                                                               ("other", 0): -1001}
        consumer.close()
        # The group is empty now: the subscribed topic's offset goes too.
        answer = kadmin.delete_group_offsets(GROUP, [kafka.TopicPartition("subscribed", 0)])
        assert answer == {kafka.TopicPartition("subscribed", 0): kafka.errors.NoError}
        try:
            missing = kadmin.delete_group_offsets("no-such-group",
                                                  [kafka.TopicPartition("subscribed", 0)])
        except kafka.errors.GroupIdNotFoundError:
            missing = "GROUP_ID_NOT_FOUND"
    finally:
        kadmin.close()
    assert missing == "GROUP_ID_NOT_FOUND"
    assert committed(cluster, ["subscribed", "other"]) == {("subscribed", 0): -1001,
                                                           ("other", 0): -1001}
