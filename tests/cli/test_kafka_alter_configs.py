"""Issue 28: AlterConfigs (33), IncrementalAlterConfigs (44) and ElectLeaders (43) from
Kafka's own admin clients against a real 3-broker cluster.

confluent-kafka's ``incremental_alter_configs`` / ``alter_configs`` and kafka-python's
``alter_configs`` change a topic's configs through the controller's metadata log: the
next DescribeConfigs shows them as DYNAMIC_TOPIC_CONFIG, and they take effect on the
replicas at once (a lowered max.message.bytes refuses a producer's record; a lowered
retention.ms deletes old segments). Dynamic broker configs, cluster-wide and per
broker, show with their sources and change what topics without their own value get;
kafka-python's ``alter_configs`` sets them on one broker (it cannot name the
cluster-wide ``""`` resource). ElectLeaders moves leadership back to the preferred replica.
"""

from __future__ import annotations

import socket
import struct

import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    OffsetSpec,
    ResourceType,
)

from tidewater.broker.kafka import codec  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Retention checked twice a second, and no automatic preferred elections: the
    # ElectLeaders test makes its own.
    c = start_cluster(tmp_path_factory.mktemp("alter-configs"), 3, "min.insync.replicas=2",
                      "log.retention.check.interval.ms=500",
                      "auto.leader.rebalance.enable=false")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def admin(c) -> AdminClient:
    return AdminClient({"bootstrap.servers": c.kafka})


def create(c, name: str, *configs: str, partitions: int = 1) -> None:
    args = ["topics", "create", name, "--partitions", str(partitions),
            "--replication-factor", "3"]
    for config in configs:
        args += ["--config", config]
    assert c.tide(*args).returncode == 0
    wait_for(lambda: fully_replicated(c, name), f"{name} fully replicated")


def incremental(c, resource_type, name: str, *ops: tuple[str, AlterConfigOpType, str | None],
                validate_only: bool = False) -> None:
    resource = ConfigResource(resource_type, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=op) for key, op, value in ops])
    client = admin(c)  # held: a dropped client fails its futures
    [(_, future)] = client.incremental_alter_configs([resource],
                                                     validate_only=validate_only).items()
    future.result(30)


def described(c, resource_type, name: str) -> dict:
    client = admin(c)
    [(_, future)] = client.describe_configs([ConfigResource(resource_type, name)]).items()
    return future.result(30)


def produce(c, topic: str, size: int) -> KafkaError | None:
    """One record of ``size`` bytes; its delivery error, None when stored."""
    producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka, "acks": "all",
                                         "message.max.bytes": 10_000_000})
    errors: list[KafkaError | None] = []
    producer.produce(topic, value=b"x" * size, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    return errors[0]


def test_max_message_bytes_set_refuses_a_record_and_delete_takes_it_back(cluster):
    create(cluster, "sized")
    assert produce(cluster, "sized", 5000) is None
    incremental(cluster, ResourceType.TOPIC, "sized",
                ("max.message.bytes", AlterConfigOpType.SET, "2000"))
    entry = described(cluster, ResourceType.TOPIC, "sized")["max.message.bytes"]
    assert (entry.value, entry.source) == ("2000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    error = produce(cluster, "sized", 5000)
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    incremental(cluster, ResourceType.TOPIC, "sized",
                ("max.message.bytes", AlterConfigOpType.DELETE, None))
    entry = described(cluster, ResourceType.TOPIC, "sized")["max.message.bytes"]
    assert (entry.value, entry.source) == ("1048588", ConfigSource.DEFAULT_CONFIG.value)
    assert produce(cluster, "sized", 5000) is None


def earliest(c, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    client = admin(c)
    return client.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset


def test_lowered_retention_ms_deletes_old_segments_on_every_replica(cluster):
    create(cluster, "aging", "segment.bytes=1024")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    for i in range(60):
        producer.produce("aging", value=b"r%04d" % i + b"." * 100)
        producer.flush(30)  # a batch each: segments of a few batches
    assert earliest(cluster, "aging") == 0
    incremental(cluster, ResourceType.TOPIC, "aging",
                ("retention.ms", AlterConfigOpType.SET, "1000"))
    wait_for(lambda: earliest(cluster, "aging") > 0, "old segments deleted", timeout_s=60)

    def replica_starts():
        result = cluster.tide("topics", "describe", "aging", "--json")
        import json
        [topic] = json.loads(result.stdout)["topics"]
        return [r["log_start_offset"] for r in topic["partitions"][0]["replicas_state"]]
    wait_for(lambda: all(start > 0 for start in replica_starts()), "every replica trimmed")


def test_append_subtract_validate_only_and_refusals(cluster):
    create(cluster, "policy")
    incremental(cluster, ResourceType.TOPIC, "policy",
                ("cleanup.policy", AlterConfigOpType.APPEND, "compact"))
    assert described(cluster, ResourceType.TOPIC, "policy")["cleanup.policy"].value == (
        "delete,compact")
    incremental(cluster, ResourceType.TOPIC, "policy",
                ("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"))
    assert described(cluster, ResourceType.TOPIC, "policy")["cleanup.policy"].value == "compact"
    incremental(cluster, ResourceType.TOPIC, "policy",
                ("retention.ms", AlterConfigOpType.SET, "5"), validate_only=True)
    retention = described(cluster, ResourceType.TOPIC, "policy")["retention.ms"]
    assert retention.source == ConfigSource.DEFAULT_CONFIG.value
    for ops, code in [((("retention.ms", AlterConfigOpType.SET, "soon"),),
                       KafkaError.INVALID_CONFIG),
                      ((("retention.ms", AlterConfigOpType.APPEND, "5"),),
                       KafkaError.INVALID_CONFIG),
                      ((("no.such.config", AlterConfigOpType.SET, "1"),),
                       KafkaError.INVALID_CONFIG)]:
        with pytest.raises(KafkaException) as refused:
            incremental(cluster, ResourceType.TOPIC, "policy", *ops)
        assert refused.value.args[0].code() == code
    with pytest.raises(KafkaException) as refused:
        incremental(cluster, ResourceType.TOPIC, "ghost",
                    ("retention.ms", AlterConfigOpType.SET, "5"))
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_legacy_alter_configs_replaces_the_topics_own_configs(cluster):
    create(cluster, "legacy", "retention.ms=86400000")
    client = admin(cluster)
    [(_, future)] = client.alter_configs([ConfigResource(
        ResourceType.TOPIC, "legacy", set_config={"segment.ms": "600000"})]).items()
    future.result(30)
    configs = described(cluster, ResourceType.TOPIC, "legacy")
    assert (configs["segment.ms"].value, configs["segment.ms"].source) == (
        "600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_kafka_python_alter_configs_both_apis(cluster):
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    create(cluster, "kp")
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        for use_incremental, value in ((True, "3600000"), (False, "7200000")):
            client.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "kp",
                                                  configs={"retention.ms": value})],
                                 incremental=use_incremental)
            by_name = client.describe_configs(
                [KConfigResource(ConfigResourceType.TOPIC, "kp")])["topic"]["kp"]
            assert by_name["retention.ms"]["value"] == value
    finally:
        client.close()


def wire(c, api_key: int, version: int, values: dict):
    """One request on Kafka's wire to the first broker; the decoded answer. (Neither
    confluent-kafka nor kafka-python sends the "" BROKER resource that kafka-configs.sh
    --entity-default sends.)"""
    host, _, port = c.kafka.split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(codec.encode_request(api_key, version, 7, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(api_key, version, s.recv(size, socket.MSG_WAITALL))
    return answer


def cluster_wide(c, *ops: tuple[str, int, str | None]) -> None:
    answer = wire(c, 44, 1, {"validate_only": False, "resources": [
        {"resource_type": 4, "resource_name": "", "configs": [
            {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}]})
    assert [r.error_code for r in answer.responses] == [0]


def cluster_wide_described(c) -> dict:
    answer = wire(c, 32, 4, {"resources": [{"resource_type": 4, "resource_name": "",
                                            "configuration_keys": None}],
                             "include_synonyms": False, "include_documentation": False})
    [result] = answer.results
    return {e.name: (e.value, e.config_source) for e in result.configs}


def test_dynamic_broker_configs_cluster_wide_and_per_broker(cluster):
    create(cluster, "plain")
    cluster_wide(cluster, ("message.max.bytes", 0, "3000"), ("log.retention.ms", 0, "86400000"))
    incremental(cluster, ResourceType.BROKER, "2",
                ("log.retention.ms", AlterConfigOpType.SET, "43200000"),
                ("log.roll.ms", AlterConfigOpType.SET, "3600000"))
    one, two = (described(cluster, ResourceType.BROKER, b) for b in ("1", "2"))
    assert (one["log.retention.ms"].value, one["log.retention.ms"].source) == (
        "86400000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert (two["log.retention.ms"].value, two["log.retention.ms"].source) == (
        "43200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert one["log.roll.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    # a topic that does not set it inherits the broker's (whichever broker answers, the
    # cluster-wide value: broker 2's own one is not message.max.bytes)
    topic = described(cluster, ResourceType.TOPIC, "plain")["max.message.bytes"]
    assert (topic.value, topic.source) == (
        "3000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    # Kafka's synonyms of a topic config: the broker-level layers it inherits, in order
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        by_name = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "plain")],
                                          include_synonyms=True,
                                          config_filter="all")["topic"]["plain"]
    finally:
        client.close()
    assert [(x["name"], x["value"], x["source"]) for x in by_name["max.message.bytes"]
            ["synonyms"]] in (
        [("message.max.bytes", "3000", 3), ("message.max.bytes", "1048588", 5)],
        [("message.max.bytes", "3000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
         ("message.max.bytes", "1048588", "DEFAULT_CONFIG")])
    assert two["message.max.bytes"].value == "3000" and not two["message.max.bytes"].is_read_only
    # the cluster-wide resource lists only what is set there
    assert cluster_wide_described(cluster) == {
        "log.retention.ms": ("86400000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
        "message.max.bytes": ("3000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)}
    # a topic without its own max.message.bytes takes the new broker default
    error = produce(cluster, "plain", 5000)
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(KafkaException) as refused:
        incremental(cluster, ResourceType.BROKER, "1",
                    ("replica.lag.time.max.ms", AlterConfigOpType.SET, "100"))
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    cluster_wide(cluster, ("message.max.bytes", 1, None), ("log.retention.ms", 1, None))
    incremental(cluster, ResourceType.BROKER, "2",
                ("log.retention.ms", AlterConfigOpType.DELETE, None),
                ("log.roll.ms", AlterConfigOpType.DELETE, None))
    assert produce(cluster, "plain", 5000) is None
    assert described(cluster, ResourceType.BROKER, "2")["log.retention.ms"].source == (
        ConfigSource.DEFAULT_CONFIG.value)


def leader_of(c, topic: str) -> tuple[int, list[int], list[int]]:
    result = c.tide("topics", "describe", topic, "--json")
    import json
    [t] = json.loads(result.stdout)["topics"]
    p = t["partitions"][0]
    return p["leader"], p["replicas"], p["isr"]


def test_elect_leaders_preferred_after_the_preferred_replica_returns(cluster):
    create(cluster, "elect")
    client = admin(cluster)
    tp = TopicPartition("elect", 0)
    results = client.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)
    assert results[tp] is not None and results[tp].code() == KafkaError.ELECTION_NOT_NEEDED
    leader, replicas, _ = leader_of(cluster, "elect")
    preferred = replicas[0]
    assert leader == preferred
    assert run_tide("cluster", "kill", str(preferred), "--signal", "TERM",
                    "--data-dir", str(cluster.data_dir)).returncode == 0
    wait_for(lambda: leader_of(cluster, "elect")[0] not in (-1, preferred), "a new leader")
    assert run_tide("cluster", "start", str(preferred), "--data-dir",
                    str(cluster.data_dir), timeout_s=120).returncode == 0
    wait_for(lambda: preferred in leader_of(cluster, "elect")[2], "the preferred replica in the ISR")
    assert leader_of(cluster, "elect")[0] != preferred  # no automatic rebalance here
    results = client.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)
    assert results[tp] is None
    assert leader_of(cluster, "elect")[0] == preferred
    unknown = TopicPartition("elect", 7)
    results = client.elect_leaders(ElectionType.UNCLEAN, [unknown, tp]).result(30)
    assert results[unknown].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert results[tp].code() == KafkaError.ELECTION_NOT_NEEDED


def test_aiokafka_alter_configs_and_kafka_python_elect_leaders(cluster):
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AType
    create(cluster, "aio")

    async def alter() -> list:
        client = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka)
        await client.start()
        try:
            return await client.alter_configs([AConfigResource(
                AType.TOPIC, "aio", configs={"max.message.bytes": "4000"})])
        finally:
            await client.close()
    [response] = asyncio.run(alter())
    [(code, _message, _type, name)] = response.resources
    assert (code, name) == (0, "aio")
    entry = described(cluster, ResourceType.TOPIC, "aio")["max.message.bytes"]
    assert (entry.value, entry.source) == ("4000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)

    from kafka.admin import KafkaAdminClient
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        answer = client.elect_leaders(0, {"aio": [0]}, raise_errors=False)
    finally:
        client.close()
    [(topic, [(partition, code, _message)])] = [
        (r[0], [tuple(p) for p in r[1]]) for r in answer.replica_election_results]
    assert (topic, partition, code) == ("aio", 0, KafkaError.ELECTION_NOT_NEEDED)


def test_message_timestamp_type_changed_to_log_append_time(cluster):
    import time
    create(cluster, "stamped")
    incremental(cluster, ResourceType.TOPIC, "stamped",
                ("message.timestamp.type", AlterConfigOpType.SET, "LogAppendTime"))
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    stamps = []
    producer.produce("stamped", value=b"v", timestamp=1_000_000_000_000,  # 2001
                     on_delivery=lambda err, msg: stamps.append((err, msg.timestamp())))
    assert producer.flush(30) == 0
    [(error, (kind, stamp))] = stamps
    assert error is None and kind == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
    assert abs(stamp - time.time() * 1000) < 60_000


def test_min_insync_replicas_lowered_at_run_time_lets_acks_all_through(cluster):
    """The topic has min.insync.replicas=2 (the cluster's); with one of its two replicas
    gone acks=all is refused, until AlterConfigs lowers it to 1. (Tidewater caps the rule
    at the replication factor, so raising it above the ISR of a full topic shows nothing.)"""
    assert cluster.tide("topics", "create", "guarded", "--replica-assignment",
                        "2:3").returncode == 0
    wait_for(lambda: sorted(leader_of(cluster, "guarded")[2]) == [2, 3], "a full ISR")
    assert run_tide("cluster", "kill", "3", "--signal", "TERM",
                    "--data-dir", str(cluster.data_dir)).returncode == 0
    try:
        wait_for(lambda: leader_of(cluster, "guarded")[2] == [2], "the ISR down to broker 2")
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                                             "message.timeout.ms": 5000, "retries": 0})
        errors: list = []
        producer.produce("guarded", value=b"v", on_delivery=lambda err, _m: errors.append(err))
        producer.flush(30)
        assert errors[0] is not None and errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS
        incremental(cluster, ResourceType.TOPIC, "guarded",
                    ("min.insync.replicas", AlterConfigOpType.SET, "1"))
        errors.clear()
        producer.produce("guarded", value=b"v", on_delivery=lambda err, _m: errors.append(err))
        producer.flush(30)
        assert errors == [None]
    finally:
        assert run_tide("cluster", "start", "3", "--data-dir", str(cluster.data_dir),
                        timeout_s=120).returncode == 0


def test_kafka_dynamic_broker_configs_without_an_effect_are_stored_and_described(cluster):
    """Kafka lets these change at run time (librdkafka's admin test sets
    sasl.kerberos.min.time.before.relogin on a broker): they are accepted with Kafka's
    type checked, kept and described as dynamic, a password never in clear."""
    incremental(cluster, ResourceType.BROKER, "3",
                ("sasl.kerberos.min.time.before.relogin", AlterConfigOpType.SET, "58000"),
                ("num.io.threads", AlterConfigOpType.SET, "16"),
                ("sasl.jaas.config", AlterConfigOpType.SET, "secret-module required;"))
    three = described(cluster, ResourceType.BROKER, "3")
    relogin = three["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.value, relogin.source, relogin.is_read_only) == (
        "58000", ConfigSource.DYNAMIC_BROKER_CONFIG.value, False)
    assert three["num.io.threads"].value == "16"
    assert three["sasl.jaas.config"].is_sensitive and three["sasl.jaas.config"].value is None
    assert "num.io.threads" not in described(cluster, ResourceType.BROKER, "1")
    with pytest.raises(KafkaException) as refused:
        incremental(cluster, ResourceType.BROKER, "3",
                    ("num.io.threads", AlterConfigOpType.SET, "many"))
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    incremental(cluster, ResourceType.BROKER, "3",
                ("num.io.threads", AlterConfigOpType.DELETE, None))
    assert "num.io.threads" not in described(cluster, ResourceType.BROKER, "3")


def test_kafka_python_alters_broker_configs_per_broker_and_cluster_wide(cluster):
    """kafka-python's ``KafkaAdminClient.alter_configs`` on BROKER resources, checked with
    its ``describe_configs``: IncrementalAlterConfigs (its default) and legacy
    AlterConfigs (``incremental=False``, which first reads the broker's dynamic configs
    back so as not to drop them) on one broker; ``reset_configs`` deletes. kafka-python
    routes a BROKER resource to ``int(name)`` and so refuses the cluster-wide ``""``
    resource (ValueError, before sending): that one is set here on the wire, and
    kafka-python's describe of each broker shows it in force, under a broker's own value."""
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    def broker(name: str, configs=None):
        return KConfigResource(ConfigResourceType.BROKER, name, configs=configs)

    def described_by_kafka_python(client, broker_id: str) -> dict:
        return client.describe_configs([broker(broker_id)], config_filter="all")[
            "broker"][broker_id]

    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        assert client.alter_configs([broker("2", {"log.retention.ms": "43200000"})]) == {
            "broker": {"2": "OK"}}
        assert client.alter_configs([broker("2", {"log.roll.ms": "3600000"})],
                                    incremental=False) == {"broker": {"2": "OK"}}
        two, one = (described_by_kafka_python(client, b) for b in ("2", "1"))
        assert (two["log.retention.ms"]["value"], two["log.retention.ms"]["config_source"]) == (
            "43200000", "DYNAMIC_BROKER_CONFIG")
        assert (two["log.roll.ms"]["value"], two["log.roll.ms"]["config_source"]) == (
            "3600000", "DYNAMIC_BROKER_CONFIG")
        assert one["log.retention.ms"]["config_source"] == "DEFAULT_CONFIG"
        modified = client.describe_configs([broker("2")])["broker"]["2"]  # 'modified' filter
        assert {"log.retention.ms", "log.roll.ms"} <= set(modified)
        # A read-only broker config: kafka-python refuses it itself (not dynamic per the
        # describe), and with raise_on_unknown=False the broker answers INVALID_REQUEST.
        with pytest.raises(ValueError, match="replica.lag.time.max.ms"):
            client.alter_configs([broker("1", {"replica.lag.time.max.ms": "100"})])
        refused = client.alter_configs([broker("1", {"replica.lag.time.max.ms": "100"})],
                                       raise_on_unknown=False)
        assert "InvalidRequestError" in refused["broker"]["1"], refused

        with pytest.raises(ValueError, match="integer"):
            client.alter_configs([broker("", {"log.retention.ms": "86400000"})])
        cluster_wide(cluster, ("log.retention.ms", 0, "86400000"))
        two, one = (described_by_kafka_python(client, b) for b in ("2", "1"))
        assert (one["log.retention.ms"]["value"], one["log.retention.ms"]["config_source"]) == (
            "86400000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        assert (two["log.retention.ms"]["value"], two["log.retention.ms"]["config_source"]) == (
            "43200000", "DYNAMIC_BROKER_CONFIG")  # the broker's own value wins

        assert client.reset_configs([broker("2", ["log.retention.ms", "log.roll.ms"])]) == {
            "broker": {"2": "OK"}}
        two = described_by_kafka_python(client, "2")
        assert (two["log.retention.ms"]["value"], two["log.retention.ms"]["config_source"]) == (
            "86400000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        assert two["log.roll.ms"]["config_source"] == "DEFAULT_CONFIG"
    finally:
        cluster_wide(cluster, ("log.retention.ms", 1, None))
        client.close()
    assert cluster_wide_described(cluster) == {}
