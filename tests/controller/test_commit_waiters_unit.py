"""CommitWaiters: each proposal's future answered once, by the first of commit, snapshot,
deadline, leadership loss or stop; the cap on waiters in flight. Then the shell's use of
it: the timer at the earliest deadline, the cap, stop, a cancelled caller."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.controller.quorum.commit_waiters import CommitWaiters
from tidewater.controller.quorum.config import Endpoint, QuorumConfig
from tidewater.controller.quorum.errors import QuorumNotCaughtUpError, QuorumStoppedError
from tidewater.controller.quorum.shell import QuorumShell
from tidewater.proto.errors import NotControllerError, RequestTimedOutError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def outcome(future: asyncio.Future[None]) -> type[BaseException] | None | str:
    if not future.done():
        return "waiting"
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return None if error is None else type(error)


def test_the_commit_of_the_proposed_epoch_answers_success_another_epoch_not_controller(loop):
    waiters = CommitWaiters(8)
    mine, lost = loop.create_future(), loop.create_future()
    waiters.add(5, 2, mine, now_ms=0, timeout_ms=100)
    waiters.add(6, 2, lost, now_ms=0, timeout_ms=100)
    waiters.on_committed(4, 2)  # nobody waits there
    waiters.on_committed(5, 2)
    waiters.on_committed(6, 3)
    assert outcome(mine) is None and outcome(lost) is NotControllerError and len(waiters) == 0


def test_expire_fails_what_is_due_and_gives_the_next_deadline(loop):
    waiters = CommitWaiters(8)
    early, late = loop.create_future(), loop.create_future()
    waiters.add(1, 1, early, now_ms=1000, timeout_ms=100)
    waiters.add(2, 1, late, now_ms=1050, timeout_ms=100)
    assert waiters.expire(1099) == 1100 and outcome(early) == "waiting"
    assert waiters.expire(1100) == 1150
    assert outcome(early) is RequestTimedOutError and "within 100 ms" in str(early.exception())
    assert waiters.expire(1150) is None and outcome(late) is RequestTimedOutError
    assert waiters.expire(2000) is None


def test_a_snapshot_fails_the_waiters_below_its_end_as_unknown(loop):
    waiters = CommitWaiters(8)
    covered, beyond = loop.create_future(), loop.create_future()
    waiters.add(9, 1, covered, now_ms=0, timeout_ms=100)
    waiters.add(10, 1, beyond, now_ms=0, timeout_ms=100)
    waiters.on_snapshot_installed(10)
    assert outcome(covered) is RequestTimedOutError and outcome(beyond) == "waiting"
    assert len(waiters) == 1


def test_fail_all_answers_every_waiter_with_the_given_error(loop):
    waiters = CommitWaiters(8)
    futures = [loop.create_future() for _ in range(3)]
    for offset, future in enumerate(futures):
        waiters.add(offset, 1, future, now_ms=0, timeout_ms=100)
    waiters.fail_all(QuorumStoppedError("stopped"))
    assert [outcome(f) for f in futures] == [QuorumStoppedError] * 3 and len(waiters) == 0


def test_past_the_cap_add_is_refused_retriably_and_a_slot_frees_once_answered(loop):
    waiters = CommitWaiters(2)
    waiters.add(1, 1, loop.create_future(), now_ms=0, timeout_ms=100)
    waiters.add(2, 1, loop.create_future(), now_ms=0, timeout_ms=100)
    with pytest.raises(QuorumNotCaughtUpError) as refused:
        waiters.add(3, 1, loop.create_future(), now_ms=0, timeout_ms=100)
    assert refused.value.retriable
    waiters.on_committed(1, 1)
    waiters.add(3, 1, loop.create_future(), now_ms=0, timeout_ms=100)
    assert len(waiters) == 2


def test_discard_forgets_only_the_same_future_and_a_cancelled_one_is_never_answered(loop):
    waiters = CommitWaiters(8)
    cancelled, newer = loop.create_future(), loop.create_future()
    waiters.add(1, 1, cancelled, now_ms=0, timeout_ms=100)
    cancelled.cancel()
    waiters.on_committed(1, 1)  # the cancelled caller: no answer, no error
    waiters.add(1, 2, newer, now_ms=0, timeout_ms=100)
    waiters.discard(1, cancelled)
    assert len(waiters) == 1
    waiters.discard(1, newer)
    assert len(waiters) == 0 and outcome(newer) == "waiting"


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 6), st.integers(1, 3), st.integers(1, 50)),
    st.tuples(st.just("commit"), st.integers(0, 6), st.integers(1, 3)),
    st.tuples(st.just("snapshot"), st.integers(0, 7)),
    st.tuples(st.just("tick"), st.integers(0, 30)),
    st.tuples(st.just("lose_leadership"),),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(1, 4))
def test_each_future_gets_the_first_event_that_concerns_it(ops, capacity):
    """Against a model: a dict of what waits, the clock only moving forward."""
    loop = asyncio.new_event_loop()
    try:
        waiters = CommitWaiters(capacity)
        model: dict[int, tuple[int, int, asyncio.Future[None]]] = {}  # offset: epoch, deadline
        expected: dict[int, object] = {}  # id(future): outcome
        futures: list[asyncio.Future[None]] = []
        now = 0

        def settle(future: asyncio.Future[None], result: object) -> None:
            expected[id(future)] = result

        for op in ops:
            if op[0] == "add":
                _, offset, epoch, timeout = op
                future = loop.create_future()
                if len(model) >= capacity:
                    with pytest.raises(QuorumNotCaughtUpError):
                        waiters.add(offset, epoch, future, now_ms=now, timeout_ms=timeout)
                    continue
                waiters.add(offset, epoch, future, now_ms=now, timeout_ms=timeout)
                if offset in model:  # replaced: the older one is never answered
                    settle(model[offset][2], "waiting")
                model[offset] = (epoch, now + timeout, future)
                futures.append(future)
                settle(future, "waiting")
            elif op[0] == "commit":
                _, offset, epoch = op
                if offset in model:
                    proposed, _, future = model.pop(offset)
                    settle(future, None if proposed == epoch else NotControllerError)
            elif op[0] == "snapshot":
                for offset in [o for o in model if o < op[1]]:
                    settle(model.pop(offset)[2], RequestTimedOutError)
            elif op[0] == "tick":
                now += op[1]
                for offset in [o for o, w in model.items() if w[1] <= now]:
                    settle(model.pop(offset)[2], RequestTimedOutError)
                due = waiters.expire(now)
                assert due == min((w[1] for w in model.values()), default=None)
            else:
                for _, _, future in model.values():
                    settle(future, NotControllerError)
                model.clear()
                waiters.fail_all(NotControllerError("lost"))
            if op[0] == "commit":
                waiters.on_committed(op[1], op[2])
            elif op[0] == "snapshot":
                waiters.on_snapshot_installed(op[1])
            assert len(waiters) == len(model) <= capacity
        assert [outcome(f) for f in futures] == [expected[id(f)] for f in futures]
    finally:
        loop.close()


def idle_shell(tmp_path, proposals_in_flight_max: int = 1024) -> QuorumShell:
    """A shell never started: only its waiters and their timer run."""
    config = QuorumConfig(node_id=1, data_dir=tmp_path, voters={1: Endpoint("127.0.0.1", 1)},
                          proposals_in_flight_max=proposals_in_flight_max)
    return QuorumShell(config, on_fatal=lambda error: None)


async def test_the_shells_timer_fails_each_waiter_at_its_own_deadline(tmp_path):
    shell = idle_shell(tmp_path)
    slow = asyncio.ensure_future(shell._wait_committed(1, 1, 400))
    fast = asyncio.ensure_future(shell._wait_committed(2, 1, 30))  # re-arms earlier
    with pytest.raises(RequestTimedOutError, match="within 30 ms"):
        await fast
    assert not slow.done()
    with pytest.raises(RequestTimedOutError, match="within 400 ms"):
        await slow
    assert len(shell._waiters) == 0
    await shell.stop()


async def test_the_shell_refuses_past_its_cap_and_stop_fails_the_rest(tmp_path):
    shell = idle_shell(tmp_path, proposals_in_flight_max=1)
    waiting = asyncio.ensure_future(shell._wait_committed(1, 1, 60_000))
    await asyncio.sleep(0)
    with pytest.raises(QuorumNotCaughtUpError):
        await shell._wait_committed(2, 1, 60_000)
    await shell.stop()
    with pytest.raises(QuorumStoppedError):
        await waiting


async def test_a_cancelled_proposal_leaves_no_waiter_behind(tmp_path):
    shell = idle_shell(tmp_path)
    waiting = asyncio.ensure_future(shell._wait_committed(1, 1, 60_000))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(shell._waiters) == 0
    await shell.stop()
