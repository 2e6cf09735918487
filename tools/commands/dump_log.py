"""``tide dump-log FILE... [--print-data] [--json] [--verify]``: decode on-disk files.

In the spirit of ``kafka-dump-log.sh``: reads a partition's files offline (no
broker needed) and prints what is in them. The kind of a file comes from its
name (a directory stands for the files in it):

=============================  ==================================================
``<20 digits>.log``            one line per batch; ``--print-data`` adds a line per record;
                               a control batch's marker (COMMIT/ABORT) always
``<20 digits>.index``          ``(offset, position)`` entries, 8 bytes each
``<20 digits>.timeindex``      ``(timestamp, offset)`` entries, 12 bytes each
``leader-epoch-checkpoint``    ``(epoch, start_offset)`` entries
``replication-offset-checkpoint``, ``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``
                               ``(topic, partition, offset)`` entries
``.kafka_cleanshutdown``       the clean-shutdown marker
``.compacted``                 the partition's log is compacted (may skip offsets)
``partition.metadata``         the topic ID of the partition's incarnation (KIP-516)
``<20 digits>.snapshot``       idempotent producers' state at that offset (Kafka's
                               ProducerSnapshot v1, ``broker/storage/producer_state.py``)
``<20 digits>.txnindex``       aborted transactions (Kafka's TransactionIndex,
                               ``broker/storage/txn_index.py``), 34 bytes each
``raft.log``, ``quorum-state``, the controller quorum's Raft files: entries (offset, epoch,
``snapshot-*.snap``            kind, record), the quorum state, snapshots (``dump_raft``)
=============================  ==================================================

The 20-digit name is the segment's base offset; index files store offsets
relative to it and are printed as absolute offsets. Index files may end in
zero entries (a preallocated file): those are padding, not entries.

``--json`` prints one JSON object per line. These objects are a stable
interface (new keys may be added; existing ones keep their meaning)::

    {"type": "file", "file", "kind", "base_offset"}
    {"type": "batch", "file", "position", "base_offset", "last_offset", "count",
     "partition_leader_epoch", "size", "crc", "crc_valid", "compression", "max_timestamp",
     "producer_id", "producer_epoch", "base_sequence", "is_transactional", "is_control"}
    {"type": "record", "offset", "timestamp", "key", "value", "headers"}
    {"type": "control_record", "offset", "marker", "coordinator_epoch"}
    {"type": "txn_index_entry", "file", "producer_id", "first_offset", "last_offset",
     "last_stable_offset"}
    {"type": "index_entry", "file", "offset", "position"}
    {"type": "time_index_entry", "file", "timestamp", "offset"}
    {"type": "epoch_entry", "file", "epoch", "start_offset"}
    {"type": "checkpoint_entry", "file", "topic", "partition", "offset"}
    {"type": "partition_metadata", "file", "version", "topic_id"}
    {"type": "producer_snapshot_entry", "file", "producer_id", "producer_epoch",
     "first_sequence", "last_sequence", "last_offset", "offset_delta", "timestamp",
     "coordinator_epoch", "current_txn_first_offset"}
    {"type": "problem", "file", "position", "problem", "message"}

``key``/``value`` are UTF-8 text (other bytes backslash-escaped), null when
absent; ``headers`` is ``[[name, value], ...]``; ``compression`` is one of
none, gzip, snappy, lz4, zstd; ``marker`` is COMMIT, ABORT or null (a control
record of another type); ``position`` of a problem is a byte position or
null.

Problems: a torn or malformed tail, an unreadable file, undecodable records
are always reported (``problem`` lines). ``--verify`` also checks CRCs, offset
continuity (contiguous and increasing within a segment and from one given
segment to the next; in a compacted log, whose cleaner removes records and
whole batches, offsets may skip forward: ``--compacted``, or the partition is
marked ``.compacted`` or listed in its data dir's ``cleaner-offset-checkpoint``),
leader epochs never
decreasing, and that every index
entry points at the start of a batch whose last offset it names (time index:
a batch with that last offset and that max timestamp). Exit code: 1 when a
file could not be read or, with ``--verify``, when any problem was found; 0
otherwise.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tidewater.broker.storage import partition_metadata
from tidewater.broker.storage.checkpoints import (
    CLEAN_SHUTDOWN_FILE,
    OFFSET_CHECKPOINT_FILE_NAMES,
    OffsetCheckpointFile,
)
from tidewater.broker.storage.cleaner_swap import COMPACTED_MARKER
from tidewater.broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT, read_epoch_checkpoint
from tidewater.broker.storage.producer_state import SNAPSHOT_SUFFIX, decode_snapshot
from tidewater.broker.storage.segment import TXN_INDEX_SUFFIX
from tidewater.broker.storage.txn_index import ENTRY_SIZE as TXN_INDEX_ENTRY_SIZE
from tidewater.broker.storage.txn_index import decode_entries
from tidewater.proto.batch import (
    BATCH_LENGTH_MIN,
    HEADER_SIZE,
    MAGIC_V2,
    TRANSACTIONAL_MASK,
    BatchHeader,
    BytesLike,
    compute_crc,
    read_header,
)
from tidewater.proto.compression import COMPRESSION_NAMES
from tidewater.proto.control_records import parse_marker
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    KafkaStorageError,
    UnsupportedCompressionError,
)
from tidewater.proto.records import Record, decode_batch_records
from tidewater.proto.topic_id import topic_id_to_text
from tidewater.tools.commands.dump_raft import (
    dump_raft_file,
    format_raft_text,
    raft_file_kind,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers

# One output event (a line of --json): {"type": "file" | "batch" | "record" | ..., ...},
# its values JSON's.
Event = dict[str, Any]
# A segment's bytes: read, or mmapped (a segment may be large).
Segment = BytesLike | mmap.mmap

SEGMENT_NAME_DIGITS = 20
OFFSET_INDEX_ENTRY = struct.Struct(">ii")   # relative offset, position
TIME_INDEX_ENTRY = struct.Struct(">qi")     # timestamp, relative offset
assert OFFSET_INDEX_ENTRY.size == 8 and TIME_INDEX_ENTRY.size == 12

KIND_LOG, KIND_INDEX, KIND_TIME_INDEX = "log", "index", "timeindex"
KIND_EPOCHS, KIND_OFFSETS, KIND_MARKER = "leader-epoch-checkpoint", "offset-checkpoint", "marker"
KIND_PARTITION_METADATA = "partition-metadata"
KIND_PRODUCER_SNAPSHOT = "producer-snapshot"
KIND_TXN_INDEX = "txnindex"
_SEGMENT_SUFFIXES = {".log": KIND_LOG, ".index": KIND_INDEX, ".timeindex": KIND_TIME_INDEX,
                     SNAPSHOT_SUFFIX: KIND_PRODUCER_SNAPSHOT, TXN_INDEX_SUFFIX: KIND_TXN_INDEX}


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "dump-log",
        help="decode segment, index and checkpoint files",
        description="Decode Tidewater/Kafka on-disk files: *.log, *.index, *.timeindex, "
                    "leader-epoch-checkpoint, partition.metadata, the offset checkpoint "
                    "files and the controller quorum's raft.log, quorum-state and "
                    "snapshot-*.snap. "
                    "A directory stands for the files in it.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="files or partition directories")
    parser.add_argument("--print-data", action="store_true",
                        help="print every record of every batch (key, value, headers), "
                             "every Raft entry's record and a Raft snapshot's image")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--verify", action="store_true",
                        help="check CRCs, offset continuity and index consistency; "
                             "exit 1 naming every problem")
    parser.add_argument("--compacted", action="store_true",
                        help="with --verify: the log is compacted (offsets may skip forward); "
                             "found on its own when the data dir's cleaner-offset-checkpoint "
                             "lists the partition")
    parser.set_defaults(func=run)


# -- file kinds ----------------------------------------------------------------

def file_kind(path: Path) -> tuple[str | None, int | None]:
    """``(kind, segment base offset)`` from the file name; kind None if unknown."""
    name = path.name
    if name == LEADER_EPOCH_CHECKPOINT:
        return KIND_EPOCHS, None
    if name in OFFSET_CHECKPOINT_FILE_NAMES:
        return KIND_OFFSETS, None
    if name in (CLEAN_SHUTDOWN_FILE, COMPACTED_MARKER):
        return KIND_MARKER, None
    if name == partition_metadata.PARTITION_METADATA_FILE:
        return KIND_PARTITION_METADATA, None
    raft_kind = raft_file_kind(path)
    if raft_kind is not None:
        return raft_kind, None
    stem, dot, suffix = name.partition(".")
    kind = _SEGMENT_SUFFIXES.get(dot + suffix)
    if kind is None or not (stem.isascii() and stem.isdigit()):
        return None, None
    return kind, int(stem)


_KIND_ORDER = {KIND_LOG: 0, KIND_INDEX: 1, KIND_TIME_INDEX: 2, KIND_TXN_INDEX: 3,
               KIND_PRODUCER_SNAPSHOT: 4}


def _directory_order(path: Path) -> tuple[int, int, int, str]:
    kind, base_offset = file_kind(path)
    if base_offset is None or kind is None:  # checkpoints after the segments
        return (1, 0, 0, path.name)
    return (0, base_offset, _KIND_ORDER[kind], path.name)


def expand_paths(args: list[str]) -> list[Path]:
    """Files in argument order; a directory becomes its known files: segments by base
    offset (.log, .index, .timeindex), then checkpoints by name."""
    paths: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            known = [p for p in path.iterdir() if p.is_file() and file_kind(p)[0] is not None]
            paths.extend(sorted(known, key=_directory_order))
        else:
            paths.append(path)
    return paths


# -- reading segments ---------------------------------------------------------------

@dataclass
class SegmentScan:
    """What a scan of one .log found: batches by position and the framing problems."""

    size: int
    batches: list[tuple[int, BatchHeader]] = field(default_factory=list)
    by_position: dict[int, BatchHeader] = field(default_factory=dict)
    by_last_offset: dict[int, BatchHeader] = field(default_factory=dict)
    tail_problem: tuple[int, str] | None = None   # (position, message)

    def add(self, position: int, header: BatchHeader) -> None:
        self.batches.append((position, header))
        self.by_position[position] = header
        self.by_last_offset[header.last_offset] = header


def _map_file(path: Path) -> Segment:
    """The file's bytes, mmapped when not empty (a segment may be large)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _readable(buf: Segment) -> BytesLike:
    """``buf`` for proto's readers: they read through struct and slices, which take an
    mmap too, though their BytesLike names bytes, bytearray and memoryview only (a
    memoryview here would keep the mmap from closing)."""
    return cast("BytesLike", buf)


def scan_batches(buf: Segment) -> Iterator[tuple[int, BatchHeader | None, str | None]]:
    """``(position, header, None)`` per framed batch, then ``(position, None, problem)`` if
    the bytes from ``position`` on are not a whole batch (torn or malformed tail)."""
    size = len(buf)
    data = _readable(buf)
    position = 0
    while position < size:
        available = size - position
        if available < HEADER_SIZE:
            yield position, None, (f"torn tail: {available} bytes, "
                                   f"less than a {HEADER_SIZE}-byte batch header")
            return
        header = read_header(data, position)
        if header.batch_length < BATCH_LENGTH_MIN:
            yield position, None, f"malformed batch: length {header.batch_length} below minimum"
            return
        if header.size > available:
            yield position, None, (f"torn tail: batch length says {header.size} bytes, "
                                   f"{available} present")
            return
        yield position, header, None
        position += header.size


def scan_segment(buf: Segment) -> SegmentScan:
    scan = SegmentScan(size=len(buf))
    for position, header, problem in scan_batches(buf):
        if header is None:
            assert problem is not None  # no header: the problem with the bytes there
            scan.tail_problem = (position, problem)
            break
        scan.add(position, header)
    return scan


# -- output -----------------------------------------------------------------------------

def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def record_event(record: Record) -> Event:
    return {
        "type": "record",
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _text(record.key),
        "value": _text(record.value),
        "headers": [[name, _text(value)] for name, value in record.headers],
    }


def batch_event(file: str, position: int, header: BatchHeader, crc_valid: bool) -> Event:
    return {
        "type": "batch",
        "file": file,
        "position": position,
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "count": header.record_count,
        "partition_leader_epoch": header.partition_leader_epoch,
        "size": header.size,
        "crc": header.crc,
        "crc_valid": crc_valid,
        "compression": COMPRESSION_NAMES.get(header.compression, f"unknown({header.compression})"),
        "max_timestamp": header.max_timestamp,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "is_transactional": bool(header.attributes & TRANSACTIONAL_MASK),
        "is_control": header.is_control,
    }


def control_record_event(record: Record) -> Event:
    marker = parse_marker(record.key, record.value)
    return {"type": "control_record", "offset": record.offset,
            "marker": None if marker is None else ("COMMIT" if marker.committed else "ABORT"),
            "coordinator_epoch": None if marker is None else marker.coordinator_epoch}


def problem_event(file: str, position: int | None, problem: str, message: str) -> Event:
    return {"type": "problem", "file": file, "position": position, "problem": problem,
            "message": message}


def _or_null(text: str | None) -> str:
    return "null" if text is None else text


def format_text(event: Event) -> str:
    kind = event["type"]
    raft_line = format_raft_text(event)
    if raft_line is not None:
        return raft_line
    if kind == "file":
        line = f"Dumping {event['file']}"
        if event["kind"] == KIND_LOG:
            line += f"\nLog starting offset: {event['base_offset']}"
        return line
    if kind == "batch":
        return (f"baseOffset: {event['base_offset']} lastOffset: {event['last_offset']} "
                f"count: {event['count']} partitionLeaderEpoch: {event['partition_leader_epoch']} "
                f"position: {event['position']} size: {event['size']} "
                f"maxTimestamp: {event['max_timestamp']} compresscodec: {event['compression']} "
                f"producerId: {event['producer_id']} producerEpoch: {event['producer_epoch']} "
                f"baseSequence: {event['base_sequence']} "
                f"isTransactional: {str(event['is_transactional']).lower()} "
                f"isControl: {str(event['is_control']).lower()} "
                f"crc: {event['crc']} isValid: {str(event['crc_valid']).lower()}")
    if kind == "control_record":
        return (f"| offset: {event['offset']} endTxnMarker: {_or_null(event['marker'])} "
                f"coordinatorEpoch: {_or_null(str(event['coordinator_epoch']))}")
    if kind == "txn_index_entry":
        return (f"producerId: {event['producer_id']} firstOffset: {event['first_offset']} "
                f"lastOffset: {event['last_offset']} "
                f"lastStableOffset: {event['last_stable_offset']}")
    if kind == "record":
        headers = ", ".join(f"{name}: {_or_null(value)}" for name, value in event["headers"])
        return (f"| offset: {event['offset']} timestamp: {event['timestamp']} "
                f"key: {_or_null(event['key'])} value: {_or_null(event['value'])} "
                f"headers: [{headers}]")
    if kind == "index_entry":
        return f"offset: {event['offset']} position: {event['position']}"
    if kind == "time_index_entry":
        return f"timestamp: {event['timestamp']} offset: {event['offset']}"
    if kind == "epoch_entry":
        return f"epoch: {event['epoch']} startOffset: {event['start_offset']}"
    if kind == "checkpoint_entry":
        return f"topic: {event['topic']} partition: {event['partition']} offset: {event['offset']}"
    if kind == "partition_metadata":
        return f"version: {event['version']} topicId: {event['topic_id']}"
    if kind == "producer_snapshot_entry":
        return (f"producerId: {event['producer_id']} producerEpoch: {event['producer_epoch']} "
                f"firstSequence: {event['first_sequence']} "
                f"lastSequence: {event['last_sequence']} lastOffset: {event['last_offset']} "
                f"offsetDelta: {event['offset_delta']} timestamp: {event['timestamp']} "
                f"coordinatorEpoch: {event['coordinator_epoch']} "
                f"currentTxnFirstOffset: {event['current_txn_first_offset']}")
    if kind == "problem":
        where = event["file"] + (f":{event['position']}" if event["position"] is not None else "")
        return f"PROBLEM {where}: {event['problem']}: {event['message']}"
    return json.dumps(event)


# -- dumping ------------------------------------------------------------------------------

def _listed_as_compacted(partition_dir: Path) -> bool:
    """The partition's log is compacted: its ``.compacted`` marker, or its data dir names it
    in ``cleaner-offset-checkpoint``."""
    if (partition_dir / COMPACTED_MARKER).exists():
        return True
    try:
        lines = (partition_dir.parent / "cleaner-offset-checkpoint").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    topic, _, partition = partition_dir.name.rpartition("-")
    return any(line.split()[:2] == [topic, partition] for line in lines[2:])


class LogDumper:
    """Turns files into events; remembers what --verify needs across files."""

    def __init__(self, *, print_data: bool, verify: bool, compacted: bool = False):
        self.print_data = print_data
        self.verify = verify
        self.compacted = compacted
        self.problem_count = 0
        self.unreadable_count = 0
        self._scans: dict[Path, SegmentScan | None] = {}
        # Per directory: (base offset, next offset) of each .log dumped, for continuity.
        self._segment_ends: dict[Path, list[tuple[int, int | None, str]]] = {}

    def _problem(self, file: str, position: int | None, problem: str, message: str) -> Event:
        self.problem_count += 1
        return problem_event(file, position, problem, message)

    def dump(self, path: Path) -> Iterator[Event]:
        file = str(path)
        kind, base_offset = file_kind(path)
        if kind is None:
            self.unreadable_count += 1
            yield self._problem(file, None, "unknown_file",
                                "not a .log/.index/.timeindex segment file, a checkpoint, "
                                "partition.metadata or a Raft file")
            return
        yield {"type": "file", "file": file, "kind": kind, "base_offset": base_offset}
        try:
            if kind in (KIND_LOG, KIND_INDEX, KIND_TIME_INDEX):
                assert base_offset is not None  # a segment file is named by its base offset
                if kind == KIND_LOG:
                    yield from self._dump_log(path, file, base_offset)
                elif kind == KIND_INDEX:
                    yield from self._dump_index(path, file, base_offset)
                else:
                    yield from self._dump_time_index(path, file, base_offset)
            elif kind == KIND_EPOCHS:
                for epoch, start_offset in read_epoch_checkpoint(path):
                    yield {"type": "epoch_entry", "file": file, "epoch": epoch,
                           "start_offset": start_offset}
            elif kind == KIND_OFFSETS:
                for (topic, partition), offset in sorted(OffsetCheckpointFile(path).read().items()):
                    yield {"type": "checkpoint_entry", "file": file, "topic": topic,
                           "partition": partition, "offset": offset}
            elif kind == KIND_PARTITION_METADATA:
                topic_id = partition_metadata.read_partition_metadata(path.parent)
                if topic_id is None:
                    raise FileNotFoundError(2, "No such file or directory")
                yield {"type": "partition_metadata", "file": file,
                       "version": partition_metadata.VERSION,
                       "topic_id": topic_id_to_text(topic_id)}
            elif kind == KIND_PRODUCER_SNAPSHOT:
                for entry in decode_snapshot(path.read_bytes(), path=file):
                    last = entry.batches[-1] if entry.batches else None
                    yield {"type": "producer_snapshot_entry", "file": file,
                           "producer_id": entry.producer_id,
                           "producer_epoch": entry.producer_epoch,
                           "first_sequence": last.first_sequence if last else -1,
                           "last_sequence": last.last_sequence if last else -1,
                           "last_offset": last.last_offset if last else -1,
                           "offset_delta": last.last_offset - last.first_offset if last else 0,
                           "timestamp": entry.last_timestamp_ms,
                           "coordinator_epoch": entry.coordinator_epoch,
                           "current_txn_first_offset": entry.current_txn_first_offset}
            elif kind == KIND_TXN_INDEX:
                data = path.read_bytes()
                entries, used = decode_entries(data)
                for aborted in entries:
                    yield {"type": "txn_index_entry", "file": file,
                           "producer_id": aborted.producer_id,
                           "first_offset": aborted.first_offset,
                           "last_offset": aborted.last_offset,
                           "last_stable_offset": aborted.last_stable_offset}
                if used != len(data):
                    yield self._problem(file, used, "torn_tail",
                                        f"{len(data) - used} bytes after the last whole "
                                        f"{TXN_INDEX_ENTRY_SIZE}-byte entry of version 0")
            elif raft_file_kind(path) == kind:
                for event in dump_raft_file(path, kind, print_data=self.print_data):
                    if event["type"] == "problem":
                        self.problem_count += 1
                    yield event
            elif kind == KIND_MARKER and not path.exists():
                raise FileNotFoundError(2, "No such file or directory")
        except CorruptFileError as e:
            yield self._problem(file, None, "corrupt_file", str(e))
        except (OSError, KafkaStorageError) as e:
            self.unreadable_count += 1
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            yield self._problem(file, None, "unreadable", f"cannot read: {reason}")

    # .log

    def _dump_log(self, path: Path, file: str, base_offset: int) -> Iterator[Event]:
        buf = _map_file(path)
        try:
            yield from self._dump_log_bytes(path, file, base_offset, buf)
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()

    def _dump_log_bytes(self, path: Path, file: str, base_offset: int,
                        segment: Segment) -> Iterator[Event]:
        buf = _readable(segment)
        scan = SegmentScan(size=len(buf))
        compacted = self.compacted or _listed_as_compacted(path.parent)
        expected_offset = base_offset
        previous_epoch = -1
        for position, header, tail_problem in scan_batches(buf):
            if header is None:
                assert tail_problem is not None  # no header: the problem with the bytes there
                scan.tail_problem = (position, tail_problem)
                yield self._problem(file, position, "torn_tail", tail_problem)
                break
            scan.add(position, header)
            crc_computed = compute_crc(buf, position, header.size)
            yield batch_event(file, position, header, crc_computed == header.crc)
            if header.magic != MAGIC_V2:
                yield self._problem(file, position, "bad_magic",
                                    f"magic {header.magic}, only 2 is supported")
                expected_offset = header.next_offset
                continue
            records = None
            if header.is_control:  # a transaction marker: shown whatever the flags
                try:
                    records = decode_batch_records(buf, position, header)
                    for record in records:
                        yield control_record_event(record)
                except (CorruptRecordError, UnsupportedCompressionError) as e:
                    yield self._problem(file, position, "bad_records",
                                        getattr(e, "reason", str(e)))
            elif self.print_data or self.verify:
                try:
                    records = decode_batch_records(buf, position, header)
                except (CorruptRecordError, UnsupportedCompressionError) as e:
                    yield self._problem(file, position, "bad_records",
                                        getattr(e, "reason", str(e)))
                if self.print_data and records is not None:
                    for record in records:
                        yield record_event(record)
            if self.verify:
                yield from self._verify_batch(file, position, header, crc_computed, records,
                                              expected_offset, previous_epoch, compacted)
                expected_offset = header.next_offset
                previous_epoch = max(previous_epoch, header.partition_leader_epoch)
        self._scans[path] = scan
        if self.verify:
            next_offset = scan.batches[-1][1].next_offset if scan.batches else None
            self._segment_ends.setdefault(path.parent, []).append((base_offset, next_offset, file))

    def _verify_batch(self, file: str, position: int, header: BatchHeader, crc_computed: int,
                      records: list[Record] | None, expected_offset: int,
                      previous_epoch: int, compacted: bool = False) -> Iterator[Event]:
        if crc_computed != header.crc:
            yield self._problem(file, position, "crc_mismatch",
                                f"stored CRC {header.crc:#010x}, computed {crc_computed:#010x}")
        if header.base_offset != expected_offset and not (
                compacted and header.base_offset > expected_offset):
            what = "gap" if header.base_offset > expected_offset else "overlap"
            yield self._problem(file, position, "offset_discontinuity",
                                f"batch starts at offset {header.base_offset}, expected "
                                f"{expected_offset} ({what})")
        if header.last_offset_delta < 0 or (header.record_count != header.last_offset_delta + 1
                                            and not (compacted and header.record_count
                                                     <= header.last_offset_delta + 1)):
            yield self._problem(file, position, "offset_discontinuity",
                                f"{header.record_count} records but lastOffsetDelta "
                                f"{header.last_offset_delta}")
        if header.partition_leader_epoch < previous_epoch:
            yield self._problem(file, position, "epoch_decrease",
                                f"partitionLeaderEpoch {header.partition_leader_epoch} after "
                                f"{previous_epoch}")
        if records is not None:
            offsets = [r.offset for r in records]
            expected = list(range(header.base_offset, header.base_offset + len(records)))
            if compacted:  # kept records at their own offsets, in order, inside the batch
                expected = sorted(o for o in set(offsets)
                                  if header.base_offset <= o <= header.last_offset)
            if offsets != expected:
                yield self._problem(file, position, "offset_discontinuity",
                                    f"record offsets {offsets[:10]} are not "
                                    f"{header.base_offset}..{header.last_offset} in order")

    def finish(self) -> Iterator[Event]:
        """Checks that need every file: segment-to-segment continuity."""
        if not self.verify:
            return
        for segments in self._segment_ends.values():
            segments.sort()
            for (_, next_offset, _), (base_offset, _, file) in zip(segments, segments[1:],
                                                                   strict=False):
                if next_offset is not None and base_offset != next_offset and not (
                        base_offset > next_offset and (self.compacted or _listed_as_compacted(
                            Path(file).parent))):
                    yield self._problem(file, None, "offset_discontinuity",
                                        f"segment starts at {base_offset}, the previous one "
                                        f"ends at {next_offset}")

    # .index / .timeindex

    def _segment_scan(self, index_path: Path, base_offset: int) -> SegmentScan | None:
        log_path = index_path.with_name(f"{base_offset:0{SEGMENT_NAME_DIGITS}d}.log")
        if log_path not in self._scans:
            try:
                buf = _map_file(log_path)
            except OSError:
                self._scans[log_path] = None
            else:
                try:
                    self._scans[log_path] = scan_segment(buf)
                finally:
                    if isinstance(buf, mmap.mmap):
                        buf.close()
        return self._scans[log_path]

    def _index_entries(self, path: Path, file: str, entry: struct.Struct,
                       ) -> tuple[list[tuple[int, int]], list[Event]]:
        data = path.read_bytes()
        problems = []
        whole = len(data) - len(data) % entry.size
        if whole != len(data):
            problems.append(self._problem(
                file, whole, "torn_tail",
                f"{len(data) - whole} trailing bytes, not a whole {entry.size}-byte entry"))
        entries = [entry.unpack_from(data, p) for p in range(0, whole, entry.size)]
        # A preallocated file ends in zero entries: padding. Only a file of exactly one
        # entry keeps a zero first entry (a real (base offset, position 0) entry).
        file_entry_count = len(entries)
        while entries and entries[-1] == (0, 0) and file_entry_count > 1:
            entries.pop()
        return entries, problems

    def _dump_index(self, path: Path, file: str, base_offset: int) -> Iterator[Event]:
        entries, problems = self._index_entries(path, file, OFFSET_INDEX_ENTRY)
        yield from problems
        for relative_offset, position in entries:
            yield {"type": "index_entry", "file": file, "offset": base_offset + relative_offset,
                   "position": position}
        if not self.verify:
            return
        scan = self._segment_scan(path, base_offset)
        if scan is None:
            yield self._problem(file, None, "missing_log", "no matching .log to verify against")
            return
        previous = None
        for i, (relative_offset, position) in enumerate(entries):
            offset = base_offset + relative_offset
            if previous is not None and (relative_offset <= previous[0] or position <= previous[1]):
                yield self._problem(file, i * OFFSET_INDEX_ENTRY.size, "index_out_of_order",
                                    f"entry {i} (offset {offset}, position {position}) does not "
                                    f"increase on entry {i - 1}")
            previous = (relative_offset, position)
            header = scan.by_position.get(position)
            if header is None:
                yield self._problem(file, i * OFFSET_INDEX_ENTRY.size, "index_mismatch",
                                    f"entry {i}: position {position} is not the start of a batch "
                                    f"in the .log ({scan.size} bytes)")
            elif header.last_offset != offset:
                yield self._problem(file, i * OFFSET_INDEX_ENTRY.size, "index_mismatch",
                                    f"entry {i}: offset {offset}, but the batch at position "
                                    f"{position} ends at offset {header.last_offset}")

    def _dump_time_index(self, path: Path, file: str, base_offset: int) -> Iterator[Event]:
        entries, problems = self._index_entries(path, file, TIME_INDEX_ENTRY)
        yield from problems
        for timestamp, relative_offset in entries:
            yield {"type": "time_index_entry", "file": file, "timestamp": timestamp,
                   "offset": base_offset + relative_offset}
        if not self.verify:
            return
        scan = self._segment_scan(path, base_offset)
        if scan is None:
            yield self._problem(file, None, "missing_log", "no matching .log to verify against")
            return
        previous_timestamp = None
        for i, (timestamp, relative_offset) in enumerate(entries):
            offset = base_offset + relative_offset
            if previous_timestamp is not None and timestamp <= previous_timestamp:
                yield self._problem(file, i * TIME_INDEX_ENTRY.size, "index_out_of_order",
                                    f"entry {i}: timestamp {timestamp} not above {previous_timestamp}")
            previous_timestamp = timestamp
            header = scan.by_last_offset.get(offset)
            if header is None:
                yield self._problem(file, i * TIME_INDEX_ENTRY.size, "index_mismatch",
                                    f"entry {i}: no batch in the .log ends at offset {offset}")
            elif header.max_timestamp != timestamp:
                yield self._problem(file, i * TIME_INDEX_ENTRY.size, "index_mismatch",
                                    f"entry {i}: timestamp {timestamp}, but the batch ending at "
                                    f"offset {offset} has max timestamp {header.max_timestamp}")


def run(args: argparse.Namespace) -> int:
    dumper = LogDumper(print_data=args.print_data, verify=args.verify,
                       compacted=args.compacted)
    out = sys.stdout
    if args.json:
        def emit(event: Event) -> None:
            out.write(json.dumps(event, ensure_ascii=False) + "\n")
    else:
        def emit(event: Event) -> None:
            out.write(format_text(event) + "\n")
    for path in expand_paths(args.files):
        for event in dumper.dump(path):
            emit(event)
    for event in dumper.finish():
        emit(event)
    out.flush()
    if args.verify and dumper.problem_count:
        print(f"tide: dump-log: {dumper.problem_count} problem(s) found", file=sys.stderr)
        return 1
    if dumper.unreadable_count:
        return 1
    return 0
