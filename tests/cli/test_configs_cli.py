"""Issue 28: `tide configs describe|alter` (kafka-configs.sh), `tide leader-election`
(kafka-leader-election.sh), `tide topics create --replica-assignment/--if-not-exists`,
`tide topics delete --if-exists`, and Kafka clients' manual assignments
(confluent-kafka's NewTopic/NewPartitions replica_assignment, kafka-python's
create_partitions), against a real controller and 3 brokers.
"""

from __future__ import annotations

import json

import pytest
from cluster_fixtures import assert_one_line_error, run_tide, start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("configs-cli"), 3,
                      "auto.leader.rebalance.enable=false")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def topic_json(c, name: str) -> dict | None:
    result = c.tide("topics", "describe", name, "--json")
    if result.returncode != 0:
        return None
    [topic] = json.loads(result.stdout)["topics"]
    return topic


def test_configs_alter_and_describe_a_topic(cluster):
    assert cluster.tide("topics", "create", "cfg", "--partitions", "1",
                        "--replication-factor", "3").returncode == 0
    altered = cluster.tide("configs", "alter", "--entity-type", "topics", "--entity-name",
                           "cfg", "--add-config",
                           "retention.ms=3600000,cleanup.policy=[compact,delete]")
    assert altered.returncode == 0, altered.stderr
    assert "Completed updating config for topic cfg" in altered.stdout
    described = cluster.tide("configs", "describe", "--entity-type", "topics",
                             "--entity-name", "cfg")
    assert "retention.ms=3600000" in described.stdout
    assert "cleanup.policy=compact,delete" in described.stdout
    # Kafka's own DescribeConfigs sees the same
    client = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, future)] = client.describe_configs([ConfigResource(ResourceType.TOPIC, "cfg")]).items()
    entry = future.result(30)["retention.ms"]
    assert (entry.value, entry.source) == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert cluster.tide("configs", "alter", "--entity-type", "topics", "--entity-name", "cfg",
                        "--delete-config", "retention.ms").returncode == 0
    described = cluster.tide("configs", "describe", "--entity-type", "topics",
                             "--entity-name", "cfg")
    assert "retention.ms" not in described.stdout
    refused = cluster.tide("configs", "alter", "--entity-type", "topics", "--entity-name",
                           "cfg", "--add-config", "retention.ms=soon")
    assert_one_line_error(refused, "cannot alter topic cfg", "retention.ms")


def test_configs_alter_brokers_default_and_one(cluster):
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-default",
                        "--add-config", "log.retention.ms=86400000").returncode == 0
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-name", "2",
                        "--add-config", "log.segment.bytes=1048576").returncode == 0
    default = cluster.tide("configs", "describe", "--entity-type", "brokers",
                           "--entity-default")
    assert default.stdout.splitlines()[1:] == ["  log.retention.ms=86400000"]
    two = cluster.tide("configs", "describe", "--entity-type", "brokers", "--entity-name", "2")
    assert two.stdout.splitlines()[1:] == ["  log.segment.bytes=1048576"]
    client = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, future)] = client.describe_configs([ConfigResource(ResourceType.BROKER, "2")]).items()
    configs = future.result(30)
    assert configs["log.segment.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert configs["log.retention.ms"].source == (
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    refused = cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-name", "1",
                           "--add-config", "broker.rack=r1")
    assert_one_line_error(refused, "cannot alter broker 1", "dynamically")
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-default",
                        "--delete-config", "log.retention.ms").returncode == 0
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-name", "2",
                        "--delete-config", "log.segment.bytes").returncode == 0


def test_replica_assignment_if_not_exists_and_if_exists(cluster):
    created = cluster.tide("topics", "create", "placed", "--replica-assignment", "3:1,2:3")
    assert created.returncode == 0, created.stderr
    topic = wait_for(lambda: topic_json(cluster, "placed"), "the topic")
    assert [p["replicas"] for p in topic["partitions"]] == [[3, 1], [2, 3]]
    again = cluster.tide("topics", "create", "placed", "--partitions", "1")
    assert again.returncode != 0
    assert cluster.tide("topics", "create", "placed", "--partitions", "1",
                        "--if-not-exists").returncode == 0
    bad = cluster.tide("topics", "create", "bad", "--replica-assignment", "1:1")
    assert_one_line_error(bad, "cannot create topic 'bad'", "twice")
    grown = cluster.tide("topics", "alter", "placed", "--partitions", "3",
                         "--replica-assignment", "1:2")
    assert grown.returncode == 0, grown.stderr
    topic = wait_for(lambda: topic_json(cluster, "placed"), "the topic")
    assert topic["partitions"][2]["replicas"] == [1, 2]
    assert cluster.tide("topics", "delete", "ghost").returncode != 0
    assert cluster.tide("topics", "delete", "ghost", "--if-exists").returncode == 0


def test_kafka_clients_create_topics_and_partitions_with_assignments(cluster):
    client = AdminClient({"bootstrap.servers": cluster.kafka})
    futures = client.create_topics([NewTopic("kplaced", 2, replica_assignment=[[2, 3], [3, 1]])])
    futures["kplaced"].result(30)
    topic = wait_for(lambda: topic_json(cluster, "kplaced"), "the topic")
    assert [p["replicas"] for p in topic["partitions"]] == [[2, 3], [3, 1]]
    futures = client.create_partitions([NewPartitions("kplaced", 3,
                                                      replica_assignment=[[1, 2]])])
    futures["kplaced"].result(30)
    futures = client.create_partitions([NewPartitions("kplaced", 4,
                                                      replica_assignment=[[1, 9]])])
    with pytest.raises(KafkaException) as refused:
        futures["kplaced"].result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        kp.create_partitions({"kplaced": KNewPartitions(4, [[3, 2]])})
    finally:
        kp.close()
    topic = wait_for(lambda: (t := topic_json(cluster, "kplaced")) and
                     len(t["partitions"]) == 4 and t, "4 partitions")
    assert [p["replicas"] for p in topic["partitions"]] == [[2, 3], [3, 1], [1, 2], [3, 2]]


def test_leader_election_preferred_and_all_partitions(cluster):
    assert cluster.tide("topics", "create", "lead", "--replica-assignment", "2:1:3").returncode == 0
    wait_for(lambda: (t := topic_json(cluster, "lead")) and
             len(t["partitions"][0]["isr"]) == 3, "a full ISR")
    not_needed = cluster.tide("leader-election", "--election-type", "preferred", "--topic",
                              "lead", "--partition", "0")
    assert not_needed.returncode == 0 and "already elected" in not_needed.stdout
    assert run_tide("cluster", "kill", "2", "--signal", "TERM",
                    "--data-dir", str(cluster.data_dir)).returncode == 0
    wait_for(lambda: (t := topic_json(cluster, "lead")) and
             t["partitions"][0]["leader"] not in (-1, 2), "another leader")
    assert run_tide("cluster", "start", "2", "--data-dir", str(cluster.data_dir),
                    timeout_s=120).returncode == 0
    wait_for(lambda: (t := topic_json(cluster, "lead")) and
             2 in t["partitions"][0]["isr"], "broker 2 back in the ISR")
    elected = cluster.tide("leader-election", "--election-type", "preferred",
                           "--all-topic-partitions")
    assert elected.returncode == 0, elected.stderr
    assert "lead-0" in elected.stdout
    assert topic_json(cluster, "lead")["partitions"][0]["leader"] == 2
    unknown = cluster.tide("leader-election", "--election-type", "unclean", "--topic", "lead",
                           "--partition", "5")
    assert_one_line_error(unknown, "election failed", "lead-5")


def test_kafka_python_describe_topic_partitions_pages_with_a_cursor(cluster):
    from kafka.admin import KafkaAdminClient
    assert cluster.tide("topics", "create", "paged", "--replica-assignment",
                        "1:2,2:3,3:1").returncode == 0
    wait_for(lambda: (t := topic_json(cluster, "paged")) and
             all(p["leader"] >= 0 for p in t["partitions"]), "leaders")
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        first = client.describe_topic_partitions(["paged", "nope"], response_partition_limit=2)
        [nope, paged] = first["topics"]  # sorted by name
        assert nope["name"] == "nope" and nope["error_code"] == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert [p["partition_index"] for p in paged["partitions"]] == [0, 1]
        assert [p["replica_nodes"] for p in paged["partitions"]] == [[1, 2], [2, 3]]
        assert first["next_cursor"] == {"topic_name": "paged", "partition_index": 2}
        rest = client.describe_topic_partitions(["paged"], cursor=first["next_cursor"])
        [paged] = rest["topics"]
        assert [p["partition_index"] for p in paged["partitions"]] == [2]
        assert paged["partitions"][0]["leader_id"] == 3
        assert rest["next_cursor"] is None
    finally:
        client.close()


def test_records_delete_and_log_dirs(cluster, tmp_path):
    assert cluster.tide("topics", "create", "trim", "--replica-assignment",
                        "1:2:3").returncode == 0
    wait_for(lambda: (t := topic_json(cluster, "trim")) and
             len(t["partitions"][0]["isr"]) == 3, "a full ISR")
    produced = cluster.tide("produce", "trim", "--acks", "all",
                            input="".join(f"v{i}\n" for i in range(20)))
    assert produced.returncode == 0, produced.stderr
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": "trim", "partition": 0,
                                                   "offset": 7},
                                                  {"topic": "trim", "partition": 4,
                                                   "offset": 1}], "version": 1}))
    deleted = cluster.tide("records", "delete", "--offset-json-file", str(offsets))
    assert deleted.returncode != 0  # partition 4 does not exist
    assert "partition: trim-0\tlow_watermark: 7" in deleted.stdout
    assert "trim-4\terror:" in deleted.stdout
    starts = [r["log_start_offset"] for r in topic_json(cluster, "trim")["partitions"][0]
              ["replicas_state"]]
    assert starts == [7, 7, 7]
    offsets.write_text(json.dumps({"partitions": [{"topic": "trim", "partition": 0,
                                                   "offset": -1}]}))
    deleted = cluster.tide("records", "delete", "--offset-json-file", str(offsets))
    assert deleted.returncode == 0 and "low_watermark: 20" in deleted.stdout

    described = cluster.tide("log-dirs", "--describe", "--broker-list", "1,3",
                             "--topic-list", "trim")
    assert described.returncode == 0, described.stderr
    document = json.loads(described.stdout.splitlines()[-1])
    assert [b["broker"] for b in document["brokers"]] == [1, 3]
    for broker in document["brokers"]:
        [log_dir] = broker["logDirs"]
        assert log_dir["logDir"] and log_dir["error"] is None
        [replica] = log_dir["partitions"]
        assert replica["partition"] == "trim-0" and replica["size"] > 0
        assert replica["offsetLag"] == 0 and replica["isFuture"] is False


def test_altered_configs_survive_controller_and_broker_restarts(cluster):
    assert cluster.tide("topics", "create", "kept", "--replica-assignment", "1:2:3").returncode == 0
    assert cluster.tide("configs", "alter", "--entity-type", "topics", "--entity-name", "kept",
                        "--add-config", "max.message.bytes=2000").returncode == 0
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-default",
                        "--add-config", "log.roll.ms=7200000").returncode == 0
    for process in ("controller", "1"):
        assert run_tide("cluster", "kill", process, "--signal", "KILL",
                        "--data-dir", str(cluster.data_dir)).returncode == 0
        assert run_tide("cluster", "start", process, "--data-dir", str(cluster.data_dir),
                        timeout_s=120).returncode == 0
    described = wait_for(lambda: (r := cluster.tide(
        "configs", "describe", "--entity-type", "topics", "--entity-name", "kept")
        ).returncode == 0 and r, "the controller back")
    assert "max.message.bytes=2000" in described.stdout
    # broker 1, restarted, has the dynamic default again (from UpdateMetadata)
    client = AdminClient({"bootstrap.servers": cluster.kafka})

    def broker_one_roll_ms():
        [(_, future)] = client.describe_configs(
            [ConfigResource(ResourceType.BROKER, "1")]).items()
        try:
            entry = future.result(30)["log.roll.ms"]
        except KafkaException:
            return None
        return (entry.value, entry.source) == (
            "7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    wait_for(broker_one_roll_ms, "broker 1's dynamic default after its restart")
    # and the leader (broker 1, the preferred replica, once it is back) refuses a large record
    def broker_one_leads():
        topic = topic_json(cluster, "kept")
        if topic is not None and topic["partitions"][0]["leader"] == 1:
            return True
        # back in the ISR: a preferred election gives it leadership (no automatic one here)
        cluster.tide("leader-election", "--election-type", "preferred", "--topic", "kept",
                     "--partition", "0")
        return False
    wait_for(broker_one_leads, "broker 1 leading again")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                                         "message.max.bytes": 10_000_000})
    errors = []
    producer.produce("kept", value=b"x" * 5000, on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(30) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert cluster.tide("configs", "alter", "--entity-type", "brokers", "--entity-default",
                        "--delete-config", "log.roll.ms").returncode == 0
