"""Checkpoint files in Kafka's text format, written atomically, and the clean-shutdown marker.

Offset checkpoint files (one per data dir) map a partition to an offset:

- ``replication-offset-checkpoint``: high watermarks,
- ``recovery-point-offset-checkpoint``: offsets below which the log is flushed,
- ``log-start-offset-checkpoint``: first offset still kept after retention,
- ``cleaner-offset-checkpoint``: where the log cleaner's next cleaning of a
  compacted log begins (its first dirty offset; ``cleaner.py``).

Format (UTF-8 text, ``\\n`` line ends; Kafka's ``OffsetCheckpointFile``)::

    0                     <- version, always 0
    2                     <- number of entry lines that follow
    orders 0 1234         <- topic, partition, offset; separated by one space
    payments 3 17

An empty (zero-byte) file reads as no entries; a missing file too. A wrong
version, a last line without its newline (a torn copy), a count that is not the number of entry lines, a malformed line or a
partition listed twice is a ``CorruptFileError`` naming the file and line.

Every write goes to ``<file>.tmp``, is fsynced, renamed over the file, and the
directory is fsynced, so a crash leaves either the old or the new file, never a
mix. An ``OSError`` (full disk, permission) becomes ``KafkaStorageError`` and
leaves the old file as it was.

The clean-shutdown marker ``.kafka_cleanshutdown`` (empty file, Kafka's name)
is written last on a clean shutdown and removed on start-up once the logs are
open; its absence on start-up means the logs must be recovered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import CorruptFileError, KafkaStorageError

CHECKPOINT_VERSION = 0
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
OFFSET_CHECKPOINT_FILE_NAMES = (
    REPLICATION_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
TMP_SUFFIX = ".tmp"

T = TypeVar("T")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write ``<path>.tmp``, fsync, rename, fsync the dir.

    Raises KafkaStorageError (with the path) on any OSError; the old file stays intact.
    """
    path = Path(path)
    tmp_path = path.with_name(path.name + TMP_SUFFIX)
    try:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
        # The rename is durable only once the directory entry is on disk.
        _fsync_dir(path.parent)
    except OSError as e:
        try:
            tmp_path.unlink(missing_ok=True)
        except OSError:
            pass  # the original error is the one worth reporting
        raise KafkaStorageError(f"cannot write checkpoint: {e.strerror or e}", path=str(path)) from e


def read_file_bytes(path: Path) -> bytes | None:
    """The file's bytes, None if it does not exist; other OSErrors become KafkaStorageError."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read checkpoint: {e.strerror or e}", path=str(path)) from e


def parse_checkpoint(data: bytes, path: Path | str,
                     parse_entry: Callable[[list[str]], T]) -> list[T]:
    """Parse Kafka's versioned text checkpoint: version line, count line, entry lines.

    ``parse_entry`` gets the space-separated fields of one entry line and raises
    ValueError when they are malformed. Line numbers in errors are 1-based.
    """
    path = str(path)
    if not data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"not UTF-8 text (byte {e.start})", path=path) from e
    lines = text.split("\n")
    if lines[-1] != "":
        # Every line we write ends in a newline; without it the last value may be cut.
        raise CorruptFileError("last line has no newline (torn write?)", path=path,
                               line=len(lines))
    lines.pop()
    if lines[0] != str(CHECKPOINT_VERSION):
        raise CorruptFileError(f"unsupported version {lines[0]!r}", path=path, line=1)
    if len(lines) < 2:
        raise CorruptFileError("missing entry count", path=path, line=2)
    try:
        expected_count = _parse_int(lines[1])
        if expected_count < 0:
            raise ValueError("negative")
    except ValueError as e:
        raise CorruptFileError(f"malformed entry count {lines[1]!r}", path=path, line=2) from e
    entries: list[T] = []
    for line_number, line in enumerate(lines[2:], start=3):
        try:
            entries.append(parse_entry(line.split(" ")))
        except ValueError as e:
            raise CorruptFileError(f"malformed line {line!r} ({e})", path=path,
                                   line=line_number) from e
    if len(entries) != expected_count:
        raise CorruptFileError(f"count says {expected_count} entries, found {len(entries)}",
                               path=path, line=2)
    return entries


def format_checkpoint(entry_lines: list[str]) -> bytes:
    """Version line, count line, then one line per entry, each ending in ``\\n``."""
    parts = [str(CHECKPOINT_VERSION), str(len(entry_lines)), *entry_lines]
    return ("\n".join(parts) + "\n").encode("utf-8")


def _parse_int(field: str) -> int:
    # int() would accept " 7", "+7" and "7_0"; a checkpoint field is only [-]digits.
    body = field[1:] if field.startswith("-") else field
    if not body.isascii() or not body.isdigit():
        raise ValueError(f"not an integer: {field!r}")
    return int(field)


def _parse_offset_entry(fields: list[str]) -> tuple[TopicPartition, int]:
    if len(fields) != 3:
        raise ValueError(f"expected 'topic partition offset', got {len(fields)} fields")
    topic, partition_text, offset_text = fields
    if not topic:
        raise ValueError("empty topic")
    partition = _parse_int(partition_text)
    if partition < 0:
        raise ValueError(f"negative partition {partition}")
    return TopicPartition(topic, partition), _parse_int(offset_text)


class OffsetCheckpointFile:
    """One offset checkpoint file (``topic partition offset`` lines) in a data dir."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> dict[TopicPartition, int]:
        """Offsets by partition; {} when the file is missing or empty.

        Raises CorruptFileError on a malformed file, KafkaStorageError on an I/O error.
        """
        data = read_file_bytes(self.path)
        if data is None:
            return {}
        offsets: dict[TopicPartition, int] = {}
        for line_index, (tp, offset) in enumerate(
                parse_checkpoint(data, self.path, _parse_offset_entry)):
            if tp in offsets:
                raise CorruptFileError(f"partition {tp.topic}-{tp.partition} listed twice",
                                       path=str(self.path), line=line_index + 3)
            offsets[tp] = offset
        return offsets

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file with ``offsets`` (atomic, fsynced); lines sorted by topic, partition."""
        lines = []
        for (topic, partition), offset in sorted(offsets.items()):
            if not topic or any(c.isspace() for c in topic):
                raise ValueError(f"topic name {topic!r} cannot be written to a checkpoint")
            if partition < 0:
                raise ValueError(f"negative partition {partition}")
            lines.append(f"{topic} {int(partition)} {int(offset)}")
        write_file_atomically(self.path, format_checkpoint(lines))


def write_clean_shutdown_marker(data_dir: Path) -> None:
    """Mark ``data_dir`` as cleanly shut down (call after every log is flushed and checkpointed)."""
    write_file_atomically(Path(data_dir) / CLEAN_SHUTDOWN_FILE, b"")


def has_clean_shutdown_marker(data_dir: Path) -> bool:
    return (Path(data_dir) / CLEAN_SHUTDOWN_FILE).exists()


def remove_clean_shutdown_marker(data_dir: Path) -> None:
    """Remove the marker (on start-up, once logs are open), durably; missing is fine."""
    path = Path(data_dir) / CLEAN_SHUTDOWN_FILE
    try:
        path.unlink(missing_ok=True)
        _fsync_dir(path.parent)
    except OSError as e:
        raise KafkaStorageError(f"cannot remove clean-shutdown marker: {e.strerror or e}",
                                path=str(path)) from e
