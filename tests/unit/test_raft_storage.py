"""The Raft files: round trips, recovery that cuts only a torn tail, corruption found with
its position, and a node restarted from its directory."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.controller.raft import (
    Entry,
    EntryKind,
    QuorumState,
    RaftConfig,
    RaftNode,
    Ready,
    Snapshot,
    SnapshotId,
    VoterKey,
    snapshot_file,
)
from tidewater.controller.raft.files import CorruptRaftFileError
from tidewater.controller.raft.storage import (
    LOG_FILE,
    LOG_HEADER,
    QUORUM_STATE_FILE,
    RaftStorage,
)
from tidewater.proto.errors import KafkaStorageError

pytestmark = pytest.mark.timeout(120)

DIR_A = "a" * 32
VOTERS = frozenset({VoterKey(1, DIR_A), VoterKey(2, "b" * 32), VoterKey(3, "c" * 32)})
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def entries(start: int, count: int, epoch: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(o, epoch, EntryKind.DATA, f"record {o}".encode() * (o % 4))
                 for o in range(start, start + count))


def ready(*, append: tuple[Entry, ...] = (), truncate_to: int | None = None,
          quorum_state: QuorumState | None = None, snapshot: Snapshot | None = None,
          log_end_offset: int) -> Ready:
    return Ready(snapshot_write=snapshot, snapshot_install=None, log_truncate_to=truncate_to,
                 log_append=append, quorum_state=quorum_state, send=(), committed=(),
                 log_end_offset=log_end_offset)


def formatted(directory: Path) -> Path:
    RaftStorage.format(directory, 1, VOTERS, directory_id=DIR_A)
    return directory


def test_round_trip_of_log_truncation_and_quorum_state(tmp_path):
    formatted(tmp_path)
    storage = RaftStorage.open(tmp_path)
    storage.carry_out(ready(append=entries(0, 10), log_end_offset=10))
    storage.carry_out(ready(truncate_to=6, append=entries(6, 2, epoch=2),
                            quorum_state=QuorumState(2, VoterKey(2, "b" * 32), None),
                            log_end_offset=8))
    storage.close()
    reopened = RaftStorage.open(tmp_path)
    assert reopened.entries == [*entries(0, 6), *entries(6, 2, epoch=2)]
    assert reopened.quorum_state == QuorumState(2, VoterKey(2, "b" * 32), None)
    assert reopened.local_directory_id == DIR_A
    assert reopened.bootstrap_voters == VOTERS


def test_a_new_format_gets_a_new_directory_id(tmp_path):
    first = RaftStorage.format(tmp_path / "x", 1, VOTERS)
    shutil.rmtree(tmp_path / "x")  # the disk is lost
    second = RaftStorage.format(tmp_path / "x", 1, VOTERS)
    assert first.id == second.id and first.directory_id != second.directory_id
    with pytest.raises(FileExistsError):
        RaftStorage.format(tmp_path / "x", 1, VOTERS)


@SETTINGS
@given(count=st.integers(1, 12), cut=st.integers(0, 10_000))
def test_a_cut_log_recovers_a_prefix_and_cuts_at_a_frame_boundary(tmp_path_factory, count, cut):
    directory = formatted(tmp_path_factory.mktemp("cut"))
    storage = RaftStorage.open(directory)
    written = entries(0, count)
    storage.carry_out(ready(append=written, log_end_offset=count))
    storage.close()
    path = directory / LOG_FILE
    data = path.read_bytes()
    cut_at = LOG_HEADER.size + cut % (len(data) - LOG_HEADER.size + 1)
    path.write_bytes(data[:cut_at])
    recovered = RaftStorage.open(directory)
    assert list(written[:len(recovered.entries)]) == recovered.entries
    assert (cut_at == len(data)) == (len(recovered.entries) == count)
    # the torn tail is gone from the file, and the log takes appends again
    end = len(recovered.entries)
    recovered.carry_out(ready(append=entries(end, 2), log_end_offset=end + 2))
    recovered.close()
    assert RaftStorage.open(directory).entries == [*written[:end], *entries(end, 2)]


@SETTINGS
@given(count=st.integers(1, 12), where=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_a_flipped_byte_is_found_or_only_the_last_frame_is_cut(tmp_path_factory, count, where,
                                                              flip):
    directory = formatted(tmp_path_factory.mktemp("flip"))
    storage = RaftStorage.open(directory)
    written = entries(0, count)
    storage.carry_out(ready(append=written, log_end_offset=count))
    storage.close()
    path = directory / LOG_FILE
    data = bytearray(path.read_bytes())
    position = where % len(data)
    data[position] ^= flip
    path.write_bytes(bytes(data))
    try:
        recovered = RaftStorage.open(directory)
    except CorruptRaftFileError as e:
        # found at the frame the flipped byte belongs to (or the first frame, when the
        # log header's start offset was hit)
        assert e.path == str(path) and 0 <= e.position <= max(position, LOG_HEADER.size)
        return
    # Only damage to the last frame may pass as a torn write: everything before it is kept.
    assert recovered.entries == list(written[:count - 1])


@SETTINGS
@given(where=st.integers(0, 10_000), flip=st.integers(1, 255), cut=st.booleans())
def test_a_damaged_quorum_state_is_corruption(tmp_path_factory, where, flip, cut):
    directory = formatted(tmp_path_factory.mktemp("qs"))
    path = directory / QUORUM_STATE_FILE
    data = bytearray(path.read_bytes())
    position = where % len(data)
    if cut:
        data = data[:position]
    else:
        data[position] ^= flip
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRaftFileError) as raised:
        RaftStorage.open(directory)
    assert raised.value.path == str(path)


@SETTINGS
@given(where=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_a_damaged_snapshot_is_corruption(tmp_path_factory, where, flip):
    directory = tmp_path_factory.mktemp("snap")
    snapshot = Snapshot(SnapshotId(7, 2), VOTERS, b"image bytes")
    path = snapshot_file.write(directory, snapshot)
    assert snapshot_file.recover(directory) == snapshot
    data = bytearray(path.read_bytes())
    data[where % len(data)] ^= flip
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRaftFileError):
        snapshot_file.recover(directory)


def test_a_snapshot_cuts_the_log_behind_it_and_survives_a_restart(tmp_path):
    formatted(tmp_path)
    storage = RaftStorage.open(tmp_path)
    storage.carry_out(ready(append=entries(0, 10), log_end_offset=10))
    snapshot = Snapshot(SnapshotId(6, 1), VOTERS, b"image")
    storage.carry_out(ready(snapshot=snapshot, log_end_offset=10))
    assert storage.log_start_offset == 6
    storage.close()
    reopened = RaftStorage.open(tmp_path)
    assert reopened.snapshot == snapshot
    assert reopened.log_start_offset == 6 and reopened.entries == list(entries(6, 4))
    newer = Snapshot(SnapshotId(9, 1), VOTERS, b"image 2")
    reopened.carry_out(ready(snapshot=newer, log_end_offset=10))
    assert [p.name for p in tmp_path.glob("snapshot-*")] == [snapshot_file.file_name(newer.snapshot_id)]


def test_a_crash_between_snapshot_and_log_cut_is_finished_at_open(tmp_path):
    formatted(tmp_path)
    storage = RaftStorage.open(tmp_path)
    storage.carry_out(ready(append=entries(0, 5), log_end_offset=5))
    storage.close()
    snapshot_file.write(tmp_path, Snapshot(SnapshotId(3, 1), VOTERS, b"x"))  # then the crash
    reopened = RaftStorage.open(tmp_path)
    assert reopened.log_start_offset == 3 and reopened.entries == list(entries(3, 2))


def run_node(directory: Path, local: VoterKey, now_ms: int) -> tuple[RaftNode, RaftStorage]:
    storage = RaftStorage.open(directory)
    node = RaftNode(RaftConfig(), local, random.Random(1), now_ms,
                    bootstrap_voters=storage.bootstrap_voters, quorum_state=storage.quorum_state,
                    snapshot=storage.snapshot, entries=storage.entries)
    return node, storage


def drain(node: RaftNode, storage: RaftStorage, now_ms: int) -> list[Entry]:
    committed: list[Entry] = []
    while node.has_ready():
        r = node.ready()
        storage.carry_out(r)
        committed += r.committed
        node.advance(r, now_ms)
    return committed


def test_a_single_voter_node_commits_and_restarts_from_its_directory(tmp_path):
    local = RaftStorage.format(tmp_path, 1, frozenset({VoterKey(1, DIR_A)}), directory_id=DIR_A)
    node, storage = run_node(tmp_path, local, 0)
    node.tick(5000)  # election timeout: pre-vote, vote, lead (alone)
    drain(node, storage, 5000)
    assert node.is_leader and node.epoch == 1
    node.propose([b"one", b"two"], 5001)
    committed = drain(node, storage, 5001)
    assert [e.data for e in committed if e.kind is EntryKind.DATA] == [b"one", b"two"]
    node.compact(b"image after two", 5002)
    drain(node, storage, 5002)
    storage.close()
    node, storage = run_node(tmp_path, local, 6000)
    assert node.quorum_state == QuorumState(1, local, 1)
    assert node.snapshot_id == SnapshotId(3, 1) and node.log_end_offset == 3
    node.tick(20_000)  # resigned after the restart; runs again
    drain(node, storage, 20_000)
    assert node.is_leader and node.epoch == 2


def test_an_installed_snapshot_replaces_the_whole_log(tmp_path):
    formatted(tmp_path)
    storage = RaftStorage.open(tmp_path)
    storage.carry_out(ready(append=entries(0, 8), log_end_offset=8))  # a diverged history
    snapshot = Snapshot(SnapshotId(5, 3), VOTERS, b"leader's image")
    storage.carry_out(Ready(snapshot_write=None, snapshot_install=snapshot, log_truncate_to=None,
                            log_append=entries(5, 2, epoch=3), quorum_state=None, send=(),
                            committed=(), log_end_offset=7))
    storage.close()
    reopened = RaftStorage.open(tmp_path)
    assert reopened.snapshot == snapshot
    assert reopened.entries == list(entries(5, 2, epoch=3))


def test_one_process_at_a_time_uses_a_directory(tmp_path):
    formatted(tmp_path)
    storage = RaftStorage.open(tmp_path)
    with pytest.raises(KafkaStorageError, match="locked"):
        RaftStorage.open(tmp_path)
    storage.close()
    RaftStorage.open(tmp_path).close()
