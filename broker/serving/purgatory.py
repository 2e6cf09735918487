"""Waiting rooms for requests that cannot be answered yet; woken by events, never polled.

``AcksWaits`` holds the shell's end of acks=all produce requests. The decision
of when each completes, and with which code, is the replication core's
(``ReplicaState``: a wait is opened at the append, bound to that leadership,
answered by a later ``Ready.completed``); this registry only maps a wait's id
to whoever answers the client, and arms the timer that tells the core a
wait's deadline has come. A wait may complete before anyone attaches to it
(RF=1: at the append itself): its code is kept until ``attach``.

``FetchWaiters`` holds long-poll fetches: a waiting fetch watches a set of
partitions and is woken by the first change on any of them that can change
its answer (a follower's: an append; a consumer's: a HW move; both: a
leadership change); it then reads again and decides whether it has enough
bytes. A follower's fetch session (``replica_fetch_session``) listens to its
partitions for as long as it lasts (``listen``): it hears of every change,
parked or not, and so reads again only the partitions that changed.

Everything runs on the broker's one event loop, so registering a waiter and
checking the current state happen without a gap for an event to slip through.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol, TypeAlias, TypeVar

from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replication.replica_produce import acks_all_wait_ms
from tidewater.proto.errors import InvariantViolation

log = logging.getLogger("tidewater.broker.serving.purgatory")

_T = TypeVar("_T")
# A parked fetch: resolved with the key that woke it, or None when its time is up.
Parked: TypeAlias = asyncio.Future[Hashable | None]
_ByKey: TypeAlias = dict[Hashable, set[Parked]]


class Listener(Protocol):
    """A fetch session listening to its partitions (``FetchWaiters.listen``)."""

    # The session's parked long-poll, if one is (counted by ``FetchWaiters.waiting``).
    parked: asyncio.Future[Hashable | None] | None

    def on_notice(self, key: Hashable, wakes_follower: bool) -> None:
        """``key`` changed: an append or a leadership change (``wakes_follower``; the
        core's DeleteRecords wakes followers too), or a HW move (not)."""


def resolve_once(future: asyncio.Future[_T], result: _T) -> None:
    """``future``'s result, unless it has one (or was cancelled)."""
    if not future.done():
        future.set_result(result)


class AcksWait:
    """One acks=all wait: its id in the core, and who to tell its ErrorCode."""

    __slots__ = ("waiter_id", "partition", "code", "callback", "timer")

    def __init__(self, waiter_id: int, partition: Partition) -> None:
        self.waiter_id = waiter_id
        self.partition = partition
        self.code: int | None = None
        self.callback: Callable[[int], None] | None = None
        self.timer: asyncio.TimerHandle | None = None


class AcksWaits:
    def __init__(self, on_deadline: Callable[[AcksWait], None]) -> None:
        """``on_deadline(wait)`` runs when a wait's timer fires (the core decides)."""
        self._on_deadline = on_deadline
        self._open: dict[int, AcksWait] = {}
        self._ids = itertools.count(1)

    def pending(self) -> int:
        return len(self._open)

    def open(self, partition: Partition, timeout_ms: int) -> AcksWait:
        """A new wait of ``partition`` (its id goes to the core with the append)."""
        wait = AcksWait(next(self._ids), partition)
        self._open[wait.waiter_id] = wait
        # The core's deadline (``acks_all_wait_ms``: the request's timeout, capped), one
        # millisecond late: the core compares its own clock with the deadline, and the
        # loop's clock may run a little behind it (the replication tick is the backstop).
        wait.timer = asyncio.get_running_loop().call_later(
            (acks_all_wait_ms(timeout_ms) + 1) / 1000, self._on_deadline, wait)
        return wait

    def complete(self, waiter_id: int, code: int) -> None:
        """The core decided ``waiter_id``'s outcome (``Ready.completed``)."""
        wait = self._open.pop(waiter_id, None)
        if wait is None:
            return  # withdrawn meanwhile
        if wait.timer is not None:
            wait.timer.cancel()
        wait.code = code
        callback = wait.callback
        if callback is not None:
            wait.callback = None
            try:
                callback(code)
            except InvariantViolation:
                raise  # never only a log line: the boundary above stops the broker
            except Exception:  # a bug there must not break who moved the HW
                log.exception("acks=all answer callback failed")

    def attach(self, wait: AcksWait, callback: Callable[[int], None]) -> None:
        """``callback(code)`` once the wait has its outcome (at once if it has it)."""
        if wait.code is not None:
            callback(wait.code)
        else:
            wait.callback = callback

    def withdraw(self, wait: AcksWait) -> None:
        """The request went away: the core forgets the wait, nobody is answered."""
        if self._open.pop(wait.waiter_id, None) is None:
            return
        if wait.timer is not None:
            wait.timer.cancel()
        wait.callback = None
        wait.partition.replica.withdraw_wait(wait.waiter_id)

    async def wait_for(self, wait: AcksWait) -> int:
        if wait.code is not None:
            return wait.code
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.attach(wait, future.set_result)
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(wait)
            raise

    def open_waits(self) -> list[AcksWait]:
        return list(self._open.values())


class FetchWaiters:
    """Long-poll fetches parked on partitions, by what can change their answer.

    A follower's answer changes with appends (``notify_append``), a consumer's
    with HW moves (``notify_high_watermark``): a consumer never reads above the
    HW, and a HW move alone does not answer a follower (``FetchPath.fetch``).
    ``notify`` (leadership changes, errors) and ``notify_all`` (shutdown) wake both.
    Waking a fetch whose answer cannot have changed costs a read pass and a new
    park, once per record and parked fetch. Listeners (``listen``) hear of every
    notice of their keys and park on their own.
    """

    def __init__(self) -> None:
        self._consumers_by_key: _ByKey = {}
        self._followers_by_key: _ByKey = {}
        self._keys: dict[Parked, tuple[tuple[Hashable, ...], _ByKey]] = {}
        self._listeners_by_key: dict[Hashable, list[Listener]] = {}

    def listen(self, keys: Iterable[Hashable], listener: Listener) -> None:
        """``listener.on_notice`` for every notice of ``keys`` until ``unlisten``."""
        for key in keys:
            listeners = self._listeners_by_key.get(key)
            if listeners is None:
                self._listeners_by_key[key] = [listener]
            else:
                listeners.append(listener)

    def unlisten(self, keys: Iterable[Hashable], listener: Listener) -> None:
        for key in keys:
            listeners = self._listeners_by_key.get(key)
            if listeners is not None and listener in listeners:
                listeners.remove(listener)
                if not listeners:
                    del self._listeners_by_key[key]

    def watch(self, keys: Iterable[Hashable], *, follower: bool = False) -> Parked:
        """A future resolved by the next ``notify`` of any of ``keys``, or the next
        ``notify_append`` (a follower's) or ``notify_high_watermark`` (a consumer's);
        call ``discard`` after."""
        future: Parked = asyncio.get_running_loop().create_future()
        watched = tuple(keys)
        by_key = self._followers_by_key if follower else self._consumers_by_key
        self._keys[future] = (watched, by_key)
        for key in watched:
            waiters = by_key.get(key)
            if waiters is None:
                by_key[key] = {future}
            else:
                waiters.add(future)
        return future

    async def wait(self, keys: Iterable[Hashable], timeout_s: float, *,
                   follower: bool = False) -> None:
        """Until ``watch``'s future resolves, or ``timeout_s``."""
        future = self.watch(keys, follower=follower)
        timer = asyncio.get_running_loop().call_later(timeout_s, resolve_once, future, None)
        try:
            await future
        finally:
            timer.cancel()
            self.discard(future)

    def discard(self, future: Parked) -> None:
        watched = self._keys.pop(future, None)
        if watched is not None:
            keys, by_key = watched
            for key in keys:
                waiters = by_key.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del by_key[key]
        if not future.done():
            future.cancel()

    def notify(self, key: Hashable) -> None:
        self.notify_high_watermark(key)
        self.notify_append(key)

    def notify_high_watermark(self, key: Hashable) -> None:
        _wake(self._consumers_by_key.pop(key, ()), key)
        listeners = self._listeners_by_key.get(key)
        if listeners is not None:
            for listener in listeners:
                listener.on_notice(key, False)

    def notify_append(self, key: Hashable) -> None:
        _wake(self._followers_by_key.pop(key, ()), key)
        listeners = self._listeners_by_key.get(key)
        if listeners is not None:
            for listener in listeners:
                listener.on_notice(key, True)

    def notify_all(self) -> None:
        for key in dict.fromkeys([*self._consumers_by_key, *self._followers_by_key,
                                  *self._listeners_by_key]):
            self.notify(key)

    def waiting(self) -> int:
        parked = {f for by_key in (self._consumers_by_key, self._followers_by_key)
                  for waiters in by_key.values() for f in waiters}
        parked.update(listener.parked for listeners in self._listeners_by_key.values()
                      for listener in listeners if listener.parked is not None)
        return len(parked)


def _wake(futures: Iterable[Parked], key: Hashable) -> None:
    for future in futures:
        if not future.done():
            future.set_result(key)
