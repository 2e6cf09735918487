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


def _join_and_consume(bootstrap: str, group: str, topic: str, count: int,
                      **conf) -> confluent_kafka.Consumer:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "auto.offset.reset": "earliest", **conf})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            got += 1
    assert got == count
    return consumer


def test_delete_groups_right_after_the_consumers_closed(cluster):
    """Dynamic members leave when they close: their groups are deleted at once. Static
    members (KIP-345) do not leave; their groups are deleted once their session timeout
    has passed since they closed (librdkafka's 0081 waits just that long)."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    admin.create_topics([NewTopic("dg", 2, 1)])["dg"].result(30)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka})
    for i in range(10):
        producer.produce("dg", value=b"v", partition=i % 2)
    assert producer.flush(30) == 0

    dynamic = ["dg-dyn-0", "dg-dyn-1"]
    consumers = [_join_and_consume(cluster.kafka, g, "dg", 10) for g in dynamic]
    # Two members in one group too: the last one's LeaveGroup empties it.
    pair = [_join_and_consume(cluster.kafka, "dg-pair", "dg", 10 if i == 0 else 0,
                              **{"session.timeout.ms": 6000}) for i in range(2)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.describe_consumer_groups(["dg-pair"])["dg-pair"].result(30)
        if len(described.members) == 2 and str(described.state).endswith("STABLE"):
            break
        for c in pair:
            c.poll(0.2)
    for c in consumers + pair:
        c.close()
    for future in admin.delete_consumer_groups(dynamic + ["dg-pair"]).values():
        future.result(30)  # NON_EMPTY_GROUP would raise
    for group, future in admin.describe_consumer_groups(dynamic + ["dg-pair"]).items():
        assert str(future.result(30).state).endswith("DEAD"), group

    # Heartbeats well inside the session: with librdkafka's default interval (3 s) above
    # a 2 s session, the first member's session ran out while the second joined on a
    # loaded CI machine (the client logged "session timed out", rejoined and was fenced),
    # and its group was empty before the delete this test expects to be refused.
    session_ms = 6000
    static = ["dg-static-0", "dg-static-1"]
    consumers = [_join_and_consume(cluster.kafka, g, "dg", 10,
                                   **{"group.instance.id": f"instance-{i}",
                                      "session.timeout.ms": session_ms,
                                      "heartbeat.interval.ms": 500})
                 for i, g in enumerate(static)]
    for c in consumers:
        c.close()
    # Right after closing, the static members are still members (as Kafka).
    [(_, early)] = admin.delete_consumer_groups([static[0]]).items()
    with pytest.raises(KafkaException) as refused:
        early.result(30)
    assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    time.sleep(session_ms / 1000)
    for future in admin.delete_consumer_groups(static).values():
        future.result(30)
