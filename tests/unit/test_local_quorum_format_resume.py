"""``local_cluster.format_new_quorum`` stopped half-way (a crash simulated by raising from
the k-th controller's format, from the retire, or from removing the record) is finished by
the next call: every controller formatted with the same initial voters, one formatted
before the crash never formatted again, a migrated metadata.log retired exactly once and
held by every controller. What cannot be finished as begun raises a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewater.controller.metadata import cluster_record, controller_epoch_record
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.quorum.formatting import is_formatted, raft_directory
from tidewater.controller.raft import Snapshot, VoterKey
from tidewater.controller.raft.storage import RaftStorage
from tidewater.tools import local_cluster, quorum_format_plan
from tidewater.tools.local_cluster import UnfinishedQuorumFormatError, format_new_quorum

pytestmark = pytest.mark.timeout(60)

NODES = (1, 2, 3)


class Crash(Exception):
    """Stands for the process dying at that point."""


def data_dirs(cluster: Path) -> dict[int, Path]:
    return {i: cluster / f"controller-{i}" for i in NODES}


def single_log(cluster: Path) -> Path:
    log = MetadataLog.open(cluster / "controller")
    log.append([cluster_record("c-1"), controller_epoch_record(1), controller_epoch_record(2)])
    log.close()
    return cluster / "controller" / "metadata.log"


def read_dir(raft_dir: Path) -> tuple[str, frozenset[VoterKey], Snapshot | None]:
    storage = RaftStorage.open(raft_dir)
    try:
        return storage.local_directory_id, storage.bootstrap_voters, storage.snapshot
    finally:
        storage.close()


def assert_consistent(cluster: Path, migrated: bool) -> dict[int, str]:
    """Every controller formatted as its own key of one voter set (holding one snapshot
    when migrated), nothing left to finish; its directory ids."""
    states = {i: read_dir(raft_directory(d)) for i, d in data_dirs(cluster).items()}
    voters = {v for _, v, _ in states.values()}
    assert len(voters) == 1
    (voter_set,) = voters
    assert voter_set == {VoterKey(i, states[i][0]) for i in NODES}
    snapshots = [s for _, _, s in states.values()]
    if migrated:
        assert snapshots[0] is not None and all(s == snapshots[0] for s in snapshots)
    else:
        assert snapshots == [None] * len(NODES)
    assert not (cluster / quorum_format_plan.FILE_NAME).exists()
    return {i: s[0] for i, s in states.items()}


def crash_on_format(monkeypatch, k: int) -> list[int]:
    """Make the k-th format call (1-based) crash before writing; the node ids formatted."""
    real = local_cluster.format_controller
    calls: list[int] = []

    def format_or_crash(raft_dir, node_id, voters, **kwargs):
        calls.append(node_id)
        if len(calls) == k:
            raise Crash
        return real(raft_dir, node_id, voters, **kwargs)

    monkeypatch.setattr(local_cluster, "format_controller", format_or_crash)
    return calls


def count_retires(monkeypatch, crash: bool = False) -> list[Path]:
    real = local_cluster.retire_metadata_log
    retired: list[Path] = []

    def retire(path):
        if crash:
            raise Crash
        retired.append(path)
        return real(path)

    monkeypatch.setattr(local_cluster, "retire_metadata_log", retire)
    return retired


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_crash_formatting_the_kth_controller_is_finished_by_the_next_call(
        tmp_path, monkeypatch, k):
    cluster = tmp_path / "cluster"
    calls = crash_on_format(monkeypatch, k)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster))
    before = {i: read_dir(raft_directory(data_dirs(cluster)[i]))[0] for i in calls[:k - 1]}
    assert (cluster / quorum_format_plan.FILE_NAME).exists()
    monkeypatch.undo()
    calls = crash_on_format(monkeypatch, 0)  # counts only
    assert format_new_quorum(data_dirs(cluster)) is False
    assert sorted(calls) == [i for i in NODES if i not in before]  # the rest only
    ids = assert_consistent(cluster, migrated=False)
    assert all(ids[i] == directory_id for i, directory_id in before.items())
    assert format_new_quorum(data_dirs(cluster)) is False  # a restart formats nothing
    assert assert_consistent(cluster, migrated=False) == ids


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_crash_migrating_into_the_kth_controller_is_finished_and_retires_once(
        tmp_path, monkeypatch, k):
    cluster = tmp_path / "cluster"
    log = single_log(cluster)
    retired = count_retires(monkeypatch)
    crash_on_format(monkeypatch, k)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    assert log.exists() and retired == []
    monkeypatch.undo()
    retired = count_retires(monkeypatch)
    assert format_new_quorum(data_dirs(cluster), migrate_from=log) is True
    assert retired == [log]
    assert not log.exists() and log.with_name("metadata.log.migrated").exists()
    assert_consistent(cluster, migrated=True)
    assert format_new_quorum(data_dirs(cluster), migrate_from=log) is False
    assert retired == [log]


def test_a_crash_before_retiring_the_log_retires_it_on_the_next_call(tmp_path, monkeypatch):
    cluster = tmp_path / "cluster"
    log = single_log(cluster)
    count_retires(monkeypatch, crash=True)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    assert all(is_formatted(raft_directory(d)) for d in data_dirs(cluster).values())
    ids = {i: read_dir(raft_directory(d))[0] for i, d in data_dirs(cluster).items()}
    monkeypatch.undo()
    retired = count_retires(monkeypatch)
    formats = crash_on_format(monkeypatch, 0)
    assert format_new_quorum(data_dirs(cluster), migrate_from=log) is True
    assert retired == [log] and formats == []
    assert assert_consistent(cluster, migrated=True) == ids


def test_a_crash_before_removing_the_record_finishes_without_retiring_again(
        tmp_path, monkeypatch):
    cluster = tmp_path / "cluster"
    log = single_log(cluster)
    retired = count_retires(monkeypatch)

    def crash(path):
        raise Crash

    monkeypatch.setattr(quorum_format_plan, "remove_plan", crash)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    assert retired == [log] and not log.exists()
    monkeypatch.undo()
    retired = count_retires(monkeypatch)
    assert format_new_quorum(data_dirs(cluster), migrate_from=log) is True
    assert retired == []
    assert_consistent(cluster, migrated=True)


def test_what_cannot_be_finished_as_begun_is_refused_naming_the_fix(tmp_path, monkeypatch):
    cluster = tmp_path / "cluster"
    log = single_log(cluster)
    crash_on_format(monkeypatch, 2)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    monkeypatch.undo()
    five = {i: cluster / f"controller-{i}" for i in range(1, 6)}
    with pytest.raises(UnfinishedQuorumFormatError, match="--controllers 3"):
        format_new_quorum(five, migrate_from=log)
    log.rename(log.with_name("metadata.log.migrated"))
    with pytest.raises(UnfinishedQuorumFormatError, match="put it back"):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    log.with_name("metadata.log.migrated").rename(log)
    appended = MetadataLog.open(cluster / "controller")
    appended.append([controller_epoch_record(3)])  # a single controller ran meanwhile
    appended.close()
    with pytest.raises(UnfinishedQuorumFormatError, match="changed since"):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    assert not is_formatted(raft_directory(data_dirs(cluster)[2]))


def test_a_folder_with_a_formatted_controller_and_no_record_formats_nothing(tmp_path):
    cluster = tmp_path / "cluster"
    format_new_quorum(data_dirs(cluster))
    wiped = raft_directory(data_dirs(cluster)[2])
    for f in wiped.iterdir():
        f.unlink()
    assert format_new_quorum(data_dirs(cluster)) is False  # a wiped voter is not re-formatted
    assert not is_formatted(wiped)


def test_a_failed_record_write_formats_nothing_and_the_next_call_formats_all(tmp_path,
                                                                            monkeypatch):
    """The record is the first write: when it fails (a full disk) no controller is
    formatted, so the next call starts afresh instead of taking the folder for a restart."""
    cluster = tmp_path / "cluster"
    real_write = quorum_format_plan.write_plan

    def full_disk(path, plan):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quorum_format_plan, "write_plan", full_disk)
    with pytest.raises(OSError):
        format_new_quorum(data_dirs(cluster))
    assert not any(is_formatted(raft_directory(d)) for d in data_dirs(cluster).values())
    monkeypatch.setattr(quorum_format_plan, "write_plan", real_write)
    assert format_new_quorum(data_dirs(cluster)) is False
    assert_consistent(cluster, migrated=False)


def test_a_fresh_migration_digests_the_log_once_a_resumed_one_once_again(tmp_path, monkeypatch):
    cluster = tmp_path / "cluster"
    log = single_log(cluster)
    digests: list[Path] = []
    real = quorum_format_plan.file_sha256

    def counted(path: Path) -> str:
        digests.append(path)
        return real(path)
    monkeypatch.setattr(quorum_format_plan, "file_sha256", counted)
    crashes = crash_on_format(monkeypatch, 2)
    with pytest.raises(Crash):
        format_new_quorum(data_dirs(cluster), migrate_from=log)
    assert digests == [log] and crashes  # the plan's digest, not taken again to compare
    assert format_new_quorum(data_dirs(cluster), migrate_from=log) is True
    assert digests == [log, log]  # the resumed call checks the log against the plan
    assert_consistent(cluster, migrated=True)
