"""The log cleaner: planning (pure), the batch filter, the throttle, a cleaning of a real
log directory end to end (offsets, epochs, CRCs, producer batches, follower appends of
gaps), and a crash at every step of the swap followed by recovery."""

from __future__ import annotations

import os
import shutil

import pytest

from tidewater.broker.storage import cleaner as cleaner_module
from tidewater.broker.storage.cleaner import IoThrottle, LogCleaner
from tidewater.broker.storage.cleaner_plan import SegmentSummary, group_segments, plan_cleaning
from tidewater.broker.storage.cleaner_rewrite import FilterStats, RetainRules, filter_batch, keeps
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.recovery import close_segments_quietly
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import iter_batches, validate_batch
from tidewater.proto.compression import COMPRESSION_GZIP
from tidewater.proto.records import SimpleRecord, decode_batch_records, encode_batch

TP = TopicPartition("t", 0)
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "1024",
           "min.cleanable.dirty.ratio": "0", "delete.retention.ms": "1000"}


def compact_config(**overrides: str) -> LogConfig:
    return LogConfig.from_configs({**COMPACT, **overrides})


def summary(base, end, size=100, ts=0, first_ms=None):
    return SegmentSummary(base, end, size, ts, first_ms)


def read_records(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, read through Log.read (CRC-checked)."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        if not result.records:
            break
        for position, header in iter_batches(result.records):
            out += [(r.offset, r.key, r.value)
                    for r in decode_batch_records(result.records, position, header)]
        offset = result.next_offset
    return out


def fill(log: Log, updates: list[tuple[bytes, bytes | None]], *, epoch=0, ts=1000, per_batch=1,
         **batch_args):
    for i in range(0, len(updates), per_batch):
        log.append_as_leader(encode_batch(updates[i:i + per_batch], base_timestamp_ms=ts,
                                          **batch_args), epoch, now_ms=ts)


def updates(n: int, keys: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%d" % (i % keys), b"v%d" % i) for i in range(n)]


def clean(log: Log, now_ms=10_000, cleaner=None, hw=None):
    cleaner = cleaner or LogCleaner(log.dir.parent)
    log.flush()
    return cleaner.clean_logs({TP: log}, {TP: log.log_end_offset if hw is None else hw}, now_ms)


# -- planning ----------------------------------------------------------------------


def test_plan_stops_at_the_high_watermark_and_the_active_segment():
    segments = [summary(0, 10), summary(10, 20), summary(20, 30), summary(30, 35)]
    config = compact_config(**{"segment.bytes": "1000000"})
    plan = plan_cleaning(segments, first_dirty_offset=0, high_watermark=25, recovery_point=99,
                         now_ms=0, config=config)
    assert plan is not None and plan.clean_end_offset == 20 and plan.groups == ((0, 1),)
    plan = plan_cleaning(segments, first_dirty_offset=0, high_watermark=99, recovery_point=99,
                         now_ms=0, config=config)
    assert plan is not None and plan.clean_end_offset == 30  # never the active segment
    assert plan_cleaning(segments, first_dirty_offset=0, high_watermark=9, recovery_point=99,
                         now_ms=0, config=config) is None
    assert plan_cleaning(segments, first_dirty_offset=0, high_watermark=99, recovery_point=15,
                         now_ms=0, config=config).clean_end_offset == 10  # unflushed: no


def test_plan_needs_the_dirty_ratio_and_compaction():
    segments = [summary(0, 10, 300), summary(10, 20, 100), summary(20, 30)]
    plan = plan_cleaning(segments, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=0, config=compact_config(**{"min.cleanable.dirty.ratio": "0.25"}))
    assert plan is not None and plan.dirty_ratio == 0.25 and plan.dirty_segments == (1,)
    assert plan_cleaning(segments, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=0,
                         config=compact_config(**{"min.cleanable.dirty.ratio": "0.3"})) is None
    assert plan_cleaning(segments, first_dirty_offset=20, high_watermark=99, recovery_point=99,
                         now_ms=0, config=compact_config()) is None  # nothing dirty
    assert plan_cleaning(segments, first_dirty_offset=0, high_watermark=99, recovery_point=99,
                         now_ms=0, config=LogConfig()) is None  # cleanup.policy=delete
    # A first dirty offset past the end (log recreated): cleaned from the start again.
    assert plan_cleaning(segments, first_dirty_offset=500, high_watermark=99, recovery_point=99,
                         now_ms=0, config=compact_config()).first_dirty_offset == 0


def test_plan_keeps_records_younger_than_the_compaction_lag():
    segments = [summary(0, 10, ts=100), summary(10, 20, ts=5000), summary(20, 30, ts=6000)]
    config = compact_config(**{"min.compaction.lag.ms": "1000"})
    plan = plan_cleaning(segments, first_dirty_offset=0, high_watermark=99, recovery_point=99,
                         now_ms=5500, config=config)
    assert plan is not None and plan.clean_end_offset == 10


def test_a_dirty_segment_older_than_the_max_lag_is_cleaned_at_any_ratio():
    # 10% dirty, far below the 0.5 minimum: cleaned only once its first batch is overdue.
    segments = [summary(0, 10, 900, first_ms=0), summary(10, 20, 100, first_ms=2000),
                summary(20, 30, first_ms=9000)]
    lagged = compact_config(**{"max.compaction.lag.ms": "5000", "min.cleanable.dirty.ratio": "0.5"})
    assert plan_cleaning(segments, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=7000, config=lagged) is None  # waited 5,000 ms: not more
    plan = plan_cleaning(segments, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=7001, config=lagged)
    assert plan is not None and plan.dirty_segments == (1,) and plan.dirty_ratio == 0.1
    assert plan_cleaning(segments, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=10**9, config=compact_config(**{
                             "min.cleanable.dirty.ratio": "0.5"})) is None  # default: never
    # ...and never below the HW's limits or min.compaction.lag.ms.
    both = compact_config(**{"max.compaction.lag.ms": "5000", "min.compaction.lag.ms": "8000",
                             "min.cleanable.dirty.ratio": "0.5"})
    young = [summary(0, 10, 900, first_ms=0), summary(10, 20, 100, ts=7000, first_ms=2000),
             summary(20, 30, first_ms=9000)]
    assert plan_cleaning(young, first_dirty_offset=10, high_watermark=99, recovery_point=99,
                         now_ms=7001, config=both) is None


def test_a_compacted_log_rolls_its_active_segment_at_the_max_lag(tmp_path):
    config = compact_config(**{"segment.ms": "60000", "max.compaction.lag.ms": "5000",
                               "segment.bytes": "1000000"})
    assert config.roll_ms == 5000
    assert LogConfig.from_configs({"max.compaction.lag.ms": "5000"}).roll_ms == 7 * 86_400_000
    assert compact_config().roll_ms == 7 * 86_400_000
    # The active segment is never cleaned: rolling it at the lag is what lets its records
    # be compacted in time.
    log = Log.open(tmp_path / "t-0", config, now_ms=0)
    fill(log, updates(10, 2), ts=0)
    log.maybe_roll(now_ms=5000)
    assert len(log.segments()) == 1  # not older than the lag yet
    log.maybe_roll(now_ms=5001)
    assert len(log.segments()) == 2
    [result] = clean(log, now_ms=5002)
    assert [(k, v) for _o, k, v in read_records(log)] == [(b"k0", b"v8"), (b"k1", b"v9")]
    assert result.clean_end_offset == 10
    log.close()


def test_groups_fit_segment_bytes():
    segments = [summary(0, 10, 400), summary(10, 20, 400), summary(20, 30, 400), summary(30, 31)]
    assert group_segments(segments, 1000) == ((0, 1), (2,))
    assert group_segments(segments, 100) == ((0,), (1,), (2,))


def test_throttle_holds_the_rate():
    throttle = IoThrottle(1000, now_s=0.0)
    assert throttle.delay_s(500, 0.0) == 0.0 or throttle.delay_s(0, 0.0) >= 0
    delays = sum(throttle.delay_s(1000, 0.0) for _ in range(3))
    assert delays > 0
    assert IoThrottle(0, 0.0).delay_s(1 << 30, 0.0) == 0.0
    # Idle time does not bank more than a second of allowance.
    later = IoThrottle(1000, now_s=0.0)
    assert later.delay_s(1000, 100.0) == 0.0 and later.delay_s(2000, 100.0) > 1.5


# -- the batch filter ----------------------------------------------------------------


def _rules(offsets, horizon=0, producers=None):
    return RetainRules(offsets, horizon, producers or {})


def test_filter_keeps_offsets_attributes_and_a_valid_crc():
    data = encode_batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3")], base_offset=100,
                        partition_leader_epoch=7, base_timestamp_ms=5000,
                        compression=COMPRESSION_GZIP, producer_id=9, producer_epoch=1,
                        base_sequence=40)
    header = validate_batch(data)
    out = filter_batch(data, 0, header, _rules({b"a": 102, b"b": 101}), FilterStats())
    assert out is not None
    new = validate_batch(out)  # CRC and framing
    assert (new.base_offset, new.last_offset_delta, new.partition_leader_epoch, new.producer_id,
            new.producer_epoch, new.base_sequence, new.compression, new.max_timestamp) == (
        100, 2, 7, 9, 1, 40, COMPRESSION_GZIP, header.max_timestamp)
    assert [(r.offset, r.key, r.value) for r in decode_batch_records(out, 0, new)] == [
        (101, b"b", b"2"), (102, b"a", b"3")]
    # Every record kept: the very same bytes.
    assert filter_batch(data, 0, header, _rules({}), FilterStats()) == data


def test_filter_drops_superseded_keyless_and_old_tombstones():
    data = encode_batch([(b"a", b"1"), (None, b"x"), (b"t", None)], base_timestamp_ms=1000)
    header = validate_batch(data)
    stats = FilterStats()
    assert filter_batch(data, 0, header, _rules({b"a": 5}, horizon=2000), stats) is None
    assert (stats.records_read, stats.records_kept) == (3, 0)
    kept = filter_batch(data, 0, header, _rules({b"a": 5}, horizon=500), FilterStats())
    assert [(r.key, r.value) for r in decode_batch_records(kept, 0, validate_batch(kept))] == [
        (b"t", None)]  # a tombstone younger than the horizon stays


@pytest.mark.parametrize("batch_ts,kept", [(1999, False), (2000, True), (2001, True)])
def test_a_tombstone_goes_once_its_batch_is_older_than_the_horizon(batch_ts, kept):
    assert keeps(b"k", None, 5, batch_ts, _rules({b"k": 5}, horizon=2000)) is kept
    assert keeps(b"k", b"v", 5, batch_ts, _rules({b"k": 5}, horizon=2000))  # values stay
    assert not keeps(b"k", b"v", 4, batch_ts, _rules({b"k": 5}, horizon=0))  # superseded


def test_filter_keeps_a_producers_last_batch_empty():
    data = encode_batch([(b"a", b"1")], base_offset=10, producer_id=3, producer_epoch=0,
                        base_sequence=5)
    header = validate_batch(data)
    assert filter_batch(data, 0, header, _rules({b"a": 99}), FilterStats()) is None
    out = filter_batch(data, 0, header, _rules({b"a": 99}, producers={3: 10}), FilterStats())
    new = validate_batch(out)
    assert (new.record_count, new.base_offset, new.last_offset, new.base_sequence) == (0, 10, 10, 5)


# -- cleaning a log --------------------------------------------------------------------


def test_cleaning_keeps_the_latest_value_per_key_at_its_offset(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(200, 7), epoch=0)
    fill(log, updates(100, 7)[::-1], epoch=3)
    before = read_records(log)
    entries = log.leader_epoch_cache.entries()
    size_before = log.size_bytes
    [result] = clean(log)
    after = read_records(log)
    clean_end = result.clean_end_offset
    latest = {}
    for offset, key, _value in before:
        if offset < clean_end:
            latest[key] = offset
    assert [r for r in after if r[0] < clean_end] == [r for r in before if r[0] == latest[r[1]]]
    assert [r for r in after if r[0] >= clean_end] == [r for r in before if r[0] >= clean_end]
    assert log.size_bytes < size_before
    assert log.leader_epoch_cache.entries() == entries
    assert set(os.listdir(log.dir)) & {".cleaned", ".swap"} == set()
    # Recovery from scratch reads the same log (gaps accepted, epochs kept).
    log.close()
    reopened = Log.open(tmp_path / "t-0", compact_config(), now_ms=0, recovery_point=0)
    assert read_records(reopened) == after
    assert reopened.leader_epoch_cache.entries() == entries
    reopened.close()


def test_a_second_pass_merges_the_small_segments(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(300, 3))
    clean(log)
    segments_after_first = len(log.segments())
    fill(log, updates(30, 3))
    cleaner = LogCleaner(tmp_path)
    clean(log, cleaner=cleaner)
    assert len(log.segments()) < segments_after_first
    keys = [k for _, k, _ in read_records(log) if True]
    assert len(keys) <= 3 + len([s for s in log.segments()]) * 3
    log.close()


def test_tombstones_go_after_delete_retention(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, [(b"a", b"1"), (b"a", None), (b"b", b"2")] * 30, ts=1000)
    clean(log, now_ms=1500)  # horizon 500: the tombstones are younger
    assert (b"a", None) in [(k, v) for _, k, v in read_records(log)]
    cleaner = LogCleaner(tmp_path)
    cleaner.first_dirty_offsets[TP] = 0
    clean(log, now_ms=5000, cleaner=cleaner)  # horizon 4000: they go
    assert b"a" not in [k for o, k, _ in read_records(log) if o < log.segments()[-1].base_offset]
    log.close()


def test_retention_leaves_compacted_logs_alone(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(**{"retention.ms": "1"}), now_ms=0)
    fill(log, updates(100, 100))
    assert log.delete_old_segments(now_ms=10**9, high_watermark=log.log_end_offset) == 0
    log.close()


def test_cleaning_never_reads_past_the_high_watermark(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(200, 2))
    before = read_records(log)
    hw = log.segments()[3].base_offset
    clean(log, hw=hw)
    after = read_records(log)
    assert [r for r in after if r[0] >= hw] == [r for r in before if r[0] >= hw]
    log.close()


def test_a_follower_copies_a_compacted_leader(tmp_path):
    leader = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(leader, updates(150, 5), epoch=2)
    clean(leader)
    follower = Log.open(tmp_path / "f" / "t-0", compact_config(), now_ms=0)
    offset = 0
    while offset < leader.log_end_offset:
        result = leader.read(offset, 300)
        follower.append_as_follower(result.records, now_ms=0)
        offset = result.next_offset
    assert read_records(follower) == read_records(leader)
    assert follower.log_end_offset == leader.log_end_offset
    assert follower.leader_epoch_cache.entries() == [(2, leader.read(0, 100).first_offset)]
    leader.close()
    follower.close()


def test_a_plain_log_still_refuses_a_gap(tmp_path):
    from tidewater.broker.storage.log import UnexpectedAppendOffsetError
    log = Log.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(encode_batch([(b"k", b"v")], base_offset=5), now_ms=0)
    log.close()


def test_a_producers_last_batch_survives(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    log.append_as_leader(encode_batch([SimpleRecord(b"a", b"first")], producer_id=77,
                                      producer_epoch=0, base_sequence=0), 0, now_ms=1000)
    fill(log, [(b"a", b"newer")] + updates(100, 1))
    clean(log)
    batches = []
    for segment in log.segments():
        data = segment.log_path.read_bytes()
        batches += [h for _, h in iter_batches(data)]
    [kept] = [h for h in batches if h.producer_id == 77]
    assert (kept.base_offset, kept.record_count, kept.base_sequence) == (0, 0, 0)
    log.close()


# -- a crash at every step of the swap -----------------------------------------------


class Crash(BaseException):
    """A power cut: nothing after it runs (BaseException: no handler catches it)."""


def _snapshot(log):
    log.flush()
    return read_records(log)


@pytest.mark.parametrize("trusted", [False, True])
def test_a_crash_at_any_step_of_the_swap_leaves_old_or_new(tmp_path, monkeypatch, trusted):
    source = tmp_path / "source"
    log = Log.open(source / "t-0", compact_config(**{"segment.bytes": "4096"}), now_ms=0)
    fill(log, updates(400, 9), epoch=1)
    fill(log, updates(40, 9), epoch=4)
    log.close()
    # A run without a crash: the new records, and how many renames its swaps make.
    reference = tmp_path / "reference"
    shutil.copytree(source, reference)
    log = Log.open(reference / "t-0", compact_config(**{"segment.bytes": "4096"}), now_ms=0)
    old = read_records(log)
    entries = log.leader_epoch_cache.entries()
    renames = []
    real_rename = os.rename
    real_swap = cleaner_module.swap_in
    swapping = [False]

    def counting_rename(a, b):
        if swapping[0]:
            renames.append((a, b))
        return real_rename(a, b)

    def swap(*args):
        swapping[0] = True
        try:
            return real_swap(*args)
        finally:
            swapping[0] = False

    monkeypatch.setattr(os, "rename", counting_rename)
    monkeypatch.setattr(cleaner_module, "swap_in", swap)
    [result] = clean(log)
    assert result.segments_after >= 2
    new = read_records(log)
    assert new != old
    groups = [(s.base_offset, s.next_offset) for s in log.segments()
              if s.base_offset < result.clean_end_offset]
    log.close()
    steps = len(renames)
    assert steps >= 6 * result.segments_after
    for crash_at in range(steps + 1):
        work = tmp_path / f"crash-{crash_at}"
        shutil.copytree(source, work)
        log = Log.open(work / "t-0", compact_config(**{"segment.bytes": "4096"}), now_ms=0)
        count = [0]

        def crashing_rename(a, b, count=count, crash_at=crash_at):
            if swapping[0]:
                if count[0] == crash_at:
                    raise Crash()
                count[0] += 1
            return real_rename(a, b)

        monkeypatch.setattr(os, "rename", crashing_rename)
        try:
            clean(log)
        except Crash:
            pass
        monkeypatch.setattr(os, "rename", real_rename)
        close_segments_quietly(log.segments())  # no flush, no clean shutdown: a crash
        recovered = Log.open(work / "t-0", compact_config(**{"segment.bytes": "4096"}),
                             now_ms=0, recovery_point=(1 << 62) if trusted else 0)
        records = read_records(recovered)
        # Group by group the log is the old one or the cleaned one, the cleaned groups
        # first (they are swapped in oldest first): never a mix, never a loss.
        states = []
        for start, end in groups:
            got = [r for r in records if start <= r[0] < end]
            was = [r for r in old if start <= r[0] < end]
            now = [r for r in new if start <= r[0] < end]
            assert got in (was, now), (crash_at, start, end)
            if was != now:
                states.append("new" if got == now else "old")
        assert states == sorted(states), (crash_at, states)  # "new"... then "old"...
        assert [r for r in records if r[0] >= result.clean_end_offset] == [
            r for r in old if r[0] >= result.clean_end_offset]
        assert recovered.leader_epoch_cache.entries() == entries
        leftovers = [n for n in os.listdir(work / "t-0")
                     if n.endswith((".cleaned", ".swap", ".deleted"))]
        assert leftovers == [], (crash_at, leftovers)
        recovered.close()


def test_a_read_goes_on_past_segments_holding_only_emptied_batches(tmp_path):
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(60, 1) + updates(60, 2)[1::2] + [(b"k9", b"last")])
    clean(log)
    emptied = log.segments()[0].log_path.read_bytes()
    assert [h.record_count for _, h in iter_batches(emptied)] == [0]
    first = log.read(0, 1 << 20)
    headers = [h for _, h in iter_batches(first.records)]
    assert any(h.record_count for h in headers)  # never an answer of empty batches alone
    assert read_records(log)[0][1] == b"k0"
    log.close()


def test_a_full_disk_while_writing_leaves_the_log_as_it_was(tmp_path, monkeypatch, caplog):
    import errno
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(200, 4))
    before = read_records(log)
    real_write = os.write

    def full_disk(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".cleaned"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    assert clean(log) == []  # logged, the next pass retries
    monkeypatch.setattr(os, "write", real_write)
    assert "No space left" in caplog.text
    assert read_records(log) == before and not log.is_offline
    assert not [n for n in os.listdir(log.dir) if n.endswith((".cleaned", ".swap"))]
    assert clean(log)  # the disk has room again
    log.close()


def test_a_failed_rename_in_the_swap_takes_the_log_offline_and_recovery_finishes_it(
        tmp_path, monkeypatch):
    import errno
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    fill(log, updates(200, 4))
    before = read_records(log)
    real_rename = os.rename

    def failing(a, b):
        if str(a).endswith(".log.swap"):  # the commit point passed: .swap -> .log fails
            raise OSError(errno.EIO, "I/O error")
        return real_rename(a, b)

    monkeypatch.setattr(os, "rename", failing)
    assert clean(log) == []
    monkeypatch.setattr(os, "rename", real_rename)
    assert log.is_offline  # memory and disk may disagree: the next open recovers
    close_segments_quietly(log.segments())
    recovered = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    after = read_records(recovered)
    assert set(after) <= set(before) and after != before  # the first group swapped in
    latest = {k: (o, v) for o, k, v in before}
    assert all(latest[k] in [(o, v) for o, kk, v in after if kk == k] for k in latest)
    recovered.close()


@pytest.mark.parametrize("clean_shutdown", [False, True])
def test_a_compacted_log_opened_before_its_configs_keeps_its_gaps(tmp_path, clean_shutdown):
    """A broker opens its logs with its default config (cleanup.policy=delete) before
    LeaderAndIsr brings the topic's: the .compacted marker keeps recovery from taking the
    cleaner's gaps for damage and cutting the log there."""
    log = Log.open(tmp_path / "t-0", compact_config(), now_ms=0)
    assert (log.dir / ".compacted").exists()
    fill(log, updates(200, 3))
    clean(log)
    after = read_records(log)
    log.close()
    reopened = Log.open(tmp_path / "t-0", LogConfig(), now_ms=0, recovery_point=0,
                        had_clean_shutdown=clean_shutdown)
    assert reopened.config.compact and read_records(reopened) == after
    reopened.close()


def test_a_log_becoming_compacted_is_marked_before_any_gap(tmp_path):
    log = Log.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    assert not (log.dir / ".compacted").exists()
    log.update_config(compact_config())
    assert (log.dir / ".compacted").exists()
    log.close()
