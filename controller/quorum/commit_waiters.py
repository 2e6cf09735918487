"""``CommitWaiters``: the proposals waiting for their entry to commit, and the rules that
answer them. One implementation for the quorum shell (``shell.py``) and the seeded
simulation (``tests/sim/sim_quorum.py``), so the simulation checks the product's rules.

A proposal whose last entry was appended at offset O in epoch E waits on a future:

* the commit reaches O with the entry of epoch E: success;
* the entry committed at O is of another epoch: ``NotControllerError`` (the proposal
  was truncated with its leader's log);
* a snapshot installed past O: ``RequestTimedOutError`` (the outcome is unknown);
* its deadline passes (``expire``): ``RequestTimedOutError``;
* leadership lost, or the node stopped: the error the caller gives ``fail_all``.

At most ``capacity`` wait at once (``QuorumNotCaughtUpError`` past it). The class holds
futures and answers them; it does no I/O and schedules nothing: the time comes in as
``now_ms`` and the caller decides when to call ``expire`` (the shell on a timer at the
returned deadline, the simulation on its ticks).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tidewater.controller.quorum.errors import QuorumNotCaughtUpError
from tidewater.proto.errors import NotControllerError, RequestTimedOutError


@dataclass
class _Waiter:
    epoch: int
    future: asyncio.Future[None]
    timeout_ms: int
    deadline_ms: int


class CommitWaiters:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._waiters: dict[int, _Waiter] = {}  # by the offset of the proposal's last entry

    def __len__(self) -> int:
        return len(self._waiters)

    def add(self, offset: int, epoch: int, future: asyncio.Future[None], *, now_ms: int,
            timeout_ms: int) -> None:
        """``future`` waits for the entry appended at ``offset`` in ``epoch`` to commit,
        for ``timeout_ms`` from ``now_ms``."""
        if len(self._waiters) >= self.capacity:
            raise QuorumNotCaughtUpError("too many proposals waiting to commit")
        self._waiters[offset] = _Waiter(epoch, future, timeout_ms, now_ms + timeout_ms)

    def discard(self, offset: int, future: asyncio.Future[None]) -> None:
        """Forget ``future`` (its caller stopped waiting); a newer waiter at ``offset``
        stays."""
        waiter = self._waiters.get(offset)
        if waiter is not None and waiter.future is future:
            del self._waiters[offset]

    def on_committed(self, offset: int, epoch: int) -> None:
        """The entry at ``offset``, of ``epoch``, committed and was applied."""
        waiter = self._waiters.pop(offset, None)
        if waiter is None:
            return
        if waiter.epoch == epoch:
            _succeed(waiter.future)
        else:
            _fail(waiter.future, NotControllerError(
                f"offset {offset} was committed by epoch {epoch}; the proposal of epoch "
                f"{waiter.epoch} was lost with its leader"))

    def on_snapshot_installed(self, end_offset: int) -> None:
        """A snapshot replaced every entry below ``end_offset``: whether those proposals
        committed is unknown here."""
        for offset in [o for o in self._waiters if o < end_offset]:
            _fail(self._waiters.pop(offset).future, RequestTimedOutError(
                f"offset {offset} was replaced by a snapshot: outcome unknown"))

    def fail_all(self, error: Exception) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            _fail(waiter.future, error)

    def expire(self, now_ms: int) -> int | None:
        """Fail the waiters whose deadline is ``now_ms`` or before; the earliest deadline
        left, None if none is."""
        for offset, waiter in list(self._waiters.items()):
            if waiter.deadline_ms <= now_ms:
                del self._waiters[offset]
                _fail(waiter.future, RequestTimedOutError(
                    f"offset {offset} not committed within {waiter.timeout_ms} ms (no "
                    f"majority of voters reachable?)"))
        return min((w.deadline_ms for w in self._waiters.values()), default=None)


def _succeed(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled caller
        future.set_result(None)


def _fail(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
