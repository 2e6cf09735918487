"""Issue 28, KIP-430: the operations a caller may do on the cluster, a topic, a group.

confluent-kafka's ``describe_cluster`` (DescribeCluster), ``describe_topics`` and
``describe_consumer_groups`` with ``include_authorized_operations=True``, and
kafka-python's ``describe_topic_partitions`` (DescribeTopicPartitions), against a broker
without an authorizer (every operation Kafka supports on the resource) and against one
with SASL and ACLs (what the ACLs grant, DESCRIBE implied by READ, DESCRIBE_CONFIGS by
ALTER_CONFIGS, as Kafka's authorizer).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection  # noqa: E402
from confluent_kafka import TopicPartition as Tp  # noqa: E402
from confluent_kafka.admin import AclOperation as Op  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tidewater.tools.cluster_sasl import read_password  # noqa: E402

# Kafka's AclEntry.supportedOperations
TOPIC_OPS = {Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER,
             Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}
GROUP_OPS = {Op.READ, Op.DESCRIBE, Op.DELETE}
CLUSTER_OPS = {Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
               Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE}


def _bits(ops: set) -> int:
    return sum(1 << op.value for op in ops)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("ops-open"), 1)
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("ops-acl"), 1,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512,PLAIN"))
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.kafka, c.sasl = manifest["kafka_bootstrap"], manifest["sasl"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def _admin_conf(c) -> dict:
    if not hasattr(c, "sasl"):
        return {"bootstrap.servers": c.kafka}
    return {"bootstrap.servers": c.kafka, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": c.sasl["mechanism"], "sasl.username": c.sasl["username"],
            "sasl.password": read_password(c.sasl["command_config"])}


def _prepare(c, topic: str, group: str) -> None:
    """The topic, and the group with a committed offset (an Empty group), as the admin."""
    admin = AdminClient(_admin_conf(c))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    offsets = ConsumerGroupTopicPartitions(group, [Tp(topic, 0, 0)])
    [future] = admin.alter_consumer_group_offsets([offsets]).values()
    future.result(30)


def _described(conf: dict, topic: str, group: str) -> tuple[set, set, set]:
    admin = AdminClient(conf)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
    topics = admin.describe_topics(TopicCollection([topic]),
                                   include_authorized_operations=True)
    described_topic = topics[topic].result(30)
    groups = admin.describe_consumer_groups([group], include_authorized_operations=True)
    described_group = groups[group].result(30)
    return (set(cluster.authorized_operations or ()),
            set(described_topic.authorized_operations or ()),
            set(described_group.authorized_operations or ()))


def _topic_partitions_ops(kafka_python_conf: dict, topic: str) -> int:
    from kafka.admin import KafkaAdminClient
    client = KafkaAdminClient(**kafka_python_conf)
    try:
        [answer] = client.describe_topic_partitions([topic])["topics"]
    finally:
        client.close()
    assert answer["error_code"] == 0, answer
    return answer["topic_authorized_operations"]


def test_without_an_authorizer_every_supported_operation_is_authorized(open_cluster):
    c = open_cluster
    _prepare(c, "ops-open-t", "ops-open-g")
    cluster_ops, topic_ops, group_ops = _described(_admin_conf(c), "ops-open-t", "ops-open-g")
    assert (cluster_ops, topic_ops, group_ops) == (CLUSTER_OPS, TOPIC_OPS, GROUP_OPS)
    assert _topic_partitions_ops({"bootstrap_servers": c.kafka}, "ops-open-t") == \
        _bits(TOPIC_OPS)
    # Not asked for: none (librdkafka leaves the list unset for Kafka's Int32.MIN).
    admin = AdminClient(_admin_conf(c))
    assert admin.describe_cluster().result(30).authorized_operations is None
    described = admin.describe_topics(TopicCollection(["ops-open-t"]))["ops-open-t"].result(30)
    assert described.authorized_operations is None


def test_with_acls_the_operations_are_what_the_acls_grant(acl_cluster):
    c = acl_cluster
    _prepare(c, "ops-acl-t", "ops-acl-g")

    def tide(*args: str):
        result = run_tide(*args, "--command-config", c.sasl["command_config"],
                          bootstrap=c.bootstrap)
        assert result.returncode == 0, result.stderr
        return result

    tide("users", "create", "carol", "--password", "carol-pw")
    tide("acls", "add", "--allow-principal", "User:carol", "--operation", "describe",
         "--operation", "alter_configs", "--cluster")
    tide("acls", "add", "--allow-principal", "User:carol", "--operation", "read",
         "--operation", "write", "--topic", "ops-acl-t")
    tide("acls", "add", "--allow-principal", "User:carol", "--operation", "read",
         "--group", "ops-acl-g")
    tide("acls", "add", "--deny-principal", "User:carol", "--operation", "delete",
         "--group", "ops-acl-g")
    carol = {"bootstrap.servers": c.kafka, "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "carol",
             "sasl.password": "carol-pw"}
    expected = ({Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS},
                {Op.READ, Op.WRITE, Op.DESCRIBE},
                {Op.READ, Op.DESCRIBE})
    deadline = time.monotonic() + 30
    while (got := _described(carol, "ops-acl-t", "ops-acl-g")) != expected \
            and time.monotonic() < deadline:
        time.sleep(0.5)  # the ACLs reach the broker with the next metadata push
    assert got == expected
    assert _topic_partitions_ops({"bootstrap_servers": c.kafka,
                                  "security_protocol": "SASL_PLAINTEXT",
                                  "sasl_mechanism": "SCRAM-SHA-512",
                                  "sasl_plain_username": "carol",
                                  "sasl_plain_password": "carol-pw"}, "ops-acl-t") == \
        _bits({Op.READ, Op.WRITE, Op.DESCRIBE})
    # The admin (a super user) may do everything.
    assert _described(_admin_conf(c), "ops-acl-t", "ops-acl-g") == \
        (CLUSTER_OPS, TOPIC_OPS, GROUP_OPS)
