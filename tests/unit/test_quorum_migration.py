"""Migrating a single controller's metadata.log into a quorum (``quorum.migration``): the
Raft directory starts with one snapshot holding the replayed image, ending at the log's
next offset (compacted logs included) in an epoch above a formatted-empty directory's;
every controller formatted from the same file holds the same bytes; only the
controller's own log is renamed; nothing is formatted when there is nothing to migrate."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import (
    ClusterMetadata,
    cluster_record,
    controller_epoch_record,
    topic_created_record,
)
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.quorum.formatting import is_formatted, raft_directory
from tidewater.controller.quorum.metadata_app import MetadataApplication
from tidewater.controller.quorum.migration import (
    MIGRATION_EPOCH,
    NothingToMigrateError,
    UnmigratedMetadataLogError,
    migrate_metadata_log,
    require_migrated,
)
from tidewater.controller.raft import SnapshotId, VoterKey
from tidewater.controller.raft.storage import RaftStorage
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto.errors import KafkaStorageError

pytestmark = pytest.mark.timeout(30)

VOTERS = frozenset({VoterKey(1, "11" * 16), VoterKey(2, "22" * 16), VoterKey(3, "33" * 16)})
TOPIC_ID = bytes(range(16))


def write_compacted_log(data_dir: Path) -> int:
    """A metadata log compacted once (its first record is not at offset 0); its next offset."""
    log = MetadataLog.open(data_dir)
    log.append([cluster_record("c-1"), controller_epoch_record(1), controller_epoch_record(2)])
    log.rewrite([cluster_record("c-1"), controller_epoch_record(2)])  # offsets continue at 3
    partition = PartitionRecord("orders", 0, (1, 2), (1, 2), 1, 0, 0, TOPIC_ID)
    log.append([topic_created_record("orders", {"retention.ms": "60000"}, [partition],
                                     topic_id=TOPIC_ID)])
    next_offset = log.next_offset
    log.close()
    return next_offset


def restored(raft_dir: Path) -> tuple[RaftStorage, ClusterMetadata]:
    storage = RaftStorage.open(raft_dir)
    assert storage.snapshot is not None
    app = MetadataApplication(ControllerStateMachine(ControllerConfig()))
    app.restore(storage.snapshot.data, storage.snapshot.snapshot_id.offset)
    return storage, app.machine.metadata


def test_migrated_directory_starts_with_the_image_at_the_logs_next_offset(tmp_path):
    data_dir = tmp_path / "c1"
    next_offset = write_compacted_log(data_dir)
    assert next_offset == 6  # 3 records, compacted to 2 at offsets 3, 4, then the topic at 5
    with pytest.raises(UnmigratedMetadataLogError, match="--migrate-metadata-log"):
        require_migrated(data_dir, "tide quorum format --data-dir D --node-id 1")

    local, snapshot = migrate_metadata_log(raft_directory(data_dir), 1, VOTERS,
                                           data_dir / "metadata.log")
    assert local == VoterKey(1, "11" * 16)
    assert snapshot.snapshot_id == SnapshotId(next_offset, MIGRATION_EPOCH)
    assert not (data_dir / "metadata.log").exists()
    assert (data_dir / "metadata.log.migrated").exists()
    require_migrated(data_dir, "unused")  # nothing left to migrate

    storage, metadata = restored(raft_directory(data_dir))
    try:
        assert storage.log_start_offset == storage.log_end_offset == next_offset
        assert storage.quorum_state.epoch == MIGRATION_EPOCH
        assert storage.quorum_state.voted_for is None
        assert storage.bootstrap_voters == VOTERS and storage.snapshot.voters == VOTERS
    finally:
        storage.close()
    assert metadata.cluster_id == "c-1" and metadata.controller_epoch == 2
    assert metadata.topics["orders"].configs == {"retention.ms": "60000"}
    assert metadata.topics["orders"].topic_id == TOPIC_ID
    assert metadata.last_offset == next_offset - 1


def test_every_controller_formatted_from_one_file_holds_the_same_snapshot(tmp_path):
    old = tmp_path / "c1"
    write_compacted_log(old)
    _, first = migrate_metadata_log(raft_directory(old), 1, VOTERS, old / "metadata.log")
    # The others read the renamed file (or a copy): theirs is not renamed, they have none.
    _, second = migrate_metadata_log(raft_directory(tmp_path / "c2"), 2, VOTERS,
                                     old / "metadata.log.migrated")
    assert first == second
    assert (old / "metadata.log.migrated").exists()
    with pytest.raises(FileExistsError):
        migrate_metadata_log(raft_directory(old), 1, VOTERS, old / "metadata.log.migrated")


def test_nothing_to_migrate_formats_nothing(tmp_path):
    empty = tmp_path / "c1"
    MetadataLog.open(empty).close()
    require_migrated(empty, "unused")  # an empty log is no single-controller cluster
    for path in (empty / "metadata.log", tmp_path / "missing.log"):
        with pytest.raises(NothingToMigrateError):
            migrate_metadata_log(raft_directory(empty), 1, VOTERS, path)
    assert not is_formatted(raft_directory(empty))


def test_both_format_commands_take_the_option(tmp_path, capsys):
    """``tide quorum format`` and ``python -m tidewater.controller.quorum format`` migrate
    with the same implementation; without --initial-controllers both refuse (usage)."""
    from tidewater.controller.quorum.__main__ import main as quorum_main
    from tidewater.tools.cli import main as tide_main

    old = tmp_path / "c1"
    write_compacted_log(old)
    initial = ",".join(f"{v.id}@127.0.0.1:{9290 + v.id}:{v.directory_id}" for v in VOTERS)
    assert tide_main(["quorum", "format", "--data-dir", str(old), "--node-id", "1",
                      "--no-initial-controllers", "--migrate-metadata-log",
                      str(old / "metadata.log")]) == 2
    assert quorum_main(["format", "--data-dir", str(tmp_path / "c2" / "raft"), "--node-id",
                        "2", "--no-initial-controllers", "--migrate-metadata-log",
                        str(old / "metadata.log")]) == 2
    assert (old / "metadata.log").exists() and not is_formatted(raft_directory(old))
    capsys.readouterr()

    assert tide_main(["quorum", "format", "--data-dir", str(old), "--node-id", "1",
                      "--initial-controllers", initial, "--migrate-metadata-log",
                      str(old / "metadata.log")]) == 0
    assert "as a snapshot up to offset 6" in capsys.readouterr().out
    assert quorum_main(["format", "--data-dir", str(tmp_path / "c2" / "raft"), "--node-id",
                        "2", "--initial-controllers", initial, "--migrate-metadata-log",
                        str(old / "metadata.log.migrated")]) == 0
    first, _ = restored(raft_directory(old))
    second, _ = restored(tmp_path / "c2" / "raft")
    try:
        assert first.snapshot == second.snapshot
        assert (first.local_directory_id, second.local_directory_id) == ("11" * 16, "22" * 16)
    finally:
        first.close()
        second.close()


def test_a_running_controllers_log_is_not_migrated(tmp_path):
    data_dir = tmp_path / "c1"
    write_compacted_log(data_dir)
    running = MetadataLog.open(data_dir)  # holds metadata.lock, as a running controller
    try:
        with pytest.raises(KafkaStorageError, match="stop it first"):
            migrate_metadata_log(raft_directory(data_dir), 1, VOTERS, data_dir / "metadata.log")
        assert not is_formatted(raft_directory(data_dir))
        assert (data_dir / "metadata.log").exists()
    finally:
        running.close()
