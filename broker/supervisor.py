"""Every background task of the broker is supervised: one that dies stops the broker.

A background task (replication ticks, checkpoints, retention, a fetcher, an
AlterPartition sender) that ends with an exception is a bug or an unhandled
failure: serving on without it would silently stop replication, HW
checkpoints or retention. ``TaskSupervisor.spawn`` logs such a death at
CRITICAL with its traceback and calls ``on_fatal``, which the broker process
turns into a shutdown with a non-zero exit (``broker/__main__.py``), as the
controller does. A cancelled task (shutdown) is not a failure.

A supervised loop waits with ``asyncio.timeout``, never ``asyncio.wait_for``:
Python 3.11's ``wait_for`` returns the awaited result when a cancel arrives in
the same loop turn as that result, so the loop goes on and a shutdown that
awaits the cancelled task waits forever.

``fail`` does the same for an invariant violation caught at a request
boundary: the broker stops rather than answer UNKNOWN_SERVER_ERROR and go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("tidewater.broker.supervisor")


def _ignore(error: BaseException) -> None:
    pass


class TaskSupervisor:
    def __init__(self, on_fatal: Callable[[BaseException], None] = _ignore):
        self.on_fatal = on_fatal
        self.failure: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.critical("background task %s died: %r", task.get_name(), error, exc_info=error)
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Stop the broker after ``error`` (once)."""
        if self.failure is None:
            self.failure = error
            log.critical("stopping the broker after: %r", error)
            self.on_fatal(error)

    async def stop(self) -> None:
        """Cancel every task still running and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def running(self) -> int:
        return len(self._tasks)
