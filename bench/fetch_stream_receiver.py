"""A latency receiver with no thread hand-off: one asyncio loop reads the partition's
FetchStream itself (long-polls, one in flight) and stamps each record as it arrives.

For the latency rows only, as the measure of what ``client.consumer.Consumer``'s
hand-offs cost: the Consumer's answers arrive on the ``tide-client-io`` loop thread
and wake the polling thread (a latch and a GIL exchange per answer); here the
answer is decoded on the loop that read it. The start position comes from a
Consumer (ListOffsets at the end, as ``auto_offset_reset="latest"``); fetches use
the Consumer's request fields; batches are checked (CRC) and decoded as the
Consumer does (``proto.batch.validate_batch``, ``proto.records.decode_consumer_records``).
No retries: a leader change or an error ends the run (the bench's cluster is steady).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import TopicPartition
from tidewater.client.streams import CallerLoop, StreamPool
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import HEADER_SIZE, peek_batch_size, read_header, validate_batch
from tidewater.proto.errors import TidewaterError, error_for_code
from tidewater.proto.records import ConsumerRecord, decode_consumer_records

FETCH_MAX_WAIT_MS = 100  # the threaded receiver's fetch_max_wait_ms
PARTITION_FETCH_BYTES_MAX = 1024 * 1024


def start_position(bootstrap: str, tp: TopicPartition) -> int:
    """The partition's end, as a Consumer with auto_offset_reset="latest" starts."""
    consumer = Consumer(bootstrap, auto_offset_reset="latest")
    try:
        consumer.assign([tp])
        return consumer.position(tp)
    finally:
        consumer.close()


def records_after(data: bytes, tp: TopicPartition, position: int) -> tuple[list[ConsumerRecord], int]:
    """The records of ``data`` at or after ``position``, and the position after them."""
    out: list[ConsumerRecord] = []
    pos = 0
    while True:
        size = peek_batch_size(data, pos)
        if size is None or size < HEADER_SIZE or pos + size > len(data):
            return out, position
        start, pos = pos, pos + size
        if read_header(data, start).next_offset <= position:
            continue
        header = validate_batch(data, start)
        if not header.is_control:
            out += [r for r in decode_consumer_records(data, start, header, tp.topic, tp.partition)
                    if r.offset >= position]
        position = max(position, header.next_offset)


async def receive(bootstrap: str, topic: str, position: int, expected: int, timeout_s: float,
                  on_record: Callable[[ConsumerRecord], None]) -> int:
    """Fetch ``topic``-0 from ``position`` until ``expected`` records or ``timeout_s``;
    ``on_record`` for each on arrival. Returns the records received."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer(bootstrap)  # its metadata client and its fetch request's fields
    streams: StreamPool[pb.FetchRequest, pb.FetchResponse] = StreamPool(
        "FetchStream", ordered=True, io=CallerLoop())
    loop = asyncio.get_running_loop()
    received = 0
    try:
        leader = await asyncio.to_thread(consumer.metadata.leader_for, tp)
        if leader is None:
            raise RuntimeError(f"{topic}-0 has no leader")
        deadline = time.monotonic() + timeout_s
        while received < expected and time.monotonic() < deadline:
            request = pb.FetchRequest(
                replica_id=-1, replica_broker_epoch=-1, max_wait_ms=FETCH_MAX_WAIT_MS, min_bytes=1,
                max_bytes=consumer.fetch_max_bytes, partitions=[pb.FetchPartition(
                    topic=topic, partition=0, current_leader_epoch=leader.leader_epoch,
                    fetch_offset=position, last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=PARTITION_FETCH_BYTES_MAX)])
            answer: asyncio.Future[pb.FetchResponse] = loop.create_future()

            def on_answer(response: pb.FetchResponse | None, error: TidewaterError | None,
                          answer: asyncio.Future[pb.FetchResponse] = answer) -> None:
                # Called on this loop's thread: the stream's reader task.
                if not answer.done():
                    if error is not None:
                        answer.set_exception(error)
                    else:
                        assert response is not None
                        answer.set_result(response)

            stream = streams.stream(leader.address)
            if stream is None or not stream.send(request, on_answer, FETCH_MAX_WAIT_MS / 1000 + 30):
                raise RuntimeError("no FetchStream to the leader")
            response = await answer
            if response.error_code != pb.NONE:
                raise error_for_code(response.error_code)
            for p in response.partitions:
                if p.error_code != pb.NONE:
                    raise error_for_code(p.error_code)
                records, position = records_after(p.records, tp, position)
                for record in records:
                    on_record(record)
                received += len(records)
    finally:
        await streams.aclose()
        await asyncio.to_thread(consumer.close)
    return received
