"""The client streams on the process's grpc.aio loop (client.streams): answers by
correlation id or in order, close with requests in flight, the loop thread's life."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from tidewater.client.metadata import BrokerConnectionError, ChannelPool
from tidewater.client.streams import IoLoop, StreamPool, StreamRequest
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tide-client-io"]


class StreamBroker(pb_grpc.BrokerServicer):
    """ProduceStream answers requests in pairs, the second one first (the client matches
    them by correlation id); acks=0 requests are counted, not answered. FetchStream answers
    each request in order, its max_wait_ms as the answer's ``mark``; a request with
    max_wait_ms -1 is held until ``release`` is set."""

    def __init__(self):
        self.unanswered = 0
        self.release = threading.Event()

    def ProduceStream(self, request_iterator, context):
        held = None
        for request in request_iterator:
            if request.acks == 0:
                self.unanswered += 1
                continue
            answer = pb.ProduceResponse(correlation_id=request.correlation_id)
            if held is None:
                held = answer
                continue
            yield answer
            yield held
            held = None
        if held is not None:
            yield held

    def FetchStream(self, request_iterator, context):
        for request in request_iterator:
            if request.max_wait_ms < 0:
                self.release.wait(30)
            yield pb.FetchResponse(partitions=[pb.FetchPartitionResponse(
                high_watermark=request.max_wait_ms)])


def mark(response: pb.FetchResponse) -> int:
    return response.partitions[0].high_watermark


@pytest.fixture
def broker():
    servicer = StreamBroker()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    pool = ChannelPool()
    yield servicer, ("127.0.0.1", port), pool
    servicer.release.set()
    pool.close()
    server.stop(grace=None)


def test_produce_answers_are_matched_by_correlation_id(broker):
    _servicer, address, pool = broker
    streams = StreamPool("ProduceStream", ordered=False)
    answers: dict[int, futures.Future] = {}
    stream = streams.stream(address)
    for i in range(6):
        request = pb.ProduceRequest(acks=-1)
        answers[i] = futures.Future()
        assert stream.send(request, lambda r, e, f=answers[i]: f.set_result((r, e)), 30)
        assert request.correlation_id == i + 1  # set by send
    for i, answer in answers.items():
        response, error = answer.result(10)
        assert error is None and response.correlation_id == i + 1
    streams.close(timeout_s=5)
    assert not loop_threads()


def test_fetch_answers_come_in_order_and_wake_the_waiter(broker):
    _servicer, address, pool = broker
    streams = StreamPool("FetchStream", ordered=True)
    stream = streams.stream(address)
    pending = [StreamRequest(stream, pb.FetchRequest(max_wait_ms=i)) for i in range(5)]
    for p in pending:
        assert stream.send(p.request, p.on_answer, 30)
    assert [mark(p.result()) for p in pending] == list(range(5))
    streams.close()
    assert not loop_threads()


def test_close_fails_requests_in_flight_and_stops_the_loop(broker):
    servicer, address, pool = broker
    streams = StreamPool("FetchStream", ordered=True)
    stream = streams.stream(address)
    held = StreamRequest(stream, pb.FetchRequest(max_wait_ms=-1))  # the broker holds it
    after = StreamRequest(stream, pb.FetchRequest(max_wait_ms=1))
    assert stream.send(held.request, held.on_answer, 30)
    assert stream.send(after.request, after.on_answer, 30)
    assert len(loop_threads()) == 1
    started = time.monotonic()
    streams.close(timeout_s=5)
    assert time.monotonic() - started < 2  # an ordered stream does not wait for answers
    for request in (held, after):
        with pytest.raises(BrokerConnectionError):
            request.result()
    assert not stream.send(pb.FetchRequest(), lambda r, e: None, 30)
    assert streams.stream(address) is None  # a closed pool opens nothing
    assert not loop_threads()


def test_close_sends_queued_unanswered_requests_first(broker):
    servicer, address, pool = broker
    streams = StreamPool("ProduceStream", ordered=False)
    stream = streams.stream(address)
    called = []
    for _ in range(50):
        assert stream.send(pb.ProduceRequest(acks=0), lambda r, e: called.append((r, e)), 30,
                           answered=False)
    streams.close(timeout_s=5)
    assert called == [(None, None)] * 50  # an acks=0 request is done once queued
    assert servicer.unanswered == 50  # and still written before the half-close
    assert not loop_threads()


def test_pools_share_one_loop_until_the_last_closes(broker):
    _servicer, address, pool = broker
    produce = StreamPool("ProduceStream", ordered=False)
    fetch = StreamPool("FetchStream", ordered=True)
    produce.stream(address)
    fetch.stream(address)
    assert len(loop_threads()) == 1
    produce.close()
    assert len(loop_threads()) == 1
    request = StreamRequest(fetch.stream(address), pb.FetchRequest(max_wait_ms=7))
    assert request.stream.send(request.request, request.on_answer, 30)
    assert mark(request.result()) == 7  # the other pool still works
    fetch.close()
    assert not loop_threads()
    # A new pool starts a new loop.
    again = StreamPool("FetchStream", ordered=True)
    request = StreamRequest(again.stream(address), pb.FetchRequest(max_wait_ms=3))
    assert request.stream.send(request.request, request.on_answer, 30)
    assert mark(request.result()) == 3
    again.close()
    assert not loop_threads()


def test_a_callback_may_send_and_close_from_the_loop_thread(broker):
    _servicer, address, pool = broker
    streams = StreamPool("ProduceStream", ordered=False)
    done = futures.Future()

    def second(response, error):
        # On the loop thread: close from here must not wait for the loop itself.
        assert threading.current_thread().name == "tide-client-io"
        streams.close()
        done.set_result((response, error))

    def first(response, error):
        assert error is None
        stream = streams.stream(address)
        assert stream.send(pb.ProduceRequest(acks=-1), second, 30)
        assert stream.send(pb.ProduceRequest(acks=-1), lambda r, e: None, 30)  # a pair

    stream = streams.stream(address)
    assert stream.send(pb.ProduceRequest(acks=-1), first, 30)
    assert stream.send(pb.ProduceRequest(acks=-1), lambda r, e: None, 30)
    response, error = done.result(10)
    assert error is None and response.correlation_id == 3
    for thread in loop_threads():
        thread.join(5)
    assert not loop_threads()


def test_a_forked_child_forgets_the_parents_loop(broker):
    _servicer, address, pool = broker
    streams = StreamPool("FetchStream", ordered=True)
    streams.stream(address)
    shared = IoLoop._shared
    assert shared is not None
    IoLoop._forget_after_fork()  # what os.register_at_fork runs in a child
    try:
        assert IoLoop._shared is None and IoLoop._users == 0
    finally:
        IoLoop._shared, IoLoop._users = shared, 1
    streams.close()
    assert not loop_threads()
