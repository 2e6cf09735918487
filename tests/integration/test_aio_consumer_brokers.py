"""The asyncio consumer (``client.aio_consumer``) on FetchStream, against real brokers."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.test_client_streams import bootstrap_of
from tidewater.client.aio_consumer import AsyncConsumer
from tidewater.client.aio_producer import AsyncProducer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def _poll_until(consumer: AsyncConsumer, expected: int, timeout_s: float = 30) -> list:
    got: list = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < expected:
        assert asyncio.get_running_loop().time() < deadline, f"{len(got)} of {expected} records"
        got += await consumer.poll(200)
    return got


async def _produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    async with AsyncProducer(bootstrap, acks="all", linger_ms=0) as producer:
        for v in values:
            await producer.send(topic, v, partition=partition)
        await producer.flush(60)


async def test_reads_assigned_partitions_from_each_leader_and_follows_new_records(cluster):
    c = cluster(3)
    c.create_topic("aio-c", partitions=2, replication_factor=3)
    for partition in (0, 1):
        c.wait_leader_ready("aio-c", partition)
    bootstrap = bootstrap_of(c)
    values = {p: [f"p{p}-{i}".encode() for i in range(120)] for p in (0, 1)}
    for p in (0, 1):
        await _produce(bootstrap, "aio-c", p, values[p])
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest",
                             fetch_max_wait_ms=200) as consumer:
        consumer.assign([("aio-c", 0), ("aio-c", 1)])
        got = await _poll_until(consumer, 240)
        for p in (0, 1):
            assert [(r.offset, r.value) for r in got if r.partition == p] == list(enumerate(values[p]))
        assert await consumer.position(("aio-c", 0)) == 120
        assert await consumer.poll(300) == []  # caught up: the long-poll ends empty
        # Records written while a poll long-polls arrive in that poll's answer.
        more = [f"more-{i}".encode() for i in range(5)]
        poll = asyncio.ensure_future(_poll_until(consumer, 5))
        await _produce(bootstrap, "aio-c", 0, more)
        assert [(r.partition, r.value) for r in await poll] == [(0, v) for v in more]
        consumer.seek(("aio-c", 1), 100)
        assert [r.offset for r in await _poll_until(consumer, 20)] == list(range(100, 120))


async def test_out_of_range_resets_and_a_cancelled_long_poll_holds_nothing_back(cluster):
    c = cluster(1)  # one broker: both partitions on the same leader, so the same stream
    c.create_topic("aio-r", partitions=2, replication_factor=1)
    for partition in (0, 1):
        c.wait_leader_ready("aio-r", partition)
    bootstrap = bootstrap_of(c)
    values = [f"v{i}".encode() for i in range(30)]
    await _produce(bootstrap, "aio-r", 0, values)
    await _produce(bootstrap, "aio-r", 1, [b"after"])
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest",
                             fetch_max_wait_ms=20_000) as consumer:
        consumer.assign([("aio-r", 0)])
        consumer.seek(("aio-r", 0), 10_000)  # past the end: OFFSET_OUT_OF_RANGE, reset to earliest
        assert [r.value for r in await _poll_until(consumer, 30)] == values
        # A 20 s long-poll on partition 0 withdrawn by its caller, then partition 1 wanted:
        # the withdrawn fetch's stream breaks, so the next fetch is not answered behind it
        # (which would take the ~20 s the broker holds that long-poll).
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.poll(30_000), 0.3)
        consumer.assign([("aio-r", 1)])
        records = await asyncio.wait_for(consumer.poll(3000), 12)
        assert [r.value for r in records] == [b"after"]


async def test_group_id_is_refused():
    with pytest.raises(ValueError):
        AsyncConsumer("127.0.0.1:1", group_id="g")
