"""Log: appends (leader and follower), reads, rolls, retention, truncation, flush policy,
timestamps, and disk errors that must leave the log consistent."""

import errno
import os

import pytest

from tidewater.broker.storage.log import Log, UnexpectedAppendOffsetError
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import iter_batches, validate_batch
from tidewater.proto.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    KafkaStorageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from tidewater.proto.records import decode_records, encode_batch


def batch(n=1, value=b"v", ts=1000, epoch=-1, base_offset=0):
    return encode_batch([(None, value)] * n, base_timestamp_ms=ts, base_offset=base_offset,
                        partition_leader_epoch=epoch)


def open_log(tmp_path, name="t-0", **config):
    return Log.open(tmp_path / name, LogConfig(**config), now_ms=0)


def wait_for_roll_flushes():
    """Rolled segments are flushed on the process's one "flush-log" thread, in order:
    a job queued now runs after every flush queued before it."""
    from tidewater.broker.storage import log as log_module

    log_module._roll_flusher().submit(lambda: None).result(timeout=30)


def headers(data):
    return [(h.base_offset, h.last_offset, h.partition_leader_epoch) for _, h in iter_batches(data)]


def read_all(log):
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out.extend(headers(result.records))
        offset = result.next_offset
    return out


def test_leader_append_assigns_offsets_and_stamps_epoch(tmp_path):
    log = open_log(tmp_path)
    assert log.topic_partition == TopicPartition("t", 0)
    first = log.append_as_leader(batch(3, base_offset=999, epoch=77), leader_epoch=2, now_ms=5)
    second = log.append_as_leader(batch(2) + batch(1), leader_epoch=2, now_ms=6)
    assert (first.first_offset, first.last_offset, first.record_count) == (0, 2, 3)
    assert (second.first_offset, second.last_offset, second.record_count) == (3, 5, 3)
    assert log.log_end_offset == 6
    data = log.read(0, 1 << 20).records
    assert headers(data) == [(0, 2, 2), (3, 4, 2), (5, 5, 2)]
    for position, _header in iter_batches(data):
        validate_batch(data, position)  # restamping kept every CRC valid
    assert [r.offset for r in decode_records(data)] == [0, 1, 2, 3, 4, 5]
    assert log.leader_epoch_cache.entries() == [(2, 0)]


def test_leader_append_rejects_bad_input_and_writes_nothing(tmp_path):
    log = open_log(tmp_path, max_message_bytes=500, segment_bytes=4000)
    log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
    good = batch(2)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good + bytes(corrupt), leader_epoch=0, now_ms=0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good[:-3], leader_epoch=0, now_ms=0)
    with pytest.raises(MessageTooLargeError):
        log.append_as_leader(batch(1, b"x" * 600), leader_epoch=0, now_ms=0)
    with pytest.raises(RecordListTooLargeError):
        log.append_as_leader(b"".join(batch(1, b"x" * 400) for _ in range(10)), 0, now_ms=0)
    with pytest.raises(FencedLeaderEpochError):
        log.append_as_leader(good, leader_epoch=-1, now_ms=0)
    assert log.log_end_offset == 1
    assert log.size_bytes == len(batch())
    assert read_all(log) == [(0, 0, 0)]


def test_empty_append_is_a_no_op(tmp_path):
    log = open_log(tmp_path)
    info = log.append_as_leader(b"", leader_epoch=0, now_ms=0)
    assert info.record_count == 0 and log.log_end_offset == 0


def test_follower_append_keeps_offsets_and_epochs(tmp_path):
    log = open_log(tmp_path)
    data = batch(2, epoch=1, base_offset=0) + batch(1, epoch=3, base_offset=2)
    info = log.append_as_follower(data, now_ms=0)
    assert (info.first_offset, info.last_offset) == (0, 2)
    assert headers(log.read(0, 1 << 20).records) == [(0, 1, 1), (2, 2, 3)]
    assert log.leader_epoch_cache.entries() == [(1, 0), (3, 2)]
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(batch(1, epoch=3, base_offset=5), now_ms=0)
    with pytest.raises(UnexpectedAppendOffsetError):  # a gap inside the fetched batches
        log.append_as_follower(batch(1, epoch=3, base_offset=3) + batch(1, epoch=3, base_offset=5),
                               now_ms=0)
    assert log.log_end_offset == 3


def test_read_limits_bytes_offsets_and_min_one_batch(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=100)
    for i in range(20):
        log.append_as_leader(batch(2, b"%02d" % i), leader_epoch=0, now_ms=0)
    size = len(batch(2, b"00"))
    result = log.read(7, 3 * size)
    assert result.first_offset == 6  # the batch holding 7 comes whole
    assert headers(result.records) == [(6, 7, 0), (8, 9, 0), (10, 11, 0)]
    assert result.next_offset == 12
    assert headers(log.read(7, 3 * size + size - 1).records)[-1] == (10, 11, 0)
    assert headers(log.read(7, 1).records) == [(6, 7, 0)]  # min_one_batch
    assert log.read(7, 1, min_one_batch=False).records == b""
    assert headers(log.read(0, 1 << 20, max_offset=9).records)[-1] == (8, 9, 0)
    assert log.read(10, 1 << 20, max_offset=10).records == b""
    end = log.read(40, 100)
    assert (end.records, end.first_offset, end.next_offset) == (b"", 40, 40)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(41, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_roll_on_segment_bytes_and_reads_across_segments(tmp_path):
    size = len(batch(1, b"x" * 100))
    log = open_log(tmp_path, segment_bytes=3 * size)
    for _ in range(10):
        log.append_as_leader(batch(1, b"x" * 100), leader_epoch=0, now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 3, 6, 9]
    assert [s.size_bytes for s in log.segments()] == [3 * size] * 3 + [size]
    wait_for_roll_flushes()
    assert log.recovery_point == 9  # rolled segments are flushed (in the background)
    assert read_all(log) == [(i, i, 0) for i in range(10)]
    names = sorted(p.name for p in (tmp_path / "t-0").iterdir())
    assert "00000000000000000003.log" in names and "00000000000000000003.index" in names
    assert "00000000000000000003.timeindex" in names and "leader-epoch-checkpoint" in names


def test_roll_on_segment_ms_and_on_full_index(tmp_path):
    log = open_log(tmp_path, segment_ms=1000)
    log.append_as_leader(batch(), 0, now_ms=0)
    log.maybe_roll(now_ms=1000)
    assert len(log.segments()) == 1
    log.maybe_roll(now_ms=1001)
    assert len(log.segments()) == 2
    log.maybe_roll(now_ms=5000)  # the new segment is empty: nothing to roll
    assert len(log.segments()) == 2
    log.append_as_leader(batch(), 0, now_ms=5000)
    log.append_as_leader(batch(), 0, now_ms=6001)  # checked on append too
    assert [s.base_offset for s in log.segments()] == [0, 1, 2]

    # 24 bytes: 3 offset-index entries (or 2 time-index entries; equal timestamps add one)
    full = open_log(tmp_path, name="t-1", index_interval_bytes=0, segment_index_bytes=24)
    for _ in range(10):
        full.append_as_leader(batch(), 0, now_ms=0)
    # the first batch of a segment never gets an entry, so 4 batches fill a segment
    assert [s.base_offset for s in full.segments()] == [0, 4, 8]


def test_truncate_to_drops_later_segments_and_straddling_batches(tmp_path):
    size = len(batch(2))
    log = open_log(tmp_path, segment_bytes=2 * size)
    for epoch in range(5):
        log.append_as_leader(batch(2), leader_epoch=epoch, now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 4, 8]
    log.truncate_to(7)  # offset 7 is inside batch 6..7: that batch goes whole
    assert log.log_end_offset == 6
    assert read_all(log) == [(0, 1, 0), (2, 3, 1), (4, 5, 2)]
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2), (2, 4)]
    assert [s.base_offset for s in log.segments()] == [0, 4]
    assert not (tmp_path / "t-0" / "00000000000000000008.log").exists()
    log.truncate_to(4)  # the segment starting at 4 would be empty: it goes
    assert log.log_end_offset == 4 and [s.base_offset for s in log.segments()] == [0]
    log.truncate_to(100)  # beyond the LEO: nothing to cut
    assert log.log_end_offset == 4
    log.append_as_leader(batch(2), leader_epoch=9, now_ms=0)
    assert read_all(log)[-1] == (4, 5, 9)
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.leader_epoch_cache.entries() == []


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, now_ms=0)
    log.truncate_fully_and_start_at(50)
    assert (log.log_start_offset, log.log_end_offset) == (50, 50)
    assert log.leader_epoch_cache.entries() == []
    log.append_as_leader(batch(1), 2, now_ms=0)
    assert read_all(log) == [(50, 50, 2)]
    assert [p.name for p in sorted((tmp_path / "t-0").glob("*.log"))] == [
        "00000000000000000050.log"]


def test_retention_by_bytes_stays_below_hw_and_keeps_active(tmp_path):
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=2 * size, retention_bytes=2 * size, retention_ms=-1)
    for epoch in range(10):
        log.append_as_leader(batch(1), leader_epoch=epoch, now_ms=0)
    assert [s.base_offset for s in log.segments()] == [0, 2, 4, 6, 8]
    assert log.delete_old_segments(now_ms=0, high_watermark=3) == 1  # segment 2..3 ends at HW 4
    assert log.log_start_offset == 2
    # Kafka's rule: delete while what is left still holds retention.bytes
    assert log.delete_old_segments(now_ms=0, high_watermark=10) == 3
    assert log.log_start_offset == 8
    assert [s.base_offset for s in log.segments()] == [8]
    assert log.leader_epoch_cache.entries() == [(8, 8), (9, 9)]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(7, 100)
    assert read_all(log) == [(8, 8, 8), (9, 9, 9)]
    assert log.delete_old_segments(now_ms=0, high_watermark=10) == 0  # never the active one


def test_retention_renames_under_the_lock_and_unlinks_later(tmp_path, monkeypatch):
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=2 * size, retention_bytes=2 * size, retention_ms=-1)
    for epoch in range(6):
        log.append_as_leader(batch(1), leader_epoch=epoch, now_ms=0)
    pending = []
    monkeypatch.setattr("tidewater.broker.storage.log.unlink_in_background",
                        lambda paths, name: pending.extend(paths))
    assert log.delete_old_segments(now_ms=0, high_watermark=6) == 2
    directory = tmp_path / "t-0"
    # Freeing the blocks waits for the background thread; the log no longer has them.
    assert sorted(p.name for p in directory.glob("*.log")) == ["00000000000000000004.log"]
    assert sorted(p.name for p in pending) == sorted(
        f"{base:020d}{suffix}.deleted" for base in (0, 2)
        for suffix in (".log", ".index", ".timeindex"))
    # A crash before the unlink: opening the log removes the leftovers.
    log.close()
    reopened = Log.open(directory, LogConfig(segment_bytes=2 * size), now_ms=0,
                        log_start_offset=4)
    assert not any(p.name.endswith(".deleted") for p in directory.iterdir())
    assert reopened.log_start_offset == 4 and reopened.log_end_offset == 6


def test_retention_by_time_uses_largest_timestamp(tmp_path):
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=size, retention_ms=1000)
    for i in range(4):
        log.append_as_leader(batch(1, ts=10_000 * (i + 1)), 0, now_ms=0)
    # segments' max timestamps: 10000, 20000, 30000, 40000 (active)
    assert log.delete_old_segments(now_ms=21_001, high_watermark=4) == 2
    assert log.log_start_offset == 2
    assert log.leader_epoch_cache.entries() == [(0, 2)]


def test_fetch_offset_by_timestamp(tmp_path):
    log = open_log(tmp_path, segment_bytes=300, index_interval_bytes=50)
    for i in range(20):
        log.append_as_leader(encode_batch([(None, b"a"), (None, b"b")],
                                          base_timestamp_ms=1000 + 10 * i), i // 5, now_ms=0)
    # record 2i has timestamp 1000+10i, record 2i+1 too (both take the batch's base)
    assert log.fetch_offset_by_timestamp(1000) == (0, 1000, 0)
    assert log.fetch_offset_by_timestamp(1051) == (12, 1060, 1)
    assert log.fetch_offset_by_timestamp(1190) == (38, 1190, 3)
    assert log.fetch_offset_by_timestamp(1191) is None
    assert log.fetch_offset_by_timestamp(-2) == (0, -1, 0)
    assert log.fetch_offset_by_timestamp(-1) == (40, -1, 3)


def test_max_timestamp_finds_the_first_record_with_the_largest_timestamp(tmp_path):
    # KIP-734 (ListOffsets v7, timestamp -3): timestamps need not rise with offsets.
    log = open_log(tmp_path, segment_bytes=300, index_interval_bytes=50)
    assert log.fetch_offset_by_timestamp(-3) is None  # empty
    stamps = [5000, 9000, 7000, 9000, 3000, 8000, 1000, 2000]
    for i, ts in enumerate(stamps):
        log.append_as_leader(encode_batch([(None, b"a"), (None, b"b")],
                                          base_timestamp_ms=ts), i // 4, now_ms=0)
    assert len(log.segments()) > 1
    assert log.fetch_offset_by_timestamp(-3) == (2, 9000, 0)  # batch 1, not batch 3


def test_log_append_time_restamps_max_timestamp(tmp_path):
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(batch(2, ts=5), leader_epoch=0, now_ms=777)
    assert info.log_append_time_ms == 777 and info.max_timestamp == 777
    data = log.read(0, 1000).records
    header = validate_batch(data)  # CRC recomputed
    assert header.max_timestamp == 777 and header.timestamp_type == 1


def test_end_offset_for_epoch(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 0, now_ms=0)
    log.append_as_leader(batch(2), 2, now_ms=0)
    assert log.end_offset_for_epoch(0) == (0, 3)
    assert log.end_offset_for_epoch(1) == (0, 3)
    assert log.end_offset_for_epoch(2) == (2, 5)
    assert log.latest_epoch == 2


def test_flush_policy_moves_recovery_point(tmp_path, monkeypatch):
    fsyncs = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (fsyncs.append(fd), real(fd))[1])
    default = open_log(tmp_path, name="a-0")
    default.append_as_leader(batch(), 0, now_ms=0)
    default.append_as_leader(batch(), 0, now_ms=0)
    assert default.recovery_point == 0  # Kafka's default: flush on roll and checkpoints only
    default.flush()
    assert default.recovery_point == 2

    every = open_log(tmp_path, name="b-0", flush_messages=1)
    before = len(fsyncs)
    every.append_as_leader(batch(), 0, now_ms=0)
    assert every.recovery_point == 1 and len(fsyncs) > before

    timed = open_log(tmp_path, name="c-0", flush_ms=100)
    timed.append_as_leader(batch(), 0, now_ms=50)
    assert timed.recovery_point == 0
    assert not timed.maybe_flush(now_ms=99)
    assert timed.maybe_flush(now_ms=100)
    assert timed.recovery_point == 1
    timed.append_as_leader(batch(), 0, now_ms=250)  # flushed by the append itself
    assert timed.recovery_point == 2


def test_reopen_after_close_keeps_everything(tmp_path):
    size = len(batch(2))
    log = open_log(tmp_path, segment_bytes=3 * size, index_interval_bytes=10)
    for i in range(10):
        log.append_as_leader(batch(2, ts=100 + i), i // 3, now_ms=0)
    expected = read_all(log)
    cache = log.leader_epoch_cache.entries()
    log.close()
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(batch(), 3, now_ms=0)
    reopened = Log.open(tmp_path / "t-0", log.config, now_ms=0, had_clean_shutdown=True,
                        recovery_point=log.recovery_point)
    assert read_all(reopened) == expected
    assert reopened.leader_epoch_cache.entries() == cache
    assert reopened.recovery_point == reopened.log_end_offset == 20
    assert reopened.fetch_offset_by_timestamp(105)[0] == 10
    reopened.append_as_leader(batch(1), 3, now_ms=0)
    assert reopened.log_end_offset == 21


def test_failed_write_leaves_log_unchanged_and_usable(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, now_ms=0)
    size_before = log.size_bytes
    real_write = os.write

    def full_disk_after_half(fd, data):
        # Segment writes get half through, then the disk is full: the torn half must go.
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            return real_write(fd, data)
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk_after_half)
    with pytest.raises(KafkaStorageError) as info:
        log.append_as_leader(batch(3), 1, now_ms=0)
    assert info.value.error_name == "KAFKA_STORAGE_ERROR"
    assert info.value.path.endswith("00000000000000000000.log")
    assert log.log_end_offset == 2
    assert os.path.getsize(tmp_path / "t-0" / "00000000000000000000.log") == size_before
    assert log.leader_epoch_cache.entries() == [(0, 0)]  # the epoch-1 entry was undone
    monkeypatch.setattr(os, "write", real_write)
    log.append_as_leader(batch(1), 1, now_ms=0)
    assert read_all(log) == [(0, 1, 0), (2, 2, 1)]


def test_failed_epoch_checkpoint_write_leaves_log_unchanged(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, now_ms=0)

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(KafkaStorageError) as info:
        log.append_as_leader(batch(1), 1, now_ms=0)  # a new epoch: the checkpoint is written first
    assert info.value.path.endswith("leader-epoch-checkpoint")
    assert not log.is_offline
    assert log.log_end_offset == 2 and log.leader_epoch_cache.entries() == [(0, 0)]
    monkeypatch.undo()
    log.append_as_leader(batch(1), 1, now_ms=0)
    assert read_all(log) == [(0, 1, 0), (2, 2, 1)]


def test_failed_roll_takes_log_offline_and_loses_nothing(tmp_path, monkeypatch):
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=2 * size)
    log.append_as_leader(batch(1), 0, now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=0)
    real_open = os.open

    def no_space_for_new_files(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and str(path).endswith(".log"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_space_for_new_files)
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(batch(1), 0, now_ms=0)  # needs a new segment
    assert log.is_offline
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(batch(1), 0, now_ms=0)
    monkeypatch.undo()
    log.close()
    assert read_all(Log.open(tmp_path / "t-0", log.config, now_ms=0)) == [(0, 0, 0), (1, 1, 0)]


def test_failed_fsync_takes_log_offline_until_reopened(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, now_ms=0)

    def broken_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    monkeypatch.setattr(os, "fdatasync", broken_fsync)
    with pytest.raises(KafkaStorageError):
        log.flush()
    assert log.is_offline
    with pytest.raises(KafkaStorageError):
        log.read(0, 100)
    monkeypatch.undo()
    log.close()
    reopened = Log.open(tmp_path / "t-0", log.config, now_ms=0)
    assert read_all(reopened) == [(0, 1, 0)]


def test_permission_error_is_a_storage_error_with_the_path(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, now_ms=0)
    log.close()
    real_open = os.open

    def denied(path, flags, *args, **kwargs):
        if str(path).endswith(".log"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(KafkaStorageError) as info:
        Log.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    assert info.value.path.endswith("00000000000000000000.log")
    monkeypatch.undo()
    assert read_all(Log.open(tmp_path / "t-0", LogConfig(), now_ms=0)) == [(0, 1, 0)]


def test_reads_return_whole_batches_within_max_bytes(tmp_path):
    """Random start offsets and limits: whole contiguous batches from the one holding the
    start, never over max_bytes unless a single batch is forced by min_one_batch; the
    position hints of sequential reads give the same bytes as cold reads."""
    import random

    rng = random.Random(5)
    log = open_log(tmp_path, segment_bytes=5000, index_interval_bytes=300)
    for i in range(200):
        log.append_as_leader(batch(rng.randint(1, 3), b"x" * rng.randint(0, 200)), i // 50,
                             now_ms=0)
    everything = read_all(log)
    by_offset = {o: (base, last, epoch) for base, last, epoch in everything
                 for o in range(base, last + 1)}
    for _ in range(300):
        start = rng.randrange(log.log_end_offset)
        max_bytes = rng.randint(1, 3000)
        result = log.read(start, max_bytes)
        got = headers(result.records)
        assert got[0] == by_offset[start]
        assert len(result.records) <= max_bytes or len(got) == 1
        assert got == everything[everything.index(got[0]):everything.index(got[0]) + len(got)]
        assert result.next_offset == got[-1][1] + 1
        again = (log.read(result.next_offset, max_bytes)
                 if result.next_offset < log.log_end_offset else None)
        if again is not None and again.records:
            assert headers(again.records)[0][0] == result.next_offset


def test_inactive_segment_indexes_leave_memory_and_come_back(tmp_path, caplog):
    log = open_log(tmp_path, segment_bytes=600, index_interval_bytes=50)
    for i in range(60):
        log.append_as_leader(batch(1, b"%02d" % i * 20), 0, now_ms=0)
    wait_for_roll_flushes()  # a rolled segment's indexes leave memory once written
    segments = log.segments()
    assert len(segments) > 6
    assert all(not s.indexes_loaded and len(s.index) == 0 for s in segments[:-1])
    expected = read_all(log)
    assert expected == [(i, i, 0) for i in range(60)]
    assert sum(s.indexes_loaded for s in segments[:-1]) <= 4  # a bounded number come back
    first = segments[0]
    assert not first.indexes_loaded  # evicted again by later reads
    first.index.path.write_bytes(b"\x00" * 7)  # damaged while out of memory
    assert headers(log.read(3, 1).records) == [(3, 3, 0)]
    assert "rebuilding the indexes" in caplog.text
    assert len(first.index.path.read_bytes()) % 8 == 0  # the rebuilt file replaced it
    log.close()
    caplog.clear()
    reopened = Log.open(tmp_path / "t-0", log.config, now_ms=0, had_clean_shutdown=True)
    assert read_all(reopened) == expected
    assert "rebuilding" not in caplog.text
