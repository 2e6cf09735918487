"""The leader epoch cache of one partition and its ``leader-epoch-checkpoint`` file.

The cache is a sorted list of ``(epoch, start_offset)``: ``start_offset`` is the
first offset written in that epoch. Epochs strictly increase along the list and
start offsets never decrease. The rules (assign, end_offset_for, truncation)
are Kafka's ``LeaderEpochFileCache`` as the project's replication reference
("Leader epoch cache") writes them down.

File format (UTF-8 text, ``\\n`` line ends, Kafka's ``LeaderEpochCheckpointFile``)::

    0          <- version, always 0
    2          <- number of entry lines that follow
    0 0        <- epoch, start_offset; separated by one space
    3 120

An empty (zero-byte) file is an empty cache. A wrong version, a malformed line,
a count mismatch, a negative value or entries out of order is a
``CorruptFileError`` (path and line), so the log can rebuild the cache from the
``partitionLeaderEpoch`` of its batches instead.

Ordering rule: every change is written to the file (tmp, fsync, rename, fsync
dir) before the method returns, so a broker that answered LeaderAndIsr or
acknowledged an append never forgets the epoch after a crash. A change that
leaves the entries the file already holds is not written again.

One exception, Kafka's (``truncateFromEndAsyncFlush``, KAFKA-15046): opening a
log drops the entries starting at or after its end (an epoch with no record
yet, e.g. the leader's own epoch when nothing was written in it) in memory
only, ``truncate_from_end(..., write=False)``. The file keeps them until the
next change, or until the log grows or an epoch is assigned (``write_pending``),
whichever comes first. A crash meanwhile loses nothing: the next opening drops
them again. A restart then writes no file for the usual leader whose epoch
starts at the end: its becoming leader again assigns the entry the file still
holds. Measured: 2 fsynced rewrites per partition at every restart before.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from pathlib import Path

from tidewater.broker.storage.checkpoints import (
    format_checkpoint,
    parse_checkpoint,
    read_file_bytes,
    write_file_atomically,
)
from tidewater.proto.errors import CorruptFileError

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
UNDEFINED_EPOCH_OFFSET = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def _parse_epoch_entry(fields: list[str]) -> tuple[int, int]:
    if len(fields) != 2:
        raise ValueError(f"expected 'epoch start_offset', got {len(fields)} fields")
    epoch_text, start_text = fields
    for text in fields:
        body = text[1:] if text.startswith("-") else text
        if not body.isascii() or not body.isdigit():
            raise ValueError(f"not an integer: {text!r}")
    epoch, start_offset = int(epoch_text), int(start_text)
    if epoch < 0 or start_offset < 0:
        raise ValueError("negative epoch or start offset")
    return epoch, start_offset


def _check_order(entries: list[tuple[int, int]]) -> int | None:
    """Index of the first entry out of order (epoch not above, or start below, the previous)."""
    for i in range(1, len(entries)):
        if entries[i][0] <= entries[i - 1][0] or entries[i][1] < entries[i - 1][1]:
            return i
    return None


def read_epoch_checkpoint(path: Path) -> list[tuple[int, int]]:
    """Entries of a ``leader-epoch-checkpoint`` file; [] when missing or empty.

    Raises CorruptFileError (with path and line) or KafkaStorageError (I/O error).
    """
    data = read_file_bytes(path)
    if data is None:
        return []
    entries = parse_checkpoint(data, path, _parse_epoch_entry)
    bad = _check_order(entries)
    if bad is not None:
        raise CorruptFileError(
            f"entry {entries[bad]} out of order after {entries[bad - 1]}",
            path=str(path), line=bad + 3,
        )
    return entries


def format_epoch_checkpoint(entries: Iterable[tuple[int, int]]) -> bytes:
    return format_checkpoint([f"{epoch} {start_offset}" for epoch, start_offset in entries])


class LeaderEpochCache:
    """``(epoch, start_offset)`` entries of one partition, persisted on every change.

    ``checkpoint_path=None`` keeps the cache in memory only (the simulation).
    Methods are thread-safe: the appending task and fetch handlers may share it.
    """

    def __init__(self, checkpoint_path: Path | None, entries: Iterable[tuple[int, int]] = ()):
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
        self._entries: list[tuple[int, int]] = [(int(e), int(s)) for e, s in entries]
        if any(e < 0 or s < 0 for e, s in self._entries):
            raise ValueError(f"negative epoch or start offset in {self._entries}")
        if _check_order(self._entries) is not None:
            raise ValueError(f"epoch entries out of order: {self._entries}")
        self._lock = threading.RLock()
        # The entries the file holds (fsynced), when known: a change to them is not
        # written again. None: unknown (a new cache, a missing or empty file).
        self._file_entries: list[tuple[int, int]] | None = None
        # The file holds entries dropped from memory by truncate_from_end(write=False).
        self.write_pending = False

    @classmethod
    def load(cls, checkpoint_path: Path) -> LeaderEpochCache:
        """The cache stored at ``checkpoint_path`` (empty if the file is missing).

        Raises CorruptFileError when the file is damaged: the caller decides
        whether to rebuild from the log's batches.
        """
        cache = cls(checkpoint_path, read_epoch_checkpoint(checkpoint_path))
        if cache._entries:
            cache._file_entries = list(cache._entries)
        return cache

    # -- queries -----------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_entry(self) -> tuple[int, int] | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    @property
    def latest_epoch(self) -> int:
        # Read on every append: no lock. Changes replace the list whole (_replace),
        # so one read of the attribute sees a consistent list.
        entries = self._entries
        return entries[-1][0] if entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def epoch_start_offset(self, epoch: int) -> int:
        """First offset written in ``epoch``; -1 if the cache has no such epoch."""
        with self._lock:
            i = bisect.bisect_left(self._entries, (epoch, -1))
            if i < len(self._entries) and self._entries[i][0] == epoch:
                return self._entries[i][1]
            return UNDEFINED_OFFSET

    def epoch_for_offset(self, offset: int) -> int:
        """Epoch of the record at ``offset`` by the cache (-1 if before the first entry)."""
        with self._lock:
            epoch = UNDEFINED_EPOCH
            for entry_epoch, start_offset in self._entries:
                if start_offset > offset:
                    break
                epoch = entry_epoch
            return epoch

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)``: the largest epoch <= requested and where it ended.

        The end offset is the start of the first epoch above ``requested_epoch``,
        or ``log_end_offset`` when ``requested_epoch`` is the latest epoch.
        ``(-1, -1)`` when requested is -1 or no epoch above it is known.
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH:
                return UNDEFINED_EPOCH_OFFSET
            if self._entries and requested_epoch == self._entries[-1][0]:
                return requested_epoch, log_end_offset
            # First entry with an epoch above the requested one.
            higher = bisect.bisect_right(self._entries, (requested_epoch, float("inf")))
            if higher == len(self._entries):
                return UNDEFINED_EPOCH_OFFSET
            end_offset = self._entries[higher][1]
            if higher == 0:
                # The requested epoch predates everything we know: it ended where ours begin.
                return requested_epoch, end_offset
            return self._entries[higher - 1][0], end_offset

    # -- changes -----------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; fsynced before returning.

        Ignored when ``epoch`` is the latest epoch and ``start_offset`` is not
        below its start (an epoch keeps its first start offset). Otherwise every
        entry, newest first, whose epoch >= ``epoch`` or whose start >=
        ``start_offset`` is removed before the new entry is appended.
        Negative values are a caller bug (ValueError): batches with no epoch
        (-1) must not be assigned.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        with self._lock:
            if self._entries:
                latest_epoch, latest_start = self._entries[-1]
                if epoch == latest_epoch and start_offset >= latest_start:
                    self.write_if_pending()  # the epoch is durable when this returns
                    return
            keep = len(self._entries)
            while keep and (self._entries[keep - 1][0] >= epoch
                            or self._entries[keep - 1][1] >= start_offset):
                keep -= 1
            self._replace([*self._entries[:keep], (epoch, start_offset)])

    def truncate_from_end(self, offset: int, *, write: bool = True) -> None:
        """Drop entries starting at or after ``offset`` (log truncated to ``offset``).

        ``write=False`` (opening a log at its end ``offset``): in memory only, the file
        keeps them until ``write_if_pending`` or the next change (module docstring)."""
        if offset < 0:
            return
        with self._lock:
            keep = len(self._entries)
            while keep and self._entries[keep - 1][1] >= offset:
                keep -= 1
            if keep == len(self._entries):
                return
            if write or self.checkpoint_path is None:
                self._replace(self._entries[:keep])
            else:
                self._entries = self._entries[:keep]
                self.write_pending = True

    def write_if_pending(self) -> None:
        """Write the entries if the file still holds ones dropped by
        ``truncate_from_end(write=False)``: before the log grows past them."""
        if not self.write_pending:
            return
        with self._lock:
            if self.write_pending:
                self._replace(list(self._entries))

    def truncate_from_start(self, offset: int) -> None:
        """The log now starts at ``offset``: drop entries starting at or before it,
        keeping the last dropped one with its start moved up to ``offset``."""
        if offset < 0:
            return
        with self._lock:
            dropped = 0
            while dropped < len(self._entries) and self._entries[dropped][1] <= offset:
                dropped += 1
            if dropped == 0:
                return
            last_dropped_epoch = self._entries[dropped - 1][0]
            new_entries = [(last_dropped_epoch, offset), *self._entries[dropped:]]
            if new_entries != self._entries:
                self._replace(new_entries)

    def clear(self) -> None:
        """Forget every entry (the log was deleted or fully truncated)."""
        with self._lock:
            self._replace([])

    def _replace(self, new_entries: list[tuple[int, int]]) -> None:
        # File first: if the write fails (KafkaStorageError) memory and disk both
        # keep the old entries.
        if self.checkpoint_path is not None and new_entries != self._file_entries:
            write_file_atomically(self.checkpoint_path, format_epoch_checkpoint(new_entries))
            self._file_entries = list(new_entries)
        self._entries = new_entries
        self.write_pending = False

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.checkpoint_path}, {self._entries})"
