"""Fetch sessions (KIP-227) against real brokers: kafka-python's consumer (which opens
sessions, Fetch v12) reads 100 partitions across a leader change and a broker restart,
and the brokers' metrics show its fetches were incremental; librdkafka's (sessionless,
Fetch v16 by topic id) and aiokafka's (sessionless, v11) read alongside it. A raw client's session does not survive the
restart (FETCH_SESSION_ID_NOT_FOUND, then a new session)."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import time
import urllib.request

import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

from tidewater.broker.kafka.codec import decode_response, encode_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

kafka = pytest.importorskip("kafka")
confluent_kafka = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")

TOPIC = "wide"
PARTITIONS = 100
FETCH = 1


def metrics(process: dict) -> str:
    url = f"http://127.0.0.1:{process['metrics_port']}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def counter(text: str, name: str, kind: str) -> float:
    found = re.search(rf'^tidewater_broker_{name}_total\{{kind="{kind}"\}} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def raw_fetch(address: str, session_id: int, epoch: int, partitions: list[int]):
    """One Fetch v12 on a new connection: the answer's (error, session id)."""
    host, port = address.rsplit(":", 1)
    values = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
              "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
              "rack_id": "", "forgotten_topics_data": [],
              "topics": [{"topic": TOPIC, "partitions": [{
                  "partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                  "last_fetched_epoch": -1, "log_start_offset": -1,
                  "partition_max_bytes": 1 << 16} for p in partitions]}]}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_request(FETCH, 12, 1, values))
        size = b""
        while len(size) < 4:
            size += s.recv(4 - len(size))
        (length,) = struct.unpack(">i", size)
        frame = b""
        while len(frame) < length:
            frame += s.recv(length - len(frame))
    _, body = decode_response(FETCH, 12, frame)
    return int(body.error_code), int(body.session_id)


def produce(bootstrap: str, tag: bytes) -> set[bytes]:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 5})
    values = {b"%s-%03d" % (tag, p) for p in range(PARTITIONS)}
    for value in sorted(values):
        producer.produce(TOPIC, value=value, partition=int(value[-3:]))
    assert producer.flush(60) == 0
    return values


def read_until(consumer, expected: set[bytes], seen: list[bytes], rdkafka,
               rdkafka_seen: list[bytes]) -> None:
    """Poll both consumers until each read every expected value (a duplicate fails the
    test later)."""
    deadline = time.monotonic() + 90
    while not (expected <= set(seen) and expected <= set(rdkafka_seen)):
        assert time.monotonic() < deadline, (
            f"kafka-python misses {sorted(expected - set(seen))[:5]}, "
            f"librdkafka {sorted(expected - set(rdkafka_seen))[:5]}")
        for records in consumer.poll(timeout_ms=200).values():
            seen.extend(r.value for r in records)
        for message in rdkafka.consume(num_messages=500, timeout=0.2):
            if message.error() is None:
                rdkafka_seen.append(message.value())


class AiokafkaReader:
    """aiokafka's consumer (Fetch v11, sessionless) reading in its own thread and loop
    until stopped."""

    def __init__(self, bootstrap: str):
        self.seen: list[bytes] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        # A daemon: a failed test must not wait on it.
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(bootstrap)),
                                        daemon=True)
        self._thread.start()

    async def _run(self, bootstrap: str) -> None:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap,
                                             enable_auto_commit=False, fetch_max_wait_ms=100)
        try:
            await consumer.start()
            consumer.assign([aiokafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                self.seen.extend(r.value for records in batches.values() for r in records)
        except BaseException as e:  # reported to the test's thread by stop()
            self.error = e
        finally:
            await consumer.stop()

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise self.error
        return self.seen


def test_a_consumer_of_100_partitions_reads_everything_through_sessions(tmp_path):
    c = start_cluster(tmp_path / "cluster", 2, "min.insync.replicas=1")
    aio: AiokafkaReader | None = None
    try:
        manifest = c.manifest()
        bootstrap = manifest["kafka_bootstrap"]
        brokers = {p["broker_id"]: p for p in manifest["processes"].values()
                   if p["kind"] == "broker"}
        assert c.tide("topics", "create", TOPIC, "--partitions", str(PARTITIONS),
                      "--replication-factor", "2").returncode == 0
        wait_for(lambda: fully_replicated(c, TOPIC, 2), "the topic replicated")
        expected = produce(bootstrap, b"a")
        consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap.split(","),
                                       enable_auto_commit=False, fetch_max_wait_ms=100)
        consumer.assign([kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        rdkafka = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100})
        rdkafka.assign([confluent_kafka.TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING)
                        for p in range(PARTITIONS)])
        seen: list[bytes] = []
        rdkafka_seen: list[bytes] = []
        aio = AiokafkaReader(bootstrap)
        read_until(consumer, expected, seen, rdkafka, rdkafka_seen)
        for _ in range(10):  # idle polls: incremental fetches with nothing new
            consumer.poll(timeout_ms=200)
        before = {b: metrics(p) for b, p in brokers.items()}
        assert any(counter(t, "kafka_fetches", "incremental") > 0 for t in before.values())
        assert any(re.search(r"^tidewater_broker_incremental_fetch_sessions [1-9]", t,
                             re.MULTILINE) for t in before.values())

        # A raw client opens a session on broker 2, which is then killed: partitions it
        # led move to broker 1 (a leader change under the consumer's sessions).
        victim = 2
        full_error, session_id = raw_fetch(brokers[victim]["kafka"], 0, 0, [0, 1])
        assert full_error == 0 and session_id != 0
        assert run_tide("cluster", "kill", str(victim), "--signal", "KILL",
                        "--data-dir", str(c.data_dir)).returncode == 0
        expected |= produce(bootstrap, b"b")
        read_until(consumer, expected, seen, rdkafka, rdkafka_seen)
        # Restarted, broker 2 has no sessions: the old id is unknown, a new one is opened.
        assert run_tide("cluster", "start", str(victim), "--data-dir", str(c.data_dir),
                        timeout_s=90).returncode == 0
        wait_for(lambda: fully_replicated(c, TOPIC, 2), "broker 2 back in every ISR")
        assert raw_fetch(brokers[victim]["kafka"], session_id, 1, [0, 1]) == (
            70, 0)  # FETCH_SESSION_ID_NOT_FOUND
        again_error, again_id = raw_fetch(brokers[victim]["kafka"], 0, 0, [0, 1])
        assert again_error == 0 and again_id != 0
        # Leadership back to the preferred replicas, if the cluster moves it, or not:
        # either way the consumer reads what is written next.
        expected |= produce(bootstrap, b"c")
        read_until(consumer, expected, seen, rdkafka, rdkafka_seen)
        consumer.close()
        rdkafka.close()
        wait_for(lambda: expected <= set(aio.seen), "aiokafka read every record", 90)
        aio_seen = aio.stop()
        assert len(aio_seen) == len(set(aio_seen)) == 3 * PARTITIONS
        assert len(seen) == len(set(seen)) == 3 * PARTITIONS  # nothing twice, nothing lost
        assert len(rdkafka_seen) == len(set(rdkafka_seen)) == 3 * PARTITIONS
        after = {b: metrics(p) for b, p in brokers.items()}
        assert counter(after[1], "kafka_fetches", "incremental") > counter(
            before[1], "kafka_fetches", "incremental")
    finally:
        if aio is not None:
            aio._stop.set()
        stop_cluster(c)
