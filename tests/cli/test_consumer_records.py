"""``client.consumer.Consumer`` decodes every record shape a real cluster hands it.

Batches are produced with raw acks=all Produce calls (so the test controls their
exact bytes: the decoder's fast path, its general path for long lengths and
timestamp deltas, headers, null keys and values, compressed batches) and read
back through ``Consumer.poll`` from a controller and 3 brokers.
"""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import cluster  # noqa: F401

from tidewater.client.admin import AdminClient
from tidewater.client.consumer import Consumer, ConsumerRecord
from tidewater.client.metadata import MetadataClient, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    SimpleRecord,
    encode_batch,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BASE_TS = 1_700_000_000_000


def create_topic(bootstrap: str, name: str, configs: dict | None = None, partitions: int = 1) -> None:
    admin = AdminClient(bootstrap)
    try:
        admin.create_topic(name, partitions, 3, configs)
        deadline = time.monotonic() + 30
        while True:
            ps = admin.describe_topics([name], with_replica_state=False)[0].partitions
            if all(p.leader >= 0 and set(p.isr) == set(p.replicas) for p in ps):
                return
            assert time.monotonic() < deadline, ps
            time.sleep(0.1)
    finally:
        admin.close()


def produce_batches(bootstrap: str, topic: str, batches: list[bytes], partition: int = 0) -> int:
    """Append each batch with acks=all; the leader epoch the batches got."""
    metadata = MetadataClient(bootstrap)
    try:
        leader = metadata.leader_for(TopicPartition(topic, partition))
        stub = metadata.pool.broker(leader.address)
        for batch in batches:
            resp = stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=10000, partitions=[
                pb.ProducePartitionData(topic=topic, partition=partition, records=batch)]), timeout=30)
            assert resp.partitions[0].error_code == pb.NONE, resp
        return leader.leader_epoch
    finally:
        metadata.close()


def consume(bootstrap: str, topic: str, count: int, *, start: int | None = None,
            max_records: int | None = None, **settings) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    with Consumer(bootstrap, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([(topic, 0)])
        if start is not None:
            consumer.seek((topic, 0), start)
        deadline = time.monotonic() + 60
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} records"
            polled = consumer.poll(500, max_records=max_records)
            if max_records is not None:
                assert len(polled) <= max_records
            got += polled
    return got


def mixed_records(n: int) -> list[SimpleRecord]:
    """Every shape the decoder distinguishes, in one batch."""
    out = []
    for i in range(n):
        key = None if i % 3 else b"key-%d" % i
        value = None if i % 17 == 5 else bytes([i % 251]) * (9000 if i % 10 == 7 else i * 13 % 700)
        headers = (("trace", b"t%d" % i), ("nothing", None)) if i % 4 == 1 else ()
        # mostly small deltas; some far apart (3+ byte varints), some before the base
        ts = BASE_TS + (i if i % 9 else i * 1_000_003) - (50 if i % 11 == 3 else 0)
        out.append(SimpleRecord(key, value, headers, ts))
    return out


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4,
                                         COMPRESSION_ZSTD])
def test_consumer_reads_every_record_shape(cluster, compression):  # noqa: F811
    topic = f"shapes{compression}"
    create_topic(cluster.bootstrap, topic)
    sent = [mixed_records(60), [SimpleRecord(None, b"x" * 100, (), BASE_TS + i) for i in range(400)],
            mixed_records(25)]
    epoch = produce_batches(cluster.bootstrap, topic,
                            [encode_batch(recs, compression=compression) for recs in sent])
    expected = [r for recs in sent for r in recs]
    got = consume(cluster.bootstrap, topic, len(expected))
    assert all(type(r) is ConsumerRecord for r in got)
    assert [(r.topic, r.partition, r.leader_epoch) for r in got] == [(topic, 0, epoch)] * len(expected)
    assert [r.offset for r in got] == list(range(len(expected)))
    assert [(r.key, r.value, r.timestamp, r.headers) for r in got] == [
        (s.key, s.value, s.timestamp_ms, s.headers) for s in expected]


def test_seek_inside_a_batch_and_max_records(cluster):  # noqa: F811
    topic = "seekmid"
    create_topic(cluster.bootstrap, topic)
    produce_batches(cluster.bootstrap, topic, [
        encode_batch([(None, b"%d" % (b * 100 + i)) for i in range(100)], base_timestamp_ms=BASE_TS)
        for b in range(3)])
    got = consume(cluster.bootstrap, topic, 300 - 137, start=137, max_records=7)
    assert [(r.offset, r.value) for r in got] == [(o, b"%d" % o) for o in range(137, 300)]


def test_log_append_time_records_carry_the_brokers_timestamp(cluster):  # noqa: F811
    topic = "appendtime"
    create_topic(cluster.bootstrap, topic, {"message.timestamp.type": "LogAppendTime"})
    before_ms = time.time_ns() // 1_000_000
    produce_batches(cluster.bootstrap, topic, [
        encode_batch([SimpleRecord(None, b"v%d" % i, (), BASE_TS + i) for i in range(50)])])
    got = consume(cluster.bootstrap, topic, 50)
    assert [r.value for r in got] == [b"v%d" % i for i in range(50)]
    assert len({r.timestamp for r in got}) == 1  # the batch's maxTimestamp, set by the leader
    assert got[0].timestamp >= before_ms


def test_max_records_across_partitions_returns_each_record_once_in_order(cluster):  # noqa: F811
    topic = "maxparts"
    create_topic(cluster.bootstrap, topic, partitions=3)
    for p in range(3):
        produce_batches(cluster.bootstrap, topic, [
            encode_batch([(None, b"%d-%d" % (p, b * 40 + i)) for i in range(40)]) for b in range(2)],
            partition=p)
    got: list[ConsumerRecord] = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in range(3)])
        deadline = time.monotonic() + 60
        while len(got) < 240:
            assert time.monotonic() < deadline, f"{len(got)} of 240 records"
            polled = consumer.poll(500, max_records=13)
            assert len(polled) <= 13
            got += polled
        assert consumer.poll(200) == []
    for p in range(3):
        assert [(r.offset, r.value) for r in got if r.partition == p] == [
            (o, b"%d-%d" % (p, o)) for o in range(80)]
