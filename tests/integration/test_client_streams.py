"""The Producer on ProduceStream and the Consumer on FetchStream, against real brokers."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from tests.integration.conftest import free_port, wait_for
from tests.integration.test_replica_fetch_stream import rpc_count
from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def metrics_cluster(cluster, n: int):
    ports = {broker_id: free_port() for broker_id in range(1, n + 1)}
    c = cluster(n, extra_args=lambda broker_id: ["--metrics-port", str(ports[broker_id])])

    def scrape(broker_id: int) -> str:
        url = f"http://127.0.0.1:{ports[broker_id]}/metrics"
        return urllib.request.urlopen(url, timeout=2).read().decode()

    return c, scrape


def bootstrap_of(c) -> str:
    return ",".join(b.address for b in c.brokers.values())


def consume(bootstrap: str, topic: str, expected: int) -> list:
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign([(topic, 0)])
        got: list = []
        wait_for(lambda: (got.extend(consumer.poll(200)), len(got) >= expected)[1],
                 message=f"{expected} records consumed")
        return got


def test_producer_and_consumer_use_the_streams(cluster):
    c, scrape = metrics_cluster(cluster, 3)
    c.create_topic("cs", replication_factor=3)
    leader = c.wait_leader_ready("cs")
    bootstrap = bootstrap_of(c)
    values = [f"v{i}".encode() for i in range(300)]
    # linger 0 and 5 in flight: many single-record requests on the stream at once.
    with Producer(bootstrap, acks="all", linger_ms=0, max_in_flight_per_partition=5) as producer:
        futures = [producer.send("cs", v, partition=0) for v in values]
        producer.flush(60)
        offsets = [f.result(0).offset for f in futures]
    assert offsets == list(range(len(values)))  # stream order is send order
    records = consume(bootstrap, "cs", len(values))
    assert [(r.offset, r.value) for r in records] == list(enumerate(values))
    text = scrape(leader.broker_id)
    assert rpc_count(text, "ProduceStream") >= 1
    assert rpc_count(text, "FetchStream") >= 1
    assert rpc_count(text, "Produce") == 0
    assert rpc_count(text, "Fetch") == 0


def test_consumer_long_polls_on_the_stream(cluster):
    c = cluster(2)
    c.create_topic("lp", replication_factor=2)
    c.wait_leader_ready("lp")
    bootstrap = bootstrap_of(c)
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5000) as consumer, \
            Producer(bootstrap, acks="all", linger_ms=0) as producer:
        consumer.assign([("lp", 0)])
        assert consumer.position(("lp", 0)) == 0
        # A poll long-polling on the stream is answered by the commit of the write.
        timer = threading.Timer(0.3, lambda: producer.send("lp", b"late", partition=0))
        timer.start()
        try:
            got = []
            wait_for(lambda: (got.extend(consumer.poll(5000)), got)[1], message="late record")
        finally:
            timer.join()
        assert [(r.offset, r.value) for r in got] == [(0, b"late")]


def test_acks_zero_stream_burst_of_small_batches_all_sent(cluster):
    """acks=0 requests are settled inside the stream's ``send`` (no answer comes): the
    settling must not send the batches queued behind from there, or a burst of small
    batches recursed a frame per batch until it failed, leaving records unresolved."""
    c = cluster(1)
    c.create_topic("z", replication_factor=1)
    c.wait_leader_ready("z")
    bootstrap = bootstrap_of(c)
    count = 30_000
    # Batches smaller than a record and requests of one batch: thousands of requests
    # queued behind one another.
    with Producer(bootstrap, acks=0, linger_ms=5, batch_size_bytes=16,
                  request_bytes_max=1) as producer:
        for i in range(count):
            producer.send("z", b"%06d" % i, partition=0)
        producer.flush(30)
    records = consume(bootstrap, "z", count)
    assert [r.value for r in records] == [b"%06d" % i for i in range(count)]


def test_prefetched_long_poll_never_holds_up_a_seek_or_a_short_poll(cluster):
    """A caught-up consumer keeps a long-poll out on its stream (the prefetch); a poll
    shorter than it returns at its own timeout, and a seek withdraws it at once instead
    of leaving the next fetch queued behind it on the stream (5 s here)."""
    c = cluster(1)
    c.create_topic("pf", replication_factor=1)
    c.wait_leader_ready("pf")
    bootstrap = bootstrap_of(c)
    with Producer(bootstrap, acks="all", linger_ms=0) as producer:
        for i in range(3):
            producer.send("pf", f"{i}".encode(), partition=0).result(10)
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5000) as consumer:
        consumer.assign([("pf", 0)])
        got: list = []
        wait_for(lambda: (got.extend(consumer.poll(1000)), len(got) >= 3)[1], message="3 records")
        assert consumer._prefetched is not None  # caught up: the long-poll is out
        started = time.monotonic()
        assert consumer.poll(50) == []
        assert time.monotonic() - started < 2.5  # not the long-poll's 5 s
        consumer.seek(("pf", 0), 1)
        started = time.monotonic()
        again = consumer.poll(2500)
        assert [(r.offset, r.value) for r in again] == [(1, b"1"), (2, b"2")]
        assert time.monotonic() - started < 2.5


def test_waiting_poll_gets_its_next_long_poll_sent_by_the_answering_thread(cluster):
    """A poll waiting for its prefetched long-poll: the loop thread that reads the answer
    sends the next long-poll itself, and the poll adopts exactly that one (no second fetch
    from the polling thread). Records come once and in order; a truncated poll
    (``max_records``) and a seek still see every record once."""
    c = cluster(1)
    c.create_topic("fl", replication_factor=1)
    c.wait_leader_ready("fl")
    bootstrap = bootstrap_of(c)
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5000) as consumer, \
            Producer(bootstrap, acks="all", linger_ms=0) as producer:
        producer.send("fl", b"0", partition=0).result(10)
        consumer.assign([("fl", 0)])
        got: list = []
        wait_for(lambda: (got.extend(consumer.poll(1000)), got)[1], message="record 0")
        for i in (1, 2, 3):
            waited_on = consumer._prefetched[1][0][2]  # the long-poll the next poll waits for
            timer = threading.Timer(0.3, lambda i=i: producer.send("fl", b"%d" % i, partition=0))
            timer.start()
            try:
                got += consumer.poll(5000)
            finally:
                timer.join()
            assert waited_on.follow is not None  # sent from the loop thread, on the answer
            assert consumer._prefetched is waited_on.follow  # and adopted as the prefetch
            assert waited_on.follow[0] == {waited_on.stream.address: ((consumer._assigned(("fl", 0)), i + 1,
                                                                        waited_on.items[0][2]),)}
        assert [(r.offset, r.value) for r in got] == [(i, b"%d" % i) for i in range(4)]
        # A truncated poll takes one record; the loop sent no fetch ahead of it.
        for i in (4, 5):
            producer.send("fl", b"%d" % i, partition=0).result(10)
        one = []
        wait_for(lambda: (one.extend(consumer.poll(1000, max_records=1)), one)[1], message="record 4")
        rest = []
        wait_for(lambda: (rest.extend(consumer.poll(1000)), rest)[1], message="record 5")
        assert [r.offset for r in one + rest] == [4, 5]
        consumer.seek(("fl", 0), 2)
        again: list = []
        wait_for(lambda: (again.extend(consumer.poll(1000)), len(again) >= 4)[1], message="after seek")
        assert [r.offset for r in again] == [2, 3, 4, 5]


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
def test_leader_stopped_mid_stream_loses_nothing_acknowledged(cluster, stop):
    c = cluster(3)
    c.create_topic("mid", replication_factor=3)
    leader = c.wait_leader_ready("mid")
    bootstrap = bootstrap_of(c)
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stopping = threading.Event()

    def write() -> None:
        with Producer(bootstrap, acks="all", linger_ms=0, max_in_flight_per_partition=5,
                      retry_backoff_ms=50, request_timeout_ms=5000) as producer:
            i = 0
            while not stopping.is_set() or i < 400:
                value = f"m{i}".encode()
                future = producer.send("mid", value, partition=0)
                future.add_done_callback(lambda f, value=value: (
                    failed.append(f.exception()) if f.exception() else acked.append(value)))
                i += 1
                if i % 20 == 0:
                    producer.flush(60)
            producer.flush(60)

    writer = threading.Thread(target=write)
    writer.start()
    wait_for(lambda: len(acked) >= 100, message="writes acknowledged before the stop")
    if stop == "sigkill":
        leader.proc.kill()
    else:
        leader.proc.terminate()
    stopping.set()
    writer.join(180)
    assert not writer.is_alive()
    assert failed == []
    survivor = next(b for b in c.brokers.values() if b is not leader)
    records = consume(survivor.address, "mid", len(acked))
    stored = {r.value for r in records}
    assert set(acked) <= stored  # every acknowledged record survived the leader
