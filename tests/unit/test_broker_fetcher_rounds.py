"""A follower's stream round without sockets: what cuts the read short, the deadline, reuse.

The fake call behaves as grpc.aio's does for these cases (checked against grpcio 1.85):
``cancel()`` makes a pending ``read()`` raise CancelledError in the reading task,
without that task being cancelled.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import tidewater.broker.following.fetcher as fetcher_module
from tests.unit.test_broker_fetcher import seeded_log, wait_until
from tests.unit.test_broker_replica_manager import TP, lai, make_manager
from tidewater.broker.following.fetcher import StreamBrokenError
from tidewater.broker.replication.replica import FollowerPhase
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class FakeStreamCall:
    """A ReplicaFetch call whose answers the test hands over."""

    def __init__(self):
        self.answers: asyncio.Queue = asyncio.Queue()
        self.written: list[bytes] = []
        self.cancelled = False
        self.pending: asyncio.Future | None = None

    async def write(self, request: pb.FetchRequest) -> None:
        if self.cancelled:
            raise asyncio.InvalidStateError("RPC already finished.")
        self.written.append(request.SerializeToString())

    async def read(self):
        if self.cancelled:
            raise asyncio.CancelledError
        self.pending = asyncio.ensure_future(self.answers.get())
        try:
            return await self.pending
        finally:
            self.pending = None

    def cancel(self) -> bool:
        self.cancelled = True
        if self.pending is not None:
            self.pending.cancel()
        return True


class FakeStub:
    def __init__(self):
        self.calls: list[FakeStreamCall] = []

    def ReplicaFetch(self, metadata=None):  # the generated stub's name
        self.calls.append(FakeStreamCall())
        return self.calls[-1]


async def follower(tmp_path, wait_max_ms=500):
    """A follower of TP with its fetcher's own task stopped: the test drives the rounds."""
    rm, _ = make_manager(tmp_path, broker_id=2,
                         **{"replica.fetch.wait.max.ms": str(wait_max_ms)})
    rm.log_manager._logs[TP] = seeded_log([(0, 3)])
    await rm.leader_and_isr(lai(leader=1, leader_epoch=0))
    fetcher = rm.fetchers.fetchers[1]
    fetcher.task.cancel()
    await asyncio.gather(fetcher.task, return_exceptions=True)
    partition = rm.partitions[TP]
    partition.replica.follower.phase = FollowerPhase.FETCHING  # as if truncation was done
    fetcher._changed.clear()
    return rm, fetcher, partition


def answer(high_watermark: int | None, session_held: bool = False) -> bytes:
    """An answer as the stream reads it: FetchResponse wire bytes (``fetch_wire``); None:
    the partition left out (a session's answer with nothing new for it)."""
    return pb.FetchResponse(error_code=pb.NONE, session_held=session_held, partitions=[
        pb.FetchPartitionResponse(topic=TP.topic, partition=TP.partition, error_code=pb.NONE,
                                  high_watermark=high_watermark, log_start_offset=0,
                                  log_end_offset=3)] if high_watermark is not None else []
    ).SerializeToString()


async def test_a_held_session_names_only_what_moved_until_the_stream_is_dropped(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()

    async def one_round(answer_bytes: bytes) -> pb.FetchRequest:
        calls = len(stub.calls)
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: len(stub.calls) > calls - 1 and stub.calls
                         and stub.calls[-1].pending is not None)
        await stub.calls[-1].answers.put(answer_bytes)
        await asyncio.wait_for(round_, 10)
        return pb.FetchRequest.FromString(stub.calls[-1].written[-1])

    try:
        first = await one_round(answer(1, session_held=True))
        assert first.session_mode == pb.SESSION_FULL and len(first.partitions) == 1
        # Nothing moved: an incremental request naming nothing; the answer leaves the
        # partition out and its core hears nothing (the HW stays).
        second = await one_round(answer(None, session_held=True))
        assert second.session_mode == pb.SESSION_INCREMENTAL and not second.partitions
        assert rm.partitions[TP].high_watermark == 1
        # The log moved (truncated here): named, with what the leader needs of it.
        a.log.truncate_to(2)
        third = await one_round(answer(2, session_held=True))
        assert third.session_mode == pb.SESSION_INCREMENTAL
        assert [(p.partition, p.fetch_offset, p.partition_max_bytes, p.topic_id)
                for p in third.partitions] == [(TP.partition, 2,
                                               rm.config.replica_fetch_max_bytes,
                                               a.topic_id)]
        assert rm.partitions[TP].high_watermark == 2
        # An answer without session_held (the leader dropped it): full requests again.
        await one_round(answer(2))
        assert (await one_round(answer(2, session_held=True))).session_mode == pb.SESSION_FULL
        # A dropped stream ends the session: the new stream starts with a full request.
        fetcher._drop_stream()
        fourth = await one_round(answer(2, session_held=True))
        assert len(stub.calls) == 2 and fourth.session_mode == pb.SESSION_FULL
        assert len(fourth.partitions) == 1
        assert (await one_round(answer(None, session_held=True))).session_mode \
            == pb.SESSION_INCREMENTAL
        # Another set of fetching partitions: a full request first.
        fetcher._build_request([a])
        assert (await one_round(answer(2, session_held=True))).session_mode == pb.SESSION_FULL
    finally:
        await rm.stop()


async def test_answered_rounds_share_one_stream_and_one_request_message(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()
    try:
        for hw in (1, 2):
            round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
            await wait_until(lambda: stub.calls and stub.calls[-1].pending is not None)
            await stub.calls[0].answers.put(answer(hw))
            await asyncio.wait_for(round_, 10)
            assert rm.partitions[TP].high_watermark == hw
        assert len(stub.calls) == 1 and not stub.calls[0].cancelled
        assert fetcher._stream is stub.calls[0]
        first, second = stub.calls[0].written
        assert first == second  # same offsets: nothing was appended
        fresh = pb.FetchRequest(replica_id=2, replica_broker_epoch=7, max_wait_ms=500,
                                min_bytes=1, max_bytes=rm.config.replica_fetch_max_bytes,
                                session_mode=pb.SESSION_FULL)
        fresh.partitions.add(topic=TP.topic, partition=TP.partition, current_leader_epoch=0,
                             fetch_offset=3, last_fetched_epoch=0, log_start_offset=0,
                             partition_max_bytes=rm.config.replica_fetch_max_bytes,
                             topic_id=rm.partitions[TP].topic_id)
        assert pb.FetchRequest.FromString(first) == fresh
        assert len(rm.partitions[TP].topic_id) == 16  # the follower names the incarnation
    finally:
        await rm.stop()


async def test_reused_request_follows_the_log_and_a_new_assignment_set(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    try:
        request, sent = fetcher._fetch_request([a])
        assert sent == {(TP.topic, TP.partition): (a, 0, 3)}
        a.log.truncate_to(1)
        again, sent = fetcher._fetch_request([a])
        assert again is request and again.partitions[0].fetch_offset == 1
        assert sent == {(TP.topic, TP.partition): (a, 0, 1)}
        # A LeaderAndIsr of a new leader epoch: the same message, asking in the new epoch.
        await rm.leader_and_isr(lai(leader=1, leader_epoch=1, partition_epoch=1))
        fetcher.task.cancel()
        await asyncio.gather(fetcher.task, return_exceptions=True)
        new, sent = fetcher._fetch_request([a])
        assert new is request and new.partitions[0].current_leader_epoch == 1
        assert sent == {(TP.topic, TP.partition): (a, 1, 1)}
        # Another assignment set: a new message.
        other, _ = fetcher._fetch_request([])
        assert other is not request
    finally:
        await rm.stop()


async def test_a_changed_assignment_set_cuts_the_read_short(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()
    try:
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: stub.calls and stub.calls[0].pending is not None)
        fetcher.mark_changed()
        assert await asyncio.wait_for(round_, 10) is None  # returned, not raised
        assert stub.calls[0].cancelled and fetcher._stream is None
        # The next round opens a new stream.
        fetcher._changed.clear()
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: len(stub.calls) == 2 and stub.calls[1].pending is not None)
        await stub.calls[1].answers.put(answer(3))
        await asyncio.wait_for(round_, 10)
        assert rm.partitions[TP].high_watermark == 3
    finally:
        await rm.stop()


async def test_a_malformed_answer_breaks_the_stream_and_the_next_round_reopens(tmp_path, caplog):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()
    try:
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: stub.calls and stub.calls[0].pending is not None)
        await stub.calls[0].answers.put(b"\x12\x05\x0a\x09garbage")  # a topic past its end
        with caplog.at_level(logging.WARNING, logger="tidewater.broker.following.fetcher"):
            with pytest.raises(StreamBrokenError, match="malformed answer from broker 1"):
                await asyncio.wait_for(round_, 10)
        assert "broker 1 sent a malformed fetch answer" in caplog.text
        assert stub.calls[0].cancelled and fetcher._stream is None
        assert rm.partitions[TP].log.log_end_offset == 3  # nothing applied
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: len(stub.calls) == 2 and stub.calls[1].pending is not None)
        await stub.calls[1].answers.put(answer(2))
        await asyncio.wait_for(round_, 10)
        assert rm.partitions[TP].high_watermark == 2
    finally:
        await rm.stop()


async def test_a_change_while_writing_drops_the_stream_before_reading(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()

    class ChangingCall(FakeStreamCall):
        async def write(self, request):
            fetcher.mark_changed()  # e.g. a LeaderAndIsr handled while the write awaited
            await super().write(request)

    stub.ReplicaFetch = lambda metadata=None: stub.calls.append(ChangingCall()) or stub.calls[-1]
    try:
        await asyncio.wait_for(fetcher._fetch_round(stub, [a]), 10)
        assert stub.calls[0].written and stub.calls[0].cancelled and fetcher._stream is None
    finally:
        await rm.stop()


async def test_an_overdue_answer_breaks_the_stream_at_its_own_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(fetcher_module, "RPC_MARGIN_S", 0.2)
    rm, fetcher, a = await follower(tmp_path, wait_max_ms=100)  # timeout 0.3 s per read
    stub = FakeStub()
    loop = asyncio.get_running_loop()
    try:
        # An answered round arms the deadline timer; the next read's deadline is later.
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: stub.calls and stub.calls[0].pending is not None)
        await stub.calls[0].answers.put(answer(1))
        await asyncio.wait_for(round_, 10)
        await asyncio.sleep(0.2)
        started = loop.time()
        with pytest.raises(StreamBrokenError, match="no answer"):
            await asyncio.wait_for(fetcher._fetch_round(stub, [a]), 10)
        assert loop.time() - started >= 0.3  # the first timer fired early and was re-armed
        assert stub.calls[0].cancelled and fetcher._stream is None
    finally:
        await rm.stop()


async def test_cancelling_the_fetcher_task_during_a_read_is_not_swallowed(tmp_path):
    rm, fetcher, a = await follower(tmp_path)
    stub = FakeStub()
    try:
        round_ = asyncio.ensure_future(fetcher._fetch_round(stub, [a]))
        await wait_until(lambda: stub.calls and stub.calls[0].pending is not None)
        fetcher.mark_changed()  # the call is cancelled too: the task's cancellation still wins
        round_.cancel()
        with pytest.raises(asyncio.CancelledError):
            await round_
        assert stub.calls[0].cancelled and fetcher._stream is None
    finally:
        await rm.stop()
    assert fetcher._read_timer is None  # close() cancelled the deadline timer


async def test_real_stream_silent_leader_is_dropped_at_the_deadline_and_reopened(tmp_path, monkeypatch,
                                                                                caplog):
    # Over real gRPC: the deadline timer cancels the call, the read raises CancelledError
    # (grpc.aio's behaviour for a locally cancelled call), the fetcher backs off and opens
    # a new stream, which is answered.
    from tests.unit.test_broker_replica_fetch import (
        CountingServicer,
        follow,
        make_follower,
        start_leader,
    )

    monkeypatch.setattr(fetcher_module, "RPC_MARGIN_S", 0.3)
    caplog.set_level(logging.DEBUG, logger="tidewater.broker.following.fetcher")
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = seeded_log([(0, 2)])

    class SilentFirstStream(CountingServicer):
        async def ReplicaFetch(self, request_iterator, context):
            self.calls["ReplicaFetch"] += 1
            if self.calls["ReplicaFetch"] == 1:
                await context.read()
                await asyncio.sleep(60)  # never answers: cancelled by the follower
                return
            await super(CountingServicer, self).ReplicaFetch(request_iterator, context)

    servicer = SilentFirstStream(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    follower_rm = make_follower(tmp_path / "f", **{"replica.fetch.wait.max.ms": "100",
                                                   "replica.fetch.backoff.ms": "50"})
    try:
        await follower_rm.leader_and_isr(follow(port))
        follower_log = follower_rm.log_manager.get(TP)
        await wait_until(lambda: follower_log.log_end_offset == 2, timeout_s=20)
        assert follower_log.log_end_offset == 2
        assert servicer.calls == {"Fetch": 0, "ReplicaFetch": 2}
        assert "no answer from broker 1 in 0.4s" in caplog.text
    finally:
        await follower_rm.stop()
        await server.stop(0)


async def test_a_cancel_that_meets_a_wake_up_ends_the_fetcher(tmp_path):
    """Python 3.11's wait_for returns the result when the cancel comes in the same loop
    turn as it, and the loop would go on: a broker's shutdown then waits forever."""
    rm, _ = make_manager(tmp_path, broker_id=2)
    rm.log_manager._logs[TP] = seeded_log([(0, 3)])
    await rm.leader_and_isr(lai(leader=1, leader_epoch=0))  # no endpoint for broker 1: idle
    fetcher = rm.fetchers.fetchers[1]
    for _ in range(20):
        await asyncio.sleep(0.01)  # into its wait for a change
        fetcher._changed.set()
        fetcher.task.cancel()
        done, _ = await asyncio.wait([fetcher.task], timeout=2)
        assert done and fetcher.task.cancelled()
        fetcher.task = asyncio.get_running_loop().create_task(fetcher._run())
    fetcher.task.cancel()
    await asyncio.gather(fetcher.task, return_exceptions=True)
