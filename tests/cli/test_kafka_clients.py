"""Issue 15: Kafka clients we did not write against ``tide cluster up``'s Kafka listeners.

kcat (Debian's, librdkafka 2.0.2), confluent-kafka (librdkafka 2.16),
kafka-python and aiokafka produce to and consume from the same brokers the
gRPC client uses, through the same produce and fetch paths; a record written
by one side is read byte for byte by the other.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid

import pytest
from cluster_fixtures import kafka_cluster, run_tide

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

KCAT = shutil.which("kcat")
# `cluster up --rack az-a,az-b`: the names go round, so broker 3 is in az-a again.
RACKS = {1: "az-a", 2: "az-b", 3: "az-a"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from kafka_cluster(tmp_path_factory, "kafka", up_flags=("--rack", "az-a,az-b"))


def new_topic(c, partitions=3) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.kafka})
    [(_, future)] = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=3)]).items()
    future.result(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every replica in the ISR
        result = c.tide("topics", "describe", name, "--json")
        if result.returncode == 0:
            [topic] = json.loads(result.stdout)["topics"]
            if all(len(p["isr"]) == 3 and p["leader"] >= 0 for p in topic["partitions"]):
                return name
        time.sleep(0.2)
    pytest.fail(f"{name} not fully replicated")


def consume_confluent(c, topic: str, count: int, partitions=3, timeout_s=30) -> list:
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": "assign-only",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
    finally:
        consumer.close()
    return got


def test_manifest_and_cli_name_the_kafka_bootstrap(cluster):
    brokers = [p for p in cluster.manifest()["processes"].values() if p["kind"] == "broker"]
    assert cluster.kafka.split(",") == [b["kafka"] for b in brokers]
    assert not set(cluster.kafka.split(",")) & set(cluster.bootstrap.split(","))


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_with_every_acks_and_compression(cluster, compression):
    topic = new_topic(cluster)
    delivered = []

    def on_delivery(error, message):
        assert error is None, error
        delivered.append((message.partition(), message.offset(), message.key()))

    sent = 0
    for acks in ("0", "1", "all"):
        producer = Producer({"bootstrap.servers": cluster.kafka, "acks": acks,
                             "compression.type": compression, "linger.ms": 5})
        for i in range(40):
            producer.produce(topic, key=f"{acks}-{i}".encode(), value=f"value-{i}".encode() * 5,
                             headers=[("source", b"confluent"), ("n", str(i).encode())],
                             on_delivery=on_delivery)
            sent += 1
        assert producer.flush(30) == 0
    # acks=0 reports no offsets; 1 and all report one each, all distinct.
    acknowledged = [(p, o) for p, o, key in delivered if not key.startswith(b"0-")]
    assert len(acknowledged) == 80 and len(set(acknowledged)) == 80
    assert all(o is not None and o >= 0 for _, o in acknowledged)
    messages = consume_confluent(cluster, topic, sent)
    assert len(messages) == sent
    by_key = {m.key(): m for m in messages}
    assert by_key[b"all-7"].value() == b"value-7" * 5
    assert by_key[b"all-7"].headers() == [("source", b"confluent"), ("n", b"7")]


def test_acks_all_below_min_insync_replicas_is_not_enough_replicas(cluster, tmp_path):
    topic = new_topic(cluster, partitions=1)
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    describe = cluster.tide("topics", "describe", topic, "--json")
    [info] = json.loads(describe.stdout)["topics"]
    followers = [r for r in info["partitions"][0]["replicas"]
                 if r != info["partitions"][0]["leader"]]
    for broker in followers:  # the leader alone: ISR 1 < min.insync.replicas 2
        assert run_tide("cluster", "kill", str(broker), "--signal", "KILL",
                        "--data-dir", str(cluster.data_dir)).returncode == 0
    leader = info["partitions"][0]["leader"]

    def isr_is_the_leader_alone():
        result = cluster.tide("topics", "describe", topic, "--json")
        [now] = json.loads(result.stdout)["topics"] if result.returncode == 0 else [None]
        return now is not None and now["partitions"][0]["isr"] == [leader]
    try:
        deadline = time.monotonic() + 30
        while not isr_is_the_leader_alone():
            assert time.monotonic() < deadline, "the ISR did not shrink"
            time.sleep(0.2)
        errors = []
        producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                             "message.timeout.ms": 8000, "retries": 0})
        producer.produce(topic, value=b"x", on_delivery=lambda e, m: errors.append(e))
        producer.flush(30)
        assert len(errors) == 1 and errors[0] is not None
        assert errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS, errors[0]
    finally:
        for broker in followers:
            run_tide("cluster", "start", str(broker), "--data-dir", str(cluster.data_dir),
                     timeout_s=90)
    del admin


def test_admin_client_creates_and_deletes_topics(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    name = f"admin-{uuid.uuid4().hex[:6]}"
    [(_, created)] = admin.create_topics([NewTopic(name, 2, 3)]).items()
    created.result(30)
    [(_, again)] = admin.create_topics([NewTopic(name, 2, 3)]).items()
    with pytest.raises(confluent_kafka.KafkaException) as exists:
        again.result(30)
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert name in admin.list_topics(timeout=10).topics
    [(_, deleted)] = admin.delete_topics([name]).items()
    deleted.result(30)
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name not in admin.list_topics(timeout=10).topics


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it "
                                         "from Debian where apt works)")
def test_kcat_lists_produces_and_consumes(cluster):
    topic = new_topic(cluster)
    listed = subprocess.run([KCAT, "-b", cluster.kafka, "-L", "-t", topic], capture_output=True,
                            text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert "3 brokers" in listed.stdout and f'topic "{topic}" with 3 partitions' in listed.stdout
    lines = "".join(f"key{i}:value{i}\n" for i in range(300))
    produced = subprocess.run([KCAT, "-b", cluster.kafka, "-P", "-t", topic, "-K:",
                               "-X", "acks=all", "-z", "snappy"],
                              input=lines, capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([KCAT, "-b", cluster.kafka, "-C", "-t", topic, "-o", "beginning",
                               "-e", "-q", "-f", "%k=%s\n"],
                              capture_output=True, text=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.splitlines()) == sorted(f"key{i}=value{i}"
                                                          for i in range(300))


def test_kafka_python_and_aiokafka_produce_and_consume(cluster):
    kafka = pytest.importorskip("kafka")
    topic = new_topic(cluster)
    servers = cluster.kafka.split(",")
    # kafka-python 3's defaults: idempotent (InitProducerId), acks=all.
    producer = kafka.KafkaProducer(bootstrap_servers=servers)
    for i in range(100):
        producer.send(topic, key=b"kp%d" % i, value=b"kafka-python %d" % i,
                      headers=[("h", b"v")]).get(timeout=30)
    producer.close()

    async def with_aiokafka():
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka import TopicPartition as AioTopicPartition
        aio_producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all")
        await aio_producer.start()
        try:
            for i in range(100):
                await aio_producer.send_and_wait(topic, b"aiokafka %d" % i, key=b"a%d" % i)
        finally:
            await aio_producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(topic, p) for p in range(3)])
            await consumer.seek_to_beginning()
            values = []
            deadline = time.monotonic() + 30
            while len(values) < 200 and time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    values += [m.value for m in messages]
            return values
        finally:
            await consumer.stop()

    aio_values = asyncio.run(with_aiokafka())
    consumer = kafka.KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                                   consumer_timeout_ms=3000)
    consumer.assign([kafka.TopicPartition(topic, p) for p in range(3)])
    consumer.seek_to_beginning()
    kp_values = [m.value for m in consumer]
    consumer.close()
    expected = sorted([b"kafka-python %d" % i for i in range(100)] +
                      [b"aiokafka %d" % i for i in range(100)])
    assert sorted(aio_values) == expected and sorted(kp_values) == expected


def test_grpc_and_kafka_clients_read_each_others_records_byte_for_byte(cluster):
    from tidewater.client.consumer import Consumer as GrpcConsumer
    from tidewater.client.producer import Producer as GrpcProducer

    topic = new_topic(cluster, partitions=1)
    grpc_producer = GrpcProducer(cluster.bootstrap, acks=-1)
    grpc_producer.send(topic, b"from-grpc", key=b"k1", partition=0,
                       headers=[("h", b"\x00\x01")], timestamp_ms=1_700_000_000_123).result(30)
    grpc_producer.close()
    kafka_producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    kafka_producer.produce(topic, value=b"from-kafka", key=b"k2", partition=0,
                           headers=[("h", b"\x02")], timestamp=1_700_000_000_456)
    assert kafka_producer.flush(30) == 0
    [first, second] = consume_confluent(cluster, topic, 2, partitions=1)
    assert (first.key(), first.value(), first.headers(), first.timestamp()[1]) == \
        (b"k1", b"from-grpc", [("h", b"\x00\x01")], 1_700_000_000_123)
    assert (second.key(), second.value(), second.offset()) == (b"k2", b"from-kafka", 1)
    grpc_consumer = GrpcConsumer(cluster.bootstrap, auto_offset_reset="earliest")
    grpc_consumer.assign([(topic, 0)])
    records = []
    deadline = time.monotonic() + 30
    while len(records) < 2 and time.monotonic() < deadline:
        records += grpc_consumer.poll(timeout_ms=500)
    grpc_consumer.close()
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in records][1] == \
        (b"k2", b"from-kafka", [("h", b"\x02")], 1_700_000_000_456)


def test_kafka_requests_show_in_the_brokers_metrics(cluster):
    import urllib.request

    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    # A topic that does not exist: Metadata answers UNKNOWN_TOPIC_OR_PARTITION for it
    # (while it is auto-created, as Kafka's KRaft brokers answer).
    admin.list_topics(topic=f"missing-{uuid.uuid4().hex[:6]}", timeout=10)
    text = ""
    for process in cluster.manifest()["processes"].values():
        if process["kind"] == "broker":
            url = f"http://127.0.0.1:{process['metrics_port']}/metrics"
            text += urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'request_latency_seconds_count{rpc="kafka:Metadata"}' in text
    assert 'request_latency_seconds_count{rpc="kafka:ApiVersions"}' in text
    assert 'error="UNKNOWN_TOPIC_OR_PARTITION",rpc="kafka:Metadata"' in text or \
        'rpc="kafka:Metadata",error="UNKNOWN_TOPIC_OR_PARTITION"' in text


def test_admin_client_describes_topic_configs_and_the_cluster(cluster):
    from confluent_kafka.admin import ConfigResource, ConfigSource

    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    name = f"configs-{uuid.uuid4().hex[:6]}"
    [(_, created)] = admin.create_topics([NewTopic(name, 1, 3, config={
        "retention.ms": "3600000", "cleanup.policy": "delete"})]).items()
    created.result(30)
    [(_, described)] = admin.describe_configs([ConfigResource("topic", name)]).items()
    configs = described.result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # The cluster's min.insync.replicas=2 (cluster up) was written into the topic.
    assert configs["min.insync.replicas"].value == "2"
    # Not set on the topic: the broker's default.
    assert configs["segment.bytes"].value == str(1 << 30)
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    [(_, missing)] = admin.describe_configs([ConfigResource("topic", "no-such-topic")]).items()
    with pytest.raises(confluent_kafka.KafkaException) as unknown:
        missing.result(30)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    described_cluster = admin.describe_cluster(request_timeout=30).result(30)
    assert sorted(node.id for node in described_cluster.nodes) == [1, 2, 3]
    assert {f"{n.host}:{n.port}" for n in described_cluster.nodes} == \
        set(cluster.kafka.split(","))
    assert described_cluster.cluster_id
    assert {n.id: n.rack for n in described_cluster.nodes} == RACKS


def test_every_client_sees_each_brokers_rack(cluster):
    """broker.rack travels broker -> controller (RegisterBroker) -> brokers (UpdateMetadata)
    -> clients (Kafka Metadata v1+, DescribeCluster, the gRPC Metadata and tide)."""
    kafka = pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient

    # librdkafka's Metadata (list_topics) keeps no rack; its describe_cluster does (above).
    servers = cluster.kafka.split(",")
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        described = admin.describe_cluster()
    finally:
        admin.close()
    assert {b["broker_id"]: b["rack"] for b in described["brokers"]} == RACKS
    consumer = kafka.KafkaConsumer(bootstrap_servers=servers)
    try:
        consumer.topics()  # a Metadata request
        brokers = consumer._client.cluster.brokers()
    finally:
        consumer.close()
    assert {b.node_id: b.rack for b in brokers} == RACKS

    from tidewater.client.metadata import ChannelPool, parse_address
    from tidewater.proto import tidewater_pb2 as pb

    pool = ChannelPool()
    try:
        answer = pool.broker(parse_address(cluster.bootstrap.split(",")[0])).Metadata(
            pb.MetadataRequest(), timeout=30)
    finally:
        pool.close()
    assert {b.broker_id: b.rack for b in answer.brokers} == RACKS
    shown = json.loads(run_tide("cluster", "describe", "--json", "--bootstrap-server",
                                cluster.bootstrap).stdout)
    assert {b["id"]: b["rack"] for b in shown["brokers"]} == RACKS
    text = run_tide("cluster", "describe", "--bootstrap-server", cluster.bootstrap).stdout
    for broker_id, rack in RACKS.items():
        line = next(x for x in text.splitlines() if x.startswith(f"Broker {broker_id}\t"))
        assert line.endswith(f"rack {rack}"), line


def test_admin_client_adds_partitions_that_take_records(cluster):
    from confluent_kafka.admin import NewPartitions

    topic = new_topic(cluster, partitions=1)
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, grown)] = admin.create_partitions([NewPartitions(topic, 3)]).items()
    grown.result(30)
    [(_, smaller)] = admin.create_partitions([NewPartitions(topic, 2)]).items()
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        smaller.result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all"})
    for partition in range(3):
        producer.produce(topic, value=b"p%d" % partition, partition=partition)
    assert producer.flush(30) == 0
    messages = consume_confluent(cluster, topic, 3)
    assert sorted((m.partition(), m.value()) for m in messages) == [
        (0, b"p0"), (1, b"p1"), (2, b"p2")]


def test_admin_client_lists_earliest_latest_and_max_timestamp_offsets(cluster):
    from confluent_kafka import TopicPartition as TP
    from confluent_kafka.admin import OffsetSpec

    topic = new_topic(cluster, partitions=1)
    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all", "linger.ms": 0})
    for i, ts in enumerate([5000, 9000, 7000, 9000, 3000]):
        producer.produce(topic, value=b"%d" % i, partition=0, timestamp=1_700_000_000_000 + ts)
        producer.flush(30)
    admin = AdminClient({"bootstrap.servers": cluster.kafka})

    def offset_for(spec):
        [(_, future)] = admin.list_offsets({TP(topic, 0): spec}).items()
        info = future.result(30)
        return info.offset, info.timestamp

    assert offset_for(OffsetSpec.earliest())[0] == 0
    assert offset_for(OffsetSpec.latest())[0] == 5
    assert offset_for(OffsetSpec.max_timestamp()) == (1, 1_700_000_009_000)
    assert offset_for(OffsetSpec.for_timestamp(1_700_000_006_000))[0] == 1
