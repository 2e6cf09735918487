"""Raft snapshots on disk (KIP-630): the application's image up to an offset.

A snapshot is named by where it ends: ``snapshot-<end offset, 20 digits>-<epoch,
10 digits>.snap`` (the epoch of the last entry it covers). Layout (big-endian)::

    offset  size  field
    0       4     magic          b"TWSN"
    4       2     version        1
    6       4     crc32c         CRC-32C of every byte after this field
    10      8     end_offset     uint64: the snapshot covers offsets [0, end_offset)
    18      4     epoch          uint32: the epoch of the entry at end_offset - 1
    22      2     voter_count    the voter set in force at end_offset, then voter_count x:
    24      20    voter          id int32, directory id 16 bytes
    ..      4     data_length    uint32
    ..      n     data           the application's image (opaque here)

Written whole: ``.tmp``, fsync, rename, directory fsync; then older snapshots
are deleted (the newest is all a node needs: the log after it, or the leader,
has the rest). At open, leftover ``.tmp`` files are deleted and the newest
snapshot is read; a damaged one (magic, CRC, size, or a name that disagrees
with its content) is corruption: ``CorruptRaftFileError``. A crash cannot
tear a snapshot (the rename is atomic), so nothing is cut.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import crc32c

from tidewater.controller.raft.files import (
    TMP_SUFFIX,
    CorruptRaftFileError,
    fsync_dir,
    write_atomically,
)
from tidewater.controller.raft.messages import Snapshot, SnapshotId, VoterKey

MAGIC = b"TWSN"
VERSION = 1
HEADER = struct.Struct(">4sHIQIH")
assert HEADER.size == 24
VOTER = struct.Struct(">i16s")
assert VOTER.size == 20
DATA_LENGTH = struct.Struct(">I")
assert DATA_LENGTH.size == 4
NAME = re.compile(r"^snapshot-(\d{20})-(\d{10})\.snap$")


def file_name(snapshot_id: SnapshotId) -> str:
    return f"snapshot-{snapshot_id.offset:020d}-{snapshot_id.epoch:010d}.snap"


def encode(snapshot: Snapshot) -> bytes:
    sid = snapshot.snapshot_id
    body = bytearray(HEADER.pack(MAGIC, VERSION, 0, sid.offset, sid.epoch, len(snapshot.voters)))
    for voter in sorted(snapshot.voters):
        body += VOTER.pack(voter.id, bytes.fromhex(voter.directory_id))
    body += DATA_LENGTH.pack(len(snapshot.data)) + snapshot.data
    struct.pack_into(">I", body, 6, crc32c.crc32c(bytes(body[10:])))
    return bytes(body)


def decode(data: bytes, path: Path) -> Snapshot:
    if len(data) < HEADER.size:
        raise CorruptRaftFileError("snapshot header cut short", path=path, position=len(data))
    magic, version, crc, end_offset, epoch, count = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptRaftFileError("not a snapshot (magic/version)", path=path, position=0)
    if crc32c.crc32c(data[10:]) != crc:
        raise CorruptRaftFileError("snapshot CRC mismatch", path=path, position=6)
    position = HEADER.size + count * VOTER.size
    if len(data) < position + DATA_LENGTH.size:
        raise CorruptRaftFileError("snapshot cut short", path=path, position=len(data))
    voters = frozenset(VoterKey(i, d.hex()) for i, d in (
        VOTER.unpack_from(data, HEADER.size + n * VOTER.size) for n in range(count)))
    (length,) = DATA_LENGTH.unpack_from(data, position)
    position += DATA_LENGTH.size
    if len(data) != position + length:
        raise CorruptRaftFileError("snapshot size does not match its data length", path=path,
                                   position=position)
    return Snapshot(SnapshotId(end_offset, epoch), voters, data[position:])


def write(directory: Path, snapshot: Snapshot) -> Path:
    """Write ``snapshot`` durably, then delete the older ones."""
    path = directory / file_name(snapshot.snapshot_id)
    write_atomically(path, encode(snapshot))
    removed = False
    for other in directory.glob("snapshot-*.snap"):
        if other != path:
            other.unlink()
            removed = True
    if removed:
        fsync_dir(directory)
    return path


def recover(directory: Path) -> Snapshot | None:
    """The newest snapshot in ``directory`` (older ones and ``.tmp`` leftovers deleted)."""
    for leftover in directory.glob("snapshot-*.snap" + TMP_SUFFIX):
        leftover.unlink()
    named = sorted((int(m.group(1)), int(m.group(2)), p) for p in directory.glob("snapshot-*.snap")
                   if (m := NAME.match(p.name)))
    if not named:
        return None
    offset, epoch, path = named[-1]
    snapshot = decode(path.read_bytes(), path)
    if snapshot.snapshot_id != SnapshotId(offset, epoch):
        raise CorruptRaftFileError(f"snapshot {snapshot.snapshot_id} in a file named for "
                                   f"{SnapshotId(offset, epoch)}", path=path, position=10)
    for _, _, older in named[:-1]:
        older.unlink()
    return snapshot
