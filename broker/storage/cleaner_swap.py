"""Swapping a cleaned segment in for the segments it replaces, atomically across a crash.

Kafka's suffix protocol (``LogCleaner`` / ``UnifiedLog.replaceSegments`` / ``LogLoader``).
A cleaned group of segments ``[B, E)`` (B: its first segment's base offset, E: the base
of the segment after the group) becomes one segment ``<B>``. The cleaned segment always
ends at E (the cleaner keeps the group's last batch, empty if need be:
``cleaner_rewrite.py``), so its own batches say which old segments it replaces: every
``.log`` whose base offset lies in ``[B, E)``.

Files and steps (``<B>`` = 20-digit base offset)::

    1. write  <B>.log.cleaned, <B>.index.cleaned, <B>.timeindex.cleaned; fsync all three
    2. rename <B>.index.cleaned     -> <B>.index.swap
              <B>.timeindex.cleaned -> <B>.timeindex.swap
              <B>.log.cleaned       -> <B>.log.swap          <- the commit point
       fsync the directory
    3. rename every old segment's three files -> <name>.deleted
    4. rename <B>.index.swap -> <B>.index, <B>.timeindex.swap -> <B>.timeindex,
              <B>.log.swap   -> <B>.log
       then, without the lock: fsync the directory; unlink the .deleted files

Steps 2-4 run under the log's lock (readers never see a half-swapped list); the
directory fsync after step 4 does not (appends wait on that lock): a crash before it
leaves some prefix of the renames, which recovery finishes like any other.
Recovery on start-up (``complete_interrupted_swaps``, before the segments are
listed), for a crash at any point:

- ``<B>.log.swap`` exists (the commit point was passed): its batches are scanned to
  find E; every ``.log`` (and its index files) with a base offset in ``[B, E)`` is
  removed, then the ``.swap`` files are renamed to their plain names (an index file
  missing after that is rebuilt from the ``.log`` by the usual recovery).
- otherwise the swap never happened: ``.cleaned`` files and any ``.swap`` index file
  are leftovers, removed with the ``.deleted`` ones (``recovery.LEFTOVER_SUFFIXES``),
  and the old segments, never touched before step 3, are the log.

Either way the log holds the old segments or the new one, never a mix and never
neither.

The marker ``.compacted`` (an empty file in the partition directory) says the log is
compacted and may have offset gaps. It is made durable (file and directory fsynced)
as soon as a log is opened or configured with ``cleanup.policy=compact``, before any
gap can reach it (its own cleaner's swap, or a follower append from a compacted
leader). A broker opens its logs before it learns their topic configs: recovery then
takes a log with the marker for a compacted one, so it never cuts the log at a gap. The epoch checkpoint is not touched: compaction changes no batch's epoch or
offsets (``recovery._epoch_cache_matches_log`` accepts removed batches in a
compacted log).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    fsync_dir,
    parse_segment_file_name,
    segment_file_name,
    storage_error,
)

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
COMPACTED_MARKER = ".compacted"


def is_marked_compacted(directory: Path) -> bool:
    return (directory / COMPACTED_MARKER).exists()


def mark_compacted(directory: Path) -> None:
    """Create the ``.compacted`` marker, durably (no-op when it exists)."""
    path = directory / COMPACTED_MARKER
    if path.exists():
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise storage_error("cannot create the compacted marker", path, e) from e
    fsync_dir(directory)


def swap_in(directory: Path, cleaned: LogSegment, old: Sequence[LogSegment]) -> list[Path]:
    """Steps 2-4 (module docstring) for a ``cleaned`` segment written and fsynced under
    ``.cleaned`` names; the caller holds the log's lock. Returns the old files, renamed
    ``.deleted``, for the caller to unlink."""
    cleaned.rename_files(SWAP_SUFFIX)
    fsync_dir(directory)
    renamed: list[Path] = []
    for segment in old:
        renamed += segment.rename_for_deletion()
    cleaned.rename_files("")
    return renamed  # the caller fsyncs the directory once it released the lock


def complete_interrupted_swaps(directory: Path, config: LogConfig) -> int:
    """Finish every swap whose commit point a crash left behind (module docstring);
    returns how many. Leftover ``.cleaned`` / ``.swap`` index files are removed later
    with the other leftovers."""
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise storage_error("cannot list log directory", directory, e) from e
    swaps = sorted(parsed[0] for name in names
                   if name.endswith(LOG_SUFFIX + SWAP_SUFFIX)
                   and (parsed := parse_segment_file_name(name)) is not None)
    if not swaps:
        return 0
    log_bases = sorted(parsed[0] for name in names
                       if (parsed := parse_segment_file_name(name)) is not None
                       and parsed[1] == LOG_SUFFIX)
    # The swap file holds gaps (removed batches): scan it as the compacted log it is.
    compacted = dataclasses.replace(config, cleanup_policy="compact")
    for base in swaps:
        segment = LogSegment.open_existing(directory, base, compacted, SWAP_SUFFIX)
        try:
            scan = segment.scan(base, validate_crc=True)
            if scan.error is not None:
                log.warning("recovery: %s is damaged at position %d (%s); it replaces the "
                            "segments up to offset %d only", segment.log_path, scan.valid_bytes,
                            scan.error.reason, scan.next_offset)
            end = scan.next_offset
            for old_base in log_bases:
                if base <= old_base < end:
                    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                        _unlink(directory / segment_file_name(old_base, suffix))
            segment.rename_files("")
        finally:
            segment.close()
        log.warning("recovery: completed the interrupted swap of cleaned segment %s "
                    "(offsets %d..%d)", segment.log_path, base, end - 1)
    fsync_dir(directory)
    return len(swaps)


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise storage_error("cannot remove replaced segment file", path, e) from e
