"""The metadata owner over the Raft quorum (``controller.quorum.voters`` set).

The same contract as ``controller.owner.MetadataOwner`` (handlers and timers
``submit`` commands; one task runs them one at a time), with Raft as the log:

1. Only the *active* controller runs commands: the quorum's leader once the
   LEADER_CHANGE entry of its own epoch was committed and applied (so its image
   holds everything committed before it). Anyone else answers
   ``NotActiveError`` (NOT_CONTROLLER, with the leader's id as a hint).
2. A command runs against a scratch copy of the image: its ``Tx`` applies the
   records there, so the command sees its own changes, while the real image
   (``machine.metadata``, what handlers and senders read) holds only committed
   state. Its records are proposed with no ``await`` in between (the offsets the
   scratch used are the ones the leader appends at; checked on the answer).
3. The answer resolves only once the records are committed *and* applied: the
   shell applies committed entries through ``MetadataApplication.apply``, the
   code every standby and every restart replays with. Then the effects go to
   the senders (``on_commit``) and the caller gets the result.
4. Becoming active runs ``machine.start`` first, with the Raft epoch as the
   controller epoch (brokers refuse requests of an older one): fresh sessions,
   a resync of every unfenced broker, elections for offline partitions; then
   ``on_start`` (the controller's ``--bootstrap-user-config`` users' missing
   SCRAM credentials), in the same command.
5. Losing the leadership (``on_leadership(False, ...)``): queued commands and the
   one waiting on its commit fail with ``NotActiveError``, and ``on_renounce``
   stops the senders at once: no decision leaves a controller that may have
   been replaced.

A command that raises never touches the real image (only its scratch copy), so
it fails only its caller; an ``InvariantViolation`` still ends the owner (and the
controller). A proposal that timed out as leader may commit later: its effects
were not dispatched, so the next command's effects resync every unfenced broker.

The scratch copy is a ``deepcopy`` of the image per command (``scratch_copy``)
that shares the ``PartitionRecord``s: they are frozen, and a record replaces one
rather than changing it, so only the containers are copied. A plain deepcopy cost
60-140 ms at 1,000 partitions on a loaded host, per command and so per broker
heartbeat: the event loop then starved the Raft and broker RPCs (elections,
fenced brokers); sharing them makes it 1-5 ms. Kafka's timeline data structures
(snapshot and revert) are what a much larger image would need.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.owner import Command, OwnerStoppedError
from tidewater.controller.quorum.metadata_app import encode_record
from tidewater.controller.quorum.shell import QuorumShell
from tidewater.controller.raft import Entry, EntryKind
from tidewater.controller.state_machine import ControllerStateMachine, Effects, Tx
from tidewater.proto.errors import InvariantViolation, NotControllerError, RequestTimedOutError

log = logging.getLogger(__name__)
T = TypeVar("T")
# The trailing metadata key of a standby's NOT_CONTROLLER answer: the leader's node id.
LEADER_HINT_KEY = "tidewater-controller-leader"


def scratch_copy(image: ClusterMetadata) -> ClusterMetadata:
    """A copy of ``image`` that no record applied to it can change ``image`` through.

    Immutable objects are shared (the deepcopy memo maps each to itself): the
    partitions' frozen ``PartitionRecord``s, nearly all of a large image.
    """
    memo: dict[int, Any] = {id(p): p for p in image.all_partitions()}
    return copy.deepcopy(image, memo)


class NotActiveError(OwnerStoppedError):
    """This controller is not the quorum's active controller (NOT_CONTROLLER)."""

    def __init__(self, message: str, leader_id: int = -1):
        super().__init__(message)
        self.leader_id = leader_id


class QuorumOwner:
    def __init__(self, machine: ControllerStateMachine, *,
                 on_commit: Callable[[Effects], None],
                 on_activated: Callable[[int], None], on_renounce: Callable[[], None],
                 clock_ms: Callable[[], int], queue_size_max: int = 1024,
                 on_start: Callable[[Tx, int], None] | None = None):
        self.machine = machine
        # Runs in the start command, after ``machine.start`` (the bootstrap users' SCRAM
        # credentials): its records commit with the start's, before any other command.
        self._on_start = on_start
        self._on_commit = on_commit
        self._on_activated = on_activated
        self._on_renounce = on_renounce
        self._clock_ms = clock_ms
        self._queue: asyncio.Queue[tuple[Command[Any], asyncio.Future[Any]]] = asyncio.Queue(
            queue_size_max)
        self.shell: QuorumShell | None = None
        self._leader_epoch = 0  # the epoch this node leads (0: not the leader)
        self.active_epoch = 0  # the epoch this node decides in (0: not active)
        self._effects_in_doubt = False
        self._stopping = False
        self.failure: BaseException | None = None

    # ---- the shell's callbacks (synchronous, inside its drain) ----------------------

    def on_leadership(self, leader: bool, epoch: int) -> None:
        if leader:
            self._leader_epoch = epoch
            log.info("controller %d leads the quorum in epoch %d; active once its "
                     "LEADER_CHANGE commits", self.machine.config.node_id, epoch)
            return
        was_active = self.active_epoch
        self._leader_epoch = 0
        self.active_epoch = 0
        self._fail_pending(self._not_active())
        if was_active:
            log.warning("controller %d lost the leadership of epoch %d: no more decisions",
                        self.machine.config.node_id, was_active)
            self._on_renounce()

    def on_applied(self, entry: Entry) -> None:
        if (entry.kind is EntryKind.LEADER_CHANGE and self._leader_epoch
                and entry.epoch == self._leader_epoch and not self.active_epoch):
            self.active_epoch = entry.epoch
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(self._started)
            self._queue.put_nowait((self._start_command(entry.epoch), future))

    def _start_command(self, epoch: int) -> Command[None]:
        def start(tx: Tx, now_ms: int) -> None:
            self.machine.start(tx, now_ms, controller_epoch=epoch)
            if self._on_start is not None:
                self._on_start(tx, now_ms)
        return start

    def _started(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.error("starting as the active controller failed: %r", error)
            return
        log.info("controller %d is the active controller (controller epoch %d)",
                 self.machine.config.node_id, self.machine.metadata.controller_epoch)
        self._on_activated(self.machine.metadata.controller_epoch)

    # ---- commands -------------------------------------------------------------------

    def _not_active(self) -> NotActiveError:
        hint = self.shell.leader_hint() if self.shell is not None else -1
        return NotActiveError(f"NOT_CONTROLLER: controller {self.machine.config.node_id} is not "
                              f"the active controller (leader: {hint})", hint)

    def now_ms(self) -> int:
        """The clock commands run with."""
        return self._clock_ms()

    async def submit(self, command: Command[T]) -> T:
        if self._stopping or self.failure is not None:
            raise OwnerStoppedError("the controller is shutting down") from self.failure
        if not self.active_epoch:
            raise self._not_active()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    async def _execute(self, command: Command[T]) -> T:
        shell = self.shell
        epoch = self.active_epoch
        if shell is None or not epoch:
            raise self._not_active()
        node = shell.node
        real = self.machine.metadata
        scratch = scratch_copy(real)
        tx = Tx(scratch, node.log_end_offset)
        self.machine.metadata = scratch  # what the command reads (no await until restored)
        try:
            result = command(tx, self._clock_ms())
        finally:
            self.machine.metadata = real
        effects = tx.effects
        if self._effects_in_doubt:
            effects.resync_brokers |= real.unfenced_broker_ids()
        if tx.records:
            try:
                first, committed_epoch = await shell.propose(
                    [encode_record(r) for r in tx.records])
            except NotControllerError as e:
                raise self._not_active() from e
            except RequestTimedOutError:
                self._effects_in_doubt = True  # it may still commit, unseen by the senders
                raise
            if first != tx.next_offset or committed_epoch != epoch:
                raise InvariantViolation(f"records applied to the scratch image at "
                                         f"{tx.next_offset} (epoch {epoch}) were appended at "
                                         f"{first} (epoch {committed_epoch})")
            if self.active_epoch != epoch:
                raise self._not_active()
        self._effects_in_doubt = False
        self._on_commit(effects)
        return result

    async def run(self) -> None:
        try:
            while True:
                command, future = await self._queue.get()
                if future.done():
                    continue
                try:
                    result = await self._execute(command)
                except InvariantViolation as e:
                    if not future.done():
                        future.set_exception(OwnerStoppedError(f"metadata owner failed: {e!r}"))
                    raise
                except Exception as e:
                    if not future.done():
                        future.set_exception(e)
                    continue
                if not future.done():
                    future.set_result(result)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                self.failure = e
                log.critical("metadata owner stopped", exc_info=e)
            self._stopping = True
            self._fail_pending(OwnerStoppedError(f"metadata owner stopped: {e!r}"))
            raise

    def stop(self) -> None:
        self._stopping = True

    def _fail_pending(self, error: Exception) -> None:
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(error)
