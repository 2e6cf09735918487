"""One log segment: ``<base>.log`` with its ``.index`` and ``.timeindex``.

``<base>.log`` (``base`` = the first offset in it, 20 digits, zero-padded) is a
plain concatenation of RecordBatch v2 batches exactly as they travel on the wire
(layout in ``proto/batch.py``), with no framing of its own: Kafka's format.
Offsets are known from batch headers alone (``baseOffset`` and
``lastOffsetDelta``); records are never decoded here. The index files and their
formats are described in ``broker/storage/index.py``.

The segment does the file I/O of one append (a single ``write``), reads of whole
batches by offset (index lookup, then a header scan), truncation and the batch
scan used by recovery. A read checks every batch it returns (framing, contiguous
offsets, CRC-32C; ``corruption.py``) and ends before a damaged one: bit rot in a
file that recovery trusted is found by the first reader, never served. Every ``OSError`` becomes ``KafkaStorageError`` with the
path; a failed append cuts any partial bytes so the file keeps whole batches.

Threading: one writer (the partition's append path). Readers may run on other
threads: they only read below the size they saw when they started. A flush may
run its fsyncs and index writes outside the owner's lock (``begin_flush``,
``SegmentFlush.sync``, ``end_flush``); the index files order their writers.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypeVar, TypeVarTuple

from tidewater.broker.storage.corruption import (
    FRAME,
    CorruptBatch,
    CorruptBatchError,
    content_problem,
    frame_problem,
    truncated_problem,
)
from tidewater.broker.storage.index import (
    RELATIVE_OFFSET_MAX,
    IndexFile,
    IndexWrite,
    OffsetIndex,
    TimeIndex,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BytesLike,
)
from tidewater.proto.crc import crc32c
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    InvariantViolation,
    KafkaStorageError,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"  # aborted transactions (txn_index.py), written by the log
DELETED_SUFFIX = ".deleted"  # a segment file waiting to be unlinked (removed on open)
SCAN_CHUNK_BYTES = 8 << 20  # recovery reads this much per syscall
LOCATE_CHUNK_BYTES = 16 << 10  # header scan after an index lookup
POSITION_HINTS_MAX = 64  # where recent reads ended: the next read of each reader starts there

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes,
# lastOffsetDelta, baseTimestamp, maxTimestamp (the first 43 header bytes)
_SCAN_HEADER = struct.Struct(">qiibIhiqq")
assert _SCAN_HEADER.size == 43
_PREFIX = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_EPOCH = struct.Struct(">i")
_HAS_PREADV = hasattr(os, "preadv")

# (position, size, base_offset, partition_leader_epoch, last_offset_delta, max_timestamp)
BatchFrame: TypeAlias = tuple[int, int, int, int, int, int]
_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base_offset, suffix) of a segment file name, None if it is not one."""
    stem, dot, suffix = name.partition(".")
    if not dot or len(stem) != 20 or not stem.isascii() or not stem.isdigit():
        return None
    return int(stem), "." + suffix


def storage_error(what: str, path: Path, error: OSError) -> KafkaStorageError:
    return KafkaStorageError(f"{what}: {error.strerror or error}", path=str(path))


def fsync_dir(directory: Path) -> None:
    """Make file creations, renames and deletions in ``directory`` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise storage_error("cannot fsync directory", directory, e) from e


def iter_batches_in_file(fd: int, path: Path, start: int, end: int, *,
                         validate_crc: bool) -> Iterator[BatchFrame]:
    """Yield raw header tuples ``(position, size, base_offset, epoch, last_offset_delta,
    max_timestamp)`` for batches in ``[start, end)`` of a file.

    Reads ``SCAN_CHUNK_BYTES`` at a time and checks framing and magic (and the
    CRC32C over a memoryview slice when ``validate_crc``). The first bad or torn
    batch raises CorruptRecordError with its file position; the batches before
    it have already been yielded.
    """
    unpack_header = _SCAN_HEADER.unpack_from
    position = start
    # One buffer for the whole scan: reading into it is much faster than a new
    # bytes object (fresh pages to fault in) per chunk.
    buffer = memoryview(bytearray(max(0, min(SCAN_CHUNK_BYTES, end - start))))
    while position < end:
        want = min(len(buffer), end - position)
        try:
            chunk_end = _pread_into(fd, buffer[:want], position)
        except OSError as e:
            raise storage_error("cannot read segment", path, e) from e
        chunk = view = buffer[:chunk_end]
        if chunk_end == 0:
            raise CorruptRecordError("file ended early", position=position, path=str(path))
        p = 0
        while True:
            remaining = chunk_end - p
            if remaining < HEADER_SIZE:
                break
            (base_offset, batch_length, epoch, magic, crc, _attributes, last_offset_delta,
             _base_timestamp, max_timestamp) = unpack_header(chunk, p)
            size = LOG_OVERHEAD + batch_length
            if batch_length < BATCH_LENGTH_MIN:
                raise CorruptRecordError(f"batch length {batch_length} below minimum",
                                         position=position + p, path=str(path))
            if size > remaining:
                break
            if magic != MAGIC_V2:
                raise CorruptRecordError(f"unsupported magic {magic}", position=position + p,
                                         path=str(path))
            if last_offset_delta < 0:
                raise CorruptRecordError("negative lastOffsetDelta", position=position + p,
                                         path=str(path))
            if validate_crc and crc32c(view[p + ATTRIBUTES_OFFSET:p + size]) != crc:
                raise CorruptRecordError("CRC mismatch", position=position + p, path=str(path))
            yield position + p, size, base_offset, epoch, last_offset_delta, max_timestamp
            p += size
        if p == 0:
            # Not even one whole batch in the chunk: either it is bigger than the
            # chunk (read it whole next time) or the file ends inside it.
            if chunk_end >= LOG_OVERHEAD:
                batch_length = _PREFIX.unpack_from(chunk, 0)[1]
                if batch_length < BATCH_LENGTH_MIN:
                    raise CorruptRecordError(f"batch length {batch_length} below minimum",
                                             position=position, path=str(path))
                size = LOG_OVERHEAD + batch_length
                if size <= end - position and size > chunk_end:
                    yield from _iter_one_big_batch(fd, path, position, size, end,
                                                   validate_crc=validate_crc)
                    position += size
                    continue
                raise CorruptRecordError(
                    f"truncated batch: length says {size} bytes, {end - position} present",
                    position=position, path=str(path))
            raise CorruptRecordError(f"truncated batch: {chunk_end} bytes at end of file",
                                     position=position, path=str(path))
        position += p


def _pread_into(fd: int, view: memoryview, position: int) -> int:
    if _HAS_PREADV:
        return os.preadv(fd, [view], position)
    data = os.pread(fd, len(view), position)
    view[:len(data)] = data
    return len(data)


def _iter_one_big_batch(fd: int, path: Path, position: int, size: int, end: int, *,
                        validate_crc: bool) -> Iterator[BatchFrame]:
    try:
        chunk = os.pread(fd, size, position)
    except OSError as e:
        raise storage_error("cannot read segment", path, e) from e
    if len(chunk) < size:
        raise CorruptRecordError("truncated batch", position=position, path=str(path))
    (base_offset, _length, epoch, magic, crc, _attributes, last_offset_delta, _base_timestamp,
     max_timestamp) = _SCAN_HEADER.unpack_from(chunk, 0)
    if magic != MAGIC_V2:
        raise CorruptRecordError(f"unsupported magic {magic}", position=position, path=str(path))
    if last_offset_delta < 0:
        raise CorruptRecordError("negative lastOffsetDelta", position=position, path=str(path))
    if validate_crc and crc32c(memoryview(chunk)[ATTRIBUTES_OFFSET:]) != crc:
        raise CorruptRecordError("CRC mismatch", position=position, path=str(path))
    yield position, size, base_offset, epoch, last_offset_delta, max_timestamp


@dataclass
class SegmentScan:
    """What a scan of a segment found: how far it is valid and what broke it."""

    valid_bytes: int
    next_offset: int
    error: CorruptRecordError | None = None
    # (epoch, base_offset) at each change of partitionLeaderEpoch, in order.
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)


class SegmentFlush:
    """The fsyncs of one segment's flush, run without the owner's lock (see
    ``LogSegment.begin_flush``)."""

    __slots__ = ("segment", "size", "truncations", "syncs_data", "data_fd", "index_writes")

    def __init__(self, segment: LogSegment, size: int, truncations: int):
        self.segment = segment
        self.size = size  # the .log size when the flush began: durable after sync
        self.truncations = truncations
        self.syncs_data = False  # the .log had bytes not yet fsynced
        self.data_fd = -1  # a dup of the .log descriptor until sync or close
        self.index_writes: list[tuple[IndexFile, IndexWrite]] = []

    def sync(self) -> None:
        """fdatasync the .log, then write and fsync the index files."""
        try:
            if self.data_fd != -1:
                try:
                    getattr(os, "fdatasync", os.fsync)(self.data_fd)
                except OSError as e:
                    raise storage_error("cannot fsync segment", self.segment.log_path, e) from e
        finally:
            self.close()
        for index, job in self.index_writes:
            index.write(job)

    def close(self) -> None:
        if self.data_fd != -1:
            fd, self.data_fd = self.data_fd, -1
            try:
                os.close(fd)
            except OSError:
                pass  # our own dup: nothing was written through it


class LogSegment:
    """The files of one segment and the offsets, sizes and timestamps they hold."""

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, fd: int,
                 size_bytes: int, suffix: str = ""):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        # ``suffix``: a segment the cleaner is writing (``.cleaned``, ``.swap``; cleaner_swap.py)
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX + suffix)
        self.index = OffsetIndex(directory / segment_file_name(base_offset, INDEX_SUFFIX + suffix),
                                 base_offset, config.segment_index_bytes // 8)
        self.time_index = TimeIndex(
            directory / segment_file_name(base_offset, TIME_INDEX_SUFFIX + suffix),
            base_offset, config.segment_index_bytes // 12)
        self._fd = fd
        self.size_bytes = size_bytes
        self.flushed_size_bytes = size_bytes
        self.next_offset = base_offset  # offset after the last batch
        self.max_timestamp = -1  # largest batch maxTimestamp in the segment
        self.offset_of_max_timestamp = base_offset
        self.bytes_since_last_index_entry = 0
        self.first_batch_time_ms: int | None = None  # for segment.ms
        self._position_hints: dict[int, int] = {}  # offset -> batch start, for sequential reads
        self.indexes_loaded = True  # False after release_indexes until a lookup needs them
        self._truncations = 0  # cuts of the file (a flush in progress checks it)

    # -- opening -----------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, config: LogConfig,
               suffix: str = "") -> LogSegment:
        """A new empty segment; an existing file of the same name is emptied."""
        path = directory / segment_file_name(base_offset, LOG_SUFFIX + suffix)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
        except OSError as e:
            raise storage_error("cannot create segment", path, e) from e
        segment = cls(directory, base_offset, config, fd, 0, suffix)
        try:
            # No fsync of the empty files (a roll runs on the event loop): the
            # directory fsync makes them durable, right after for a new or fully
            # truncated log, before the recovery point passes them after a roll
            # (Log.flush_outside_lock). Lost in a crash, recovery cuts the log there.
            segment.index.create_empty()
            segment.time_index.create_empty()
        except KafkaStorageError:
            segment.close()
            raise
        return segment

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, config: LogConfig,
                      suffix: str = "") -> LogSegment:
        """Open the files without reading any batch (load_trusted or recover comes next)."""
        path = directory / segment_file_name(base_offset, LOG_SUFFIX + suffix)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            size = os.fstat(fd).st_size
        except OSError as e:
            raise storage_error("cannot open segment", path, e) from e
        return cls(directory, base_offset, config, fd, size, suffix)

    def load_trusted(self) -> bool:
        """Use the index files as they are and check the tail after the last entry.

        Used for segments below the recovery point (flushed) and after a clean
        shutdown: reads only the index files and the batches after the last
        index entry (CRC-checked). False when that is not enough (an index file
        missing or insane, the tail does not scan): the caller must then
        ``scan`` the whole segment, which rebuilds the indexes and finds the cut.
        """
        self.indexes_loaded = True
        try:
            if not (self.index.load(self.size_bytes) and self.time_index.load(1 << 63)):
                log.info("index files of %s missing; rebuilding them", self.log_path)
                return False
        except CorruptFileError as e:
            log.warning("%s; rebuilding the indexes of %s", e, self.log_path)
            return False
        last_offset, position = self.index.last_entry
        try:
            self._scan_tail(position, validate_crc=True,
                            expected_last_offset=last_offset if position > 0 else None)
        except CorruptRecordError as e:
            log.warning("tail check of %s failed (%s); scanning the whole segment",
                        self.log_path, e)
            return False
        if self.time_index.last_entry[1] >= max(self.next_offset, self.base_offset + 1):
            log.warning("time index %s points past the segment end %d; rebuilding it",
                        self.time_index.path, self.next_offset)
            return False
        return True

    def _scan_tail(self, position: int, *, validate_crc: bool,
                   expected_last_offset: int | None = None) -> None:
        """Set next_offset, max timestamp and bytes since the last index entry from the
        batches at ``position`` onwards (the time index gives the max before it)."""
        next_offset = self.base_offset
        max_timestamp, offset_of_max = -1, self.base_offset
        if position > 0 or len(self.time_index):
            max_timestamp, offset_of_max = self.time_index.last_entry
        first = True
        for (batch_position, _size, base_offset, _epoch, last_offset_delta,
             batch_max_timestamp) in iter_batches_in_file(self._fd, self.log_path, position,
                                                          self.size_bytes,
                                                          validate_crc=validate_crc):
            last_offset = base_offset + last_offset_delta
            if first and position == 0 and not self.follows(base_offset, self.base_offset):
                raise CorruptRecordError(
                    f"first batch offset {base_offset} is not the segment base {self.base_offset}",
                    position=batch_position, path=str(self.log_path))
            if not first and not self.follows(base_offset, next_offset):
                raise CorruptRecordError(
                    f"batch offset {base_offset} does not follow {next_offset - 1}",
                    position=batch_position, path=str(self.log_path))
            if batch_position == 0 and self.first_batch_time_ms is None:
                self.first_batch_time_ms = batch_max_timestamp
            if first and expected_last_offset is not None and last_offset != expected_last_offset:
                raise CorruptRecordError(
                    f"index says last offset {expected_last_offset}, batch has {last_offset}",
                    position=batch_position, path=str(self.log_path))
            first = False
            next_offset = last_offset + 1
            if batch_max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = batch_max_timestamp, last_offset
        if first and position > 0:
            raise CorruptRecordError("index points past the last batch", position=position,
                                     path=str(self.log_path))
        self.next_offset = next_offset
        self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, offset_of_max
        self.bytes_since_last_index_entry = self.size_bytes - position
        if self.first_batch_time_ms is None and self.size_bytes:
            self.first_batch_time_ms = self._read_first_max_timestamp()

    def _read_first_max_timestamp(self) -> int:
        try:
            header = os.pread(self._fd, 43, 0)
        except OSError as e:
            raise storage_error("cannot read segment", self.log_path, e) from e
        return _SCAN_HEADER.unpack_from(header, 0)[8] if len(header) == 43 else -1

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the batches (framing only).

        CorruptBatchError if the file does not scan (the batches themselves are
        damaged): the indexes then cover the sound batches before the damaged one
        and everything else stays as it was (the segment's end and timestamps: the
        damage is the reader's to report and the replica's to repair, not a cut)."""
        saved = (self.next_offset, self.max_timestamp, self.offset_of_max_timestamp,
                 self.bytes_since_last_index_entry, self.first_batch_time_ms)
        scan = self.scan(self.base_offset, validate_crc=False)
        if scan.error is None:
            return
        # A damaged lastOffsetDelta shows in a framing-only scan at the batch after it;
        # the CRC names the batch itself.
        scan = self.scan(self.base_offset, validate_crc=True)
        (self.next_offset, self.max_timestamp, self.offset_of_max_timestamp,
         self.bytes_since_last_index_entry, self.first_batch_time_ms) = saved
        if scan.error is None:
            raise InvariantViolation(f"{self.log_path}: a CRC scan found nothing to refuse")
        raise CorruptBatchError(CorruptBatch(str(self.log_path), scan.valid_bytes,
                                             scan.next_offset, scan.error.reason))

    def scan(self, expected_base_offset: int, *, validate_crc: bool = True) -> SegmentScan:
        """Walk every batch, rebuild the indexes in memory and stop at the first bad one.

        A batch is bad if its framing, magic or CRC is wrong or its base offset is
        not ``expected_base_offset`` (first batch) or the previous last offset + 1.
        The segment's state then describes the valid prefix; the file is not cut
        here (see truncate_to_position).
        """
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        interval = self.config.index_interval_bytes
        max_offset_entries, max_time_entries = self.index.max_entries, self.time_index.max_entries
        next_offset = expected_base_offset
        max_timestamp, offset_of_max = -1, self.base_offset
        bytes_since = 0
        valid_bytes = 0
        epoch_starts: list[tuple[int, int]] = []
        last_epoch = None
        error = None
        first_time = None
        try:
            for (position, size, base_offset, epoch, last_offset_delta,
                 batch_max_timestamp) in iter_batches_in_file(self._fd, self.log_path, 0,
                                                              self.size_bytes,
                                                              validate_crc=validate_crc):
                if not self.follows(base_offset, next_offset):
                    raise CorruptRecordError(
                        f"batch offset {base_offset} where {next_offset} was expected",
                        position=position, path=str(self.log_path))
                last_offset = base_offset + last_offset_delta
                if last_offset - self.base_offset > RELATIVE_OFFSET_MAX:
                    raise CorruptRecordError("offset too far from the segment base",
                                             position=position, path=str(self.log_path))
                if first_time is None:
                    first_time = batch_max_timestamp
                if batch_max_timestamp > max_timestamp:
                    max_timestamp, offset_of_max = batch_max_timestamp, last_offset
                if bytes_since > interval and len(offset_entries) < max_offset_entries:
                    offset_entries.append((last_offset, position))
                    if ((not time_entries or max_timestamp > time_entries[-1][0])
                            and len(time_entries) < max_time_entries):
                        time_entries.append((max_timestamp, offset_of_max))
                    bytes_since = 0
                bytes_since += size
                if epoch != last_epoch:
                    epoch_starts.append((epoch, base_offset))
                    last_epoch = epoch
                next_offset = last_offset + 1
                valid_bytes = position + size
        except CorruptRecordError as e:
            error = e
        self.index.reset(offset_entries)
        self.time_index.reset(time_entries)
        self.indexes_loaded = True
        self.next_offset = next_offset if valid_bytes else self.base_offset
        self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, offset_of_max
        self.bytes_since_last_index_entry = bytes_since
        self.first_batch_time_ms = first_time
        return SegmentScan(valid_bytes, self.next_offset, error, epoch_starts)

    def epoch_starts(self) -> list[tuple[int, int]]:
        """(epoch, base_offset) at each change of partitionLeaderEpoch (header scan)."""
        starts: list[tuple[int, int]] = []
        last_epoch = None
        for (_p, _s, base_offset, epoch, _d, _t) in iter_batches_in_file(
                self._fd, self.log_path, 0, self.size_bytes, validate_crc=False):
            if epoch != last_epoch:
                starts.append((epoch, base_offset))
                last_epoch = epoch
        return starts

    def follows(self, base_offset: int, expected: int) -> bool:
        """A batch at ``base_offset`` may come where ``expected`` (the previous batch's last
        offset + 1) is: the same offset, or any later one in a compacted log (the cleaner
        removes whole batches; ``cleaner.py``). A baseOffset lies outside the CRC, so a
        damaged one that jumps forward goes unseen there: Kafka cannot see it either."""
        return base_offset == expected or (base_offset > expected and self.config.compact)

    # -- appending ---------------------------------------------------------

    def relative_offset_fits(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= RELATIVE_OFFSET_MAX

    def append(self, data: BytesLike, batches: list[tuple[int, int, int, int]], next_offset: int,
               now_ms: int) -> None:
        """Write ``data`` (whole batches) with one write and index it.

        ``batches`` holds ``(position_in_data, size, last_offset, max_timestamp)``
        per batch. On an OSError the file is cut back to its old size and
        KafkaStorageError is raised with nothing changed.
        """
        if not self.indexes_loaded:
            self.ensure_indexes()  # the active segment's are always loaded; be sure
        start = self.size_bytes
        view = data if type(data) is memoryview else memoryview(data)
        try:
            written = os.write(self._fd, view)
            while written < len(view):  # short writes happen on full disks and signals
                written += os.write(self._fd, view[written:])
        except OSError as e:
            self._cut_after_failed_write(start)
            raise storage_error("cannot append to segment", self.log_path, e) from e
        interval = self.config.index_interval_bytes
        index, time_index = self.index, self.time_index
        max_timestamp, offset_of_max = self.max_timestamp, self.offset_of_max_timestamp
        bytes_since = self.bytes_since_last_index_entry
        for position, size, last_offset, batch_max_timestamp in batches:
            if batch_max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = batch_max_timestamp, last_offset
            if bytes_since > interval:
                index.append(last_offset, start + position)
                time_index.maybe_append(max_timestamp, offset_of_max)
                bytes_since = 0
            bytes_since += size
        self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, offset_of_max
        self.bytes_since_last_index_entry = bytes_since
        if start == 0:
            self.first_batch_time_ms = now_ms
        self.size_bytes = start + len(view)
        self.next_offset = next_offset

    def _cut_after_failed_write(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as e:
            # Partial bytes may remain; recovery on the next start cuts the torn tail.
            log.error("cannot cut %s back to %d bytes after a failed write: %s",
                      self.log_path, size, e)
            raise storage_error("cannot cut segment after failed write", self.log_path, e) from e

    # -- reading -----------------------------------------------------------

    def _read_at(self, size: int, position: int) -> bytes:
        try:
            return os.pread(self._fd, size, position)
        except OSError as e:
            raise storage_error("cannot read segment", self.log_path, e) from e

    def locate(self, offset: int, size_limit: int | None = None) -> tuple[int, int, int] | None:
        """(position, base_offset, last_offset) of the first batch whose last offset >=
        ``offset``; None if there is none below ``size_limit``.

        The index lookup is checked against the batch it points to; a stale or
        damaged index is rebuilt from the file and the lookup repeated.
        """
        end = self.size_bytes if size_limit is None else size_limit
        return self._checked_lookup(self._locate, offset, end)

    def _checked_lookup(self, lookup: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """``lookup(*args)``; when it finds an index entry that does not match the log
        (CorruptFileError), the indexes are rebuilt from the file and it runs again."""
        try:
            return lookup(*args)
        except CorruptFileError as e:
            log.warning("%s; rebuilding the indexes of %s", e, self.log_path)
            self._replace_indexes()
            return lookup(*args)

    def _replace_indexes(self) -> None:
        """Rebuild both indexes from the batches and write them now, not at the next roll
        or close."""
        self.rebuild_indexes()
        self.index.flush()
        self.time_index.flush()

    def _locate(self, offset: int, end: int) -> tuple[int, int, int] | None:
        """Walk the batch headers from the index entry at or below ``offset``; each batch
        must start where the one before it ended (offsets and bytes), so a damaged
        header is found here, not skipped over. The batch after the last one ending
        below ``offset`` is returned by position and the base offset it must have,
        whatever its header says: a truncation below a damaged batch must find it, and
        a read checks it. CorruptBatchError where the chain of headers breaks."""
        self.ensure_indexes()
        # The entry for a batch ending below ``offset``: the batch holding it is then
        # reached by the walk, which finds where it must start even if its header is
        # damaged (an entry naming that batch itself would have to trust the header).
        entry_offset, position = self.index.lookup(offset - 1)
        check_entry = position > 0
        # The base offset the batch at the walk's position must have (unknown at an
        # index entry until its batch is passed), and where the batch before it starts.
        expected = None if check_entry else self.base_offset
        previous, previous_base = -1, -1
        while position < end:
            chunk = self._read_at(min(LOCATE_CHUNK_BYTES, end - position), position)
            p = 0
            while position + p < end:
                has_header = len(chunk) - p >= HEADER_SIZE
                if not has_header and p > 0:
                    break  # the next chunk starts here
                at = position + p
                if has_header:
                    base_offset, batch_length = _PREFIX.unpack_from(chunk, p)
                    last_offset = base_offset + _LAST_OFFSET_DELTA.unpack_from(
                        chunk, p + _LAST_OFFSET_DELTA_AT)[0]
                    size = LOG_OVERHEAD + batch_length
                if expected is not None and expected >= offset:
                    if has_header and self.follows(base_offset, expected):
                        return at, base_offset, last_offset
                    # Not the batch that must start here: damaged, or the walk went astray
                    # after a batch whose batchLength is damaged (its CRC tells).
                    if previous >= 0:
                        problem = self._batch_problem_at(previous, previous_base, end)
                        if problem is not None:
                            raise CorruptBatchError(CorruptBatch(
                                str(self.log_path), previous, previous_base, problem))
                    return at, expected, expected
                if not has_header:  # fewer bytes than a header left in the file
                    if check_entry:
                        raise CorruptFileError(f"index entry ({entry_offset}, {position}) is "
                                               "past the last batch", path=str(self.index.path))
                    if expected is None:
                        raise InvariantViolation(f"{self.log_path}: a broken chain with no batch before")
                    raise self._chain_broken(previous, previous_base, at, expected, end)
                if check_entry:
                    if batch_length < BATCH_LENGTH_MIN or last_offset != entry_offset:
                        raise CorruptFileError(
                            f"index entry ({entry_offset}, {position}) does not match the log",
                            path=str(self.index.path))
                    check_entry = False
                    if at + size > end:
                        raise self._chain_broken(-1, -1, at, base_offset, end)
                elif (expected is None or not self.follows(base_offset, expected)
                      or batch_length < BATCH_LENGTH_MIN
                      or at + size > end):
                    if expected is None:
                        raise InvariantViolation(f"{self.log_path}: a broken chain with no batch before")
                    raise self._chain_broken(previous, previous_base, at, expected, end)
                if last_offset >= offset:
                    return at, base_offset, last_offset
                previous, previous_base, expected = at, base_offset, last_offset + 1
                p += size
            position += p
        if expected is not None and end == self.size_bytes and expected != self.next_offset:
            # The walk reached the end of the file, but not at the segment's end offset: a
            # damaged batchLength made it jump there.
            raise self._chain_broken(previous, previous_base, end, expected, end)
        return None

    def _chain_broken(self, previous: int, previous_base: int, position: int, expected: int,
                      end: int) -> CorruptBatchError:
        """The batch headers stop following each other at ``position``: the batch there is
        damaged, or the one before it at ``previous`` (a damaged lastOffsetDelta or
        batchLength leads the walk astray while that batch's header still looks sane;
        its CRC tells)."""
        if previous >= 0:
            problem = self._batch_problem_at(previous, previous_base, end)
            if problem is not None:
                return CorruptBatchError(CorruptBatch(str(self.log_path), previous, previous_base,
                                                      problem))
        problem = self._batch_problem_at(position, expected, end) or "batch header out of order"
        return CorruptBatchError(CorruptBatch(str(self.log_path), position, expected, problem))

    def _batch_problem_at(self, position: int, expected_base_offset: int, end: int) -> str | None:
        """What is wrong with the batch at ``position`` (framing, offsets, CRC), None if it
        is sound. Reads it whole: for slow paths only."""
        room = end - position
        frame = self._read_at(min(room, ATTRIBUTES_OFFSET), position)
        if len(frame) < ATTRIBUTES_OFFSET:
            return truncated_problem(room)
        base_offset, batch_length, _epoch, magic, crc = FRAME.unpack_from(frame, 0)
        problem = frame_problem(base_offset, batch_length, magic, expected_base_offset, room,
                                gaps_allowed=self.config.compact)
        if problem is not None:
            return problem
        size = LOG_OVERHEAD + batch_length
        if size <= LOCATE_CHUNK_BYTES:
            data = self._read_at(size, position)
            if len(data) < size:
                return truncated_problem(len(data))
            return content_problem(memoryview(data), 0, size, crc)
        # A damaged batchLength may claim up to the rest of the file: CRC it piecewise.
        head = self._read_at(HEADER_SIZE, position)
        computed, at = crc32c(memoryview(head)[ATTRIBUTES_OFFSET:]), position + HEADER_SIZE
        while at < position + size:
            piece = self._read_at(min(SCAN_CHUNK_BYTES, position + size - at), at)
            if not piece:
                return truncated_problem(at - position)
            computed, at = crc32c(piece, computed), at + len(piece)
        if computed != crc:
            return f"CRC mismatch: stored {crc:#010x}, computed {computed:#010x}"
        if _LAST_OFFSET_DELTA.unpack_from(head, _LAST_OFFSET_DELTA_AT)[0] < 0:
            return "negative lastOffsetDelta"
        return None

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None,
             min_one_batch: bool) -> tuple[bytes, int, int, CorruptBatch | None] | None:
        """Whole, checked batches from the one holding ``start_offset``: (bytes, first
        offset, next offset, the damaged batch that ended the read or None).

        Stops before the first batch with base offset >= ``max_offset`` and before
        ``max_bytes``, but returns the first batch whole if ``min_one_batch``.
        None when the segment has no batch with last offset >= start_offset.

        Every batch returned passed the checks of ``corruption.py`` (framing,
        contiguous offsets, CRC-32C): the read stops before the first one that fails
        and names it; CorruptBatchError if that is the first batch. Damaged bytes are
        never returned.

        One pread in the common case: a sequential reader's start position comes
        from where its previous read ended (``_position_hints``), and the read
        stops at an indexed batch start so the bytes need no trimming copy.
        """
        end = self.size_bytes  # batches past this may be mid-append
        position = self._position_hints.get(start_offset)
        if position is not None and position < end:
            # Where a checked batch ended, so the next batch must start at start_offset:
            # a header saying otherwise is damaged (the hints go with any cut).
            first_offset = start_offset
        else:
            found = self.locate(start_offset, end)
            if found is None:
                return None
            position, first_offset, _last = found
        if max_offset is not None and first_offset >= max_offset:
            return b"", first_offset, first_offset, None
        data = self._read_at(self._whole_batches_bytes(position, max_bytes, end), position)
        view = memoryview(data)
        unpack_frame, unpack_delta = FRAME.unpack_from, _LAST_OFFSET_DELTA.unpack_from
        length, room = len(data), end - position
        p, next_offset = 0, first_offset
        damaged = False
        gaps = self.config.compact  # see ``follows``
        while length - p >= HEADER_SIZE:
            base_offset, batch_length, _epoch, magic, crc = unpack_frame(data, p)
            size = LOG_OVERHEAD + batch_length
            if ((base_offset != next_offset and not (gaps and base_offset > next_offset))
                    or batch_length < BATCH_LENGTH_MIN or magic != MAGIC_V2 or p + size > room):
                damaged = True
                break
            if p == 0:
                first_offset = base_offset  # above start_offset after a compaction gap
            if p + size > length or (max_offset is not None and base_offset >= max_offset):
                break
            delta = unpack_delta(data, p + _LAST_OFFSET_DELTA_AT)[0]
            if crc32c(view[p + ATTRIBUTES_OFFSET:p + size]) != crc or delta < 0:
                damaged = True
                break
            next_offset = base_offset + delta + 1
            p += size
        else:
            # Bytes too few for a header at the segment's end: a torn or damaged batch.
            damaged = 0 < length - p and length == room
        corrupt = None
        if damaged:
            problem = (self._batch_problem_at(position + p, next_offset, end)
                       or "batch changed while read")
            corrupt = CorruptBatch(str(self.log_path), position + p, next_offset, problem)
            if p == 0:
                raise CorruptBatchError(corrupt)
        elif p == 0:
            if not min_one_batch or (max_offset is not None and first_offset >= max_offset):
                return b"", first_offset, first_offset, None
            data, next_offset = self._read_one_batch(position, first_offset, end)
            p = length = len(data)
        self._remember_position(next_offset, position + p)
        return (data if p == length else data[:p]), first_offset, next_offset, corrupt

    def _read_one_batch(self, position: int, base_offset: int, end: int) -> tuple[bytes, int]:
        """The whole, checked batch at ``position`` that must start at ``base_offset`` (one
        larger than a read's max_bytes), and the offset after it."""
        room = end - position
        frame = self._read_at(min(room, ATTRIBUTES_OFFSET), position)
        problem = truncated_problem(room) if len(frame) < ATTRIBUTES_OFFSET else None
        if problem is None:
            found_base, batch_length, _epoch, magic, crc = FRAME.unpack_from(frame, 0)
            problem = frame_problem(found_base, batch_length, magic, base_offset, room,
                                    gaps_allowed=self.config.compact)
            if problem is None:
                size = LOG_OVERHEAD + batch_length
                data = self._read_at(size, position)
                problem = (truncated_problem(len(data)) if len(data) < size
                           else content_problem(memoryview(data), 0, size, crc))
                if problem is None:
                    return data, found_base + _LAST_OFFSET_DELTA.unpack_from(
                        data, _LAST_OFFSET_DELTA_AT)[0] + 1
        raise CorruptBatchError(CorruptBatch(str(self.log_path), position, base_offset, problem))

    def _whole_batches_bytes(self, position: int, max_bytes: int, end: int) -> int:
        """How much to read from ``position``: up to ``max_bytes``, ending at a known batch
        boundary when one is known (the segment end, an indexed batch start)."""
        limit = position + max(0, max_bytes)
        if limit >= end:
            return end - position
        self.ensure_indexes()
        boundary = self.index.position_at_or_below(limit)
        if boundary > position:
            return boundary - position  # may leave up to an index interval unused
        return limit - position

    def _remember_position(self, offset: int, position: int) -> None:
        hints = self._position_hints
        if len(hints) >= POSITION_HINTS_MAX:
            hints.clear()
        hints[offset] = position

    def read_epoch_at(self, position: int) -> int:
        """partitionLeaderEpoch of the batch at ``position``."""
        header = self._read_at(16, position)
        if len(header) < 16:
            raise CorruptRecordError("truncated batch", position=position, path=str(self.log_path))
        epoch: int = _EPOCH.unpack_from(header, 12)[0]
        return epoch

    def read_batch_at(self, position: int) -> bytes:
        header = self._read_at(LOG_OVERHEAD, position)
        return self._read_at(LOG_OVERHEAD + _PREFIX.unpack_from(header, 0)[1], position)

    def find_offset_by_timestamp(self, timestamp_ms: int,
                                 from_offset: int) -> tuple[int, int, int, int] | None:
        """First batch at or after ``from_offset`` with maxTimestamp >= ``timestamp_ms``:
        (position, base_offset, max_timestamp, partition_leader_epoch), or None."""
        if self.max_timestamp < timestamp_ms:
            return None
        self.ensure_indexes()
        index_offset = self._checked_lookup(self._time_index_start, timestamp_ms)
        found = self.locate(max(index_offset, from_offset))
        if found is None:
            return None
        start = found[0]
        for (position, _size, base_offset, epoch, _delta, max_timestamp) in iter_batches_in_file(
                self._fd, self.log_path, start, self.size_bytes, validate_crc=False):
            if max_timestamp >= timestamp_ms:
                return position, base_offset, max_timestamp, epoch
        return None

    def _time_index_start(self, timestamp_ms: int) -> int:
        """The offset a timestamp search may start from: the time index entry for
        ``timestamp_ms``, checked against the batch it names, whose maxTimestamp must be
        the entry's (as ``_locate`` checks offset index entries). A damaged entry that
        still sorts (a flipped bit in a timestamp) would otherwise start the search past
        the record sought. CorruptFileError when it does not match."""
        entry_timestamp, entry_offset = self.time_index.lookup(timestamp_ms)
        if entry_timestamp == -1 and entry_offset == self.base_offset:
            return entry_offset  # no entry at or below the timestamp: from the start
        found = self.locate(entry_offset)
        batch = None if found is None else next(iter_batches_in_file(
            self._fd, self.log_path, found[0], self.size_bytes, validate_crc=False), None)
        if batch is None or batch[5] != entry_timestamp:
            raise CorruptFileError(
                f"time index entry ({entry_timestamp}, {entry_offset}) does not match the log",
                path=str(self.time_index.path))
        return entry_offset

    # -- truncation, flush, lifecycle --------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset >= ``offset``; returns bytes removed.

        A batch holding ``offset`` goes whole, so next_offset may end below ``offset``.
        """
        found = self.locate(offset)
        if found is None:
            return 0
        return self.truncate_to_position(found[0], found[1])

    def truncate_to_position(self, position: int, next_offset: int) -> int:
        """Cut the file at ``position`` (a batch boundary) where ``next_offset`` starts."""
        removed = self.size_bytes - position
        if removed <= 0:
            return 0
        self.ensure_indexes()
        try:
            os.ftruncate(self._fd, position)
        except OSError as e:
            raise storage_error("cannot truncate segment", self.log_path, e) from e
        self.size_bytes = position
        self._truncations += 1
        self._position_hints.clear()
        self.flushed_size_bytes = min(self.flushed_size_bytes, position)
        self.index.truncate_to_position(position)
        self.time_index.truncate_to(next_offset)
        self.next_offset = next_offset
        if position == 0:
            self.next_offset = self.base_offset
            self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
            self.bytes_since_last_index_entry = 0
            self.first_batch_time_ms = None
        else:
            self._scan_tail(self.index.last_entry[1], validate_crc=False)
        return removed

    def on_become_inactive(self) -> None:
        """Kafka adds a final time index entry when a segment is rolled."""
        self.ensure_indexes()
        if self.max_timestamp >= 0 and not self.time_index.is_full:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    def release_indexes(self) -> None:
        """Drop the index entries from memory (written first if needed): an inactive
        segment's indexes are read back from their files on the next lookup."""
        if self.indexes_loaded and self._fd >= 0:  # a closed (deleted) segment writes nothing
            self.index.flush()
            self.time_index.flush()
            self.index.unload()
            self.time_index.unload()
            self.indexes_loaded = False

    def ensure_indexes(self) -> None:
        """Load released indexes from their files (rebuilding them if the files are bad)."""
        if self.indexes_loaded:
            return
        self.indexes_loaded = True
        try:
            if self.index.load(self.size_bytes) and self.time_index.load(self.next_offset):
                return
            log.warning("index files of %s missing; rebuilding them", self.log_path)
        except CorruptFileError as e:
            log.warning("%s; rebuilding the indexes of %s", e, self.log_path)
        self._replace_indexes()

    @property
    def indexes_full(self) -> bool:
        """Either index has no room for another entry (the segment must roll)."""
        return self.index.is_full or self.time_index.is_full

    @property
    def needs_flush(self) -> bool:
        return (self.flushed_size_bytes != self.size_bytes or self.index.is_dirty
                or self.time_index.is_dirty or self.index.needs_sync
                or self.time_index.needs_sync)

    def flush_data(self) -> None:
        """fsync the .log if anything was appended since the last fsync."""
        if self.flushed_size_bytes != self.size_bytes:
            size = self.size_bytes
            try:
                # fdatasync still writes the file size (needed to read the data back).
                getattr(os, "fdatasync", os.fsync)(self._fd)
            except OSError as e:
                raise storage_error("cannot fsync segment", self.log_path, e) from e
            self.flushed_size_bytes = size

    def mark_data_unsynced(self) -> None:
        """The .log may hold bytes not yet on disk (a scan after a crash read them from
        the page cache): the next flush fsyncs it before the recovery point passes it."""
        self.flushed_size_bytes = -1

    def flush(self) -> None:
        """fsync the .log, then write and fsync the index tails."""
        self.flush_data()
        self.index.flush()
        self.time_index.flush()

    def begin_flush(self) -> SegmentFlush:
        """The fast, locked part of a flush: snapshot the index tails and take a
        descriptor of the .log. ``SegmentFlush.sync`` then writes and fsyncs without
        the owner's lock, and ``end_flush`` (lock held again) records what it did.

        An own descriptor (``dup``): the segment may be closed (deleted, truncated
        away) while the fsync runs, and its number reused by another file.
        """
        job = SegmentFlush(self, self.size_bytes, self._truncations)
        if self.flushed_size_bytes != self.size_bytes:
            try:
                job.data_fd = os.dup(self._fd)
            except OSError as e:
                raise storage_error("cannot flush segment", self.log_path, e) from e
            job.syncs_data = True
        for index in (self.index, self.time_index):
            snapshot = index.snapshot()
            if snapshot is not None:
                job.index_writes.append((index, snapshot))
        return job

    def end_flush(self, job: SegmentFlush) -> None:
        """Record what ``job`` made durable (the owner's lock held, ``job.sync`` done)."""
        for index, snapshot in job.index_writes:
            index.commit(snapshot)
        # A truncation meanwhile may have cut below job.size and appended new bytes
        # there, which the fsync may have missed.
        if job.syncs_data and job.truncations == self._truncations:
            self.flushed_size_bytes = max(self.flushed_size_bytes, job.size)

    def close(self) -> None:
        self.index.retire()
        self.time_index.retire()
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError as e:
                raise storage_error("cannot close segment", self.log_path, e) from e
            finally:
                self._fd = -1

    @property
    def txn_index_path(self) -> Path:
        """The segment's aborted-transaction index (``txn_index.py``; it may not exist)."""
        return self.log_path.with_name(segment_file_name(self.base_offset, TXN_INDEX_SUFFIX))

    def delete(self) -> None:
        """Close and remove the files (the ``.txnindex`` too)."""
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path,
                     self.txn_index_path):
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise storage_error("cannot delete segment file", path, e) from e

    def rename_for_deletion(self) -> list[Path]:
        """Close and rename the three files to ``<name>.deleted`` (fast: no data freed);
        returns the new paths for the caller to unlink later, without any lock (freeing
        a GiB file's blocks takes milliseconds). Opening a log removes ``.deleted``
        files, so a crash in between loses nothing that was still wanted."""
        self.close()
        renamed = []
        for path in (self.log_path, self.index.path, self.time_index.path,
                     self.txn_index_path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.rename(path, target)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise storage_error("cannot rename segment file for deletion", path, e) from e
            renamed.append(target)
        return renamed

    def rename_files(self, suffix: str) -> None:
        """Give the three files the plain names + ``suffix``, the index files first: the
        ``.log`` file's rename is the step ``cleaner_swap.py``'s recovery goes by."""
        for index in (self.index, self.time_index):
            target = self.directory / segment_file_name(
                self.base_offset, (INDEX_SUFFIX if index is self.index else TIME_INDEX_SUFFIX)
                + suffix)
            try:
                index.rename_to(target)
            except OSError as e:
                raise storage_error("cannot rename index file", index.path, e) from e
        target = self.directory / segment_file_name(self.base_offset, LOG_SUFFIX + suffix)
        try:
            os.rename(self.log_path, target)
        except OSError as e:
            raise storage_error("cannot rename segment", self.log_path, e) from e
        self.log_path = target

    @property
    def truncations(self) -> int:
        """How many times the file was cut: bytes read before a change of it may be stale."""
        return self._truncations

    def __repr__(self) -> str:
        return (f"LogSegment(base={self.base_offset}, next={self.next_offset}, "
                f"size={self.size_bytes})")
