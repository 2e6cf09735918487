"""Clients fall back to unary Produce/Fetch against a broker without the streams, and a
stream that breaks fails its requests with the retriable transport error."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from tests.unit.test_client_fake_cluster import consume_all, fake_cluster  # noqa: F401 - fixture
from tidewater.client.metadata import BrokerConnectionError, ChannelPool
from tidewater.client.producer import Producer
from tidewater.client.streams import StreamPool, StreamRequest
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import RequestTimedOutError

pytestmark = pytest.mark.timeout(60)


def test_producer_and_consumer_fall_back_to_unary_without_the_streams(fake_cluster):  # noqa: F811
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks="all", linger_ms=0, max_in_flight_per_partition=5) as producer:
        futs = [producer.send("t", f"v{i}".encode(), partition=0) for i in range(20)]
        producer.flush(10)
        assert [f.result(0).offset for f in futs] == list(range(20))
        # The first request found ProduceStream UNIMPLEMENTED; later ones went unary directly.
        assert producer._streams.stream(state.addresses[state.leaders[0]]) is None
    assert state.produce_requests >= 1
    records = consume_all(bootstrap, 20, partitions=(0,))
    assert [(r.offset, r.value) for r in records] == [(i, f"v{i}".encode()) for i in range(20)]


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
