"""The log of one partition replica: an ordered list of segments plus its epoch cache.

Theory of operation. The log is a directory of segments (layout and recovery in
``recovery.py``, file formats in ``segment.py`` and ``index.py``, the epoch
checkpoint in ``epoch_cache.py``). Only the last segment (the active one) is
written. Offsets are contiguous: each batch starts at the previous batch's last
offset + 1 and each segment at the previous segment's end, so the log end
offset (LEO) is the active segment's end.

- Appends validate every batch (framing, magic, CRC32C) without decoding
  records. A leader append restamps baseOffset/partitionLeaderEpoch in a copy
  of the request bytes (both lie outside the CRC) and assigns offsets from the
  LEO; a follower append keeps the leader's offsets and epochs. One ``write``
  per append; the epoch cache is updated (and fsynced) before the write, as
  Kafka does, and undone if the write fails.
- Reads locate the batch holding the start offset (segment by base offset,
  then index, then header scan) and return whole batches, each checked
  (framing, contiguous offsets, CRC-32C): a damaged batch ends the read, which
  names it (``ReadResult.corrupt``, or CorruptBatchError when it comes first;
  ``corruption.py``). ``truncate_to`` below it is how a replica repairs itself.
- The active segment rolls on ``segment.bytes``, ``segment.ms``, a full index,
  or when an offset would not fit the index's 32-bit relative offset. The roll
  (inside an append, on the event loop) only creates the new segment's files,
  without any fsync. As in Kafka (``UnifiedLog.roll`` schedules "flush-log"),
  the rolled segment is flushed in the background: a worker thread fsyncs the
  directory, the rolled segment's data and its index files without the lock
  (``flush_outside_lock``), then moves the recovery point to the new segment's
  base. Until then the rolled segment keeps its indexes in memory. A disk error
  there takes the log offline; a broken invariant goes to the log's
  ``on_background_failure`` (the broker's supervisor stops the process).
- ``recovery_point``: every offset below it is durable (data fsynced, and the
  directory fsynced after the file was created). It moves on flush
  (``flush.messages``, ``flush.ms``, a roll's background flush, checkpoint,
  close). Every flush that moves it fsyncs the directory first if a roll
  created files since the last directory fsync. A policy flush inside an
  append fsyncs only the ``.log`` data (and that directory); index files are
  written by a roll's background flush, checkpoint, close and the periodic
  flush.ms pass (opening rescans whatever the index files lack).
- What an acknowledged append may lose in a crash: with ``flush.messages`` /
  ``flush.ms`` unset (Kafka's default) durability is replication, not fsync:
  anything above the recovery point may be lost, including a whole new segment
  whose file name did not reach the disk (recovery then sees the log end at the
  previous segment, or a gap, and cuts there). With ``flush.messages=1`` an
  append still returns only once its data and the name of any file a roll
  created are fsynced. Recovery after an unclean shutdown re-validates every
  segment from the one holding the recovery point on, so a roll whose
  background flush never ran loses nothing that reached the disk.
- Reopening: ``recovery.py`` trusts or re-validates the segments; the epoch
  checkpoint is rebuilt from the batches' partitionLeaderEpoch when it is
  missing, empty, corrupt, or disagrees with the batches; the checkpointed
  log start offset is used only if it is a segment's base offset.
- A fetch or follower append never needs the records decoded; only a
  timestamp lookup decodes the one batch it lands in (exact record offset).
- Idempotent producers' state (``producer_state.py``, Kafka's ProducerStateManager):
  a leader append checks each batch carrying a producer id before anything is
  written (a retry already in the log returns its original offsets with
  ``AppendInfo.duplicate``, nothing written); every append records its batches
  after the write. A roll writes ``<offset>.snapshot`` at the new segment's base
  (fsynced by the roll's background flush), close writes one at the LEO;
  opening loads the latest readable snapshot at or below the LEO and reads the
  batches after it (none at all: only the active segment's, as for a log written
  before producer state existed); ``truncate_to`` reloads the same way; retention deletes the
  snapshots below the new log start (the producers stay until they expire).
- Transactions (KIP-98): a transactional batch opens its producer's transaction,
  a marker (control batch, ``proto/control_records.py``) ends it; only the
  transaction coordinator's path appends markers (``append_as_leader(...,
  markers_allowed=True)``), a client's control batch is INVALID_RECORD. Each
  ABORT adds an entry to the marker segment's ``.txnindex`` (``txn_index.py``);
  followers and the producer-state rebuild on open (and after a truncation)
  process the same batches the same way, so they end with the same open
  transactions and index. ``first_unstable_offset`` bounds the last stable
  offset (``min`` with the HW, which the replication core owns).
- Retention deletes whole segments that lie entirely below the high
  watermark, oldest first, never the active one, and moves the log start
  offset (the epoch cache drops what lies before it); not with
  ``cleanup.policy=compact``, whose log the cleaner rewrites instead
  (``cleaner.py``; its segments may then have offset gaps). Under the lock the
  files are renamed ``.deleted``; a background thread unlinks them.
- No fsync under the lock on the checkpoint's or a roll's path:
  ``flush_outside_lock`` snapshots under it, fsyncs without it, and publishes
  the snapshot's LEO (a roll's: the new segment's base) as the recovery point.
  (Truncations, close and the flush.messages / flush.ms policies inside an
  append still fsync under it: rare, or asked for.)

Errors: bad input raises CorruptRecordError / MessageTooLargeError /
RecordListTooLargeError before anything is written. An OSError becomes
KafkaStorageError. A failed append write is cut back so the LEO is unchanged;
any other failure while changing the log takes it offline (every later call
raises KafkaStorageError) because memory and disk may then disagree; the next
open recovers it from disk.

Threading: every public method takes the log's lock, so one task may append
while fetch handlers read from other threads; a roll's flush runs in the flush
executor's thread (``Log.open``) and takes the lock before and after its fsyncs,
not during them. ``drain_roll_flushes`` waits for the queued ones (shutdown).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewater.broker.storage.checkpoints import write_file_atomically
from tidewater.broker.storage.cleaner_swap import mark_compacted
from tidewater.broker.storage.corruption import CorruptBatch, CorruptBatchError
from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.broker.storage.index import RELATIVE_OFFSET_MAX
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.producer_state import (
    PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    CompletedTxn,
    ProducerBatch,
    ProducerStateManager,
    parse_snapshot_file_name,
    snapshot_file_name,
)
from tidewater.broker.storage.recovery import close_segments_quietly, open_log_dir
from tidewater.broker.storage.segment import LogSegment, fsync_dir, storage_error
from tidewater.broker.storage.topics import TopicPartition, parse_log_dir_name
from tidewater.broker.storage.txn_index import AbortedTxn, TxnIndexes, txn_index_path
from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    BytesLike,
    iter_batches,
    read_header,
    set_base_offset_and_epoch,
    validate_batch,
)
from tidewater.proto.control_records import marker_of_batch
from tidewater.proto.crc import crc32c
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRecordError,
    InvalidRequestError,
    InvariantViolation,
    KafkaStorageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from tidewater.proto.records import decode_batch

log = logging.getLogger(__name__)

INACTIVE_INDEXES_LOADED_MAX = 4  # per log; the active segment's are always loaded
PRODUCER_STATE_READ_BYTES = 8 << 20  # a rebuild of the producers' state reads this much at once
EARLIEST_TIMESTAMP = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP = -1  # ListOffsets: the log end offset
MAX_TIMESTAMP = -3  # ListOffsets v7 (KIP-734): the record with the largest timestamp
_ATTRIBUTES_AND_MAX_TIMESTAMP = (struct.Struct(">h"), struct.Struct(">q"))
_MAX_TIMESTAMP_AT = 35
_CRC = struct.Struct(">I")
# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER_FIELDS = struct.Struct(">qiibIhiqqqhii")
assert _HEADER_FIELDS.size == HEADER_SIZE
_unpack_header = _HEADER_FIELDS.unpack_from
_CRC_AT = 17


class UnexpectedAppendOffsetError(InvalidRequestError):
    """A follower append does not start at the log end offset."""


@dataclass(slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    record_count: int
    max_timestamp: int
    size_bytes: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    offset_of_max_timestamp: int = -1
    # A retried idempotent batch already in the log: nothing was appended, the offsets
    # are the original's (``producer_state.py``).
    duplicate: bool = False


@dataclass(slots=True)
class ReadResult:
    records: bytes  # whole batches, each checked (framing, offsets, CRC-32C)
    first_offset: int  # base offset of the first batch (the start offset if empty)
    next_offset: int  # offset after the last batch returned
    # The damaged batch the read stopped before (its base offset is next_offset), if any.
    corrupt: CorruptBatch | None = None


class Log:
    """One partition replica's log. Open with ``Log.open``."""

    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment],
                 leader_epoch_cache: LeaderEpochCache, log_start_offset: int,
                 recovery_point: int, now_ms: int, flush_executor: Executor | None = None,
                 producer_state: ProducerStateManager | None = None,
                 on_background_failure: Callable[[BaseException], None] | None = None):
        self.dir = directory
        self.topic_partition: TopicPartition | None
        try:
            self.topic_partition = parse_log_dir_name(directory.name)
        except ValueError:
            self.topic_partition = None  # a test or tool directory
        self.config = config
        self.leader_epoch_cache = leader_epoch_cache
        # Idempotent producers' state (producer_state.py), changed under the lock only.
        self.producer_state = producer_state or ProducerStateManager()
        # Aborted transactions per segment (txn_index.py), changed under the lock only.
        self.txn_indexes = TxnIndexes(directory)
        self._segments = segments
        self._base_offsets = [s.base_offset for s in segments]
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms
        self._offline_reason: str | None = None
        self._closed = False
        self._truncations = 0  # truncate_to / truncate_fully_and_start_at calls that cut
        # Rolls so far, and how many of them a directory fsync covered (the new files'
        # names are durable): no flush moves the recovery point before that fsync.
        self._rolls = self._dir_synced_rolls = 0
        # Rolled segments whose flush has not written their indexes yet; their indexes
        # stay in memory until it has (unload needs them on disk).
        self._rolled_unflushed: list[LogSegment] = []
        self._flush_executor = flush_executor  # None: the process's "flush-log" thread
        # A broken invariant in a job nobody awaits (the flush of a roll): the broker
        # stops on it (its supervisor), as on one anywhere else.
        self._on_background_failure = on_background_failure
        self._lock = threading.RLock()
        # Inactive segments whose indexes a read loaded back, oldest first.
        self._loaded_inactive: deque[LogSegment] = deque()
        for segment in segments[:-1]:
            segment.release_indexes()

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, dir: Path, config: LogConfig, *, now_ms: int, recovery_point: int = 0,
             log_start_offset: int | None = None, had_clean_shutdown: bool = False,
             flush_executor: Executor | None = None,
             producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
             on_background_failure: Callable[[BaseException], None] | None = None) -> Log:
        """Open (creating if needed) the log in ``dir``; recover unless shut down cleanly.

        ``flush_executor`` runs the flush of each rolled segment (default: one
        "flush-log" thread shared by the process's logs); an ``InvariantViolation``
        there goes to ``on_background_failure`` (the broker stops on it). The
        producers' state is loaded from the latest snapshot and the batches after it."""
        directory = Path(dir)
        opened = open_log_dir(directory, config, recovery_point=recovery_point,
                              log_start_offset=log_start_offset,
                              had_clean_shutdown=had_clean_shutdown)
        # Trusted segments were flushed; recovered ones were fsynced while opening.
        opened_log = cls(directory, opened.config, opened.segments, opened.leader_epoch_cache,
                         opened.log_start_offset, opened.segments[-1].next_offset, now_ms,
                         flush_executor,
                         ProducerStateManager(expiration_ms=producer_id_expiration_ms),
                         on_background_failure)
        try:
            with opened_log._lock:
                opened_log.txn_indexes.load(opened_log._base_offsets)
                # Recovery may have cut markers off: their entries go, the replay re-adds
                # what is still in the log.
                opened_log.txn_indexes.truncate_to(opened_log.log_end_offset)
                opened_log._reload_producer_state(now_ms)
        except BaseException:
            close_segments_quietly(opened.segments)
            raise
        return opened_log

    # -- state ---------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    def segments(self) -> list[LogSegment]:
        with self._lock:
            return list(self._segments)

    @property
    def is_offline(self) -> bool:
        return self._offline_reason is not None

    @property
    def is_closed(self) -> bool:
        """Closed or deleted (shutdown, StopReplica, topic deletion): appends and reads
        raise; flushes do nothing."""
        return self._closed

    def _check_usable(self) -> None:
        if self._offline_reason is not None:
            raise KafkaStorageError(f"log is offline after a disk error: {self._offline_reason}",
                                    path=str(self.dir))
        if self._closed:
            raise KafkaStorageError("log is closed", path=str(self.dir))

    def _go_offline(self, error: KafkaStorageError) -> None:
        self._offline_reason = str(error)
        log.error("log %s offline: %s", self.dir, error)

    # -- appends -------------------------------------------------------------

    def append_as_leader(self, records: bytes, leader_epoch: int, now_ms: int, *,
                         markers_allowed: bool = False,
                         coordinator_origin: bool = False) -> AppendInfo:
        """Validate, assign offsets from the LEO, stamp ``leader_epoch``, append.
        Control batches (transaction markers) only with ``markers_allowed`` (the
        coordinator's path, ``serving/txn_markers.py``); each is checked against its
        producer's state first. ``coordinator_origin``: the group coordinator's append
        (``ProducerStateManager.check_leader_append``)."""
        with self._lock:
            if self._offline_reason is not None or self._closed:
                self._check_usable()
            latest_epoch = self.leader_epoch_cache.latest_epoch
            if leader_epoch < latest_epoch:
                raise FencedLeaderEpochError(
                    f"append in leader epoch {leader_epoch}, the log is at epoch {latest_epoch}")
            if len(records) > self.config.segment_bytes:
                self._check_append_size(len(records))
            buf = bytearray(records)  # the one copy: restamped in place, then written
            view = memoryview(buf)
            first_offset = offset = self._segments[-1].next_offset
            log_append_time = self.config.log_append_time
            max_size = self.config.max_message_bytes
            batches = []
            producer_batches: list[ProducerBatch] = []
            has_markers = False
            record_count = 0
            max_timestamp, offset_of_max = -1, -1
            position, end = 0, len(buf)
            while position < end:
                fields = _checked_header(buf, view, position, end, max_size)
                attributes = fields[5]
                if attributes & (CONTROL_MASK | TRANSACTIONAL_MASK):
                    self._check_transactional(buf, position, fields, markers_allowed)
                    has_markers = has_markers or bool(attributes & CONTROL_MASK)
                if fields[9] >= 0 and not attributes & CONTROL_MASK:  # a producer's batch
                    producer_batches.append(ProducerBatch(
                        fields[9], fields[10], fields[11], fields[6],
                        bool(attributes & TRANSACTIONAL_MASK)))
                size, last_offset_delta, batch_record_count = (
                    LOG_OVERHEAD + fields[1], fields[6], fields[12])
                if batch_record_count != last_offset_delta + 1:
                    raise CorruptRecordError(
                        f"record count {batch_record_count} does not match lastOffsetDelta "
                        f"{last_offset_delta}", position=position)
                set_base_offset_and_epoch(buf, position, offset, leader_epoch)  # outside the CRC
                batch_max_timestamp = fields[8]
                if log_append_time:
                    batch_max_timestamp = now_ms
                    _set_log_append_time(buf, position, size, fields[5], now_ms)
                last_offset = offset + last_offset_delta
                batches.append((position, size, last_offset, batch_max_timestamp))
                if batch_max_timestamp > max_timestamp:
                    max_timestamp, offset_of_max = batch_max_timestamp, last_offset
                record_count += batch_record_count
                offset = last_offset + 1
                position += size
            if not batches:
                return self._empty_append_info()
            if producer_batches:
                duplicate = self.producer_state.check_leader_append(
                    producer_batches, coordinator_origin=coordinator_origin)
                if duplicate is not None:
                    return AppendInfo(duplicate.first_offset, duplicate.last_offset, 0, -1, 0,
                                      -1, -1, duplicate=True)
            # The cache ignores an epoch it already has; skip the call (and its lock).
            epochs = ([(leader_epoch, first_offset)]
                      if leader_epoch >= 0 and leader_epoch != latest_epoch else [])
            self._append(view, batches, epochs, offset, record_count, now_ms)
            self._on_appended(view, batches, producer_batches or has_markers, offset)
            return AppendInfo(first_offset, offset - 1, record_count, max_timestamp, len(buf),
                              now_ms if log_append_time else -1, offset_of_max)

    def _check_transactional(self, buf: BytesLike, position: int, fields: tuple[Any, ...],
                             markers_allowed: bool) -> None:
        """(lock held) A transactional batch needs a producer id; a control batch is the
        coordinator's only and must hold a marker its producer's state accepts."""
        if fields[9] < 0:
            raise InvalidRecordError(f"a transactional or control batch without a producer "
                                     f"id at position {position}")
        if not fields[5] & CONTROL_MASK:
            return
        if not markers_allowed:
            raise InvalidRecordError("clients cannot produce control batches")
        header = read_header(buf, position)
        marker = marker_of_batch(buf, position, header)
        if marker is None or header.record_count != 1:
            raise InvalidRecordError(f"the control batch at position {position} does not "
                                     "hold one transaction marker")
        self.producer_state.check_marker(header.producer_id, header.producer_epoch,
                                         marker.coordinator_epoch)

    @staticmethod
    def batch_bounds(records: BytesLike) -> Iterator[tuple[int, int, int]]:
        """(position, base offset, next offset) of each whole batch of a fetched chunk."""
        for position, header in iter_batches(records, validate=False):
            yield position, header.base_offset, header.next_offset

    def append_as_follower(self, records: BytesLike, now_ms: int) -> AppendInfo:
        """Validate and append the leader's batches as they are (offsets, epochs)."""
        with self._lock:
            self._check_usable()
            self._check_append_size(len(records))
            view = memoryview(records)
            offset = first_offset = self._segments[-1].next_offset
            gaps = self.config.compact  # a compacted leader sends batches with gaps between
            batches = []
            epochs: list[tuple[int, int]] = []
            last_epoch = self.leader_epoch_cache.latest_epoch
            record_count = 0
            max_timestamp, offset_of_max = -1, -1
            position, end = 0, len(view)
            has_producer_batches = False
            while position < end:
                fields = _checked_header(view, view, position, end, None)
                has_producer_batches = has_producer_batches or fields[9] >= 0
                base_offset, size, epoch = fields[0], LOG_OVERHEAD + fields[1], fields[2]
                if base_offset != offset and not (gaps and base_offset > offset):
                    raise UnexpectedAppendOffsetError(
                        f"follower batch at offset {base_offset}, expected {offset} "
                        f"(log end offset {first_offset})")
                last_offset = base_offset + fields[6]
                batch_max_timestamp = fields[8]
                batches.append((position, size, last_offset, batch_max_timestamp))
                if batch_max_timestamp > max_timestamp:
                    max_timestamp, offset_of_max = batch_max_timestamp, last_offset
                if epoch >= 0 and epoch != last_epoch:
                    epochs.append((epoch, base_offset))
                    last_epoch = epoch
                record_count += fields[12]
                offset = last_offset + 1
                position += size
            if not batches:
                return self._empty_append_info()
            self._append(view, batches, epochs, offset, record_count, now_ms)
            self._on_appended(view, batches, has_producer_batches, offset)
            return AppendInfo(first_offset, offset - 1, record_count, max_timestamp, len(view),
                              -1, offset_of_max)

    def _on_appended(self, data: BytesLike, batches: list[tuple[int, int, int, int]],
                     producer_batches: object, next_offset: int) -> None:
        """The producers' state after an append (lock held): every written batch that
        carries a producer id is recorded, as a follower and recovery record them."""
        state = self.producer_state
        if producer_batches:
            for position, _size, last_offset, batch_max_timestamp in batches:
                header = read_header(data, position)
                if header.producer_id >= 0:
                    self._on_producer_batch(data, position, header, last_offset,
                                            batch_max_timestamp)
        state.on_batches_end(next_offset)

    def _on_producer_batch(self, data: BytesLike, position: int, header: BatchHeader,
                           last_offset: int, max_timestamp: int) -> None:
        """(lock held) One batch with a producer id, now in the log: the producer's state,
        and for an ABORT marker the ``.txnindex`` entry. A marker that does not decode
        (the leader checked it; bit rot would have failed the CRC) ends nothing."""
        state = self.producer_state
        attributes = header.attributes
        if not attributes & CONTROL_MASK:
            state.on_batch(header.producer_id, header.producer_epoch, header.base_sequence,
                           header.base_offset, last_offset, max_timestamp,
                           is_transactional=bool(attributes & TRANSACTIONAL_MASK))
            return
        try:
            marker = marker_of_batch(data, position, header)
        except (CorruptRecordError, ValueError) as e:
            log.warning("%s: control batch at %d does not decode: %s", self.dir,
                        header.base_offset, e)
            return
        if marker is None:
            return
        completed = state.on_marker(header.producer_id, header.producer_epoch,
                                    header.base_offset, max_timestamp,
                                    committed=marker.committed,
                                    coordinator_epoch=marker.coordinator_epoch)
        if completed is not None and completed.is_aborted:
            self._index_aborted(completed)

    def _index_aborted(self, completed: CompletedTxn) -> None:
        i = bisect_right(self._base_offsets, completed.last_offset) - 1
        entry = AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset,
                           self.producer_state.last_stable_offset_after(completed))
        self.txn_indexes.add(self._base_offsets[max(i, 0)], entry)

    # -- transactions ----------------------------------------------------------

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none open)."""
        with self._lock:
            return self.producer_state.first_unstable_offset

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions a read of [start_offset, end_offset) overlaps."""
        with self._lock:
            return self.txn_indexes.aborted_between(start_offset, end_offset)

    def _check_append_size(self, size: int) -> None:
        # Kafka's RecordBatchTooLargeException: an append must fit in one segment.
        if size > self.config.segment_bytes:
            raise RecordListTooLargeError(
                f"{size} bytes in one append exceed segment.bytes {self.config.segment_bytes}")

    def _empty_append_info(self) -> AppendInfo:
        leo = self.log_end_offset
        return AppendInfo(leo, leo - 1, 0, -1, 0, -1, -1)

    def _append(self, data: BytesLike, batches: list[tuple[int, int, int, int]],
                epochs: list[tuple[int, int]], next_offset: int, record_count: int,
                now_ms: int) -> None:
        segment = self._segments[-1]
        if self._should_roll(segment, len(data), next_offset - 1, now_ms):
            self._roll(now_ms)
            segment = self._segments[-1]
        old_log_end_offset = segment.next_offset
        cache = self.leader_epoch_cache
        try:
            # Entries at the old end dropped in memory only at opening (epoch_cache.py)
            # must leave the file before the log grows past them.
            cache.write_if_pending()
            for epoch, start_offset in epochs:
                cache.assign(epoch, start_offset)
            segment.append(data, batches, next_offset, now_ms)
        except KafkaStorageError as e:
            # Undo: the cache may hold entries for offsets that were never written.
            try:
                if epochs:
                    cache.truncate_from_end(old_log_end_offset)
            except KafkaStorageError as undo_error:
                self._go_offline(undo_error)
            if self.active_segment.size_bytes != _file_size(self.active_segment):
                self._go_offline(e)
            raise
        self._unflushed_messages += record_count
        flush_messages, flush_ms = self.config.flush_messages, self.config.flush_ms
        if ((flush_messages is not None and self._unflushed_messages >= flush_messages)
                or (flush_ms is not None and now_ms - self._last_flush_ms >= flush_ms)):
            self._flush(now_ms, indexes=False)

    # -- rolling -------------------------------------------------------------

    def _should_roll(self, segment: LogSegment, append_bytes: int, last_offset: int,
                     now_ms: int) -> bool:
        size = segment.size_bytes
        if not size:
            return False
        config = self.config
        first_batch_time_ms = segment.first_batch_time_ms
        return (size + append_bytes > config.segment_bytes
                or (first_batch_time_ms is not None
                    and now_ms - first_batch_time_ms > config.roll_ms)
                or segment.indexes_full
                or last_offset - segment.base_offset > RELATIVE_OFFSET_MAX)

    def maybe_roll(self, now_ms: int) -> None:
        """Roll the active segment if segment.ms (``LogConfig.roll_ms``) has passed
        (called periodically)."""
        with self._lock:
            self._check_usable()
            segment = self.active_segment
            if (segment.size_bytes and segment.first_batch_time_ms is not None
                    and now_ms - segment.first_batch_time_ms > self.config.roll_ms):
                self._roll(now_ms)

    def roll(self, now_ms: int) -> None:
        """Start a new segment at the LEO now (no-op if the active segment is empty).
        The rolled segment is flushed in the background (see ``_roll``)."""
        with self._lock:
            self._check_usable()
            if self.active_segment.size_bytes:
                self._roll(now_ms)

    def _roll(self, now_ms: int) -> None:
        """Create the new segment; no fsync here (this runs inside an append, under the
        lock, on the event loop). As Kafka's ``UnifiedLog.roll`` schedules "flush-log",
        the flush of the rolled segment (data, indexes, the directory) runs in the
        flush executor, without the lock, and moves the recovery point to the new
        segment's base when it is done (``flush_outside_lock(end_offset=...)``)."""
        old = self.active_segment
        try:
            old.on_become_inactive()
            new = LogSegment.create(self.dir, old.next_offset, self.config)
        except KafkaStorageError as e:
            self._go_offline(e)
            raise
        self._segments = [*self._segments, new]
        self._base_offsets = [*self._base_offsets, new.base_offset]
        self._rolls += 1
        # Kafka's roll snapshot: a restart rebuilds the producers from here on. Its
        # fsync is the background flush's (below), with the rolled segment's.
        self._write_producer_snapshot(sync=False)
        if not self._awaits_flush(old):  # rolled before, then truncated back into
            self._rolled_unflushed.append(old)
        executor = self._flush_executor or _roll_flusher()
        try:
            executor.submit(self._flush_rolled, new.base_offset)
        except RuntimeError:  # the executor is shut down (interpreter exit)
            log.warning("%s: no background flush after the roll to %d; the next flush, "
                        "close or recovery covers it", self.dir, new.base_offset)

    def _flush_rolled(self, end_offset: int) -> None:
        """The background half of a roll (in the flush executor's thread)."""
        try:
            _fsync_file(self.dir / snapshot_file_name(end_offset))  # the directory: below
        except KafkaStorageError as e:  # only the snapshot is in doubt: an older one serves
            log.warning("%s: producer snapshot at %d not synced: %s", self.dir, end_offset, e)
        # The rolled segments' aborted transactions, durable with the snapshot that covers
        # them: a replay after a crash starts at that snapshot and would not re-add them.
        with self._lock:
            rolled_bases = [b for b in self._base_offsets if b < end_offset]
        for base in rolled_bases[-2:]:  # the one rolled now, and one a quick roll left
            path = txn_index_path(self.dir, base)
            if path.exists():
                try:
                    _fsync_file(path)
                except KafkaStorageError as e:
                    log.warning("%s: transaction index not synced: %s", self.dir, e)
        try:
            self.flush_outside_lock(end_offset=end_offset)
        except KafkaStorageError:
            pass  # the log went offline and said why; the next open recovers it
        except InvariantViolation as e:
            # A bug, not a disk error: nobody waits for this job, so it must not end in a
            # log line; the broker stops, as on a broken invariant anywhere else.
            log.critical("flushing the rolled segments of %s broke an invariant", self.dir,
                         exc_info=e)
            if self._on_background_failure is None:
                raise  # no owner to stop (a tool or test): the executor's future holds it
            self._on_background_failure(e)
        except Exception:  # a bug: nobody waits for this job, so say it loudly here
            log.exception("flushing the rolled segments of %s failed", self.dir)

    # -- reads ---------------------------------------------------------------

    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_batch: bool = True) -> ReadResult:
        """Whole batches from the one holding ``start_offset``, up to ``max_bytes``.

        Only batches with base offset < ``max_offset`` (exclusive; the HW for
        consumers). At least one batch if ``min_one_batch``, even past max_bytes.
        OffsetOutOfRangeError outside [log_start_offset, log_end_offset].

        Each batch is checked (framing, contiguous offsets, CRC-32C) and damaged bytes
        are never returned: the read ends before a damaged batch and names it in
        ``ReadResult.corrupt``, or raises CorruptBatchError if it is the first one
        (see ``corruption.py``; the caller reports it).
        """
        with self._lock:
            self._check_usable()
            log_end_offset = self.log_end_offset
            if start_offset < self.log_start_offset or start_offset > log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {start_offset} outside [{self.log_start_offset}, {log_end_offset}]")
            i = bisect_right(self._base_offsets, start_offset) - 1
            empty_batches, empty_first = b"", start_offset  # see _only_empty_batches
            while 0 <= i < len(self._segments) and start_offset < log_end_offset:
                segment = self._segments[i]
                found = segment.read(start_offset, max_bytes - len(empty_batches), max_offset,
                                     min_one_batch)
                self._note_index_use(segment)
                if found is not None:
                    data, first_offset, next_offset, corrupt = found
                    if (data and corrupt is None and self.config.compact
                            and len(empty_batches) + len(data) < max_bytes
                            and _only_empty_batches(data)):
                        # A compacted segment may end in batches the cleaner emptied: a
                        # consumer given nothing but those takes it for a record too large
                        # to fetch (librdkafka), so the read goes on into the next segment.
                        if not empty_batches:
                            empty_first = first_offset
                        empty_batches += data
                        start_offset, i = next_offset, i + 1
                        continue
                    if empty_batches:
                        return ReadResult(empty_batches + data, empty_first,
                                          next_offset if data else start_offset, corrupt)
                    return ReadResult(data, first_offset, next_offset if data else start_offset,
                                      corrupt)
                i += 1
            if empty_batches:
                return ReadResult(empty_batches, empty_first, start_offset)
            return ReadResult(b"", start_offset, start_offset)

    def _note_index_use(self, segment: LogSegment) -> None:
        """Keep at most INACTIVE_INDEXES_LOADED_MAX inactive segments' indexes in memory."""
        if segment is self._segments[-1] or not segment.indexes_loaded:
            return
        loaded = self._loaded_inactive
        if segment in loaded:
            return
        loaded.append(segment)
        while len(loaded) > INACTIVE_INDEXES_LOADED_MAX:
            oldest = loaded.popleft()
            # A rolled segment not yet flushed keeps its indexes until the flush has
            # written them (releasing would write and fsync them here, under the lock).
            if oldest is not self._segments[-1] and not self._awaits_flush(oldest):
                oldest.release_indexes()

    def fetch_offset_by_timestamp(self, timestamp_ms: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader_epoch) of the first record with timestamp >=
        ``timestamp_ms``; None if there is none. -2: log start, -1: log end, -3: the
        first record with the largest timestamp (KIP-734; None for an empty log)."""
        with self._lock:
            self._check_usable()
            cache = self.leader_epoch_cache
            if timestamp_ms == MAX_TIMESTAMP:
                # Segment maxima bound every record's timestamp, so the first record at
                # or above the largest of them is the one with the largest timestamp.
                timestamp_ms = max((s.max_timestamp for s in self._segments), default=-1)
                if timestamp_ms < 0:
                    return None
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return (self.log_start_offset, -1,
                        cache.epoch_for_offset(self.log_start_offset))
            if timestamp_ms == LATEST_TIMESTAMP:
                return self.log_end_offset, -1, cache.latest_epoch
            for segment in self._segments:
                if segment.max_timestamp < timestamp_ms:
                    continue
                found = segment.find_offset_by_timestamp(timestamp_ms, self.log_start_offset)
                self._note_index_use(segment)
                if found is None:
                    continue
                position, base_offset, max_timestamp, epoch = found
                return self._exact_offset_for_timestamp(segment, position, timestamp_ms,
                                                        base_offset, max_timestamp, epoch)
            return None

    def _exact_offset_for_timestamp(self, segment: LogSegment, position: int, timestamp_ms: int,
                                    base_offset: int, max_timestamp: int,
                                    epoch: int) -> tuple[int, int, int]:
        # The batch is found from headers; the record inside needs a decode.
        try:
            _header, records = decode_batch(segment.read_batch_at(position))
        except (CorruptRecordError, ValueError) as e:
            log.warning("cannot decode batch at %s:%d for a timestamp lookup: %s",
                        segment.log_path, position, e)
            return max(base_offset, self.log_start_offset), max_timestamp, epoch
        for record in records:
            if record.timestamp >= timestamp_ms and record.offset >= self.log_start_offset:
                return record.offset, record.timestamp, epoch
        return max(base_offset, self.log_start_offset), max_timestamp, epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # -- truncation and retention --------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Drop every batch holding offsets >= ``offset`` (a batch straddling it goes
        whole, so the LEO may end below ``offset``); epoch cache follows."""
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        with self._lock:
            self._check_usable()
            if offset < self.log_start_offset:
                self._truncate_fully_and_start_at(offset)
                return
            try:
                if offset < self.log_end_offset:
                    self._truncate_segments(offset)
                    # A straddling batch went whole: entries from the new LEO on go too.
                    self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
                else:
                    self.leader_epoch_cache.truncate_from_end(offset)  # Kafka does, even here
                self.txn_indexes.truncate_to(self.log_end_offset)
                if self.producer_state.map_end_offset > self.log_end_offset:
                    self._reload_producer_state(None)
            except KafkaStorageError as e:
                self._go_offline(e)
                raise
            self.recovery_point = min(self.recovery_point, self.log_end_offset)

    def _truncate_segments(self, offset: int) -> None:
        self._truncations += 1  # before the cut: a flush in progress must not publish
        keep = max(1, bisect_right(self._base_offsets, offset - 1))
        doomed = self._segments[keep:]
        self._segments = self._segments[:keep]
        self._base_offsets = self._base_offsets[:keep]
        for segment in reversed(doomed):
            segment.delete()
        active = self.active_segment
        active.truncate_to(offset)
        active.flush()  # the cut must be durable before anything new is written
        if doomed:
            fsync_dir(self.dir)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything; the log restarts empty at ``offset`` (start = LEO = offset)."""
        if offset < 0:
            raise ValueError(f"cannot start a log at negative offset {offset}")
        with self._lock:
            self._check_usable()
            self._truncate_fully_and_start_at(offset)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._truncations += 1  # before the cut: a flush in progress must not publish
        try:
            # Newest first: a crash midway leaves a prefix of the old log, never a gap.
            for segment in reversed(self._segments):
                segment.delete()
            self._segments, self._base_offsets = [], []
            new = LogSegment.create(self.dir, offset, self.config)
            self._segments, self._base_offsets = [new], [offset]
            fsync_dir(self.dir)
            self.leader_epoch_cache.clear()
            self._delete_producer_snapshots(lambda _offset: True)
            self.producer_state.clear(offset)
            self.txn_indexes.clear()
        except KafkaStorageError as e:
            self._go_offline(e)
            raise
        self.log_start_offset = offset
        self.recovery_point = offset
        self._unflushed_messages = 0

    def delete_old_segments(self, now_ms: int, high_watermark: int) -> int:
        """Retention: delete the oldest segments past retention.ms or beyond
        retention.bytes, only those entirely below ``high_watermark`` and never the
        active one. Returns how many were deleted.

        Under the lock the files are only renamed (``.deleted``); they are unlinked
        in a background thread afterwards, so freeing GiBs never holds up appends."""
        with self._lock:
            self._check_usable()
            config = self.config
            if not config.delete:
                return 0  # cleanup.policy=compact: the cleaner removes records, not retention
            total_bytes = self.size_bytes
            deletable = 0
            for i in range(len(self._segments) - 1):
                segment = self._segments[i]
                if self._segments[i + 1].base_offset <= self.log_start_offset:
                    # Entirely below the log start (DeleteRecords): Kafka's
                    # deleteLogStartOffsetBreachedSegments, whatever the retention.
                    total_bytes -= segment.size_bytes
                    deletable += 1
                    continue
                if self._segments[i + 1].base_offset > high_watermark:
                    break
                expired = config.retention_ms >= 0 and (
                    now_ms - self._largest_timestamp(segment) > config.retention_ms)
                too_big = (config.retention_bytes >= 0
                           and total_bytes - segment.size_bytes >= config.retention_bytes)
                if not (expired or too_big):
                    break
                total_bytes -= segment.size_bytes
                deletable += 1
            renamed = self._delete_oldest(deletable) if deletable else []
        if renamed:
            unlink_in_background(renamed, name=f"retention-{self.dir.name}")
        return deletable

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset`` (DeleteRecords on a leader, or a
        follower following its leader's; Kafka's ``maybeIncrementLogStartOffset``).
        Whether ``offset`` is allowed (at most the HW) is the caller's decision; it must
        be at most the LEO. Returns whether the start moved.

        Only memory and the epoch cache (fsynced) change here: the records below stay
        on disk until retention deletes the segments entirely below the new start, and
        the caller writes the log-start checkpoint (``LogManager``) to make it durable.
        A read below the new start is OFFSET_OUT_OF_RANGE at once; a read at it returns
        the whole batch holding it (consumers skip the records before their offset)."""
        with self._lock:
            self._check_usable()
            if offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot move the log start of {self.dir.name} to {offset}: past the "
                    f"log end offset {self.log_end_offset}")
            if offset <= self.log_start_offset:
                return False
            try:
                self.leader_epoch_cache.truncate_from_start(offset)
            except KafkaStorageError as e:
                self._go_offline(e)
                raise
            self.log_start_offset = offset
            log.info("%s: log start offset moved to %d", self.dir.name, offset)
            return True

    def _largest_timestamp(self, segment: LogSegment) -> int:
        if segment.max_timestamp >= 0:
            return segment.max_timestamp
        try:  # no batch timestamps: Kafka falls back to the file's mtime
            return int(os.stat(segment.log_path).st_mtime * 1000)
        except OSError as e:
            raise storage_error("cannot stat segment", segment.log_path, e) from e

    def _delete_oldest(self, count: int) -> list[Path]:
        """Drop the ``count`` oldest segments; returns their renamed files to unlink."""
        doomed = self._segments[:count]
        new_start = self._segments[count].base_offset
        renamed: list[Path] = []
        try:
            # Start offset first: a crash after it but before the files go only
            # leaves extra old data, which the next retention pass removes.
            self.log_start_offset = max(self.log_start_offset, new_start)
            self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
            self._segments = self._segments[count:]
            self._base_offsets = self._base_offsets[count:]
            # Producers stay (they expire by time); their snapshots below the start go.
            start = self.log_start_offset
            self._delete_producer_snapshots(lambda offset: offset < start)
            for segment in doomed:
                log.info("retention: deleting %s (%d bytes)", segment.log_path, segment.size_bytes)
                renamed += segment.rename_for_deletion()  # its .txnindex too
            self.txn_indexes.forget_segments(s.base_offset for s in doomed)
        except KafkaStorageError as e:
            self._go_offline(e)
            raise
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        return renamed

    # -- idempotent producers ------------------------------------------------

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms (wall-clock ``now_ms``)."""
        with self._lock:
            return self.producer_state.remove_expired(now_ms)

    def producer_snapshot_offsets(self) -> list[int]:
        """Offsets of the ``<offset>.snapshot`` files in the directory, ascending."""
        try:
            names = os.listdir(self.dir)
        except OSError as e:
            raise storage_error("cannot list log directory", self.dir, e) from e
        return sorted(o for o in map(parse_snapshot_file_name, names) if o is not None)

    def _write_producer_snapshot(self, *, sync: bool) -> None:
        """(lock held) Snapshot the producers at the LEO. Without ``sync`` (a roll, on the
        event loop) the file is written but not fsynced; a torn one fails its CRC on
        open and an older snapshot is used instead, so a failure here only warns."""
        state = self.producer_state
        offset = self.log_end_offset
        if state.map_end_offset != offset:
            return  # not a state of the whole log (cannot happen: every append updates it)
        path = self.dir / snapshot_file_name(offset)
        data = state.snapshot_bytes()
        try:
            if sync:
                write_file_atomically(path, data)
            else:
                path.write_bytes(data)
        except (OSError, KafkaStorageError) as e:
            log.warning("%s: no producer snapshot at %d: %s", self.dir, offset, e)

    def _delete_producer_snapshots(self, doomed: Callable[[int], bool]) -> None:
        for offset in self.producer_snapshot_offsets():
            if doomed(offset):
                path = self.dir / snapshot_file_name(offset)
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:
                    raise storage_error("cannot delete producer snapshot", path, e) from e

    def _reload_producer_state(self, now_ms: int | None) -> None:
        """(lock held) The producers as of the LEO: the latest readable snapshot at or
        below it (later ones are deleted: a truncation cut their batches), then every
        batch after it. ``now_ms`` (wall clock): drop producers already expired."""
        log_end_offset = self.log_end_offset
        self._delete_producer_snapshots(lambda offset: offset > log_end_offset)
        state = self.producer_state
        state.clear(self.log_start_offset)
        loaded = False
        for offset in reversed(self.producer_snapshot_offsets()):
            path = self.dir / snapshot_file_name(offset)
            try:
                state.load_snapshot(path.read_bytes(), offset, path=str(path), now_ms=now_ms)
                loaded = True
                break
            except CorruptFileError as e:
                log.warning("%s; deleting it", e)
                path.unlink(missing_ok=True)
            except OSError as e:
                raise storage_error("cannot read producer snapshot", path, e) from e
        offset = max(state.map_end_offset, self.log_start_offset)
        if not loaded:
            # No snapshot at all: segments closed before the active one were written before
            # producer state existed (every roll since leaves a snapshot), as Kafka assumes
            # when it upgrades a log: only the active segment is read, not GiBs of log.
            offset = max(offset, self._segments[-1].base_offset)
        while offset < log_end_offset:
            try:
                result = self.read(offset, PRODUCER_STATE_READ_BYTES)
            except CorruptBatchError as e:
                log.warning("%s: producer state rebuilt up to offset %d only: %s", self.dir,
                            offset, e)
                break
            records = result.records
            position = 0
            while position < len(records):
                header = read_header(records, position)
                if header.producer_id >= 0:
                    self._on_producer_batch(records, position, header, header.last_offset,
                                            header.max_timestamp)
                position += header.size
            if result.corrupt is not None or result.next_offset <= offset:
                break
            offset = result.next_offset
        state.map_end_offset = log_end_offset

    # -- compaction ------------------------------------------------------------

    @property
    def truncations(self) -> int:
        """Cuts so far: the cleaner's snapshot of the segments is stale once it changed."""
        return self._truncations

    def replace_with_cleaned(self, old: list[LogSegment], cleaned: LogSegment, truncations: int,
                             swap_in: Callable[[LogSegment, list[LogSegment]], list[Path]],
                             *, removed_aborts: set[int] | frozenset[int] = frozenset(),
                             ) -> list[Path] | None:
        """Swap ``cleaned`` in for the consecutive closed segments ``old`` (``swap_in`` does
        the renames: ``cleaner_swap.py``), under the lock. None, with nothing done, when
        the log changed since the cleaner read it (a cut, retention, closed). Returns the
        old files, renamed ``.deleted``, to unlink without the lock. ``removed_aborts``:
        offsets of ABORT markers the cleaner removed; their ``.txnindex`` entries go too
        (an entry without its marker would hide the producer's later batches)."""
        with self._lock:
            if (self._closed or self._offline_reason is not None
                    or self._truncations != truncations or not old):
                return None
            i = bisect_right(self._base_offsets, old[0].base_offset) - 1
            current = self._segments[i:i + len(old)]
            if (i < 0 or len(current) != len(old)
                    or any(a is not b for a, b in zip(current, old, strict=True))
                    or i + len(old) >= len(self._segments)):  # never the active segment
                return None
            try:
                renamed = swap_in(cleaned, old)
                # The old segments' .txnindex files went with them; their entries stay
                # true of the cleaned one (markers and transactional batches are kept).
                self.txn_indexes.merge_into(cleaned.base_offset,
                                            [o.base_offset for o in old],
                                            dropped=removed_aborts)
            except KafkaStorageError as e:
                self._go_offline(e)
                raise
            self._segments = [*self._segments[:i], cleaned, *self._segments[i + len(old):]]
            self._base_offsets = [s.base_offset for s in self._segments]
            self._loaded_inactive = deque(s for s in self._loaded_inactive
                                          if not any(s is o for o in old))
            cleaned.release_indexes()
            return renamed

    # -- flush and lifecycle -------------------------------------------------

    def flush_outside_lock(self, now_ms: int | None = None, *,
                           end_offset: int | None = None) -> bool:
        """Flush everything up to the LEO as of the call, as ``flush`` does, but fsync
        without holding the log's lock; False (nothing done) if the log is closed or
        offline. For the recovery-point checkpoint, which runs in a thread, the
        flush.ms policy (``now_ms``: the flush time it counts from) and, with
        ``end_offset`` (a segment's base offset), the flush of the segments a roll
        left behind: only those below it, and the recovery point moves to it.

        Appends and reads (the broker's event loop) take this lock: an fsync under it,
        which waits for the disk's journal while GiBs of other data are written back,
        stopped the whole broker for up to hundreds of ms. Three steps:

        1. Lock held, fast (no I/O): note the target offset, encode the index tails,
           ``dup`` the .log descriptors to fsync (``LogSegment.begin_flush``).
        2. No lock: fsync the directory if a roll created files since the last one,
           fdatasync the .log files, then write and fsync the index tails (a write to
           a file can wait for the journal too).
        3. Lock held: record what step 2 made durable, and move the recovery point to
           the target of step 1, unless the log was truncated meanwhile (the offsets
           below it may then hold new, unsynced batches; the next flush moves it).

        The recovery point thus never passes data or a file name not yet durable. Index
        entries it passes may rarely lag on disk (a flush whose index write was overtaken
        by an older snapshot's); opening rescans what an index file lacks.
        """
        with self._lock:
            if self._closed or self._offline_reason is not None:
                return False
            target = self.log_end_offset
            if end_offset is not None:
                target = min(target, end_offset)  # a truncation may have cut below it
            truncations = self._truncations
            unflushed_messages = self._unflushed_messages if end_offset is None else 0
            rolls = self._rolls
            # A later flush that moved the recovery point past ``target`` synced it.
            directory = (self.dir if rolls != self._dir_synced_rolls
                         and self.recovery_point < target else None)
            jobs = []
            try:
                for segment in self._segments_to_flush(None if end_offset is None else target):
                    if segment.needs_flush:
                        jobs.append(segment.begin_flush())
            except KafkaStorageError as e:
                for job in jobs:
                    job.close()
                self._go_offline(e)
                raise
        try:
            if directory is not None:
                fsync_dir(directory)
            for job in jobs:
                job.sync()
        except KafkaStorageError as e:
            for job in jobs:
                job.close()  # the jobs not synced still hold a dup'ed descriptor
            with self._lock:
                if self._closed:
                    return False  # deleted meanwhile: its directory was renamed or removed
                self._go_offline(e)
            raise
        with self._lock:
            if self._closed or self._offline_reason is not None:
                return False  # close flushed under the lock itself; offline stays offline
            for job in jobs:
                job.segment.end_flush(job)
            if directory is not None:
                self._dir_synced_rolls = max(self._dir_synced_rolls, rolls)
            if self._truncations == truncations:
                self.recovery_point = max(self.recovery_point, target)
                self._unflushed_messages = max(0, self._unflushed_messages - unflushed_messages)
            if now_ms is not None:
                self._last_flush_ms = now_ms
            self._release_flushed_rolled()
            return True

    def _segments_from_recovery_point(self) -> list[LogSegment]:
        """The segment holding the recovery point and every later one (lock held)."""
        return self._segments[max(0, bisect_right(self._base_offsets, self.recovery_point) - 1):]

    def _segments_to_flush(self, end_offset: int | None) -> list[LogSegment]:
        """(lock held) The segments from the recovery point's on, those starting below
        ``end_offset`` only (None: all), after the rolled segments whose indexes are
        not written yet (a flush.messages flush may have moved the recovery point past
        them with their data only)."""
        segments = self._segments_from_recovery_point()
        if end_offset is not None:
            segments = [s for s in segments if s.base_offset < end_offset]
        first = segments[0].base_offset if segments else end_offset
        earlier = [s for s in self._rolled_unflushed
                   if self._holds(s) and (first is None or s.base_offset < first)]
        return earlier + segments

    def holds_closed_segment(self, segment: LogSegment, truncations: int) -> bool:
        """``segment`` is still one of this log's closed (not active) segments and was not
        cut since its ``truncations`` count was read: bytes read from it without the lock
        meanwhile are its bytes (the scrub checks this before it reports damage)."""
        with self._lock:
            return (not self._closed and self._offline_reason is None and self._holds(segment)
                    and segment is not self._segments[-1] and segment.truncations == truncations)

    def _holds(self, segment: LogSegment) -> bool:
        """``segment`` is still one of the log's (not deleted or truncated away)."""
        i = bisect_right(self._base_offsets, segment.base_offset) - 1
        return i >= 0 and self._segments[i] is segment

    def _awaits_flush(self, segment: LogSegment) -> bool:
        return any(s is segment for s in self._rolled_unflushed)

    def _release_flushed_rolled(self) -> None:
        """Drop from memory the indexes of rolled segments a flush has written (lock
        held; no I/O: their files are complete)."""
        if not self._rolled_unflushed:
            return
        active = self._segments[-1]
        waiting = []
        for segment in self._rolled_unflushed:
            if segment is active or not self._holds(segment):
                continue  # active again after a truncation, or deleted
            if segment.needs_flush:
                waiting.append(segment)
            else:
                segment.release_indexes()
        self._rolled_unflushed = waiting

    def flush(self, now_ms: int | None = None) -> None:
        """fsync everything up to the LEO; the recovery point becomes the LEO."""
        with self._lock:
            self._check_usable()
            self._flush(now_ms)

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush if flush.ms has passed with unflushed data (called periodically).
        The fsyncs run outside the log's lock (``flush_outside_lock``)."""
        with self._lock:
            self._check_usable()
            flush_ms = self.config.flush_ms
            if not (flush_ms is not None and self.recovery_point < self.log_end_offset
                    and now_ms - self._last_flush_ms >= flush_ms):
                return False
        return self.flush_outside_lock(now_ms)

    def _flush(self, now_ms: int | None, *, indexes: bool = True) -> None:
        try:
            self._flush_segments(indexes=indexes)
        except KafkaStorageError as e:
            self._go_offline(e)
            raise
        self._unflushed_messages = 0
        if now_ms is not None:
            self._last_flush_ms = now_ms

    def _flush_segments(self, *, indexes: bool = True) -> None:
        """Flush (lock held) the segments from the recovery point's on, and rolled ones
        not flushed yet, and the directory if a roll created files since its last
        fsync; the recovery point becomes the LEO.

        ``indexes=False`` (the flush.messages / flush.ms policy) fsyncs only the .log
        data: index files are written by a roll's background flush, checkpoint and
        close. A trusted segment whose index lags after a crash is still read right:
        loading scans (with CRC) every batch after the last index entry on disk.
        """
        for segment in self._segments_to_flush(None):
            if not indexes:
                segment.flush_data()
            elif segment.needs_flush:
                segment.flush()
        if self._rolls != self._dir_synced_rolls:
            fsync_dir(self.dir)
            self._dir_synced_rolls = self._rolls
        self.recovery_point = max(self.recovery_point, self.log_end_offset)
        if indexes:
            self._release_flushed_rolled()

    def update_config(self, config: LogConfig) -> None:
        """New topic configs apply to later appends, rolls and retention passes."""
        with self._lock:
            if config.compact and not self.config.compact:
                mark_compacted(self.dir)  # durable before any gap arrives (cleaner_swap.py)
            self.config = config
            for segment in self._segments:
                segment.config = config

    def close(self) -> None:
        """Flush and close the files; the log can no longer be used."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._offline_reason is None:
                    self._flush(None)
                    self.active_segment.on_become_inactive()
                    self.active_segment.flush()
                    self.txn_indexes.sync()
                    self._write_producer_snapshot(sync=True)  # a clean open reads no batch
            finally:
                self._closed = True
                for segment in self._segments:
                    try:
                        segment.close()
                    except KafkaStorageError as e:
                        log.error("%s", e)

    def delete(self, *, in_background: bool = False, rename_to: Path | None = None,
               keep_files: bool = False) -> None:
        """Close without flushing and remove the whole directory.

        ``rename_to`` first renames the directory there, under the log's lock with
        the close: a roll or a flush in another thread then never sees the old path
        gone while the log still looks open (it would take the log offline).
        ``in_background`` removes the files in a daemon thread: for a directory
        already renamed out of the way (a ``-delete`` dir that loading removes
        anyway), so deleting GiBs never stalls the caller's event loop.
        ``keep_files`` leaves the (renamed) directory for the caller to remove
        (``LogManager`` hands it to its ``LogDirDeleter``).
        """
        with self._lock:
            if rename_to is not None:
                try:
                    os.rename(self.dir, rename_to)
                except OSError as e:
                    raise storage_error("cannot rename log for deletion", self.dir, e) from e
                self.dir = rename_to
            self._closed = True
            close_segments_quietly(self._segments)
            if keep_files:
                return
            if in_background:
                threading.Thread(target=shutil.rmtree, args=(self.dir,),
                                 kwargs={"ignore_errors": True}, daemon=True,
                                 name=f"delete-{self.dir.name}").start()
                return
            try:
                shutil.rmtree(self.dir)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise storage_error("cannot delete log directory", self.dir, e) from e

    def __repr__(self) -> str:
        return (f"Log({self.dir}, start={self.log_start_offset}, end={self.log_end_offset}, "
                f"segments={len(self._segments)})")


def _checked_header(buf: BytesLike, view: memoryview, position: int, end: int,
                    max_size: int | None) -> tuple[Any, ...]:
    """The header fields (``_HEADER_FIELDS`` order) of a batch that passes framing,
    magic and CRC checks. The fast path builds no objects; on any failure
    ``validate_batch`` says precisely what is wrong (MessageTooLargeError when too big)."""
    if end - position >= HEADER_SIZE:
        fields = _unpack_header(buf, position)
        size = LOG_OVERHEAD + fields[1]
        if (fields[1] >= BATCH_LENGTH_MIN and size <= end - position
                and (max_size is None or size <= max_size)
                and fields[3] == MAGIC_V2 and fields[6] >= 0 and fields[12] >= 0
                and crc32c(view[position + ATTRIBUTES_OFFSET:position + size]) == fields[4]):
            return fields
    try:
        validate_batch(buf, position, max_size=max_size)
    except CorruptRecordError as e:
        if e.too_large:
            raise MessageTooLargeError(e.reason) from None
        raise
    # validate_batch checks the same conditions, so it raised; keep a typed error anyway.
    raise CorruptRecordError("malformed batch", position=position)


def _only_empty_batches(data: BytesLike) -> bool:
    """Every batch in ``data`` (whole, checked batches) holds no record (recordCount 0)."""
    position, end = 0, len(data)
    while position < end:
        fields = _unpack_header(data, position)
        if fields[12]:
            return False
        position += LOG_OVERHEAD + fields[1]
    return True


def _set_log_append_time(buf: bytearray, position: int, size: int, attributes: int,
                         now_ms: int) -> None:
    """Mark the batch LogAppendTime with maxTimestamp = now; these lie inside the CRC."""
    attributes_struct, timestamp_struct = _ATTRIBUTES_AND_MAX_TIMESTAMP
    attributes_struct.pack_into(buf, position + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    timestamp_struct.pack_into(buf, position + _MAX_TIMESTAMP_AT, now_ms)
    crc = crc32c(memoryview(buf)[position + ATTRIBUTES_OFFSET:position + size])
    _CRC.pack_into(buf, position + _CRC_AT, crc)


_roll_flusher_executor: ThreadPoolExecutor | None = None
_roll_flusher_lock = threading.Lock()


def _roll_flusher() -> Executor:
    """The process's one "flush-log" thread (Kafka's scheduler job of that name): the
    flushes of rolled segments, one at a time in roll order (fsyncs in parallel would
    only queue in the disk). Started on the first roll; at interpreter exit it
    finishes the queued flushes (those of closed logs do nothing)."""
    global _roll_flusher_executor
    with _roll_flusher_lock:
        if _roll_flusher_executor is None:
            _roll_flusher_executor = ThreadPoolExecutor(max_workers=1,
                                                        thread_name_prefix="flush-log")
        return _roll_flusher_executor


def drain_roll_flushes(timeout_s: float = 60.0) -> bool:
    """Wait until the process's flush-log thread has run every flush queued so far
    (it runs them in order: a no-op queued now finishes after them). False on timeout."""
    with _roll_flusher_lock:
        executor = _roll_flusher_executor
    if executor is None:
        return True
    try:
        executor.submit(lambda: None).result(timeout_s)
    except RuntimeError:  # shut down at interpreter exit: it finished its queue
        return True
    except TimeoutError:
        return False
    return True


def _forget_roll_flusher() -> None:
    global _roll_flusher_executor
    _roll_flusher_executor = None  # a forked child has no copy of the thread


os.register_at_fork(after_in_child=_forget_roll_flusher)


def unlink_in_background(paths: list[Path], *, name: str) -> None:
    """Unlink ``paths`` in a daemon thread (errors logged): the caller holds no lock
    and is maybe the event loop, which must not wait for blocks to be freed. A file
    left behind by a crash ends in ``.deleted`` and opening the log removes it."""

    def unlink_all() -> None:
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                log.warning("cannot delete %s: %s", path, e)

    threading.Thread(target=unlink_all, daemon=True, name=name).start()


def _fsync_file(path: Path) -> None:
    """fsync ``path`` if it exists (KafkaStorageError on a disk error)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError as e:
        raise storage_error("cannot open for fsync", path, e) from e
    try:
        os.fsync(fd)
    except OSError as e:
        raise storage_error("cannot fsync", path, e) from e
    finally:
        os.close(fd)


def _file_size(segment: LogSegment) -> int:
    try:
        return os.stat(segment.log_path).st_size
    except OSError:
        return -1
