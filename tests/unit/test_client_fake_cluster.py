"""Producer and consumer against in-process fake brokers (real gRPC, scripted behaviour).

The fakes keep one log per partition and a leader/epoch table that tests
change, and can be told to answer the next requests with an error. This drives
the client's retry, metadata-refresh and leader-following paths without the
real broker processes. They serve ProduceStream and FetchStream as the broker
does (and unary Produce and Fetch, which the clients do not use).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

from tidewater.client.consumer import Consumer, NoOffsetForPartitionError
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.batch import iter_batches, set_base_offset_and_epoch
from tidewater.proto.errors import InvalidTopicError, UnknownTopicOrPartitionError


class FakeState:
    def __init__(self, partitions: int, broker_ids: list[int]):
        self.lock = threading.Lock()
        self.broker_ids = broker_ids
        self.addresses: dict[int, tuple[str, int]] = {}
        self.leaders = {p: broker_ids[p % len(broker_ids)] for p in range(partitions)}
        self.epochs = dict.fromkeys(range(partitions), 0)
        self.logs: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        self.log_start = dict.fromkeys(range(partitions), 0)
        self.produce_errors: list[int] = []  # answer the next produce partitions with these
        self.produce_requests = 0
        self.produce_delay_s = 0.0  # before a produce request is answered (acks=all's wait)
        self.produce_calls_now = 0  # produce requests being answered right now
        self.produce_calls_max = 0
        self.fetch_waits_ms: list[int] = []  # max_wait_ms of every Fetch, in arrival order
        self.fetch_offsets: list[int] = []  # the first partition's fetch_offset, likewise
        self.metadata_requests = 0

    def leo(self, p: int) -> int:
        log = self.logs[p]
        if not log:
            return self.log_start[p]
        base, data = log[-1]
        header = next(iter_batches(data))[1]
        return base + header.last_offset_delta + 1

    def move_leader(self, p: int, broker_id: int) -> None:
        with self.lock:
            self.leaders[p] = broker_id
            self.epochs[p] += 1


class FakeBroker(pb_grpc.BrokerServicer):
    def __init__(self, broker_id: int, state: FakeState):
        self.broker_id = broker_id
        self.state = state

    def Metadata(self, request, context):
        s = self.state
        with s.lock:
            s.metadata_requests += 1
            topics = [pb.TopicMetadata(name="t", partitions=[
                pb.PartitionMetadata(partition=p, leader=s.leaders[p], leader_epoch=s.epochs[p],
                                     replicas=s.broker_ids, isr=s.broker_ids)
                for p in sorted(s.leaders)])]
            if request.topics and "t" not in request.topics:
                topics = [pb.TopicMetadata(name=n, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION)
                          for n in request.topics]
            elif request.topics:
                topics += [pb.TopicMetadata(name=n, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION)
                           for n in request.topics if n != "t"]
            return pb.MetadataResponse(
                brokers=[pb.BrokerEndpoint(broker_id=b, host=h, port=port)
                         for b, (h, port) in s.addresses.items()],
                controller_id=3000, topics=topics, cluster_id="fake")

    def Produce(self, request, context):
        self._wait_before_answer()
        return self._append(request)

    def InitProducerId(self, request, context):
        return pb.InitProducerIdResponse(error_code=pb.NONE, producer_id=1000 + self.broker_id,
                                         producer_epoch=0)

    def ProduceStream(self, request_iterator, context):
        """Like the broker's: requests appended in arrival order, each answered (by
        correlation_id) after the produce delay, several at once; none with acks=0."""
        answers: queue.SimpleQueue = queue.SimpleQueue()
        waiting = threading.Semaphore(0)  # one release per answer thread that finished

        def answer(response) -> None:
            self._wait_before_answer(response)
            answers.put(response)
            waiting.release()

        def read() -> None:
            started = 0
            try:
                for request in request_iterator:
                    response = self._append(request)
                    if request.acks != 0:
                        response.correlation_id = request.correlation_id
                        threading.Thread(target=answer, args=(response,), daemon=True).start()
                        started += 1
            except grpc.RpcError:
                pass  # the client went away
            for _ in range(started):
                waiting.acquire()
            answers.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (response := answers.get()) is not None:
            yield response

    def _wait_before_answer(self, response: pb.ProduceResponse | None = None) -> None:
        s = self.state
        with s.lock:
            s.produce_calls_now += 1
            s.produce_calls_max = max(s.produce_calls_max, s.produce_calls_now)
        time.sleep(s.produce_delay_s)
        with s.lock:
            s.produce_calls_now -= 1

    def _append(self, request) -> pb.ProduceResponse:
        s = self.state
        out = []
        with s.lock:
            s.produce_requests += 1
            for part in request.partitions:
                p = part.partition
                if s.produce_errors:
                    code = s.produce_errors.pop(0)
                    out.append(pb.ProducePartitionResponse(topic=part.topic, partition=p,
                                                           error_code=code, base_offset=-1))
                    continue
                if part.topic != "t" or p not in s.leaders:
                    out.append(pb.ProducePartitionResponse(topic=part.topic, partition=p,
                                                           error_code=pb.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                if s.leaders[p] != self.broker_id:
                    out.append(pb.ProducePartitionResponse(topic=part.topic, partition=p,
                                                           error_code=pb.NOT_LEADER_OR_FOLLOWER))
                    continue
                out.append(self._append_partition(part, request.acks))
        if request.acks == 0:
            return pb.ProduceResponse()  # like the real broker: no answer owed with acks=0
        return pb.ProduceResponse(partitions=out)

    def _append_partition(self, part, acks: int) -> pb.ProducePartitionResponse:
        """Append one partition's batches (lock held; this broker leads it)."""
        s, p = self.state, part.partition
        data = bytearray(part.records)
        base = s.leo(p)
        offset = base
        for position, header in list(iter_batches(data)):
            set_base_offset_and_epoch(data, position, offset, s.epochs[p])
            s.logs[p].append((offset, bytes(data[position:position + header.size])))
            offset += header.last_offset_delta + 1
        return pb.ProducePartitionResponse(topic=part.topic, partition=p, error_code=pb.NONE,
                                           base_offset=base if acks != 0 else -1)

    def Fetch(self, request, context):
        s = self.state
        out = []
        with s.lock:
            s.fetch_waits_ms.append(request.max_wait_ms)
            s.fetch_offsets.append(request.partitions[0].fetch_offset if request.partitions else -1)
            for fp in request.partitions:
                p = fp.partition
                resp = pb.FetchPartitionResponse(topic=fp.topic, partition=p)
                if s.leaders.get(p) != self.broker_id:
                    resp.error_code = pb.NOT_LEADER_OR_FOLLOWER
                elif fp.current_leader_epoch >= 0 and fp.current_leader_epoch < s.epochs[p]:
                    resp.error_code = pb.FENCED_LEADER_EPOCH
                elif fp.current_leader_epoch > s.epochs[p]:
                    resp.error_code = pb.UNKNOWN_LEADER_EPOCH
                elif not s.log_start[p] <= fp.fetch_offset <= s.leo(p):
                    resp.error_code = pb.OFFSET_OUT_OF_RANGE
                else:
                    chunks = []
                    size = 0
                    for base, data in s.logs[p]:
                        header = next(iter_batches(data))[1]
                        if base + header.last_offset_delta >= fp.fetch_offset:
                            # Like the broker: at least one batch, then up to partition_max_bytes.
                            if chunks and size + len(data) > fp.partition_max_bytes:
                                break
                            chunks.append(data)
                            size += len(data)
                    resp.records = b"".join(chunks)
                    resp.high_watermark = s.leo(p)
                    resp.leader_epoch = s.epochs[p]
                out.append(resp)
        return pb.FetchResponse(partitions=out)

    def FetchStream(self, request_iterator, context):
        """One answer per request, in order, as the broker's (no long-poll: answered at once)."""
        for request in request_iterator:
            yield self.Fetch(request, context)

    def ListOffsets(self, request, context):
        s = self.state
        out = []
        with s.lock:
            for lp in request.partitions:
                p = lp.partition
                if s.leaders.get(p) != self.broker_id:
                    out.append(pb.ListOffsetsPartitionResponse(topic=lp.topic, partition=p,
                                                               error_code=pb.NOT_LEADER_OR_FOLLOWER))
                    continue
                offset = s.log_start[p] if lp.timestamp == -2 else s.leo(p)
                out.append(pb.ListOffsetsPartitionResponse(topic=lp.topic, partition=p,
                                                           offset=offset, timestamp=-1))
        return pb.ListOffsetsResponse(partitions=out)


def serve_fake_cluster(broker_type: type[FakeBroker] = FakeBroker):
    """Two fake brokers of ``broker_type`` on 127.0.0.1: yields (state, bootstrap)."""
    state = FakeState(partitions=3, broker_ids=[1, 2])
    servers = []
    for b in state.broker_ids:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_BrokerServicer_to_server(broker_type(b, state), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        state.addresses[b] = ("127.0.0.1", port)
        servers.append(server)
    bootstrap = ",".join(f"127.0.0.1:{state.addresses[b][1]}" for b in state.broker_ids)
    yield state, bootstrap
    for server in servers:
        server.stop(grace=None)


@pytest.fixture
def fake_cluster():
    yield from serve_fake_cluster()


def consume_all(bootstrap: str, expected: int, partitions=(0, 1, 2), timeout_ms: int = 5000):
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("t", p) for p in partitions])
        got = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if len(got) >= expected:
                break
        return got


def test_per_record_offsets_and_keyed_partitioning(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks="all", linger_ms=20) as producer:
        futs = [producer.send("t", f"v{i}".encode(), key=b"same-key") for i in range(10)]
        producer.flush(5)
        metas = [f.result() for f in futs]
    partitions = {m.partition for m in metas}
    assert len(partitions) == 1  # one key, one partition
    assert [m.offset for m in metas] == list(range(10))
    records = consume_all(bootstrap, 10)
    assert [(r.offset, r.value) for r in records] == [(i, f"v{i}".encode()) for i in range(10)]
    assert all(r.key == b"same-key" for r in records)


def test_retriable_errors_are_retried_and_not_leader_refreshes_metadata(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0, retry_backoff_ms=10) as producer:
        producer.send("t", b"warm", partition=0).result(5)
        refreshes_before = state.metadata_requests
        state.produce_errors = [pb.NOT_ENOUGH_REPLICAS, pb.REQUEST_TIMED_OUT]
        state.move_leader(0, 2)  # the producer's metadata now points at the wrong broker
        meta = producer.send("t", b"after", partition=0).result(5)
    assert meta.offset == 1
    assert state.metadata_requests > refreshes_before
    assert [base for base, _ in state.logs[0]] == [0, 1]


def test_non_retriable_error_fails_the_records_with_a_typed_exception(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, linger_ms=0) as producer:
        state.produce_errors = [pb.INVALID_TOPIC_EXCEPTION]
        fut = producer.send("t", b"x", partition=1)
        with pytest.raises(InvalidTopicError):
            fut.result(5)
    assert state.logs[1] == []


def test_retries_zero_fails_fast(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, linger_ms=0, retries=0) as producer:
        state.produce_errors = [pb.NOT_ENOUGH_REPLICAS]
        with pytest.raises(Exception) as info:
            producer.send("t", b"x", partition=2).result(5)
    assert info.value.error_code == pb.NOT_ENOUGH_REPLICAS


def test_unknown_topic_raises_on_send(fake_cluster):
    _, bootstrap = fake_cluster
    with Producer(bootstrap, unknown_topic_wait_ms=200) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("missing", b"x")


def test_batching_puts_many_records_in_few_requests(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=50, batch_size_bytes=1 << 20) as producer:
        futs = [producer.send("t", b"x" * 10, partition=0) for _ in range(200)]
        producer.flush(5)
    assert all(f.result().offset >= 0 for f in futs)
    assert state.produce_requests <= 5
    assert len(state.logs[0]) <= 5


def test_acks_zero_resolves_with_offset_minus_one(fake_cluster):
    _, bootstrap = fake_cluster
    with Producer(bootstrap, acks=0, linger_ms=0) as producer:
        assert producer.send("t", b"x", partition=0).result(5).offset == -1


def test_consumer_follows_leader_change(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        for i in range(3):
            producer.send("t", f"a{i}".encode(), partition=0).result(5)
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=10) as consumer:
        consumer.assign([("t", 0)])
        first = consumer.poll(2000)
        assert [r.value for r in first] == [b"a0", b"a1", b"a2"]
        state.move_leader(0, 2)
        with state.lock:  # the new leader appends in its epoch
            base = state.leo(0)
        with Producer(bootstrap, acks=1, linger_ms=0) as producer:
            producer.send("t", b"b0", partition=0).result(5)
        got = []
        for _ in range(30):
            got += consumer.poll(100)
            if got:
                break
        assert [(r.offset, r.value, r.leader_epoch) for r in got] == [(base, b"b0", 1)]


def test_offset_out_of_range_resets_by_policy(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        producer.send("t", b"only", partition=1).result(5)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("t", 1)])
        consumer.seek(("t", 1), 50)
        got = []
        for _ in range(20):
            got += consumer.poll(100)
            if got:
                break
        assert [r.value for r in got] == [b"only"]
    with Consumer(bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([("t", 1)])
        consumer.seek(("t", 1), 50)
        with pytest.raises(NoOffsetForPartitionError):
            consumer.poll(500)


def test_seek_to_end_and_max_records(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        for i in range(5):
            producer.send("t", f"{i}".encode(), partition=2).result(5)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("t", 2)])
        consumer.seek_to_end()
        assert consumer.position(("t", 2)) == 5
        consumer.seek(("t", 2), 1)
        got = consumer.poll(1000, max_records=2)
        assert [r.offset for r in got] == [1, 2]
        got = consumer.poll(1000)
        assert [r.offset for r in got] == [3, 4]


def test_callbacks_may_send_and_flush_waits_for_every_future(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        chained = []

        def resend(fut):
            # Runs on a client thread: sending from a callback must not deadlock.
            chained.append(producer.send("t", b"second", partition=0))

        producer.send("t", b"first", partition=0).add_done_callback(resend)
        futs = [producer.send("t", b"x", partition=1) for _ in range(50)]
        producer.flush(5)
        assert all(f.done() for f in futs)
        producer.flush(5)
        assert chained and chained[0].result(5).offset == 1


def test_queued_batches_of_a_partition_share_one_request_with_contiguous_offsets(fake_cluster):
    state, bootstrap = fake_cluster
    # Tiny batches and a slow broker: batches queue up behind each request in flight.
    state.produce_delay_s = 0.05
    with Producer(bootstrap, acks=1, linger_ms=0, batch_size_bytes=200) as producer:
        futs = []
        for i in range(300):
            futs.append(producer.send("t", f"{i:04d}".encode() * 10, partition=0))
            if i % 30 == 0:
                time.sleep(0.01)
        producer.flush(10)
    assert [f.result().offset for f in futs] == list(range(300))
    assert len(state.logs[0]) > 10  # many batches ...
    assert state.produce_requests < len(state.logs[0])  # ... in fewer requests
    records = consume_all(bootstrap, 300, partitions=(0,))
    assert [r.value for r in records] == [f"{i:04d}".encode() * 10 for i in range(300)]


def test_records_queued_behind_a_request_go_from_the_answering_thread(fake_cluster):
    """The answer to a request sends what queued behind it: the sender thread is not
    woken per record (nor per answer) to do it."""
    state, bootstrap = fake_cluster
    state.produce_delay_s = 0.02
    senders: list[str] = []
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        send_ready = producer._send_ready

        def recording_send_ready(ready, **kwargs):
            senders.append(threading.current_thread().name)
            send_ready(ready, **kwargs)

        producer._send_ready = recording_send_ready
        ready = producer._accumulator.ready
        sender_rounds = []

        def counting_ready(*args, **kwargs):  # called once per wake of the sender thread
            sender_rounds.append(1)
            return ready(*args, **kwargs)

        producer._accumulator.ready = counting_ready
        futs = []
        for i in range(200):
            futs.append(producer.send("t", f"{i}".encode(), partition=0))
            time.sleep(0.001)
        producer.flush(10)
    assert [f.result().offset for f in futs] == list(range(200))
    # A _send_ready that lost the race for the partition sends nothing: >=, not ==.
    assert state.produce_requests >= 10 and len(senders) >= state.produce_requests
    # The sender thread's timed wake-up (every 200 ms) may rarely win the race for one.
    assert senders.count("tide-producer-sender") <= 2, senders
    # ... and it was not woken per record while the partition's request was out (200
    # sends over ~0.3 s: its timed wake-ups and a few flush/close rounds).
    assert len(sender_rounds) < 30, len(sender_rounds)


def test_consumer_ignores_a_partial_tail_and_rejects_a_corrupt_batch(fake_cluster):
    from tidewater.client.consumer import Consumer as C
    from tidewater.client.metadata import TopicPartition
    from tidewater.proto.errors import CorruptRecordError
    from tidewater.proto.records import encode_batch

    first = encode_batch([(None, b"a"), (None, b"b")], base_offset=0)
    second = encode_batch([(None, b"c")], base_offset=2)
    c = C("127.0.0.1:1")
    tp = TopicPartition("t", 0)
    c.assign([tp])
    c.seek(tp, 1)
    got = c._decode(tp, first + second[:20])
    assert [(r.offset, r.value) for r in got] == [(1, b"b")]
    assert c._positions[tp] == 2  # the partial batch is fetched again next time
    bad = bytearray(second)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        c._decode(tp, bytes(bad))
    c.close()


def test_delivery_timeout_names_the_last_error(fake_cluster):
    from tidewater.proto.errors import RequestTimedOutError

    state, bootstrap = fake_cluster
    state.produce_errors = [pb.NOT_ENOUGH_REPLICAS] * 1000
    with Producer(bootstrap, linger_ms=0, retry_backoff_ms=20, delivery_timeout_ms=300) as producer:
        fut = producer.send("t", b"x", partition=0)
        with pytest.raises(RequestTimedOutError) as info:
            fut.result(5)
    assert "NOT_ENOUGH_REPLICAS" in str(info.value)
    assert state.logs[0] == []


def test_failed_batches_are_counted_without_any_callback(fake_cluster):
    """records_failed (Kafka's record-error-total) counts a failed batch's records, and the
    first error stays: what `tide produce` reports without callbacks per record."""
    state, bootstrap = fake_cluster
    with Producer(bootstrap, linger_ms=50, retries=0) as producer:
        state.produce_errors = [pb.INVALID_TOPIC_EXCEPTION]
        futures = [producer.send("t", b"x", partition=1) for _ in range(3)]
        producer.flush(5)
        assert producer.records_failed == 3
        assert isinstance(producer.first_record_error, InvalidTopicError)
        producer.send("t", b"ok", partition=1).result(5)
        assert producer.records_failed == 3
    assert all(isinstance(f.exception(), InvalidTopicError) for f in futures)


@pytest.mark.parametrize("in_flight", [1, 4])
def test_max_in_flight_per_partition_bounds_the_requests_out_at_once(fake_cluster, in_flight):
    state, bootstrap = fake_cluster
    state.produce_delay_s = 0.1  # a slow acks=all round trip
    with Producer(bootstrap, acks="all", linger_ms=0, batch_size_bytes=300, request_bytes_max=700,
                  max_in_flight_per_partition=in_flight) as producer:
        futs = [(f"{i:04d}".encode() * 20, producer.send("t", f"{i:04d}".encode() * 20,
                                                          partition=0)) for i in range(120)]
        producer.flush(20)
    assert (state.produce_calls_max == 1 if in_flight == 1
            else 1 < state.produce_calls_max <= in_flight)
    # Every record landed once, at the offset its future names (requests that were out at
    # the same time may be appended in either order).
    stored = {r.offset: r.value for r in consume_all(bootstrap, 120, partitions=(0,))}
    assert sorted(stored) == list(range(120))
    assert {f.result().offset: value for value, f in futs} == stored


def test_max_in_flight_per_partition_must_be_positive(fake_cluster):
    _state, bootstrap = fake_cluster
    with pytest.raises(ValueError):
        Producer(bootstrap, max_in_flight_per_partition=0)


def test_consumer_prefetches_the_next_chunk_and_drops_it_after_a_seek(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        for i in range(5):  # five batches; each fetch below returns one
            producer.send("t", f"{i}".encode(), partition=1).result(5)
        with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                      max_partition_fetch_bytes=1) as consumer:
            consumer.assign([("t", 1)])
            assert [r.offset for r in consumer.poll(2000)] == [0]
            # The high watermark (5) lies beyond the chunk: the next fetch (from offset 1,
            # no long-poll) went out before poll returned.
            deadline = time.monotonic() + 5
            while 0 not in state.fetch_waits_ms and time.monotonic() < deadline:
                time.sleep(0.01)
            assert 0 in state.fetch_waits_ms
            got = []
            for _ in range(20):
                got += consumer.poll(200)
                if len(got) >= 2:
                    break
            assert [r.offset for r in got] == [1, 2]
            # A seek leaves the prefetched answer (from offset 3) unused.
            consumer.seek(("t", 1), 1)
            got = []
            for _ in range(20):
                got += consumer.poll(200)
                if len(got) >= 4:
                    break
            assert [(r.offset, r.value) for r in got] == [(i, f"{i}".encode()) for i in range(1, 5)]


def test_caught_up_consumer_prefetches_a_long_poll(fake_cluster):
    state, bootstrap = fake_cluster
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        for i in range(5):
            producer.send("t", f"{i}".encode(), partition=1).result(5)
        with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
            consumer.assign([("t", 1)])
            assert [r.offset for r in consumer.poll(2000)] == [0, 1, 2, 3, 4]
            # Everything up to the high watermark came: the next fetch is out already, as
            # a long-poll from the new position.
            assert consumer._prefetched is not None
            deadline = time.monotonic() + 5
            while state.fetch_offsets[-1] != 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert (state.fetch_offsets[-1], state.fetch_waits_ms[-1]) == (5, 200)
            for i in range(5, 8):
                producer.send("t", f"{i}".encode(), partition=1).result(5)
            got = []
            for _ in range(20):
                got += consumer.poll(200)
                if len(got) >= 3:
                    break
            assert [r.offset for r in got] == [5, 6, 7]
            assert 0 not in state.fetch_waits_ms  # every fetch was a long-poll
