"""Sparse offset index and time index of one log segment (Kafka's formats).

``<base>.index`` holds 8-byte entries, big-endian::

    offset  size  field
    0       4     relative offset   int32  (absolute offset - segment base offset)
    4       4     position          int32  (byte position of a batch in the .log)

``<base>.timeindex`` holds 12-byte entries, big-endian::

    0       8     timestamp         int64  (max timestamp seen in the segment so far)
    8       4     relative offset   int32  (last offset of the batch that reached it)

As in Kafka, an offset-index entry pairs the LAST offset of a batch with the
position where that batch STARTS, and one is added after every
``index.interval.bytes`` of appended data, so a lookup lands at most one
interval before the wanted batch. Entries strictly increase in both fields.
The time index gets an entry when the segment's max timestamp grows (at the
same interval) and once more when the segment stops being active.

Entries live in memory (``array``) and are written to the files when the
segment is flushed with its indexes (roll, checkpoint, close): only the new
tail is appended, a truncation cuts the file. Inactive segments drop their
entries from memory (``unload``) and load them again when a read needs them. The files carry
exactly the entries (Kafka trims its preallocated files to that on close), so
Kafka's tools read them. A file that fails the sanity check (size not a
multiple of the entry, entries not increasing, position past the segment) is
reported as CorruptFileError and the segment rebuilds it from the .log.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from array import array
from bisect import bisect_right
from pathlib import Path

from tidewater.proto.errors import CorruptFileError, KafkaStorageError

OFFSET_INDEX_ENTRY = struct.Struct(">ii")
TIME_INDEX_ENTRY = struct.Struct(">qi")
assert OFFSET_INDEX_ENTRY.size == 8
assert TIME_INDEX_ENTRY.size == 12
RELATIVE_OFFSET_MAX = (1 << 31) - 1
_LITTLE_ENDIAN = sys.byteorder == "little"


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read index: {e.strerror}", path=str(path)) from e


class IndexWrite:
    """One flush of an index file, taken under the owner's lock (``IndexFile.snapshot``),
    written and fsynced without it (``write``), recorded under it again (``commit``)."""

    __slots__ = ("start", "data", "entries", "generation", "writes_before", "written",
                 "synced_writes")

    def __init__(self, start: int, data: bytes | None, entries: int, generation: int,
                 writes_before: int):
        self.start = start  # first entry in data; the file is cut there first
        self.data = data  # entries [start, entries) encoded; None: only fsync the file
        self.entries = entries
        self.generation = generation
        self.writes_before = writes_before  # file writes done when the snapshot was taken
        self.written = -1  # the number of this write, -1 if the file was not written
        self.synced_writes = 0  # every write up to this number is durable after ``write``


class IndexFile:
    """Incremental writer: the file holds entries [0, _clean_entries) exactly.

    A flush is three steps so the slow part needs no lock of the owner's (the
    log's lock, which appends on the event loop wait for): ``snapshot`` encodes the
    entries not yet in the file (owner's lock held), ``write`` writes and fsyncs
    them (``_file_lock`` only, which orders the writers of the file), ``commit``
    records the result (owner's lock held). A snapshot that another write or a
    truncation overtook is not written, or leaves the file marked for a rewrite.
    """

    entry_size: int

    def __init__(self, path: Path, base_offset: int, max_entries: int):
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_entries)
        self._clean_entries = 0  # entries known equal on disk and in memory
        self._file_entries = -1  # entries the file holds; -1: unknown (rewrite it)
        self._generation = 0  # truncations and resets of the entries
        self._file_lock = threading.Lock()
        self._retired = False  # the segment is closed: its path may be gone or reused
        # Writes to the file (counted under _file_lock), and how many an fsync made durable.
        self._writes = self._synced_writes = 0

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_entries  # subclasses: the same without __len__

    @property
    def is_dirty(self) -> bool:
        return self._file_entries != len(self) or self._clean_entries != len(self)

    @property
    def needs_sync(self) -> bool:
        """The file was written since its last fsync."""
        return self._synced_writes != self._writes

    def _encode(self, start: int) -> bytes:
        raise NotImplementedError

    def flush(self) -> None:
        """Write the entries not yet on disk (cutting a longer file first) and fsync."""
        job = self.snapshot()
        if job is not None:
            self.write(job, newest=True)
            self.commit(job)

    def create_empty(self) -> None:
        """Create (or empty) the file for a new segment, without fsync; the caller
        fsyncs the directory. Lost in a crash, it is rebuilt when the log opens."""
        if len(self):
            raise AssertionError(f"creating {self.path} for an index with entries")
        try:
            with self._file_lock:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        except OSError as e:
            raise KafkaStorageError(f"cannot create index: {e.strerror}", path=str(self.path)) from e
        self._clean_entries = self._file_entries = 0

    def snapshot(self) -> IndexWrite | None:
        """What a flush must write and fsync (owner's lock held); None if nothing."""
        if self.is_dirty:
            start = self._clean_entries if self._file_entries >= 0 else 0
            return IndexWrite(start, self._encode(start), len(self), self._generation,
                              self._writes)
        if self.needs_sync:
            return IndexWrite(0, None, len(self), self._generation, self._writes)
        return None

    def write(self, job: IndexWrite, *, newest: bool = False) -> None:
        """Write ``job``'s entries, unless overtaken, then fsync (no owner's lock needed).

        ``newest``: the owner's lock has been held since the snapshot, so no entry
        changed and the job is written even if an unlocked job wrote the file after
        the snapshot (its entries are a prefix of these; the cut at ``start`` drops
        whatever it wrote past them)."""
        try:
            with self._file_lock:
                if self._retired:
                    return  # writing would recreate a deleted file, or another segment's
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    if job.data is not None and (newest or (
                            job.writes_before == self._writes
                            and job.generation == self._generation)):
                        os.ftruncate(fd, job.start * self.entry_size)
                        view = memoryview(job.data)
                        position = job.start * self.entry_size
                        while view:
                            written = os.pwrite(fd, view, position)
                            view = view[written:]
                            position += written
                        self._writes += 1
                        job.written = self._writes
                    # Every write so far is complete: the fsync below makes them durable.
                    job.synced_writes = self._writes
                except BaseException:
                    os.close(fd)
                    raise
            try:
                os.fsync(fd)  # outside _file_lock: a later writer need not wait for it
            finally:
                os.close(fd)
        except OSError as e:
            raise KafkaStorageError(f"cannot write index: {e.strerror}", path=str(self.path)) from e

    def retire(self) -> None:
        """No more writes (the segment closes): an unlocked ``write`` still pending
        must not touch the path, which a deletion frees for a new segment's file."""
        with self._file_lock:
            self._retired = True

    def commit(self, job: IndexWrite) -> None:
        """Record what ``write(job)`` did (owner's lock held)."""
        self._synced_writes = max(self._synced_writes, job.synced_writes)
        if job.written == -1:
            return
        if job.generation != self._generation:
            self._file_entries = -1  # written from entries cut meanwhile: rewrite it all
        elif job.written == self._writes:  # nobody wrote the file since: it holds the job
            self._clean_entries = self._file_entries = job.entries

    def delete_file(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            raise KafkaStorageError(f"cannot delete index: {e.strerror}", path=str(self.path)) from e
        self._clean_entries = 0
        self._file_entries = -1
        self._synced_writes = self._writes  # nothing left to fsync in a file that is gone

    def rename_to(self, path: Path) -> None:
        if self.path.exists():
            os.rename(self.path, path)
        self.path = path

    def adopt_matching_file(self) -> bool:
        """After a rebuild (``reset``) while opening: if the file already holds exactly
        these entries (a killed process, not a crashed machine, leaves it so), take it as
        written, so the next flush only fsyncs it instead of cutting and rewriting it
        (measured: the cut and rewrite of 120 index files was most of a 60-log
        recovery). Its pages may still be unwritten, so it counts as one write not yet
        fsynced. Returns whether the file matched."""
        data = _read_file(self.path)
        if data is None or data != self._encode(0):
            return False
        with self._file_lock:
            self._writes += 1
        self._clean_entries = self._file_entries = len(self)
        return True

    def unload(self) -> None:
        """Forget the entries (the file holds them all); ``load`` brings them back."""
        if self.is_dirty:
            raise AssertionError(f"unloading {self.path} with unwritten entries")
        self._clear()
        self._clean_entries = self._file_entries = 0

    def _clear(self) -> None:
        raise NotImplementedError

    def _mark_truncated(self, entries: int) -> None:
        self._clean_entries = min(self._clean_entries, entries)
        self._generation += 1

    def _corrupt(self, why: str) -> CorruptFileError:
        return CorruptFileError(f"corrupt index ({why})", path=str(self.path))


class OffsetIndex(IndexFile):
    entry_size = OFFSET_INDEX_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_entries: int):
        super().__init__(path, base_offset, max_entries)
        self._relative_offsets = array("i")
        self._positions = array("i")

    def __len__(self) -> int:
        return len(self._relative_offsets)

    @property
    def is_full(self) -> bool:
        return len(self._relative_offsets) >= self.max_entries

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if self._relative_offsets and relative <= self._relative_offsets[-1]:
            raise AssertionError(f"index entry {offset} not above the last one")
        self._relative_offsets.append(relative)
        self._positions.append(position)

    @property
    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, (base_offset, 0) when empty."""
        if not self._relative_offsets:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[-1], self._positions[-1]

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """Largest entry with offset <= target: (offset, position); (base_offset, 0) if none."""
        i = bisect_right(self._relative_offsets, target_offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[i - 1], self._positions[i - 1]

    def position_at_or_below(self, position: int) -> int:
        """Largest indexed batch start <= ``position`` (0 if none): every batch before
        it ends there, so a read up to it returns whole batches without a scan."""
        i = bisect_right(self._positions, position)
        return self._positions[i - 1] if i else 0

    def entry(self, i: int) -> tuple[int, int]:
        return self.base_offset + self._relative_offsets[i], self._positions[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose offset >= ``offset``."""
        keep = bisect_right(self._relative_offsets, offset - self.base_offset - 1)
        del self._relative_offsets[keep:]
        del self._positions[keep:]
        self._mark_truncated(keep)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries for batches at or after byte ``position``."""
        keep = bisect_right(self._positions, position - 1)
        del self._relative_offsets[keep:]
        del self._positions[keep:]
        self._mark_truncated(keep)

    def _clear(self) -> None:
        self._relative_offsets, self._positions = array("i"), array("i")

    def reset(self, entries: list[tuple[int, int]]) -> None:
        self._relative_offsets = array("i", (o - self.base_offset for o, _ in entries))
        self._positions = array("i", (p for _, p in entries))
        self._mark_truncated(0)

    def _encode(self, start: int) -> bytes:
        pairs = array("i", bytes(8 * (len(self) - start)))
        pairs[0::2] = self._relative_offsets[start:]
        pairs[1::2] = self._positions[start:]
        if _LITTLE_ENDIAN:
            pairs.byteswap()
        return pairs.tobytes()

    def load(self, segment_size: int) -> bool:
        """Read the file; False if it does not exist. CorruptFileError if insane."""
        data = _read_file(self.path)
        if data is None:
            return False
        if len(data) % self.entry_size:
            raise self._corrupt(f"size {len(data)} is not a multiple of {self.entry_size}")
        pairs = array("i", data)
        if _LITTLE_ENDIAN:
            pairs.byteswap()
        relative_offsets, positions = pairs[0::2], pairs[1::2]
        previous_offset, previous_position = -1, -1
        for relative, position in zip(relative_offsets, positions, strict=True):
            if relative <= previous_offset or position <= previous_position:
                raise self._corrupt("entries not strictly increasing")
            previous_offset, previous_position = relative, position
        if positions and positions[-1] >= segment_size:
            raise self._corrupt(f"position {positions[-1]} beyond segment size {segment_size}")
        self._relative_offsets, self._positions = relative_offsets, positions
        self._clean_entries = self._file_entries = len(self)
        return True


class TimeIndex(IndexFile):
    entry_size = TIME_INDEX_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_entries: int):
        super().__init__(path, base_offset, max_entries)
        self._timestamps = array("q")
        self._relative_offsets = array("i")

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def is_full(self) -> bool:
        return len(self._timestamps) >= self.max_entries

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, (-1, base_offset) when empty."""
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._relative_offsets[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is above the last entry's."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        relative = offset - self.base_offset
        if self._relative_offsets and relative < self._relative_offsets[-1]:
            raise AssertionError(f"time index offset {offset} below the last one")
        self._timestamps.append(timestamp)
        self._relative_offsets.append(relative)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """Largest entry with timestamp <= target: (timestamp, offset); (-1, base) if none."""
        i = bisect_right(self._timestamps, timestamp)
        if i == 0:
            return -1, self.base_offset
        return self._timestamps[i - 1], self.base_offset + self._relative_offsets[i - 1]

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose offset >= ``offset``."""
        keep = bisect_right(self._relative_offsets, offset - self.base_offset - 1)
        del self._timestamps[keep:]
        del self._relative_offsets[keep:]
        self._mark_truncated(keep)

    def _clear(self) -> None:
        self._timestamps, self._relative_offsets = array("q"), array("i")

    def reset(self, entries: list[tuple[int, int]]) -> None:
        self._timestamps = array("q", (t for t, _ in entries))
        self._relative_offsets = array("i", (o - self.base_offset for _, o in entries))
        self._mark_truncated(0)

    def _encode(self, start: int) -> bytes:
        pack = TIME_INDEX_ENTRY.pack
        return b"".join(
            pack(t, o) for t, o in zip(self._timestamps[start:], self._relative_offsets[start:],
                                       strict=True)
        )

    def load(self, next_offset: int) -> bool:
        """Read the file; False if it does not exist. CorruptFileError if insane."""
        data = _read_file(self.path)
        if data is None:
            return False
        if len(data) % self.entry_size:
            raise self._corrupt(f"size {len(data)} is not a multiple of {self.entry_size}")
        timestamps, relative_offsets = array("q"), array("i")
        previous_timestamp, previous_offset = None, -1
        for timestamp, relative in TIME_INDEX_ENTRY.iter_unpack(data):
            if previous_timestamp is not None and timestamp <= previous_timestamp:
                raise self._corrupt("timestamps not strictly increasing")
            if relative < previous_offset:
                raise self._corrupt("offsets decreasing")
            timestamps.append(timestamp)
            relative_offsets.append(relative)
            previous_timestamp, previous_offset = timestamp, relative
        if relative_offsets and self.base_offset + relative_offsets[-1] >= max(next_offset, self.base_offset + 1):
            raise self._corrupt(f"offset beyond the segment end {next_offset}")
        self._timestamps, self._relative_offsets = timestamps, relative_offsets
        self._clean_entries = self._file_entries = len(self)
        return True
