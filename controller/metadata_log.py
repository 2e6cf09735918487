"""The controller's durable metadata log: an append-only file of JSON records.

Files in ``<data-dir>``::

    metadata.log       the records (format below)
    metadata.lock      held with flock(LOCK_EX) while a controller uses the directory
    metadata.log.tmp   a compaction in progress (deleted at open: the rename never happened)

The directory is mode 0700 and every file 0600 (set at open, also on older ones): the
records hold control tokens and SCRAM keys.

``metadata.log`` is a sequence of frames, nothing else::

    offset  size  field
    0       4     payload_length   uint32 big-endian, 1..RECORD_BYTES_MAX
    4       4     crc32c           uint32 big-endian, CRC-32C of the payload
    8       n     payload          UTF-8 JSON object with a "type" key

Every record has an *offset*. Offsets only grow, across restarts and
compactions, so the controller uses them as broker epochs. A file starts at
offset 0, unless its first record is ``{"type": "log_start", "next_offset": N}``
(written by compaction): then the record after it has offset N. ``log_start``
itself is not a metadata record and is never returned.

Recovery: frames are read in order. A frame that is cut short (fewer bytes
than its header announces), zero bytes where a header should be, or the very
last frame when its CRC fails, is a torn write from a crash: the file is
truncated at the frame's start and the truncation fsynced. A bad frame with
more data after it, or a payload that is not a JSON object with a type, is
corruption: ``CorruptFileError`` with the path and byte position, and nothing
is modified.

Durability: ``append`` writes all frames of a batch with one write and fsyncs
the file before returning. ``rewrite`` (compaction) writes ``.tmp``, fsyncs it,
renames it over the log and fsyncs the directory: a crash leaves either the
old or the new file, never a mix.

Failures: a failed append (full disk, I/O error) marks the log ``failed``: it
refuses every later append, since after a failed write or fsync nobody knows
what reached the disk (a retried fsync may even report success for pages the
kernel already dropped). The caller must stop the process; recovery cuts the
torn frame on the next start. A ``rewrite`` that fails before the rename
leaves the log as it was, still usable (``.tmp`` is removed); one that fails
at or after the rename marks the log ``failed`` too, because the open file
may then be an unlinked inode that no restart would read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeAlias

import crc32c

from tidewater.proto.errors import CorruptFileError, KafkaStorageError

log = logging.getLogger(__name__)

FILE_NAME = "metadata.log"
LOCK_FILE_NAME = "metadata.lock"
TMP_SUFFIX = ".tmp"
# The log holds control tokens and SCRAM keys: only the controller's user reads it.
FILE_MODE = 0o600
DIR_MODE = 0o700
FRAME_HEADER = struct.Struct(">II")  # payload_length, crc32c
assert FRAME_HEADER.size == 8
RECORD_BYTES_MAX = 16 * 1024 * 1024  # a topic with many partitions still fits
LOG_START = "log_start"

# One record: a JSON object with a "type" (controller.metadata lists them).
MetadataRecord: TypeAlias = dict[str, Any]


def encode_frame(record: MetadataRecord) -> bytes:
    payload = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    if not 0 < len(payload) <= RECORD_BYTES_MAX:
        raise ValueError(f"metadata record of {len(payload)} bytes is out of bounds")
    return FRAME_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def _tighten_dir(data_dir: Path) -> None:
    """Mode 0700 also for a directory made before this rule or under a loose umask. One
    the controller does not own (a mount point) keeps its mode, with a warning: its
    files are 0600 anyway."""
    try:
        os.chmod(data_dir, DIR_MODE)
    except PermissionError as e:
        log.warning("metadata log directory %s keeps its mode (%s); its files are 0600",
                    data_dir, e)


def _open_private(path: Path) -> IO[bytes]:
    """``open(path, "a+b")`` for a file of mode 0600 (made so, or tightened if older)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "a+b")
    except BaseException:
        os.close(fd)
        raise

def lock_directory(data_dir: Path, held_message: str) -> IO[bytes]:
    """The held ``metadata.lock`` of ``data_dir`` (flock LOCK_EX; released when the
    returned file is closed). ``KafkaStorageError(held_message)`` when another process
    holds it."""
    lock_file = _open_private(data_dir / LOCK_FILE_NAME)
    try:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        lock_file.close()
        raise KafkaStorageError(held_message, path=str(data_dir / FILE_NAME)) from e
    return lock_file


class MetadataLog:
    """Append-only record file. Open with ``MetadataLog.open``, which recovers it."""

    def __init__(self, data_dir: Path, lock_file: IO[bytes], file: IO[bytes],
                 records: list[MetadataRecord], start_offset: int, size_bytes: int):
        self.data_dir = data_dir
        self.path = data_dir / FILE_NAME
        self._lock_file = lock_file
        self._file = file
        self._recovered = records
        self.start_offset = start_offset  # offset of the first record in the file
        self.size_bytes = size_bytes
        self.next_offset = start_offset + len(records)
        self._failure: OSError | None = None  # the write that left the file in doubt

    @property
    def failed(self) -> bool:
        """A write failed: the file's content is in doubt and no append is accepted."""
        return self._failure is not None

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise KafkaStorageError(f"metadata log failed earlier ({self._failure}); "
                                    f"restart to recover it", path=str(self.path))

    @property
    def record_count(self) -> int:
        """Records in the file now (what a replay would read)."""
        return self.next_offset - self.start_offset

    @classmethod
    def open(cls, data_dir: Path) -> MetadataLog:
        data_dir = Path(data_dir)
        path = data_dir / FILE_NAME
        try:
            data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            _tighten_dir(data_dir)
            # Kept open: the flock lasts as long as the file. Two controllers appending
            # to one log would interleave records.
            lock_file = lock_directory(
                data_dir, "metadata log is locked by another controller process")
        except OSError as e:
            raise KafkaStorageError(f"cannot open metadata log: {e}", path=str(data_dir)) from e
        try:
            tmp = path.with_name(path.name + TMP_SUFFIX)
            tmp.unlink(missing_ok=True)  # an unfinished compaction
            created = not path.exists()
            file = _open_private(path)  # owned by the MetadataLog
            if created:
                _fsync_dir(data_dir)
        except OSError as e:
            lock_file.close()
            raise KafkaStorageError(f"cannot open metadata log: {e}", path=str(path)) from e
        try:
            file.seek(0)
            data = file.read()
            records, valid_bytes = _decode_all(data, str(path))
            if valid_bytes < len(data):
                log.warning("metadata log %s: cutting torn tail of %d bytes at position %d",
                            path, len(data) - valid_bytes, valid_bytes)
                file.truncate(valid_bytes)
                file.flush()
                os.fsync(file.fileno())
        except OSError as e:
            file.close()
            lock_file.close()
            raise KafkaStorageError(f"cannot recover metadata log: {e}", path=str(path)) from e
        except BaseException:
            file.close()
            lock_file.close()
            raise
        try:
            start_offset = _pop_log_start(records, str(path))
        except CorruptFileError:
            file.close()
            lock_file.close()
            raise
        return cls(data_dir, lock_file, file, records, start_offset, valid_bytes)

    def recovered_records(self) -> Iterator[tuple[int, MetadataRecord]]:
        """(offset, record) for every record found at open, in order (once)."""
        records, self._recovered = self._recovered, []
        for i, record in enumerate(records):
            yield self.start_offset + i, record

    def append(self, records: Iterable[MetadataRecord]) -> int:
        """Write and fsync ``records``; returns the offset of the first one."""
        self._check_usable()
        frame_list = [encode_frame(r) for r in records]
        first_offset = self.next_offset
        if not frame_list:
            return first_offset
        frames = b"".join(frame_list)
        try:
            self._file.write(frames)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            self._failure = e
            raise KafkaStorageError(f"cannot write metadata log: {e}", path=str(self.path)) from e
        self.size_bytes += len(frames)
        self.next_offset += len(frame_list)
        return first_offset

    def rewrite(self, records: list[MetadataRecord]) -> int:
        """Replace the whole file by ``records`` (a snapshot); returns the first one's offset.

        Offsets continue from ``next_offset``: the snapshot's records get new,
        larger offsets, so epochs derived from offsets never repeat.
        """
        self._check_usable()
        first_offset = self.next_offset
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        data = encode_frame({"type": LOG_START, "next_offset": first_offset})
        data += b"".join(encode_frame(r) for r in records)
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE),
                           "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        except OSError as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # removed at the next open
            raise KafkaStorageError(f"cannot compact metadata log (unchanged): {e}",
                                    path=str(self.path)) from e
        try:
            os.replace(tmp, self.path)
            _fsync_dir(self.data_dir)
            new_file = _open_private(self.path)  # owned by the MetadataLog
        except OSError as e:
            self._failure = e
            raise KafkaStorageError(f"cannot compact metadata log: {e}", path=str(self.path)) from e
        self._file.close()
        self._file = new_file
        self.start_offset = first_offset
        self.next_offset = first_offset + len(records)
        self.size_bytes = len(data)
        return first_offset

    def close(self) -> None:
        try:
            self._file.close()  # flushes: after a failure that may fail again
        except OSError as e:
            if self._failure is None:
                raise
            log.warning("closing the failed metadata log %s: %s", self.path, e)
        finally:
            self._lock_file.close()  # releases the flock


def read_records(path: Path) -> tuple[int, list[MetadataRecord]]:
    """A metadata log file's (offset of its first record, records), read only: a torn
    tail is left out as ``open`` would cut it, the file is not touched (the quorum
    migration reads a log, or a copy of one, that no controller runs on)."""
    records, _ = _decode_all(path.read_bytes(), str(path))
    return _pop_log_start(records, str(path)), records


def _pop_log_start(records: list[MetadataRecord], path: str) -> int:
    """Remove a leading ``log_start`` record; the offset of the first record left."""
    if not records or records[0].get("type") != LOG_START:
        return 0
    try:
        return int(records.pop(0)["next_offset"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptFileError(f"bad log_start record: {e!r}", path=path) from e


def _decode_all(data: bytes, path: str) -> tuple[list[MetadataRecord], int]:
    """Every complete, valid record in ``data`` and the byte length they span."""
    records: list[MetadataRecord] = []
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < FRAME_HEADER.size:
            break  # torn header
        length, crc = FRAME_HEADER.unpack_from(data, pos)
        if not 0 < length <= RECORD_BYTES_MAX:
            if not any(data[pos:]):
                break  # zeros after the last record: blocks allocated, never written
            raise CorruptFileError(f"bad record length {length} at position {pos}", path=path)
        payload_start = pos + FRAME_HEADER.size
        if end - payload_start < length:
            break  # torn payload
        payload = data[payload_start:payload_start + length]
        if crc32c.crc32c(payload) != crc:
            if payload_start + length == end:
                break  # the last frame, half-written: torn
            raise CorruptFileError(f"CRC mismatch in record at position {pos}", path=path)
        try:
            record = json.loads(payload)
        except (ValueError, RecursionError) as e:
            # RecursionError: JSON nested deeper than the parser's stack (a payload of
            # 100,000 "["), which no record the controller writes is.
            raise CorruptFileError(f"record at position {pos} is not JSON: "
                                   f"{type(e).__name__}: {str(e)[:200]}", path=path) from None
        if not isinstance(record, dict) or "type" not in record:
            raise CorruptFileError(f"record at position {pos} has no type", path=path)
        if record["type"] == LOG_START and pos != 0:
            raise CorruptFileError(f"log_start record at position {pos}", path=path)
        records.append(record)
        pos = payload_start + length
    return records, pos
