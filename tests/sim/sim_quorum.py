"""A simulated controller of a quorum: the product's QuorumOwner, RaftNode and
ControllerStateMachine behind a fake network, disk and clock.

``SimQuorumController`` is ``SimController`` (the broker-facing transport: calls,
heartbeat streams, senders, timers) with the quorum's owner in place of
``MetadataOwner``. What runs is the product's:

* ``controller/raft``'s ``RaftNode`` (elections, replication, commit), its
  Readies carried out in the order ``controller/quorum/shell.py`` carries them
  out (durable, send, apply, advance; a failed write stops the process and is
  never advanced);
* ``controller/quorum/metadata_app.py``'s ``MetadataApplication``: every
  committed entry applied to ``machine.metadata`` (standbys keep a hot image;
  a restarted controller replays the committed log);
* ``controller/quorum/owner.py``'s ``QuorumOwner`` (a broken variant's subclass
  comes in as ``owner_class``): only the leader whose LEADER_CHANGE applied
  decides, on a scratch image, answering once its records committed; standbys
  answer NOT_CONTROLLER with the leader's id.

``SimRaftShell`` stands in for ``QuorumShell`` where the owner calls it (``node``,
``leader_hint``, ``propose``): the proposal's waiters are the shell's
``CommitWaiters`` (``controller/quorum/commit_waiters.py``), expired on the
simulation's clock at each tick. The owner is asyncio code: the simulation
runs each quorum step inside one event loop (``Simulation._quorum_step``) and
lets the loop run until idle at its end, so commands advance at known points and
a run stays a function of its seed (no timers, no I/O on that loop).

The disk (``QuorumDisk``): the quorum state and the log, with the chain hash of
each durable entry for the log-matching check; ``fail_next_write`` (a full disk)
makes the next Ready that writes fail after a random prefix reached the disk, and
the process stops. There are no snapshots here (``raft_cluster.py`` covers them).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.quorum.commit_waiters import CommitWaiters
from tidewater.controller.quorum.config import QuorumConfig
from tidewater.controller.quorum.errors import QuorumNotCaughtUpError, QuorumStoppedError
from tidewater.controller.quorum.metadata_app import MetadataApplication
from tidewater.controller.quorum.owner import NotActiveError, QuorumOwner
from tidewater.controller.raft import (
    Entry,
    Message,
    NotLeaderError,
    ProposalRejectedError,
    QuorumState,
    RaftConfig,
    RaftNode,
    Ready,
    VoterKey,
)
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto.errors import InvariantViolation, NotControllerError

from .messages import ControllerAnswer
from .network import Network
from .raft_cluster import AppState, RaftChecker, chain_hash
from .sim_controller import DOWN, RUNNING, SimController

# Timings for the simulation's network (delays up to 60 ms, 5 ms steps): a request
# timeout above the longest round trip, elections well under a broker session.
SIM_RAFT_CONFIG = RaftConfig(election_timeout_ms=300, fetch_timeout_ms=600, fetch_backoff_ms=20,
                             request_timeout_ms=200, begin_quorum_resend_ms=100,
                             fetch_entries_max=16)
PROPOSE_TIMEOUT_MS = 2000  # QuorumConfig.propose_timeout_ms_default is 5000: a shorter run
PROPOSALS_IN_FLIGHT_MAX = QuorumConfig.proposals_in_flight_max  # the product's default
SETTLE_ROUNDS = 12  # event-loop turns at the end of a step: a command's whole path


def controller_address(node_id: int) -> int:
    """A quorum controller's node on the simulated network (brokers are 1..n)."""
    return -node_id


@dataclass
class QuorumDisk:
    """One controller's data directory: what survives a crash."""

    directory_id: str
    quorum_state: QuorumState = QuorumState()
    log: list[Entry] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)  # chain hash after each entry
    fail_next_write: bool = False
    failed_writes: int = 0


class QuorumChecker(RaftChecker):
    """The Raft checks (election safety, log matching, leader completeness, one apply
    order, nothing committed lost) and one of the owner: one active controller per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.active_of_epoch: dict[int, int] = {}

    def on_active(self, node_id: int, epoch: int) -> None:
        known = self.active_of_epoch.setdefault(epoch, node_id)
        if known != node_id:
            self.fail(f"controllers {known} and {node_id} are both active in epoch {epoch}")


class SimRaftShell:
    """What ``QuorumOwner`` calls of ``QuorumShell``, over the simulated controller."""

    def __init__(self, controller: SimQuorumController):
        self._controller = controller

    @property
    def node(self) -> RaftNode:
        node = self._controller.node
        if node is None:
            raise QuorumStoppedError("the quorum node is not running")
        return node

    def leader_hint(self) -> int:
        node = self._controller.node
        return -1 if node is None or node.leader_id is None else node.leader_id

    async def propose(self, records: Sequence[bytes], timeout_ms: int = 0) -> tuple[int, int]:
        controller = self._controller
        node = self.node
        try:
            first = node.propose(records, controller.clock_ms())
        except NotLeaderError as e:
            raise NotControllerError(str(e)) from e
        except ProposalRejectedError as e:
            raise QuorumNotCaughtUpError(str(e)) from e
        epoch = node.epoch
        controller.drain()
        if controller.node is not node:
            raise QuorumStoppedError("the quorum node stopped")
        last = first + len(records) - 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = controller.waiters
        waiters.add(last, epoch, future, now_ms=controller.clock_ms(),
                    timeout_ms=PROPOSE_TIMEOUT_MS)
        if controller.app.applied_offset > last:
            waiters.on_committed(last, epoch)  # committed in the drain above
        try:
            await future
        finally:
            waiters.discard(last, future)  # a cancelled caller
        return first, epoch


class SimQuorumController(SimController):
    def __init__(self, network: Network, config: ControllerConfig, *, node_id: int,
                 disk: QuorumDisk, voters: frozenset[VoterKey], checker: QuorumChecker,
                 loop: asyncio.AbstractEventLoop, rng: random.Random,
                 clock_ms: Callable[[], int], uuid4, trace,
                 owner_class: type[QuorumOwner] = QuorumOwner,
                 raft_config: RaftConfig = SIM_RAFT_CONFIG):
        super().__init__(network, None, replace(config, node_id=node_id), clock_ms=clock_ms,
                         uuid4=uuid4, trace=trace)
        self.node_id = node_id
        self.address = controller_address(node_id)
        self.name = f"controller {node_id}"
        self.disk = disk
        self.voters = voters
        self.checker = checker
        self.loop = loop
        self.rng = rng
        self.quorum_owner_class = owner_class
        self.raft_config = raft_config
        self.node: RaftNode | None = None
        self.app = MetadataApplication(ControllerStateMachine(self.config, ClusterMetadata()))
        self.app_state = AppState()
        self.quorum_owner: QuorumOwner | None = None
        self.waiters = CommitWaiters(PROPOSALS_IN_FLIGHT_MAX)
        self.failure: BaseException | None = None
        self.activations = 0
        self.activated_epochs: list[int] = []  # controller epochs it became active in
        self._tasks: set[asyncio.Task[Any]] = set()
        self._was_leader = False
        self._leader_epoch = 0

    # ------------------------------------------------------------------ views

    @property
    def image(self) -> ClusterMetadata:
        """Its applied (committed) image; a stopped controller's as it stopped."""
        return self.app.machine.metadata

    @property
    def applied_offset(self) -> int:
        return self.app.applied_offset

    @property
    def active_epoch(self) -> int:
        owner = self.quorum_owner
        return owner.active_epoch if owner is not None and self.state == RUNNING else 0

    # ------------------------------------------------------------------ the process

    def start(self, now_ms: int) -> None:
        """A new process: a fresh image, the Raft node over the disk; the committed log
        is applied again as the node learns the high watermark."""
        self.run_id += 1
        self.machine = ControllerStateMachine(self.config, ClusterMetadata(), uuid4=self.uuid4)
        owner = self.quorum_owner = self.quorum_owner_class(
            self.machine, on_commit=self._on_commit, on_activated=self._on_activated,
            on_renounce=self._on_renounce, clock_ms=self.clock_ms)
        owner.shell = SimRaftShell(self)  # type: ignore[assignment]
        self.app = MetadataApplication(self.machine, on_applied=owner.on_applied)
        self.app_state = AppState()
        self.senders = {}
        self._streams.clear()
        self._stream_bound.clear()
        self._traced.clear()
        self.waiters = CommitWaiters(PROPOSALS_IN_FLIGHT_MAX)
        self._was_leader = False
        self._leader_epoch = 0
        disk = self.disk
        self.node = RaftNode(self.raft_config, VoterKey(self.node_id, disk.directory_id),
                             random.Random(self.rng.getrandbits(64)), now_ms,
                             bootstrap_voters=self.voters, quorum_state=disk.quorum_state,
                             entries=list(disk.log),
                             bootstrap_servers=frozenset(v.id for v in self.voters))
        self.state = RUNNING
        self._spawn(owner.run())
        self.trace(now_ms, f"controller {self.node_id}: started (run {self.run_id}), epoch "
                           f"{self.node.epoch}, log end {self.node.log_end_offset}")
        self.drain()

    def crash(self, now_ms: int) -> None:
        if self.state == DOWN:
            return
        self.crashes += 1
        self.trace(now_ms, f"controller {self.node_id}: crashed")
        self._stop()

    def end_of_run(self) -> None:
        """The run is over: stop without counting a crash."""
        if self.state != DOWN:
            self._stop()

    def _stop(self) -> None:
        self.state = DOWN
        self.node = None
        self.senders = {}
        self._streams.clear()
        self._stream_bound.clear()
        self.waiters.fail_all(QuorumStoppedError("the quorum node stopped"))
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coroutine) -> asyncio.Task[Any]:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ commands

    def _command(self, command, on_result: Callable[[Any], None] | None = None):
        """``QuorumOwner.submit`` as a task; ``on_result`` gets the answer, or the
        ``NotActiveError`` a standby answers with. Returns None (the answer comes later)."""
        if self.state != RUNNING or self.quorum_owner is None:
            return None
        run_id = self.run_id
        task = self._spawn(self.quorum_owner.submit(command))

        def done(task: asyncio.Task[Any]) -> None:
            if task.cancelled() or self.run_id != run_id or self.state != RUNNING:
                return
            error = task.exception()
            if error is None:
                result = task.result()
                if on_result is not None and result is not None:
                    on_result(result)
            elif isinstance(error, NotActiveError):
                if on_result is not None:
                    on_result(error)
            else:
                self.count(f"command failed: {type(error).__name__}")
        task.add_done_callback(done)
        return None

    def _answered_by(self, src: int, call_id: int, answer: Callable[[Any], None]
                     ) -> Callable[[Any], None]:
        def answered(result: Any) -> None:
            if isinstance(result, NotActiveError):
                # NOT_CONTROLLER with the leader's id (the trailing metadata's hint)
                self.network.send(self.address, src, ControllerAnswer(
                    call_id, None, not_controller=True, leader_hint=result.leader_id),
                    self.clock_ms())
            else:
                answer(result)
        return answered

    def _on_activated(self, controller_epoch: int) -> None:
        self.activations += 1
        # Checked by the step (an exception raised in this asyncio callback would only be
        # logged by the loop).
        self.activated_epochs.append(controller_epoch)
        now_ms = self.clock_ms()
        self.trace(now_ms, f"controller {self.node_id}: active (controller epoch "
                           f"{controller_epoch})")
        self._next_session_check_ms = now_ms + self._session_check_interval_ms()
        self._next_preferred_ms = now_ms + int(
            self.config.leader_imbalance_check_interval_seconds * 1000)

    def _on_renounce(self) -> None:
        self.trace(self.clock_ms(), f"controller {self.node_id}: no longer active")
        self.senders = {}

    # ------------------------------------------------------------------ messages and time

    def handle(self, src: int, message, now_ms: int) -> None:
        if self.state == DOWN:
            return
        if isinstance(message, Message):
            node = self.node
            assert node is not None
            node.step(message, now_ms)
            self.drain()
            return
        super().handle(src, message, now_ms)

    def tick(self, now_ms: int) -> None:
        if self.state == DOWN:
            return
        node = self.node
        assert node is not None
        node.tick(now_ms)
        self.drain()
        self.waiters.expire(now_ms)  # the shell's timer, at tick granularity
        if self.active_epoch:
            super().tick(now_ms)  # the active controller's timers and senders

    # ------------------------------------------------------------------ Readies

    def drain(self) -> None:
        """``QuorumShell._drain_readies``: durable, send, apply, advance; then leadership."""
        node = self.node
        while node is not None and node.has_ready():
            ready = node.ready()
            if not self._persist(ready):
                return  # stopped: nothing sent, applied or advanced
            now_ms = self.clock_ms()
            for message in ready.send:
                self.network.send(self.address, controller_address(message.destination),
                                  message, now_ms)
            for entry in ready.committed:
                self.checker.on_apply(self.node_id, self.app_state, entry)
                self.app.apply(entry)
                self.waiters.on_committed(entry.offset, entry.epoch)
            node.advance(ready, now_ms)
        if node is None or self.node is not node:
            return
        leader = node.is_leader
        if leader != self._was_leader or (leader and node.epoch != self._leader_epoch):
            if self._was_leader:
                self.waiters.fail_all(NotControllerError(
                    f"node {self.node_id} lost the leadership of epoch {self._leader_epoch}"))
            self._was_leader = leader
            self._leader_epoch = node.epoch if leader else 0
            if leader:
                self.trace(self.clock_ms(), f"controller {self.node_id}: leads epoch "
                                            f"{node.epoch}, log end {node.log_end_offset}")
            assert self.quorum_owner is not None
            self.quorum_owner.on_leadership(leader, node.epoch)
        if leader:
            self.checker.on_leader(self.node_id, node)

    def _persist(self, ready: Ready) -> bool:
        """``RaftStorage.carry_out`` on the fake disk; False if the write failed (the
        process stops, as the shell's ``on_fatal`` exits it)."""
        disk = self.disk
        if ready.snapshot_write is not None or ready.snapshot_install is not None:
            raise InvariantViolation("snapshots are not simulated with brokers")
        writes = bool(ready.log_append or ready.log_truncate_to is not None
                      or ready.quorum_state is not None)
        torn = writes and disk.fail_next_write
        if ready.log_truncate_to is not None:
            del disk.log[ready.log_truncate_to:]
            del disk.chain[ready.log_truncate_to:]
        entries = ready.log_append
        if torn:
            entries = entries[:self.rng.randint(0, len(entries))]
        for entry in entries:
            if entry.offset != len(disk.log):
                raise InvariantViolation(f"controller {self.node_id}: append of {entry.offset} "
                                         f"at {len(disk.log)}")
            disk.chain.append(chain_hash(disk.chain[-1] if disk.chain else 0, entry))
            disk.log.append(entry)
            self.checker.on_durable_append(self.node_id, entry, disk.chain[-1])
        if torn:
            disk.fail_next_write = False
            disk.failed_writes += 1
            self.fatal_stops += 1
            self.trace(self.clock_ms(), f"controller {self.node_id}: raft write failed "
                                        f"({len(entries)} of {len(ready.log_append)} entries "
                                        f"written): exits")
            self._stop()
            return False
        if ready.quorum_state is not None:
            disk.quorum_state = ready.quorum_state
        return True

