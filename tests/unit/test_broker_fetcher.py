"""Follower fetchers: truncation by OffsetForLeaderEpoch over real gRPC, stale answers dropped."""

from __future__ import annotations

import asyncio

from tests.unit.test_broker_fakes import FakeLog, make_batch
from tests.unit.test_broker_replica_manager import TP, lai, make_manager, serve
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replication.replica import FollowerPhase, ReplicaState
from tidewater.broker.storage.log_config import LogConfig
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import set_base_offset_and_epoch


def seeded_log(epochs_and_counts) -> FakeLog:
    log = FakeLog(TP, LogConfig())
    for epoch, count in epochs_and_counts:
        for _ in range(count):
            log.append_as_leader(make_batch(1, timestamp_ms=1000), epoch, 0)
    return log


async def wait_until(predicate, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_follower_truncates_to_the_largest_common_epoch_then_fetches(tmp_path):
    # replication.md worked example: leader (0,0),(2,5) LEO 8; follower (0,0),(1,3) LEO 6.
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = seeded_log([(0, 5), (2, 3)])
    follower_rm, _ = make_manager(tmp_path / "f", broker_id=2)
    follower_rm.log_manager._logs[TP] = seeded_log([(0, 3), (1, 3)])
    server, port = await serve(leader_rm)
    try:
        await leader_rm.leader_and_isr(lai(leader=1, leader_epoch=3, isr=(1,)))
        request = lai(leader=1, leader_epoch=3, isr=(1,))
        request.leaders[0].broker_id, request.leaders[0].port = 1, port
        follower_log = follower_rm.log_manager.get(TP)
        resp = await follower_rm.leader_and_isr(request)
        assert resp.partitions[0].error_code == pb.NONE
        await wait_until(lambda: follower_log.log_end_offset == 8)
        # Truncated to 3 (end of epoch 0 on the follower), then fetched 3..8 from the leader.
        assert follower_log.leader_epoch_cache.entries() == [(0, 0), (2, 5)]
        leader_log = leader_rm.log_manager.get(TP)
        assert [b[2] for b in follower_log.batches] == [b[2] for b in leader_log.batches]
        await wait_until(lambda: follower_rm.partitions[TP].high_watermark == 8)
    finally:
        await follower_rm.stop()
        await server.stop(0)


class OneAnswerCall:
    """A ReplicaFetch call answering its one request with one record at ``leader_epoch``;
    with ``bump``, the manager applies a newer LeaderAndIsr first (the answer was in
    flight when the leader epoch changed)."""

    def __init__(self, rm, record: bytes, leader_epoch: int, bump: bool):
        self.rm, self.record, self.leader_epoch, self.bump = rm, record, leader_epoch, bump
        self.request: pb.FetchRequest | None = None

    async def write(self, request: pb.FetchRequest) -> None:
        self.request = request

    async def read(self) -> bytes:
        if self.bump:
            resp = await self.rm.leader_and_isr(lai(leader=1, leader_epoch=1, partition_epoch=1))
            assert resp.partitions[0].error_code == pb.NONE
        p = self.request.partitions[0]
        return pb.FetchResponse(error_code=pb.NONE, partitions=[pb.FetchPartitionResponse(
            topic=p.topic, partition=p.partition, error_code=pb.NONE, high_watermark=1,
            log_start_offset=0, log_end_offset=1, leader_epoch=self.leader_epoch,
            records=self.record)]).SerializeToString()  # as the stream reads it

    def cancel(self) -> bool:  # the changed assignment drops the stream: the answer is read
        return True


class OneAnswerStub:
    def __init__(self, call: OneAnswerCall):
        self.call = call

    def ReplicaFetch(self, metadata=None):  # the generated stub's name
        return self.call


async def fetch_round(fetcher, stub, partition) -> None:
    """One stream round driven by hand (the fetcher's own task is stopped)."""
    fetcher.task.cancel()
    await asyncio.gather(fetcher.task, return_exceptions=True)
    partition.replica.follower.phase = FollowerPhase.FETCHING  # as if truncation was done
    fetcher._changed.clear()
    await fetcher._fetch_round(stub, [partition])


async def test_fetch_answer_dropped_when_leader_epoch_changed_in_flight(tmp_path):
    rm, _ = make_manager(tmp_path, broker_id=2)
    record = bytearray(make_batch(1))
    set_base_offset_and_epoch(record, 0, 0, 0)
    await rm.leader_and_isr(lai(leader=1, leader_epoch=0))
    try:
        fetcher = rm.fetchers.fetchers[1]
        await fetch_round(fetcher, OneAnswerStub(OneAnswerCall(rm, bytes(record), 0, bump=True)),
                          rm.partitions[TP])
        assert rm.partitions[TP].leader_epoch == 1
        assert rm.partitions[TP].log.log_end_offset == 0  # the epoch-0 answer was dropped
        # The same answer in a current request is applied.
        await fetch_round(fetcher, OneAnswerStub(OneAnswerCall(rm, bytes(record), 1, bump=False)),
                          rm.partitions[TP])
        assert rm.partitions[TP].log.log_end_offset == 1
        assert rm.partitions[TP].high_watermark == 1
    finally:
        await rm.stop()


def test_fetched_chunk_is_aligned_to_the_log_end():
    log = seeded_log([(0, 5)])  # single-record batches 0..4, LEO 5
    replica = ReplicaState(TP.topic, TP.partition, local_broker_id=2, log=log, high_watermark=0,
                           min_insync_replicas=1, replica_lag_time_max_ms=1000)
    partition = Partition(TP, log, replica)
    below = bytearray(make_batch(2))
    set_base_offset_and_epoch(below, 0, 1, 0)  # offsets 1..2: wholly below the LEO
    straddling = bytearray(make_batch(5))
    set_base_offset_and_epoch(straddling, 0, 3, 0)  # offsets 3..7 straddle LEO 5
    chunk = bytes(below + straddling)
    aligned = partition._from_log_end(chunk)
    assert aligned == bytes(straddling)
    assert log.log_end_offset == 3  # cut back to the leader's batch base
    log.append_as_follower(aligned, 0)
    assert log.log_end_offset == 8
    assert partition._from_log_end(chunk) == b""
