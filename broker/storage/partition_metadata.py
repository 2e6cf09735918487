"""``partition.metadata``: which topic incarnation a partition directory belongs to (KIP-516).

Kafka's file, byte for byte: UTF-8 text, two lines, each ending in ``\\n``::

    version: 0
    topic_id: <topic ID, 22 characters of URL-safe base64 without padding>

It lives in every partition directory (``<topic>-<partition>/partition.metadata``)
next to the segments. A log gets it when it is created for a topic ID, or, for
a log made before topic IDs (no file), when the first LeaderAndIsr names its
ID; it is never rewritten with another ID: a log whose ID differs from the one
the controller names is moved aside for deletion instead (``LogManager.delete``).

Writes go through ``write_file_atomically`` (``partition.metadata.tmp``, fsync,
rename, directory fsync): a crash leaves the old file (or none) and maybe a
``.tmp``, which opening the log removes with the other leftovers. Ordering: the
file is durable before the log takes its first record, so a directory without
it holds only records written before topic IDs existed.

Reading: a missing file is ``None`` (no ID yet); anything else that is not
exactly the format above (another version, a line missing or extra, a bad or
reserved ID) is a ``CorruptFileError`` carrying the path and line.
"""

from __future__ import annotations

from pathlib import Path

from tidewater.broker.storage.checkpoints import write_file_atomically
from tidewater.proto.errors import CorruptFileError, KafkaStorageError
from tidewater.proto.topic_id import is_valid_topic_id, topic_id_from_text, topic_id_to_text

PARTITION_METADATA_FILE = "partition.metadata"
VERSION = 0


def encode_partition_metadata(topic_id: bytes) -> bytes:
    return f"version: {VERSION}\ntopic_id: {topic_id_to_text(topic_id)}\n".encode()


def decode_partition_metadata(data: bytes, path: str = PARTITION_METADATA_FILE) -> bytes:
    """The topic ID in a file's bytes; CorruptFileError (path, line) for anything malformed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"not UTF-8: {e}", path=path) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != 2:
        raise CorruptFileError(f"expected 2 lines, found {len(lines)}", path=path)
    values = []
    for number, (line, key) in enumerate(zip(lines, ("version", "topic_id"), strict=True), 1):
        name, sep, value = line.partition(":")
        if not sep or name.strip() != key:
            raise CorruptFileError(f"expected '{key}: ...', found {line!r}", path=path,
                                   line=number)
        values.append(value.strip())
    if values[0] != str(VERSION):
        raise CorruptFileError(f"unsupported version {values[0]!r}", path=path, line=1)
    try:
        topic_id = topic_id_from_text(values[1])
    except ValueError as e:
        raise CorruptFileError(str(e), path=path, line=2) from None
    if not is_valid_topic_id(topic_id):
        raise CorruptFileError(f"reserved topic id {values[1]}", path=path, line=2)
    return topic_id


def read_partition_metadata(directory: Path) -> bytes | None:
    """The topic ID of the partition directory, None when it has no file (yet)."""
    path = Path(directory) / PARTITION_METADATA_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KafkaStorageError(f"cannot read {PARTITION_METADATA_FILE}: {e}",
                                path=str(path)) from e
    return decode_partition_metadata(data, str(path))


def write_partition_metadata(directory: Path, topic_id: bytes) -> None:
    """Write the file atomically (KafkaStorageError on a disk error, the old file intact)."""
    write_file_atomically(Path(directory) / PARTITION_METADATA_FILE,
                          encode_partition_metadata(topic_id))
