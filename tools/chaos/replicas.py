"""Compare the replicas of a partition below the high watermark, from their files.

Reads each broker's data folder (``<data>/<topic>-<partition>/<base>.log``
segments, RecordBatch v2, see proto/batch.py) directly, so the comparison
does not trust what the brokers say about themselves. Every batch is
CRC-checked. Followers store the leader's batches byte for byte, so replicas
agree below the HW exactly when their sequences of
``(base_offset, last_offset, partition_leader_epoch, crc)`` for batches
starting below the HW are equal, contiguous, and reach the HW.

A compacted topic's replicas are cleaned each on its own schedule, so their
batches differ (removed records, re-encoded batches, offset gaps) and are not
contiguous. There, replicas agree below the HW when every offset that two of
them both hold carries the same key and value (``compare_compacted``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidewater.proto.batch import iter_batches
from tidewater.proto.errors import CorruptRecordError
from tidewater.proto.records import decode_batch_records

Record = tuple[bytes | None, bytes | None]  # (key, value)


@dataclass(frozen=True, slots=True)
class BatchSummary:
    base_offset: int
    last_offset: int
    partition_leader_epoch: int
    crc: int


@dataclass(frozen=True, slots=True)
class ReplicaComparison:
    identical: bool
    detail: str  # "" when identical


def partition_dir(data_dir: Path, topic: str, partition: int) -> Path:
    return Path(data_dir) / f"{topic}-{partition}"


def read_batches_below(log_dir: Path, high_watermark: int) -> list[BatchSummary]:
    """Batches starting below ``high_watermark``, in order, from every segment.

    A damaged batch below the HW raises CorruptRecordError; damage after it
    (a tail being written right now) ends the read.
    """
    out: list[BatchSummary] = []
    for segment in sorted(log_dir.glob("*.log")):
        data = segment.read_bytes()
        try:
            for _, h in iter_batches(data):
                if h.base_offset >= high_watermark:
                    return out
                out.append(BatchSummary(h.base_offset, h.base_offset + h.last_offset_delta,
                                        h.partition_leader_epoch, h.crc))
        except CorruptRecordError as e:
            last = out[-1].last_offset if out else -1
            if last + 1 < high_watermark:
                raise CorruptRecordError(e.reason, position=e.position, path=str(segment)) from None
            return out
    return out


def check_contiguous(batches: list[BatchSummary], high_watermark: int, log_start_offset: int = 0
                     ) -> str:
    """'' when the batches cover [log_start_offset, high_watermark) without gaps, else why not."""
    expected = None
    for b in batches:
        if expected is not None and b.base_offset != expected:
            return f"gap or overlap at offset {expected} (next batch starts at {b.base_offset})"
        expected = b.last_offset + 1
    if high_watermark > log_start_offset and (expected is None or expected < high_watermark):
        return f"log ends at {expected if expected is not None else log_start_offset}, below HW {high_watermark}"
    return ""


def compare_replicas(batches_by_broker: dict[int, list[BatchSummary]], high_watermark: int
                     ) -> ReplicaComparison:
    """Pure: do all replicas hold the same batches below the HW?"""
    problems = []
    for broker, batches in sorted(batches_by_broker.items()):
        why = check_contiguous(batches, high_watermark, batches[0].base_offset if batches else 0)
        if why:
            problems.append(f"broker {broker}: {why}")
    reference_broker, reference = min(batches_by_broker.items(), default=(None, []))
    for broker, batches in sorted(batches_by_broker.items()):
        if broker == reference_broker or batches == reference:
            continue
        for i, (a, b) in enumerate(zip(reference, batches, strict=False)):
            if a != b:
                problems.append(f"brokers {reference_broker} and {broker} differ at batch {i}: "
                                f"{a} vs {b}")
                break
        else:
            problems.append(f"brokers {reference_broker} and {broker} hold {len(reference)} and "
                            f"{len(batches)} batches below HW {high_watermark}")
    return ReplicaComparison(not problems, "; ".join(problems))


def read_records_below(log_dir: Path, high_watermark: int) -> dict[int, Record]:
    """offset -> (key, value) of every record below ``high_watermark`` (CRC-checked as
    ``read_batches_below``; a compacted log may skip offsets)."""
    out: dict[int, Record] = {}
    for segment in sorted(log_dir.glob("*.log")):
        data = segment.read_bytes()
        try:
            for position, h in iter_batches(data):
                if h.base_offset >= high_watermark:
                    return out
                for r in decode_batch_records(data, position, h):
                    if r.offset < high_watermark:
                        out[r.offset] = (r.key, r.value)
        except CorruptRecordError as e:
            last = max(out, default=-1)
            if last + 1 < high_watermark:
                raise CorruptRecordError(e.reason, position=e.position, path=str(segment)) from None
            return out
    return out


def compare_compacted(records_by_broker: dict[int, dict[int, Record]]) -> ReplicaComparison:
    """Pure: every offset two replicas both hold carries the same key and value."""
    problems = []
    reference_broker, reference = min(records_by_broker.items(), default=(None, {}))
    for broker, records in sorted(records_by_broker.items()):
        if broker == reference_broker:
            continue
        for offset in sorted(reference.keys() & records.keys()):
            if reference[offset] != records[offset]:
                problems.append(f"brokers {reference_broker} and {broker} differ at offset "
                                f"{offset}: {reference[offset]} vs {records[offset]}")
                break
    return ReplicaComparison(not problems, "; ".join(problems))


def compare_partition(data_dirs: dict[int, Path], topic: str, partition: int, high_watermark: int,
                      *, compacted: bool = False) -> ReplicaComparison:
    """Read and compare the partition in each broker's data folder."""
    batches = {}
    records = {}
    for broker, data_dir in sorted(data_dirs.items()):
        log_dir = partition_dir(data_dir, topic, partition)
        if not log_dir.is_dir():
            return ReplicaComparison(False, f"broker {broker}: no folder {log_dir}")
        try:
            if compacted:
                records[broker] = read_records_below(log_dir, high_watermark)
            else:
                batches[broker] = read_batches_below(log_dir, high_watermark)
        except (CorruptRecordError, OSError) as e:
            return ReplicaComparison(False, f"broker {broker}: {e}")
    if compacted:
        return compare_compacted(records)
    return compare_replicas(batches, high_watermark)
