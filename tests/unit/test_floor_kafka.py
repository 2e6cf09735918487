"""bench/probes/floor_kafka.py: the design floor's hand-written Kafka answers read back with
the broker's own codec (kio's schemas), and its Produce and Fetch served from the floor
leader's ``Log``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tidewater.broker.__main__ as broker_main

broker_main.import_kafka_types_without_hypothesis()

from bench.probes.design_floor import FOLLOWER_IDS, StoredLeaderState  # noqa: E402
from bench.probes.floor_kafka import OFFERED, FloorKafkaServer  # noqa: E402
from tidewater.broker.kafka.codec import decode_response, encode_request  # noqa: E402
from tidewater.proto.batch import iter_batches  # noqa: E402
from tidewater.proto.records import decode_batch_records, encode_batch  # noqa: E402


def _ask(server: FloorKafkaServer, api_key: int, version: int, values: dict):
    frame = encode_request(api_key, version, 7, values)[4:]  # without the size prefix
    answer = asyncio.run(server.answer(frame))
    assert answer is not None
    correlation_id, body = decode_response(api_key, 0 if api_key == 18 else version, answer)
    assert correlation_id == 7
    return body


def test_a_newer_api_versions_gets_the_v0_list_and_unsupported_version(tmp_path: Path) -> None:
    server = FloorKafkaServer(StoredLeaderState(str(tmp_path)), "paced")
    body = _ask(server, 18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert int(body.error_code) == 35
    assert {(k.api_key, k.min_version, k.max_version) for k in body.api_keys} == {
        (key, version, version) for key, version in OFFERED.items()}


def test_metadata_names_the_floor_leader_for_the_one_partition(tmp_path: Path) -> None:
    server = FloorKafkaServer(StoredLeaderState(str(tmp_path)), "paced")
    server.port = 4321
    body = _ask(server, 3, 1, {"topics": None})
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(1, "127.0.0.1", 4321)]
    (topic,) = body.topics
    assert topic.name == "paced"
    assert [(p.partition_index, p.leader_id, p.isr_nodes) for p in topic.partitions] == [(0, 1, (1,))]


def test_produced_records_are_fetched_and_listed_once_the_hw_passes(tmp_path: Path) -> None:
    state = StoredLeaderState(str(tmp_path))
    server = FloorKafkaServer(state, "paced")
    batch = encode_batch([(None, b"one"), (None, b"two")])
    produced = _ask(server, 0, 3, {"transactional_id": None, "acks": 1, "timeout": 1000,
                                   "topic_data": [{"name": "paced", "partition_data": [
                                       {"index": 0, "records": batch}]}]})
    (partition,) = produced.responses[0].partition_responses
    assert (int(partition.error_code), partition.base_offset) == (0, 0)
    fetch = {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
             "isolation_level": 0, "topics": [{"topic": "paced", "partitions": [
                 {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    nothing = _ask(server, 1, 4, fetch).responses[0].partitions[0]
    assert (nothing.high_watermark, nothing.records) == (0, b"")  # not committed yet
    for follower_id in FOLLOWER_IDS:
        state.follower_at(follower_id, 2)
    fetched = _ask(server, 1, 4, fetch).responses[0].partitions[0]
    assert fetched.high_watermark == 2
    values = [r.value for position, header in iter_batches(fetched.records)
              for r in decode_batch_records(fetched.records, position, header)]
    assert values == [b"one", b"two"]
    listed = _ask(server, 2, 1, {"replica_id": -1, "topics": [{"name": "paced", "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]})
    assert listed.topics[0].partitions[0].offset == 2
