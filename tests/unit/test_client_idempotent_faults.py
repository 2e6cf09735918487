"""The Python producers' idempotence against fake brokers that keep producer state with
the broker's own rules (``ProducerStateManager``) and lose requests or answers on cue:
with 5 requests in flight, every record is written once, in send order, and told the
offset it was written at."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit.test_client_fake_cluster import FakeBroker, serve_fake_cluster
from tidewater.broker.storage.producer_state import ProducerBatch, ProducerStateManager
from tidewater.client.aio_producer import AsyncProducer
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches, set_base_offset_and_epoch
from tidewater.proto.errors import TidewaterError
from tidewater.proto.records import decode_records

pytestmark = pytest.mark.timeout(60)
RECORDS = 400


class IdempotentFakeBroker(FakeBroker):
    """Appends as the broker does for idempotent batches. Cues on the state:
    ``refuse_from``: the first request whose first sequence reaches each value is
    refused (NOT_LEADER_OR_FOLLOWER, nothing written); ``lose_from``: likewise appended
    but answered REQUEST_TIMED_OUT (the answer is lost); ``lost_answer_late_s``: the
    lost answers come that much later than the others (answers out of order)."""

    def _wait_before_answer(self, response: pb.ProduceResponse | None = None) -> None:
        super()._wait_before_answer(response)
        if response is not None and any(p.error_code == pb.REQUEST_TIMED_OUT
                                         for p in response.partitions):
            time.sleep(self.state.lost_answer_late_s)

    def _append_partition(self, part, acks: int) -> pb.ProducePartitionResponse:
        s, p = self.state, part.partition
        data = bytearray(part.records)
        headers = list(iter_batches(data))
        first = headers[0][1].base_sequence
        answer = pb.ProducePartitionResponse(topic=part.topic, partition=p, error_code=pb.NONE,
                                             base_offset=-1)
        if _cue(s.refuse_from, first):
            answer.error_code = pb.NOT_LEADER_OR_FOLLOWER
            return answer
        answer.batch_bytes_max = s.batch_bytes_max
        if s.batch_bytes_max and max(h.size for _, h in headers) > s.batch_bytes_max:
            answer.error_code = pb.MESSAGE_TOO_LARGE
            return answer
        state = s.producer_states.setdefault(p, ProducerStateManager())
        try:
            duplicate = state.check_leader_append([ProducerBatch(
                h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta)
                for _, h in headers])
        except TidewaterError as e:
            answer.error_code = e.error_code
            return answer
        if duplicate is not None:
            s.duplicates_answered += 1
            answer.base_offset = duplicate.first_offset
            return answer
        answer.base_offset = offset = s.leo(p)
        for position, h in headers:
            set_base_offset_and_epoch(data, position, offset, s.epochs[p])
            s.logs[p].append((offset, bytes(data[position:position + h.size])))
            state.on_batch(h.producer_id, h.producer_epoch, h.base_sequence, offset,
                           offset + h.last_offset_delta, h.max_timestamp)
            offset += h.last_offset_delta + 1
        if _cue(s.lose_from, first):
            answer.error_code, answer.base_offset = pb.REQUEST_TIMED_OUT, -1
        return answer


def _cue(thresholds: list[int], sequence: int) -> bool:
    for i, threshold in enumerate(thresholds):
        if sequence >= threshold:
            del thresholds[i]
            return True
    return False


@pytest.fixture
def faulty_cluster():
    for state, bootstrap in serve_fake_cluster(IdempotentFakeBroker):
        state.producer_states = {}
        state.duplicates_answered = 0
        state.refuse_from = [60, 200]
        state.lose_from = [120, 300]
        state.produce_delay_s = 0.01  # several requests in flight at once
        state.lost_answer_late_s = 0.0
        state.batch_bytes_max = 0  # told in each answer: 0, no growth
        yield state, bootstrap


def written(state) -> list[tuple[int, int]]:
    return [(r.offset, int(r.value)) for _, data in state.logs[0] for r in decode_records(data)]


def check(state, offsets: list[int]) -> None:
    log = written(state)
    assert [v for _, v in log] == list(range(RECORDS))  # once each, in send order
    assert offsets == [o for o, _ in log]  # each told the offset it is at
    assert not state.refuse_from and not state.lose_from  # every fault happened
    assert state.duplicates_answered >= 2  # the lost answers' retries were deduplicated


def grown_batches(state, batch_bytes_max: int) -> None:
    """With a leader's ``batch_bytes_max`` told, a backlogged partition's batches grew past
    batch_size_bytes (256), and none past what the leader takes."""
    sizes = [len(data) for _, data in state.logs[0]]
    if batch_bytes_max:
        assert 256 < max(sizes) <= batch_bytes_max, sizes
    else:
        assert max(sizes) <= 256, sizes


# 2048: the leader tells the largest batch it takes, and backlogged batches grow to it.
@pytest.mark.parametrize("batch_bytes_max", [0, 2048])
def test_threaded_producer_keeps_order_and_writes_once_through_lost_requests_and_answers(
        faulty_cluster, batch_bytes_max):
    state, bootstrap = faulty_cluster
    state.batch_bytes_max = batch_bytes_max
    with Producer(bootstrap, max_in_flight_per_partition=5, linger_ms=0, batch_size_bytes=256,
                  retry_backoff_ms=5) as producer:
        assert producer.enable_idempotence
        futures = [producer.send("t", b"0", partition=0)]
        producer.flush(30)  # a first answer: the leader's batch_bytes_max is known
        futures += [producer.send("t", b"%d" % i, partition=0) for i in range(1, RECORDS)]
        producer.flush(30)
        offsets = [f.result(5).offset for f in futures]
    check(state, offsets)
    grown_batches(state, batch_bytes_max)


@pytest.mark.parametrize("batch_bytes_max", [0, 2048])
def test_asyncio_producer_keeps_order_and_writes_once_through_lost_requests_and_answers(
        faulty_cluster, batch_bytes_max):
    state, bootstrap = faulty_cluster
    state.batch_bytes_max = batch_bytes_max

    async def run() -> list[int]:
        async with AsyncProducer(bootstrap, max_in_flight_per_partition=5, linger_ms=0,
                                 batch_size_bytes=256, retry_backoff_ms=5) as producer:
            assert producer.enable_idempotence
            futures = [await producer.send("t", b"0", partition=0)]
            await producer.flush(30)  # a first answer: the leader's batch_bytes_max is known
            futures += [await producer.send("t", b"%d" % i, partition=0)
                        for i in range(1, RECORDS)]
            await producer.flush(30)
            return [(await f).offset for f in futures]

    check(state, asyncio.run(run()))
    grown_batches(state, batch_bytes_max)


@pytest.mark.parametrize("producer_kind", ["threaded", "asyncio"])
def test_a_late_lost_answer_is_retried_within_the_five_batches_the_broker_remembers(
        faulty_cluster, producer_kind):
    """The lost answers come after the answers of the requests sent behind them: the batches
    after a lost one are acked first, and without a window counted from the oldest unacked
    batch the producer sent more behind them, so the retry fell out of the broker's five
    and was refused (OUT_OF_ORDER_SEQUENCE_NUMBER) until the delivery timeout."""
    state, bootstrap = faulty_cluster
    state.refuse_from = []
    state.lost_answer_late_s = 0.2
    settings = dict(max_in_flight_per_partition=5, linger_ms=0, batch_size_bytes=256,
                    retry_backoff_ms=5, delivery_timeout_ms=20000)
    if producer_kind == "threaded":
        with Producer(bootstrap, **settings) as producer:
            futures = [producer.send("t", b"%d" % i, partition=0) for i in range(RECORDS)]
            producer.flush(15)
            offsets = [f.result(5).offset for f in futures]
    else:
        async def run() -> list[int]:
            async with AsyncProducer(bootstrap, **settings) as producer:
                futures = [await producer.send("t", b"%d" % i, partition=0)
                           for i in range(RECORDS)]
                await producer.flush(15)
                return [(await f).offset for f in futures]
        offsets = asyncio.run(run())
    check(state, offsets)
