"""The controller's durable metadata log: an append-only file of JSON records.

On-disk format (``<data-dir>/metadata.log``), one frame per record, nothing else::

    offset  size  field
    0       4     payload_length   uint32 big-endian, 1..RECORD_BYTES_MAX
    4       4     crc32c           uint32 big-endian, CRC-32C of the payload
    8       n     payload          UTF-8 JSON object with a "type" key

A record's *offset* is its index in the file (0 for the first). Offsets never
change (there is no compaction), so the controller uses them as broker epochs.

Recovery: frames are read in order. A frame that is cut short (fewer bytes
than its header announces), or the very last frame when its CRC fails, is a
torn write from a crash: the file is truncated at the frame's start and the
truncation fsynced. A bad frame with more data after it, or a frame whose
payload is not a JSON object, is corruption: ``CorruptFileError`` with the path
and byte position, and nothing is modified.

Only one process may use a log: ``open`` takes an exclusive ``flock`` on the
file and fails with ``KafkaStorageError`` when another process holds it.

Durability: ``append`` writes all frames of a batch with one write and fsyncs
the file before returning; the directory is fsynced when the file is created.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import crc32c

from proto.errors import CorruptFileError, KafkaStorageError

log = logging.getLogger(__name__)

FILE_NAME = "metadata.log"
FRAME_HEADER = struct.Struct(">II")  # payload_length, crc32c
assert FRAME_HEADER.size == 8
RECORD_BYTES_MAX = 16 * 1024 * 1024  # a topic with many partitions still fits


def encode_frame(record: dict) -> bytes:
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


class MetadataLog:
    """Append-only record file. Open with ``MetadataLog.open`` which recovers it."""

    def __init__(self, path: Path, file, records: list[dict], size_bytes: int):
        self.path = path
        self._file = file
        self._recovered = records
        self.size_bytes = size_bytes
        self.next_offset = len(records)

    @classmethod
    def open(cls, data_dir: Path) -> MetadataLog:
        data_dir = Path(data_dir)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            path = data_dir / FILE_NAME
            created = not path.exists()
            file = open(path, "a+b")  # noqa: SIM115 - owned by the MetadataLog
        except OSError as e:
            raise KafkaStorageError(f"cannot open metadata log: {e}", path=str(data_dir)) from e
        try:
            # Two controllers appending to one log would interleave records.
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            file.close()
            raise KafkaStorageError("metadata log is locked by another controller process",
                                    path=str(path)) from e
        try:
            if created:
                _fsync_dir(data_dir)
        except OSError as e:
            file.close()
            raise KafkaStorageError(f"cannot sync {data_dir}: {e}", path=str(data_dir)) from e
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
        except BaseException:
            file.close()
            raise
        return cls(path, file, records, valid_bytes)

    def recovered_records(self) -> Iterator[tuple[int, dict]]:
        """(offset, record) for every record found at open, in order (once)."""
        records, self._recovered = self._recovered, []
        yield from enumerate(records)

    def append(self, records: Iterable[dict]) -> int:
        """Write and fsync ``records``; returns the offset of the first one."""
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
            raise KafkaStorageError(f"cannot write metadata log: {e}", path=str(self.path)) from e
        self.size_bytes += len(frames)
        self.next_offset += len(frame_list)
        return first_offset

    def close(self) -> None:
        self._file.close()


def _decode_all(data: bytes, path: str) -> tuple[list[dict], int]:
    """Every complete, valid record in ``data`` and the byte length they span."""
    records: list[dict] = []
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < FRAME_HEADER.size:
            break  # torn header
        length, crc = FRAME_HEADER.unpack_from(data, pos)
        if not 0 < length <= RECORD_BYTES_MAX:
            if _is_tail_garbage(data, pos):
                break
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
        except ValueError as e:
            raise CorruptFileError(f"record at position {pos} is not JSON: {e}", path=path) from e
        if not isinstance(record, dict) or "type" not in record:
            raise CorruptFileError(f"record at position {pos} has no type", path=path)
        records.append(record)
        pos = payload_start + length
    return records, pos


def _is_tail_garbage(data: bytes, pos: int) -> bool:
    # A torn append can leave zeros (pre-allocated blocks) after the last record.
    return not any(data[pos:])
