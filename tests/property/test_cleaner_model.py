"""Property test: compaction against a model. Random appends (keys from a small set,
values and tombstones, batches of several records, compression, idempotent producers,
new leader epochs), rolls, cleaner passes at random times and high watermarks, and
re-opens with full recovery. After every step:

- every record read back (CRC-checked) is the one appended at that offset: same key,
  same value; offsets never move;
- nothing at or above the highest offset any pass was allowed to clean is gone;
- each key's latest record is there, unless it is a tombstone a pass was allowed to
  drop (below that pass's clean end, batch older than now - delete.retention.ms);
- right after a pass, each key appears at most once below its clean end, that
  record is the key's latest one below it, and it is no tombstone older than the
  pass's horizon;
- the leader epoch cache is exactly what the appends made it.
"""

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.property.test_log_model import _no_fsync  # noqa: F401  (autouse: no fsync)
from tests.unit.test_cleaner import read_records
from tidewater.broker.storage.cleaner import LogCleaner
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.recovery import close_segments_quietly
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.compression import COMPRESSION_GZIP, COMPRESSION_NONE
from tidewater.proto.records import SimpleRecord, encode_batch

TP = TopicPartition("t", 0)
DELETE_RETENTION_MS = 1000
CONFIG = LogConfig.from_configs({
    "cleanup.policy": "compact", "segment.bytes": "700", "index.interval.bytes": "100",
    "min.cleanable.dirty.ratio": "0", "delete.retention.ms": str(DELETE_RETENTION_MS)})
KEYS = [b"a", b"b", b"c", b"d", b"e"]


records_strategy = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=0, max_size=12))),
    min_size=1, max_size=4)


class CompactionModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="cleaner-model-"))
        self.log = Log.open(self.root / "t-0", CONFIG, now_ms=0)
        self.cleaner = LogCleaner(self.root)
        self.now_ms = 10_000
        self.epoch = 0
        self.epochs: list[tuple[int, int]] = []
        # offset -> (key, value, batch max timestamp): everything ever appended
        self.appended: dict[int, tuple[bytes, bytes | None, int]] = {}
        self.cleaned_end = 0  # highest clean end of any pass
        self.dropped_tombstones: set[int] = set()  # offsets a pass was allowed to drop
        self.just_cleaned_end: int | None = None
        self.just_cleaned_horizon = 0
        # Producer 7's next sequence: its batches are contiguous, as the leader requires.
        self.next_sequence = 0

    # -- rules -------------------------------------------------------------------

    @rule(records=records_strategy, gzip=st.booleans(), producer=st.booleans(),
          new_epoch=st.booleans(), age_ms=st.integers(0, 3000))
    def append(self, records, gzip, producer, new_epoch, age_ms):
        if new_epoch:
            self.epoch += 1
        ts = self.now_ms - age_ms
        data = encode_batch([SimpleRecord(k, v, timestamp_ms=ts) for k, v in records],
                            base_timestamp_ms=ts,
                            compression=COMPRESSION_GZIP if gzip else COMPRESSION_NONE,
                            producer_id=7 if producer else -1, producer_epoch=0 if producer else -1,
                            base_sequence=self.next_sequence if producer else -1)
        info = self.log.append_as_leader(data, self.epoch, now_ms=self.now_ms)
        if producer:
            self.next_sequence += len(records)
        if not self.epochs or self.epochs[-1][0] != self.epoch:
            self.epochs.append((self.epoch, info.first_offset))
        for i, (key, value) in enumerate(records):
            self.appended[info.first_offset + i] = (key, value, ts)
        self.just_cleaned_end = None

    @rule()
    def roll(self):
        self.log.roll(self.now_ms)
        self.just_cleaned_end = None

    @rule(advance_ms=st.integers(0, 2500), hw_back=st.integers(0, 6))
    def clean(self, advance_ms, hw_back):
        self.now_ms += advance_ms
        self.log.flush()
        hw = max(0, self.log.log_end_offset - hw_back)
        results = self.cleaner.clean_logs({TP: self.log}, {TP: hw}, self.now_ms)
        self.just_cleaned_end = None
        for result in results:
            end = result.clean_end_offset
            assert end <= hw
            self.cleaned_end = max(self.cleaned_end, end)
            horizon = self.now_ms - DELETE_RETENTION_MS
            self.dropped_tombstones |= {o for o, (_, v, ts) in self.appended.items()
                                        if o < end and v is None and ts < horizon}
            self.just_cleaned_end, self.just_cleaned_horizon = end, horizon

    @rule()
    def reopen_with_full_recovery(self):
        self.log.flush()
        close_segments_quietly(self.log.segments())
        self.log = Log.open(self.root / "t-0", CONFIG, now_ms=0, recovery_point=0)
        self.just_cleaned_end = None

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def matches_the_model(self):
        records = read_records(self.log)
        offsets = [o for o, _, _ in records]
        assert offsets == sorted(set(offsets))
        for offset, key, value in records:
            assert self.appended[offset][:2] == (key, value), offset
        present = set(offsets)
        assert {o for o in self.appended if o >= self.cleaned_end} <= present
        latest: dict[bytes, int] = {}
        for offset, (key, _, _) in sorted(self.appended.items()):
            latest[key] = offset
        for key, offset in latest.items():
            if offset not in self.dropped_tombstones:
                assert offset in present, (key, offset)
        if self.just_cleaned_end is not None:
            below = [(o, k) for o, k, _ in records if o < self.just_cleaned_end]
            keys = [k for _, k in below]
            assert len(keys) == len(set(keys)), below
            latest_below: dict[bytes, int] = {}
            for offset, (key, _, _) in sorted(self.appended.items()):
                if offset < self.just_cleaned_end:
                    latest_below[key] = offset
            assert all(latest_below[k] == o for o, k in below)
            expired = [o for o, _ in below if self.appended[o][1] is None
                       and self.appended[o][2] < self.just_cleaned_horizon]
            assert not expired, expired  # tombstones older than delete.retention.ms went
        assert self.log.leader_epoch_cache.entries() == self.epochs

    def teardown(self):
        close_segments_quietly(self.log.segments())
        shutil.rmtree(self.root, ignore_errors=True)


TestCompactionModel = CompactionModel.TestCase
TestCompactionModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
