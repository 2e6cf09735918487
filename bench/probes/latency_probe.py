"""Paced sending and timestamped payloads for the latency runs (both systems).

Payload layout (big-endian)::

    0..8    send time: time.time_ns() when the record was *due* (not when the
            sender got to it), so a sender that falls behind shows up as
            latency instead of hiding it (no coordinated omission)
    8..     filler bytes up to the record size

Receivers (another process) compute ``receipt_ns - send_ns``; both ends read
the same CLOCK_REALTIME of this one machine.
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
from collections.abc import Awaitable, Callable

_STAMP = struct.Struct(">q")
STAMP_BYTES = _STAMP.size


def stamped_payload(size_bytes: int, send_ns: int, filler: bytes) -> bytes:
    """``size_bytes`` of payload starting with ``send_ns``; ``filler`` must be long enough."""
    if size_bytes < STAMP_BYTES:
        raise ValueError(f"a latency record needs at least {STAMP_BYTES} bytes")
    return _STAMP.pack(send_ns) + filler[: size_bytes - STAMP_BYTES]


def read_stamp(payload: bytes) -> int:
    return _STAMP.unpack_from(payload, 0)[0]


def due_count(elapsed_s: float, rate_per_s: float) -> int:
    """How many records a sender at ``rate_per_s`` should have started after ``elapsed_s``."""
    if elapsed_s <= 0:
        return 0
    return int(elapsed_s * rate_per_s) + 1


def run_paced(count: int, rate_per_s: float, send_one: Callable[[int, int], None]) -> float:
    """Call ``send_one(index, due_ns)`` ``count`` times at ``rate_per_s``: every record that
    fell due is sent, then the sender sleeps until the next one is due (Kafka's
    ``ThroughputThrottler`` way). A sender woken late sends what fell due meanwhile at
    once, and the stamps still say when each was due. Returns the achieved rate."""
    start_ns = time.time_ns()
    start = time.perf_counter()
    interval_ns = 1e9 / rate_per_s
    interval_s = 1 / rate_per_s
    sent = 0
    while sent < count:
        due = min(count, due_count(time.perf_counter() - start, rate_per_s))
        while sent < due:
            send_one(sent, start_ns + int(sent * interval_ns))
            sent += 1
        if sent < count:
            # Record ``sent`` is due at start + sent * interval (``due_count``).
            wait_s = start + sent * interval_s - time.perf_counter()
            if wait_s > 0:
                time.sleep(wait_s)
    elapsed = time.perf_counter() - start
    return count / elapsed if elapsed > 0 else 0.0


async def run_paced_async(count: int, rate_per_s: float,
                          send_one: Callable[[int, int], Awaitable[None]], *,
                          whole_ms_sleeps: bool = False) -> float:
    """``run_paced`` on the running event loop: ``await send_one(index, due_ns)``, the
    same stamps and catch-up. ``whole_ms_sleeps``: sleep in whole ms, rounded up, for
    uvloop, whose timers count whole ms and round down, so a 0.5 ms sleep returns at
    once (measured 0.003 ms) and the pacer would spin; the stdlib loop sleeps as asked.
    Either way an event-loop pacer wakes later than the threaded one (0.5-0.6 ms at p50
    against 0.1, docs/benchmarks.md, issue 30): its rows carry that. Returns the
    achieved rate."""
    start_ns = time.time_ns()
    start = time.perf_counter()
    interval_ns = 1e9 / rate_per_s
    sent = 0
    while sent < count:
        due = min(count, due_count(time.perf_counter() - start, rate_per_s))
        while sent < due:
            await send_one(sent, start_ns + int(sent * interval_ns))
            sent += 1
        if sent < count:
            wait_s = start + sent / rate_per_s - time.perf_counter()
            if whole_ms_sleeps:
                wait_s = math.ceil(wait_s * 1000) / 1000
            await asyncio.sleep(max(0.0, wait_s))
    elapsed = time.perf_counter() - start
    return count / elapsed if elapsed > 0 else 0.0
