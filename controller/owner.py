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

A command that raises before appending anything fails only its caller. A
command that raises after appending, or a failed write, leaves the image ahead
of the disk: the owner stops with that error (the process exits and recovers
from the log on restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.state_machine import ControllerStateMachine, Effects, Tx

log = logging.getLogger(__name__)
T = TypeVar("T")
Command = Callable[[Tx, int], T]


class OwnerStoppedError(Exception):
    """The metadata owner is not running (shut down or failed)."""


class MetadataOwner:
    def __init__(self, metadata_log: MetadataLog, machine: ControllerStateMachine, *,
                 on_commit: Callable[[Effects], None], clock_ms: Callable[[], int],
                 queue_size_max: int = 1024):
        self.metadata_log = metadata_log
        self.machine = machine
        self._on_commit = on_commit
        self._clock_ms = clock_ms
        self._queue: asyncio.Queue[tuple[Command, asyncio.Future]] = asyncio.Queue(queue_size_max)
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
        first = self.metadata_log.rewrite(snapshot)
        log.info("compacted the metadata log from %d to %d records (offsets from %d)",
                 count, len(snapshot), first)
        return True

    async def submit(self, command: Command[T]) -> T:
        if self._stopping or self.failure is not None:
            raise OwnerStoppedError("the controller is shutting down") from self.failure
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    def run_now(self, command: Command[T]) -> T:
        """Run a command synchronously (start-up, before the owner task runs)."""
        return self._execute(command)

    def _execute(self, command: Command[T]) -> T:
        tx = Tx(self.machine.metadata, self.metadata_log.next_offset)
        try:
            result = command(tx, self._clock_ms())
        except Exception as e:
            if tx.records:
                raise ImageAheadOfDiskError(
                    f"command failed after appending {len(tx.records)} records") from e
            raise
        if tx.records:
            try:
                first = self.metadata_log.append(tx.records)  # fsynced
            except Exception as e:
                raise ImageAheadOfDiskError("metadata log write failed") from e
            assert first == tx.next_offset, (first, tx.next_offset)
        try:
            self._on_commit(tx.effects)
        except Exception as e:
            raise ImageAheadOfDiskError("dispatching committed effects failed") from e
        return result

    async def run(self) -> None:
        try:
            while True:
                command, future = await self._queue.get()
                if future.cancelled():
                    continue
                try:
                    result = self._execute(command)
                except ImageAheadOfDiskError as e:
                    future.set_exception(OwnerStoppedError(f"metadata owner failed: {e}"))
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
