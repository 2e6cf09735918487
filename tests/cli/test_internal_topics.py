"""Issue 29 item 10: internal topics cannot be deleted, over Kafka's protocol
(confluent-kafka's AdminClient) and gRPC (`tide topics delete`): the answer is
INVALID_TOPIC_EXCEPTION with kafka-topics.sh's message, and the group's committed
offsets stay."""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

OFFSETS = "__consumer_offsets"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("internal"), 1)
    c.kafka = c.manifest()["kafka_bootstrap"]
    yield c
    stop_cluster(c)


def commit_an_offset(c, topic: str, group: str) -> None:
    """A group commits offset 1 of ``topic``-0 (which makes __consumer_offsets)."""
    produced = c.tide("produce", topic, "--acks", "all", input="a\nb\n")
    assert produced.returncode == 0, produced.stderr
    consumer = confluent_kafka.Consumer({"bootstrap.servers": c.kafka, "group.id": group,
                                         "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        message = None
        while message is None or message.error() is not None:
            assert time.monotonic() < deadline, "no record consumed"
            message = consumer.poll(1.0)
        consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()


def committed(c, topic: str, group: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": c.kafka, "group.id": group})
    try:
        [tp] = consumer.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=20)
        return int(tp.offset)
    finally:
        consumer.close()


def test_consumer_offsets_cannot_be_deleted_over_kafka_or_grpc(cluster):
    c = cluster
    assert c.tide("topics", "create", "events").returncode == 0
    commit_an_offset(c, "events", "keepers")
    admin = admin_mod.AdminClient({"bootstrap.servers": c.kafka})
    wait_for(lambda: OFFSETS in admin.list_topics(timeout=10).topics, f"{OFFSETS} created")
    assert committed(c, "events", "keepers") == 1

    futures = admin.delete_topics([OFFSETS, "__transaction_state"], operation_timeout=10)
    for name, future in futures.items():
        with pytest.raises(confluent_kafka.KafkaException) as raised:
            future.result(30)
        error = raised.value.args[0]
        assert error.code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, (name, error)

    deleted = c.tide("topics", "delete", OFFSETS)
    assert deleted.returncode != 0
    assert "INVALID_TOPIC_EXCEPTION" in deleted.stderr and "internal topic" in deleted.stderr

    assert OFFSETS in admin.list_topics(timeout=10).topics
    assert committed(c, "events", "keepers") == 1
    # An ordinary topic is still deleted as before.
    [ordinary] = admin.delete_topics(["events"], operation_timeout=10).values()
    ordinary.result(30)
