"""In-memory stand-ins for the storage contract (architecture.md), for broker unit tests.

``FakeLog`` keeps whole batches in a list and follows the contract of
``broker.storage.log.Log`` closely enough to drive the replica manager
without files: offsets assigned from the LEO, epochs stamped, the real
LeaderEpochCache (in memory) updated on appends and truncations.
"""

from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass

from crc32c import crc32c

from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    iter_batches,
    set_base_offset_and_epoch,
)
from tidewater.proto.errors import CorruptRecordError, OffsetOutOfRangeError

_HEADER = struct.Struct(">qiibIhiqqqhii")


def make_batch(record_count: int = 1, payload: bytes = b"x", *, base_offset: int = 0,
               epoch: int = -1, timestamp_ms: int | None = None) -> bytes:
    """A RecordBatch v2 with a valid CRC; the record bytes are opaque filler."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    body = payload * record_count
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(body)
    buf = bytearray(_HEADER.pack(base_offset, batch_length, epoch, 2, 0, 0, record_count - 1,
                                 ts, ts, -1, -1, -1, record_count) + body)
    crc = crc32c(bytes(buf[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", buf, 17, crc)
    return bytes(buf)


@dataclass
class FakeAppendInfo:
    first_offset: int
    last_offset: int
    record_count: int
    max_timestamp: int
    size_bytes: int
    log_append_time_ms: int = -1
    duplicate: bool = False


@dataclass
class FakeReadResult:
    records: bytes
    first_offset: int
    next_offset: int
    corrupt: None = None  # a fake log holds no damaged batch


class FakeLog:
    def __init__(self, tp: TopicPartition, config: LogConfig):
        self.topic_partition = tp
        self.config = config
        self.leader_epoch_cache = LeaderEpochCache(None)
        self.batches: list[tuple[int, int, bytes]] = []  # (base, next, bytes)
        self.log_start_offset = 0

    @property
    def log_end_offset(self) -> int:
        return self.batches[-1][1] if self.batches else self.log_start_offset

    @property
    def size_bytes(self) -> int:
        return sum(len(b) for _, _, b in self.batches)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    batch_bounds = staticmethod(Log.batch_bounds)

    # No transactions in a fake log: nothing holds the last stable offset back.
    first_unstable_offset = None

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[object]:
        return []

    def append_as_leader(self, records: bytes, leader_epoch: int, now_ms: int, *,
                         markers_allowed: bool = False,
                         coordinator_origin: bool = False) -> FakeAppendInfo:
        headers = list(iter_batches(records))
        for _, h in headers:
            if h.size > self.config.max_message_bytes:
                raise CorruptRecordError("too large", too_large=True)
        first = self.log_end_offset
        count = 0
        for position, h in headers:
            buf = bytearray(records[position:position + h.size])
            base = self.log_end_offset
            set_base_offset_and_epoch(buf, 0, base, leader_epoch)
            self.leader_epoch_cache.assign(leader_epoch, base)
            self.batches.append((base, base + h.last_offset_delta + 1, bytes(buf)))
            count += h.record_count
        return FakeAppendInfo(first, self.log_end_offset - 1, count, now_ms, len(records))

    def append_as_follower(self, records: bytes, now_ms: int) -> FakeAppendInfo:
        first = self.log_end_offset
        for position, h in iter_batches(records):
            if h.base_offset != self.log_end_offset:
                raise CorruptRecordError(f"follower batch at {h.base_offset}, LEO {self.log_end_offset}")
            if h.partition_leader_epoch >= 0:
                self.leader_epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
            self.batches.append((h.base_offset, h.next_offset, bytes(records[position:position + h.size])))
        return FakeAppendInfo(first, self.log_end_offset - 1, 0, now_ms, len(records))

    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_batch: bool = True) -> FakeReadResult:
        if not self.log_start_offset <= start_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(f"{start_offset}")
        out = bytearray()
        next_offset = start_offset
        for base, nxt, data in self.batches:
            if nxt <= start_offset:
                continue
            if max_offset is not None and base >= max_offset:
                break
            if out and len(out) + len(data) > max_bytes:
                break
            if not out and len(data) > max_bytes and not min_one_batch:
                break
            out += data
            next_offset = nxt
        return FakeReadResult(bytes(out), start_offset, next_offset)

    def truncate_to(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b[0] < offset]
        self.leader_epoch_cache.truncate_from_end(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches = []
        self.log_start_offset = offset
        self.leader_epoch_cache.clear()

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(f"{offset}")
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.leader_epoch_cache.truncate_from_start(offset)
        return True

    def fetch_offset_by_timestamp(self, timestamp_ms: int):
        for base, _, data in self.batches:
            (max_ts,) = struct.unpack_from(">q", data, 35)
            if max_ts >= timestamp_ms:
                return base, max_ts, self.leader_epoch_cache.epoch_for_offset(base)
        return None

    def delete_old_segments(self, now_ms: int, high_watermark: int) -> int:
        return 0


class FakeLogManager:
    """LogManager in memory; ``deleted`` lists the logs moved aside, in order."""

    def __init__(self):
        self._logs: dict[TopicPartition, FakeLog] = {}
        self._topic_ids: dict[TopicPartition, bytes | None] = {}
        self.checkpointed: dict[TopicPartition, int] = {}
        self.deleted: list[tuple[TopicPartition, FakeLog, bytes | None]] = []

    def get(self, tp):
        return self._logs.get(tp)

    def logs(self):
        return dict(self._logs)

    def add_loaded(self, tp, log, topic_id=None):
        """A log found at start-up, with the ID of its partition.metadata (None: none)."""
        self._logs[tp] = log
        self._topic_ids[tp] = topic_id

    def get_or_create(self, tp, config, now_ms, topic_id=None):
        if tp not in self._logs:
            self._logs[tp] = FakeLog(tp, config)
            self._topic_ids[tp] = topic_id
        return self._logs[tp]

    def topic_id(self, tp):
        return self._topic_ids.get(tp)

    def topic_ids(self):
        return {tp: self._topic_ids.get(tp) for tp in self._logs}

    def assign_topic_id(self, tp, topic_id):
        assert self._topic_ids.get(tp) is None
        self._topic_ids[tp] = topic_id

    def delete(self, tp):
        log = self._logs.pop(tp, None)
        if log is not None:
            self.deleted.append((tp, log, self._topic_ids.pop(tp, None)))

    def moves_aside(self):
        return contextlib.nullcontext([])  # a move here is done at once: nothing to settle

    def settle_deletions(self, moved):
        pass

    def update_topic_config(self, topic, config):
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.config = config

    def read_high_watermarks(self):
        return dict(self.checkpointed)

    def checkpoint_high_watermarks(self, hws):
        self.checkpointed = dict(hws)

    def maybe_roll_and_flush(self, now_ms, logs=None):
        pass

    def checkpoint_recovery_points(self):
        pass

    def checkpoint_log_start_offsets(self):
        self.log_starts_checkpointed = {tp: log.log_start_offset
                                        for tp, log in self._logs.items()}

    def delete_old_segments(self, now_ms, high_watermarks, logs=None):
        return 0
