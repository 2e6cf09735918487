"""Waiting rooms for requests that cannot be answered yet; woken by events, never polled.

``ProducePurgatory`` holds acks=all produce requests until the partition's
high watermark reaches their last offset + 1 (or leadership is lost, the ISR
shrinks below the minimum, or the request times out). Whoever moves a
partition's HW or ISR calls ``try_complete`` with a function that says, for a
required offset, "still waiting" (None) or the ErrorCode to answer.

``FetchWaiters`` holds long-poll fetches: a waiting fetch watches a set of
partitions and is woken by the first append or HW move on any of them; it
then reads again and decides whether it has enough bytes.

Everything runs on the broker's one event loop, so registering a waiter and
checking the current state happen without a gap for an event to slip through.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable

from proto import tidewater_pb2 as pb


def _answer(future: asyncio.Future, result) -> None:
    if not future.done():
        future.set_result(result)


class ProducePurgatory:
    def __init__(self) -> None:
        # partition -> heap of (required_offset, seq, future); smallest offset first.
        self._waiters: dict[Hashable, list[tuple[int, int, asyncio.Future]]] = {}
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
    def __init__(self) -> None:
        self._by_key: dict[Hashable, set[asyncio.Future]] = {}
        self._keys: dict[asyncio.Future, tuple[Hashable, ...]] = {}

    def watch(self, keys: Iterable[Hashable]) -> asyncio.Future:
        """A future resolved by the next ``notify`` of any of ``keys``; call ``discard`` after."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._keys[future] = tuple(keys)
        for key in self._keys[future]:
            self._by_key.setdefault(key, set()).add(future)
        return future

    async def wait(self, keys: Iterable[Hashable], timeout_s: float) -> None:
        """Until the next ``notify`` of any of ``keys``, or ``timeout_s``."""
        future = self.watch(keys)
        timer = asyncio.get_running_loop().call_later(timeout_s, _answer, future, None)
        try:
            await future
        finally:
            timer.cancel()
            self.discard(future)

    def discard(self, future: asyncio.Future) -> None:
        for key in self._keys.pop(future, ()):
            waiters = self._by_key.get(key)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._by_key[key]
        if not future.done():
            future.cancel()

    def notify(self, key: Hashable) -> None:
        for future in self._by_key.pop(key, ()):
            if not future.done():
                future.set_result(key)

    def notify_all(self) -> None:
        for key in list(self._by_key):
            self.notify(key)

    def waiting(self) -> int:
        return len({f for s in self._by_key.values() for f in s})
