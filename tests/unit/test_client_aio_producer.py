"""The asyncio producer against in-process fake brokers: offsets, retries, leader moves, acks=0,
and its ProduceStream paths (answers by correlation_id, broken and hung streams; a server
without the stream: tests/unit/test_client_streams_errors.py)."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest
from test_client_fake_cluster import FakeBroker, FakeState, consume_all, fake_cluster  # noqa: F401

from tidewater.client import aio_producer
from tidewater.client.aio_producer import AsyncProducer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    InvalidTopicError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)


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


async def test_a_record_sent_in_the_answers_loop_pass_goes_in_the_next_request(fake_cluster):  # noqa: F811
    """A record the application sends in the loop pass that reads an answer (a timer that
    fell due alongside it) goes in the request carrying what queued behind the answered
    one, not in a request of its own a whole round later."""
    state, bootstrap = fake_cluster
    async with AsyncProducer(bootstrap, acks=1, linger_ms=0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        loop = asyncio.get_running_loop()
        late: list[asyncio.Future] = []
        on_response = producer._on_response

        def send_in_this_pass() -> None:
            # One step of send(): it does not suspend (metadata cached, buffer free).
            step = producer.send("t", b"C", partition=0)
            try:
                step.send(None)
            except StopIteration as done:
                late.append(done.value)
            else:  # pragma: no cover - send suspended
                raise AssertionError("send suspended")

        def answer_then_send(groups, response, transport_error):
            producer._on_response = on_response  # once: the answer to A
            loop.call_soon(send_in_this_pass)  # queued in the pass that reads the answer
            on_response(groups, response, transport_error)

        producer._on_response = answer_then_send
        futs = [await producer.send("t", b"A", partition=0)]  # out at once
        futs.append(await producer.send("t", b"B", partition=0))  # queued behind A
        while not late:
            await asyncio.sleep(0.001)
        await producer.flush(5)
    assert [f.result().offset for f in futs + late] == [1, 2, 3]
    # warm, A, then B and C together (one batch, one request)
    assert [base for base, _ in state.logs[0]] == [0, 1, 2]


# ---------------------------------------------------------------------- ProduceStream paths


class StreamFakeBroker(FakeBroker):
    """The fake's ProduceStream, counting streams; ``mode`` "break-first": the first stream
    ends with INTERNAL after reading one request (unanswered); "hang": streams read and
    never answer."""

    mode = "answer"
    streams_opened = 0

    def ProduceStream(self, request_iterator, context):
        type(self).streams_opened += 1
        if self.mode == "hang":
            for _ in request_iterator:
                pass
            return
        if self.mode == "break-first" and type(self).streams_opened == 1:
            next(request_iterator)
            context.abort(grpc.StatusCode.INTERNAL, "broker failed")
        yield from super().ProduceStream(request_iterator, context)


@pytest.fixture
def stream_cluster():
    StreamFakeBroker.streams_opened = 0
    state = FakeState(partitions=3, broker_ids=[1, 2])
    servers = []
    for b in state.broker_ids:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_BrokerServicer_to_server(StreamFakeBroker(b, state), server)
        state.addresses[b] = ("127.0.0.1", server.add_insecure_port("127.0.0.1:0"))
        server.start()
        servers.append(server)
    yield state, ",".join(f"127.0.0.1:{state.addresses[b][1]}" for b in state.broker_ids)
    for server in servers:
        server.stop(grace=None)


async def test_answers_on_the_stream_with_several_requests_in_flight(stream_cluster):
    state, bootstrap = stream_cluster
    async with AsyncProducer(bootstrap, acks="all", linger_ms=0,
                             max_in_flight_per_partition=4) as producer:
        futs = [await producer.send("t", f"v{i}".encode(), partition=0) for i in range(100)]
        await producer.flush(10)
    assert [f.result().offset for f in futs] == list(range(100))
    assert StreamFakeBroker.streams_opened == 1 and state.produce_requests >= 1


async def test_a_broken_stream_fails_its_requests_as_retriable(stream_cluster):
    state, bootstrap = stream_cluster
    StreamFakeBroker.mode = "break-first"
    try:
        async with AsyncProducer(bootstrap, acks=1, linger_ms=0, retry_backoff_ms=10) as producer:
            meta = await asyncio.wait_for(producer.send_and_wait("t", b"x", partition=0), 10)
    finally:
        StreamFakeBroker.mode = "answer"
    assert meta.offset == 0  # retried on a new stream, appended once
    assert StreamFakeBroker.streams_opened == 2
    assert len(state.logs[0]) == 1


async def test_a_hung_broker_times_requests_out(stream_cluster, monkeypatch):
    _state, bootstrap = stream_cluster
    monkeypatch.setattr(aio_producer, "DEADLINE_SLACK_S", 0.0)
    StreamFakeBroker.mode = "hang"
    try:
        async with AsyncProducer(bootstrap, acks=1, linger_ms=0, retries=0,
                                 request_timeout_ms=300) as producer:
            with pytest.raises(RequestTimedOutError):
                await asyncio.wait_for(producer.send_and_wait("t", b"x", partition=0), 10)
    finally:
        StreamFakeBroker.mode = "answer"
