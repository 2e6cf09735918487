"""Offset and time indexes: lookups, Kafka's byte format, incremental flush, sanity checks,
and a segment healing a stale or damaged index from its .log."""

import struct

import pytest

from tidewater.broker.storage.index import OffsetIndex, TimeIndex
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.segment import LogSegment
from tidewater.proto.errors import CorruptFileError
from tidewater.proto.records import encode_batch


def test_offset_index_lookup_finds_largest_entry_at_or_below(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 100, 10)
    assert index.lookup(150) == (100, 0)
    for offset, position in [(105, 40), (110, 90), (120, 200)]:
        index.append(offset, position)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(104) == (100, 0)
    assert index.lookup(105) == (105, 40)
    assert index.lookup(119) == (110, 90)
    assert index.lookup(10**9) == (120, 200)
    with pytest.raises(AssertionError):
        index.append(120, 300)


def test_offset_index_file_is_kafka_big_endian_and_flush_is_incremental(tmp_path):
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100, 10)
    index.append(105, 40)
    index.append(110, 90)
    index.flush()
    assert path.read_bytes() == struct.pack(">iiii", 5, 40, 10, 90)
    index.append(120, 200)
    index.truncate_to(110)  # drops 110 and 120
    index.append(111, 95)
    index.flush()
    assert path.read_bytes() == struct.pack(">iiii", 5, 40, 11, 95)
    loaded = OffsetIndex(path, 100, 10)
    assert loaded.load(segment_size=1000)
    assert loaded.lookup(115) == (111, 95)
    assert not OffsetIndex(tmp_path / "missing.index", 0, 10).load(10)


@pytest.mark.parametrize("data, why", [
    (struct.pack(">ii", 5, 40) + b"\x00", "multiple"),
    (struct.pack(">iiii", 5, 40, 5, 90), "increasing"),
    (struct.pack(">iiii", 5, 40, 6, 30), "increasing"),
    (struct.pack(">ii", 5, 4000), "beyond"),
])
def test_offset_index_load_rejects_insane_files(tmp_path, data, why):
    path = tmp_path / "x.index"
    path.write_bytes(data)
    with pytest.raises(CorruptFileError, match=why):
        OffsetIndex(path, 0, 10).load(segment_size=1000)


def test_time_index_appends_only_rising_timestamps_and_looks_up(tmp_path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, 10, 10)
    assert index.lookup(5) == (-1, 10)
    index.maybe_append(1000, 12)
    index.maybe_append(1000, 14)  # not rising: ignored
    index.maybe_append(2000, 20)
    assert len(index) == 2
    assert index.lookup(1500) == (1000, 12)
    assert index.lookup(2000) == (2000, 20)
    index.flush()
    assert path.read_bytes() == struct.pack(">qiqi", 1000, 2, 2000, 10)
    index.truncate_to(20)
    index.flush()
    assert path.read_bytes() == struct.pack(">qi", 1000, 2)
    loaded = TimeIndex(path, 10, 10)
    assert loaded.load(next_offset=30)
    assert loaded.last_entry == (1000, 12)


def test_time_index_load_rejects_insane_files(tmp_path):
    path = tmp_path / "x.timeindex"
    path.write_bytes(struct.pack(">qiqi", 2000, 1, 1000, 2))
    with pytest.raises(CorruptFileError):
        TimeIndex(path, 0, 10).load(next_offset=10)
    path.write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptFileError):
        TimeIndex(path, 0, 10).load(next_offset=10)


def _segment_with_batches(tmp_path, count=40):
    config = LogConfig(index_interval_bytes=64)
    segment = LogSegment.create(tmp_path, 0, config)
    offset = 0
    for i in range(count):
        data = bytearray(encode_batch([(None, b"v%03d" % i)] * 2, base_offset=offset,
                                      base_timestamp_ms=1000 + i))
        segment.append(data, [(0, len(data), offset + 1, 1000 + i)], offset + 2, now_ms=0)
        offset += 2
    return segment, config


def test_segment_index_entries_point_at_batch_starts(tmp_path):
    segment, _config = _segment_with_batches(tmp_path)
    assert len(segment.index) > 10
    for i in range(len(segment.index)):
        last_offset, position = segment.index.entry(i)
        batch = segment.read_batch_at(position)
        base_offset, = struct.unpack_from(">q", batch, 0)
        assert base_offset + 1 == last_offset  # entry pairs a batch's last offset with its start


def test_segment_read_heals_a_damaged_index(tmp_path, caplog):
    segment, config = _segment_with_batches(tmp_path)
    segment.flush()
    expected = [segment.read(o, 10_000, None, True)[1] for o in range(80)]
    path = segment.index.path
    data = bytearray(path.read_bytes())
    # Plausible but wrong: shift every position by one batch, keeping the file sane.
    entries = list(struct.iter_unpack(">ii", data))
    shifted = b"".join(struct.pack(">ii", o, p + 79) for o, p in entries[:-1])
    path.write_bytes(shifted)
    segment.close()
    reopened = LogSegment.open_existing(tmp_path, 0, config)
    # Trusted load checks only the tail: the damage is found on the first read through it.
    reopened.load_trusted()
    got = [reopened.read(o, 10_000, None, True)[1] for o in range(80)]
    assert got == expected
    assert "does not match the log" in caplog.text


def test_segment_load_trusted_refuses_missing_or_insane_index(tmp_path):
    segment, config = _segment_with_batches(tmp_path)
    segment.flush()
    segment.close()
    (tmp_path / "00000000000000000000.index").write_bytes(b"\x01\x02\x03")
    reopened = LogSegment.open_existing(tmp_path, 0, config)
    assert not reopened.load_trusted()
    scan = reopened.scan(0)
    assert scan.error is None and scan.next_offset == 80
    reopened.flush()
    again = LogSegment.open_existing(tmp_path, 0, config)
    assert again.load_trusted()
    assert again.next_offset == 80 and again.max_timestamp == 1039


def entries_on_disk(path):
    return list(struct.iter_unpack(">ii", path.read_bytes()))


def test_an_unlocked_write_overtaken_by_a_locked_flush_is_not_written(tmp_path):
    # snapshot (lock held) -> write (no lock) -> commit (lock held): a locked flush in
    # between wrote newer entries, which the older snapshot must not overwrite.
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 10)
    index.append(1, 10)
    job = index.snapshot()
    index.append(2, 20)
    index.flush()
    index.write(job)
    index.commit(job)
    assert entries_on_disk(path) == [(1, 10), (2, 20)]
    assert not index.is_dirty and not index.needs_sync


def test_a_locked_flush_after_an_unlocked_write_leaves_the_file_equal_to_memory(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 10)
    for offset in (1, 2, 3):
        index.append(offset, offset * 10)
    job = index.snapshot()
    index.write(job)  # not committed yet: the locked flush below does not know of it
    index.truncate_to(2)
    index.append(2, 25)
    index.flush()
    index.commit(job)  # written from entries cut meanwhile: the file is rewritten next
    assert entries_on_disk(path) == [(1, 10), (2, 25)]
    index.flush()
    assert entries_on_disk(path) == [(1, 10), (2, 25)]
    assert not index.is_dirty and not index.needs_sync


def test_a_truncation_before_an_unlocked_write_skips_it_and_marks_a_rewrite(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 10)
    index.append(1, 10)
    index.flush()
    index.append(2, 20)
    index.append(3, 30)
    job = index.snapshot()
    index.truncate_to(2)
    index.write(job)  # overtaken: entries 2 and 3 are gone from memory
    index.commit(job)
    assert entries_on_disk(path) == [(1, 10)]
    assert not index.is_dirty and not index.needs_sync
    index.append(2, 22)
    job = index.snapshot()
    index.write(job)
    index.truncate_to(2)  # after the write, before the commit
    index.commit(job)
    assert index.is_dirty
    index.flush()
    assert entries_on_disk(path) == [(1, 10)]


def test_a_retired_index_is_never_written(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, 10)
    index.append(1, 10)
    job = index.snapshot()
    index.retire()  # the segment closed (deleted): the path may belong to another file now
    index.write(job)
    assert not path.exists()


def test_a_segment_flush_writes_and_fsyncs_without_the_owner_and_records_it(tmp_path):
    config = LogConfig(index_interval_bytes=0)
    segment = LogSegment.create(tmp_path, 0, config)
    data = b"".join(encode_batch([(None, b"v")], base_offset=i, base_timestamp_ms=1000 + i)
                    for i in range(3))
    size = len(data) // 3
    segment.append(data, [(i * size, size, i, 1000 + i) for i in range(3)], 3, now_ms=0)
    assert segment.needs_flush
    job = segment.begin_flush()
    job.sync()
    segment.end_flush(job)
    assert not segment.needs_flush
    assert segment.flushed_size_bytes == segment.size_bytes
    assert entries_on_disk(segment.index.path) == [(1, size), (2, 2 * size)]
    segment.close()
