"""The clients' periodic metadata refresh runs in the background: a send to a known
leader never waits for it, even when the broker it asks is paused (SIGSTOP)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.integration.conftest import wait_for
from tidewater.client.consumer import Consumer
from tidewater.client.metadata import MetadataClient
from tidewater.client.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Long enough that, without the background refresh, a send would still be waiting for
# the paused broker when the test looks: no timing is asserted, only the order.
METADATA_TIMEOUT_MS = 60_000


def refresh_waiting() -> bool:
    return any(t.name == "tide-metadata-refresh" for t in threading.enumerate())


def test_an_aged_metadata_refresh_on_a_paused_broker_never_blocks_send(cluster):
    c = cluster(3)
    c.create_topic("aged", replication_factor=3)
    leader = c.wait_leader_ready("aged", isr_size=3)
    asked = next(b for b in c.brokers.values() if b.broker_id != leader.broker_id)
    # Bootstrapped from ``asked`` alone: it answers the first Metadata and is asked first
    # next time (the last broker that answered).
    metadata = MetadataClient(asked.address, metadata_max_age_ms=300,
                              request_timeout_ms=METADATA_TIMEOUT_MS)
    producer = Producer(asked.address, acks=1, linger_ms=0, metadata=metadata)
    consumer = None
    try:
        assert producer.send("aged", b"before", partition=0).result(timeout=30).offset == 0
        asked.proc.signal(signal.SIGSTOP)
        paused_at_s = time.monotonic()
        try:
            wait_for(lambda: time.monotonic() - metadata.snapshot.fetched_at_s > 0.3,
                     message="metadata older than metadata_max_age_ms")
            futures = [producer.send("aged", b"r%d" % i, partition=0) for i in range(20)]
            offsets = [f.result(timeout=30).offset for f in futures]
            # Every record went to the leader and was acknowledged while the refresh
            # still waits for the paused broker: no send waited for it.
            assert refresh_waiting()
            assert offsets == list(range(1, 21))
        finally:
            asked.proc.signal(signal.SIGCONT)
        # Resumed, the paused broker answers and the refresh installs a new snapshot.
        wait_for(lambda: not refresh_waiting(), message="the background refresh finished")
        assert metadata.snapshot.fetched_at_s > paused_at_s
        consumer = Consumer(leader.address, auto_offset_reset="earliest")
        consumer.assign([("aged", 0)])
        values = []
        wait_for(lambda: values.extend(r.value for r in consumer.poll(500)) or len(values) >= 21,
                 message="all 21 records read back")
        assert values == [b"before"] + [b"r%d" % i for i in range(20)]
    finally:
        asked.proc.signal(signal.SIGCONT)
        producer.close()
        if consumer is not None:
            consumer.close()
