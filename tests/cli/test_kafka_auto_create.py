"""Issue 28: topic auto-creation as Kafka's (``auto.create.topics.enable``).

A real 3-broker cluster with the controller's ``num.partitions=3`` and
``default.replication.factor=3``: confluent-kafka's producer writing to a topic
nobody created gets it created with those defaults and every record is read
back; kafka-python's consumer subscribing to a new topic creates it through
Metadata. A one-broker cluster with ``auto.create.topics.enable=false`` keeps
answering UNKNOWN_TOPIC_OR_PARTITION, and a name Kafka refuses is
INVALID_TOPIC_EXCEPTION (never created) on both.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from cluster_fixtures import describe_topic, fully_replicated, start_cluster, stop_cluster, wait_for

from tidewater.broker.kafka import codec
from tidewater.proto import tidewater_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

METADATA = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("auto-create"), 3, "num.partitions=3",
                      "default.replication.factor=3", "min.insync.replicas=2")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def disabled(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("no-auto-create"), 1,
                      "auto.create.topics.enable=false")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def metadata(bootstrap: str, topics: list[str], version: int = 12,
             allow: bool = True) -> dict[str, int]:
    """topic -> error code of one raw Metadata request to the first broker."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    values: dict = {"topics": [{"name": t, "topic_id": uuid.UUID(int=0)} for t in topics],
                    "allow_auto_topic_creation": allow,
                    "include_cluster_authorized_operations": False,
                    "include_topic_authorized_operations": False}
    frame = codec.encode_request(METADATA, version, 7, values)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(frame)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        body = s.recv(size, socket.MSG_WAITALL)
    _, answer = codec.decode_response(METADATA, version, body)
    return {t.name: t.error_code for t in answer.topics}


def new_name() -> str:
    return f"auto-{uuid.uuid4().hex[:8]}"


def test_a_produce_to_a_new_topic_creates_it_with_the_defaults(cluster):
    topic = new_name()
    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 60_000})
    delivered, errors = [], []

    def report(error, message):
        (errors if error is not None else delivered).append(error or message)
    for i in range(300):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), on_delivery=report)
    assert producer.flush(90) == 0
    assert errors == [] and len(delivered) == 300
    described = wait_for(lambda: fully_replicated(cluster, topic), f"{topic} replicated")
    assert len(described["partitions"]) == 3
    assert all(len(p["replicas"]) == 3 for p in described["partitions"])

    consumer = Consumer({"bootstrap.servers": cluster.kafka, "group.id": "auto-create-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 300 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
    finally:
        consumer.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(300))


def test_kafka_python_consumer_subscribing_creates_the_topic(cluster):
    from kafka import KafkaConsumer, KafkaProducer
    topic = new_name()
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka, group_id=f"g-{topic}",
                             auto_offset_reset="earliest", consumer_timeout_ms=1000)
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while describe_topic(cluster, topic) is None and time.monotonic() < deadline:
            consumer.poll(timeout_ms=500)  # its Metadata requests create the topic
        assert describe_topic(cluster, topic) is not None
        wait_for(lambda: fully_replicated(cluster, topic), f"{topic} replicated")
        producer = KafkaProducer(bootstrap_servers=cluster.kafka, acks="all")
        for i in range(10):
            producer.send(topic, f"r{i}".encode())
        producer.flush(30)
        producer.close()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [r.value for r in records]
        assert sorted(got) == sorted(f"r{i}".encode() for i in range(10))
    finally:
        consumer.close()


def test_metadata_honours_allow_auto_topic_creation(cluster):
    topic = new_name()
    for _ in range(3):
        assert metadata(cluster.kafka, [topic], allow=False) == {
            topic: pb.UNKNOWN_TOPIC_OR_PARTITION}
        time.sleep(0.2)
    assert describe_topic(cluster, topic) is None
    # Metadata v0-3 has no such field: those clients always allow it, as with Kafka.
    metadata(cluster.kafka, [topic], version=3)
    wait_for(lambda: metadata(cluster.kafka, [topic]) == {topic: pb.NONE}, f"{topic} created")
    assert len(describe_topic(cluster, topic)["partitions"]) == 3


@pytest.mark.parametrize("name", ["bad name", "a" * 250, "..", "t\u00f6pic"])
def test_an_invalid_name_is_refused_and_never_created(cluster, name):
    assert metadata(cluster.kafka, [name]) == {name: pb.INVALID_TOPIC_EXCEPTION}
    assert metadata(cluster.kafka, [name], allow=False) == {name: pb.INVALID_TOPIC_EXCEPTION}


def test_internal_topics_are_not_created_for_clients(cluster):
    name = "__transaction_state"
    assert metadata(cluster.kafka, [name]) == {name: pb.UNKNOWN_TOPIC_OR_PARTITION}
    time.sleep(1)
    assert metadata(cluster.kafka, [name]) == {name: pb.UNKNOWN_TOPIC_OR_PARTITION}


def test_disabled_auto_creation_keeps_unknown_topics_unknown(disabled):
    topic = new_name()
    assert metadata(disabled.kafka, [topic]) == {topic: pb.UNKNOWN_TOPIC_OR_PARTITION}
    producer = Producer({"bootstrap.servers": disabled.kafka, "message.timeout.ms": 3000,
                         "topic.metadata.propagation.max.ms": 1000})
    errors = []
    producer.produce(topic, b"x", on_delivery=lambda e, m: errors.append(e))
    producer.flush(15)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() in (confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART,
                                confluent_kafka.KafkaError._UNKNOWN_TOPIC,
                                confluent_kafka.KafkaError._MSG_TIMED_OUT)
    assert metadata(disabled.kafka, [topic]) == {topic: pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert describe_topic(disabled, topic) is None
    assert metadata(disabled.kafka, ["bad name"]) == {"bad name": pb.INVALID_TOPIC_EXCEPTION}
