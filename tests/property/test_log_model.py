"""Property test: random sequences of append (leader and follower), roll, truncate,
full truncation, retention and reopen (clean, or a crash with a torn tail) against a
simple in-memory model. After every step the log and its epoch cache agree with the
model: same batches (bytes of the CRC'd part, offsets, epochs), same start and end
offsets, and cache entries equal to the epoch runs of the kept batches.
"""

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.proto.batch import ATTRIBUTES_OFFSET, iter_batches
from tidewater.proto.records import encode_batch

CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=90, retention_ms=-1)


@pytest.fixture(autouse=True, scope="module")
def _no_fsync():
    # A simulated crash here keeps the page cache, so fsync changes nothing but time.
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    os.fsync = os.fdatasync = lambda fd: None
    yield
    os.fsync, os.fdatasync = real_fsync, real_fdatasync


@dataclass(frozen=True)
class ModelBatch:
    base_offset: int
    last_offset: int
    epoch: int
    body: bytes  # attributes..end: what the CRC covers, never changed by the log


def model_batches_of(data: bytes) -> list[ModelBatch]:
    return [ModelBatch(h.base_offset, h.last_offset, h.partition_leader_epoch,
                       bytes(data[p + ATTRIBUTES_OFFSET:p + h.size]))
            for p, h in iter_batches(data)]


payloads = st.lists(st.binary(max_size=40), min_size=1, max_size=4)


class LogMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp()
        self.dir = Path(self.tmp) / "p-0"
        self.log = Log.open(self.dir, CONFIG, now_ms=0)
        self.now_ms = 0
        self.leader_epoch = 0  # what a controller would hand out: never goes down
        self.batches: list[ModelBatch] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        # Kafka's truncateFromStart keeps the epoch current at the new log start as an entry
        # (epoch, log start) even when retention left no batch: that epoch, or None.
        self.start_epoch: int | None = None

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def tick(self):
        self.now_ms += 7
        return self.now_ms

    def _append_model(self, batches: list[ModelBatch]):
        self.batches.extend(batches)
        self.log_end_offset = batches[-1].last_offset + 1

    @rule(records=st.lists(payloads, min_size=1, max_size=3), bump=st.booleans())
    def append_as_leader(self, records, bump):
        self.leader_epoch += bump
        data = b"".join(encode_batch([(None, v) for v in values], base_timestamp_ms=1000)
                        for values in records)
        info = self.log.append_as_leader(data, self.leader_epoch, now_ms=self.tick())
        assert info.first_offset == self.log_end_offset
        expected, offset = [], self.log_end_offset
        for b in model_batches_of(data):
            length = b.last_offset - b.base_offset
            expected.append(ModelBatch(offset, offset + length, self.leader_epoch, b.body))
            offset += length + 1
        self._append_model(expected)
        assert info.last_offset == self.log_end_offset - 1

    @rule(records=st.lists(payloads, min_size=1, max_size=3),
          bumps=st.lists(st.booleans(), min_size=3, max_size=3))
    def append_as_follower(self, records, bumps):
        data, offset = b"", self.log_end_offset
        for values, bump in zip(records, bumps, strict=False):
            self.leader_epoch += bump
            data += encode_batch([(None, v) for v in values], base_offset=offset,
                                 partition_leader_epoch=self.leader_epoch,
                                 base_timestamp_ms=1000)
            offset += len(values)
        self.log.append_as_follower(data, now_ms=self.tick())
        self._append_model(model_batches_of(data))

    @rule()
    def roll(self):
        self.log.roll(now_ms=self.tick())

    @rule(data=st.data())
    def truncate_to(self, data):
        offset = data.draw(st.integers(self.log_start_offset, self.log_end_offset + 2))
        self.log.truncate_to(offset)
        if offset < self.log_end_offset:
            self.batches = [b for b in self.batches if b.last_offset < offset]
            self.log_end_offset = (self.batches[-1].last_offset + 1 if self.batches
                                   else self.log_start_offset)
            if not self.batches:  # truncateFromEnd(LEO = log start) drops that entry too
                self.start_epoch = None

    @rule(data=st.data())
    def truncate_fully_and_start_at(self, data):
        offset = data.draw(st.integers(0, self.log_end_offset + 5))
        self.log.truncate_fully_and_start_at(offset)
        self.batches = []
        self.start_epoch = None
        self.log_start_offset = self.log_end_offset = offset

    @rule(data=st.data(), retention_bytes=st.integers(0, 1500))
    def delete_old_segments(self, data, retention_bytes):
        high_watermark = data.draw(st.integers(self.log_start_offset, self.log_end_offset))
        self.log.update_config(dataclasses.replace(CONFIG, retention_bytes=retention_bytes))
        segments = [(s.base_offset, s.size_bytes) for s in self.log.segments()]
        total = sum(size for _, size in segments)
        expected = 0
        for i in range(len(segments) - 1):
            if segments[i + 1][0] > high_watermark or total - segments[i][1] < retention_bytes:
                break
            total -= segments[i][1]
            expected += 1
        assert self.log.delete_old_segments(self.tick(), high_watermark) == expected
        self.log.update_config(CONFIG)
        if expected:
            runs = self._epoch_runs()
            self.log_start_offset = segments[expected][0]
            self.batches = [b for b in self.batches if b.base_offset >= self.log_start_offset]
            before = [epoch for epoch, start in runs if start <= self.log_start_offset]
            self.start_epoch = before[-1] if before else None

    @rule()
    def reopen_after_clean_shutdown(self):
        self.log.close()
        self.log = Log.open(self.dir, CONFIG, now_ms=self.tick(), had_clean_shutdown=True,
                            recovery_point=self.log.recovery_point,
                            log_start_offset=self.log.log_start_offset)

    @precondition(lambda self: self.log.active_segment.size_bytes > 0)
    @rule(torn_bytes=st.integers(0, 80))
    def reopen_after_crash(self, torn_bytes):
        old = self.log
        active = old.active_segment
        path, base, size = active.log_path, active.base_offset, active.size_bytes
        recovery_point, log_start_offset = old.recovery_point, old.log_start_offset
        for segment in old.segments():
            segment.close()  # abandon: nothing more is flushed or written
        kept_size = max(0, size - torn_bytes)
        with open(path, "r+b") as f:
            f.truncate(kept_size)
        self.log = Log.open(self.dir, CONFIG, now_ms=self.tick(), recovery_point=recovery_point,
                            log_start_offset=log_start_offset)
        # The model drops the active segment's batches that no longer fit in the file.
        in_segment = [b for b in self.batches if b.base_offset >= base]
        position, keep = 0, []
        for b in in_segment:
            position += ATTRIBUTES_OFFSET + len(b.body)  # the whole batch
            if position > kept_size:
                break
            keep.append(b)
        self.batches = [b for b in self.batches if b.base_offset < base] + keep
        self.log_end_offset = keep[-1].last_offset + 1 if keep else base
        if not self.batches:
            self.start_epoch = None  # recovery truncates the cache to the (start) LEO

    @invariant()
    def log_agrees_with_model(self):
        log = self.log
        assert log.log_start_offset == self.log_start_offset
        assert log.log_end_offset == self.log_end_offset
        assert log.log_start_offset <= log.recovery_point <= log.log_end_offset
        got, offset = [], log.log_start_offset
        while offset < log.log_end_offset:
            result = log.read(offset, 700)
            assert result.records, f"no progress at {offset}"
            got.extend(model_batches_of(result.records))
            offset = result.next_offset
        assert got == self.batches

    def _epoch_runs(self) -> list[tuple[int, int]]:
        """The cache Kafka keeps: the epoch runs of the batches, or, with none left after
        retention, the epoch that was current at the log start."""
        runs: list[tuple[int, int]] = []
        for b in self.batches:
            if b.epoch >= 0 and (not runs or runs[-1][0] != b.epoch):
                runs.append((b.epoch, b.base_offset))
        if not runs and self.start_epoch is not None:
            runs.append((self.start_epoch, self.log_start_offset))
        return runs

    @invariant()
    def epoch_cache_agrees_with_model(self):
        assert self.log.leader_epoch_cache.entries() == self._epoch_runs()


LogMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
test_log_matches_model = LogMachine.TestCase
