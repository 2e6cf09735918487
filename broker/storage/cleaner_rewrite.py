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
- Transactions (Kafka's rules, in part). The cleaner never reaches the last
  stable offset (``cleaner.py``: an open transaction may still abort). A batch
  of an **aborted** transaction (its producer's, from the transaction's first
  offset to its ABORT marker, per the ``.txnindex``: ``AbortedRanges``) adds
  nothing to the offset map (its keys must not shadow committed values) and is
  removed (an empty batch where one must stay, as above). A committed
  transaction's batches and every control batch (marker) are kept byte for
  byte. Not yet Kafka's: markers are never removed (Kafka drops one once the
  delete horizon has passed and no data of its transaction is left), so a
  cleaned log keeps one small batch per transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidewater.proto.batch import (
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    BytesLike,
)
from tidewater.proto.batch_builder import BatchBuilder
from tidewater.proto.compression import COMPRESSION_NONE
from tidewater.proto.records import decode_batch_records


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
    aborted = rules.aborted.holds(header)
    if header.attributes & (CONTROL_MASK | TRANSACTIONAL_MASK) and not aborted:
        stats.batches_kept += 1
        stats.records_kept += header.record_count
        return original
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
