"""LogManager: loading a data dir, creating and deleting logs, checkpoints, the
clean-shutdown marker, and clamping stored high watermarks after recovery."""

import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.checkpoints import CLEAN_SHUTDOWN_FILE, OffsetCheckpointFile
from tidewater.broker.storage.log import drain_roll_flushes
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import InvalidTopicError, KafkaStorageError, OffsetOutOfRangeError
from tidewater.proto.records import encode_batch

CONFIG = LogConfig(segment_bytes=400)
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b-x", 0)


def batch(n=1):
    return encode_batch([(None, b"value")] * n, base_timestamp_ms=1000)


def filled_manager(data_dir, config=CONFIG):
    manager = LogManager(data_dir, config)
    manager.load(now_ms=0)
    for tp, count in ((A0, 10), (A1, 3), (B0, 0)):
        log = manager.get_or_create(tp, config, now_ms=0)
        for _ in range(count):
            log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    return manager


def test_create_load_and_clean_shutdown(tmp_path):
    manager = filled_manager(tmp_path)
    assert not manager.had_clean_shutdown
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["a-0", "a-1", "b-x-0"]
    assert manager.get_or_create(A0, CONFIG, now_ms=0) is manager.get(A0)
    manager.checkpoint_high_watermarks({A0: 12, A1: 6, TopicPartition("gone", 0): 5})
    manager.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {
        A0: 20, A1: 6, B0: 0}
    assert OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read() == {
        A0: 0, A1: 0, B0: 0}

    again = LogManager(tmp_path, CONFIG)
    again.load(now_ms=0)
    assert again.had_clean_shutdown
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    assert {tp: log.log_end_offset for tp, log in again.logs().items()} == {A0: 20, A1: 6, B0: 0}
    assert again.read_high_watermarks() == {A0: 12, A1: 6, B0: 0}
    assert again.get(A0).leader_epoch_cache.entries() == [(1, 0)]


def test_only_a_data_dir_with_data_is_called_not_shut_down_cleanly(tmp_path, caplog):
    """Issue 15: a brand-new data dir logged "was not shut down cleanly" on first start."""
    fresh = LogManager(tmp_path / "new", CONFIG)
    fresh.load(now_ms=0)
    assert fresh.is_new and not fresh.had_clean_shutdown
    assert "not shut down cleanly" not in caplog.text
    filled_manager(tmp_path / "crashed")  # logs written, never shut down
    crashed = LogManager(tmp_path / "crashed", CONFIG)
    crashed.load(now_ms=0)
    assert not crashed.is_new
    assert "not shut down cleanly" in caplog.text


def test_unclean_start_recovers_and_clamps_high_watermarks(tmp_path, caplog):
    manager = filled_manager(tmp_path)
    manager.checkpoint_high_watermarks({A0: 20, A1: 6})
    manager.checkpoint_recovery_points()
    log = manager.get(A0)
    log.append_as_leader(batch(2), leader_epoch=2, now_ms=0)  # after the recovery point
    active = log.active_segment.log_path
    size = active.stat().st_size
    # Crash: no shutdown; the last append is torn in half.
    with open(active, "r+b") as f:
        f.truncate(size - 20)
    again = LogManager(tmp_path, CONFIG)
    again.load(now_ms=0)
    assert not again.had_clean_shutdown
    assert again.get(A0).log_end_offset == 20
    assert again.get(A0).leader_epoch_cache.entries() == [(1, 0)]
    assert "bytes removed" in caplog.text
    # Cut a log below its stored HW: reading HWs clamps into [log start, LEO].
    again.get(A1).truncate_to(2)
    assert again.read_high_watermarks() == {A0: 20, A1: 2, B0: 0}
    assert "clamped" in caplog.text


def test_corrupt_checkpoints_mean_full_recovery_not_failure(tmp_path, caplog):
    manager = filled_manager(tmp_path)
    manager.checkpoint_high_watermarks({A0: 20})
    manager.shutdown()
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                 "replication-offset-checkpoint"):
        (tmp_path / name).write_bytes(b"0\n7\ngarbage")
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    again = LogManager(tmp_path, CONFIG)
    again.load(now_ms=0)
    assert again.get(A0).log_end_offset == 20
    assert again.read_high_watermarks() == {A0: 0, A1: 0, B0: 0}  # re-learned from the leader
    assert "ignoring it" in caplog.text


def test_invalid_topic_never_touches_the_disk(tmp_path):
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    for topic in ("..", "../evil", "a/b", "", "x" * 250):
        with pytest.raises(InvalidTopicError):
            manager.get_or_create(TopicPartition(topic, 0), CONFIG, now_ms=0)
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil-0").exists()


def test_delete_renames_and_closes_the_log_under_its_own_lock(tmp_path, monkeypatch):
    """A roll or flush in a worker thread takes the log's lock: it sees the log either
    open at its old path or closed, never open with its directory renamed away (which
    took the log offline with an error)."""
    manager = filled_manager(tmp_path)
    partition_log = manager.get(A0)
    real_rename = os.rename
    seen = []

    def probe_rename(src, dst):
        seen.append((partition_log._lock._is_owned(), partition_log.is_closed))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", probe_rename)
    manager.delete(A0)
    assert seen and seen[0] == (True, False)
    assert partition_log.is_closed and not partition_log.is_offline


def test_delete_removes_directory_and_checkpoint_entries(tmp_path):
    manager = filled_manager(tmp_path)
    manager.checkpoint_high_watermarks({A0: 20, A1: 6})
    manager.checkpoint_recovery_points()
    manager.checkpoint_log_start_offsets()
    manager.delete(A0)
    manager.delete(A0)  # absent: no-op
    assert manager.get(A0) is None
    assert not (tmp_path / "a-0").exists()
    # The renamed directory's files go in a background thread (never on the caller's loop).
    deadline = time.monotonic() + 10
    while any(p.name.endswith("-delete") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(p.name.endswith("-delete") for p in tmp_path.iterdir())
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                 "replication-offset-checkpoint"):
        assert A0 not in OffsetCheckpointFile(tmp_path / name).read()
    recreated = manager.get_or_create(A0, CONFIG, now_ms=0)
    assert recreated.log_end_offset == 0


def test_load_finishes_interrupted_deletes_and_ignores_strangers(tmp_path, caplog):
    (tmp_path / "a-0.0123abcd-delete").mkdir()
    (tmp_path / "a-0.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"x")
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    assert manager.logs() == {}
    assert manager.deleter.wait_idle(10)  # removed in the background, not during the load
    assert not (tmp_path / "a-0.0123abcd-delete").exists()
    assert (tmp_path / "lost+found").exists()
    assert "not a partition directory" in caplog.text


def test_retention_and_periodic_work_through_the_manager(tmp_path):
    config = LogConfig(segment_bytes=200, retention_bytes=200, retention_ms=-1, segment_ms=1000)
    manager = LogManager(tmp_path, config)
    manager.load(now_ms=0)
    log = manager.get_or_create(A0, config, now_ms=0)
    for _ in range(10):
        log.append_as_leader(batch(2), 0, now_ms=0)
    segments_before = len(log.segments())
    assert manager.delete_old_segments(now_ms=0, high_watermarks={A0: 20}) > 0
    assert log.log_start_offset > 0
    assert OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read()[A0] == \
        log.log_start_offset
    assert len(log.segments()) < segments_before
    manager.maybe_roll_and_flush(now_ms=5000)  # segment.ms passed: the active one rolls
    assert log.active_segment.size_bytes == 0
    manager.update_topic_config("a", LogConfig(segment_bytes=10_000))
    assert log.config.segment_bytes == 10_000


def all_bytes(log):
    out, offset = b"", log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out, offset = out + result.records, result.next_offset
    return out


CHECKPOINT_NAMES = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                    "replication-offset-checkpoint")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(CHECKPOINT_NAMES), data=st.data(), clean=st.booleans())
def test_damaged_offset_checkpoints_never_stop_the_broker_or_lose_data(tmp_path_factory, name,
                                                                       data, clean):
    """Cut or flip a checkpoint at a random position: the data dir still loads, every
    log keeps its batches (from its start offset, which stays a segment start), and
    the high watermarks read back lie within each log."""
    data_dir = tmp_path_factory.mktemp("dir")
    manager = filled_manager(data_dir)
    manager.checkpoint_high_watermarks({A0: 17, A1: 5, B0: 0})
    expected = {tp: all_bytes(log) for tp, log in manager.logs().items()}
    manager.shutdown()
    path = data_dir / name
    content = bytearray(path.read_bytes())
    if data.draw(st.booleans(), label="cut"):
        content = content[:data.draw(st.integers(0, len(content) - 1), label="at")]
    else:
        content[data.draw(st.integers(0, len(content) - 1), label="at")] ^= data.draw(
            st.integers(1, 255), label="xor")
    path.write_bytes(bytes(content))
    if not clean:
        (data_dir / CLEAN_SHUTDOWN_FILE).unlink()
    again = LogManager(data_dir, CONFIG)
    again.load(now_ms=0)
    hws = again.read_high_watermarks()
    for tp, log in again.logs().items():
        bases = [s.base_offset for s in log.segments()]
        assert log.log_start_offset in bases
        assert log.log_end_offset == {A0: 20, A1: 6, B0: 0}[tp]
        assert expected[tp].endswith(all_bytes(log))
        assert log.log_start_offset <= hws[tp] <= log.log_end_offset
    again.shutdown()


class SlowFsync:
    """os.fsync and os.fdatasync that block on the first call (a disk busy writing
    back GiBs) until ``release``; later calls go straight through."""

    def __init__(self, monkeypatch):
        self.entered, self.released = threading.Event(), threading.Event()
        self.calls = 0
        real_fsync, real_fdatasync = os.fsync, os.fdatasync

        def slow(real):
            def call(fd):
                self.calls += 1
                if not self.entered.is_set():
                    self.entered.set()
                    assert self.released.wait(timeout=30), "the test never released the fsync"
                real(fd)
            return call

        monkeypatch.setattr(os, "fsync", slow(real_fsync))
        monkeypatch.setattr(os, "fdatasync", slow(real_fdatasync))

    def release(self):
        self.released.set()


def run_in_thread(fn, *args):
    """Start ``fn`` in a thread; the returned join() re-raises its exception."""
    outcome = []

    def target():
        try:
            outcome.append((True, fn(*args)))
        except BaseException as e:  # handed to the test thread
            outcome.append((False, e))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join(timeout=30):
        thread.join(timeout)
        assert not thread.is_alive(), f"{fn} still waiting after {timeout} s"
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    return join


def test_appends_and_reads_go_on_while_a_checkpoint_fsyncs(tmp_path, monkeypatch):
    manager = filled_manager(tmp_path)
    a0 = manager.get(A0)
    # The fills rolled segments, whose flushes are queued on the flush-log thread. Done
    # first: else one of them, not the checkpoint, may take the slow fsync, the checkpoint
    # runs late under load, and the append below lands before it reads the LEOs (CI under
    # load saw recovery_point 22).
    assert drain_roll_flushes()
    disk = SlowFsync(monkeypatch)
    checkpoint = run_in_thread(manager.checkpoint_recovery_points)
    assert disk.entered.wait(timeout=30)
    # The fsync is stuck. An append waiting for the log's lock would time out here
    # (generous bound: this checks "does not wait for the fsync", not a speed).
    run_in_thread(a0.append_as_leader, batch(2), 1, 0)(timeout=20)
    assert run_in_thread(a0.read, 20, 1 << 20)(timeout=20).next_offset == 22
    assert A0 in run_in_thread(manager.logs)(timeout=20)
    disk.release()
    checkpoint()
    # The points are the LEOs when the flush began: the append during it is not durable.
    assert a0.recovery_point == 20
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {
        A0: 20, A1: 6, B0: 0}
    manager.checkpoint_recovery_points()
    assert a0.recovery_point == 22
    for segment in a0.segments():
        assert not segment.needs_flush  # data and index files written and fsynced
        assert not segment.index.needs_sync and not segment.time_index.needs_sync


def test_no_checkpoint_fsync_runs_under_a_log_lock(tmp_path, monkeypatch):
    # An index entry per batch: the active segments' index files have tails to write.
    manager = filled_manager(tmp_path, LogConfig(segment_bytes=400, index_interval_bytes=0))
    logs = manager.logs().values()
    assert any(log.active_segment.index.is_dirty for log in logs)
    # The rolls above queued flushes on the flush-log thread: done first, or one of them,
    # overtaken by the checkpoint's own flush, may leave an index write behind it (CI
    # under load saw "needs_flush" afterwards). Only the checkpoint's fsyncs are probed.
    assert drain_roll_flushes()
    under_lock = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def probing(real):
        def call(fd):
            # Appends (the event loop) take the log's lock: another thread must get it.
            for log in logs:
                got = []
                probe = threading.Thread(target=lambda log=log, got=got: got.append(
                    log._lock.acquire(timeout=5) and (log._lock.release() or True)))
                probe.start()
                probe.join()
                if not got[0]:
                    under_lock.append((fd, log))
            real(fd)
        return call

    monkeypatch.setattr(os, "fsync", probing(real_fsync))
    monkeypatch.setattr(os, "fdatasync", probing(real_fdatasync))
    manager.checkpoint_recovery_points()
    assert under_lock == []
    for log in logs:
        assert log.recovery_point == log.log_end_offset
        assert not any(segment.needs_flush for segment in log.segments())


def test_checkpoint_files_are_written_without_the_logs_map_lock(tmp_path, monkeypatch):
    manager = filled_manager(tmp_path)
    disk = SlowFsync(monkeypatch)
    checkpoint = run_in_thread(manager.checkpoint_high_watermarks, {A0: 20, A1: 6})
    assert disk.entered.wait(timeout=30)
    # The event loop's calls into the manager do not wait for the file's fsync.
    assert len(run_in_thread(manager.logs)(timeout=20)) == 3
    run_in_thread(manager.get_or_create, TopicPartition("c", 0), CONFIG, 0)(timeout=20)
    disk.release()
    checkpoint()
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read() == {
        A0: 20, A1: 6}


@pytest.mark.parametrize("cut", ["truncate_to", "truncate_fully_and_start_at"])
def test_a_truncation_during_the_fsyncs_never_raises_the_recovery_point(tmp_path, monkeypatch,
                                                                         cut):
    manager = filled_manager(tmp_path, LogConfig(segment_bytes=1 << 20))  # no roll flushes
    a0 = manager.get(A0)
    disk = SlowFsync(monkeypatch)
    checkpoint = run_in_thread(manager.checkpoint_recovery_points)
    assert disk.entered.wait(timeout=30)
    # Cut below the LEO the flush noted, then append past it again: offsets 10.. are new
    # batches the stuck fsync may have missed, so the flush must not claim them.
    run_in_thread(getattr(a0, cut), 10)(timeout=20)
    for _ in range(8):
        run_in_thread(a0.append_as_leader, batch(2), 2, 0)(timeout=20)
    assert a0.log_end_offset == 26
    disk.release()
    checkpoint()
    assert a0.recovery_point <= 10
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read()[A0] <= 10
    manager.checkpoint_recovery_points()
    assert a0.recovery_point == 26


def test_a_failed_fsync_takes_the_log_offline_and_writes_no_points(tmp_path, monkeypatch):
    manager = filled_manager(tmp_path)
    manager.checkpoint_recovery_points()
    a0 = manager.get(A0)
    a0.append_as_leader(batch(2), leader_epoch=1, now_ms=0)

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(KafkaStorageError):
        manager.checkpoint_recovery_points()
    assert a0.is_offline and a0.recovery_point == 20
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read()[A0] == 20


def test_checkpoint_skips_a_log_deleted_meanwhile(tmp_path, monkeypatch):
    manager = filled_manager(tmp_path)
    disk = SlowFsync(monkeypatch)
    checkpoint = run_in_thread(manager.checkpoint_recovery_points)
    assert disk.entered.wait(timeout=30)
    run_in_thread(manager.delete, A1)(timeout=20)  # not flushed yet: closed when its turn comes
    a0 = manager.get(A0)
    run_in_thread(a0.truncate_fully_and_start_at, 20)(timeout=20)  # its segments' fds close
    disk.release()
    checkpoint()
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {
        A0: 20, B0: 0}


def test_delete_records_moves_the_log_start_durably_and_retention_frees_below_it(tmp_path):
    """DeleteRecords: the start moves inside a batch, survives a clean and an unclean
    restart (log-start-offset-checkpoint), reads below it are out of range, and the
    segments entirely below it go on the next retention pass (any retention)."""
    config = LogConfig(segment_bytes=200, retention_ms=-1, retention_bytes=-1)
    manager = LogManager(tmp_path, config)
    manager.load(now_ms=0)
    log = manager.get_or_create(A0, config, now_ms=0)
    for epoch in (1, 1, 2, 2, 2, 3):
        log.append_as_leader(batch(2), epoch, now_ms=0)
    assert log.maybe_increment_log_start_offset(7)  # inside the batch [6, 7] of epoch 2
    assert not log.maybe_increment_log_start_offset(5)  # never backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(13)  # past the LEO
    assert log.leader_epoch_cache.entries() == [(2, 7), (3, 10)]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 1000)
    assert log.read(7, 1000).first_offset == 6  # the whole batch holding the start
    manager.checkpoint_log_start_offsets()

    # An unclean restart (no marker): the checkpoint still says 7.
    for opened in manager.logs().values():
        opened.close()
    again = LogManager(tmp_path, config)
    again.load(now_ms=0)
    log = again.get(A0)
    assert log.log_start_offset == 7
    assert log.leader_epoch_cache.entries() == [(2, 7), (3, 10)]
    segments_before = len(log.segments())
    assert again.delete_old_segments(now_ms=0, high_watermarks={A0: 12}) > 0
    assert len(log.segments()) < segments_before
    assert log.segments()[0].base_offset <= 7 < log.segments()[0].next_offset
    assert log.log_start_offset == 7
    again.shutdown()
    last = LogManager(tmp_path, config)
    last.load(now_ms=0)
    assert last.get(A0).log_start_offset == 7
    last.shutdown()
