"""Issue 29: client quotas hold on the gRPC listener too (broker/servicers/grpc_quotas.py).

Tidewater's own Producer and Consumer (gRPC ProduceStream and FetchStream) first run
unthrottled, then under a ``users --entity-default`` quota set with ``tide quotas``
(every caller without authentication is the user ANONYMOUS): each is held near the quota,
far below what it did unthrottled. A quota is per broker; the cluster has one.
"""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "grpc-quotas"
QUOTA_BYTES_PER_S = 200_000
VALUE_BYTES = 1_000
RUN_S = 10.0
# A token bucket of one second's burst: over 10 s a client that waits out every
# throttle gets at most ~1/10 over its quota; the floor leaves room for a loaded machine.
CEILING = 1.25
FLOOR = 0.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("grpc-quotas"), 1)
    assert c.tide("topics", "create", TOPIC, "--partitions", "1",
                  "--replication-factor", "1").returncode == 0
    yield c
    stop_cluster(c)


def produce_rate(bootstrap: str, seconds: float) -> float:
    """Value bytes per second acknowledged while sending as fast as the producer may."""
    acked = [0]
    producer = Producer(bootstrap, acks=1, linger_ms=5, batch_size_bytes=16_384)

    def on_done(future) -> None:
        if future.exception() is None:
            acked[0] += VALUE_BYTES

    value = b"q" * VALUE_BYTES
    sent = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            # At most ~1 s of the quota unacknowledged, so the final flush is short.
            if (sent * VALUE_BYTES) - acked[0] > QUOTA_BYTES_PER_S:
                time.sleep(0.005)
                continue
            producer.send(TOPIC, value, partition=0).add_done_callback(on_done)
            sent += 1
        producer.flush()
    finally:
        producer.close()
    return acked[0] / (time.monotonic() - started)


def fetch_rate(bootstrap: str, seconds: float) -> tuple[float, int]:
    """(value bytes per second read from the start of the topic, records read)."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    read = 0
    records = 0
    try:
        consumer.assign([(TOPIC, 0)])
        consumer.seek_to_beginning()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            batch = consumer.poll(timeout_ms=200)
            records += len(batch)
            read += sum(len(r.value or b"") for r in batch)
        return read / (time.monotonic() - started), records
    finally:
        consumer.close()


def set_user_default(cluster, config: str) -> None:
    r = cluster.tide("quotas", "alter", "--entity-type", "users", "--entity-default",
                     "--add-config", config)
    assert r.returncode == 0, r.stderr


def test_grpc_producer_and_consumer_are_held_to_their_byte_rate_quotas(cluster):
    unthrottled_produce = produce_rate(cluster.bootstrap, 3.0)
    assert unthrottled_produce > 4 * QUOTA_BYTES_PER_S, unthrottled_produce

    set_user_default(cluster, f"producer_byte_rate={QUOTA_BYTES_PER_S}")
    time.sleep(1.0)  # the quota reaches the broker with the next metadata update
    throttled_produce = produce_rate(cluster.bootstrap, RUN_S)
    print(f"produce: unthrottled {unthrottled_produce:,.0f} B/s, "
          f"throttled {throttled_produce:,.0f} B/s ({throttled_produce / QUOTA_BYTES_PER_S:.2f}x)")
    assert FLOOR * QUOTA_BYTES_PER_S < throttled_produce < CEILING * QUOTA_BYTES_PER_S

    unthrottled_fetch, _ = fetch_rate(cluster.bootstrap, 2.0)
    assert unthrottled_fetch > 4 * QUOTA_BYTES_PER_S, unthrottled_fetch
    set_user_default(cluster, f"consumer_byte_rate={QUOTA_BYTES_PER_S}")
    time.sleep(1.0)
    throttled_fetch, records = fetch_rate(cluster.bootstrap, RUN_S)
    print(f"fetch: unthrottled {unthrottled_fetch:,.0f} B/s, "
          f"throttled {throttled_fetch:,.0f} B/s ({throttled_fetch / QUOTA_BYTES_PER_S:.2f}x)")
    assert records > 0
    assert FLOOR * QUOTA_BYTES_PER_S < throttled_fetch < CEILING * QUOTA_BYTES_PER_S
