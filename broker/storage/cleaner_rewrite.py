"""What a compaction keeps of each batch: the offset map and the batch filter (pure, bytes in
and bytes out, no files).

Kafka's ``LogCleaner.buildOffsetMap`` and ``MemoryRecords.filterTo``:

- The **offset map** holds, for every key in the dirty section, the offset of its
  last record there (``OffsetMap.add_batch`` over the dirty batches in order).
- A record is **kept** when it has a key, no later record of that key is in the
  map (``offset >= map[key]``, or the key is not in it), and it is not a
  tombstone (null value) whose batch's maxTimestamp is older than the tombstone
  horizon (now - ``delete.retention.ms``). A record without a key is removed
  (Kafka refuses such records on a compacted topic; the cleaner drops them).
- A batch with every record kept is written back **byte for byte**. One with some
  kept is re-encoded through the one batch encoder (``proto/batch_builder.py``)
  with its baseOffset, partitionLeaderEpoch, attributes (compression, timestamp
  type), baseTimestamp, maxTimestamp, producer id/epoch, baseSequence and
  lastOffsetDelta unchanged and each record at its original offset delta, so the
  offsets, the epochs, the producer's sequence numbers and the time index stay
  what they were, with a new CRC. A batch with no record kept is removed, except
  (as an empty batch, ``recordCount`` 0) when it is its producer's last batch in the
  log (Kafka keeps it so the producer's idempotence state survives) or when the
  caller asks to keep it (the last batch of a cleaned group: the cleaned segment
  then ends where the group did; ``cleaner_swap.py`` relies on it).
- Transactions (Kafka's ``CleanedTransactionMetadata``). The cleaner never
  reaches the last stable offset (``cleaner.py``: an open transaction may still
  abort). A batch of an **aborted** transaction (its producer's, from the
  transaction's first offset to its ABORT marker, per the ``.txnindex``:
  ``AbortedRanges``) adds nothing to the offset map (its keys must not shadow
  committed values) and is removed (an empty batch where one must stay, as
  above). A committed transaction's batches are compacted like any other.
- A **marker** (control batch) goes in two passes, as Kafka's (KIP-534's delete
  horizon): while a pass still meets a batch of its transaction (``TxnPass``)
  it is kept; the first pass that meets none stamps it, byte-for-byte the same
  record with the delete-horizon attribute bit (0x40) and baseTimestamp = now +
  ``delete.retention.ms``; a pass after that time removes it (and, for an
  ABORT, its ``.txnindex`` entry: ``TxnPass.removed_aborts``). So a consumer
  that read the transaction's data has ``delete.retention.ms`` to read its
  marker. A marker that is its producer's last batch stays (its epoch and
  coordinator epoch live on in the producer state rebuilt from the log). A
  producer snapshot taken while the transaction was open would reopen it if a
  reload started there; the reload starts at the latest snapshot, which lies
  past the marker (the cleaned segments all rolled after it), as in Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tidewater.proto.batch import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    BytesLike,
)
from tidewater.proto.batch_builder import BatchBuilder
from tidewater.proto.compression import COMPRESSION_NONE
from tidewater.proto.control_records import marker_of_batch
from tidewater.proto.records import decode_batch_records

DELETE_HORIZON_MASK = 0x40  # Kafka's attribute bit: baseTimestamp holds the delete horizon


class AbortedRanges:
    """Per producer, the offset ranges [first offset, ABORT marker] of its aborted
    transactions (from the log's ``.txnindex`` entries)."""

    def __init__(self, ranges: Iterable[tuple[int, int, int]] = ()):
        self._by_producer: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first_offset, last_offset in ranges:
            self._by_producer.setdefault(producer_id, []).append((first_offset, last_offset))

    def holds(self, header: BatchHeader) -> bool:
        """Is this a data batch of an aborted transaction?"""
        if header.attributes & CONTROL_MASK or not header.attributes & TRANSACTIONAL_MASK:
            return False
        ranges = self._by_producer.get(header.producer_id)
        if not ranges:
            return False
        offset = header.base_offset
        return any(first <= offset <= last for first, last in ranges)


class TxnPass:
    """What one cleaning pass (every group, in offset order) knows of transactions."""

    def __init__(self, aborted: AbortedRanges, now_ms: int, delete_retention_ms: int):
        self.aborted = aborted
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        # Producers whose current transaction's data this pass met (kept or dropped).
        self._met_committed: set[int] = set()
        self._met_aborted: set[int] = set()
        self.removed_aborts: set[int] = set()  # offsets of ABORT markers removed

    def on_data_batch(self, header: BatchHeader, aborted: bool) -> None:
        if header.attributes & TRANSACTIONAL_MASK:
            (self._met_aborted if aborted else self._met_committed).add(header.producer_id)

    def on_marker(self, header: BatchHeader, committed: bool
                  ) -> Literal["keep", "stamp", "remove"]:
        met = self._met_committed if committed else self._met_aborted
        if header.producer_id in met:
            met.discard(header.producer_id)
            return "keep"
        if not header.attributes & DELETE_HORIZON_MASK:
            return "stamp"
        return "remove" if header.base_timestamp <= self.now_ms else "keep"


class OffsetMap:
    """Key -> offset of its last record in the dirty section (Kafka's ``SkimpyOffsetMap``,
    as a dict: exact, bounded by ``entries_max`` instead of a buffer size)."""

    def __init__(self, entries_max: int, aborted: AbortedRanges | None = None):
        self.entries_max = entries_max
        self.aborted = aborted or AbortedRanges()
        self.offsets: dict[bytes, int] = {}
        self.last_offset = -1  # the last offset added

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def full(self) -> bool:
        return len(self.offsets) >= self.entries_max

    def add_batch(self, buf: BytesLike, position: int, header: BatchHeader) -> None:
        """Every keyed record of one (CRC-checked) batch; control batches hold no data,
        an aborted transaction's batches none that counts."""
        if header.attributes & CONTROL_MASK or self.aborted.holds(header):
            return
        offsets = self.offsets
        for record in decode_batch_records(buf, position, header):
            if record.key is not None:
                offsets[bytes(record.key)] = record.offset
                self.last_offset = record.offset

    def get(self, key: bytes) -> int | None:
        return self.offsets.get(key)


@dataclass(frozen=True, slots=True)
class RetainRules:
    offsets: Mapping[bytes, int]  # the offset map
    tombstone_horizon_ms: int  # tombstones in batches with maxTimestamp below this go
    producer_last_offsets: Mapping[int, int]  # producer id -> last offset of its last batch
    aborted: AbortedRanges = field(default_factory=AbortedRanges)
    txn: TxnPass | None = None  # None: markers are kept as they are


@dataclass(slots=True)
class FilterStats:
    records_read: int = 0
    records_kept: int = 0
    batches_read: int = 0
    batches_kept: int = 0

    def add(self, other: FilterStats) -> None:
        self.records_read += other.records_read
        self.records_kept += other.records_kept
        self.batches_read += other.batches_read
        self.batches_kept += other.batches_kept


def keeps(key: bytes | None, value: bytes | None, offset: int, batch_max_timestamp: int,
          rules: RetainRules) -> bool:
    """Whether a record survives the compaction (module docstring)."""
    if key is None:
        return False
    latest = rules.offsets.get(bytes(key))
    if latest is not None and offset < latest:
        return False
    return value is not None or batch_max_timestamp >= rules.tombstone_horizon_ms


def filter_batch(buf: BytesLike, position: int, header: BatchHeader, rules: RetainRules,
                 stats: FilterStats, *, keep_empty: bool = False) -> bytes | None:
    """The batch at ``position`` as the compaction leaves it: its own bytes, a re-encoded
    batch, or None when it goes (module docstring)."""
    stats.batches_read += 1
    stats.records_read += header.record_count
    original = bytes(memoryview(buf)[position:position + header.size])
    if header.attributes & CONTROL_MASK:
        kept_marker = _filter_marker(buf, position, header, rules, keep_empty)
        if kept_marker is not None:
            stats.batches_kept += 1
            stats.records_kept += header.record_count
        return kept_marker
    aborted = rules.aborted.holds(header)
    if rules.txn is not None:
        rules.txn.on_data_batch(header, aborted)
    records = decode_batch_records(buf, position, header)
    kept = [] if aborted else [
        r for r in records if keeps(r.key, r.value, r.offset, header.max_timestamp, rules)]
    if len(kept) == len(records):
        stats.batches_kept += 1
        stats.records_kept += len(kept)
        return original
    is_producers_last = (header.producer_id >= 0 and rules.producer_last_offsets.get(
        header.producer_id) == header.last_offset)
    if not kept and not (keep_empty or is_producers_last):
        return None
    stats.batches_kept += 1
    stats.records_kept += len(kept)
    builder = BatchBuilder(header.base_timestamp)
    for record in kept:
        builder.append(record.key, record.value, record.headers, record.timestamp,
                       offset_delta=record.offset - header.base_offset)
    return builder.build(
        header.compression if kept else COMPRESSION_NONE, base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch, producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
        attributes=header.attributes, last_offset_delta=header.last_offset_delta,
        max_timestamp_ms=header.max_timestamp, allow_empty=True)


def _filter_marker(buf: BytesLike, position: int, header: BatchHeader, rules: RetainRules,
                   keep_empty: bool) -> bytes | None:
    """A control batch as the pass leaves it (module docstring): as it is, stamped with
    the delete horizon, or None (removed)."""
    original = bytes(memoryview(buf)[position:position + header.size])
    txn = rules.txn
    marker = marker_of_batch(buf, position, header) if txn is not None else None
    if txn is None or marker is None:
        return original
    decision = txn.on_marker(header, marker.committed)
    is_producers_last = rules.producer_last_offsets.get(header.producer_id) == header.last_offset
    if decision == "keep" or is_producers_last:
        return original
    if decision == "remove" and not keep_empty:
        if not marker.committed:
            txn.removed_aborts.add(header.base_offset)
        return None
    if header.attributes & DELETE_HORIZON_MASK:
        return original  # removable, but the group must end with it: it stays stamped
    [record] = decode_batch_records(buf, position, header)
    builder = BatchBuilder(txn.now_ms + txn.delete_retention_ms)
    builder.append(record.key, record.value, record.headers, record.timestamp,
                   offset_delta=record.offset - header.base_offset)
    return builder.build(
        COMPRESSION_NONE, base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch, producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
        attributes=header.attributes | DELETE_HORIZON_MASK,
        last_offset_delta=header.last_offset_delta, max_timestamp_ms=header.max_timestamp)
