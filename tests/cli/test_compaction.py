"""Issue 16, compacted topics, against ``tide cluster up``: a topic created with
``tide topics create --config cleanup.policy=compact`` and small segments takes many
updates per key from confluent-kafka; every broker's cleaner compacts its replica;
confluent-kafka, kafka-python and aiokafka consumers reading from the beginning see
the latest value per key at its original offset (deleted keys gone), and the three
replicas agree record for record wherever they both still hold an offset. Then
brokers are SIGKILLed while they clean, and the replicas still agree."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

from tidewater.proto.batch import iter_batches
from tidewater.proto.records import decode_batch_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, ConfigResource  # noqa: E402

TOPIC = "compacted"
KEYS = 25
UPDATES = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("compaction"), 3, "log.cleaner.backoff.ms=300",
                      "log.cleaner.io.max.bytes.per.second=4000000")
    c.kafka = c.manifest()["kafka_bootstrap"]
    yield c
    stop_cluster(c)


def replica_records(data_dir: Path, topic: str = TOPIC) -> dict[int, tuple[bytes | None, bytes | None]]:
    """offset -> (key, value) of every record in one replica's segment files, read with the
    batch decoder (CRC-checked), not through the broker. A cleaner swapping segments
    meanwhile removes a listed file: the reading starts over."""
    for _attempt in range(50):
        out = {}
        try:
            for path in sorted((data_dir / f"{topic}-0").glob("*.log")):
                data = path.read_bytes()
                try:
                    for position, header in iter_batches(data):
                        for record in decode_batch_records(data, position, header):
                            out[record.offset] = (record.key, record.value)
                except Exception:  # the active segment's tail may be mid-append
                    pass
        except FileNotFoundError:
            continue
        return out
    raise AssertionError(f"{data_dir} kept changing while read")


def replay(records) -> dict[bytes, tuple[int, bytes]]:
    """key -> (offset, value) after applying ``records`` in order (a tombstone deletes)."""
    state: dict[bytes, tuple[int, bytes]] = {}
    for offset, key, value in records:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = (offset, value)
    return state


def cleaner_runs(c) -> list[float]:
    runs = []
    for process in c.manifest()["processes"].values():
        if process["kind"] != "broker":
            continue
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{process['metrics_port']}/metrics", timeout=10).read().decode()
        runs += [float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("tidewater_broker_cleaner_runs_total")]
    return runs


def test_a_compacted_topic_keeps_the_latest_value_per_key_on_every_replica(cluster):
    created = cluster.tide("topics", "create", TOPIC, "--partitions", "1",
                           "--replication-factor", "3", "--config", "cleanup.policy=compact",
                           "--config", "segment.bytes=4096", "--config",
                           "min.cleanable.dirty.ratio=0.1", "--config", "delete.retention.ms=0")
    assert created.returncode == 0, created.stderr
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the topic fully replicated")

    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, future)] = admin.describe_configs([ConfigResource("topic", TOPIC)]).items()
    configs = future.result(30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["min.cleanable.dirty.ratio"].value == "0.1"
    assert configs["delete.retention.ms"].value == "0"

    rng = random.Random(16)
    produced: dict[int, tuple[bytes, bytes | None]] = {}
    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all", "linger.ms": 5,
                         "batch.size": 2000})  # batches fit the small segments

    def on_delivery(error, message):
        assert error is None, error
        produced[message.offset()] = (message.key(), message.value())

    for i in range(UPDATES):
        key = b"key-%02d" % rng.randrange(KEYS)
        value = None if i % 97 == 0 else b"value-%d-" % i + b"x" * rng.randrange(40)
        producer.produce(TOPIC, key=key, value=value, partition=0, on_delivery=on_delivery)
        if i % 500 == 0:
            producer.flush(30)
    assert producer.flush(30) == 0
    assert len(produced) == UPDATES

    brokers = [Path(p["data_dir"]) for p in cluster.manifest()["processes"].values()
               if p["kind"] == "broker"]
    # Every replica's cleaner ran: each holds far fewer records than were produced.
    wait_for(lambda: all(len(replica_records(d)) < UPDATES / 3 for d in brokers),
             "every replica compacted", timeout_s=120)
    wait_for(lambda: len([r for r in cleaner_runs(cluster) if r > 0]) == 3,
             "every broker's cleaner_runs metric counting")  # counted when a pass ends

    def cleaners_done() -> bool:
        # delete.retention.ms=0: a reader racing the cleaner could miss a tombstone (what
        # the setting is for), so the readers below start once the replicas stay put.
        before = [replica_records(d) for d in brokers]
        time.sleep(1.0)
        return before == [replica_records(d) for d in brokers]

    wait_for(cleaners_done, "the cleaners done")

    consumer = Consumer({"bootstrap.servers": cluster.kafka, "group.id": "compaction-test",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    seen = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(message.error())
            seen.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    assert seen and seen[-1][0] == max(produced)
    # Each record read is the one produced at that offset (offsets kept), fewer than sent.
    assert all(produced[offset] == (key, value) for offset, key, value in seen)
    assert len(seen) < UPDATES / 3
    # Replaying what the consumer read gives the latest value of every key.
    expected = replay((offset, key, value) for offset, (key, value) in sorted(produced.items()))
    assert replay(seen) == expected

    # kafka-python reads the same records (gaps and emptied batches included).
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPythonPartition
    reader = KafkaConsumer(bootstrap_servers=cluster.kafka.split(","), enable_auto_commit=False,
                           consumer_timeout_ms=5000)
    reader.assign([KafkaPythonPartition(TOPIC, 0)])
    reader.seek_to_beginning()
    by_kafka_python = []
    for message in reader:
        by_kafka_python.append((message.offset, message.key, message.value))
        if message.offset >= seen[-1][0]:
            break
    reader.close()
    # The cleaners may have gone on since: a later reading holds at most what the first did.
    assert set(by_kafka_python) <= set(seen) and replay(by_kafka_python) == expected

    # So does aiokafka.
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition

    async def read_with_aiokafka() -> list:
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka.split(","),
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            partition = AioPartition(TOPIC, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            out: list = []
            while not out or out[-1][0] < seen[-1][0]:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                out += [(m.offset, m.key, m.value) for m in batches.get(partition, [])]
            return out
        finally:
            await consumer.stop()

    by_aiokafka = asyncio.run(read_with_aiokafka())
    assert set(by_aiokafka) <= set(seen) and replay(by_aiokafka) == expected

    # The replicas agree wherever two hold the same offset, and on each key's latest record.
    replicas = [replica_records(d) for d in brokers]
    for a in replicas:
        for b in replicas:
            for offset in a.keys() & b.keys():
                assert a[offset] == b[offset], offset
    for replica in replicas:
        assert all(replica.get(offset) == (key, value)
                   for key, (offset, value) in expected.items())
    print(json.dumps({"produced": UPDATES, "read": len(seen),
                      "replica_records": [len(r) for r in replicas]}))


def test_kafka_create_topics_takes_and_checks_the_cleanup_policy(cluster):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, created)] = admin.create_topics([NewTopic(
        "both", num_partitions=1, replication_factor=3,
        config={"cleanup.policy": "compact,delete", "min.compaction.lag.ms": "5000"})]).items()
    created.result(30)
    [(_, future)] = admin.describe_configs([ConfigResource("topic", "both")]).items()
    configs = future.result(30)
    assert configs["cleanup.policy"].value == "compact,delete"
    assert configs["min.compaction.lag.ms"].value == "5000"
    assert configs["min.cleanable.dirty.ratio"].value == "0.5"  # the default, as Kafka's
    [(_, refused)] = admin.create_topics([NewTopic(
        "shredded", num_partitions=1, replication_factor=3,
        config={"cleanup.policy": "shred"})]).items()
    with pytest.raises(KafkaException) as error:
        refused.result(30)
    assert error.value.args[0].name() == "INVALID_CONFIG"


def test_replicas_agree_after_brokers_are_killed_while_they_clean(cluster):
    """SIGKILL brokers while records arrive and cleaners swap segments: each restarts
    (recovery finishes or drops an interrupted swap), catches up, and every replica
    still holds the latest value of every key at its offset, agreeing on every offset
    two of them hold."""
    topic = "chaos-compacted"
    created = cluster.tide("topics", "create", topic, "--partitions", "1",
                           "--replication-factor", "3", "--config", "cleanup.policy=compact",
                           "--config", "segment.bytes=3000", "--config",
                           "min.cleanable.dirty.ratio=0.01", "--config", "min.insync.replicas=2")
    assert created.returncode == 0, created.stderr
    wait_for(lambda: fully_replicated(cluster, topic), "the topic fully replicated")
    rng = random.Random(7)
    produced: dict[int, tuple[bytes, bytes]] = {}

    def on_delivery(error, message):
        if error is None:
            produced[message.offset()] = (message.key(), message.value())

    producer = Producer({"bootstrap.servers": cluster.kafka, "acks": "all", "linger.ms": 5,
                         "batch.size": 2000, "message.timeout.ms": 60000})
    data_dir = str(cluster.data_dir)
    for round_ in range(3):
        victim = str(1 + round_ % 3)
        for i in range(400):
            key = b"key-%02d" % rng.randrange(10)
            producer.produce(topic, key=key, value=b"r%d-%d" % (round_, i), partition=0,
                             on_delivery=on_delivery)
            producer.poll(0)
            if i == 200:  # mid-stream: its cleaner is most likely swapping now
                killed = run_tide("cluster", "kill", victim, "--data-dir", data_dir)
                assert killed.returncode == 0, killed.stderr
        producer.flush(60)
        started = run_tide("cluster", "start", victim, "--data-dir", data_dir, timeout_s=90)
        assert started.returncode == 0, started.stderr
        wait_for(lambda: fully_replicated(cluster, topic), "the ISR whole again", timeout_s=90)
    assert producer.flush(60) == 0
    assert len(produced) > 600

    brokers = [Path(p["data_dir"]) for p in cluster.manifest()["processes"].values()
               if p["kind"] == "broker"]
    expected = replay((o, k, v) for o, (k, v) in sorted(produced.items()))

    def replicas_settled():
        replicas = [replica_records(d, topic) for d in brokers]
        if not all(max(r, default=-1) >= max(produced) for r in replicas):
            return None  # a follower still catching up
        return replicas

    replicas = wait_for(replicas_settled, "every replica caught up", timeout_s=90)
    for replica in replicas:
        for offset, record in replica.items():
            assert produced.get(offset, record) == record, offset  # never another record
        assert all(replica.get(offset) == (key, value)
                   for key, (offset, value) in expected.items())
    for a in replicas:
        for b in replicas:
            assert all(a[o] == b[o] for o in a.keys() & b.keys())
    # A restart may cut a torn tail, never a compacted log at one of its offset gaps (the
    # broker opens its logs before it learns the topic's configs: the .compacted marker).
    for process in cluster.manifest()["processes"].values():
        text = Path(process["log"]).read_text(errors="replace")
        assert not [line for line in text.splitlines()
                    if "recovery: cut" in line and "was expected" in line]
