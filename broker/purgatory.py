"""Waiting rooms for requests that cannot be answered yet; woken by events, never polled.

``ProducePurgatory`` holds acks=all produce requests until the partition's
high watermark reaches their last offset + 1 (or leadership is lost, the ISR
shrinks below the minimum, or the request times out). Whoever moves a
partition's HW or ISR calls ``try_complete`` with a function that says, for a
required offset, "still waiting" (None) or the ErrorCode to answer.

``FetchWaiters`` holds long-poll fetches: a waiting fetch watches a set of
partitions and is woken by the first change on any of them that can change
its answer (a follower's: an append; a consumer's: a HW move; both: a
leadership change); it then reads again and decides whether it has enough
bytes.

Everything runs on the broker's one event loop, so registering a waiter and
checking the current state happen without a gap for an event to slip through.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Hashable, Iterable

from tidewater.proto import tidewater_pb2 as pb

log = logging.getLogger("tidewater.broker.purgatory")


def _answer(future: asyncio.Future, result) -> None:
    if not future.done():
        future.set_result(result)


def _nothing() -> None:
    pass


class _Watch:
    """A ``ProducePurgatory.watch`` waiter: the future-like end (``done``, ``set_result``,
    ``cancel``) the heap and ``try_complete`` use, calling its callback on the answer."""

    __slots__ = ("_callback", "_done", "timer")

    def __init__(self, callback: Callable[[int], None]) -> None:
        self._callback = callback
        self._done = False
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, code: int) -> None:
        self._done = True
        if self.timer is not None:
            self.timer.cancel()
        try:
            self._callback(code)
        except Exception:  # noqa: BLE001 - a bug there must not break who moved the HW
            log.exception("acks=all answer callback failed")

    def cancel(self) -> None:
        self._done = True
        if self.timer is not None:
            self.timer.cancel()


class ProducePurgatory:
    def __init__(self) -> None:
        # partition -> heap of (required_offset, seq, future); smallest offset first.
        self._waiters: dict[Hashable, list[tuple[int, int, asyncio.Future | _Watch]]] = {}
        self._seq = itertools.count()

    def pending(self, key: Hashable | None = None) -> int:
        if key is None:
            return sum(len(h) for h in self._waiters.values())
        return len(self._waiters.get(key, ()))

    async def wait(self, key: Hashable, required_offset: int, timeout_ms: int,
                   result_for: Callable[[int], int | None]) -> int:
        """Wait until ``result_for(required_offset)`` gives an ErrorCode; REQUEST_TIMED_OUT on timeout."""
        now = result_for(required_offset)
        if now is not None:
            return now
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        heapq.heappush(self._waiters.setdefault(key, []), (required_offset, next(self._seq), future))
        # A timer answering the future itself, not wait_for(shield(...)): that costs two
        # more futures and callbacks on every acks=all write.
        timer = loop.call_later(max(timeout_ms, 0) / 1000, _answer, future, pb.REQUEST_TIMED_OUT)
        try:
            return await future
        finally:
            timer.cancel()
            if not future.done():
                future.cancel()  # the request was cancelled
            self._discard_done(key)

    def watch(self, key: Hashable, required_offset: int, timeout_ms: int,
              result_for: Callable[[int], int | None],
              callback: Callable[[int], None]) -> Callable[[], None]:
        """``wait`` for a caller without a coroutine of its own: ``callback(code)`` runs once
        with what ``wait`` would return, synchronously from whatever decides it (at once,
        ``try_complete``, ``fail_all``, the timeout), so it must only record the answer.
        Returns the function that withdraws the wait (``callback`` then never runs).

        ProduceStream watches instead of running a task per acks=all request: a task costs
        its creation, two more steps through the event loop and a done-callback."""
        now = result_for(required_offset)
        if now is not None:
            callback(now)
            return _nothing
        watch = _Watch(callback)
        heapq.heappush(self._waiters.setdefault(key, []), (required_offset, next(self._seq), watch))
        watch.timer = asyncio.get_running_loop().call_later(
            max(timeout_ms, 0) / 1000, self._expire, key, watch)

        def withdraw() -> None:
            watch.cancel()
            self._discard_done(key)
        return withdraw

    def _expire(self, key: Hashable, watch: _Watch) -> None:
        if not watch.done():
            watch.set_result(pb.REQUEST_TIMED_OUT)
            self._discard_done(key)

    def try_complete(self, key: Hashable, result_for: Callable[[int], int | None]) -> int:
        """Answer every waiter of ``key`` whose result is known; returns how many."""
        heap = self._waiters.get(key)
        if not heap:
            return 0
        completed = 0
        keep = []
        for entry in heap:
            required_offset, _, future = entry
            if future.done():
                continue
            result = result_for(required_offset)
            if result is None:
                keep.append(entry)
            else:
                future.set_result(result)
                completed += 1
        heapq.heapify(keep)
        if keep:
            self._waiters[key] = keep
        else:
            del self._waiters[key]
        return completed

    def fail_all(self, key: Hashable, error_code: int) -> int:
        """Answer every waiter of ``key`` with ``error_code`` (e.g. leadership lost)."""
        heap = self._waiters.pop(key, [])
        failed = 0
        for _, _, future in heap:
            if not future.done():
                future.set_result(error_code)
                failed += 1
        return failed

    def fail_everything(self, error_code: int) -> None:
        for key in list(self._waiters):
            self.fail_all(key, error_code)

    def _discard_done(self, key: Hashable) -> None:
        heap = self._waiters.get(key)
        if heap is None:
            return
        live = [e for e in heap if not e[2].done()]
        if live:
            if len(live) != len(heap):
                heapq.heapify(live)
                self._waiters[key] = live
        else:
            del self._waiters[key]


class FetchWaiters:
    """Long-poll fetches parked on partitions, by what can change their answer.

    A follower's answer changes with appends (``notify_append``), a consumer's
    with HW moves (``notify_high_watermark``): a consumer never reads above the
    HW, and a HW move alone does not answer a follower (``ReplicaManager.fetch``).
    ``notify`` (leadership changes, errors) and ``notify_all`` (shutdown) wake both.
    Waking a fetch whose answer cannot have changed costs a read pass and a new
    park, once per record and parked fetch.
    """

    def __init__(self) -> None:
        self._consumers_by_key: dict[Hashable, set[asyncio.Future]] = {}
        self._followers_by_key: dict[Hashable, set[asyncio.Future]] = {}
        self._keys: dict[asyncio.Future, tuple[tuple[Hashable, ...], dict]] = {}

    def watch(self, keys: Iterable[Hashable], *, follower: bool = False) -> asyncio.Future:
        """A future resolved by the next ``notify`` of any of ``keys``, or the next
        ``notify_append`` (a follower's) or ``notify_high_watermark`` (a consumer's);
        call ``discard`` after."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        keys = tuple(keys)
        by_key = self._followers_by_key if follower else self._consumers_by_key
        self._keys[future] = (keys, by_key)
        for key in keys:
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
        timer = asyncio.get_running_loop().call_later(timeout_s, _answer, future, None)
        try:
            await future
        finally:
            timer.cancel()
            self.discard(future)

    def discard(self, future: asyncio.Future) -> None:
        keys, by_key = self._keys.pop(future, ((), None))
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

    def notify_append(self, key: Hashable) -> None:
        _wake(self._followers_by_key.pop(key, ()), key)

    def notify_all(self) -> None:
        for key in list(self._consumers_by_key) + list(self._followers_by_key):
            self.notify(key)

    def waiting(self) -> int:
        return len({f for by_key in (self._consumers_by_key, self._followers_by_key)
                    for waiters in by_key.values() for f in waiters})


def _wake(futures: Iterable[asyncio.Future], key: Hashable) -> None:
    for future in futures:
        if not future.done():
            future.set_result(key)
