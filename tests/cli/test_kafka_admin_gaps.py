"""Issue 28: Kafka admin behaviours librdkafka's own suite relies on, through
confluent-kafka against a real broker.

- ``message.format.version`` (deprecated; librdkafka's 0092 sets it with AlterConfigs):
  Kafka 3.x accepts a version it can parse, stores and describes it, and ignores it.
- DeleteGroups right after the group's consumers closed: a consumer's close sends
  LeaveGroup, and when the last member leaves Kafka's coordinator completes the
  rebalance at once (no member is left to wait for), so the group is Empty and may be
  deleted at once.
"""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("admin-gaps"), 1,
                      "group.min.session.timeout.ms=1000")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def _config(admin: AdminClient, topic: str, name: str):
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)[name]


def test_message_format_version_is_accepted_stored_and_described(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    admin.create_topics([NewTopic("mfv", 1, 1, config={"message.format.version": "2.8"})]
                        )["mfv"].result(30)
    assert _config(admin, "mfv", "message.format.version").value == "2.8"
    # librdkafka's 0092 step: AlterConfigs to a message format v1 version.
    resource = ConfigResource(ResourceType.TOPIC, "mfv",
                              set_config={"message.format.version": "0.10.0.0"})
    admin.alter_configs([resource])[resource].result(30)
    assert _config(admin, "mfv", "message.format.version").value == "0.10.0.0"
    # A topic without it describes Kafka 3's default.
    admin.create_topics([NewTopic("mfv-default", 1, 1)])["mfv-default"].result(30)
    described = _config(admin, "mfv-default", "message.format.version")
    assert described.value == "3.0-IV1" and described.is_default
    # What Kafka cannot parse as a version is INVALID_CONFIG.
    bad = ConfigResource(ResourceType.TOPIC, "mfv", set_config={"message.format.version": "9.9"})
    with pytest.raises(KafkaException) as refused:
        admin.alter_configs([bad])[bad].result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    # The records written after the change are still read back (the value has no effect).
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka})
    for i in range(5):
        producer.produce("mfv", value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka,
                                         "group.id": "mfv-reader",
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["mfv"])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [f"v{i}".encode() for i in range(5)]
