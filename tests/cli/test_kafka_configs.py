"""Issue 28: DescribeConfigs of BROKER resources (and topic configs) from Kafka's admin clients.

A real cluster whose brokers got ``--set log.retention.ms=3600000`` (Kafka's
broker-level name of the topics' default ``retention.ms``) and
``replica.lag.time.max.ms=4000``: confluent-kafka's and kafka-python's admin
clients describe broker 1 with those values as STATIC_BROKER_CONFIG, the rest as
DEFAULT_CONFIG, and synonyms naming the default each static value overrides.
"""

from __future__ import annotations

import socket
import struct

import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.broker.kafka import codec
from tidewater.proto import tidewater_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
DESCRIBE_CONFIGS, BROKER, BROKER_LOGGER = 32, 4, 8

from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ConfigResource,
    ConfigSource,
    ResourceType,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("configs"), 3, "log.retention.ms=3600000",
                      "replica.lag.time.max.ms=4000")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def describe_broker(c, broker: str, **options):
    admin = AdminClient({"bootstrap.servers": c.kafka})
    [(_, future)] = admin.describe_configs([ConfigResource(ResourceType.BROKER, broker)],
                                           **options).items()
    return future.result(30)


def test_confluent_admin_describes_a_brokers_settings_with_sources(cluster):
    for broker in ("1", "2"):
        configs = describe_broker(cluster, broker)
        assert configs["broker.id"].value == broker
    retention = configs["log.retention.ms"]
    assert retention.value == "3600000"
    assert retention.source == ConfigSource.STATIC_BROKER_CONFIG.value
    # a dynamic broker config (AlterConfigs may change it); others are read-only
    assert not retention.is_read_only and not retention.is_default
    assert configs["replica.lag.time.max.ms"].value == "4000"
    assert configs["replica.lag.time.max.ms"].is_read_only
    assert configs["replica.lag.time.max.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    segment = configs["log.segment.bytes"]
    assert (segment.value, segment.source) == (str(1 << 30), ConfigSource.DEFAULT_CONFIG.value)
    assert segment.is_default
    assert configs["auto.create.topics.enable"].value == "true"
    assert configs["message.max.bytes"].value == "1048588"


def test_synonyms_name_the_default_a_static_value_overrides(cluster):
    configs = describe_broker(cluster, "1")  # librdkafka always asks for synonyms
    # Kafka's list (the value in force, then the default) repeats the name; confluent-kafka
    # keys synonyms by name, so one of the two shows (kafka-python's test sees both).
    assert set(configs["log.retention.ms"].synonyms) == {"log.retention.ms"}
    [only] = configs["log.segment.bytes"].synonyms.values()
    assert (only.value, only.source) == (str(1 << 30), ConfigSource.DEFAULT_CONFIG.value)


def raw_describe(c, broker_index: int, resources: list[tuple[int, str]]) -> list:
    """DescribeConfigs v4 on the wire to one broker: [(error code, message, configs)]."""
    host, _, port = c.kafka.split(",")[broker_index].rpartition(":")
    values = {"resources": [{"resource_type": t, "resource_name": n,
                             "configuration_keys": None} for t, n in resources],
              "include_synonyms": False, "include_documentation": False}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(codec.encode_request(DESCRIBE_CONFIGS, 4, 9, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(DESCRIBE_CONFIGS, 4, s.recv(size, socket.MSG_WAITALL))
    return [(r.error_code, r.error_message, r.configs) for r in answer.results]


def test_broker_loggers_the_cluster_default_and_another_broker(cluster):
    # broker 1 answers (the first address is broker 1's, as cluster up lists them)
    [(logger_error, _, loggers), (default_error, _, defaults), (other_error, message, _)] = (
        raw_describe(cluster, 0, [(BROKER_LOGGER, "1"), (BROKER, ""), (BROKER, "2")]))
    assert (logger_error, loggers) == (pb.NONE, ())
    assert (default_error, defaults) == (pb.NONE, ())  # no dynamic cluster defaults
    assert other_error == pb.INVALID_REQUEST and "expected 1" in message


def test_kafka_python_admin_describes_a_broker(cluster):
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        described = admin.describe_configs(
            [KConfigResource(ConfigResourceType.BROKER, "3")], include_synonyms=True,
            config_filter="all")
        by_name = described["broker"]["3"]
        assert by_name["broker.id"]["value"] == "3"
        retention = by_name["log.retention.ms"]
        assert retention["value"] == "3600000"
        assert retention["config_source"] in (4, "STATIC_BROKER_CONFIG")
        # Kafka's precedence list: the value in force, then the default it overrides
        assert [(x["value"], x["source"]) for x in retention["synonyms"]] in (
            [("3600000", 4), (str(7 * 86_400_000), 5)],
            [("3600000", "STATIC_BROKER_CONFIG"), (str(7 * 86_400_000), "DEFAULT_CONFIG")])
        static = admin.describe_configs([KConfigResource(ConfigResourceType.BROKER, "3")],
                                        config_filter="static")
        assert set(static["broker"]["3"]) == {"broker.id", "log.retention.ms",
                                              "replica.lag.time.max.ms"}
    finally:
        admin.close()


def test_create_topics_takes_every_kafka_topic_config_and_describes_it(cluster):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    configs = {"compression.type": "zstd", "compression.zstd.level": "7",
               "preallocate": "true", "segment.jitter.ms": "100",
               "message.timestamp.after.max.ms": "60000",
               "leader.replication.throttled.replicas": "*", "retention.ms": "60000"}
    [(_, created)] = admin.create_topics([NewTopic("all-configs", 1, 3, config=configs)]).items()
    created.result(30)
    [(_, described)] = admin.describe_configs([ConfigResource("topic", "all-configs")]).items()
    got = described.result(30)
    for name, value in configs.items():
        assert (got[name].value, got[name].source) == (
            value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value), name
    # Not set: Kafka's default, as a default.
    assert (got["compression.gzip.level"].value, got["compression.gzip.level"].source) == (
        "-1", ConfigSource.DEFAULT_CONFIG.value)
    assert got["remote.storage.enable"].value == "false"

    refusals = {"bad-name": {"no.such.config": "1"},
                "bad-value": {"compression.type": "brotli"},
                "bad-level": {"compression.lz4.level": "99"},
                "tiered": {"remote.storage.enable": "true"}}
    futures = admin.create_topics([NewTopic(name, 1, 1, config=c)
                                   for name, c in refusals.items()])
    for name, future in futures.items():
        with pytest.raises(KafkaException) as refused:
            future.result(30)
        error = refused.value.args[0]
        assert error.code() == KafkaError.INVALID_CONFIG, (name, error)
        [(config, _)] = refusals[name].items()
        assert config in error.str(), error.str()


def test_kafka_python_creates_a_topic_with_a_config_we_only_store(cluster):
    from kafka.admin import KafkaAdminClient, NewTopic
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        admin.create_topics([NewTopic("kp-configs", 1, 1, topic_configs={
            "compression.type": "gzip", "file.delete.delay.ms": "0"})])
    finally:
        admin.close()
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, described)] = admin.describe_configs([ConfigResource("topic", "kp-configs")]).items()
    got = described.result(30)
    assert got["compression.type"].value == "gzip"
    assert got["file.delete.delay.ms"].value == "0"


def test_produce_answers_the_log_append_time_of_a_log_append_time_topic(cluster):
    import time

    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Producer
    from confluent_kafka.admin import NewTopic
    from kafka import KafkaProducer
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    topics = {"append-time": {"message.timestamp.type": "LogAppendTime"}, "create-time": {}}
    for future in admin.create_topics([NewTopic(name, 1, 3, config=c)
                                       for name, c in topics.items()]).values():
        future.result(30)
    time.sleep(1)  # the leaders learn their partitions
    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    reports = {}
    before = int(time.time() * 1000)
    for name in topics:
        producer.produce(name, b"v", timestamp=1_000_000,
                         on_delivery=lambda e, m: reports.setdefault(m.topic(), (e, m)))
    assert producer.flush(30) == 0
    after = int(time.time() * 1000)
    error, message = reports["append-time"]
    assert error is None
    kind, stamp = message.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= stamp <= after + 1000
    assert reports["create-time"][1].timestamp() == (TIMESTAMP_CREATE_TIME, 1_000_000)

    kp = KafkaProducer(bootstrap_servers=cluster.kafka, acks="all")
    try:
        appended = kp.send("append-time", b"w", timestamp_ms=1_000_000).get(30)
        created = kp.send("create-time", b"w", timestamp_ms=1_000_000).get(30)
    finally:
        kp.close()
    assert appended.timestamp >= before and created.timestamp == 1_000_000
