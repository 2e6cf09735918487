"""ReplicaFetch sessions: what a leader leaves out of an answer, what a follower leaves out
of a request, and the two over real gRPC with an idle partition beside a busy one."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_broker_fakes import FakeLog, make_batch
from tests.unit.test_broker_fetcher import wait_until
from tests.unit.test_broker_replica_fetch import CountingServicer, make_follower, start_leader
from tests.unit.test_broker_replica_manager import TP, lai, make_manager, produce, serve
from tidewater.broker.clock import mono_ms
from tidewater.broker.serving.fetch import FetchedPartition
from tidewater.broker.serving.purgatory import FetchWaiters
from tidewater.broker.serving.replica_fetch_session import ReplicaFetchSession
from tidewater.broker.serving.replica_fetch_wire import decode_fetch_response
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import FetchSessionIdNotFoundError, InvalidRequestError

pytestmark = pytest.mark.timeout(60)

TP1 = TopicPartition(TP.topic, 1)


def request(mode: int, *asks: tuple[int, int]) -> pb.FetchRequest:
    """A follower's request naming (partition, fetch offset) pairs."""
    return pb.FetchRequest(replica_id=2, session_mode=mode, partitions=[
        pb.FetchPartition(topic=TP.topic, partition=p, fetch_offset=offset)
        for p, offset in asks])


def new_session() -> ReplicaFetchSession:
    return ReplicaFetchSession(FetchWaiters(), lag_ms=10**9)


def take(session: ReplicaFetchSession, fetch: pb.FetchRequest) -> bool:
    """``session.take``, then a first pass's choice, as the fetch path makes it: a new
    session reads every partition (none is settled yet)."""
    taken = session.take(fetch)
    if taken:
        session.to_read(True, 0, 0, False)
    return taken


def result(partition: int, high_watermark: int, records: bytes = b"", error_code: int = 0,
           log_start_offset: int = 0, diverging=None) -> FetchedPartition:
    return FetchedPartition(TP.topic, partition, error_code, "", high_watermark,
                            log_start_offset, high_watermark, 0, records, diverging)


def test_a_full_request_starts_the_session_and_is_answered_whole():
    session = new_session()
    assert take(session, request(pb.SESSION_FULL, (0, 5), (1, 3)))
    assert session.held and session.named is None
    assert [(w[1], w[3]) for w in session.wanted] == [(0, 5), (1, 3)]
    results = [result(0, 5), result(1, 3)]
    assert session.answer(results) == results


def test_an_incremental_answer_leaves_out_only_what_has_nothing_new():
    session = new_session()
    take(session, request(pb.SESSION_FULL, (0, 5), (1, 3), (2, 0)))
    session.answer([result(0, 5), result(1, 3), result(2, 0)])
    # Partition 0 moved (named); 1 and 2 are asked as before.
    assert take(session, request(pb.SESSION_INCREMENTAL, (0, 6)))
    assert session.named == {0}
    assert [(w[1], w[3]) for w in session.wanted] == [(0, 6), (1, 3), (2, 0)]
    answered = session.answer([result(0, 5), result(1, 3), result(2, 0)])
    assert [r.partition for r in answered] == [0]  # named, though nothing new
    # A HW, records, an error, a divergence or a log start: answered though not named.
    for changed in (result(1, 4), result(1, 3, records=b"r"),
                    result(1, 3, error_code=pb.NOT_LEADER_OR_FOLLOWER),
                    result(1, 3, diverging=(0, 2)), result(1, 3, log_start_offset=1)):
        take(session, request(pb.SESSION_INCREMENTAL))
        assert session.named == set()
        answered = session.answer([result(0, 5), changed, result(2, 0)])
        assert answered == [changed]
    # A new full request starts over: every partition again.
    take(session, request(pb.SESSION_FULL, (0, 6), (1, 3)))
    assert len(session.answer([result(0, 5), result(1, 3)])) == 2


def test_requests_the_session_cannot_take_are_refused_whole():
    session = new_session()
    with pytest.raises(FetchSessionIdNotFoundError):
        take(session, request(pb.SESSION_INCREMENTAL, (0, 1)))
    take(session, request(pb.SESSION_FULL, (0, 5)))
    with pytest.raises(InvalidRequestError, match="orders-7 is not in this stream's"):
        take(session, request(pb.SESSION_INCREMENTAL, (7, 1)))
    with pytest.raises(InvalidRequestError, match="named twice"):
        take(session, request(pb.SESSION_FULL, (0, 5), (0, 6)))
    assert not session.held
    with pytest.raises(FetchSessionIdNotFoundError):
        take(session, request(pb.SESSION_INCREMENTAL))


def test_a_sessionless_request_is_read_as_it_is():
    """A follower of an earlier release, or a mode this release does not know."""
    session = new_session()
    take(session, request(pb.SESSION_FULL, (0, 5)))
    for mode in (pb.SESSIONLESS, 9):
        assert not take(session, request(mode, (0, 5)))
        assert not session.held


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans(),
                                   st.booleans()), min_size=3, max_size=3),
                min_size=1, max_size=12),
       st.lists(st.sets(st.integers(0, 2)), min_size=12, max_size=12))
def test_what_is_left_out_the_follower_already_has(rounds, named_per_round):
    """Whatever each round's results, after applying the answers the follower's view of
    every partition (HW, log start) is the leader's, and nothing with records or an error
    is ever left out."""
    session = new_session()
    take(session, request(pb.SESSION_FULL, (0, 0), (1, 0), (2, 0)))
    seen: dict[int, tuple[int, int]] = {}
    for number, round_ in enumerate(rounds):
        if number:
            names = named_per_round[number]
            take(session, request(pb.SESSION_INCREMENTAL, *((p, number) for p in sorted(names))))
        named = session.named
        results = [result(p, hw, records=b"r" if has_records else b"",
                          error_code=pb.NOT_LEADER_OR_FOLLOWER if failed else 0,
                          log_start_offset=start)
                   for p, (hw, start, has_records, failed) in enumerate(round_)]
        answered = session.answer(results)
        for r in answered:
            seen[r.partition] = (r.high_watermark, r.log_start_offset)
        for r in results:
            assert seen[r.partition] == (r.high_watermark, r.log_start_offset)
            if r.records or r.error_code or (named is not None and r.partition in named):
                assert r in answered


class ContextProxy:
    """A servicer context whose requests read pass through ``on_read`` and whose answers
    written pass through ``on_write``; the rest is the context's."""

    def __init__(self, context, on_read=None, on_write=None):
        self._context, self._on_read, self._on_write = context, on_read, on_write

    def __getattr__(self, name):
        return getattr(self._context, name)

    async def read(self):
        message = await self._context.read()
        if self._on_read is not None and isinstance(message, pb.FetchRequest):
            self._on_read(message)
        return message

    async def write(self, answer):
        if self._on_write is not None:
            self._on_write(answer)
        await self._context.write(answer)


class RecordingServicer(CountingServicer):
    """The real ReplicaFetch, its requests and answers kept."""

    def __init__(self, rm):
        super().__init__(rm)
        self.requests: list[pb.FetchRequest] = []
        self.answers: list[bytes] = []

    async def ReplicaFetch(self, request_iterator, context):
        return await super().ReplicaFetch(request_iterator, ContextProxy(
            context, self.requests.append, self.answers.append))


def of_two(request: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrRequest:
    second = request.partitions.add()
    second.CopyFrom(request.partitions[0])
    second.state.partition = 1
    return request


async def test_an_idle_partition_leaves_the_stream_once_the_follower_has_it(tmp_path):
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = FakeLog(TP, LogConfig())
    leader_rm.log_manager._logs[TP1] = FakeLog(TP1, LogConfig())
    servicer = RecordingServicer(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    await leader_rm.leader_and_isr(of_two(lai(leader=1, leader_epoch=0, isr=(1,))))
    follower_rm = make_follower(tmp_path / "f", **{"replica.fetch.wait.max.ms": "200"})
    follower_rm.log_manager._logs[TP1] = FakeLog(TP1, LogConfig())
    try:
        for partition in (0, 1):
            await leader_rm.produce(produce(acks=1, partition=partition))
        request = of_two(lai(leader=1, leader_epoch=0, isr=(1,)))
        request.leaders[0].broker_id, request.leaders[0].port = 1, port
        await follower_rm.leader_and_isr(request)
        logs = [follower_rm.log_manager.get(tp) for tp in (TP, TP1)]
        await wait_until(lambda: [log.log_end_offset for log in logs] == [1, 1])
        await wait_until(lambda: follower_rm.partitions[TP1].high_watermark == 1)
        caught_up = len(servicer.requests)
        for n in range(2, 6):  # partition 0 busy, partition 1 idle
            await leader_rm.produce(produce(acks=1, partition=0, records=make_batch(1)))
            await wait_until(lambda n=n: logs[0].log_end_offset == n)
        await wait_until(lambda: follower_rm.partitions[TP].high_watermark == 5)
        assert servicer.calls["ReplicaFetch"] == 1  # one stream, one session
        first = servicer.requests[0]
        assert first.session_mode == pb.SESSION_FULL and len(first.partitions) == 2
        later = servicer.requests[caught_up:]
        assert later and all(r.session_mode == pb.SESSION_INCREMENTAL for r in later)
        assert all(p.partition == 0 for r in later for p in r.partitions)
        answers = [decode_fetch_response(a) for a in servicer.answers]
        assert all(a.session_held for a in answers)
        assert [p.partition for p in answers[0].partitions] == [0, 1]
        assert not any(p.partition == 1 for a in answers[caught_up:] for p in a.partitions)
        assert any(p.records for a in answers[caught_up:] for p in a.partitions)
        assert follower_rm.partitions[TP1].high_watermark == 1  # kept, not re-answered
        # The idle partition wakes: its records come on the same stream.
        await leader_rm.produce(produce(acks=1, partition=1))
        await wait_until(lambda: logs[1].log_end_offset == 2)
        await wait_until(lambda: follower_rm.partitions[TP1].high_watermark == 2)
        assert servicer.calls["ReplicaFetch"] == 1
    finally:
        await follower_rm.stop()
        await server.stop(0)


async def test_a_settled_partition_is_read_on_refreshes_only_and_stays_in_the_isr(tmp_path):
    """Over real gRPC: while partition 0 takes records one at a time, the caught-up idle
    partition 1 is read on the session's refreshes only (a quarter of the lag time apart),
    not on every pass; idle for three lag times, neither partition drops its follower
    from the ISR (the refreshes record its fetch time); partition 1's next record reaches
    the follower at once; and the session stops listening when the stream ends."""
    lag_ms = 400
    leader_rm, controller = make_manager(tmp_path / "l", **{"replica.lag.time.max.ms": str(lag_ms)})
    leader_rm.log_manager._logs[TP] = FakeLog(TP, LogConfig())
    leader_rm.log_manager._logs[TP1] = FakeLog(TP1, LogConfig())
    servicer = RecordingServicer(leader_rm)
    server, port = await serve(leader_rm, servicer.client, servicer)
    await leader_rm.leader_and_isr(of_two(lai(leader=1, leader_epoch=0, isr=(1, 2))))
    follower_rm = make_follower(tmp_path / "f", **{"replica.fetch.wait.max.ms": "50"})
    follower_rm.log_manager._logs[TP1] = FakeLog(TP1, LogConfig())
    path = leader_rm.fetcher_path
    lookups: dict[int, int] = {0: 0, 1: 0}
    lookup = path._lookup

    def counted(topic: str, partition: int):
        lookups[partition] += 1
        return lookup(topic, partition)

    path._lookup = counted
    loop = asyncio.get_running_loop()
    try:
        request = of_two(lai(leader=1, leader_epoch=0, isr=(1, 2)))
        request.leaders[0].broker_id, request.leaders[0].port = 1, port
        await follower_rm.leader_and_isr(request)
        logs = [follower_rm.log_manager.get(tp) for tp in (TP, TP1)]
        for partition in (0, 1):
            await leader_rm.produce(produce(acks=1, partition=partition))
        await wait_until(lambda: follower_rm.partitions[TP1].high_watermark == 1)
        await asyncio.sleep(0.2)  # a few rounds: both partitions settle
        lookups.update({0: 0, 1: 0})
        asked = len(servicer.requests)
        started = loop.time()
        for n in range(2, 42):
            await leader_rm.produce(produce(acks=1, partition=0))
            await wait_until(lambda n=n: logs[0].log_end_offset == n)
        elapsed_ms = (loop.time() - started) * 1000
        rounds = len(servicer.requests) - asked
        assert rounds >= 40 and lookups[0] >= 40
        refreshes_max = int(elapsed_ms // (lag_ms // 4)) + 2
        assert lookups[1] <= refreshes_max < rounds, (lookups, refreshes_max, rounds)
        for _ in range(3 * lag_ms // 50):  # idle: the ISR's lag check keeps running
            await asyncio.sleep(0.05)
            leader_rm.background.tick_all(mono_ms())
        assert controller.items == []  # no ISR shrink proposed
        for tp in (TP, TP1):
            assert 2 in leader_rm.partitions[tp].replica.leader.isr
        await leader_rm.produce(produce(acks=1, partition=1))
        await wait_until(lambda: follower_rm.partitions[TP1].high_watermark == 2)
    finally:
        await follower_rm.stop()
        await wait_until(lambda: leader_rm.fetch_waiters.waiting() == 0)
        await server.stop(0)
    assert not leader_rm.fetch_waiters._listeners_by_key  # the session stopped listening


def test_a_session_reads_what_it_heard_of_and_parks_on_appends_only():
    """The session's choice of what a pass reads, from the notices it hears."""
    waiters = FetchWaiters()
    session = ReplicaFetchSession(waiters, lag_ms=400)
    take(session, request(pb.SESSION_FULL, (0, 5), (1, 3), (2, 0)))
    session.unsettled.clear()  # as if a pass found all three settled
    session.take(request(pb.SESSION_INCREMENTAL))
    assert session.to_read(True, 50, 0, False) == []
    waiters.notify_high_watermark(TP1)
    waiters.notify_high_watermark(TopicPartition(TP.topic, 2))
    waiters.notify_append(TopicPartition("other", 0))  # not in the session
    assert session.to_read(False, 60, 0, False) == [1, 2]
    assert session.to_read(False, 60, 0, False) == []
    session.unsettled.add(0)
    session.take(request(pb.SESSION_INCREMENTAL, (2, 1)))
    assert session.to_read(True, 70, 0, False) == [0, 2]  # unsettled, named
    session.take(request(pb.SESSION_INCREMENTAL))
    assert session.to_read(True, 101, 0, False) is None  # a quarter of the lag time
    session.take(request(pb.SESSION_INCREMENTAL))
    assert session.to_read(True, 102, 8, False) is None  # another broker epoch
    session.take(request(pb.SESSION_INCREMENTAL))
    assert session.to_read(True, 103, 8, False, 198) == [0]  # 0 is not settled
    session.take(request(pb.SESSION_INCREMENTAL))
    # A long-poll that could leave the last recorded time older than half the lag time.
    assert session.to_read(True, 103, 8, False, 199) is None
    session.close()
    waiters.notify_append(TP)
    assert not session.changed and not waiters._listeners_by_key


async def test_a_parked_session_wakes_on_an_append_or_a_leadership_change_only():
    waiters = FetchWaiters()
    session = ReplicaFetchSession(waiters, lag_ms=400)
    take(session, request(pb.SESSION_FULL, (0, 5), (1, 3)))
    for notice in (lambda: waiters.notify_append(TP1), lambda: waiters.notify(TP1),
                   waiters.notify_all):
        parked = asyncio.ensure_future(session.park(5))
        await asyncio.sleep(0)
        assert waiters.waiting() == 1
        waiters.notify_high_watermark(TP)
        waiters.notify_high_watermark(TP1)
        await asyncio.sleep(0.01)
        assert not parked.done()
        notice()
        await asyncio.wait_for(parked, 1)
        assert waiters.waiting() == 0
    started = asyncio.get_running_loop().time()
    await session.park(0.05)  # nothing: its time ends it
    assert asyncio.get_running_loop().time() - started >= 0.04


async def test_a_leader_that_never_holds_a_session_gets_full_requests(tmp_path):
    """A leader of an earlier release ignores session_mode and never says session_held."""
    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = FakeLog(TP, LogConfig())

    modes: list[int] = []

    def as_if_never_read(message: pb.FetchRequest) -> None:
        modes.append(message.session_mode)
        message.session_mode = pb.SESSIONLESS

    class EarlierRelease(RecordingServicer):
        async def ReplicaFetch(self, request_iterator, context):
            return await super().ReplicaFetch(request_iterator,
                                              ContextProxy(context, as_if_never_read))

    servicer = EarlierRelease(leader_rm)
    server, port = await start_leader(leader_rm, servicer)
    follower_rm = make_follower(tmp_path / "f", **{"replica.fetch.wait.max.ms": "100"})
    try:
        request = lai(leader=1, leader_epoch=0, isr=(1,))
        request.leaders[0].broker_id, request.leaders[0].port = 1, port
        await follower_rm.leader_and_isr(request)
        for n in range(1, 4):
            await leader_rm.produce(produce(acks=1))
            await wait_until(lambda n=n: follower_rm.log_manager.get(TP).log_end_offset == n)
        await asyncio.sleep(0.3)  # a long-poll or two with nothing new
        assert len(modes) >= 4 and set(modes) == {pb.SESSION_FULL}
        counted = leader_rm.metrics.registry.get_sample_value(
            "tidewater_broker_replica_fetch_requests_total", {"session": "sessionless"})
        assert 4 <= counted <= len(modes)  # what the leader took them for (one may be in flight)
        assert all(len(r.partitions) == 1 for r in servicer.requests)
        assert not any(decode_fetch_response(a).session_held for a in servicer.answers)
    finally:
        await follower_rm.stop()
        await server.stop(0)


async def test_forged_session_requests_are_refused_and_the_stream_goes_on(tmp_path):
    """Over real gRPC, a caller that does not follow the session's rules: an incremental
    request before any full one, one naming a partition outside the session, a full one
    naming a partition twice. Each is refused at the request level, nothing is served for
    it, and the same stream then serves a proper full request."""
    import grpc

    leader_rm, _ = make_manager(tmp_path / "l")
    leader_rm.log_manager._logs[TP] = FakeLog(TP, LogConfig())
    server, port = await start_leader(leader_rm, CountingServicer(leader_rm))
    await leader_rm.produce(produce(acks=1))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stream = channel.stream_stream("/tidewater.BrokerControl/ReplicaFetch",
                                   request_serializer=pb.FetchRequest.SerializeToString,
                                   response_deserializer=None)()

    async def ask(mode: int, *asks: tuple[int, int]):
        fetch = request(mode, *asks)
        fetch.max_wait_ms, fetch.min_bytes = 0, 1
        for p in fetch.partitions:
            p.current_leader_epoch, p.partition_max_bytes = 0, 1 << 20
        await stream.write(fetch)
        return decode_fetch_response(await stream.read())

    try:
        refused = await ask(pb.SESSION_INCREMENTAL, (0, 0))
        assert refused.error_code == pb.FETCH_SESSION_ID_NOT_FOUND and not refused.partitions
        started = await ask(pb.SESSION_FULL, (0, 0))
        assert started.error_code == pb.NONE and started.session_held
        assert [bytes(p.records) != b"" for p in started.partitions] == [True]
        outside = await ask(pb.SESSION_INCREMENTAL, (5, 0))
        assert outside.error_code == pb.INVALID_REQUEST and not outside.partitions
        twice = await ask(pb.SESSION_FULL, (0, 1), (0, 1))
        assert twice.error_code == pb.INVALID_REQUEST
        assert (await ask(pb.SESSION_INCREMENTAL)).error_code == pb.FETCH_SESSION_ID_NOT_FOUND
        again = await ask(pb.SESSION_FULL, (0, 1))
        assert again.error_code == pb.NONE and again.session_held
        assert [(p.partition, p.high_watermark) for p in again.partitions] == [(0, 1)]
    finally:
        stream.cancel()
        await channel.close()
        await server.stop(0)
