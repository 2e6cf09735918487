"""The one task that owns the controller's metadata.

gRPC handlers and timers never touch the image: they ``submit`` a command
(a function of ``(tx, now_ms)``) onto a bounded queue and await its result.
The owner runs commands one at a time:

1. run the command: it appends records to a ``Tx`` (applied to the image);
2. write the records to the metadata log and fsync;
3. hand ``tx.effects`` to ``on_commit`` (senders, metrics);
4. resolve the caller's future with the command's result.

Step 2 runs on the event loop on purpose: no other coroutine (a sender
building a LeaderAndIsr, say) can run between step 1 and the end of the fsync,
so nothing outside this task ever sees a state that is not durable yet.

A command that raises before appending anything fails only its caller,
unless what it raised is an ``InvariantViolation``: a bug in the state machine
is never handed to a caller to answer, it ends ``run`` (the caller gets
``OwnerStoppedError``) and the task's supervisor stops the controller. A
command that raises after appending, or a failed write, leaves the image ahead
of the disk. Then, still inside the same synchronous call (no await, so no
other coroutine runs in between), the owner

a. poisons the image (``ClusterMetadata.poison``): every later read raises,
   so no request, answer or replay can carry the unwritten records;
b. calls ``on_fatal``, the process's hook: it stops every sender and ends the
   process at once (``os._exit``; it returns only in tests);
c. raises ``ImageAheadOfDiskError`` (the caller gets ``OwnerStoppedError``).

A restart replays the log, which lacks the unwritten records: since none of
them left the process, no broker holds an epoch the next controller could hand
out a second time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.state_machine import ControllerStateMachine, Effects, Tx
from tidewater.proto.errors import InvariantViolation, KafkaStorageError

log = logging.getLogger(__name__)
T = TypeVar("T")
Command = Callable[[Tx, int], T]


class OwnerStoppedError(Exception):
    """The metadata owner is not running (shut down or failed)."""


class MetadataOwner:
    def __init__(self, metadata_log: MetadataLog, machine: ControllerStateMachine, *,
                 on_commit: Callable[[Effects], None],
                 on_fatal: Callable[[ImageAheadOfDiskError], None],
                 clock_ms: Callable[[], int], queue_size_max: int = 1024):
        self.metadata_log = metadata_log
        self.machine = machine
        self._on_commit = on_commit
        self._on_fatal = on_fatal
        self._clock_ms = clock_ms
        self._queue: asyncio.Queue[tuple[Command[Any], asyncio.Future[Any]]] = asyncio.Queue(
            queue_size_max)
        self._stopping = False
        self.failure: BaseException | None = None

    def recover(self) -> int:
        """Replay the log into the image (the same ``apply`` as at run time); returns the count."""
        count = 0
        for offset, record in self.metadata_log.recovered_records():
            self.machine.metadata.apply(offset, record)
            count += 1
        return count

    def maybe_compact(self, records_min: int) -> bool:
        """After ``recover``: rewrite the log as a snapshot of the image when it has at
        least ``records_min`` records and the snapshot is under half its size."""
        count = self.metadata_log.record_count
        if count < records_min:
            return False
        snapshot = self.machine.metadata.snapshot_records()
        if len(snapshot) * 2 > count:
            return False
        # Check before writing: the snapshot must rebuild exactly this image.
        check = ClusterMetadata()
        for i, record in enumerate(snapshot):
            check.apply(i, record)
        if check.snapshot_records() != snapshot:
            raise AssertionError("metadata snapshot does not replay to the same image")
        try:
            first = self.metadata_log.rewrite(snapshot)
        except KafkaStorageError as e:
            if self.metadata_log.failed:
                raise  # the rename may have happened: the open file is no longer the log
            # Nothing changed on disk and the image equals the log: compaction only saves space.
            log.error("metadata log compaction failed, keeping the log as it is: %s", e)
            return False
        log.info("compacted the metadata log from %d to %d records (offsets from %d)",
                 count, len(snapshot), first)
        return True

    def now_ms(self) -> int:
        """The clock commands run with."""
        return self._clock_ms()

    async def submit(self, command: Command[T]) -> T:
        if self._stopping or self.failure is not None:
            raise OwnerStoppedError("the controller is shutting down") from self.failure
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    def run_now(self, command: Command[T]) -> T:
        """Run a command synchronously (start-up, before the owner task runs)."""
        return self._execute(command)

    def _execute(self, command: Command[T]) -> T:
        if self.failure is not None:
            raise OwnerStoppedError("the metadata owner failed") from self.failure
        tx = Tx(self.machine.metadata, self.metadata_log.next_offset)
        try:
            result = command(tx, self._clock_ms())
        except Exception as e:
            if tx.records:
                self._fail_fatally(f"command failed after appending {len(tx.records)} records", e)
            raise
        if tx.records:
            try:
                first = self.metadata_log.append(tx.records)  # fsynced
            except Exception as e:
                self._fail_fatally(f"writing {len(tx.records)} metadata records failed", e)
            if first != tx.next_offset:  # the image used other offsets (broker epochs!) than the log
                self._fail_fatally(f"records written at offset {first}, applied at "
                                   f"{tx.next_offset}", None)
        try:
            self._on_commit(tx.effects)
        except Exception as e:
            # Durable, but some broker may never hear of it: restart and resync everyone.
            self._fail_fatally("dispatching committed effects failed", e)
        return result

    def _fail_fatally(self, what: str, cause: BaseException | None) -> NoReturn:
        """Steps a-c of the module docstring. Synchronous on purpose: no coroutine may run
        between the failure and the poisoning of every reader."""
        error = ImageAheadOfDiskError(f"{what}: {cause!r}" if cause else what)
        error.__cause__ = cause
        self.failure = error
        self._stopping = True
        self.machine.metadata.poison(error)
        self._on_fatal(error)
        raise error

    async def run(self) -> None:
        try:
            while True:
                command, future = await self._queue.get()
                if future.cancelled():
                    continue
                try:
                    result = self._execute(command)
                except (ImageAheadOfDiskError, InvariantViolation) as e:
                    # Fatal for the process, not an answer: the supervisor stops it.
                    if not future.cancelled():
                        future.set_exception(OwnerStoppedError(f"metadata owner failed: {e!r}"))
                    raise
                except Exception as e:
                    if not future.cancelled():
                        future.set_exception(e)
                    continue
                if not future.cancelled():
                    future.set_result(result)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                self.failure = e
                log.critical("metadata owner stopped", exc_info=e)
            self._fail_pending(e)
            raise

    def stop(self) -> None:
        """Refuse new commands (queued ones still run until the task is cancelled)."""
        self._stopping = True

    def _fail_pending(self, cause: BaseException) -> None:
        self._stopping = True
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(OwnerStoppedError(f"metadata owner stopped: {cause!r}"))


class ImageAheadOfDiskError(Exception):
    """The in-memory image holds records the log does not: the controller must stop."""
