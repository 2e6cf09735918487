"""The asyncio producer (``client.aio_producer``) on ProduceStream, against real brokers."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.conftest import wait_for
from tests.integration.test_client_streams import bootstrap_of, consume, metrics_cluster
from tests.integration.test_replica_fetch_stream import rpc_count
from tidewater.client.aio_producer import AsyncProducer
from tidewater.proto.errors import UnknownTopicOrPartitionError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def test_acks_all_1_and_0_on_the_stream_read_back_by_the_consumer(cluster):
    c, scrape = metrics_cluster(cluster, 3)
    for topic in ("aio-all", "aio-one", "aio-zero"):
        c.create_topic(topic, replication_factor=3)
    leaders = {c.wait_leader_ready(topic).broker_id
               for topic in ("aio-all", "aio-one", "aio-zero")}
    bootstrap = bootstrap_of(c)
    values = [f"v{i}".encode() for i in range(300)]
    # linger 0 and 5 in flight: many single-record requests on one stream at once.
    async with AsyncProducer(bootstrap, acks="all", linger_ms=0,
                             max_in_flight_per_partition=5) as producer:
        futures = [await producer.send("aio-all", v, partition=0) for v in values]
        await producer.flush(60)
        assert [f.result().offset for f in futures] == list(range(len(values)))  # send order
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send("aio-no-such-topic", b"x")
    async with AsyncProducer(bootstrap, acks=1, linger_ms=2) as producer:
        metas = [await producer.send_and_wait("aio-one", v, partition=0) for v in values[:50]]
        assert [m.offset for m in metas] == list(range(50))
    async with AsyncProducer(bootstrap, acks=0, linger_ms=0) as producer:
        futures = [await producer.send("aio-zero", v, partition=0) for v in values[:50]]
        await producer.flush(30)
        assert {f.result().offset for f in futures} == {-1}  # acks=0: no answer, no offset
    # close() sent the acks=0 requests still queued before it closed the streams.
    for topic, expected in (("aio-all", values), ("aio-one", values[:50]),
                            ("aio-zero", values[:50])):
        records = await asyncio.to_thread(consume, bootstrap, topic, len(expected))
        assert [(r.offset, r.value) for r in records] == list(enumerate(expected))
    for broker_id in leaders:
        assert rpc_count(scrape(broker_id), "Produce") == 0  # every request went on a stream
    assert sum(rpc_count(scrape(b), "ProduceStream") for b in leaders) >= 1


async def test_leader_killed_mid_run_loses_nothing_acknowledged(cluster):
    c = cluster(3)
    c.create_topic("aio-kill", replication_factor=3)
    leader = c.wait_leader_ready("aio-kill")
    bootstrap = bootstrap_of(c)
    acked: list[bytes] = []
    failed: list[BaseException] = []

    def on_done(future: asyncio.Future, value: bytes) -> None:
        error = future.exception()
        (failed if error else acked).append(error or value)

    async with AsyncProducer(bootstrap, acks="all", linger_ms=0, max_in_flight_per_partition=5,
                             retry_backoff_ms=50, request_timeout_ms=5000) as producer:
        i = 0
        while i < 400 or leader.proc.running:
            value = f"k{i}".encode()
            (await producer.send("aio-kill", value, partition=0)).add_done_callback(
                lambda f, value=value: on_done(f, value))
            i += 1
            if i % 20 == 0:
                await producer.flush(60)
            if len(acked) >= 100 and leader.proc.running:
                leader.proc.kill()  # SIGKILL, with requests out on its stream
        await producer.flush(60)
    assert failed == []
    survivor = next(b for b in c.brokers.values() if b is not leader)
    wait_for(lambda: c.partition_state("aio-kill").leader not in (-1, leader.broker_id),
             message="a new leader")
    records = await asyncio.to_thread(consume, survivor.address, "aio-kill", len(acked))
    assert set(acked) <= {r.value for r in records}  # every acknowledged record survived
