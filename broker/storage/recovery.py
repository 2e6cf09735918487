"""Opening a partition directory: find the segments, trust or re-validate them, cut.

Directory layout (one per partition replica, ``<topic>-<partition>``)::

    00000000000000000000.log        batches, see segment.py
    00000000000000000000.index      sparse offset index, see index.py
    00000000000000000000.timeindex  time index, see index.py
    00000000000000004096.log        next segment: its name is its first offset
    ...
    leader-epoch-checkpoint         see epoch_cache.py

Recovery rules (Kafka's ``LogLoader``):

- Segments below the recovery point (flushed before the crash), and every
  segment after a clean shutdown, are trusted: their index files are loaded
  and only the batches after the last index entry are CRC-checked.
- From the segment holding the recovery point on (no clean shutdown), every
  batch is re-validated: framing, magic, CRC32C, and offsets contiguous
  (a batch starts at the previous one's last offset + 1, each segment at the
  previous segment's end; in a compacted log anywhere above: ``cleaner.py``).
- At the first bad batch the file is cut there and every later segment is
  deleted; each cut is logged as a warning with path, position and bytes
  removed. A trusted segment whose index is missing or insane, or whose tail
  does not check out, is re-validated the same way.
- A log with the ``.compacted`` marker is recovered as a compacted one (offset
  gaps are no damage there) whatever config it is opened with: a broker opens
  its logs before it learns their topic configs (``cleaner_swap.py``).
- A cleaner's swap interrupted after its commit point (a ``<base>.log.swap``
  file) is completed first (``cleaner_swap.py``). Then leftovers of interrupted
  operations (``*.tmp``, ``*.deleted``, ``*.cleaned``, ``*.swap``) and index
  files without a ``.log`` are removed.
- The opened log's recovery point is its end: recovered segments are fsynced
  (the .log and both index files; an index file that already holds exactly the
  rebuilt entries is kept and only fsynced, not cut and rewritten), and after an
  unclean shutdown the directory too (a roll does not fsync it, so
  after a process crash a new segment's name may not be on disk yet).
- The epoch checkpoint is rebuilt from the batches' partitionLeaderEpoch
  (header scan, no CRC) when it is missing, empty, corrupt, or disagrees with
  the batches (an entry must start a batch of its epoch that follows a batch of
  another epoch); then it is truncated to the log's end and start offsets.
- The checkpointed log start offset is used only if it is a segment's base
  offset (retention moves it only there), else the first segment's base.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.storage.cleaner_swap import (
    complete_interrupted_swaps,
    is_marked_compacted,
    mark_compacted,
)
from tidewater.broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    fsync_dir,
    parse_segment_file_name,
    storage_error,
)
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    InvariantViolation,
    KafkaStorageError,
)

log = logging.getLogger(__name__)

LEFTOVER_SUFFIXES = (".tmp", DELETED_SUFFIX, ".cleaned", ".swap")


@dataclass
class LoadedSegments:
    segments: list[LogSegment]
    # (epoch, base_offset) at each epoch change, when collect_epochs was asked for.
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)
    bytes_removed: int = 0
    segments_scanned: int = 0


@dataclass
class OpenedLog:
    segments: list[LogSegment]  # at least one; the last is the active segment
    leader_epoch_cache: LeaderEpochCache
    log_start_offset: int
    config: LogConfig  # the caller's, compacted when the log's marker says so


def open_log_dir(directory: Path, config: LogConfig, *, recovery_point: int,
                 log_start_offset: int | None, had_clean_shutdown: bool) -> OpenedLog:
    """Open (creating if needed) a partition directory: segments, epoch cache, start."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error("cannot create log directory", directory, e) from e
    if config.compact:
        mark_compacted(directory)  # before any gap can reach the log (cleaner_swap.py)
    elif is_marked_compacted(directory):
        # Opened before the topic's configs are known: a compacted log stays one.
        config = dataclasses.replace(config, cleanup_policy="compact")
    checkpoint_path = directory / LEADER_EPOCH_CHECKPOINT
    cache: LeaderEpochCache | None
    try:
        cache = LeaderEpochCache.load(checkpoint_path)
        # Missing or empty while batches exist: rebuild from the batches.
        rebuild_epochs = not cache.entries()
    except CorruptFileError as e:
        log.warning("%s; rebuilding it from the batches' partitionLeaderEpoch", e)
        cache, rebuild_epochs = None, True
    loaded = load_segments(directory, config, recovery_point=recovery_point,
                           had_clean_shutdown=had_clean_shutdown, collect_epochs=rebuild_epochs)
    segments = loaded.segments
    try:
        if not segments:
            start = log_start_offset if log_start_offset is not None else 0
            segments.append(LogSegment.create(directory, max(0, start), config))
            fsync_dir(directory)
        elif not had_clean_shutdown:
            # The log opens with its recovery point at the end: after a process crash
            # a rolled segment's name may still be only in the page cache (a roll
            # does not fsync the directory), and so may the cuts above.
            fsync_dir(directory)
        log_end_offset = segments[-1].next_offset
        start = _choose_log_start_offset(segments, log_start_offset)
        if not rebuild_epochs:
            if cache is None:
                raise InvariantViolation("no epoch cache, yet not rebuilding it")
            if not _epoch_cache_matches_log(cache, segments, start, compacted=config.compact):
                log.warning("%s does not match the batches' partitionLeaderEpoch; rebuilding it",
                            checkpoint_path)
                rebuild_epochs = True
                loaded.epoch_starts = [e for s in segments for e in s.epoch_starts()]
        if rebuild_epochs:
            cache = _rebuild_epoch_cache(checkpoint_path, loaded.epoch_starts)
        if cache is None:
            raise InvariantViolation("no epoch cache after rebuilding it")
        cache.truncate_from_end(log_end_offset, write=False)  # epoch_cache.py: Kafka's async flush
        cache.truncate_from_start(start)
    except BaseException:
        close_segments_quietly(segments)
        raise
    return OpenedLog(segments, cache, start, config)


def _choose_log_start_offset(segments: list[LogSegment], checkpointed: int | None) -> int:
    """The checkpointed log start offset if it lies in [first segment's base, LEO]
    (retention moves it to a segment's base, DeleteRecords anywhere up to the HW), else
    the first segment's base offset (Kafka's max(checkpoint, first base))."""
    first = segments[0].base_offset
    if checkpointed is None or checkpointed <= first:
        return first
    if checkpointed <= segments[-1].next_offset:
        return checkpointed
    log.warning("log start offset %d from the checkpoint is past the log end %d of %s; "
                "using %d", checkpointed, segments[-1].next_offset, segments[0].directory,
                first)
    return first


def _epoch_cache_matches_log(cache: LeaderEpochCache, segments: list[LogSegment],
                             log_start_offset: int, *, compacted: bool = False) -> bool:
    """Each entry (epoch, start) below the LEO must start a batch of that epoch, and the
    batch before it (if kept) must be of the entry before's epoch; the log's last batch
    must be of the epoch of the last entry that starts at or below it (a damaged start
    offset at or past the LEO, which opening drops, would otherwise lose that epoch).
    Cheap: a few header reads.

    In a compacted log the cleaner may have removed the batch at ``start`` and those
    before it: the first batch kept at or after ``start`` must then be of that epoch or
    a later one (the cleaner never changes an epoch; the cache keeps Kafka's entries)."""
    bases = [s.base_offset for s in segments]
    log_end_offset = segments[-1].next_offset

    def batch_at(offset: int) -> tuple[int, int] | None:
        """(base_offset, partitionLeaderEpoch) of the batch holding ``offset``."""
        i = bisect_right(bases, offset) - 1
        if i < 0:
            return None
        found = segments[i].locate(offset)
        if found is None:
            return None
        return found[1], segments[i].read_epoch_at(found[0])

    try:
        last_epoch: int | None = None  # of the last entry starting below the LEO
        for epoch, start in cache.entries():
            if start >= log_end_offset:
                continue
            previous_epoch, last_epoch = last_epoch, epoch
            if start < log_start_offset:
                continue  # truncate_from_start fixes these
            at = batch_at(start)
            if start == log_start_offset and at is not None and at[1] == epoch:
                continue  # DeleteRecords started the log inside this epoch's batch
            if compacted:
                if at is not None and (at[0] < start or at[1] < epoch):
                    return False
                continue
            if at is None or at != (start, epoch):
                return False
            if start > log_start_offset:
                before = batch_at(start - 1)
                if before is None or before[1] == epoch or (
                        previous_epoch is not None and before[1] != previous_epoch):
                    return False
        if not compacted and log_end_offset > log_start_offset:
            last = batch_at(log_end_offset - 1)
            if last is not None and last[1] >= 0 and last[1] != last_epoch:
                return False
    except CorruptRecordError:
        return False
    return True


def _rebuild_epoch_cache(checkpoint_path: Path,
                         epoch_starts: list[tuple[int, int]]) -> LeaderEpochCache:
    cache = LeaderEpochCache(checkpoint_path)
    cache.clear()  # replaces a corrupt file even when no batch has an epoch
    for epoch, base_offset in epoch_starts:
        if epoch >= 0:
            cache.assign(epoch, base_offset)
    if cache.entries():
        log.info("rebuilt %s: %s", checkpoint_path, cache.entries())
    return cache



def list_segment_base_offsets(directory: Path) -> list[int]:
    """Base offsets of the ``.log`` files, sorted; removes leftovers and orphan indexes."""
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise storage_error("cannot list log directory", directory, e) from e
    log_bases: set[int] = set()
    index_files: list[tuple[int, str]] = []
    for name in names:
        if name.endswith(LEFTOVER_SUFFIXES):
            _remove(directory / name, "leftover of an interrupted operation")
            continue
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        base_offset, suffix = parsed
        if suffix == LOG_SUFFIX:
            log_bases.add(base_offset)
        elif suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            index_files.append((base_offset, name))
    for base_offset, name in index_files:
        if base_offset not in log_bases:
            _remove(directory / name, "index without its segment")
    return sorted(log_bases)


def _remove(path: Path, why: str) -> None:
    log.info("removing %s (%s)", path, why)
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise storage_error("cannot remove file", path, e) from e


def load_segments(directory: Path, config: LogConfig, *, recovery_point: int,
                  had_clean_shutdown: bool, collect_epochs: bool) -> LoadedSegments:
    """Open every segment of ``directory``; recover (validate and cut) as the rules say."""
    complete_interrupted_swaps(directory, config)  # before the leftovers go
    bases = list_segment_base_offsets(directory)
    if had_clean_shutdown or not bases:
        recover_from = None
    else:
        # The segment holding the recovery point: everything from it on may be torn.
        below = [b for b in bases if b <= recovery_point]
        recover_from = below[-1] if below else bases[0]
    loaded = LoadedSegments([])
    segments = loaded.segments
    expected_base: int | None = None
    try:
        for i, base_offset in enumerate(bases):
            if expected_base is not None and base_offset != expected_base and not (
                    config.compact and base_offset > expected_base):
                log.warning("recovery: %s starts at offset %d but the log before it ends at %d",
                            directory / f"{base_offset:020d}{LOG_SUFFIX}", base_offset,
                            expected_base)
                loaded.bytes_removed += _delete_later_segments(directory, config, bases[i:])
                break
            segment = LogSegment.open_existing(directory, base_offset, config)
            segments.append(segment)
            must_scan = recover_from is not None and base_offset >= recover_from
            if not must_scan and segment.load_trusted():
                if collect_epochs:
                    loaded.epoch_starts.extend(segment.epoch_starts())
                expected_base = segment.next_offset
                continue
            loaded.segments_scanned += 1
            scan = segment.scan(base_offset, validate_crc=True)
            loaded.epoch_starts.extend(scan.epoch_starts)
            if scan.error is not None:
                removed = segment.truncate_to_position(scan.valid_bytes, scan.next_offset)
                loaded.bytes_removed += removed
                log.warning("recovery: cut %s at position %d, %d bytes removed: %s",
                            segment.log_path, scan.valid_bytes, removed, scan.error.reason)
                loaded.bytes_removed += _delete_later_segments(directory, config, bases[i + 1:])
                segment.mark_data_unsynced()
                segment.flush()
                break
            # The rebuilt index files: rewritten only where they differ from the files
            # (the .log and every index file are fsynced either way).
            segment.index.adopt_matching_file()
            segment.time_index.adopt_matching_file()
            segment.mark_data_unsynced()
            segment.flush()
            expected_base = segment.next_offset
    except BaseException:
        close_segments_quietly(segments)
        raise
    return loaded


def _delete_later_segments(directory: Path, config: LogConfig, bases: list[int]) -> int:
    removed = 0
    for base_offset in bases:
        segment = LogSegment.open_existing(directory, base_offset, config)
        size = segment.size_bytes
        segment.delete()
        removed += size
        log.warning("recovery: deleted %s (%d bytes) after the cut", segment.log_path, size)
    return removed


def close_segments_quietly(segments: Iterable[LogSegment]) -> None:
    """Close every segment, ignoring storage errors: the caller is already failing or deleting."""
    for segment in segments:
        try:
            segment.close()
        except KafkaStorageError:
            pass
