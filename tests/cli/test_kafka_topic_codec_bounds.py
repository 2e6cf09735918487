"""Issue 28: compression.type (broker-side recompression) and KIP-937 timestamp bounds
take effect on a real 3-broker cluster, driven by confluent-kafka and raw Kafka frames.

A topic with compression.type=zstd receives lz4 and uncompressed batches: every
replica's segments (``tide dump-log``) hold zstd batches only, and the records read
back are the ones sent. An idempotent producer's batch keeps its producer id and
sequence through the rewrite, so a retry of it is recognised as a duplicate.
AlterConfigs switching compression.type takes effect at run time. A topic with
message.timestamp.before.max.ms=3600000 refuses a record two hours old with
INVALID_TIMESTAMP and takes a current one.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest
from cluster_fixtures import (
    describe_topic,
    fully_replicated,
    run_tide,
    start_cluster,
    stop_cluster,
    wait_for,
)

from tidewater.broker.kafka import codec
from tidewater.proto.compression import COMPRESSION_LZ4, COMPRESSION_ZSTD
from tidewater.proto.records import SimpleRecord, encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

PRODUCE, INIT_PRODUCER_ID = 0, 22
INVALID_TIMESTAMP = 32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("codec-bounds"), 3, "min.insync.replicas=2")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def create(c, name: str, *configs: str) -> None:
    args = ["topics", "create", name, "--partitions", "1", "--replication-factor", "3"]
    for config in configs:
        args += ["--config", config]
    created = c.tide(*args)
    assert created.returncode == 0, created.stderr
    wait_for(lambda: fully_replicated(c, name), f"{name} fully replicated")


def call(address: str, api_key: int, version: int, values: dict):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.settimeout(30)
        s.sendall(codec.encode_request(api_key, version, 13, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(api_key, version, s.recv(size, socket.MSG_WAITALL))
    return answer


def leader_address(c, topic: str) -> str:
    described = describe_topic(c, topic)
    assert described is not None
    return c.kafka.split(",")[described["partitions"][0]["leader"] - 1]


def produce_raw(c, topic: str, records: bytes):
    answer = call(leader_address(c, topic), PRODUCE, 9, {
        "transactional_id": None, "acks": -1, "timeout": 30000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    [[partition]] = [t.partition_responses for t in answer.responses]
    return partition


def replica_dumps(c, topic: str, expected_records: int) -> list[list[dict]]:
    """Each replica's dump-log events, once every replica holds ``expected_records``."""
    dirs = sorted(c.data_dir.glob(f"*/**/{topic}-0"))
    assert len(dirs) == 3, dirs

    def dumps():
        out = []
        for directory in dirs:
            dumped = run_tide("dump-log", str(directory), "--json", "--print-data", "--verify")
            assert dumped.returncode == 0, dumped.stdout[-2000:] + dumped.stderr
            events = [json.loads(line) for line in dumped.stdout.splitlines()]
            assert [e for e in events if e["type"] == "problem"] == []
            out.append(events)
        counts = [sum(1 for e in events if e["type"] == "record") for events in out]
        return out if counts == [expected_records] * 3 else None
    return wait_for(dumps, f"{expected_records} records on every replica")


def batches(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "batch"]


def records(events: list[dict]) -> list[tuple]:
    return [(e["offset"], e["timestamp"], e["key"], e["value"], e["headers"])
            for e in events if e["type"] == "record"]


def send(c, topic: str, compression: str, values: list[bytes], **extra) -> list:
    producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka, "acks": "all",
                                         "compression.type": compression, "linger.ms": 20,
                                         **extra})
    reports: list = []
    for i, value in enumerate(values):
        producer.produce(topic, key=b"k%d" % i, value=value, headers=[("h", b"%d" % i)],
                         timestamp=1_700_000_000_000 + i,
                         on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(30) == 0
    assert all(e is None for e, _ in reports), reports
    return reports


def consume_all(c, topic: str, count: int) -> list:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": c.kafka, "group.id": f"g-{topic}",
                                         "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.timestamp()[1], message.key(),
                            message.value(), message.headers()))
    finally:
        consumer.close()
    return got


def test_zstd_topic_rewrites_lz4_and_uncompressed_batches_on_every_replica(cluster):
    create(cluster, "to-zstd", "compression.type=zstd")
    values = [b"value-%d-" % i + b"abc" * (i % 30) for i in range(300)]
    send(cluster, "to-zstd", "lz4", values[:150])
    send(cluster, "to-zstd", "none", values[150:])
    dumps = replica_dumps(cluster, "to-zstd", len(values))
    for events in dumps:
        assert {b["compression"] for b in batches(events)} == {"zstd"}
        assert all(b["crc_valid"] for b in batches(events))
    assert records(dumps[0]) == records(dumps[1]) == records(dumps[2])
    assert [b["size"] for b in batches(dumps[0])] == [b["size"] for b in batches(dumps[1])]
    got = consume_all(cluster, "to-zstd", len(values))
    assert [(o, ts, k, v, h) for o, ts, k, v, h in got] == [
        (i, 1_700_000_000_000 + (i % 150), b"k%d" % (i % 150), values[i], [("h", b"%d" % (i % 150))])
        for i in range(len(values))]


def test_an_idempotent_batch_keeps_its_sequence_and_a_retry_is_a_duplicate(cluster):
    create(cluster, "idem-zstd", "compression.type=zstd")
    init = call(cluster.kafka.split(",")[0], INIT_PRODUCER_ID, 4, {
        "transactional_id": None, "transaction_timeout": 60000,
        "producer_id": -1, "producer_epoch": -1})
    assert init.error_code == 0
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    now = int(time.time() * 1000)

    def batch(sequence: int) -> bytes:
        return encode_batch([SimpleRecord(b"k", b"v%d-%d" % (sequence, i), timestamp_ms=now)
                             for i in range(3)], compression=COMPRESSION_LZ4,
                            producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
    first = produce_raw(cluster, "idem-zstd", batch(0))
    assert (first.error_code, first.base_offset) == (0, 0)
    retry = produce_raw(cluster, "idem-zstd", batch(0))  # the same batch again
    assert (retry.error_code, retry.base_offset) == (0, 0)  # its original offsets
    second = produce_raw(cluster, "idem-zstd", batch(3))
    assert (second.error_code, second.base_offset) == (0, 3)
    for events in replica_dumps(cluster, "idem-zstd", 6):
        assert [(b["base_offset"], b["compression"], b["producer_id"], b["producer_epoch"],
                 b["base_sequence"]) for b in batches(events)] == [
            (0, "zstd", pid, epoch, 0), (3, "zstd", pid, epoch, 3)]
    # A librdkafka idempotent producer through the rewrite: every record once, in order.
    values = [b"idem-%d" % i for i in range(200)]
    send(cluster, "idem-zstd", "lz4", values, **{"enable.idempotence": True})
    got = consume_all(cluster, "idem-zstd", 206)
    assert [v for _, _, _, v, _ in got][6:] == values


def test_alter_configs_switches_compression_at_run_time(cluster):
    create(cluster, "switching")
    send(cluster, "switching", "lz4", [b"a%d" % i for i in range(20)])
    client = AdminClient({"bootstrap.servers": cluster.kafka})
    [(_, future)] = client.incremental_alter_configs([ConfigResource(
        ResourceType.TOPIC, "switching", incremental_configs=[ConfigEntry(
            "compression.type", "gzip",
            incremental_operation=AlterConfigOpType.SET)])]).items()
    future.result(30)
    time.sleep(1)  # the replicas apply the metadata record
    send(cluster, "switching", "lz4", [b"b%d" % i for i in range(20)])
    for events in replica_dumps(cluster, "switching", 40):
        codecs = [(b["base_offset"], b["compression"]) for b in batches(events)]
        assert {c for o, c in codecs if o < 20} == {"lz4"}, codecs  # kept as written
        assert {c for o, c in codecs if o >= 20} == {"gzip"}, codecs
    got = consume_all(cluster, "switching", 40)
    assert [v for _, _, _, v, _ in got] == [b"a%d" % i for i in range(20)] + [
        b"b%d" % i for i in range(20)]


def test_timestamp_before_max_ms_refuses_an_old_record(cluster):
    create(cluster, "bounded", "message.timestamp.before.max.ms=3600000")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                                         "retries": 0})
    reports: list = []
    now = int(time.time() * 1000)
    producer.produce("bounded", value=b"old", timestamp=now - 2 * 3_600_000,
                     on_delivery=lambda e, m: reports.append(e))
    producer.flush(30)
    producer.produce("bounded", value=b"fresh", timestamp=now,
                     on_delivery=lambda e, m: reports.append(e))
    producer.flush(30)
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_TIMESTAMP
    assert reports[1] is None
    # The raw answer: INVALID_TIMESTAMP with Kafka's message; nothing of it appended.
    old = encode_batch([SimpleRecord(None, b"new", timestamp_ms=now),
                        SimpleRecord(None, b"old", timestamp_ms=now - 2 * 3_600_000)])
    refused = produce_raw(cluster, "bounded", old)
    assert refused.error_code == INVALID_TIMESTAMP, refused
    assert "is out of range. The timestamp should be within" in refused.error_message
    [events] = replica_dumps(cluster, "bounded", 1)[:1]
    assert [e["value"] for e in events if e["type"] == "record"] == ["fresh"]


def test_cluster_wide_after_max_ms_refuses_a_future_record(cluster):
    """The broker default (``log.message.timestamp.after.max.ms``, dynamic cluster-wide)
    bounds a topic without its own value; deleting it lifts the bound again."""
    create(cluster, "future")
    now = int(time.time() * 1000)

    def future_batch() -> bytes:
        return encode_batch([SimpleRecord(None, b"later", timestamp_ms=now + 3_600_000)])

    def alter(setting: str) -> None:
        assert cluster.tide("configs", "alter", "--entity-type", "brokers",
                            "--entity-default", setting).returncode == 0
    alter("--add-config=log.message.timestamp.after.max.ms=60000")
    try:
        wait_for(lambda: produce_raw(cluster, "future", future_batch()).error_code
                 == INVALID_TIMESTAMP, "the cluster-wide bound in force")
    finally:
        alter("--delete-config=log.message.timestamp.after.max.ms")
    wait_for(lambda: produce_raw(cluster, "future", future_batch()).error_code == 0,
             "the bound lifted")


def test_max_message_bytes_applies_to_the_batch_as_rewritten(cluster):
    """A zstd batch well under max.message.bytes that is larger once rewritten
    uncompressed is refused (MESSAGE_TOO_LARGE), nothing appended."""
    create(cluster, "inflated", "compression.type=uncompressed", "max.message.bytes=4000")
    small = encode_batch([SimpleRecord(None, b"z" * 10_000, timestamp_ms=int(time.time() * 1000))],
                         compression=COMPRESSION_ZSTD)  # a few dozen bytes
    assert len(small) < 4000
    refused = produce_raw(cluster, "inflated", small)
    assert refused.error_code == 10, refused  # MESSAGE_TOO_LARGE
    fits = encode_batch([SimpleRecord(None, b"z" * 1000, timestamp_ms=int(time.time() * 1000))],
                        compression=COMPRESSION_ZSTD)
    taken = produce_raw(cluster, "inflated", fits)
    assert (taken.error_code, taken.base_offset) == (0, 0)
    for events in replica_dumps(cluster, "inflated", 1):
        assert [b["compression"] for b in batches(events)] == ["none"]
