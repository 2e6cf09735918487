"""A roll inside an append fsyncs nothing on the appending thread: the rolled segment
is flushed in the background (Kafka's "flush-log" job) and only then does the
recovery point move; a crash before that flush loses nothing that reached the disk."""

import dataclasses
import os
import threading
from concurrent.futures import Executor, Future

import pytest

from tidewater.broker.storage import log as log_module
from tidewater.broker.storage import recovery
from tidewater.broker.storage.log import Log, drain_roll_flushes
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import iter_batches
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.records import encode_batch

RECORD = encode_batch([(None, b"x" * 100)], base_timestamp_ms=1000)
CONFIG = LogConfig(segment_bytes=3 * len(RECORD), index_interval_bytes=1)


class QueuedFlushes(Executor):
    """Keeps the jobs a log submits. ``run`` runs them in a thread of its own, as the
    "flush-log" thread would; never running them is a crash before the flush."""

    def __init__(self):
        self.jobs = []

    def submit(self, fn, /, *args, **kwargs):
        self.jobs.append((fn, args, kwargs))
        return Future()

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []

        def work():
            for fn, args, kwargs in jobs:
                fn(*args, **kwargs)

        thread = threading.Thread(target=work, name="test-flush-log")
        thread.start()
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture
def fsyncs(monkeypatch):
    """(thread name, call) of every os.fsync / os.fdatasync, and of every fsync_dir."""
    assert drain_roll_flushes()  # earlier tests' flushes must not land in this one's list
    calls = []
    in_fsync_dir = threading.local()
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def probe(fd, real=real, name=name):
            if not getattr(in_fsync_dir, "value", False):
                calls.append((threading.current_thread().name, name))
            return real(fd)

        monkeypatch.setattr(os, name, probe)
    real_fsync_dir = log_module.fsync_dir

    def probe_dir(directory):
        calls.append((threading.current_thread().name, "fsync_dir"))
        in_fsync_dir.value = True
        try:
            real_fsync_dir(directory)
        finally:
            in_fsync_dir.value = False

    monkeypatch.setattr(log_module, "fsync_dir", probe_dir)
    return calls


def open_log(tmp_path, flushes, config=CONFIG):
    return Log.open(tmp_path / "t-0", config, now_ms=0, flush_executor=flushes)


def offsets(log):
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out.extend(h.base_offset for _, h in iter_batches(result.records))
        offset = result.next_offset
    return out


def test_a_roll_inside_an_append_fsyncs_nothing_on_the_appending_thread(tmp_path, fsyncs):
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes)
    log.append_as_leader(RECORD, 0, now_ms=0)  # epoch 0's checkpoint fsync: not the roll's
    fsyncs.clear()
    for _ in range(9):
        log.append_as_leader(RECORD, 0, now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 3, 6, 9]
    assert fsyncs == []  # neither the data, the indexes nor the directory
    assert len(flushes.jobs) == 3  # one flush per roll, queued
    assert log.recovery_point == 0  # moves only when a flush has made the data durable
    assert all(s.indexes_loaded for s in log.segments())  # kept until written


def test_the_background_flush_syncs_the_rolled_segment_then_moves_the_recovery_point(
        tmp_path, fsyncs):
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes)
    for _ in range(4):
        log.append_as_leader(RECORD, 0, now_ms=0)
    fsyncs.clear()
    flushes.run()
    assert log.recovery_point == 3  # the new segment's base
    assert {thread for thread, _ in fsyncs} == {"test-flush-log"}
    calls = [call for _, call in fsyncs]
    # The roll's producer snapshot, the directory (the new files' names), the .log data,
    # the two index files.
    assert calls == ["fsync", "fsync_dir", "fdatasync", "fsync", "fsync"]
    rolled, active = log.segments()
    assert not rolled.needs_flush and not rolled.indexes_loaded  # on disk, out of memory
    index_bytes = rolled.index.path.stat().st_size  # entries (1-byte index interval)
    assert index_bytes > 0 and index_bytes % 8 == 0
    assert rolled.time_index.path.stat().st_size > 0  # with the roll's final entry
    assert active.needs_flush and log.log_end_offset == 4  # the active one is left alone
    assert offsets(log) == [0, 1, 2, 3]  # reads load the written indexes back


def test_rolls_flush_on_the_processs_flush_log_thread(tmp_path, fsyncs):
    log = Log.open(tmp_path / "t-0", CONFIG, now_ms=0)  # the default executor
    log.append_as_leader(RECORD, 0, now_ms=0)  # epoch 0's checkpoint fsync: not the roll's
    fsyncs.clear()
    for _ in range(6):
        log.append_as_leader(RECORD, 0, now_ms=0)
    log_module._roll_flusher().submit(lambda: None).result(timeout=30)  # after the rolls'
    assert log.recovery_point == 6
    main = threading.current_thread().name
    assert all(thread.startswith("flush-log") for thread, _ in fsyncs if thread != main)
    assert fsyncs and not [call for thread, call in fsyncs if thread == main]
    log.close()


def test_a_crash_before_the_rolls_flush_ran_recovers_every_batch(tmp_path, monkeypatch):
    flushes = QueuedFlushes()  # never run: the process dies first
    log = open_log(tmp_path, flushes)
    for _ in range(10):
        log.append_as_leader(RECORD, 0, now_ms=0)
    assert log.recovery_point == 0 and len(flushes.jobs) == 3
    # No close (the crash): reopen as after an unclean shutdown, from the recovery point
    # the checkpoint last wrote. Every segment from the one holding it is re-validated.
    dir_fsyncs = []
    real_fsync_dir = recovery.fsync_dir
    monkeypatch.setattr(recovery, "fsync_dir",
                        lambda d: (dir_fsyncs.append(d), real_fsync_dir(d))[1])
    reopened = Log.open(tmp_path / "t-0", CONFIG, now_ms=0, recovery_point=log.recovery_point,
                        had_clean_shutdown=False, flush_executor=QueuedFlushes())
    assert [s.base_offset for s in reopened.segments()] == [0, 3, 6, 9]
    assert offsets(reopened) == list(range(10))
    assert reopened.leader_epoch_cache.entries() == [(0, 0)]
    # It opens with the recovery point at its end: the rolled files' names were made
    # durable (after a process crash they may have been in the page cache only).
    assert reopened.recovery_point == 10 and dir_fsyncs == [tmp_path / "t-0"]
    reopened.close()


@pytest.mark.parametrize("lost", [9, 3])
def test_a_crash_that_lost_a_rolled_files_name_cuts_the_log_there(tmp_path, lost):
    """The roll no longer fsyncs the directory: the files of the newest segment (or of
    any segment, on a file system that does not keep creations in order) may be gone
    after a crash. Recovery keeps the contiguous prefix; nothing above the recovery
    point was promised, and the recovery point never passed an unsynced name."""
    log = open_log(tmp_path, QueuedFlushes())
    for _ in range(10):
        log.append_as_leader(RECORD, 0, now_ms=0)
    for suffix in (".log", ".index", ".timeindex"):
        (tmp_path / "t-0" / f"{lost:020d}{suffix}").unlink()
    reopened = Log.open(tmp_path / "t-0", CONFIG, now_ms=0, recovery_point=log.recovery_point,
                        had_clean_shutdown=False, flush_executor=QueuedFlushes())
    assert offsets(reopened) == list(range(lost))
    reopened.close()


def test_flush_messages_still_fsyncs_a_rolled_files_name_before_the_append_returns(
        tmp_path, fsyncs):
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes, dataclasses.replace(CONFIG, flush_messages=1))
    for _ in range(3):
        log.append_as_leader(RECORD, 0, now_ms=0)
    fsyncs.clear()
    log.append_as_leader(RECORD, 0, now_ms=0)  # rolls, then the policy flush
    assert log.recovery_point == log.log_end_offset == 4
    assert "fsync_dir" in [call for _, call in fsyncs]  # the new file's name is durable
    flushes.run()  # the roll's flush still writes the rolled segment's indexes
    assert not log.segments()[0].needs_flush and not log.segments()[0].indexes_loaded
    assert log.recovery_point == 4


def test_a_truncation_before_the_flush_ran_never_raises_the_recovery_point_past_it(tmp_path):
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes)
    for _ in range(7):
        log.append_as_leader(RECORD, 0, now_ms=0)  # rolls at 3 and 6
    log.truncate_to(4)
    log.append_as_leader(RECORD, 1, now_ms=0)  # offset 4 again, unsynced
    flushes.run()  # flushes below 3 (then 6, which now lies past the LEO)
    assert log.recovery_point <= 5
    assert not log.is_offline
    log.flush()
    assert log.recovery_point == log.log_end_offset == 5
    assert offsets(log) == [0, 1, 2, 3, 4]


def test_a_truncation_while_a_rolls_flush_syncs_keeps_the_recovery_point_below_it(
        tmp_path, monkeypatch):
    """The flush snapshots under the lock and fsyncs without it: a truncation (and a new
    append at the cut offsets) in between must not let it publish its older target."""
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes)
    for _ in range(7):
        log.append_as_leader(RECORD, 0, now_ms=0)  # rolls at 3 and 6
    first, second = flushes.jobs
    flushes.jobs = [first]
    flushes.run()
    assert log.recovery_point == 3
    real_fdatasync = os.fdatasync
    cut = []

    def truncating_fdatasync(fd):  # the flush's step 2, lock not held
        if not cut:
            cut.append(True)
            log.truncate_to(4)
            log.append_as_leader(RECORD, 1, now_ms=0)  # offset 4 again, not in this flush
        return real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", truncating_fdatasync)
    flushes.jobs = [second]  # flushes below 6, as of a snapshot at LEO 7
    flushes.run()
    assert cut
    assert log.recovery_point <= 4  # offset 4 is not durable yet
    log.flush()
    assert log.recovery_point == log.log_end_offset == 5


@pytest.mark.parametrize("how", ["delete", "close", "retention"])
def test_a_log_deleted_or_closed_before_its_flush_runs_is_left_alone(tmp_path, how, caplog):
    flushes = QueuedFlushes()
    log = open_log(tmp_path, flushes, dataclasses.replace(CONFIG, retention_bytes=0))
    for _ in range(7):
        log.append_as_leader(RECORD, 0, now_ms=0)
    if how == "delete":
        log.delete()
    elif how == "close":
        log.close()
    else:
        assert log.delete_old_segments(now_ms=0, high_watermark=7) == 2
    flushes.run()
    assert not log.is_offline
    assert "failed" not in caplog.text and "offline" not in caplog.text
    if how == "retention":
        assert log.recovery_point == 6 and offsets(log) == [6]
        assert sorted(p.name for p in (tmp_path / "t-0").glob("*.index")) == [
            f"{6:020d}.index"]  # no flush recreated the deleted segments' files


def test_the_manager_skips_logs_deleted_after_its_snapshot(tmp_path):
    manager = LogManager(tmp_path, dataclasses.replace(CONFIG, retention_bytes=0, segment_ms=10))
    manager.load(now_ms=0)
    a, b = TopicPartition("a", 0), TopicPartition("b", 0)
    for tp in (a, b):
        partition_log = manager.get_or_create(tp, manager.default_config, now_ms=0)
        for _ in range(7):
            partition_log.append_as_leader(RECORD, 0, now_ms=0)
    snapshot = manager.logs()  # taken on the event loop; the thread runs later
    manager.delete(a)  # StopReplica with deletion, in between
    assert manager.delete_old_segments(0, {a: 7, b: 7}, snapshot) == 2  # b's only
    manager.maybe_roll_and_flush(now_ms=100, logs=snapshot)  # segment.ms: b rolls
    assert snapshot[a].is_closed and not snapshot[a].is_offline
    assert [s.base_offset for s in snapshot[b].segments()] == [6, 7]
    manager.shutdown()


def test_a_broken_invariant_in_the_background_flush_stops_the_broker(tmp_path, monkeypatch):
    """Not a disk error: the flush-log thread hands it to the log's owner (the broker's
    supervisor stops the process), it does not end in a log line."""
    flushes = QueuedFlushes()
    failures = []
    log = Log.open(tmp_path / "t-0", CONFIG, now_ms=0, flush_executor=flushes,
                   on_background_failure=failures.append)
    for _ in range(4):
        log.append_as_leader(RECORD, 0, now_ms=0)
    assert len(flushes.jobs) == 1
    broken = InvariantViolation("recovery point past the log end")

    def flush_breaks(**_):
        raise broken

    monkeypatch.setattr(log, "flush_outside_lock", flush_breaks)
    flushes.run()
    assert failures == [broken]
    log.close()


def test_without_an_owner_the_broken_invariant_is_raised(tmp_path, monkeypatch):
    log = open_log(tmp_path, QueuedFlushes())

    def flush_breaks(**_):
        raise InvariantViolation("recovery point past the log end")

    monkeypatch.setattr(log, "flush_outside_lock", flush_breaks)
    with pytest.raises(InvariantViolation):
        log._flush_rolled(0)
    log.close()
