"""Crash recovery: cut and corrupt segment, index and epoch-checkpoint files at random
positions; recovery must keep exactly the valid prefix and lose nothing before it.

One pristine log (several segments, several leader epochs) is built per module and
copied for every example.
"""

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.epoch_cache import read_epoch_checkpoint
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import encode_batch

CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=150)
EPOCH_FIELD = range(12, 16)  # partitionLeaderEpoch lies outside the CRC (Kafka's design)
EXAMPLES = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True, scope="module")
def _no_fsync():
    # Durability is not under test here (the files are cut by hand); fsync only costs time.
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None
    yield
    os.fsync, os.fdatasync = real_fsync, real_fdatasync


class Batch:
    def __init__(self, segment, position, data, header):
        self.segment, self.position, self.data, self.header = segment, position, data, header

    @property
    def end(self):
        return self.position + len(self.data)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(directory, batches in order, segment bases, epoch cache entries)."""
    directory = tmp_path_factory.mktemp("pristine") / "t-0"
    log = Log.open(directory, CONFIG, now_ms=0)
    rng = random.Random(20261121)
    for i in range(70):
        records = [(None, b"%03d-" % i + bytes(rng.randint(0, 80)))] * rng.randint(1, 4)
        log.append_as_leader(encode_batch(records, base_timestamp_ms=1000 + i), i // 15, now_ms=0)
    entries = log.leader_epoch_cache.entries()
    log.close()
    bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
    batches = []
    for base in bases:
        data = (directory / f"{base:020d}.log").read_bytes()
        for position, header in iter_batches(data):
            batches.append(Batch(base, position, data[position:position + header.size], header))
    assert len(bases) >= 5 and len(entries) == 5
    return directory, batches, bases, entries


def copy_of(pristine_dir: Path, into: str) -> Path:
    target = Path(into) / pristine_dir.name
    shutil.copytree(pristine_dir, target)
    return target


def epoch_runs(batches):
    entries = []
    for b in batches:
        if not entries or entries[-1][0] != b.header.partition_leader_epoch:
            entries.append((b.header.partition_leader_epoch, b.header.base_offset))
    return entries


def assert_log_holds_exactly(log, expected, first_base=0):
    got, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        for position, header in iter_batches(result.records):
            got.append(result.records[position:position + header.size])
        offset = result.next_offset
    assert got == [b.data for b in expected]
    end = expected[-1].header.next_offset if expected else first_base
    assert log.log_end_offset == end
    assert log.leader_epoch_cache.entries() == epoch_runs(expected)


def reopen(directory, *, clean=False, recovery_point=0):
    return Log.open(directory, CONFIG, now_ms=0, recovery_point=recovery_point,
                    had_clean_shutdown=clean)


@EXAMPLES
@given(data=st.data())
def test_cut_segment_keeps_exactly_the_whole_batches_before_the_cut(pristine, data, caplog):
    pristine_dir, batches, bases, _entries = pristine
    segment = data.draw(st.sampled_from(bases), label="segment")
    path_name = f"{segment:020d}.log"
    size = (pristine_dir / path_name).stat().st_size
    cut = data.draw(st.integers(0, size - 1), label="cut")
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        with open(directory / path_name, "r+b") as f:
            f.truncate(cut)
        log = reopen(directory)
        expected = [b for b in batches if b.segment < segment or (b.segment == segment
                                                                  and b.end <= cut)]
        assert_log_holds_exactly(log, expected, first_base=0)
        assert all(int(p.name[:20]) <= segment for p in directory.glob("*.log"))
        if expected and expected[-1].end != cut and expected[-1].segment == segment:
            assert f"cut {directory / path_name} at position {expected[-1].end}" in caplog.text
        # Recovered means stable: a second crash-restart changes nothing; appends go on.
        log.close()
        log = reopen(directory)
        assert_log_holds_exactly(log, expected)
        info = log.append_as_leader(encode_batch([(None, b"after")]), 9, now_ms=0)
        assert info.first_offset == (expected[-1].header.next_offset if expected else 0)
        log.close()


@EXAMPLES
@given(data=st.data())
def test_corrupt_byte_cuts_at_the_damaged_batch(pristine, data, caplog):
    pristine_dir, batches, bases, _entries = pristine
    victim = data.draw(st.sampled_from(batches), label="batch")
    offset_in_batch = data.draw(st.integers(0, len(victim.data) - 1), label="byte")
    assume(offset_in_batch not in EPOCH_FIELD)
    flip = data.draw(st.integers(1, 255), label="xor")
    path_name = f"{victim.segment:020d}.log"
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        with open(directory / path_name, "r+b") as f:
            f.seek(victim.position + offset_in_batch)
            byte = f.read(1)[0]
            f.seek(victim.position + offset_in_batch)
            f.write(bytes([byte ^ flip]))
        log = reopen(directory)
        expected = batches[:batches.index(victim)]
        assert_log_holds_exactly(log, expected)
        assert f"cut {directory / path_name} at position {victim.position}" in caplog.text
        assert "bytes removed" in caplog.text
        log.close()


def test_corruption_after_the_recovery_point_is_found(pristine, caplog):
    """Segments below the recovery point are trusted (index + tail check only), the rest
    is re-validated batch by batch."""
    pristine_dir, batches, bases, _entries = pristine
    last_segment = [b for b in batches if b.segment == bases[-2]]
    victim = last_segment[len(last_segment) // 2]
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        with open(directory / f"{victim.segment:020d}.log", "r+b") as f:
            f.seek(victim.position + 40)
            f.write(b"\x00\x01\x02")
        log = reopen(directory, recovery_point=bases[-2])
        assert_log_holds_exactly(log, batches[:batches.index(victim)])
        assert "rebuilding" not in caplog.text  # trusted segments kept their index files
        log.close()


def test_crash_with_flush_per_append_trusts_data_and_scans_the_unwritten_index_tail(tmp_path):
    """flush.messages=1 fsyncs only the .log per append (indexes are written on roll and
    close), so after a crash the recovery point is the LEO while index files lag."""
    config = LogConfig(segment_bytes=1500, index_interval_bytes=100, flush_messages=1)
    log = Log.open(tmp_path / "t-0", config, now_ms=0)
    for i in range(40):
        log.append_as_leader(encode_batch([(None, b"%02d" % i * 10)], base_timestamp_ms=i), 0,
                             now_ms=0)
    assert len(log.segments()) > 1
    recovery_point, end = log.recovery_point, log.log_end_offset
    assert recovery_point == end == 40
    active_index = log.active_segment.index.path
    assert log.active_segment.index.is_dirty  # entries in memory, not on disk yet
    for segment in log.segments():
        segment.close()  # crash: nothing more reaches the disk
    reopened = Log.open(tmp_path / "t-0", config, now_ms=0, recovery_point=recovery_point)
    assert reopened.log_end_offset == 40
    for offset in range(40):
        data = reopened.read(offset, 1).records
        assert data[:8] == offset.to_bytes(8, "big")
    assert active_index.exists()


def test_clean_shutdown_marker_still_checks_the_tail(pristine, caplog):
    """A clean shutdown means the files are trusted, but the batches after the last
    index entry of each segment are still CRC-checked, and a bad one is cut."""
    pristine_dir, batches, bases, _entries = pristine
    last = [b for b in batches if b.segment == bases[-1]]
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        with open(directory / f"{bases[-1]:020d}.log", "r+b") as f:
            f.seek(last[-1].position + 30)
            f.write(b"\xde\xad")
        log = reopen(directory, clean=True)
        assert_log_holds_exactly(log, batches[:-1])
        assert "tail check" in caplog.text and "CRC mismatch" in caplog.text
        log.close()


INDEX_DAMAGE = st.sampled_from(["delete", "cut", "flip", "garbage"])


@pytest.mark.parametrize("flip", [(0, 0x80), (7, 0x01)], ids=["sign-bit", "low-bit"])
def test_time_index_entry_damaged_but_still_sorted_is_caught(pristine, flip):
    """A flipped bit in the first entry's timestamp of segment 0's time index leaves the
    entries sorted (found by the property test below, in CI): the lookup for the first
    timestamp started at that entry's batch and missed the records before it. The
    entry is now checked against the batch it names, and the indexes rebuilt."""
    pristine_dir, batches, _bases, _entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        path = directory / f"{0:020d}.timeindex"
        content = bytearray(path.read_bytes())
        at, mask = flip
        content[at] ^= mask
        path.write_bytes(content)
        log = reopen(directory, clean=True)
        for i in range(0, 70, 7):
            b = batches[i]
            assert log.fetch_offset_by_timestamp(1000 + i)[:2] == (b.header.base_offset, 1000 + i)


@EXAMPLES
@given(data=st.data(), damage=INDEX_DAMAGE, suffix=st.sampled_from([".index", ".timeindex"]),
       clean=st.booleans())
def test_damaged_index_files_lose_nothing(pristine, data, damage, suffix, clean):
    pristine_dir, batches, bases, _entries = pristine
    segment = data.draw(st.sampled_from(bases), label="segment")
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        path = directory / f"{segment:020d}{suffix}"
        content = bytearray(path.read_bytes())
        if damage == "delete":
            path.unlink()
        elif damage == "cut":
            path.write_bytes(content[:data.draw(st.integers(0, max(0, len(content) - 1)))])
        elif damage == "flip" and content:
            at = data.draw(st.integers(0, len(content) - 1))
            content[at] ^= data.draw(st.integers(1, 255))
            path.write_bytes(content)
        else:
            path.write_bytes(data.draw(st.binary(min_size=1, max_size=64)))
        log = reopen(directory, clean=clean)
        assert_log_holds_exactly(log, batches)
        # Every offset is found through the (possibly healed) index.
        for b in batches[::3]:
            for offset in (b.header.base_offset, b.header.last_offset):
                assert log.read(offset, 1).records == b.data
        for i in range(0, 70, 7):  # batch i's records all carry timestamp 1000 + i
            b = batches[i]
            assert log.fetch_offset_by_timestamp(1000 + i)[:2] == (b.header.base_offset, 1000 + i)
        log.close()


CHECKPOINT_DAMAGE = st.sampled_from(["delete", "empty", "cut", "flip", "garbage"])


@EXAMPLES
@given(data=st.data(), damage=CHECKPOINT_DAMAGE, clean=st.booleans())
def test_damaged_epoch_checkpoint_is_rebuilt_from_batches(pristine, data, damage, clean, caplog):
    pristine_dir, batches, _bases, entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        path = directory / "leader-epoch-checkpoint"
        content = bytearray(path.read_bytes())
        if damage == "delete":
            path.unlink()
        elif damage == "empty":
            path.write_bytes(b"")
        elif damage == "cut":
            path.write_bytes(content[:data.draw(st.integers(0, len(content) - 1))])
        elif damage == "flip":
            at = data.draw(st.integers(0, len(content) - 1))
            content[at] ^= data.draw(st.integers(1, 255))
            path.write_bytes(content)
        else:
            path.write_bytes(data.draw(st.binary(max_size=40)))
        log = reopen(directory, clean=clean)
        assert log.leader_epoch_cache.entries() == entries == epoch_runs(batches)
        assert_log_holds_exactly(log, batches)
        log.close()
        # The rebuilt file is valid again.
        assert Log.open(directory, CONFIG, now_ms=0,
                        had_clean_shutdown=True).leader_epoch_cache.entries() == entries


@pytest.mark.parametrize("damage", [
    "last start past the end",  # a flipped digit (156 -> 356): opening dropped that epoch
    "an entry missing",  # the batches before the next entry are of the missing epoch
])
def test_a_checkpoint_that_parses_but_lost_an_epoch_is_rebuilt(pristine, damage):
    pristine_dir, batches, _bases, entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        log_end_offset = batches[-1].header.last_offset + 1
        kept = list(entries)
        if damage == "last start past the end":
            kept[-1] = (kept[-1][0], log_end_offset + 200)
        else:
            del kept[2]
        lines = [f"{epoch} {start}" for epoch, start in kept]
        (directory / "leader-epoch-checkpoint").write_text(f"0\n{len(lines)}\n" + "".join(
            f"{line}\n" for line in lines))
        log = reopen(directory)
        assert log.leader_epoch_cache.entries() == entries
        log.close()


def test_stray_files_of_interrupted_operations_are_removed(pristine):
    pristine_dir, batches, bases, _entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        (directory / "leader-epoch-checkpoint.tmp").write_bytes(b"0\n")
        (directory / f"{bases[0]:020d}.log.deleted").write_bytes(b"x")
        (directory / "00000000000000099999.index").write_bytes(b"")  # no .log beside it
        log = reopen(directory)
        assert_log_holds_exactly(log, batches)
        names = {p.name for p in directory.iterdir()}
        assert "leader-epoch-checkpoint.tmp" not in names
        assert f"{bases[0]:020d}.log.deleted" not in names
        assert "00000000000000099999.index" not in names
        log.close()


def test_gap_between_segments_cuts_the_later_ones(pristine, caplog):
    pristine_dir, batches, bases, _entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        for suffix in (".log", ".index", ".timeindex"):
            (directory / f"{bases[2]:020d}{suffix}").unlink()
        log = reopen(directory, clean=True)
        assert_log_holds_exactly(log, [b for b in batches if b.segment < bases[2]])
        assert "does not follow" in caplog.text or "but the log before it ends" in caplog.text
        log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_epoch_at_the_log_end_is_dropped_at_opening_and_leaves_the_file_before_an_append(
        pristine, clean):
    """An epoch with no record yet (a leader's, nothing written in it) is dropped when the
    log opens, in memory only: the file loses it before the log grows past it."""
    pristine_dir, _batches, _bases, entries = pristine
    with tempfile.TemporaryDirectory() as tmp:
        directory = copy_of(pristine_dir, tmp)
        path = directory / "leader-epoch-checkpoint"
        log = reopen(directory, clean=True)
        end, latest_epoch = log.log_end_offset, entries[-1][0]
        log.leader_epoch_cache.assign(latest_epoch + 3, end)
        log.close()
        with_empty_epoch = path.read_bytes()
        log = reopen(directory, clean=clean)
        assert log.leader_epoch_cache.entries() == entries
        assert path.read_bytes() == with_empty_epoch  # not rewritten at opening
        # The same epoch again at the same end (the usual restart): still no rewrite.
        log.leader_epoch_cache.assign(latest_epoch + 3, end)
        assert path.read_bytes() == with_empty_epoch
        log.close()
        log = reopen(directory, clean=clean)
        # An append in the older epoch: the file must not keep the empty epoch at `end`.
        log.append_as_leader(encode_batch([(None, b"x")], base_timestamp_ms=5000), latest_epoch,
                             now_ms=0)
        log.close()
        assert read_epoch_checkpoint(path) == entries
        assert Log.open(directory, CONFIG, now_ms=0, had_clean_shutdown=True
                        ).leader_epoch_cache.entries() == entries
