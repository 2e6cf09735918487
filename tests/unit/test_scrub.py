"""The background scrub: the schedule's rate bound and coverage (pure, injected clock),
and the shell over real segment files with one byte flipped at random positions."""

import asyncio
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tidewater.broker.storage.corruption import check_chunk
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.scrub import (
    PASS_PERIOD_MIN_MS,
    LogScrubber,
    ReadChunk,
    ScrubSchedule,
    StartPass,
    Wait,
)
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import encode_batch

CONFIG = LogConfig(segment_bytes=3000, index_interval_bytes=200)
EPOCH_FIELD = range(12, 16)  # outside the CRC: not findable (Kafka's format)
EXAMPLES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- the schedule ------------------------------------------------------------------

class FakeTargets:
    """Targets made of batches of given sizes; checks chunks as the shell would."""

    def __init__(self, batch_sizes: list[list[int]]):
        self.batch_sizes = batch_sizes
        self.starts = [self._starts(sizes) for sizes in batch_sizes]

    @staticmethod
    def _starts(sizes: list[int]) -> list[int]:
        out, at = [], 0
        for size in sizes:
            out.append(at)
            at += size
        return out

    @property
    def sizes(self) -> list[int]:
        return [sum(sizes) for sizes in self.batch_sizes]

    def check(self, read: ReadChunk) -> tuple[int, int]:
        """(verified bytes, need bytes) for a read: whole batches from its position."""
        starts, sizes = self.starts[read.target], self.batch_sizes[read.target]
        i = starts.index(read.position)  # reads always start at a batch
        end, verified = read.position + read.length, 0
        while i < len(sizes) and starts[i] + sizes[i] <= end:
            verified += sizes[i]
            i += 1
        need = sizes[i] if verified == 0 and i < len(sizes) else 0
        return verified, need


@settings(max_examples=300, deadline=None)
@given(batch_sizes=st.lists(st.lists(st.integers(61, 5000), max_size=12), max_size=6),
       rate=st.integers(1, 20_000), chunk=st.integers(100, 4000),
       interval_ms=st.integers(0, 5000),
       steps_ms=st.lists(st.integers(0, 700), min_size=1, max_size=400),
       start_ms=st.integers(-10**9, 10**9))
def test_schedule_bounds_the_rate_and_covers_every_byte_each_pass(batch_sizes, rate, chunk,
                                                                  interval_ms, steps_ms,
                                                                  start_ms):
    targets = FakeTargets(batch_sizes)
    schedule = ScrubSchedule(bytes_per_second=rate, interval_ms=interval_ms, chunk_bytes=chunk,
                             now_ms=start_ms)
    biggest = max([chunk] + [s for sizes in batch_sizes for s in sizes])
    now, granted, passes = start_ms, 0, 0
    covered: list[list[tuple[int, int]]] = []
    pass_ended_ms: int | None = None
    pass_started_ms = start_ms
    for step in steps_ms:
        now += step
        # Act until the schedule says wait, as the shell's loop does.
        for _ in range(1000):
            action = schedule.next_action(now)
            if isinstance(action, Wait):
                assert action.until_ms >= now
                if schedule.passes_done > passes:  # a pass just ended: all bytes seen
                    passes = schedule.passes_done
                    assert [sorted(c) for c in covered] == [
                        [(start, start + size) for start, size in zip(starts, sizes, strict=True)]
                        for starts, sizes in zip(targets.starts, batch_sizes, strict=True)]
                    pass_ended_ms = now
                break
            if isinstance(action, StartPass):
                if pass_ended_ms is not None:
                    assert now >= pass_ended_ms + interval_ms
                    assert now >= pass_started_ms + PASS_PERIOD_MIN_MS
                schedule.start_pass(targets.sizes, now)
                pass_started_ms = now
                covered = [[] for _ in batch_sizes]
                continue
            assert action.length <= biggest
            granted += action.length
            # The bound: what accrued since the start, plus one burst (a chunk, or the
            # largest single read, which may be granted on a full bucket and go into debt).
            assert granted * 1000 <= rate * (now - start_ms) + biggest * 1000
            verified, need = targets.check(action)
            if verified:
                starts, sizes = targets.starts[action.target], batch_sizes[action.target]
                i = starts.index(action.position)
                at = action.position
                while at < action.position + verified:
                    covered[action.target].append((at, at + sizes[i]))
                    at += sizes[i]
                    i += 1
            schedule.advance(verified, need)
        else:
            raise AssertionError("the schedule never said wait")
    assert schedule.bytes_granted == granted


def test_schedule_waits_exactly_until_the_bucket_holds_a_chunk():
    schedule = ScrubSchedule(bytes_per_second=1000, interval_ms=60_000, chunk_bytes=500,
                             now_ms=0)
    assert isinstance(schedule.next_action(0), StartPass)
    schedule.start_pass([2000], 0)
    assert schedule.next_action(0) == ReadChunk(0, 0, 500)  # a full bucket at the start
    schedule.advance(500)
    assert schedule.next_action(0) == Wait(500)  # 500 bytes at 1000/s
    assert schedule.next_action(499) == Wait(500)
    assert schedule.next_action(500) == ReadChunk(0, 500, 500)
    schedule.advance(400, need_bytes=900)  # a 900-byte batch at 900: read it whole
    assert schedule.next_action(1000) == ReadChunk(0, 900, 900)  # the bucket is full again
    schedule.advance(900)
    # 400 bytes of debt to repay, then 200 for the last read of 200 bytes.
    assert schedule.next_action(1000) == Wait(1600)
    assert schedule.next_action(1600) == ReadChunk(0, 1800, 200)
    schedule.advance(200)
    assert schedule.next_action(1600) == Wait(61_600)  # the pass is over: the interval
    assert schedule.passes_done == 1
    assert isinstance(schedule.next_action(61_600), StartPass)


def test_schedule_skips_a_target_that_ends_early_and_refuses_a_zero_rate():
    schedule = ScrubSchedule(bytes_per_second=10**9, interval_ms=0, chunk_bytes=100, now_ms=0)
    schedule.next_action(0)
    schedule.start_pass([300, 50], 0)
    assert schedule.next_action(0) == ReadChunk(0, 0, 100)
    schedule.advance(0)  # nothing there: the file was cut
    assert schedule.next_action(1) == ReadChunk(1, 0, 50)
    with pytest.raises(ValueError):
        ScrubSchedule(bytes_per_second=0, interval_ms=0, chunk_bytes=100, now_ms=0)


# -- the shell over real files -------------------------------------------------------

@pytest.fixture(autouse=True, scope="module")
def _no_fsync():
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None
    yield
    os.fsync, os.fdatasync = real_fsync, real_fdatasync


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(data dir holding logs t-0 and u-0, t-0's batches as (segment, position, data,
    base offset), t-0's segment bases)."""
    data_dir = tmp_path_factory.mktemp("pristine")
    rng = random.Random(20261127)
    for name in ("t-0", "u-0"):
        log = Log.open(data_dir / name, CONFIG, now_ms=0)
        for i in range(60):
            # Some batches larger than the scrub's chunk below.
            size = rng.choice([rng.randint(0, 80), rng.randint(1200, 2000)])
            log.append_as_leader(encode_batch([(None, bytes(rng.randrange(256) for _ in
                                                            range(size)))]), i // 25, now_ms=0)
        log.close()
    batches, bases = [], sorted(int(p.name[:20]) for p in (data_dir / "t-0").glob("*.log"))
    for base in bases:
        data = (data_dir / "t-0" / f"{base:020d}.log").read_bytes()
        for position, header in iter_batches(data):
            batches.append((base, position, data[position:position + header.size],
                            header.base_offset))
    return data_dir, batches, bases


def open_manager(pristine_dir: Path, tmp: str) -> LogManager:
    data_dir = Path(tmp) / "data"
    shutil.copytree(pristine_dir, data_dir)
    manager = LogManager(data_dir, CONFIG)
    manager.load(now_ms=0)
    return manager


def scrub_one_pass(manager: LogManager, found: list, chunk_bytes: int = 1000) -> LogScrubber:
    """Step the scrubber (injected clock) until its first pass is over."""
    scrubber = LogScrubber(manager.logs, lambda tp, batch: found.append((tp, batch)),
                           bytes_per_second=50_000, interval_ms=3_600_000, now_ms=0,
                           chunk_bytes=chunk_bytes)
    now = 0
    while scrubber.schedule.passes_done == 0:
        now += scrubber.step(now)
    scrubber.close()
    return scrubber


def flip(path: Path, at: int, mask: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ mask]), at)
    finally:
        os.close(fd)


def test_a_clean_log_reports_nothing_and_every_closed_byte_is_read(pristine):
    pristine_dir, _batches, _bases = pristine
    with tempfile.TemporaryDirectory() as tmp:
        manager = open_manager(pristine_dir, tmp)
        found: list = []
        scrubber = scrub_one_pass(manager, found)
        assert found == []
        closed = sum(s.size_bytes for log in manager.logs().values() for s in log.segments()[:-1])
        assert scrubber.schedule.bytes_verified == closed
        assert scrubber.schedule.bytes_granted >= closed
        manager.shutdown()


@EXAMPLES
@given(data=st.data())
def test_scrub_finds_a_flipped_byte_at_its_batch(pristine, data):
    pristine_dir, batches, bases = pristine
    segment, position, batch, base_offset = data.draw(st.sampled_from(batches), label="victim")
    offset_in_batch = data.draw(st.integers(0, len(batch) - 1), label="byte")
    assume(offset_in_batch not in EPOCH_FIELD)
    chunk_bytes = data.draw(st.sampled_from([300, 1000, 4096]), label="chunk")
    with tempfile.TemporaryDirectory() as tmp:
        manager = open_manager(pristine_dir, tmp)
        path = manager.data_dir / "t-0" / f"{segment:020d}.log"
        flip(path, position + offset_in_batch, data.draw(st.integers(1, 255), label="xor"))
        found: list = []
        scrub_one_pass(manager, found, chunk_bytes)
        if segment == bases[-1]:
            assert found == []  # the active segment is the readers' to check
        else:
            assert len(found) == 1
            tp, corrupt = found[0]
            assert tp == TopicPartition("t", 0)
            assert (corrupt.path, corrupt.position, corrupt.base_offset) == (str(path), position,
                                                                             base_offset)
        manager.shutdown()


@pytest.mark.parametrize("when", ["before the segment is read", "while it is read"])
def test_damage_in_a_segment_cut_during_the_pass_is_not_reported(pristine, when):
    """The scrub reads without the log's lock: a segment cut meanwhile (a replica repairing
    itself) is gone, or active again with new bytes, and what the scrub read of it is
    stale. Cut before the scrub opens it: the file is gone; cut while the scrub holds it
    open: the scrub reads the deleted file's damaged bytes, and must not report them."""
    pristine_dir, batches, bases = pristine
    with tempfile.TemporaryDirectory() as tmp:
        manager = open_manager(pristine_dir, tmp)
        log = manager.get(TopicPartition("t", 0))
        segment, position, _batch, _base = next(
            b for b in batches if b[0] > bases[2] and b[1] > 0 and b[0] != bases[-1])
        flip(log.dir / f"{segment:020d}.log", position + 30, 0x04)
        found: list = []
        scrubber = LogScrubber(manager.logs, lambda tp, batch: found.append((tp, batch)),
                               bytes_per_second=10**9, interval_ms=3_600_000, now_ms=0,
                               chunk_bytes=100)
        now = scrubber.step(0)  # the pass begins: the targets are listed
        victim_target = bases.index(segment)  # t-0's targets come first, in order
        if when == "while it is read":
            while scrubber._fd_target != victim_target:
                now += scrubber.step(now)
        log.truncate_to(bases[2])  # the victim's segment is deleted
        while scrubber.schedule.passes_done == 0:
            now += scrubber.step(now)
        assert found == []
        assert scrubber.corrupt_found == 0
        manager.shutdown()


def test_check_chunk_reports_a_batch_running_past_the_segment_end():
    batch = encode_batch([(None, b"x" * 100)])
    damaged = bytearray(batch)
    damaged[11] ^= 0x40  # batchLength + 64
    checked = check_chunk(bytes(batch) + bytes(damaged), 0, 0, 2 * len(batch), "p")
    assert checked.verified_bytes == len(batch) and checked.next_offset == 1
    assert checked.corrupt.position == len(batch) and checked.corrupt.base_offset == 1
    assert "runs past the segment end" in checked.corrupt.reason


def test_check_chunk_asks_for_a_batch_cut_by_the_chunk_and_names_a_torn_tail():
    first, second = encode_batch([(None, b"a" * 50)]), bytearray(encode_batch([(None, b"b")]))
    second[7] = 1  # baseOffset 1: follows the first batch
    data = first + bytes(second)
    cut = check_chunk(data[:len(first) + 30], 0, 0, len(data), "p")
    assert (cut.verified_bytes, cut.next_offset, cut.corrupt, cut.need_bytes) == (
        len(first), 1, None, len(second))
    short = check_chunk(data[:len(first) + 10], 0, 0, len(data), "p")  # not even a frame
    assert short.verified_bytes == len(first) and short.need_bytes > 0
    torn = check_chunk(data + b"\0" * 10, 0, 0, len(data) + 10, "p")  # 10 bytes at the end
    assert torn.verified_bytes == len(data) and torn.corrupt.position == len(data)
    assert torn.corrupt.base_offset == 2 and "truncated batch" in torn.corrupt.reason


async def test_run_reports_through_the_callback_until_cancelled(pristine):
    pristine_dir, batches, bases = pristine
    with tempfile.TemporaryDirectory() as tmp:
        manager = open_manager(pristine_dir, tmp)
        segment, position, _batch, base_offset = [b for b in batches if b[0] == bases[1]][-1]
        flip(manager.data_dir / "t-0" / f"{segment:020d}.log", position + 70, 0x01)
        reported = asyncio.Event()
        found: list = []

        def on_corrupt(tp, batch):
            found.append((tp, batch))
            loop.call_soon_threadsafe(reported.set)  # called in the scrub's worker thread

        loop = asyncio.get_running_loop()
        scrubber = LogScrubber(manager.logs, on_corrupt, bytes_per_second=10**8,
                               interval_ms=3_600_000, now_ms=0)
        task = asyncio.create_task(scrubber.run())
        await asyncio.wait_for(reported.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [(tp, b.position, b.base_offset) for tp, b in found] == [
            (TopicPartition("t", 0), position, base_offset)]
        manager.shutdown()
