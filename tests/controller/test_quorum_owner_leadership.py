"""QuorumOwner's leadership rules against a scripted shell (no sockets): it decides only
after its own LEADER_CHANGE is applied, answers only committed-and-applied commands, and
on losing the leadership fails what is pending with NOT_CONTROLLER and stops the senders."""

from __future__ import annotations

import asyncio

import pytest

from tidewater.controller.config import ControllerConfig
from tidewater.controller.quorum.metadata_app import MetadataApplication
from tidewater.controller.quorum.owner import NotActiveError, QuorumOwner
from tidewater.controller.raft import Entry, EntryKind
from tidewater.controller.state_machine import ControllerStateMachine, Effects
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation, NotControllerError

pytestmark = pytest.mark.timeout(30)


class ScriptedShell:
    """The parts of QuorumShell the owner uses; the test decides when entries commit."""

    def __init__(self, app: MetadataApplication):
        self.app = app
        self.log_end_offset = 0
        self.epoch = 0
        self.proposed: list[tuple[int, list[bytes], asyncio.Future[None]]] = []
        self.hint = -1

    @property
    def node(self) -> ScriptedShell:
        return self

    def leader_hint(self) -> int:
        return self.hint

    def elect(self, epoch: int) -> None:
        """This node won ``epoch`` and its LEADER_CHANGE entry committed."""
        self.epoch = epoch
        self.app.apply(Entry(self.log_end_offset, epoch, EntryKind.LEADER_CHANGE, b""))
        self.log_end_offset += 1

    async def propose(self, records: list[bytes]) -> tuple[int, int]:
        first = self.log_end_offset
        self.log_end_offset += len(records)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.proposed.append((first, records, future))
        await future
        return first, self.epoch

    def commit_all(self) -> None:
        for first, records, future in self.proposed:
            for i, data in enumerate(records):
                self.app.apply(Entry(first + i, self.epoch, EntryKind.DATA, data))
            future.set_result(None)
        self.proposed.clear()

    def lose(self, owner: QuorumOwner, new_leader: int) -> None:
        self.hint = new_leader
        for _, _, future in self.proposed:
            future.set_exception(NotControllerError("lost the leadership"))
        self.proposed.clear()
        owner.on_leadership(False, self.epoch)


def commands_for(machine: ControllerStateMachine):
    def register(broker_id: int):
        request = pb.RegisterBrokerRequest(
            broker_id=broker_id, incarnation_id="i" * 32,
            listeners=[pb.Listener(name="INTERNAL", host="h", port=1)])
        return lambda tx, now: machine.register_broker(tx, now, request)
    return register


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_leadership_gates_decisions_and_commands_wait_for_commit():
    machine = ControllerStateMachine(ControllerConfig())
    register = commands_for(machine)
    committed: list[Effects] = []
    activated: list[int] = []
    renounced: list[bool] = []
    owner = QuorumOwner(machine, on_commit=committed.append, on_activated=activated.append,
                        on_renounce=lambda: renounced.append(True), clock_ms=lambda: 1000)
    app = MetadataApplication(machine, on_applied=owner.on_applied)
    shell = ScriptedShell(app)
    owner.shell = shell  # type: ignore[assignment]
    task = asyncio.create_task(owner.run())
    try:
        with pytest.raises(NotActiveError):  # a standby decides nothing
            await owner.submit(register(1))
        owner.on_leadership(True, 7)
        with pytest.raises(NotActiveError):  # leader, but its LEADER_CHANGE is not applied
            await owner.submit(register(1))
        shell.elect(7)
        await settle()
        # The start command (cluster id, controller epoch = the Raft epoch) awaits its commit.
        assert [len(r) for _, r, _ in shell.proposed] == [2]
        assert machine.metadata.controller_epoch == 0 and not activated
        shell.commit_all()
        await settle()
        assert activated == [7] and machine.metadata.controller_epoch == 7

        registering = asyncio.create_task(owner.submit(register(1)))
        await settle()
        assert not registering.done()  # proposed, not committed
        assert 1 not in machine.metadata.brokers  # the real image holds only committed state
        [(first, _, _)] = shell.proposed
        shell.commit_all()
        answer = await registering
        assert answer.error_code == pb.NONE and answer.broker_epoch == first
        assert machine.metadata.brokers[1].broker_epoch == first
        assert committed  # effects were dispatched after the commit

        # Leadership lost: the command waiting on its commit and the queued one fail.
        waiting = asyncio.create_task(owner.submit(register(2)))
        await settle()
        queued = asyncio.create_task(owner.submit(register(3)))
        await settle()
        shell.lose(owner, new_leader=2)
        for future in (waiting, queued):
            with pytest.raises(NotActiveError) as refused:
                await future
        assert refused.value.leader_id == 2
        assert renounced == [True]
        assert 2 not in machine.metadata.brokers and 3 not in machine.metadata.brokers
        with pytest.raises(NotActiveError):
            await owner.submit(register(4))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_failing_command_leaves_the_real_image_untouched():
    machine = ControllerStateMachine(ControllerConfig())
    owner = QuorumOwner(machine, on_commit=lambda effects: None, on_activated=lambda e: None,
                        on_renounce=lambda: None, clock_ms=lambda: 1000)
    shell = ScriptedShell(MetadataApplication(machine, on_applied=owner.on_applied))
    owner.shell = shell  # type: ignore[assignment]
    task = asyncio.create_task(owner.run())
    try:
        owner.on_leadership(True, 3)
        shell.elect(3)
        await settle()
        shell.commit_all()
        await settle()
        before = machine.metadata.snapshot_records()

        def half_done(tx, now_ms):
            tx.append({"type": "controller_epoch", "epoch": 99})
            raise ValueError("bad request")

        with pytest.raises(ValueError):
            await owner.submit(half_done)
        assert machine.metadata.snapshot_records() == before and not shell.proposed

        def broken(tx, now_ms):
            raise InvariantViolation("a bug")

        with pytest.raises(Exception, match="metadata owner failed"):
            await owner.submit(broken)
        await asyncio.gather(task, return_exceptions=True)
        assert isinstance(owner.failure, InvariantViolation)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
