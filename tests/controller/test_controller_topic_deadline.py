"""A topic change is answered by its deadline (timeout_ms, within the forwarding broker's
gRPC deadline) even when the active controller cannot finish it: REQUEST_TIMED_OUT per
topic, as Kafka's controller answers; one still queued when its deadline passes is dropped.

The quorum owner runs here with a leader whose proposals never commit (its followers
starved on a loaded host): the first command holds the owner, later ones queue behind it.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tidewater.controller import service as controller_service
from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata import controller_epoch_record
from tidewater.controller.metrics import ControllerMetrics
from tidewater.controller.quorum.owner import QuorumOwner
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(60)


class UncommittingShell:
    """The Raft leader as the owner sees it: proposals are taken and commit only once
    ``commit`` is set (never, unless a test sets it)."""

    def __init__(self) -> None:
        self.node = SimpleNamespace(log_end_offset=1)
        self.proposals = 0
        self.commit = asyncio.Event()

    async def propose(self, records, timeout_ms: int = 0):
        self.proposals += 1
        first = self.node.log_end_offset
        self.node.log_end_offset += len(records)
        await self.commit.wait()
        return first, 1

    def leader_hint(self) -> int:
        return 1


class Call:
    """A handler's gRPC context: only the caller's remaining deadline is read."""

    def __init__(self, remaining_s: float | None) -> None:
        self.remaining_s = remaining_s

    def time_remaining(self) -> float | None:
        return self.remaining_s

    async def abort(self, code, details):
        raise AssertionError(f"aborted {code}: {details}")


@pytest.fixture
async def stuck_controller():
    machine = ControllerStateMachine(ControllerConfig())
    owner = QuorumOwner(machine, on_commit=lambda effects: None,
                        on_activated=lambda epoch: None, on_renounce=lambda: None,
                        clock_ms=lambda: 0)
    shell = UncommittingShell()
    owner.shell = shell  # type: ignore[assignment]
    owner.active_epoch = 1
    supervisor = TaskSupervisor(lambda error: None, process="controller")
    running = asyncio.create_task(owner.run())
    service = controller_service.ControllerService(owner, machine, ControllerMetrics(), supervisor=supervisor)
    # A command that proposes and waits for a commit that does not come: it holds the owner.
    holding = asyncio.create_task(owner.submit(
        lambda tx, now: tx.append(controller_epoch_record(2))))
    while shell.proposals == 0:
        await asyncio.sleep(0.01)
    yield service, shell, machine
    holding.cancel()
    running.cancel()
    await asyncio.gather(holding, running, return_exceptions=True)


@pytest.mark.parametrize("timeout_ms, remaining_s", [(200, None), (60_000, 0.3)],
                         ids=["own-timeout", "broker-deadline"])
async def test_create_topics_queued_behind_an_uncommitted_change_times_out(
        stuck_controller, timeout_ms, remaining_s):
    service, shell, _ = stuck_controller
    request = pb.CreateTopicsRequest(timeout_ms=timeout_ms, topics=[
        pb.CreatableTopic(name="a", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name="b", num_partitions=1, replication_factor=1)])
    async with asyncio.timeout(30):  # a hang guard: before the fix it waited for ever
        response = await service.CreateTopics(request, Call(remaining_s))
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("a", pb.REQUEST_TIMED_OUT), ("b", pb.REQUEST_TIMED_OUT)]
    # It never ran (dropped from the queue once its caller gave up): nothing proposed.
    await asyncio.sleep(0)
    assert shell.proposals == 1


async def test_delete_topics_and_create_partitions_time_out_the_same_way(stuck_controller):
    service, _, _ = stuck_controller
    async with asyncio.timeout(30):
        deleted = await service.DeleteTopics(
            pb.DeleteTopicsRequest(names=["a"], timeout_ms=100), Call(None))
        grown = await service.CreatePartitions(pb.CreatePartitionsRequest(
            timeout_ms=100, topics=[pb.CreatePartitionsTopic(name="a", count=2)]), Call(None))
    assert [(t.name, t.error_code) for t in deleted.topics] == [("a", pb.REQUEST_TIMED_OUT)]
    assert [(t.name, t.error_code) for t in grown.topics] == [("a", pb.REQUEST_TIMED_OUT)]


async def test_a_create_without_timeout_is_answered_and_still_made(stuck_controller,
                                                                    monkeypatch):
    """timeout_ms 0 is Kafka's "do not wait" (librdkafka takes REQUEST_TIMED_OUT as
    creation under way): answered by the default deadline, and not dropped."""
    service, shell, machine = stuck_controller
    monkeypatch.setattr(controller_service, "DEFAULT_TIMEOUT_MS", 100)
    ran: list[list[str]] = []
    create = machine.create_topics
    monkeypatch.setattr(machine, "create_topics", lambda tx, now, request: (
        ran.append([t.name for t in request.topics]), create(tx, now, request))[1])
    request = pb.CreateTopicsRequest(timeout_ms=0, topics=[
        pb.CreatableTopic(name="later", num_partitions=1, replication_factor=1)])
    async with asyncio.timeout(30):
        response = await service.CreateTopics(request, Call(None))
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("later", pb.REQUEST_TIMED_OUT)]
        assert ran == []
        shell.commit.set()  # the change ahead of it commits: the owner moves on
        while not ran:
            await asyncio.sleep(0.01)
    assert ran == [["later"]]


def test_the_deadline_budget_keeps_back_a_margin_of_the_brokers_deadline():
    deadline_budget_s = controller_service.deadline_budget_s
    assert deadline_budget_s(2000, None) == 2.0
    assert deadline_budget_s(0, None) == 5.0  # no timeout given: the default
    assert deadline_budget_s(60_000, 10.0) == 9.5  # answered before the broker gives up
    assert deadline_budget_s(60_000, 1.0) == pytest.approx(0.9)
    assert deadline_budget_s(1000, -1.0) == 0.0
