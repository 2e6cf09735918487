"""Issue 27, the log side: transactional batches and markers over the Kafka wire on a
3-broker cluster, read back by real Kafka consumers.

Transactional batches go in with Produce (a transactional id, the transactional
attribute bit); markers with WriteTxnMarkers (key 27), as a coordinator sends
them. confluent-kafka and kafka-python consumers with
``isolation.level=read_committed`` see committed records and never aborted ones
(nor anything at or past an open transaction's first offset); read_uncommitted
sees every data record. After the leader is SIGKILLed the new leader has the
same last stable offset and aborted-transactions list (followers rebuilt them
from what they fetched), and a marker written to it releases the rest.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

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
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

TOPIC = "txlog"
PRODUCE, LIST_OFFSETS, INIT_PRODUCER_ID, WRITE_TXN_MARKERS = 0, 2, 22, 27
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


def call(address: str, api_key: int, version: int, values: dict):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.settimeout(30)
        s.sendall(codec.encode_request(api_key, version, 11, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(api_key, version, s.recv(size, socket.MSG_WAITALL))
    return answer


def leader_of(c) -> int:
    described = describe_topic(c, TOPIC)
    assert described is not None
    return described["partitions"][0]["leader"]


def leader_address(c) -> str:
    return c.kafka.split(",")[leader_of(c) - 1]  # cluster up lists broker 1's first


def new_producer_id(c) -> int:
    answer = call(c.kafka.split(",")[0], INIT_PRODUCER_ID, 4, {
        "transactional_id": None, "transaction_timeout": 60000,
        "producer_id": -1, "producer_epoch": -1})
    assert answer.error_code == 0
    return int(answer.producer_id)


def produce_txn(c, pid: int, sequence: int, values: list[bytes]) -> None:
    records = encode_batch([(None, v) for v in values], producer_id=pid, producer_epoch=0,
                           base_sequence=sequence, attributes=TRANSACTIONAL_MASK)
    answer = call(leader_address(c), PRODUCE, 9, {
        "transactional_id": f"tx-{pid}", "acks": -1, "timeout": 30000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": records}]}]})
    [[partition]] = [t.partition_responses for t in answer.responses]
    assert partition.error_code == 0, partition


def produce_plain(c, value: bytes) -> None:
    answer = call(leader_address(c), PRODUCE, 9, {
        "transactional_id": None, "acks": -1, "timeout": 30000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": encode_batch(
                [(None, value)])}]}]})
    [[partition]] = [t.partition_responses for t in answer.responses]
    assert partition.error_code == 0, partition


def write_marker(c, pid: int, committed: bool, coordinator_epoch: int = 0,
                 version: int = 1) -> int:
    answer = call(leader_address(c), WRITE_TXN_MARKERS, version, {"markers": [{
        "producer_id": pid, "producer_epoch": 0, "transaction_result": committed,
        "topics": [{"name": TOPIC, "partition_indexes": [0]}],
        "coordinator_epoch": coordinator_epoch}]})
    [marker] = answer.markers
    [topic] = marker.topics
    [partition] = topic.partitions
    return int(partition.error_code)


def latest_offset(c, isolation_level: int) -> int:
    answer = call(leader_address(c), LIST_OFFSETS, 4, {
        "replica_id": -1, "isolation_level": isolation_level, "topics": [{
            "name": TOPIC, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                           "timestamp": -1}]}]})
    [topic] = answer.topics
    [partition] = topic.partitions
    assert partition.error_code == 0
    return int(partition.offset)


def confluent_values(c, isolation: str, expected: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": c.kafka, "group.id": f"g-{uuid.uuid4()}",
        "isolation.level": isolation, "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        quiet_until = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
                continue
            if len(got) >= expected:  # then a quiet second: nothing more may come
                quiet_until = quiet_until or time.monotonic() + 1.5
                if time.monotonic() > quiet_until:
                    break
        return got
    finally:
        consumer.close()


def kafka_python_values(c, isolation: str) -> list[bytes]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=c.kafka.split(","),
                                   isolation_level=isolation, enable_auto_commit=False,
                                   consumer_timeout_ms=4000)
    try:
        consumer.assign([kafka.TopicPartition(TOPIC, 0)])
        consumer.seek_to_beginning()
        return [m.value for m in consumer]
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # These tests forge the producer's side (no transactional id known to a coordinator):
    # KIP-890's verification, which would refuse it, is off, as for the log alone.
    c = start_cluster(tmp_path_factory.mktemp("txn-log"), 3, "min.insync.replicas=2",
                      "transaction.partition.verification.enable=false")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def written(cluster):
    """A committed (A), an aborted (B) interleaved with it, an open one (C), then a
    plain record P behind C."""
    assert cluster.tide("topics", "create", TOPIC, "--partitions", "1",
                        "--replication-factor", "3").returncode == 0
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the topic fully replicated")
    a, b, c_ = (new_producer_id(cluster) for _ in range(3))
    produce_txn(cluster, a, 0, [b"a0", b"a1"])       # 0-1
    produce_txn(cluster, b, 0, [b"b0"])              # 2
    produce_txn(cluster, a, 2, [b"a2"])              # 3
    produce_txn(cluster, b, 1, [b"b1", b"b2"])       # 4-5
    assert write_marker(cluster, b, committed=False) == pb.NONE   # 6
    assert write_marker(cluster, a, committed=True) == pb.NONE    # 7
    produce_txn(cluster, c_, 0, [b"c0"])             # 8: left open
    produce_plain(cluster, b"p0")                    # 9
    return {"a": a, "b": b, "c": c_}


COMMITTED = [b"a0", b"a1", b"a2"]
EVERYTHING = [b"a0", b"a1", b"b0", b"a2", b"b1", b"b2", b"c0", b"p0"]


def test_read_committed_sees_committed_records_only_and_stops_at_the_open_transaction(
        cluster, written):
    assert latest_offset(cluster, READ_COMMITTED) == 8  # C's first offset
    assert latest_offset(cluster, READ_UNCOMMITTED) == 10
    assert confluent_values(cluster, "read_committed", len(COMMITTED)) == COMMITTED
    assert confluent_values(cluster, "read_uncommitted", len(EVERYTHING)) == EVERYTHING
    assert kafka_python_values(cluster, "read_committed") == COMMITTED
    assert kafka_python_values(cluster, "read_uncommitted") == EVERYTHING


def test_tidewaters_consumer_and_tide_consume_read_committed(cluster, written):
    from tidewater.client.consumer import Consumer

    def values(isolation_level: str) -> list[bytes]:
        with Consumer(cluster.bootstrap, auto_offset_reset="earliest",
                      isolation_level=isolation_level, fetch_max_wait_ms=100) as consumer:
            consumer.assign([(TOPIC, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                got += [r.value for r in consumer.poll(timeout_ms=200)]
            assert consumer.end_offsets([(TOPIC, 0)]) == {(TOPIC, 0): (
                8 if isolation_level == "read_committed" else 10)}
            return got
    assert values("read_committed") == COMMITTED
    assert values("read_uncommitted") == EVERYTHING
    result = cluster.tide("consume", TOPIC, "--from-beginning", "--isolation-level",
                          "read_committed", "--timeout-ms", "3000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["a0", "a1", "a2"]


def test_a_stale_coordinator_epoch_is_fenced(cluster, written):
    a = written["a"]
    assert write_marker(cluster, a, committed=True, coordinator_epoch=5) == pb.NONE  # 10
    assert write_marker(cluster, a, committed=False, coordinator_epoch=4) == (
        pb.TRANSACTION_COORDINATOR_FENCED)


def test_a_new_leader_keeps_the_lso_and_the_aborted_list(cluster, written):
    old_leader = leader_of(cluster)
    data_dir = str(cluster.data_dir)
    assert run_tide("cluster", "kill", str(old_leader), "--signal", "KILL",
                    "--data-dir", data_dir).returncode == 0
    wait_for(lambda: leader_of(cluster) not in (-1, old_leader), "a new leader", 90)
    # Its LSO is C's first offset still, and read_committed still drops B's records.
    wait_for(lambda: latest_offset(cluster, READ_COMMITTED) == 8, "the LSO at 8 on the new leader")
    assert confluent_values(cluster, "read_committed", len(COMMITTED)) == COMMITTED
    assert kafka_python_values(cluster, "read_committed") == COMMITTED
    # The coordinator ends C on the new leader: C and the plain record behind it appear.
    assert write_marker(cluster, written["c"], committed=True, version=0) == pb.NONE
    released = [*COMMITTED, b"c0", b"p0"]
    assert confluent_values(cluster, "read_committed", len(released)) == released
    assert kafka_python_values(cluster, "read_committed") == released
    assert latest_offset(cluster, READ_COMMITTED) == latest_offset(cluster, READ_UNCOMMITTED)
    assert run_tide("cluster", "start", str(old_leader), "--data-dir", data_dir,
                    timeout_s=120).returncode == 0
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the old leader back in the ISR", 90)
