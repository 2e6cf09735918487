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


GROUP_BROKER_SETTINGS = {"offsets.topic.num.partitions": "4",
                         "group.min.session.timeout.ms": "1000",
                         "group.initial.rebalance.delay.ms": "0"}


async def test_a_group_shares_partitions_commits_and_hands_them_on(cluster):
    c = cluster(3, broker_settings=GROUP_BROKER_SETTINGS)
    c.create_topic("aio-g", partitions=4, replication_factor=3)
    for partition in range(4):
        c.wait_leader_ready("aio-g", partition)
    bootstrap = bootstrap_of(c)
    for p in range(4):
        await _produce(bootstrap, "aio-g", p, [f"a{p}-{i}".encode() for i in range(10)])
    options = dict(group_id="ag", auto_offset_reset="earliest", fetch_max_wait_ms=200,
                   session_timeout_ms=3000, heartbeat_interval_ms=300,
                   enable_auto_commit=False)
    assigned: dict[str, list] = {"a": [], "b": []}
    first = AsyncConsumer(bootstrap, **options)
    await first.start()
    try:
        first.subscribe(["aio-g"], on_assign=assigned["a"].append)
        got = await _poll_until(first, 40)
        assert sorted(r.value for r in got) == sorted(
            f"a{p}-{i}".encode() for p in range(4) for i in range(10))
        assert assigned["a"] == [[("aio-g", p) for p in range(4)]]
        await first.commit()
        assert await first.committed([("aio-g", p) for p in range(4)]) == {
            ("aio-g", p): 10 for p in range(4)}
        assert first.group_metadata().generation_id >= 1

        # A second member: the group rebalances and each takes two partitions; what is
        # written after is read once, by the member that holds its partition.
        async with AsyncConsumer(bootstrap, **options) as second:
            second.subscribe(["aio-g"], on_assign=assigned["b"].append)
            seen: dict[str, list] = {"a": [], "b": []}

            async def poll_until(name: str, member: AsyncConsumer, done) -> None:
                # Each member polls in its own task, as members of a group do: a rejoin
                # runs in a worker thread, so the loop serves the other one meanwhile.
                deadline = asyncio.get_running_loop().time() + 60
                while not done():
                    assert asyncio.get_running_loop().time() < deadline, (assigned, seen)
                    seen[name] += await member.poll(100)

            def split() -> bool:
                return (len(first.assignment()) == 2 and len(second.assignment()) == 2
                        and len(assigned["a"]) >= 2 and len(assigned["b"]) >= 1)

            await asyncio.gather(poll_until("a", first, split), poll_until("b", second, split))
            held_by_first = sorted(first.assignment())
            assert sorted(held_by_first + second.assignment()) == [
                ("aio-g", p) for p in range(4)]
            for p in range(4):
                await _produce(bootstrap, "aio-g", p, [f"b{p}-{i}".encode() for i in range(5)])

            def all_read() -> bool:
                return len(seen["a"]) + len(seen["b"]) >= 20

            await asyncio.gather(poll_until("a", first, all_read),
                                 poll_until("b", second, all_read))
            for name, member in (("a", first), ("b", second)):
                assert {(r.topic, r.partition) for r in seen[name]} <= set(member.assignment())
            assert sorted(r.value for r in seen["a"] + seen["b"]) == sorted(
                f"b{p}-{i}".encode() for p in range(4) for i in range(5))
            await second.commit()  # the first commits nothing more
        # The second member left: the first takes all four partitions back, each at its
        # committed offset: its own two at 10 (it reads their five new records again,
        # at least once), the second's at 15 (nothing again).
        again: list = []
        deadline = asyncio.get_running_loop().time() + 60
        while len(first.assignment()) != 4 or len(again) < 10:
            assert asyncio.get_running_loop().time() < deadline, (first.assignment(), again)
            again += await first.poll(100)
        assert sorted(r.value for r in again) == sorted(
            f"b{p}-{i}".encode() for _, p in held_by_first for i in range(5))
        assert await first.poll(500) == []
        assert assigned["a"][-1] == [("aio-g", p) for p in range(4)]  # on_assign each time
    finally:
        await first.close()


async def test_groups_need_a_group_id():
    consumer = AsyncConsumer("127.0.0.1:1")
    with pytest.raises(ValueError):
        consumer.subscribe(["t"])
    with pytest.raises(ValueError):
        await consumer.commit({("t", 0): 1})
    await consumer.close()
