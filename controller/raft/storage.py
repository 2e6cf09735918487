"""A controller's durable Raft state: the log, the quorum state, the snapshot.

Files in ``<raft-dir>``::

    quorum-state        epoch, vote, leader, own directory id, bootstrap voters (format below)
    quorum-state.tmp    a write in progress (deleted at open: the rename never happened)
    raft.log            the log entries after the snapshot (format below)
    raft.log.tmp        a prefix cut in progress (deleted at open)
    snapshot-*.snap     snapshots (``snapshot_file``): only the newest is kept
    raft.lock           held with flock(LOCK_EX) while a process uses the directory (two
                        processes on one directory would vote twice in an epoch)

``quorum-state`` (big-endian, ``QUORUM_HEADER`` then voters)::

    offset  size  field
    0       4     magic              b"TWQS"
    4       2     version            1
    6       4     crc32c             CRC-32C of every byte after this field
    10      16    directory_id       this replica's directory id (KIP-853), set at format
    26      8     epoch              uint64
    34      4     voted_for_id       int32, -1: no vote in this epoch
    38      16    voted_for_dir      zeros when there is no vote
    54      4     leader_id          int32, -1: no leader known in this epoch
    58      2     voter_count        the bootstrap voter set, then voter_count x:
    60      20    voter              id int32, directory id 16 bytes

It is only ever replaced whole: written to ``.tmp``, fsynced, renamed over,
and the directory fsynced, so a crash leaves the old or the new file. Any
mismatch (magic, version, CRC, size) is corruption: ``CorruptRaftFileError``.

``raft.log`` is a header then frames::

    offset  size  field
    0       4     magic              b"TWRL"
    4       2     version            1
    6       8     log_start_offset   the offset of the first frame (the snapshot's end)
    frame:
    0       4     data_length        uint32, 0..ENTRY_DATA_BYTES_MAX
    4       8     offset             uint64, log_start_offset + frame index
    12      4     epoch              uint32, never decreasing
    16      1     kind               EntryKind
    17      4     data_crc32c        CRC-32C of data
    21      4     header_crc32c      CRC-32C of bytes 0..21 of the frame
    25      n     data

Recovery: frames are read in order. A torn write (a crash during an append
leaves a prefix of the bytes written, perhaps zeros after it) is cut: fewer
bytes left than a header, a header and everything after it zeros, a good
header whose data is cut short, or a last frame whose data CRC fails. The file
is cut at that frame's start and the cut fsynced. Anything else is corruption
(a complete header whose CRC fails, a bad data CRC with frames after it, an
offset out of sequence, a decreasing epoch, an unknown kind):
``CorruptRaftFileError`` with the path and byte position; nothing is modified.
The header has its own CRC so that a damaged length is never taken for a torn
tail (which would cut good frames after it).

Durability, in ``carry_out``'s order (a ``Ready``'s field order): a snapshot is
durable (``snapshot_file``) before the log behind it is cut; a truncation is
fsynced before an append that follows it; an append is one write then fsync;
the quorum state is replaced atomically after the log. Only then does the
shell send the Ready's messages. A failed write or fsync marks the storage
``failed``: it refuses every later write (nobody knows what reached the disk)
and the process must restart; recovery cuts the torn tail.
"""

from __future__ import annotations

import fcntl
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import crc32c

from tidewater.controller.raft import snapshot_file
from tidewater.controller.raft.files import TMP_SUFFIX, CorruptRaftFileError, write_atomically
from tidewater.controller.raft.messages import Entry, EntryKind, Snapshot, VoterKey
from tidewater.controller.raft.node import QuorumState, Ready
from tidewater.proto.errors import InvariantViolation, KafkaStorageError

QUORUM_STATE_FILE = "quorum-state"
LOG_FILE = "raft.log"
LOCK_FILE = "raft.lock"

QUORUM_MAGIC = b"TWQS"
QUORUM_HEADER = struct.Struct(">4sHI16sQi16siH")
assert QUORUM_HEADER.size == 60
VOTER = struct.Struct(">i16s")
assert VOTER.size == 20
QUORUM_VERSION = 1

LOG_MAGIC = b"TWRL"
LOG_HEADER = struct.Struct(">4sHQ")
assert LOG_HEADER.size == 14
LOG_VERSION = 1
FRAME_HEADER = struct.Struct(">IQIBII")  # data_length, offset, epoch, kind, data crc, header crc
assert FRAME_HEADER.size == 25
FRAME_HEADER_CRC_AT = 21  # the header CRC covers the bytes before it
ENTRY_DATA_BYTES_MAX = 16 * 1024 * 1024


def _dir_bytes(directory_id: str) -> bytes:
    raw = bytes.fromhex(directory_id)
    if len(raw) != 16:
        raise ValueError(f"directory id {directory_id!r} is not 16 bytes of hex")
    return raw


# ---- quorum state ---------------------------------------------------------------------


@dataclass(frozen=True)
class QuorumStateFile:
    directory_id: str
    state: QuorumState
    bootstrap_voters: frozenset[VoterKey]


def encode_quorum_state(content: QuorumStateFile) -> bytes:
    state = content.state
    voted = state.voted_for
    body = QUORUM_HEADER.pack(
        QUORUM_MAGIC, QUORUM_VERSION, 0, _dir_bytes(content.directory_id), state.epoch,
        voted.id if voted else -1, _dir_bytes(voted.directory_id) if voted else bytes(16),
        -1 if state.leader_id is None else state.leader_id, len(content.bootstrap_voters))
    body += b"".join(VOTER.pack(v.id, _dir_bytes(v.directory_id))
                     for v in sorted(content.bootstrap_voters))
    crc = crc32c.crc32c(body[10:])
    return body[:6] + struct.pack(">I", crc) + body[10:]


def decode_quorum_state(data: bytes, path: Path) -> QuorumStateFile:
    if len(data) < QUORUM_HEADER.size:
        raise CorruptRaftFileError("quorum state cut short", path=path, position=len(data))
    (magic, version, crc, directory, epoch, voted_id, voted_dir, leader_id,
     count) = QUORUM_HEADER.unpack_from(data)
    if magic != QUORUM_MAGIC or version != QUORUM_VERSION:
        raise CorruptRaftFileError("not a quorum-state file (magic/version)", path=path, position=0)
    if crc32c.crc32c(data[10:]) != crc:
        raise CorruptRaftFileError("quorum state CRC mismatch", path=path, position=6)
    if len(data) != QUORUM_HEADER.size + count * VOTER.size:
        raise CorruptRaftFileError("quorum state size does not match its voter count",
                                   path=path, position=len(data))
    voters = frozenset(VoterKey(i, d.hex()) for i, d in (
        VOTER.unpack_from(data, QUORUM_HEADER.size + n * VOTER.size) for n in range(count)))
    voted_for = VoterKey(voted_id, voted_dir.hex()) if voted_id >= 0 else None
    return QuorumStateFile(directory.hex(),
                           QuorumState(epoch, voted_for, None if leader_id < 0 else leader_id),
                           voters)


# ---- log --------------------------------------------------------------------------------


def encode_frame(entry: Entry) -> bytes:
    if len(entry.data) > ENTRY_DATA_BYTES_MAX:
        raise ValueError(f"entry of {len(entry.data)} bytes is too large")
    header = FRAME_HEADER.pack(len(entry.data), entry.offset, entry.epoch, int(entry.kind),
                               crc32c.crc32c(entry.data), 0)[:FRAME_HEADER_CRC_AT]
    return header + struct.pack(">I", crc32c.crc32c(header)) + entry.data


@dataclass
class RecoveredLog:
    log_start_offset: int
    entries: list[Entry]
    positions: list[int]  # byte position of each entry's frame
    valid_bytes: int  # where the good frames end (the file is cut here if longer)


def read_log(data: bytes, path: Path) -> RecoveredLog:
    """Parse ``raft.log``; a torn tail is left out (``valid_bytes`` says where to cut)."""
    if len(data) < LOG_HEADER.size:
        raise CorruptRaftFileError("log header cut short", path=path, position=0)
    magic, version, start = LOG_HEADER.unpack_from(data)
    if magic != LOG_MAGIC or version != LOG_VERSION:
        raise CorruptRaftFileError("not a raft log (magic/version)", path=path, position=0)
    entries: list[Entry] = []
    positions: list[int] = []
    position = LOG_HEADER.size
    while position < len(data):
        header = data[position:position + FRAME_HEADER.size]
        if len(header) < FRAME_HEADER.size:
            break  # torn: a header cut short
        if not any(data[position:]):
            break  # torn: zeros a crash left where the appends would have gone
        length, offset, epoch, kind, data_crc, header_crc = FRAME_HEADER.unpack(header)
        if crc32c.crc32c(header[:FRAME_HEADER_CRC_AT]) != header_crc:
            raise CorruptRaftFileError("frame header CRC mismatch", path=path, position=position)
        if length > ENTRY_DATA_BYTES_MAX:
            raise CorruptRaftFileError("frame length out of bounds", path=path, position=position)
        end = position + FRAME_HEADER.size + length
        if end > len(data):
            break  # torn: the data cut short
        if crc32c.crc32c(data[position + FRAME_HEADER.size:end]) != data_crc:
            if end == len(data):
                break  # torn: the last frame, half written
            raise CorruptRaftFileError("frame data CRC mismatch", path=path, position=position)
        expected = start + len(entries)
        if offset != expected:
            raise CorruptRaftFileError(f"frame offset {offset}, expected {expected}",
                                       path=path, position=position)
        if entries and epoch < entries[-1].epoch:
            raise CorruptRaftFileError(f"epoch {epoch} after {entries[-1].epoch}",
                                       path=path, position=position)
        try:
            entry_kind = EntryKind(kind)
        except ValueError:
            raise CorruptRaftFileError(f"unknown entry kind {kind}", path=path,
                                       position=position) from None
        entries.append(Entry(offset, epoch, entry_kind, data[position + FRAME_HEADER.size:end]))
        positions.append(position)
        position = end
    return RecoveredLog(start, entries, positions, position)


class RaftStorage:
    """One node's Raft directory. ``format`` once, then ``open`` (which recovers)."""

    def __init__(self, directory: Path, quorum: QuorumStateFile, snapshot: Snapshot | None,
                 recovered: RecoveredLog, file: IO[bytes], lock_file: IO[bytes]):
        self.directory = directory
        self._lock_file = lock_file
        self.local_directory_id = quorum.directory_id
        self.bootstrap_voters = quorum.bootstrap_voters
        self.quorum_state = quorum.state
        self.snapshot = snapshot
        self.log_start_offset = recovered.log_start_offset
        self.entries = recovered.entries  # what open() recovered (the node keeps its own copy)
        self._positions = recovered.positions
        self._size_bytes = recovered.valid_bytes
        self._file = file
        self._failure: OSError | None = None

    @staticmethod
    def format(directory: Path, node_id: int, bootstrap_voters: frozenset[VoterKey],
               directory_id: str | None = None, snapshot: Snapshot | None = None) -> VoterKey:
        """Create a Raft directory with a new directory id (KIP-853): empty, or holding
        ``snapshot`` (a migrated image) with the log starting at its end and the quorum
        state in its epoch. The quorum state, which marks the directory formatted, is
        written last: a crash before it leaves a directory that is not formatted."""
        directory.mkdir(parents=True, exist_ok=True)
        if (directory / QUORUM_STATE_FILE).exists():
            raise FileExistsError(f"{directory} is formatted already")
        directory_id = directory_id or uuid.uuid4().hex
        start_offset = 0
        state = QuorumState()
        if snapshot is not None:
            snapshot_file.write(directory, snapshot)
            start_offset = snapshot.snapshot_id.offset
            state = QuorumState(snapshot.snapshot_id.epoch, None, None)
        write_atomically(directory / LOG_FILE,
                         LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, start_offset))
        write_atomically(directory / QUORUM_STATE_FILE, encode_quorum_state(
            QuorumStateFile(directory_id, state, bootstrap_voters)))
        return VoterKey(node_id, directory_id)

    @classmethod
    def open(cls, directory: Path) -> RaftStorage:
        lock_file = open(directory / LOCK_FILE, "a+b")  # kept open: the flock lasts with it
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            lock_file.close()
            raise KafkaStorageError("raft directory is locked by another process",
                                    path=str(directory)) from e
        try:
            return cls._open_locked(directory, lock_file)
        except BaseException:
            lock_file.close()
            raise

    @classmethod
    def _open_locked(cls, directory: Path, lock_file: IO[bytes]) -> RaftStorage:
        for leftover in (QUORUM_STATE_FILE, LOG_FILE):
            (directory / (leftover + TMP_SUFFIX)).unlink(missing_ok=True)
        quorum_path = directory / QUORUM_STATE_FILE
        quorum = decode_quorum_state(quorum_path.read_bytes(), quorum_path)
        snapshot = snapshot_file.recover(directory)
        log_path = directory / LOG_FILE
        recovered = read_log(log_path.read_bytes(), log_path)
        file = open(log_path, "r+b")
        if file.seek(0, os.SEEK_END) > recovered.valid_bytes:
            file.truncate(recovered.valid_bytes)  # cut the torn tail, durably
            os.fsync(file.fileno())
        snapshot_end = snapshot.snapshot_id.offset if snapshot else 0
        if recovered.log_start_offset > snapshot_end:
            raise CorruptRaftFileError(
                f"log starts at {recovered.log_start_offset}, after the snapshot's end "
                f"{snapshot_end}", path=log_path, position=6)
        storage = cls(directory, quorum, snapshot, recovered, file, lock_file)
        if recovered.log_start_offset < snapshot_end:
            # A crash between writing a snapshot and cutting the log: cut it now.
            storage._rewrite_from(snapshot_end)
        return storage

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def log_end_offset(self) -> int:
        return self.log_start_offset + len(self._positions)

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise KafkaStorageError(f"raft storage failed earlier ({self._failure}); restart",
                                    path=str(self.directory))

    def carry_out(self, ready: Ready) -> None:
        """Make the durable part of ``ready`` durable, in its field order."""
        self._check_usable()
        try:
            if ready.snapshot_write is not None:
                snapshot_file.write(self.directory, ready.snapshot_write)
                self.snapshot = ready.snapshot_write
                self._rewrite_from(ready.snapshot_write.snapshot_id.offset)
            if ready.snapshot_install is not None:
                snapshot_file.write(self.directory, ready.snapshot_install)
                self.snapshot = ready.snapshot_install
                # the leader's snapshot replaces our whole log, whatever it held after the end
                self._rewrite_from(ready.snapshot_install.snapshot_id.offset, keep_after=False)
            if ready.log_truncate_to is not None:
                self._truncate(ready.log_truncate_to)
            if ready.log_append:
                self._append(ready.log_append)
            if ready.quorum_state is not None:
                write_atomically(self.directory / QUORUM_STATE_FILE, encode_quorum_state(
                    QuorumStateFile(self.local_directory_id, ready.quorum_state,
                                    self.bootstrap_voters)))
                self.quorum_state = ready.quorum_state
        except OSError as e:
            self._failure = e
            raise KafkaStorageError(f"raft storage write failed: {e}",
                                    path=str(self.directory)) from e
        if ready.log_end_offset != self.log_end_offset:
            raise InvariantViolation(f"raft storage ends at {self.log_end_offset}, the Ready at "
                                     f"{ready.log_end_offset}")

    def _truncate(self, end_offset: int) -> None:
        if end_offset < self.log_start_offset:
            raise InvariantViolation(f"truncation to {end_offset} below log start "
                                     f"{self.log_start_offset}")
        keep = end_offset - self.log_start_offset
        if keep >= len(self._positions):
            return
        self._size_bytes = self._positions[keep]
        del self._positions[keep:]
        self._file.truncate(self._size_bytes)
        os.fsync(self._file.fileno())

    def _append(self, entries: tuple[Entry, ...]) -> None:
        frames = bytearray()
        for entry in entries:
            if entry.offset != self.log_end_offset:
                raise InvariantViolation(f"append of {entry.offset} at {self.log_end_offset}")
            self._positions.append(self._size_bytes + len(frames))
            frames += encode_frame(entry)
        self._file.seek(self._size_bytes)
        self._file.write(frames)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._size_bytes += len(frames)

    def _rewrite_from(self, start_offset: int, *, keep_after: bool = True) -> None:
        """Cut the log's prefix before ``start_offset`` (all of it unless ``keep_after``):
        tmp, fsync, rename, directory fsync."""
        path = self.directory / LOG_FILE
        self._file.flush()
        recovered = read_log(path.read_bytes(), path)
        keep = [e for e in recovered.entries if e.offset >= start_offset and keep_after]
        if keep and keep[0].offset != start_offset:
            keep = []
        data = bytearray(LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, start_offset))
        positions = []
        for entry in keep:
            positions.append(len(data))
            data += encode_frame(entry)
        write_atomically(path, bytes(data))
        self._file.close()
        self._file = open(path, "r+b")
        self.log_start_offset = start_offset
        self.entries = keep
        self._positions = positions
        self._size_bytes = len(data)

    def close(self) -> None:
        self._file.close()
        self._lock_file.close()
