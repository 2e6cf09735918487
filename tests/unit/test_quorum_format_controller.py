"""``quorum.format_controller``, the one "migrate or format empty" dispatch: formatted empty
without a log to migrate, holding the migrated snapshot with one; a migration without
initial controllers refused before anything is read or written; a formatted directory
never formatted again."""

from __future__ import annotations

import pytest

from tidewater.controller.metadata import cluster_record, controller_epoch_record
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.quorum.format_controller import (
    FormatResult,
    MigrationNeedsVotersError,
    format_controller,
)
from tidewater.controller.quorum.formatting import is_formatted, raft_directory
from tidewater.controller.quorum.migration import MIGRATION_EPOCH
from tidewater.controller.raft import SnapshotId, VoterKey
from tidewater.controller.raft.storage import RaftStorage
from tidewater.proto.errors import InvalidConfigError

pytestmark = pytest.mark.timeout(30)

VOTERS = frozenset({VoterKey(1, "11" * 16), VoterKey(2, "22" * 16)})


def write_log(data_dir):
    log = MetadataLog.open(data_dir)
    log.append([cluster_record("c-1"), controller_epoch_record(1)])
    log.close()
    return data_dir / "metadata.log"


def test_without_a_log_the_directory_is_formatted_empty(tmp_path):
    raft_dir = raft_directory(tmp_path / "c1")
    result = format_controller(raft_dir, 1, VOTERS)
    assert result == FormatResult(VoterKey(1, "11" * 16), None)
    storage = RaftStorage.open(raft_dir)
    try:
        assert storage.snapshot is None and storage.bootstrap_voters == VOTERS
    finally:
        storage.close()


def test_fresh_directory_id_and_observer(tmp_path):
    fresh = format_controller(raft_directory(tmp_path / "c1"), 1, VOTERS,
                              fresh_directory_id=True).local
    assert fresh.id == 1 and fresh not in VOTERS
    observer = format_controller(raft_directory(tmp_path / "c3"), 3, None)
    assert observer.local.id == 3 and observer.snapshot is None


def test_with_a_log_the_directory_holds_it_migrated(tmp_path):
    data_dir = tmp_path / "c1"
    log_path = write_log(data_dir)
    result = format_controller(raft_directory(data_dir), 1, VOTERS, migrate_from=log_path)
    assert result.local == VoterKey(1, "11" * 16)
    assert result.snapshot is not None
    assert result.snapshot.snapshot_id == SnapshotId(2, MIGRATION_EPOCH)
    assert (data_dir / "metadata.log.migrated").exists()  # its own log, renamed
    storage = RaftStorage.open(raft_directory(data_dir))
    try:
        assert storage.snapshot == result.snapshot
    finally:
        storage.close()


def test_a_migration_without_initial_controllers_is_refused(tmp_path):
    data_dir = tmp_path / "c1"
    log_path = write_log(data_dir)
    with pytest.raises(MigrationNeedsVotersError, match="needs --initial-controllers") as e:
        format_controller(raft_directory(data_dir), 1, None, migrate_from=log_path)
    assert isinstance(e.value, InvalidConfigError)
    assert log_path.exists() and not is_formatted(raft_directory(data_dir))


def test_a_formatted_directory_is_refused(tmp_path):
    data_dir = tmp_path / "c1"
    raft_dir = raft_directory(data_dir)
    format_controller(raft_dir, 1, VOTERS)
    with pytest.raises(FileExistsError):
        format_controller(raft_dir, 1, VOTERS)
    log_path = write_log(data_dir)
    with pytest.raises(FileExistsError):
        format_controller(raft_dir, 1, VOTERS, migrate_from=log_path)
    assert log_path.exists()  # not renamed: nothing was migrated
