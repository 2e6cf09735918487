"""The asyncio producer against in-process fake brokers: offsets, retries, leader moves, acks=0."""

from __future__ import annotations

import asyncio

import pytest
from test_client_fake_cluster import consume_all, fake_cluster  # noqa: F401

from client.aio_producer import AsyncProducer
from proto import tidewater_pb2 as pb
from proto.errors import InvalidTopicError, RequestTimedOutError, UnknownTopicOrPartitionError


async def test_offsets_batches_and_round_trip(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    async with AsyncProducer(bootstrap, acks="all", linger_ms=5, batch_size_bytes=300) as producer:
        futs = [await producer.send("t", f"v{i}".encode(), partition=1) for i in range(200)]
        await producer.flush(5)
        metas = [f.result() for f in futs]
        keyed = await producer.send_and_wait("t", b"k", key=b"same")
    assert [m.offset for m in metas] == list(range(200))
    assert {m.partition for m in metas} == {1}
    assert len(state.logs[1]) > 1  # several batches
    records = await asyncio.to_thread(consume_all, bootstrap, 200, (1,))
    assert [r.value for r in records][:200] == [f"v{i}".encode() for i in range(200)]
    assert keyed.offset >= 0


async def test_retries_follow_a_leader_move(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    async with AsyncProducer(bootstrap, acks=1, linger_ms=0, retry_backoff_ms=10) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        state.produce_errors = [pb.NOT_ENOUGH_REPLICAS]
        state.move_leader(0, 2)
        meta = await producer.send_and_wait("t", b"after", partition=0)
    assert meta.offset == 1
    assert [base for base, _ in state.logs[0]] == [0, 1]


async def test_errors_are_typed(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    async with AsyncProducer(bootstrap, linger_ms=0, retry_backoff_ms=10,
                             delivery_timeout_ms=300) as producer:
        state.produce_errors = [pb.INVALID_TOPIC_EXCEPTION]
        with pytest.raises(InvalidTopicError):
            await producer.send_and_wait("t", b"x", partition=2)
        state.produce_errors = [pb.NOT_ENOUGH_REPLICAS] * 1000
        with pytest.raises(RequestTimedOutError, match="NOT_ENOUGH_REPLICAS"):
            await producer.send_and_wait("t", b"y", partition=2)
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send("t", b"z", partition=7)
    assert state.logs[2] == []


async def test_acks_zero(fake_cluster):  # noqa: F811
    _, bootstrap = fake_cluster
    async with AsyncProducer(bootstrap, acks=0, linger_ms=0) as producer:
        assert (await producer.send_and_wait("t", b"x", partition=0)).offset == -1
