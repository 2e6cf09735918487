"""ProduceStream and FetchStream against real broker processes, driven with raw gRPC."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from tests.integration.conftest import consume_all, wait_for
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.records import decode_records, encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RECORDS_PER_REQUEST = 3


def produce_request(correlation_id: int, topic: str, *, acks: int = -1, partition: int = 0,
                    records: bytes | None = None) -> pb.ProduceRequest:
    if records is None:
        records = encode_batch([(None, f"r{correlation_id}-{i}".encode())
                                for i in range(RECORDS_PER_REQUEST)])
    return pb.ProduceRequest(acks=acks, timeout_ms=10_000, correlation_id=correlation_id,
                             partitions=[pb.ProducePartitionData(topic=topic, partition=partition,
                                                                 records=records)])


def test_produce_stream_appends_in_arrival_order_and_answers_each_request(cluster):
    c = cluster(3)
    c.create_topic("ps", replication_factor=3)
    leader = c.wait_leader_ready("ps")
    requests = [produce_request(i, "ps") for i in range(1, 21)]
    # Requests that fail answer with their error and leave the stream usable; acks=0 is
    # appended but never answered.
    bad = [produce_request(100, "ps", acks=7), produce_request(101, "no-such-topic"),
           produce_request(102, "ps", records=b"")]
    silent = produce_request(200, "ps", acks=0)
    last = produce_request(300, "ps")
    # All sent before any answer is read: many in flight on the stream at once.
    responses = list(leader.stub.ProduceStream(iter(requests + bad + [silent, last]), timeout=60))
    by_id = {r.correlation_id: r for r in responses}
    assert sorted(by_id) == [*range(1, 21), 100, 101, 102, 300]
    for i, request in enumerate(requests):
        p = by_id[request.correlation_id].partitions[0]
        assert (p.topic, p.partition, p.error_code) == ("ps", 0, pb.NONE)
        assert p.base_offset == i * RECORDS_PER_REQUEST  # arrival order
    assert by_id[100].partitions[0].error_code == pb.INVALID_REQUIRED_ACKS
    assert by_id[101].partitions[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert by_id[102].partitions[0].error_code == pb.CORRUPT_MESSAGE
    assert all(by_id[i].partitions[0].base_offset == -1 for i in (100, 101, 102))
    # The acks=0 request came before the last one on the stream, so it was appended first.
    assert by_id[300].partitions[0].base_offset == 21 * RECORDS_PER_REQUEST
    values = [v for _, v in consume_all(leader, "ps")]
    expected = [f"r{i}-{j}".encode() for i in [*range(1, 21), 200, 300]
                for j in range(RECORDS_PER_REQUEST)]
    assert values == expected


def test_fetch_stream_answers_each_request_in_order_and_long_polls(cluster):
    c = cluster(2)
    c.create_topic("fs", replication_factor=2)
    leader = c.wait_leader_ready("fs")
    outbox: queue.Queue = queue.Queue()

    def requests():
        while (request := outbox.get()) is not None:
            yield request

    def fetch_request(offset: int, max_wait_ms: int = 0, topic: str = "fs") -> pb.FetchRequest:
        return pb.FetchRequest(replica_id=-1, replica_broker_epoch=-1, max_wait_ms=max_wait_ms,
                               min_bytes=1, max_bytes=1 << 20, partitions=[pb.FetchPartition(
                                   topic=topic, partition=0, current_leader_epoch=-1,
                                   fetch_offset=offset, partition_max_bytes=1 << 20)])

    answers = leader.stub.FetchStream(requests(), timeout=60)
    try:
        outbox.put(fetch_request(0))
        first = next(answers).partitions[0]
        assert first.error_code == pb.NONE and first.records == b"" and first.high_watermark == 0
        outbox.put(fetch_request(0, topic="no-such-topic"))
        assert next(answers).partitions[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
        # A long-poll on the stream is answered by the commit of the next write.
        outbox.put(fetch_request(0, max_wait_ms=30_000))
        written = threading.Event()

        def write() -> None:
            wait_for(lambda: leader.stub.Produce(produce_request(1, "fs"), timeout=10)
                     .partitions[0].error_code == pb.NONE, message="produce")
            written.set()

        writer = threading.Thread(target=write)
        writer.start()
        polled = next(answers).partitions[0]
        writer.join()
        assert written.is_set()
        assert [r.value for r in decode_records(polled.records)] == \
            [f"r1-{j}".encode() for j in range(RECORDS_PER_REQUEST)]
        outbox.put(fetch_request(RECORDS_PER_REQUEST))
        assert next(answers).partitions[0].records == b""
    finally:
        outbox.put(None)
    assert list(answers) == []  # half-closed: the broker ends the stream with OK
    assert answers.code() == grpc.StatusCode.OK


def test_streams_end_with_ok_when_the_broker_shuts_down(cluster):
    c = cluster(1)
    c.create_topic("sd", replication_factor=1)
    leader = c.wait_leader_ready("sd")
    outbox: queue.Queue = queue.Queue()

    def requests():
        while (request := outbox.get()) is not None:
            yield request

    answers = leader.stub.ProduceStream(requests(), timeout=120)
    try:
        outbox.put(produce_request(1, "sd"))
        assert next(answers).partitions[0].error_code == pb.NONE
        # The stream now waits for the client's next request; SIGTERM must end it.
        leader.proc.terminate()
        assert list(answers) == []
        assert answers.code() == grpc.StatusCode.OK
    finally:
        outbox.put(None)
