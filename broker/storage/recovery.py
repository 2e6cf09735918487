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
  previous segment's end).
- At the first bad batch the file is cut there and every later segment is
  deleted; each cut is logged as a warning with path, position and bytes
  removed. A trusted segment whose index is missing or insane, or whose tail
  does not check out, is re-validated the same way.
- Leftovers of interrupted operations (``*.tmp``, ``*.deleted``,
  ``*.cleaned``, ``*.swap``) and index files without a ``.log`` are removed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from broker.storage.log_config import LogConfig
from broker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    parse_segment_file_name,
    storage_error,
)
from proto.errors import KafkaStorageError

log = logging.getLogger(__name__)

LEFTOVER_SUFFIXES = (".tmp", ".deleted", ".cleaned", ".swap")


@dataclass
class LoadedSegments:
    segments: list[LogSegment]
    # (epoch, base_offset) at each epoch change, when collect_epochs was asked for.
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)
    bytes_removed: int = 0
    segments_scanned: int = 0


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
        elif suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
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
            if expected_base is not None and base_offset != expected_base:
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
                segment.flush()
                break
            segment.flush()  # writes the rebuilt index files
            expected_base = segment.next_offset
    except BaseException:
        for segment in segments:
            try:
                segment.close()
            except KafkaStorageError:
                pass
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
