"""How the client streams fail: a server without the stream gives every request the
non-retriable UnsupportedVersionError (no other way is tried), and a stream that breaks
or hangs fails its requests with the retriable transport errors."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest

from tests.unit.test_client_fake_cluster import FakeBroker, serve_fake_cluster
from tidewater.client.aio_producer import AsyncProducer
from tidewater.client.consumer import Consumer
from tidewater.client.metadata import BrokerConnectionError, ChannelPool
from tidewater.client.producer import Producer
from tidewater.client.streams import StreamPool, StreamRequest
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import RequestTimedOutError, UnsupportedVersionError

pytestmark = pytest.mark.timeout(60)


class StreamlessBroker(FakeBroker):
    """Serves unary Produce and Fetch but not the streams: the generated base answers
    UNIMPLEMENTED, as any server without them (not a broker of this release) would."""

    ProduceStream = pb_grpc.BrokerServicer.ProduceStream
    FetchStream = pb_grpc.BrokerServicer.FetchStream


@pytest.fixture
def streamless_cluster():
    yield from serve_fake_cluster(StreamlessBroker)


def test_producer_fails_records_with_unsupported_version_and_never_goes_unary(streamless_cluster):
    state, bootstrap = streamless_cluster
    with Producer(bootstrap, acks="all", linger_ms=0, retry_backoff_ms=10) as producer:
        for value in (b"first", b"second"):  # each request: no silent switch to unary later
            fut = producer.send("t", value, partition=0)
            with pytest.raises(UnsupportedVersionError, match="does not implement ProduceStream") as info:
                fut.result(10)
            assert info.value.retriable is False
            assert info.value.error_code == pb.UNSUPPORTED_VERSION
            assert fut.exception().error_name == "UNSUPPORTED_VERSION"
    assert state.produce_requests == 0 and state.logs[0] == []


async def test_async_producer_fails_records_with_unsupported_version(streamless_cluster):
    state, bootstrap = streamless_cluster
    async with AsyncProducer(bootstrap, acks=1, linger_ms=0, retry_backoff_ms=10) as producer:
        for value in (b"first", b"second"):
            with pytest.raises(UnsupportedVersionError, match="does not implement ProduceStream"):
                await asyncio.wait_for(producer.send_and_wait("t", value, partition=0), 10)
    assert state.produce_requests == 0 and state.logs[0] == []


def test_consumer_poll_raises_unsupported_version_and_never_goes_unary(streamless_cluster):
    state, bootstrap = streamless_cluster
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=10) as consumer:
        consumer.assign([("t", 0)])
        for _ in range(2):
            with pytest.raises(UnsupportedVersionError, match="does not implement FetchStream"):
                consumer.poll(2000)
    assert state.fetch_offsets == []  # no unary Fetch was sent


class HangingBroker(pb_grpc.BrokerServicer):
    """Reads stream requests and never answers; ends the stream when told."""

    def __init__(self):
        self.end = futures.Future()

    def FetchStream(self, request_iterator, context):
        next(request_iterator)
        self.end.result(30)
        return iter(())

    def ProduceStream(self, request_iterator, context):
        next(request_iterator)
        self.end.result(30)
        context.abort(grpc.StatusCode.INTERNAL, "broker failed")


@pytest.fixture
def hanging_broker():
    servicer = HangingBroker()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pool = ChannelPool()
    yield servicer, ("127.0.0.1", port), pool
    servicer.end.set_result(None) if not servicer.end.done() else None
    pool.close()
    server.stop(grace=None)


def test_broken_produce_stream_fails_pending_requests_as_connection_errors(hanging_broker):
    servicer, address, pool = hanging_broker
    streams = StreamPool("ProduceStream", ordered=False)
    answers = futures.Future()
    stream = streams.stream(address)
    assert stream.send(pb.ProduceRequest(acks=-1), lambda r, e: answers.set_result((r, e)), 30)
    servicer.end.set_result(None)  # the broker fails the call
    response, error = answers.result(10)
    assert response is None and isinstance(error, BrokerConnectionError) and error.retriable
    # A broken stream takes nothing more; the pool opens a new one.
    assert not stream.send(pb.ProduceRequest(acks=-1), lambda r, e: None, 30)
    assert streams.stream(address) is not stream
    streams.close(timeout_s=1)


def test_unanswered_stream_request_times_out(hanging_broker, monkeypatch):
    _servicer, address, pool = hanging_broker
    monkeypatch.setattr(StreamPool, "WATCHDOG_INTERVAL_S", 0.05)
    streams = StreamPool("FetchStream", ordered=True)
    stream = streams.stream(address)
    pending = StreamRequest(stream, pb.FetchRequest(replica_id=-1))
    assert stream.send(pending.request, pending.on_answer, timeout_s=0.2)
    with pytest.raises(RequestTimedOutError):
        pending.result()
    assert stream.broken
    streams.close(timeout_s=1)


def test_pool_send_goes_on_a_new_stream_once_its_stream_broke_and_nowhere_once_closed(
        hanging_broker):
    servicer, address, pool = hanging_broker
    streams = StreamPool("ProduceStream", ordered=False)
    answers = futures.Future()
    broken = streams.send(address, pb.ProduceRequest(acks=-1),
                          lambda r, e: answers.set_result((r, e)), 30)
    assert broken is not None
    servicer.end.set_result(None)  # the broker fails the call
    assert isinstance(answers.result(10)[1], BrokerConnectionError)
    again = streams.send(address, pb.ProduceRequest(acks=-1), lambda r, e: None, 30)
    assert again is not None and again is not broken and not again.broken
    streams.close(timeout_s=1)
    assert streams.send(address, pb.ProduceRequest(acks=-1), lambda r, e: None, 30) is None
