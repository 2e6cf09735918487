"""The audit's own reader of Tidewater's on-disk format (independent of broker/ and proto/).

The audit must not trust the code it checks, so this module re-implements the
little it needs with ``struct``, ``crc32c`` and the compression libraries.

Folder layout it understands::

    DATA_DIR/                            one broker's data dir (broker id: meta.properties
      meta.properties                    `broker.id=N` / `node.id=N`, else the nearest folder
      replication-offset-checkpoint      named broker-N on the path)
      recovery-point-offset-checkpoint
      log-start-offset-checkpoint
      cleaner-offset-checkpoint          partitions its log cleaner compacts (same format)
      <topic>-<partition>/
        %020d.log                        segment: RecordBatch v2 batches back to back,
        %020d.index, %020d.timeindex     named by the segment's base offset
        leader-epoch-checkpoint
        .compacted                       its log is compacted (may skip offsets)
        partition.metadata               the topic incarnation's ID (below)
      <topic>-<partition>.<hex>-delete/  a log moved aside for deletion: not audited

partition.metadata (Kafka's, KIP-516)::

    version: 0
    topic_id: <22 characters of URL-safe base64, no padding>

The ID tells incarnations of one topic name apart (a topic deleted and created
again): replicas are compared only with replicas of the same ID. A partition
dir without the file (written before topic IDs) has the ID "" and is compared
with the other ID-less ones; a malformed file is an AuditInputError.

Offset checkpoints (Kafka text format)::

    0                                    version
    <count>
    <topic> <partition> <offset>         count lines

Leader epoch checkpoint: the same with ``<epoch> <start_offset>`` lines.

RecordBatch v2 (big-endian)::

    0  baseOffset int64 | 8 batchLength int32 (bytes after this field)
    12 partitionLeaderEpoch int32 | 16 magic int8 (=2) | 17 crc uint32 (CRC32C of 21..end)
    21 attributes int16 (bits 0-2 codec: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)
    23 lastOffsetDelta int32 | 27 baseTimestamp int64 | 35 maxTimestamp int64
    43 producerId int64 | 51 producerEpoch int16 | 53 baseSequence int32
    57 recordCount int32 | 61 records (compressed as a whole when codec != 0)

Record: length varint, attributes int8, timestampDelta varlong, offsetDelta
varint, keyLength varint (-1 = null), key, valueLength varint, value,
headerCount varint, then per header keyLength varint, key, valueLength varint,
value (all varints zigzag-encoded).

A torn or corrupt tail is data, not a crash: the scan reports it as one row
with ``status`` ``torn`` or ``corrupt`` and stops that segment there (framing
after it cannot be trusted). A CRC mismatch with intact framing is reported
with ``status`` ``crc_mismatch`` and the scan goes on.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

LOG_OVERHEAD = 12
HEADER_SIZE = 61
BATCH_LENGTH_MIN = HEADER_SIZE - LOG_OVERHEAD
CRC_START = 21
MAGIC_V2 = 2
CODEC_MASK = 0x07

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_PREFIX = struct.Struct(">qi")
assert _PREFIX.size == LOG_OVERHEAD

STATUS_OK = "ok"
STATUS_CRC_MISMATCH = "crc_mismatch"
STATUS_CORRUPT = "corrupt"  # framing broken: the rest of the segment is unreadable
STATUS_TORN = "torn"        # the file ends inside a batch

SEGMENT_SUFFIX = ".log"
EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
_TOPIC_ID_TEXT = re.compile(r"^[A-Za-z0-9_-]{22}$")
OFFSET_CHECKPOINTS = {
    "replication-offset-checkpoint": "high-watermark",
    "recovery-point-offset-checkpoint": "recovery-point",
    "log-start-offset-checkpoint": "log-start-offset",
}
_PARTITION_DIR = re.compile(r"^(?P<topic>[a-zA-Z0-9._-]{1,249})-(?P<partition>\d+)$")
_BROKER_DIR = re.compile(r"^broker[-_]?(?P<id>\d+)$")
_SCAN_DEPTH_MAX = 6  # how deep below an input folder data dirs are looked for


class AuditInputError(Exception):
    """An input cannot be read at all (missing path, nothing to audit, bad file)."""


class CheckpointFormatError(ValueError):
    """A checkpoint file does not follow the text format; carries the path and line."""

    def __init__(self, message: str, path: str, line: int):
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


class RecordDecodeError(ValueError):
    """The records section of a batch cannot be decoded (bad varint, codec, lengths)."""


# ---------------------------------------------------------------- discovery


@dataclass(frozen=True, slots=True)
class SegmentFile:
    broker_id: int
    data_dir: str
    topic: str
    partition: int
    path: str
    base_offset: int  # from the file name
    size_bytes: int
    topic_id: str = ""  # partition.metadata's, "" without one


@dataclass(frozen=True, slots=True)
class PartitionDir:
    broker_id: int
    data_dir: str
    topic: str
    partition: int
    path: str
    topic_id: str = ""


@dataclass(slots=True)
class Inventory:
    """Everything found under the input paths, in a stable order."""

    data_dirs: dict[str, int] = field(default_factory=dict)  # path -> broker id
    partition_dirs: list[PartitionDir] = field(default_factory=list)
    segments: list[SegmentFile] = field(default_factory=list)


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``"orders-3"`` -> ``("orders", 3)``; None for anything else (``x-0.abc-delete``)."""
    m = _PARTITION_DIR.match(name)
    if m is None or m["topic"] in (".", ".."):
        return None
    return m["topic"], int(m["partition"])


def segment_base_offset(path: str | Path) -> int | None:
    stem = Path(path).name[: -len(SEGMENT_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def _is_partition_dir(path: Path) -> bool:
    if parse_partition_dir_name(path.name) is None or not path.is_dir():
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(n.endswith(SEGMENT_SUFFIX) or n == EPOCH_CHECKPOINT for n in names)


def parse_partition_metadata(text: str, path: str = PARTITION_METADATA) -> str:
    """The topic ID (22-character text) in a partition.metadata file's text."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    fields = [line.partition(":") for line in lines]
    if (len(fields) != 2 or [f[0].strip() for f in fields] != ["version", "topic_id"]
            or any(not sep for _k, sep, _v in fields)):
        raise AuditInputError(f"{path}: not a partition.metadata file")
    version, topic_id = (f[2].strip() for f in fields)
    if version != "0":
        raise AuditInputError(f"{path}:1: unsupported version {version!r}")
    if not _TOPIC_ID_TEXT.match(topic_id):
        raise AuditInputError(f"{path}:2: bad topic id {topic_id!r}")
    return topic_id


def read_topic_id(partition_dir: Path) -> str:
    """The partition dir's topic ID, "" when it has no partition.metadata."""
    path = partition_dir / PARTITION_METADATA
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as e:
        raise AuditInputError(f"cannot read {path}: {e}") from e
    return parse_partition_metadata(text, str(path))


def _read_meta_broker_id(data_dir: Path) -> int | None:
    meta = data_dir / "meta.properties"
    try:
        text = meta.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("broker.id", "node.id") and value.strip().lstrip("-").isdigit():
            return int(value.strip())
    return None


def broker_id_for(data_dir: Path) -> int | None:
    """meta.properties in the data dir, else the nearest ``broker-N`` folder up the path."""
    found = _read_meta_broker_id(data_dir)
    if found is not None:
        return found
    for part in (data_dir, *data_dir.parents):
        m = _BROKER_DIR.match(part.name)
        if m:
            return int(m["id"])
    return None


def _partition_dirs_under(root: Path) -> Iterator[Path]:
    if _is_partition_dir(root):
        yield root
        return
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir())
        except OSError as e:
            raise AuditInputError(f"cannot list {folder}: {e}") from e
        for child in reversed(children):
            if _is_partition_dir(child):
                yield child
            elif depth + 1 < _SCAN_DEPTH_MAX:
                stack.append((child, depth + 1))


def discover(paths: Iterable[str | Path]) -> Inventory:
    """Find data dirs, partition dirs and segments under ``paths``.

    A path may be a folder of broker folders, one broker's data dir, one
    partition dir or one ``.log`` segment. Brokers with no id on disk are
    numbered -1, -2, ... in path order. Raises AuditInputError when a path is
    missing or nothing at all is found.
    """
    inventory = Inventory()
    unknown_ids: dict[str, int] = {}
    single_segments: list[Path] = []
    partition_paths: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise AuditInputError(f"no such file or folder: {raw}")
        if path.is_file():
            if not path.name.endswith(SEGMENT_SUFFIX):
                raise AuditInputError(f"not a segment file (*.log): {raw}")
            if parse_partition_dir_name(path.parent.name) is None:
                raise AuditInputError(f"segment {raw} is not inside a <topic>-<partition> folder")
            single_segments.append(path)
            continue
        partition_paths.extend(_partition_dirs_under(path))

    def broker_of(data_dir: Path) -> int:
        key = str(data_dir)
        if key not in inventory.data_dirs:
            found = broker_id_for(data_dir)
            if found is None:
                found = unknown_ids.setdefault(key, -1 - len(unknown_ids))
            inventory.data_dirs[key] = found
        return inventory.data_dirs[key]

    seen: set[str] = set()
    for pdir in partition_paths:
        if str(pdir) in seen:
            continue
        seen.add(str(pdir))
        topic, partition = parse_partition_dir_name(pdir.name)  # type: ignore[misc]
        broker = broker_of(pdir.parent)
        topic_id = read_topic_id(pdir)
        inventory.partition_dirs.append(
            PartitionDir(broker, str(pdir.parent), topic, partition, str(pdir), topic_id))
        for seg in sorted(pdir.glob("*" + SEGMENT_SUFFIX)):
            base = segment_base_offset(seg)
            if base is not None:
                inventory.segments.append(SegmentFile(
                    broker, str(pdir.parent), topic, partition, str(seg), base,
                    seg.stat().st_size, topic_id))
    for seg in single_segments:
        if str(seg) in {s.path for s in inventory.segments}:
            continue
        topic, partition = parse_partition_dir_name(seg.parent.name)  # type: ignore[misc]
        broker = broker_of(seg.parent.parent)
        base = segment_base_offset(seg)
        inventory.segments.append(SegmentFile(
            broker, str(seg.parent.parent), topic, partition, str(seg),
            base if base is not None else -1, seg.stat().st_size, read_topic_id(seg.parent)))
    if not inventory.segments and not inventory.partition_dirs:
        raise AuditInputError("no Tidewater partition folders or segments found in: "
                              + ", ".join(str(p) for p in paths))
    return inventory


# ---------------------------------------------------------------- batches

# One row per batch, in this column order (see BATCH_COLUMNS in datasource.py).
BATCH_FIELDS = (
    "position", "base_offset", "last_offset", "record_count", "partition_leader_epoch",
    "magic", "attributes", "crc_stored", "crc_valid", "base_timestamp", "max_timestamp",
    "producer_id", "size_bytes", "status", "error", "prev_last_offset", "prev_epoch",
    "producer_epoch", "base_sequence",
)
# Statuses whose batch is whole (framing intact): they take part in offset and epoch order.
FRAMED_STATUSES = ("ok", "crc_mismatch")


# Segments are read in windows of about this many bytes (a batch larger than that
# gets a window of its own size), so memory stays flat however large a segment is.
WINDOW_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class SegmentWindow:
    """Whole batches of a segment file, read into memory.

    ``buf`` holds the file's bytes from ``offset``; ``end`` is where the file
    ends, relative to ``buf``: ``len(buf)`` except in the last window of a
    segment whose tail is broken (a batch whose length field is below the
    minimum or runs past the end of the file), where ``buf`` stops after that
    batch's header: the scan reports it and stops there.
    """

    buf: memoryview
    offset: int
    end: int


def segment_windows(path: str, window_bytes: int = WINDOW_BYTES) -> Iterator[SegmentWindow]:
    """The segment file as consecutive windows of whole batches; raises OSError.

    One buffer is reused (grown only for a batch larger than it), so a scan's
    memory is bounded by ``window_bytes`` or the largest batch, not the file
    size. A window's ``buf`` is valid until the next one is asked for.
    """
    with open(path, "rb", buffering=0) as f:
        file_size = os.fstat(f.fileno()).st_size
        buf = bytearray(max(window_bytes, HEADER_SIZE))
        offset = filled = 0  # file position of buf[0]; bytes of buf holding file data
        while offset < file_size:
            wanted = min(len(buf), file_size - offset)
            filled += _fill(f, buf, filled, file_size - offset)
            if filled < wanted:  # the file shrank while being read: it ends here
                file_size = offset + filled
            pos, stop, need = _whole_batches(buf, filled, file_size - offset)
            if stop is not None:  # the rest of the file is one broken batch
                yield SegmentWindow(memoryview(buf)[:stop], offset, file_size - offset)
                return
            if pos:
                yield SegmentWindow(memoryview(buf)[:pos], offset, pos)
            buf[:filled - pos] = buf[pos:filled]
            offset += pos
            filled -= pos
            if need > len(buf):  # a batch larger than the window: a buffer of its size
                grown = bytearray(need)
                grown[:filled] = buf[:filled]
                buf = grown


def _fill(f, buf: bytearray, filled: int, file_left: int) -> int:
    """Read into ``buf[filled:]`` until it is full or the file ends; the bytes read."""
    view = memoryview(buf)
    total = 0
    want = min(len(buf) - filled, file_left - filled)
    while total < want:
        n = f.readinto(view[filled + total: filled + want])
        if not n:
            break  # the file shrank under us: what was read is what there is
        total += n
    view.release()
    return total


def _whole_batches(buf: bytearray, filled: int, file_left: int) -> tuple[int, int | None, int]:
    """(bytes of whole batches at the start of buf, stop, bytes the next batch needs).

    ``stop`` is not None when the batch after the whole ones is broken (the file
    ends inside its header, its length is below the minimum or runs past the
    end of the file, or its magic is wrong): the window then ends ``stop``
    bytes in, after that batch's header or at the end of the file, and the
    scan of that window reports it and stops.
    """
    pos = 0
    unpack = _PREFIX.unpack_from
    while True:
        left = file_left - pos
        if left <= 0:
            return pos, None, 0
        head = min(left, HEADER_SIZE)
        if filled - pos < head:
            return pos, None, head
        if left < HEADER_SIZE:
            return pos, pos + left, 0
        _base, length = unpack(buf, pos)
        size = LOG_OVERHEAD + length
        if length < BATCH_LENGTH_MIN or size > left or buf[pos + 16] != MAGIC_V2:
            return pos, pos + HEADER_SIZE, 0
        if pos + size > filled:
            return pos, None, size
        pos += size


def scan_batches(buf) -> Iterator[tuple]:
    """Yield one tuple per batch in ``buf`` (fields in BATCH_FIELDS order).

    Never raises on bad data: a torn or corrupt batch is the last row, with a
    status and a reason.
    """
    yield from scan_batch_chunks(buf, chunk_rows=1 << 62, flat=True)


def scan_batch_chunks(buf, chunk_rows: int = 65536, flat: bool = False, start: int = 0,
                      prev: tuple[int | None, int | None] = (None, None), *,
                      end: int | None = None, position_base: int = 0) -> Iterator:
    """Like scan_batches, but yields lists of row tuples of at most ``chunk_rows``.

    ``start`` and ``prev`` resume a scan: the position of a batch and the last
    offset and epoch of the whole batch before it (summarize_buffer's hand-over).
    ``end`` (default ``len(buf)``) is where the file ends relative to ``buf``
    (a SegmentWindow's), and ``position_base`` the file position of ``buf[0]``:
    rows carry file positions.

    This is the hot loop of the audit: one struct unpack and one CRC call per
    batch, nothing else. Each row also carries the last offset and epoch of the
    previous whole batch of the same buffer (None for the first), so offset and
    epoch order within a segment is a filter, not a sort, downstream.
    """
    view = memoryview(buf)
    end = len(buf) if end is None else end
    unpack = _HEADER.unpack_from
    pos = start
    prev_last, prev_epoch = prev
    rows: list[tuple] = []
    append = rows.append
    while pos < end:
        remaining = end - pos
        if remaining < HEADER_SIZE:
            if remaining >= LOG_OVERHEAD:
                base, length = _PREFIX.unpack_from(buf, pos)
                reason = f"file ends {remaining} bytes into a batch of {LOG_OVERHEAD + length}"
            else:
                base, reason = None, f"file ends {remaining} bytes into a batch header"
            append((pos + position_base, base, None, None, None, None, None, None, False, None, None, None,
                    remaining, STATUS_TORN, reason, prev_last, prev_epoch, None, None))
            break
        (base, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch,
         bseq, count) = unpack(buf, pos)
        size = LOG_OVERHEAD + length
        if length < BATCH_LENGTH_MIN or magic != MAGIC_V2:
            reason = (f"batch length {length} below minimum {BATCH_LENGTH_MIN}"
                      if length < BATCH_LENGTH_MIN else f"unsupported magic {magic}")
            append((pos + position_base, base, None, None, epoch, magic, None, crc, False, None, None, None,
                    remaining, STATUS_CORRUPT, reason, prev_last, prev_epoch, None, None))
            break
        if size > remaining:
            append((pos + position_base, base, base + last_delta, count, epoch, magic, attrs, crc, False,
                    base_ts, max_ts, pid, remaining, STATUS_TORN,
                    f"batch of {size} bytes but only {remaining} left in the file",
                    prev_last, prev_epoch, pepoch, bseq))
            break
        computed = crc32c(view[pos + CRC_START: pos + size])
        last = base + last_delta
        if computed != crc:
            append((pos + position_base, base, last, count, epoch, magic, attrs, crc, False, base_ts, max_ts,
                    pid, size, STATUS_CRC_MISMATCH,
                    f"CRC mismatch: stored {crc:#010x}, computed {computed:#010x}",
                    prev_last, prev_epoch, pepoch, bseq))
        elif last_delta < 0 or count < 0:
            append((pos + position_base, base, last, count, epoch, magic, attrs, crc, True, base_ts, max_ts,
                    pid, size, STATUS_CORRUPT, "negative lastOffsetDelta or record count",
                    prev_last, prev_epoch, pepoch, bseq))
            last = None  # not a whole batch: it takes no part in offset order
        else:
            append((pos + position_base, base, last, count, epoch, magic, attrs, crc, True, base_ts, max_ts,
                    pid, size, STATUS_OK, None, prev_last, prev_epoch, pepoch, bseq))
        if last is not None:
            prev_last, prev_epoch = last, epoch
        pos += size
        if len(rows) >= chunk_rows:
            if flat:
                yield from rows
            else:
                yield rows
            rows = []
            append = rows.append
    if rows:
        if flat:
            yield from rows
        else:
            yield rows
    view.release()


def scan_ended(row: tuple) -> bool:
    """Whether a batch row ends its segment's scan (framing lost: torn or corrupt)."""
    return row[13] in (STATUS_TORN, STATUS_CORRUPT) and not row[8]


def prev_after(row: tuple) -> tuple[int | None, int | None]:
    """The (last offset, epoch) of the last whole batch up to and including ``row``."""
    if row[13] in FRAMED_STATUSES and row[2] is not None:
        return row[2], row[4]
    return row[15], row[16]


def _unreadable_row(e: OSError) -> tuple:
    return (0, None, None, None, None, None, None, None, False, None, None, None, 0,
            STATUS_CORRUPT, f"cannot read segment: {e}", None, None, None, None)


def scan_segment_file(path: str, chunk_rows: int = 65536,
                      window_bytes: int = WINDOW_BYTES) -> Iterator[list[tuple]]:
    """Chunks of batch rows of one segment file; an unreadable file is one ``corrupt`` row.

    The file is read window by window (segment_windows), so memory is bounded by
    the window and ``chunk_rows``, not the file size.
    """
    pending: list[tuple] = []
    prev: tuple[int | None, int | None] = (None, None)
    try:
        for window in segment_windows(path, window_bytes):
            ended = False
            for rows in scan_batch_chunks(window.buf, chunk_rows, prev=prev, end=window.end,
                                          position_base=window.offset):
                prev = prev_after(rows[-1])
                ended = scan_ended(rows[-1])
                pending.extend(rows)
                if len(pending) >= chunk_rows:
                    yield pending
                    pending = []
            if ended:
                break
    except OSError as e:
        pending.append(_unreadable_row(e))
    if pending:
        yield pending


# ---------------------------------------------------------------- segment summaries

# The batch-level rules, decided here per segment (see summarize_segment).
RULE_BATCH_CRC = "batch_crc_and_framing"
RULE_OFFSETS = "offsets_contiguous"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
COMPACTED_MARKER = ".compacted"  # in a partition dir: its log is compacted
RULE_EPOCHS = "epochs_monotonic"

# One summary per segment, in this order (see SEGMENT_COLUMNS in datasource.py).
SEGMENT_FIELDS = (
    "batch_count", "row_count", "first_base_offset", "first_epoch", "last_offset",
    "last_epoch", "log_start_offset", "log_end_offset", "bad_batches", "offset_order_breaks",
    "epoch_drops", "violations", "epoch_changes", "last_base_offset", "base_order_breaks",
    "idempotent_batches",
)


def offset_order_problem(base_offset: int, prev_last_offset: int) -> str:
    """The detail of an offsets_contiguous violation: a gap or an overlap."""
    if base_offset > prev_last_offset + 1:
        return f"gap: offsets {prev_last_offset + 1}..{base_offset - 1} missing"
    return f"overlap: batch starts at {base_offset} after a batch ending at {prev_last_offset}"


def epoch_drop_problem(epoch: int, prev_epoch: int) -> str:
    """The detail of an epochs_monotonic violation."""
    return f"batch epoch {epoch} after epoch {prev_epoch}"


class _SegmentSummary:
    """The running state of summarize_segment / summarize_buffer (one segment)."""

    __slots__ = ("segment_base_offset", "batch_count", "row_count", "bad", "breaks", "drops",
                 "first_base", "first_epoch", "last_offset", "last_epoch", "log_start",
                 "log_end", "violations", "changes", "prev_last", "prev_epoch", "last_base",
                 "base_breaks", "idempotent")

    def __init__(self, segment_base_offset: int):
        self.segment_base_offset = segment_base_offset
        self.batch_count = self.row_count = self.bad = self.breaks = self.drops = 0
        self.first_base = self.first_epoch = self.last_offset = self.last_epoch = None
        self.log_start = self.log_end = None  # log_end: the largest last offset so far
        self.violations: list[tuple] = []
        self.changes: list[tuple] = []
        # The last whole batch so far (what the next window's first batch follows).
        self.prev_last: int | None = None
        self.prev_epoch: int | None = None
        # The base offset of the last whole batch so far; whole batches whose base offset
        # is not above the previous one's (replica_disagreements needs none); whole
        # batches of idempotent producers (producer id and base sequence set).
        self.last_base: int | None = None
        self.base_breaks = self.idempotent = 0

    def add_rows(self, rows: list[tuple]) -> None:
        """Batch rows (BATCH_FIELDS order) of the segment, in file order."""
        self.row_count += len(rows)
        violations, changes = self.violations, self.changes
        for (position, base, last, _count, epoch, _magic, _attrs, _crc, _valid, _base_ts,
             _max_ts, pid, _size, status, error, prev_last, prev_epoch, _pepoch,
             bseq) in rows:
            if status != STATUS_OK:
                self.bad += 1
                violations.append((RULE_BATCH_CRC, base,
                                   f"{status} in segment {self.segment_base_offset:020d}.log "
                                   f"at byte {position}: {error or ''}"))
                if status != STATUS_CRC_MISMATCH or base is None:
                    continue  # not a whole batch: no part in offset and epoch order
            self.batch_count += 1
            if self.last_base is not None and base <= self.last_base:
                self.base_breaks += 1
            self.last_base = base
            if pid >= 0 and bseq >= 0:
                self.idempotent += 1
            if self.first_base is None:
                self.first_base, self.first_epoch = base, epoch
                self.log_start, self.log_end = base, last
            elif base < self.log_start:
                self.log_start = base
            if last > self.log_end:
                self.log_end = last
            self.last_offset, self.last_epoch = last, epoch
            if prev_epoch is None:
                changes.append((position, epoch, base))
                continue  # the segment's first whole batch: nothing before it
            if base != prev_last + 1:
                self.breaks += 1
                violations.append((RULE_OFFSETS, base, offset_order_problem(base, prev_last)))
            if epoch != prev_epoch:
                changes.append((position, epoch, base))
                if epoch < prev_epoch:
                    self.drops += 1
                    violations.append((RULE_EPOCHS, base, epoch_drop_problem(epoch, prev_epoch)))

    def result(self) -> tuple | None:
        if not self.row_count:
            return None
        return (self.batch_count, self.row_count, self.first_base, self.first_epoch,
                self.last_offset, self.last_epoch, self.log_start,
                None if self.log_end is None else self.log_end + 1, self.bad, self.breaks,
                self.drops, self.violations, self.changes, self.last_base, self.base_breaks,
                self.idempotent)


def summarize_segment(chunks: Iterable[list[tuple]], segment_base_offset: int) -> tuple | None:
    """One segment's summary (SEGMENT_FIELDS order) from its batch rows; None when it has none.

    The batch-level rules are decided here, batch by batch in file order, so
    Spark gets one row per segment instead of one per batch:

    - batch_crc_and_framing: every row whose status is not ``ok``;
    - offsets_contiguous: a whole batch (status ``ok`` or ``crc_mismatch``) that
      does not start right after the previous whole batch of the segment;
    - epochs_monotonic: a whole batch whose epoch is below the previous one's.

    ``violations`` lists them as (rule, offset, detail); ``epoch_changes`` the
    whole batches whose epoch differs from the previous whole batch's (the
    first one included) as (position, epoch, base_offset). The first and last
    whole batches (file order) and the counts let the caller check order
    across segments and summarize replicas. ``last_base_offset`` and
    ``base_order_breaks`` (whole batches whose base offset is not above the
    previous one's) say whether replica_disagreements may merge the log;
    ``idempotent_batches`` counts whole batches with a producer id and sequence.
    """
    summary = _SegmentSummary(segment_base_offset)
    for rows in chunks:
        summary.add_rows(rows)
    return summary.result()


def summarize_buffer(buf, segment_base_offset: int) -> tuple | None:
    """summarize_segment(scan_batch_chunks(buf)), without a row tuple per sound batch."""
    summary = _SegmentSummary(segment_base_offset)
    summarize_window(summary, buf, len(buf), 0)
    return summary.result()


def summarize_window(summary: _SegmentSummary, buf, end: int, position_base: int) -> bool:
    """Add one window of a segment (SegmentWindow's fields) to ``summary``; True: scan ended.

    The hot loop of the batch-level rules: while batches frame, pass their CRC
    and have sane counts, they are summarized straight from the header (one
    unpack and one CRC call each). From the first batch that does not, the rest
    of the window goes through scan_batch_chunks and summarize_segment's row
    logic, so damage is described by the one implementation.
    """
    view = memoryview(buf)
    unpack = _HEADER.unpack_from
    pos = 0
    prev_last, prev_epoch = summary.prev_last, summary.prev_epoch
    first_base, first_epoch = summary.first_base, summary.first_epoch
    log_start, log_end, last_epoch = summary.log_start, summary.log_end, summary.last_epoch
    last_base = summary.last_base
    sound = breaks = drops = base_breaks = idempotent = 0
    violations, changes = summary.violations, summary.changes
    try:
        while end - pos >= HEADER_SIZE:
            (base, length, epoch, magic, crc, _attrs, last_delta, _base_ts, _max_ts, pid,
             _pepoch, bseq, count) = unpack(buf, pos)
            size = LOG_OVERHEAD + length
            if (length < BATCH_LENGTH_MIN or magic != MAGIC_V2 or size > end - pos
                    or last_delta < 0 or count < 0
                    or crc32c(view[pos + CRC_START: pos + size]) != crc):
                break  # not a sound batch: the row logic describes it and the rest
            last = base + last_delta
            sound += 1
            if last_base is not None and base <= last_base:
                base_breaks += 1
            last_base = base
            if pid >= 0 and bseq >= 0:
                idempotent += 1
            if prev_epoch is None:
                first_base, first_epoch, log_start, log_end = base, epoch, base, last
                changes.append((pos + position_base, epoch, base))
            else:
                if base != prev_last + 1:
                    breaks += 1
                    violations.append((RULE_OFFSETS, base, offset_order_problem(base, prev_last)))
                    if base < log_start:
                        log_start = base
                if epoch != prev_epoch:
                    changes.append((pos + position_base, epoch, base))
                    if epoch < prev_epoch:
                        drops += 1
                        violations.append((RULE_EPOCHS, base,
                                           epoch_drop_problem(epoch, prev_epoch)))
                if last > log_end:
                    log_end = last
            prev_last = last
            prev_epoch = last_epoch = epoch
            pos += size
    finally:
        view.release()
    if sound:
        summary.batch_count += sound
        summary.row_count += sound
        summary.breaks += breaks
        summary.drops += drops
        summary.first_base, summary.first_epoch = first_base, first_epoch
        summary.last_offset, summary.last_epoch = prev_last, last_epoch
        summary.log_start, summary.log_end = log_start, log_end
        summary.prev_last, summary.prev_epoch = prev_last, prev_epoch
        summary.last_base = last_base
        summary.base_breaks += base_breaks
        summary.idempotent += idempotent
    ended = False
    if pos < end:
        for rows in scan_batch_chunks(buf, start=pos, prev=(prev_last, prev_epoch), end=end,
                                      position_base=position_base):
            summary.add_rows(rows)
            summary.prev_last, summary.prev_epoch = prev_after(rows[-1])
            ended = scan_ended(rows[-1])
    return ended


def summarize_segment_file(segment: SegmentFile,
                           window_bytes: int = WINDOW_BYTES) -> tuple | None:
    """The summary of one segment file, read window by window (memory stays bounded).

    An unreadable file is one ``corrupt`` row, as in scan_segment_file.
    """
    summary = _SegmentSummary(segment.base_offset)
    try:
        for window in segment_windows(segment.path, window_bytes):
            if summarize_window(summary, window.buf, window.end, window.offset):
                break
    except OSError as e:
        summary.add_rows([_unreadable_row(e)])
    return summary.result()


# ---------------------------------------------------------------- replica comparison


class ReplicaOrderError(AuditInputError):
    """A log compared by replica_disagreements holds batches out of base-offset order.

    The driver compares by merge only replicas whose segment summaries showed strictly
    increasing base offsets, so this means a segment changed between the two reads.
    """


def whole_batch_keys(path: str, window_bytes: int = WINDOW_BYTES) -> Iterator[tuple]:
    """(base_offset, last_offset, partition_leader_epoch, crc_stored) of each whole batch
    (status ``ok`` or ``crc_mismatch``) of one segment file, in file order.

    The same batches as scan_segment_file's whole rows, without building rows: while
    batches frame and have sane counts they are read straight from the header (no CRC:
    a CRC mismatch still makes a whole batch). From the first batch that does not, the
    rest of the window goes through scan_batch_chunks, so damage is decided by the one
    implementation. An unreadable file ends the keys where reading stopped.
    """
    unpack = _HEADER.unpack_from
    try:
        for window in segment_windows(path, window_bytes):
            buf, end, pos = window.buf, window.end, 0
            while end - pos >= HEADER_SIZE:
                (base, length, epoch, magic, crc, _attrs, last_delta, _base_ts, _max_ts, _pid,
                 _pepoch, _bseq, count) = unpack(buf, pos)
                size = LOG_OVERHEAD + length
                if (length < BATCH_LENGTH_MIN or magic != MAGIC_V2 or size > end - pos
                        or last_delta < 0 or count < 0):
                    break
                yield base, base + last_delta, epoch, crc
                pos += size
            if pos < end:
                ended = False
                for rows in scan_batch_chunks(buf, start=pos, end=end,
                                              position_base=window.offset):
                    for row in rows:
                        if row[13] in FRAMED_STATUSES and row[1] is not None:
                            yield row[1], row[2], row[4], row[7]
                    ended = scan_ended(rows[-1])
                if ended:
                    return
    except OSError:
        return  # scan_segment_file reports it (one corrupt row); no more whole batches


def replica_disagreements(replicas: list[tuple[int, list[str]]]) -> Iterator[tuple]:
    """The batches of one topic incarnation that not every replica holds identically.

    ``replicas``: (broker id, its segment files in base-offset order) per replica log;
    each log's whole batches must have strictly increasing base offsets (else
    ReplicaOrderError). The logs are merged by base offset: batches every replica
    holds identically (offsets, epoch, CRC) are dropped as they go by, so memory
    holds one batch key per log. Yields (base_offset, last_offset,
    partition_leader_epoch, crc_stored, holders): each other distinct batch with the
    broker of every log holding it (a broker twice when two of its logs do), what a
    group-by of every copy on those four columns gives for those batches.
    """
    if not replicas:
        return
    brokers = [broker for broker, _paths in replicas]
    everyone = len(set(brokers))
    logs = [_chain_keys(paths) for _broker, paths in replicas]
    heads = [next(log, None) for log in logs]
    count = len(logs)
    while True:
        first = heads[0]
        if first is not None and heads.count(first) == count:
            base = first[0]  # the common case: every log's next batch is this one
            for i, log in enumerate(logs):
                following = heads[i] = next(log, None)
                if following is not None and following[0] <= base:
                    raise _order_error(replicas[i], following[0], base)
            continue
        live = [h[0] for h in heads if h is not None]
        if not live:
            return
        base = min(live)
        holders: dict[tuple, list[int]] = {}
        for i, head in enumerate(heads):
            if head is not None and head[0] == base:
                holders.setdefault(head, []).append(brokers[i])
                following = heads[i] = next(logs[i], None)
                if following is not None and following[0] <= base:
                    raise _order_error(replicas[i], following[0], base)
        for key, held_by in holders.items():
            if len(set(held_by)) < everyone:
                yield (*key, held_by)


def _chain_keys(paths: list[str]) -> Iterator[tuple]:
    for path in paths:
        yield from whole_batch_keys(path)


def _order_error(replica: tuple[int, list[str]], base: int, previous: int) -> ReplicaOrderError:
    return ReplicaOrderError(
        f"broker {replica[0]}: a batch at base offset {base} follows one at {previous} in "
        f"{', '.join(replica[1])} (did the files change during the audit?)")


# ---------------------------------------------------------------- records


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """Zigzag varint (up to 64 bits) at ``pos``: (value, next position)."""
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise RecordDecodeError("varint runs past the end of the records")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise RecordDecodeError("varint longer than 10 bytes")


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise RecordDecodeError(f"field of {length} bytes runs past the end of the records")
    return bytes(buf[pos: pos + length]), pos + length


def decompress(codec: int, data: bytes) -> bytes:
    """Uncompressed records section for a batch with compression ``codec``."""
    try:
        if codec == 0:
            return data
        if codec == 1:
            return gzip.decompress(data)
        if codec == 2:
            return _snappy_decompress(data)
        if codec == 3:
            import lz4.frame

            return lz4.frame.decompress(data)
        if codec == 4:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                return reader.read()
    except RecordDecodeError:
        raise
    except Exception as e:  # each codec library raises its own error types
        raise RecordDecodeError(f"codec {codec}: cannot decompress: {e}") from e
    raise RecordDecodeError(f"unknown compression codec {codec}")


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_decompress(data: bytes) -> bytes:
    """Raw snappy, or the xerial framing Kafka's Java client writes."""
    try:
        import cramjam

        raw = cramjam.snappy.decompress_raw
    except ImportError:
        try:
            import snappy

            raw = snappy.decompress
        except ImportError:
            raise RecordDecodeError("snappy batch but no snappy library installed") from None
    if data.startswith(_XERIAL_MAGIC):
        out = bytearray()
        pos = 16  # magic, version, compatible version
        while pos + 4 <= len(data):
            (n,) = struct.unpack_from(">i", data, pos)
            out += bytes(raw(data[pos + 4: pos + 4 + n]))
            pos += 4 + n
        return bytes(out)
    return bytes(raw(data))


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    header_count: int


def decode_batch_records(buf, position: int, size: int) -> list[DecodedRecord]:
    """Decode the records of the (framed) batch at ``position``; raises RecordDecodeError."""
    (base, _length, _epoch, _magic, _crc, attrs, _lod, base_ts, _max_ts, _pid, _pe, _bs,
     count) = _HEADER.unpack_from(buf, position)
    data = decompress(attrs & CODEC_MASK, bytes(buf[position + HEADER_SIZE: position + size]))
    records: list[DecodedRecord] = []
    pos = 0
    for _ in range(count):
        length, pos = _read_varint(data, pos)
        record_end = pos + length
        if length < 0 or record_end > len(data):
            raise RecordDecodeError(f"record length {length} runs past the end of the batch")
        pos += 1  # record attributes
        ts_delta, pos = _read_varint(data, pos)
        offset_delta, pos = _read_varint(data, pos)
        key, pos = _read_bytes(data, pos)
        value, pos = _read_bytes(data, pos)
        header_count, pos = _read_varint(data, pos)
        for _h in range(max(header_count, 0)):
            _hk, pos = _read_bytes(data, pos)
            _hv, pos = _read_bytes(data, pos)
        if pos != record_end:
            raise RecordDecodeError(
                f"record declares {length} bytes, its fields take {pos - record_end + length}")
        records.append(DecodedRecord(base + offset_delta, base_ts + ts_delta, key, value,
                                     header_count))
    if pos != len(data):
        raise RecordDecodeError(f"{len(data) - pos} bytes after the last of {count} records")
    return records


def payload_hash(data: bytes | None) -> str | None:
    """Short stable digest of a key or value (hex), None for null."""
    if data is None:
        return None
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# ---------------------------------------------------------------- checkpoints


def compacted_partitions(data_dirs: Iterable[str | Path]) -> frozenset[tuple[str, int]]:
    """(topic, partition) of every compacted partition: a replica's directory holds the
    ``.compacted`` marker, or a broker's ``cleaner-offset-checkpoint`` (Kafka's file,
    offset checkpoint format) lists it. Their replicas may have offset gaps and hold
    different subsets of the old records."""
    found: set[tuple[str, int]] = set()
    for data_dir in data_dirs:
        for marker in Path(data_dir).glob(f"*/{COMPACTED_MARKER}"):
            parsed = parse_partition_dir_name(marker.parent.name)
            if parsed is not None:
                found.add(parsed)
        path = Path(data_dir) / CLEANER_OFFSET_CHECKPOINT
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        found |= {(topic, partition) for topic, partition, _ in
                  parse_offset_checkpoint(text, str(path))}
    return frozenset(found)


def parse_offset_checkpoint(text: str, path: str = "<checkpoint>") -> list[tuple[str, int, int]]:
    """``topic partition offset`` entries; an empty file is empty. Raises CheckpointFormatError."""
    lines = text.splitlines()
    if not lines:
        return []
    count = _checkpoint_preamble(lines, path)
    entries = []
    for i, line in enumerate(lines[2: 2 + count], start=3):
        parts = line.split()
        if len(parts) != 3 or not _is_int(parts[1]) or not _is_int(parts[2]):
            raise CheckpointFormatError(f"expected 'topic partition offset', got {line!r}", path, i)
        entries.append((parts[0], int(parts[1]), int(parts[2])))
    return entries


def parse_epoch_checkpoint(text: str, path: str = "<checkpoint>") -> list[tuple[int, int]]:
    """``epoch start_offset`` entries; an empty file is empty. Raises CheckpointFormatError."""
    lines = text.splitlines()
    if not lines:
        return []
    count = _checkpoint_preamble(lines, path)
    entries = []
    for i, line in enumerate(lines[2: 2 + count], start=3):
        parts = line.split()
        if len(parts) != 2 or not all(_is_int(p) for p in parts):
            raise CheckpointFormatError(f"expected 'epoch start_offset', got {line!r}", path, i)
        entries.append((int(parts[0]), int(parts[1])))
    return entries


def _checkpoint_preamble(lines: list[str], path: str) -> int:
    if lines[0].strip() != "0":
        raise CheckpointFormatError(f"unsupported version {lines[0]!r}", path, 1)
    if len(lines) < 2 or not lines[1].strip().isdigit():
        raise CheckpointFormatError("missing entry count", path, 2)
    count = int(lines[1])
    body = [ln for ln in lines[2:] if ln.strip()]
    if len(body) != count:
        raise CheckpointFormatError(f"count says {count} entries, file has {len(body)}", path, 2)
    return count


def _is_int(s: str) -> bool:
    return s.lstrip("-").isdigit()
