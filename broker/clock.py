"""The two clocks of the broker shell (the pure replication classes take ``now_ms``)."""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Wall-clock ms: record timestamps, segment.ms and retention.ms."""
    return int(time.time() * 1000)


def mono_ms() -> int:
    """Monotonic ms: replication timing (follower lag), immune to clock steps."""
    return int(time.monotonic() * 1000)
