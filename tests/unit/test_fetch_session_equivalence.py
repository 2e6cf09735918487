"""A follower within a fetch session sees what a sessionless follower sees.

Two leaders, each a real ``ReplicaManager`` over in-memory logs, take the same writes,
leader epoch bumps and DeleteRecords; followers 2 and 3 fetch from both in the same
order: from one within a ReplicaFetch session (``ReplicaFetchSession``: incremental
requests, answers leaving out what has nothing new, passes that read only what changed),
from the other sessionless (every partition named and answered). After every fetch, each
follower's view of every partition (fetch offset, leader epoch, HW, log start, records)
must be the same through both, and so must each leader's HW. The refresh that records a
settled partition's fetch time comes on every pass, or almost never.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_broker_fakes import FakeLog, make_batch
from tests.unit.test_broker_replica_manager import TP, make_manager, produce
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.serving.fetch import record_count
from tidewater.broker.serving.replica_fetch_session import ReplicaFetchSession
from tidewater.broker.serving.replica_fetch_wire import (
    decode_fetch_response,
    encode_fetch_response,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import HEADER_SIZE, LOG_OVERHEAD

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3
FOLLOWERS = (2, 3)
TOPIC_ID = bytes(range(1, 17))


def leader_and_isr(epochs: list[int]) -> pb.LeaderAndIsrRequest:
    return pb.LeaderAndIsrRequest(
        controller_id=0, controller_epoch=1, broker_epoch=7, cluster_id="c",
        partitions=[pb.LeaderAndIsrPartition(
            state=pb.PartitionState(topic=TP.topic, partition=p, leader=1,
                                    leader_epoch=epoch, partition_epoch=epoch,
                                    replicas=[1, 2, 3], isr=[1, 2, 3], topic_id=TOPIC_ID),
            is_new=epoch == 0) for p, epoch in enumerate(epochs)])


class FollowerView:
    """What one follower knows of each partition from one leader's answers."""

    def __init__(self, replica_id: int, session: ReplicaFetchSession | None) -> None:
        self.replica_id = replica_id
        self.session = session
        self.fetch_offset = [0] * PARTITIONS
        self.leader_epoch = [0] * PARTITIONS
        self.high_watermark = [0] * PARTITIONS
        self.log_start_offset = [0] * PARTITIONS
        self.records: list[list[tuple[int, int]]] = [[] for _ in range(PARTITIONS)]
        self._asked: list[tuple[int, int, int] | None] = [None] * PARTITIONS
        self._held = False

    def request(self, max_wait_ms: int = 0) -> pb.FetchRequest:
        asks = [(self.leader_epoch[p], self.fetch_offset[p], self.log_start_offset[p])
                for p in range(PARTITIONS)]
        mode = pb.SESSIONLESS
        named = range(PARTITIONS)
        if self.session is not None:
            mode = pb.SESSION_INCREMENTAL if self._held else pb.SESSION_FULL
            if self._held:
                named = [p for p in range(PARTITIONS) if asks[p] != self._asked[p]]
            self._asked = list(asks)
        return pb.FetchRequest(
            replica_id=self.replica_id, replica_broker_epoch=7, max_wait_ms=max_wait_ms,
            min_bytes=1,
            session_mode=mode, partitions=[
                pb.FetchPartition(topic=TP.topic, partition=p, current_leader_epoch=asks[p][0],
                                  fetch_offset=asks[p][1], last_fetched_epoch=-1,
                                  partition_max_bytes=1 << 20, log_start_offset=asks[p][2])
                for p in named])

    async def fetch(self, leader: ReplicaManager, epochs: list[int],
                    max_wait_ms: int = 0) -> None:
        request = self.request(max_wait_ms)
        session = self.session
        if session is not None and session.take(request):
            results = await leader.fetch_partitions(request, session)
            wire = encode_fetch_response(session.answer(results), session_held=True)
        else:
            wire = encode_fetch_response(await leader.fetch_partitions(request))
        answer = decode_fetch_response(wire)
        assert answer.error_code == pb.NONE
        self._held = answer.session_held
        for fetched in answer.partitions:
            p = fetched.partition
            if fetched.error_code != pb.NONE:
                # Fenced or unknown epoch: the controller's LeaderAndIsr tells the new one.
                assert fetched.error_code in (pb.FENCED_LEADER_EPOCH, pb.UNKNOWN_LEADER_EPOCH)
                self.leader_epoch[p] = epochs[p]
                continue
            records = bytes(fetched.records)
            if records:
                # (base offset, records) per batch: the leaders' append times differ.
                self.records[p].extend(batches_of(records))
                self.fetch_offset[p] += record_count(records)
            self.high_watermark[p] = fetched.high_watermark
            self.log_start_offset[p] = max(self.log_start_offset[p], fetched.log_start_offset)
            self.fetch_offset[p] = max(self.fetch_offset[p], self.log_start_offset[p])

    def view(self) -> tuple:
        return (self.fetch_offset, self.leader_epoch, self.high_watermark,
                self.log_start_offset, self.records)


def batches_of(records: bytes) -> list[tuple[int, int]]:
    out = []
    position = 0
    while position < len(records):
        base_offset, batch_length = struct.unpack_from(">qi", records, position)
        out.append((base_offset, struct.unpack_from(">i", records, position + HEADER_SIZE - 4)[0]))
        position += LOG_OVERHEAD + batch_length
    return out


def make_leader(directory: Path, lag_ms: str) -> ReplicaManager:
    leader, _ = make_manager(directory, **{"replica.lag.time.max.ms": lag_ms})
    for p in range(PARTITIONS):
        tp = TopicPartition(TP.topic, p)
        leader.log_manager._logs[tp] = FakeLog(tp, LogConfig())
    return leader


steps = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.integers(0, PARTITIONS - 1), st.integers(1, 3)),
    st.tuples(st.just("fetch"), st.sampled_from(FOLLOWERS), st.just(0)),
    st.tuples(st.just("fetch"), st.sampled_from(FOLLOWERS), st.just(0)),
    st.tuples(st.just("poll"), st.sampled_from(FOLLOWERS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("epoch"), st.integers(0, PARTITIONS - 1), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, PARTITIONS - 1), st.integers(0, 3)),
    st.tuples(st.just("idle"), st.just(0), st.integers(1, 3)),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps=steps, lag_ms=st.sampled_from(["4", "600000"]))
def test_a_session_follower_sees_what_a_sessionless_one_sees(steps, lag_ms):
    asyncio.run(_run(steps, lag_ms))


async def _run(steps: list[tuple[str, int, int]], lag_ms: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        with_session = make_leader(Path(directory) / "a", lag_ms)
        sessionless = make_leader(Path(directory) / "b", lag_ms)
        leaders = (with_session, sessionless)
        epochs = [0] * PARTITIONS
        for leader in leaders:
            await leader.leader_and_isr(leader_and_isr(epochs))
        views = {
            replica_id: (FollowerView(replica_id, with_session.replica_fetch_session()),
                         FollowerView(replica_id, None))
            for replica_id in FOLLOWERS}
        for kind, number, amount in steps:
            if kind == "produce":
                for leader in leaders:
                    answer = await leader.produce(produce(
                        acks=1, partition=number, records=make_batch(amount)))
                    assert answer.partitions[0].error_code == pb.NONE
            elif kind == "fetch":
                ours, theirs = views[number]
                await ours.fetch(with_session, epochs)
                await theirs.fetch(sessionless, epochs)
                assert ours.view() == theirs.view()
            elif kind == "poll":
                # A long-poll on each leader, then a record for partition ``amount``: a
                # parked fetch wakes and reads again (a pass that is not its first).
                ours, theirs = views[number]
                polls = [asyncio.ensure_future(ours.fetch(with_session, epochs, 5000)),
                         asyncio.ensure_future(theirs.fetch(sessionless, epochs, 5000))]
                await asyncio.sleep(0.001)
                for leader in leaders:
                    await leader.produce(produce(acks=1, partition=amount))
                await asyncio.gather(*polls)
                assert ours.view() == theirs.view()
            elif kind == "epoch":
                epochs[number] += 1
                for leader in leaders:
                    await leader.leader_and_isr(leader_and_isr(epochs))
            elif kind == "delete":
                tp = TopicPartition(TP.topic, number)
                high_watermark = with_session.partitions[tp].replica.high_watermark
                assert high_watermark == sessionless.partitions[tp].replica.high_watermark
                offset = min(amount, high_watermark)
                for leader in leaders:
                    # Answered when the followers' log starts reach it, or at once: a
                    # 0 ms wait (both leaders move their log start alike either way).
                    await leader.delete_records([(TP.topic, number, offset)], 0)
            else:
                await asyncio.sleep(amount / 1000)  # a refresh may come due
            for p in range(PARTITIONS):
                tp = TopicPartition(TP.topic, p)
                assert (with_session.partitions[tp].replica.high_watermark
                        == sessionless.partitions[tp].replica.high_watermark)
        for ours, _ in views.values():
            assert ours.session is not None
            ours.session.close()
        assert not with_session.fetch_waiters._listeners_by_key
        for leader in leaders:
            await leader.stop()
