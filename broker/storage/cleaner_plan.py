"""Which segments of a compacted log the cleaner may rewrite, and in which groups (pure).

Kafka's ``LogCleanerManager`` / ``LogCleaner`` decisions, with no file and no clock
inside: segment summaries and the time come in, a ``CleaningPlan`` (or None) goes out.

The log, oldest first::

    | clean section         | dirty section                | uncleanable ...  | active |
    ^ log start             ^ first dirty offset           ^ clean end offset

- Cleanable: closed segments only, each ending at or below the *uncleanable
  offset* = min(active segment's base, high watermark, recovery point, the base
  of the first segment holding a batch younger than ``min.compaction.lag.ms``).
  Nothing at or above the HW is ever touched (it may still be truncated away),
  nor anything not yet flushed (the swap must not race the roll's flush).
- The first dirty offset is where the last cleaning ended (the cleaner offset
  checkpoint), clamped into the log (the log start when it lies past the end). Clean bytes are the cleanable segments
  wholly below it; dirty bytes the rest. The log is cleaned only when
  dirty / (clean + dirty) >= ``min.cleanable.dirty.ratio`` (and dirty > 0), or
  when a cleanable dirty segment's first batch is older than
  ``max.compaction.lag.ms`` (KIP-354: then at any ratio; ``LogConfig.roll_ms``
  rolls the active segment in time for its records to become cleanable).
- The whole cleanable range is rewritten (the clean section too: a key updated
  in the dirty section removes its older record there), as consecutive groups
  of segments, each becoming one segment named by its first segment's base
  offset: a group's bytes before cleaning fit ``segment.bytes`` and its offsets
  fit the index's 32-bit relative offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidewater.broker.storage.index import RELATIVE_OFFSET_MAX
from tidewater.broker.storage.log_config import LogConfig


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What planning needs of one segment."""

    base_offset: int
    next_offset: int  # offset after its last batch
    size_bytes: int
    max_timestamp: int  # largest batch maxTimestamp; -1 when none
    first_batch_time_ms: int | None = None  # the segment's first batch time (segment.ms)


@dataclass(frozen=True, slots=True)
class CleaningPlan:
    first_dirty_offset: int
    clean_end_offset: int  # the next cleaning's first dirty offset
    groups: tuple[tuple[int, ...], ...]  # indexes of the segments rewritten together
    dirty_ratio: float
    dirty_segments: tuple[int, ...]  # indexes of the segments the offset map reads


def uncleanable_offset(segments: Sequence[SegmentSummary], *, high_watermark: int,
                       recovery_point: int, now_ms: int, min_compaction_lag_ms: int) -> int:
    """The first offset the cleaner may not touch (module docstring)."""
    limit = min(segments[-1].base_offset, high_watermark, recovery_point)
    if min_compaction_lag_ms > 0:
        for segment in segments[:-1]:
            if segment.max_timestamp > now_ms - min_compaction_lag_ms:
                limit = min(limit, segment.base_offset)
                break
    return limit


def plan_cleaning(segments: Sequence[SegmentSummary], *, first_dirty_offset: int,
                  high_watermark: int, recovery_point: int, now_ms: int,
                  config: LogConfig) -> CleaningPlan | None:
    """The next cleaning of a log with these segments (the last is the active one), or
    None when nothing is cleanable or the dirty ratio is below the topic's minimum."""
    if not config.compact or len(segments) < 2:
        return None
    limit = uncleanable_offset(segments, high_watermark=high_watermark,
                               recovery_point=recovery_point, now_ms=now_ms,
                               min_compaction_lag_ms=config.min_compaction_lag_ms)
    cleanable = 0  # segments [0, cleanable) end at or below the limit
    while cleanable < len(segments) - 1 and segments[cleanable + 1].base_offset <= limit:
        cleanable += 1
    if cleanable == 0:
        return None
    clean_end = segments[cleanable].base_offset
    if first_dirty_offset > segments[-1].next_offset:
        first_dirty_offset = 0  # past the log's end: truncated or recreated since; start over
    first_dirty = min(max(first_dirty_offset, segments[0].base_offset), clean_end)
    dirty = tuple(i for i in range(cleanable) if segments[i + 1].base_offset > first_dirty)
    dirty_bytes = sum(segments[i].size_bytes for i in dirty)
    total_bytes = sum(segments[i].size_bytes for i in range(cleanable))
    if not dirty or dirty_bytes == 0:
        return None
    ratio = dirty_bytes / total_bytes
    if ratio < config.min_cleanable_dirty_ratio and not _overdue(
            segments, dirty, now_ms, config.max_compaction_lag_ms):
        return None
    # The map reads whole segments: one partly below the first dirty offset too.
    first_dirty = segments[dirty[0]].base_offset
    return CleaningPlan(first_dirty, clean_end, group_segments(segments[:cleanable + 1],
                                                               config.segment_bytes),
                        ratio, dirty)


def _overdue(segments: Sequence[SegmentSummary], dirty: Sequence[int], now_ms: int,
             max_compaction_lag_ms: int | None) -> bool:
    """A dirty segment's records have waited longer than max.compaction.lag.ms."""
    if max_compaction_lag_ms is None:
        return False
    for i in dirty:
        first_batch_time_ms = segments[i].first_batch_time_ms
        if first_batch_time_ms is not None and now_ms - first_batch_time_ms > max_compaction_lag_ms:
            return True
    return False


def group_segments(segments: Sequence[SegmentSummary],
                   segment_bytes: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive groups of ``segments[:-1]`` (the last one only bounds the offsets):
    each group's bytes fit ``segment_bytes`` and its offsets fit the index."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for i in range(len(segments) - 1):
        segment = segments[i]
        end = segments[i + 1].base_offset  # the group would reach up to here
        if current and (size + segment.size_bytes > segment_bytes
                        or end - 1 - segments[current[0]].base_offset > RELATIVE_OFFSET_MAX):
            groups.append(tuple(current))
            current, size = [], 0
        current.append(i)
        size += segment.size_bytes
    if current:
        groups.append(tuple(current))
    return tuple(groups)
