"""Moving a log aside for deletion and removing it in the background: order of the steps,
a crash between the rename and the removal, failures of the worker."""

import re
import threading

import pytest

from tidewater.broker.storage import log_manager as log_manager_module
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_deleter import LogDirDeleter
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

CONFIG = LogConfig()
A0 = TopicPartition("a", 0)
ID = bytes(range(1, 17))
DELETE_DIR = re.compile(r"^a-0\.[0-9a-f]{32}-delete$")


def manager_with_log(data_dir, deleter=None):
    manager = LogManager(data_dir, CONFIG)
    if deleter is not None:
        manager.deleter = deleter
    manager.load(now_ms=0)
    log = manager.get_or_create(A0, CONFIG, now_ms=0, topic_id=ID)
    log.append_as_leader(encode_batch([(None, b"v")] * 3), leader_epoch=0, now_ms=0)
    return manager


def delete_dirs(data_dir):
    return [p for p in data_dir.iterdir() if p.name.endswith("-delete")]


def test_move_aside_renames_fsyncs_then_deletes_in_the_background(tmp_path, monkeypatch):
    steps = []
    release = threading.Event()

    def slow_remove(path):
        steps.append(("remove", path.name))
        release.wait(10)
        import shutil
        shutil.rmtree(path)

    manager = manager_with_log(tmp_path, LogDirDeleter(remove=slow_remove))
    real_fsync_dir = log_manager_module.fsync_dir
    monkeypatch.setattr(log_manager_module, "fsync_dir",
                        lambda d: (steps.append(("fsync", d)), real_fsync_dir(d)))
    doomed = manager.delete(A0)
    assert DELETE_DIR.match(doomed.name), doomed
    assert steps[0] == ("fsync", tmp_path)  # the rename is durable before any file goes
    assert manager.get(A0) is None and manager.topic_id(A0) is None
    assert not (tmp_path / "a-0").exists()
    assert doomed.exists()  # still there: the worker is busy with it, not the caller
    release.set()
    assert manager.deleter.wait_idle(10)
    assert ("remove", doomed.name) in steps and not doomed.exists()
    assert manager.deleter.deleted == 1


def test_a_crash_between_rename_and_removal_is_finished_at_the_next_start(tmp_path):
    never = LogDirDeleter(remove=lambda path: None)  # the process "dies" before removing
    manager = manager_with_log(tmp_path, never)
    doomed = manager.delete(A0)
    assert never.wait_idle(10) and doomed.exists()
    # Half of its files already gone, as a crash in the middle of rmtree leaves it.
    next(doomed.glob("*.index")).unlink()
    (doomed / "partition.metadata").unlink()

    restarted = LogManager(tmp_path, CONFIG)
    restarted.load(now_ms=0)
    assert restarted.logs() == {}  # never opened as a log, whatever it still holds
    assert restarted.deleter.wait_idle(10)
    assert delete_dirs(tmp_path) == []
    # The name is free for a new incarnation.
    fresh = restarted.get_or_create(A0, CONFIG, now_ms=0, topic_id=bytes(range(2, 18)))
    assert fresh.log_end_offset == 0


def test_a_failed_removal_is_logged_counted_and_does_not_stop_the_worker(tmp_path, caplog):
    failing = {"first": True}

    def remove(path):
        if failing.pop("first", False):
            raise PermissionError(13, "Permission denied", str(path))
        import shutil
        shutil.rmtree(path)

    deleter = LogDirDeleter(remove=remove)
    first, second = tmp_path / "a-0.1-delete", tmp_path / "a-1.2-delete"
    first.mkdir()
    second.mkdir()
    deleter.submit(first)
    deleter.submit(second)
    assert deleter.wait_idle(10)
    assert deleter.failures == 1 and deleter.deleted == 1
    assert first.exists() and not second.exists()  # left for the next start-up
    assert "cannot delete" in caplog.text and str(first) in caplog.text
    assert deleter.failure is None


def test_a_dying_worker_is_reported_and_refuses_more_work(tmp_path):
    class Bug(BaseException):
        pass

    reported = []
    deleter = LogDirDeleter(on_failure=reported.append,
                            remove=lambda path: (_ for _ in ()).throw(Bug("boom")))
    path = tmp_path / "a-0.1-delete"
    path.mkdir()
    deleter.submit(path)
    assert deleter.wait_idle(10)
    assert len(reported) == 1 and isinstance(reported[0], Bug)
    with pytest.raises(RuntimeError, match="died"):
        deleter.submit(path)


def test_only_delete_dirs_are_accepted(tmp_path):
    with pytest.raises(AssertionError):
        LogDirDeleter().submit(tmp_path / "a-0")


def test_deletions_move_at_once_and_settle_once_at_the_end(tmp_path, monkeypatch):
    """A topic's partitions deleted together: each renamed at once, then one fsync of the
    data dir, the hand-over to the deleter and one write of the checkpoints at the end."""
    removed: list[str] = []
    manager = manager_with_log(tmp_path, LogDirDeleter(remove=lambda p: removed.append(p.name)))
    others = [TopicPartition("a", p) for p in (1, 2)]
    for tp in others:
        manager.get_or_create(tp, CONFIG, now_ms=0, topic_id=ID)
    manager.checkpoint_high_watermarks({A0: 3, others[0]: 0, others[1]: 0})
    fsyncs: list = []
    real_fsync_dir = log_manager_module.fsync_dir
    monkeypatch.setattr(log_manager_module, "fsync_dir",
                        lambda d: (fsyncs.append(d), real_fsync_dir(d)))
    with manager.moves_aside() as listed:
        moved = [manager.delete(tp) for tp in [A0, *others]]
        assert manager.delete(TopicPartition("a", 9)) is None  # no such log: nothing moved
        assert not (tmp_path / "a-0").exists() and all(path.exists() for path in moved)
        assert manager.logs() == {}
    assert fsyncs == [] and removed == []  # moved, not yet durable nor handed over
    manager.settle_deletions(listed)
    assert fsyncs == [tmp_path]
    assert manager.deleter.wait_idle(10) and sorted(removed) == sorted(p.name for p in moved)
    restarted = LogManager(tmp_path, CONFIG)
    assert restarted.read_high_watermarks() == {}
    assert restarted._read_checkpoint(restarted._hw_file) == {}  # the entries are gone
    with pytest.raises(Exception, match="twice"), manager.moves_aside(), \
            manager.moves_aside():
        pass


def test_deletions_that_cannot_be_made_durable_raise_when_settled(tmp_path, monkeypatch):
    from tidewater.proto.errors import KafkaStorageError

    removed: list[str] = []
    manager = manager_with_log(tmp_path, LogDirDeleter(remove=lambda p: removed.append(p.name)))

    def broken_fsync_dir(directory):
        raise KafkaStorageError("cannot fsync directory: Input/output error", path=str(directory))

    monkeypatch.setattr(log_manager_module, "fsync_dir", broken_fsync_dir)
    with manager.moves_aside() as listed:
        doomed = manager.delete(A0)
    with pytest.raises(KafkaStorageError):
        manager.settle_deletions(listed)
    assert manager.get(A0) is None and doomed.exists()
    assert manager.deleter.wait_idle(10) and removed == []  # never removed unless durable
    assert manager._deletions_pending is None  # the next request starts afresh


def test_moves_aside_lists_the_moves_for_the_caller_to_settle(tmp_path, monkeypatch):
    """``moves_aside`` leaves the fsync, the hand-over and the checkpoints to the caller
    (the broker's worker thread), unless its body raises: then it settles them itself."""
    removed: list[str] = []
    manager = manager_with_log(tmp_path, LogDirDeleter(remove=lambda p: removed.append(p.name)))
    manager.get_or_create(TopicPartition("a", 1), CONFIG, now_ms=0, topic_id=ID)
    fsyncs: list = []
    real_fsync_dir = log_manager_module.fsync_dir
    monkeypatch.setattr(log_manager_module, "fsync_dir",
                        lambda d: (fsyncs.append(d), real_fsync_dir(d)))
    with manager.moves_aside() as moved:
        doomed = manager.delete(A0)
    assert moved == [(A0, doomed)] and fsyncs == [] and removed == []
    manager.settle_deletions(moved)
    assert fsyncs == [tmp_path]
    assert manager.deleter.wait_idle(10) and removed == [doomed.name]
    with pytest.raises(RuntimeError, match="mid-request"), manager.moves_aside():
        doomed = manager.delete(TopicPartition("a", 1))
        raise RuntimeError("mid-request")
    assert fsyncs == [tmp_path, tmp_path]  # settled on the way out
    assert manager.deleter.wait_idle(10) and removed[-1] == doomed.name
    assert manager._deletions_pending is None
