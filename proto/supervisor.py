"""Every background task of a broker or controller is supervised: one that dies stops it.

A background task (replication ticks, checkpoints, retention, a fetcher, an
AlterPartition sender; the controller's metadata owner, timers and senders)
that ends with an exception is a bug or an unhandled failure: serving on
without it would silently stop replication, HW checkpoints, retention or the
delivery of the controller's decisions. ``TaskSupervisor.spawn`` logs such a
death at CRITICAL with its traceback and calls ``on_fatal``, which the process
turns into a shutdown with a non-zero exit (``broker/__main__.py``,
``controller/__main__.py``). A cancelled task (shutdown) is not a failure.

``on_fatal`` has no default: a supervisor that nobody wired to a shutdown would
let tasks die in silence, the very thing it is for.

A supervised loop waits with ``asyncio.timeout``, never ``asyncio.wait_for``:
Python 3.11's ``wait_for`` returns the awaited result when a cancel arrives in
the same loop turn as that result, so the loop goes on and a shutdown that
awaits the cancelled task waits forever.

``fail`` does the same for an invariant violation (``errors.InvariantViolation``)
caught at a request boundary: the process stops rather than answer
UNKNOWN_SERVER_ERROR and go on. ``watch_callbacks`` covers what runs outside
any task (a timer, a done-callback, ``call_soon_threadsafe``): asyncio would
only log what such a callback raises; an ``InvariantViolation`` there is fatal
too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tidewater.proto.errors import InvariantViolation

log = logging.getLogger("tidewater.supervisor")
T = TypeVar("T")


class TaskSupervisor:
    def __init__(self, on_fatal: Callable[[BaseException], None], *, process: str = "broker"):
        """``on_fatal(error)``: stop the process (called once, on the event loop);
        ``process``: its name in the log lines ("broker", "controller")."""
        if not callable(on_fatal):
            raise TypeError(f"on_fatal must be callable, got {on_fatal!r}")
        self.on_fatal = on_fatal
        self.process = process
        self.failure: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watched: tuple[asyncio.AbstractEventLoop, Any] | None = None

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.critical("%s: background task %s died: %r", self.process, task.get_name(), error,
                         exc_info=error)
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Stop the process after ``error`` (once)."""
        if self.failure is None:
            self.failure = error
            log.critical("stopping the %s after: %r", self.process, error)
            self.on_fatal(error)

    def watch_callbacks(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make an ``InvariantViolation`` raised in one of ``loop``'s plain callbacks fatal
        (the loop's exception handler; others go on to the handler there was). ``stop``
        puts that one back."""
        previous = loop.get_exception_handler()
        self._watched = (loop, previous)

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            error = context.get("exception")
            if isinstance(error, InvariantViolation):
                log.critical("%s: %s: %r", self.process, context.get("message"), error,
                             exc_info=error)
                self.fail(error)
            elif previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
        loop.set_exception_handler(handle)

    async def stop(self) -> None:
        """Cancel every task still running and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._watched is not None:
            loop, previous = self._watched
            self._watched = None
            loop.set_exception_handler(previous)

    @property
    def running(self) -> int:
        return len(self._tasks)
