"""Issue 28: DescribeLogDirs (key 35) from kafka-python's admin client, 3 brokers.

Each broker answers one log dir, its data dir, with each replica it hosts: the
size on disk (equal on every replica once they caught up), offset lag 0, not a
future replica, and the file system's total and usable bytes (v4). Named
partitions limit the answer to them.
"""

from __future__ import annotations

import os

import pytest
from cluster_fixtures import fully_replicated, kafka_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

TOPIC = "sized"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from kafka_cluster(tmp_path_factory, "log-dirs")


def describe(c, topic_partitions=None) -> dict[int, list[dict]]:
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=c.kafka.split(","))
    try:
        answers = admin.describe_log_dirs(topic_partitions)
    finally:
        admin.close()
    return {a["broker"]: a["log_dirs"] for a in answers}


def sizes(c) -> dict[tuple[int, int], int]:
    """(broker, partition) -> size of TOPIC's replicas."""
    out = {}
    for broker, dirs in describe(c).items():
        [log_dir] = dirs
        for topic in log_dir["topics"]:
            if topic["name"] == TOPIC:
                for p in topic["partitions"]:
                    out[(broker, p["partition_index"])] = p["partition_size"]
    return out


def test_kafka_python_describes_each_brokers_log_dir(cluster):
    assert cluster.tide("topics", "create", TOPIC, "--partitions", "2",
                        "--replication-factor", "3").returncode == 0
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the topic fully replicated")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    for i in range(200):
        producer.produce(TOPIC, value=b"x" * 100, partition=i % 2)
    assert producer.flush(30) == 0

    def replicas_equal():
        found = sizes(cluster)
        return len(found) == 6 and all(
            found[(b, p)] == found[(1, p)] > 100 * 100 for b in (1, 2, 3) for p in (0, 1))
    wait_for(replicas_equal, "every replica's size equal")

    data_dirs = {p["broker_id"]: p["data_dir"] for p in cluster.manifest()["processes"].values()
                 if p["kind"] == "broker"}
    described = describe(cluster)
    assert set(described) == {1, 2, 3}
    for broker, dirs in described.items():
        [log_dir] = dirs
        assert log_dir["error_code"] == 0
        assert os.path.samefile(log_dir["log_dir"], data_dirs[broker])
        assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
        [topic] = [t for t in log_dir["topics"] if t["name"] == TOPIC]
        assert sorted(p["partition_index"] for p in topic["partitions"]) == [0, 1]
        assert all(p["offset_lag"] == 0 and p["is_future_key"] is False
                   for p in topic["partitions"])

    only = describe(cluster, {TOPIC: [1]})
    for dirs in only.values():
        [log_dir] = dirs
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
                for t in log_dir["topics"]] == [(TOPIC, [1])]
