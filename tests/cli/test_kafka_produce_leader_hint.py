"""KIP-951 on Produce v10-v11: a follower of a partition answers
NOT_LEADER_OR_FOLLOWER with the leader it knows (``current_leader``) and that leader's
address (``node_endpoints``), so a client can redirect without a Metadata round trip.
Produce stays advertised from v0 (librdkafka 2.0 drops compression when the minimum is 3),
and confluent-kafka (librdkafka 2.16, which speaks v10) still produces compressed batches.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

from tidewater.broker.kafka import codec
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")

PRODUCE, API_VERSIONS = 0, 18
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("produce-hint"), 2)
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def call(address: str, api_key: int, version: int, values: dict):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.settimeout(30)
        s.sendall(codec.encode_request(api_key, version, 5, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(api_key, version, s.recv(size, socket.MSG_WAITALL))
    return answer


def produce(address: str, version: int, topic: str):
    return call(address, PRODUCE, version, {
        "transactional_id": None, "acks": -1, "timeout": 30000, "topic_data": [
            {"name": topic, "partition_data": [
                {"index": 0, "records": encode_batch([(None, b"v")])}]}]})


def test_produce_to_a_follower_names_the_leader_and_its_address(cluster):
    c = cluster
    created = c.tide("topics", "create", "hinted", "--replica-assignment", "2:1")
    assert created.returncode == 0, created.stderr
    broker_1, broker_2 = c.kafka.split(",")  # cluster up lists broker 1's first
    wait_for(lambda: produce(broker_2, 9, "hinted").responses[0]
             .partition_responses[0].error_code == 0, "broker 2 leading hinted")

    [api] = [a for a in call(broker_1, API_VERSIONS, 3, {
        "client_software_name": "t", "client_software_version": "1"}).api_keys
             if a.api_key == PRODUCE]
    assert (api.min_version, api.max_version) == (0, 11)

    for version in (10, 11):
        answer = produce(broker_1, version, "hinted")
        [partition] = answer.responses[0].partition_responses
        assert partition.error_code == NOT_LEADER_OR_FOLLOWER
        assert partition.current_leader.leader_id == 2
        assert partition.current_leader.leader_epoch >= 0
        [endpoint] = answer.node_endpoints
        assert (endpoint.node_id, f"{endpoint.host}:{endpoint.port}") == (2, broker_2)
    # v9 has neither field: the same refusal, no hint.
    [partition] = produce(broker_1, 9, "hinted").responses[0].partition_responses
    assert partition.error_code == NOT_LEADER_OR_FOLLOWER
    assert not hasattr(partition, "current_leader")


def test_confluent_kafka_produces_compressed_batches(cluster):
    c = cluster
    conf = {"bootstrap.servers": c.kafka}
    producer = confluent_kafka.Producer({**conf, "compression.type": "lz4", "acks": "all"})
    for i in range(50):
        producer.produce("squeezed", value=f"value-{i:03d}".encode() * 20)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({**conf, "group.id": "squeezed-reader",
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["squeezed"])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 50 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [f"value-{i:03d}".encode() * 20 for i in range(50)]
    # The batches on disk are the producer's lz4 ones (Kafka's DumpLogSegments line).
    [partition_dir, *_] = sorted(Path(c.data_dir).glob("broker-*/squeezed-0"))
    dumped = c.tide("dump-log", str(partition_dir))
    assert dumped.returncode == 0, dumped.stderr
    assert "compresscodec: lz4" in dumped.stdout
