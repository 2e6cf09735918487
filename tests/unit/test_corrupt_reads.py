"""Bit rot under a running log: one byte of a segment file flipped after it was written.

Reads (consumer and follower fetches) must return exactly the whole batches before
the damaged one and name it (path, position, the offset it must start at), raise
CorruptBatchError when it is the first batch they would return, and never return
a damaged byte. ``Log.truncate_to`` below the damaged batch (a replica repairing
itself) must leave the log, its indexes, epoch cache and recovery point right.

One pristine log (several segments and leader epochs, sparse indexes) is built
per module; every example works on a copy, opened first and damaged afterwards
(as rot happens under a running broker: reads see it through the page cache).
"""

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.corruption import (
    CONSUMER_READ,
    FOLLOWER_READ,
    CorruptBatch,
    CorruptBatchError,
    CorruptionReporter,
)
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.reporting_read import read_reporting
from tidewater.proto.batch import iter_batches, set_base_offset_and_epoch
from tidewater.proto.errors import CorruptRecordError
from tidewater.proto.records import decode_records, encode_batch

CONFIG = LogConfig(segment_bytes=3000, index_interval_bytes=200)
EPOCH_FIELD = range(12, 16)  # partitionLeaderEpoch: outside the CRC (Kafka's design), unseen
EXAMPLES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True, scope="module")
def _no_fsync():
    # Durability is not under test here; fsync only costs time.
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None
    yield
    os.fsync, os.fdatasync = real_fsync, real_fdatasync


class Batch:
    def __init__(self, segment: int, position: int, data: bytes, header):
        self.segment, self.position, self.data, self.header = segment, position, data, header

    @property
    def end(self) -> int:
        return self.position + len(self.data)

    def __repr__(self) -> str:
        return (f"Batch(segment={self.segment}, position={self.position}, "
                f"offsets={self.header.base_offset}..{self.header.last_offset})")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(directory, every batch in order, segment base offsets)."""
    directory = tmp_path_factory.mktemp("pristine") / "t-0"
    log = Log.open(directory, CONFIG, now_ms=0)
    rng = random.Random(20261126)
    for i in range(80):
        # Mostly small batches, some larger than the reads' max_bytes below.
        value_bytes = rng.choice([rng.randint(0, 60), rng.randint(300, 700)])
        records = [(None, b"%03d-" % i + bytes(rng.randint(0, 255) for _ in range(value_bytes)))
                   ] * rng.randint(1, 3)
        log.append_as_leader(encode_batch(records, base_timestamp_ms=1000 + i), i // 20, now_ms=i)
    log.close()
    bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
    batches = []
    for base in bases:
        data = (directory / f"{base:020d}.log").read_bytes()
        for position, header in iter_batches(data):
            batches.append(Batch(base, position, data[position:position + header.size], header))
    assert len(bases) >= 8
    assert any(len(b.data) > 600 for b in batches) and any(len(b.data) < 150 for b in batches)
    return directory, batches, bases


def open_copy(pristine_dir: Path, tmp: str) -> Log:
    directory = Path(tmp) / pristine_dir.name
    shutil.copytree(pristine_dir, directory)
    return Log.open(directory, CONFIG, now_ms=0, had_clean_shutdown=True)


def flip_byte(log: Log, victim: Batch, offset_in_batch: int, mask: int) -> None:
    """XOR one byte of the open log's file, through another descriptor (the page cache
    the log reads from sees it, as it would see rot read back from the disk)."""
    fd = os.open(log.dir / f"{victim.segment:020d}.log", os.O_RDWR)
    try:
        at = victim.position + offset_in_batch
        byte = os.pread(fd, 1, at)[0]
        os.pwrite(fd, bytes([byte ^ mask]), at)
    finally:
        os.close(fd)


def draw_damage(data, batches):
    victim = data.draw(st.sampled_from(batches), label="victim")
    offset_in_batch = data.draw(st.integers(0, len(victim.data) - 1), label="byte")
    assume(offset_in_batch not in EPOCH_FIELD)
    mask = data.draw(st.integers(1, 255), label="xor")
    return victim, offset_in_batch, mask


def split(records: bytes) -> list[bytes]:
    return [records[p:p + h.size] for p, h in iter_batches(records)]


def assert_names(found: CorruptBatch, log: Log, victim: Batch) -> None:
    assert found.path == str(log.dir / f"{victim.segment:020d}.log")
    assert found.position == victim.position
    assert found.base_offset == victim.header.base_offset


@EXAMPLES
@given(data=st.data())
def test_sequential_reads_return_exactly_the_batches_before_the_damaged_one(pristine, data):
    pristine_dir, batches, _bases = pristine
    victim, offset_in_batch, mask = draw_damage(data, batches)
    read_sizes = data.draw(st.lists(st.integers(1, 2500), min_size=1, max_size=8), label="sizes")
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        flip_byte(log, victim, offset_in_batch, mask)
        got: list[bytes] = []
        offset, found, i = 0, None, 0
        while found is None and offset < log.log_end_offset:
            try:
                result = log.read(offset, read_sizes[i % len(read_sizes)])
            except CorruptBatchError as e:
                found = e.batch
                assert e.base_offset == offset  # where the reader stands
                break
            got += split(result.records)
            found = result.corrupt
            if found is not None:
                assert result.next_offset == found.base_offset
            assert result.next_offset > offset or found is not None
            offset = result.next_offset
            i += 1
        assert got == [b.data for b in batches[:batches.index(victim)]]
        assert found is not None, "the damaged batch was read without complaint"
        assert_names(found, log, victim)
        # A reader retrying at the damaged batch keeps getting the typed error, no bytes.
        with pytest.raises(CorruptBatchError) as raised:
            log.read(victim.header.base_offset, 1 << 20)
        assert_names(raised.value.batch, log, victim)
        log.close()


@EXAMPLES
@given(data=st.data())
def test_reads_anywhere_never_return_damaged_bytes_nor_blame_a_sound_batch(pristine, data):
    """Reads that land through the index (not where a previous read ended): whatever
    they return is a run of pristine batches, and a batch they blame is the victim."""
    pristine_dir, batches, _bases = pristine
    victim, offset_in_batch, mask = draw_damage(data, batches)
    end_offset = batches[-1].header.next_offset
    reads = data.draw(st.lists(st.tuples(st.integers(0, end_offset - 1), st.integers(1, 2500)),
                               min_size=1, max_size=6), label="reads")
    pristine_runs = b"".join(b.data for b in batches)
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        flip_byte(log, victim, offset_in_batch, mask)
        for offset, max_bytes in reads:
            try:
                result = log.read(offset, max_bytes)
            except CorruptBatchError as e:
                assert_names(e.batch, log, victim)
                continue
            returned = split(result.records)
            assert returned, "min_one_batch: a read below the end returns a batch"
            assert victim.data not in returned
            # A run of consecutive pristine batches, the first holding ``offset``.
            assert result.records in pristine_runs
            first = next(b for b in batches if b.data == returned[0])
            assert first.header.base_offset <= offset <= first.header.last_offset
            if result.corrupt is not None:
                assert_names(result.corrupt, log, victim)
        log.close()


def test_the_epoch_field_is_not_covered_by_the_crc(pristine):
    """As in Kafka: partitionLeaderEpoch (like baseOffset) lies outside the CRC, so a
    flip there goes unseen by the CRC (the tests above leave those 4 bytes alone)."""
    pristine_dir, batches, _bases = pristine
    victim = batches[len(batches) // 2]
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        flip_byte(log, victim, 13, 0x40)
        result = log.read(victim.header.base_offset, 1)
        assert result.corrupt is None and len(result.records) == len(victim.data)
        log.close()


@pytest.mark.parametrize("field,at,breaks_the_walk", [
    ("baseOffset", 7, True), ("batchLength", 11, True), ("magic", 16, False), ("crc", 18, False),
    ("lastOffsetDelta", 26, True), ("records", -1, False)])
def test_each_header_field_damaged_in_an_indexed_batch_is_named_not_the_next(pristine, field, at,
                                                                           breaks_the_walk):
    """The batch an index entry points to: a read from the next batch walks the headers
    from that entry. Damage that breaks the walk (offsets, length) names the damaged
    batch, not the next one; other damage does not concern that read. Any read that
    covers the damaged batch names it."""
    pristine_dir, batches, _bases = pristine
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        victim, later = _indexed_batch_with_one_after(log, batches)
        flip_byte(log, victim, at % len(victim.data), 0x10)
        if breaks_the_walk:
            with pytest.raises(CorruptBatchError) as raised:
                log.read(later.header.base_offset, 1 << 20)
            assert_names(raised.value.batch, log, victim)
        else:
            result = log.read(later.header.base_offset, 1 << 20)
            assert split(result.records)[0] == later.data and result.corrupt is None
        before = batches[batches.index(victim) - 1]
        result = log.read(before.header.base_offset, 1 << 20)
        assert split(result.records) == [before.data]
        assert_names(result.corrupt, log, victim)
        for offset in (victim.header.base_offset, victim.header.last_offset):
            with pytest.raises(CorruptBatchError) as raised:
                log.read(offset, 1 << 20)
            assert_names(raised.value.batch, log, victim)
        log.close()


def _indexed_batch_with_one_after(log: Log, batches: list[Batch]) -> tuple[Batch, Batch]:
    """A batch an offset-index entry points to, and a later batch of its segment."""
    for segment in log.segments()[:-1]:
        segment.ensure_indexes()
        for i in range(len(segment.index)):
            entry_offset, entry_position = segment.index.entry(i)
            victim = next(b for b in batches
                          if b.segment == segment.base_offset and b.position == entry_position)
            assert victim.header.last_offset == entry_offset
            later = batches[batches.index(victim) + 1]
            if later.segment == victim.segment:
                return victim, later
    raise AssertionError("no indexed batch with a batch after it in its segment")


@EXAMPLES
@given(data=st.data())
def test_truncating_below_the_damaged_batch_repairs_the_replica(pristine, data):
    """A follower's repair: truncate to the damaged batch's base offset (below what was
    flushed: the recovery point and the HW are above it), fetch the rest again. The
    log then holds the pristine batches; indexes, epoch cache and recovery point are
    right, also after a restart (clean or not)."""
    pristine_dir, batches, bases = pristine
    victim, offset_in_batch, mask = draw_damage(data, batches)
    clean = data.draw(st.booleans(), label="clean restart")
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        epochs_before = log.leader_epoch_cache.entries()
        assert log.recovery_point == log.log_end_offset
        flip_byte(log, victim, offset_in_batch, mask)
        cut = victim.header.base_offset
        log.truncate_to(cut)
        assert log.log_end_offset == cut
        assert log.recovery_point == cut
        assert log.leader_epoch_cache.entries() == [(e, o) for e, o in epochs_before if o < cut]
        # The segments holding offsets below the cut stay (the first one at least).
        assert [s.base_offset for s in log.segments()] == [b for b in bases if b < cut] or [0]
        for b in batches[batches.index(victim):]:  # the leader's copy, as fetched
            log.append_as_follower(b.data, now_ms=0)
        assert_holds(log, batches, bases)
        log.close()
        reopened = Log.open(log.dir, CONFIG, now_ms=0, had_clean_shutdown=clean,
                            recovery_point=0 if not clean else log.recovery_point)
        assert_holds(reopened, batches, bases)
        reopened.close()


def assert_holds(log: Log, batches: list[Batch], bases: list[int]) -> None:
    """Every batch, read sequentially and found by offset through the indexes."""
    got, offset = [], 0
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        assert result.corrupt is None
        got += split(result.records)
        offset = result.next_offset
    assert got == [b.data for b in batches]
    for b in batches:
        assert log.read(b.header.last_offset, 1).records == b.data
    runs = []
    for b in batches:
        if not runs or runs[-1][0] != b.header.partition_leader_epoch:
            runs.append((b.header.partition_leader_epoch, b.header.base_offset))
    assert log.leader_epoch_cache.entries() == runs
    assert log.log_end_offset == batches[-1].header.next_offset
    for i in range(0, 80, 9):  # batch i's records carry timestamp 1000 + i
        assert log.fetch_offset_by_timestamp(1000 + i)[:2] == (batches[i].header.base_offset,
                                                               1000 + i)


def test_truncate_below_the_recovery_point_into_an_older_segment(tmp_path):
    """truncate_to far below the recovery point: later segments go, the segment holding
    the offset becomes active with its indexes cut, the epoch cache and recovery point
    follow, and appends continue from there."""
    config = LogConfig(segment_bytes=1000, index_interval_bytes=100)
    log = Log.open(tmp_path / "t-0", config, now_ms=0)
    for i in range(60):
        log.append_as_leader(encode_batch([(None, b"%02d" % i * 20)]), i // 10, now_ms=0)
    log.flush()
    assert log.recovery_point == 60 and len(log.segments()) > 4
    target = log.segments()[1]
    cut = target.base_offset + 3
    log.truncate_to(cut)
    assert log.log_end_offset == cut == log.recovery_point
    assert log.segments()[-1] is target and len(log.segments()) == 2
    assert log.leader_epoch_cache.latest_epoch == (cut - 1) // 10
    assert target.index.last_entry[0] < cut
    for i in range(5):
        log.append_as_follower(_batch_at(cut + i, epoch=7, value=b"new%d" % i), now_ms=0)
    assert log.leader_epoch_cache.entries()[-1] == (7, cut)
    values = [r.value for r in decode_records(_read_all(log))]
    assert values == [b"%02d" % i * 20 for i in range(cut)] + [b"new%d" % i for i in range(5)]
    log.close()
    reopened = Log.open(tmp_path / "t-0", config, now_ms=0, recovery_point=0)
    assert [r.value for r in decode_records(_read_all(reopened))] == values
    reopened.close()


def _batch_at(offset: int, *, epoch: int, value: bytes) -> bytes:
    data = bytearray(encode_batch([(None, value)]))
    set_base_offset_and_epoch(data, 0, offset, epoch)
    return bytes(data)


def _read_all(log: Log) -> bytes:
    out, offset = b"", 0
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out += result.records
        offset = result.next_offset
    return out


def test_reporter_logs_and_counts_each_damaged_batch_once(pristine, caplog):
    pristine_dir, batches, _bases = pristine
    victim = batches[len(batches) // 3]
    counted: list[str] = []
    reporter = CorruptionReporter(counted.append)
    with tempfile.TemporaryDirectory() as tmp:
        log = open_copy(pristine_dir, tmp)
        flip_byte(log, victim, 40, 0x01)
        before = victim.header.base_offset - 1
        with caplog.at_level(logging.ERROR):
            result = read_reporting(log, reporter, FOLLOWER_READ, before, 1 << 20)
            assert result.corrupt is not None
            for _ in range(3):  # a consumer retrying at the bad offset
                with pytest.raises(CorruptRecordError):
                    read_reporting(log, reporter, CONSUMER_READ, victim.header.base_offset, 1 << 20)
        log.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and counted == [FOLLOWER_READ]
    message = errors[0].getMessage()
    assert f"{victim.segment:020d}.log at position {victim.position}" in message
    assert f"base offset {victim.header.base_offset}" in message
    assert "found by follower read" in message and "CRC mismatch" in message
    with pytest.raises(ValueError):
        reporter.report(CorruptBatch("p", 0, 0, "x"), "by magic")
