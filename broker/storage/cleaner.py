"""The log cleaner: compacts logs with ``cleanup.policy=compact`` (Kafka's ``LogCleaner``).

One pass (``LogCleaner.clean_logs``, in a worker thread) looks at every compacted log
and cleans those whose plan says so (``cleaner_plan.py``):

1. Snapshot the segments (and the log's truncation count) under the log's lock.
2. Scan every batch header of the log for each producer's last batch (kept even when
   emptied: ``cleaner_rewrite.py``), then build the offset map over the dirty
   segments (every batch CRC-checked and decoded). A map that reaches
   ``offset_map_entries_max`` ends the dirty section at the segment where it did.
3. For each group of segments, oldest first, write the cleaned segment under
   ``.cleaned`` names (``cleaner_rewrite.filter_batch`` for every batch, the group's
   last batch always kept), fsync it with its indexes, and swap it in under the log's
   lock (``cleaner_swap.py``: ``.cleaned`` -> ``.swap`` -> plain names). A log that
   changed meanwhile (a truncation, retention, deletion) stops its cleaning; the
   ``.cleaned`` files are removed.
4. The end of the cleaned section becomes the log's next first dirty offset, kept in
   ``<data dir>/cleaner-offset-checkpoint`` (Kafka's file and format:
   ``checkpoints.py``); an offset outside the log is clamped into it. Every compacted
   log is listed there from the first pass on, cleaned or not: the audit reads the
   file to know which partitions are compacted.

Reads and writes go through ``IoThrottle`` at ``log.cleaner.io.max.bytes.per.second``.
``stop`` makes a running pass give up at the next batch (``CleaningAborted``) and
leaves only ``.cleaned`` leftovers, which opening a log removes. A damaged batch met
while cleaning stops that log's cleaning (the scrub and the readers report damage; the
cleaner never rewrites what it cannot read). Nothing at or above the HW and nothing
in the active segment is read for rewriting.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.storage.checkpoints import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tidewater.broker.storage.cleaner_plan import (
    CleaningPlan,
    SegmentSummary,
    group_segments,
    plan_cleaning,
)
from tidewater.broker.storage.cleaner_rewrite import (
    AbortedRanges,
    FilterStats,
    OffsetMap,
    RetainRules,
    TxnPass,
    filter_batch,
)
from tidewater.broker.storage.cleaner_swap import CLEANED_SUFFIX, swap_in
from tidewater.broker.storage.log import Log, unlink_in_background
from tidewater.broker.storage.segment import (
    BatchFrame,
    LogSegment,
    fsync_dir,
    iter_batches_in_file,
    storage_error,
)
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import read_header, validate_batch
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    KafkaStorageError,
    TidewaterError,
)

log = logging.getLogger(__name__)

OFFSET_MAP_ENTRIES_MAX = 1_000_000  # Kafka's 128 MiB dedupe buffer holds ~5.6 M
WRITE_CHUNK_BYTES = 1 << 20  # cleaned batches are written this much at a time


class CleaningAborted(Exception):
    """The cleaner was stopped, or the log changed under it: nothing was swapped in since."""


class IoThrottle:
    """Bytes per second over time passed in (Kafka's ``Throttler``): ``delay_s`` says how
    long to wait after moving ``n`` bytes so the rate stays at most ``bytes_per_second``
    (one second of burst). ``bytes_per_second`` <= 0: no limit."""

    def __init__(self, bytes_per_second: float, now_s: float):
        self.bytes_per_second = bytes_per_second
        self._start_s = now_s
        self._bytes = 0.0

    def delay_s(self, n: int, now_s: float) -> float:
        if self.bytes_per_second <= 0:
            return 0.0
        # Forget what lies more than a second of allowance in the past: no banking.
        elapsed = now_s - self._start_s
        if elapsed > 1.0 and self._bytes <= elapsed * self.bytes_per_second:
            self._start_s, self._bytes = now_s - 1.0, max(
                0.0, self._bytes - (elapsed - 1.0) * self.bytes_per_second)
            elapsed = 1.0
        self._bytes += n
        return max(0.0, self._bytes / self.bytes_per_second - elapsed)


@dataclass
class CleanResult:
    """One log's cleaning, for the metrics and the log line."""

    tp: TopicPartition
    first_dirty_offset: int
    clean_end_offset: int
    segments_before: int = 0
    segments_after: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    filter: FilterStats = field(default_factory=FilterStats)


class LogCleaner:
    """Cleans the compacted logs of one data dir; one pass at a time (its caller's task)."""

    def __init__(self, data_dir: Path, *, io_bytes_per_second: float = 0,
                 offset_map_entries_max: int = OFFSET_MAP_ENTRIES_MAX,
                 monotonic_s: Callable[[], float] | None = None):
        self._monotonic_s = monotonic_s or time.monotonic
        self.checkpoint = OffsetCheckpointFile(Path(data_dir) / CLEANER_OFFSET_CHECKPOINT)
        try:
            self.first_dirty_offsets: dict[TopicPartition, int] = self.checkpoint.read()
        except CorruptFileError as e:
            log.warning("%s; every compacted log is cleaned from its start", e)
            self.first_dirty_offsets = {}
        self.offset_map_entries_max = offset_map_entries_max
        self._throttle = IoThrottle(io_bytes_per_second, self._monotonic_s())
        self._stopping = threading.Event()
        self._seen: dict[TopicPartition, Log] = {}  # the log each partition had last pass
        self._segment_bytes = 0

    def stop(self) -> None:
        """A running pass gives up at its next batch."""
        self._stopping.set()

    # -- one pass --------------------------------------------------------------

    def clean_logs(self, logs: Mapping[TopicPartition, Log], high_watermarks: Mapping[
            TopicPartition, int], now_ms: int) -> list[CleanResult]:
        """Clean every compacted log that needs it (a worker thread's job). A log's disk
        error or damage is logged and the others go on."""
        results = []
        listed = False
        for tp, partition_log in logs.items():
            hw = high_watermarks.get(tp)
            if (hw is None or not partition_log.config.compact or partition_log.is_offline
                    or partition_log.is_closed):
                continue
            if tp not in self.first_dirty_offsets:
                # Listed from the first pass on: the audit learns from the checkpoint that
                # this partition is compacted (a follower's log has the leader's gaps).
                self.first_dirty_offsets[tp] = partition_log.log_start_offset
                listed = True
            try:
                result = self.clean_log(tp, partition_log, hw, now_ms)
            except CleaningAborted as e:
                log.info("cleaning %s stopped: %s", tp, e)
                if self._stopping.is_set():
                    break
                continue
            except TidewaterError as e:  # a disk error, a damaged batch: the next pass retries
                log.error("cleaning %s failed: %s", tp, e)
                continue
            if result is not None:
                results.append(result)
        if results or listed:
            self._write_checkpoint(logs)
        return results

    def clean_log(self, tp: TopicPartition, partition_log: Log, high_watermark: int,
                  now_ms: int) -> CleanResult | None:
        """Clean one log if its plan says so; None when it does not need it."""
        if self._seen.setdefault(tp, partition_log) is not partition_log:
            # A new log under the old name (topic recreated): its offsets start over.
            self._seen[tp] = partition_log
            self.first_dirty_offsets.pop(tp, None)
        segments = partition_log.segments()
        truncations = partition_log.truncations
        # Never past the last stable offset: an open transaction may still abort, and
        # its records must not enter the offset map (cleaner_rewrite.py).
        first_unstable = partition_log.first_unstable_offset
        if first_unstable is not None:
            high_watermark = min(high_watermark, first_unstable)
        aborted = AbortedRanges((a.producer_id, a.first_offset, a.last_offset)
                                for a in partition_log.aborted_transactions(0, 2**63 - 1))
        plan = plan_cleaning(
            [SegmentSummary(s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp,
                            s.first_batch_time_ms) for s in segments],
            first_dirty_offset=self.first_dirty_offsets.get(tp, 0),
            high_watermark=high_watermark, recovery_point=partition_log.recovery_point,
            now_ms=now_ms, config=partition_log.config)
        if plan is None:
            return None
        result = CleanResult(tp, plan.first_dirty_offset, plan.clean_end_offset,
                             segments_before=sum(len(g) for g in plan.groups))
        readers: dict[int, _SegmentReader] = {}
        try:
            for segment in segments:
                readers[id(segment)] = _SegmentReader(segment)
            producer_last = self._producer_last_offsets(segments, readers)
            offset_map, plan = self._build_offset_map(segments, plan, readers, result, aborted)
            delete_retention_ms = partition_log.config.delete_retention_ms
            rules = RetainRules(offset_map.offsets, now_ms - delete_retention_ms, producer_last,
                                aborted, TxnPass(aborted, now_ms, delete_retention_ms))
            for group in plan.groups:
                old = [segments[i] for i in group]
                self._clean_group(partition_log, old, truncations, readers, rules, result,
                                  now_ms)
                result.segments_after += 1
        finally:
            for reader in readers.values():
                reader.close()
        self.first_dirty_offsets[tp] = plan.clean_end_offset
        log.info("cleaned %s: offsets %d..%d, %d segments into %d, %d of %d records kept, "
                 "%d bytes read, %d written", tp, plan.first_dirty_offset,
                 plan.clean_end_offset - 1, result.segments_before, result.segments_after,
                 result.filter.records_kept, result.filter.records_read, result.bytes_read,
                 result.bytes_written)
        return result

    # -- steps -------------------------------------------------------------------

    def _producer_last_offsets(self, segments: list[LogSegment],
                               readers: dict[int, _SegmentReader]) -> dict[int, int]:
        """Producer id -> last offset of its last batch in the whole log (headers only)."""
        last: dict[int, int] = {}
        for segment in segments:
            for position, _size, _base, _epoch, _delta, _ts in readers[id(segment)].frames():
                header = read_header(readers[id(segment)].read(position, 61))
                if header.producer_id >= 0:
                    last[header.producer_id] = header.last_offset
        return last

    def _build_offset_map(self, segments: list[LogSegment], plan: CleaningPlan,
                          readers: dict[int, _SegmentReader], result: CleanResult,
                          aborted: AbortedRanges) -> tuple[OffsetMap, CleaningPlan]:
        offset_map = OffsetMap(self.offset_map_entries_max, aborted)
        self._segment_bytes = segments[0].config.segment_bytes
        for i in plan.dirty_segments:
            for data in self._batches(readers[id(segments[i])], result):
                offset_map.add_batch(data, 0, validate_batch(data))
            if offset_map.full and i != plan.dirty_segments[-1]:
                # The dirty section ends here; the rest waits for the next pass.
                end = segments[i + 1].base_offset
                summaries = [SegmentSummary(s.base_offset, s.next_offset, s.size_bytes,
                                            s.max_timestamp) for s in segments[:i + 2]]
                plan = CleaningPlan(plan.first_dirty_offset, end,
                                    group_segments(summaries, self._segment_bytes),
                                    plan.dirty_ratio, plan.dirty_segments[:plan.dirty_segments
                                                                          .index(i) + 1])
                break
        return offset_map, plan

    def _clean_group(self, partition_log: Log, old: list[LogSegment], truncations: int,
                     readers: dict[int, _SegmentReader], rules: RetainRules,
                     result: CleanResult, now_ms: int) -> None:
        directory = partition_log.dir
        cleaned = LogSegment.create(directory, old[0].base_offset, partition_log.config,
                                    CLEANED_SUFFIX)
        swapped = False
        try:
            pending = bytearray()
            entries: list[tuple[int, int, int, int]] = []
            next_offset = old[0].base_offset
            for k, segment in enumerate(old):
                for data, last_of_segment in _with_last(self._batches(readers[id(segment)],
                                                                      result)):
                    header = validate_batch(data)
                    last_of_group = last_of_segment and k == len(old) - 1
                    kept = filter_batch(data, 0, header, rules, result.filter,
                                        keep_empty=last_of_group)
                    if kept is None:
                        continue
                    entries.append((len(pending), len(kept), header.last_offset,
                                    header.max_timestamp))
                    pending += kept
                    next_offset = header.last_offset + 1
                    if len(pending) >= WRITE_CHUNK_BYTES:
                        self._write(cleaned, pending, entries, next_offset, now_ms, result)
                        pending, entries = bytearray(), []
            if pending:
                self._write(cleaned, pending, entries, next_offset, now_ms, result)
            if cleaned.size_bytes == 0:
                raise CleaningAborted(f"cleaned segment {cleaned.log_path} came out empty")
            cleaned.on_become_inactive()
            cleaned.flush()
            self._check_stopping()
            removed_aborts = rules.txn.removed_aborts if rules.txn is not None else set()
            renamed = partition_log.replace_with_cleaned(
                old, cleaned, truncations, lambda new, replaced: swap_in(directory, new, replaced),
                removed_aborts=removed_aborts)
            if renamed is None:
                raise CleaningAborted(f"{partition_log.dir} changed while it was cleaned")
            swapped = True
            fsync_dir(directory)  # step 4 made durable, without the log's lock
            unlink_in_background(renamed, name=f"cleaner-{directory.name}")
        finally:
            # Past the commit point (``.swap``) the files are the log's: recovery finishes it.
            if not swapped and cleaned.log_path.name.endswith(CLEANED_SUFFIX):
                try:
                    cleaned.delete()
                except KafkaStorageError as e:
                    log.warning("cannot remove %s: %s", cleaned.log_path, e)

    def _batches(self, reader: _SegmentReader, result: CleanResult) -> Iterator[bytes]:
        """Every batch of a segment as bytes (CRC-checked by the scan), throttled."""
        for position, size, _base, _epoch, _delta, _ts in reader.frames(validate_crc=True):
            self._check_stopping()
            data = reader.read(position, size)
            result.bytes_read += size
            self._pace(size)
            yield data

    def _write(self, cleaned: LogSegment, data: bytearray,
               entries: list[tuple[int, int, int, int]], next_offset: int, now_ms: int,
               result: CleanResult) -> None:
        self._check_stopping()
        cleaned.append(data, entries, next_offset, now_ms)
        result.bytes_written += len(data)
        self._pace(len(data))

    def _pace(self, n: int) -> None:
        delay = self._throttle.delay_s(n, self._monotonic_s())
        if delay > 0 and self._stopping.wait(delay):
            raise CleaningAborted("the cleaner is stopping")

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise CleaningAborted("the cleaner is stopping")

    def _write_checkpoint(self, logs: Mapping[TopicPartition, Log]) -> None:
        known = {tp: offset for tp, offset in self.first_dirty_offsets.items() if tp in logs}
        self.first_dirty_offsets = known
        try:
            self.checkpoint.write(known)
        except KafkaStorageError as e:
            log.error("cannot write %s: %s", self.checkpoint.path, e)


def _with_last(items: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Each item and whether it is the last one (one item of lookahead, not a list: a
    segment may be a GiB)."""
    previous = None
    for item in items:
        if previous is not None:
            yield previous, False
        previous = item
    if previous is not None:
        yield previous, True


class _SegmentReader:
    """Reads a segment through its own descriptor, up to the size it had when opened: a
    segment renamed (retention) or swapped meanwhile still reads the same bytes."""

    def __init__(self, segment: LogSegment):
        self.path = segment.log_path
        self.size = segment.size_bytes
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise CleaningAborted(f"cannot open {self.path}: {e.strerror}") from e

    def frames(self, *, validate_crc: bool = False) -> Iterator[BatchFrame]:
        return iter_batches_in_file(self.fd, self.path, 0, self.size, validate_crc=validate_crc)

    def read(self, position: int, size: int) -> bytes:
        try:
            data = os.pread(self.fd, size, position)
        except OSError as e:
            raise storage_error("cannot read segment", self.path, e) from e
        if len(data) < size:
            raise CorruptRecordError("segment shorter than when the cleaner began",
                                     position=position, path=str(self.path))
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
