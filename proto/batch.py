"""Batch-level operations on Kafka RecordBatch v2 bytes that never decode records.

These are the broker's hot path: produce validates and restamps whole batches,
fetch and replication move them as opaque bytes.

Byte layout of one batch (big-endian, Kafka's ``DefaultRecordBatch``)::

    offset  size  field
    0       8     baseOffset              int64   \\
    8       4     batchLength             int32    | outside the CRC; batchLength
    12      4     partitionLeaderEpoch    int32    | counts bytes after this field
    16      1     magic                   int8    /  (must be 2)
    17      4     crc                     uint32  CRC32C of bytes 21..end
    21      2     attributes              int16   bits 0-2 compression, bit 3
                                                  timestamp type, 4 transactional,
                                                  5 control, 6 deleteHorizon
    23      4     lastOffsetDelta         int32
    27      8     baseTimestamp           int64
    35      8     maxTimestamp            int64
    43      8     producerId              int64
    51      2     producerEpoch           int16
    53      4     baseSequence            int32
    57      4     recordCount             int32
    61      ...   records (possibly compressed)

A whole batch is ``12 + batchLength`` bytes. Because baseOffset and
partitionLeaderEpoch lie before the CRC'd range, a broker restamps them in
place without recomputing the CRC.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple, TypeAlias

from tidewater.proto.crc import crc32c, crc32c_holding_gil
from tidewater.proto.errors import CorruptRecordError

MAGIC_V2 = 2
LOG_OVERHEAD = 12  # baseOffset + batchLength
HEADER_SIZE = 61
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
# Smallest legal batchLength: the header after the length field, no records.
BATCH_LENGTH_MIN = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

NO_PARTITION_LEADER_EPOCH = -1

# What batches are read from: bytes from a file or the wire, a buffer being built,
# or a view into either.
BytesLike: TypeAlias = bytes | bytearray | memoryview

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes,
# lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
assert _PREFIX.size == LOG_OVERHEAD
_OFFSET_AND_EPOCH = struct.Struct(">q4xi")  # baseOffset, (length), epoch
_BASE_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")


class BatchHeader(NamedTuple):
    """The unpacked header. A tuple (built straight from ``struct.unpack_from``): a frozen
    dataclass's ``__init__`` costs a call per field, per batch, on produce and fetch paths."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes on disk and on the wire."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


_new_header = tuple.__new__


def read_header(buf: BytesLike, position: int = 0) -> BatchHeader:
    """Unpack the 61-byte header at ``position`` without any validation."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header: {len(buf) - position} of {HEADER_SIZE} bytes",
            position=position,
        )
    return _new_header(BatchHeader, _HEADER.unpack_from(buf, position))


def peek_batch_size(buf: BytesLike, position: int = 0) -> int | None:
    """Size of the batch starting at ``position``, or None if the length field is not there."""
    if len(buf) - position < LOG_OVERHEAD:
        return None
    batch_length: int = _PREFIX.unpack_from(buf, position)[1]
    return LOG_OVERHEAD + batch_length


def validate_batch(buf: BytesLike, position: int = 0, *,
                   max_size: int | None = None) -> BatchHeader:
    """Check framing, magic and CRC of the batch at ``position``; return its header.

    Raises CorruptRecordError (with the position and a reason) on anything wrong.
    """
    available = len(buf) - position
    if available < LOG_OVERHEAD:
        raise CorruptRecordError(
            f"truncated batch: {available} bytes, need {LOG_OVERHEAD} for offset and length",
            position=position,
        )
    batch_length = _PREFIX.unpack_from(buf, position)[1]
    if batch_length < BATCH_LENGTH_MIN:
        raise CorruptRecordError(f"batch length {batch_length} below minimum", position=position)
    size = LOG_OVERHEAD + batch_length
    if max_size is not None and size > max_size:
        raise CorruptRecordError(
            f"batch size {size} exceeds maximum {max_size}", position=position, too_large=True
        )
    if size > available:
        raise CorruptRecordError(
            f"truncated batch: length says {size} bytes, {available} present", position=position
        )
    header = _new_header(BatchHeader, _HEADER.unpack_from(buf, position))
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(f"unsupported magic {header.magic}", position=position)
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptRecordError("negative lastOffsetDelta or record count", position=position)
    computed = crc32c(memoryview(buf)[position + ATTRIBUTES_OFFSET : position + size])
    if computed != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch: stored {header.crc:#010x}, computed {computed:#010x}",
            position=position,
        )
    return header


def iter_batches(buf: BytesLike, position: int = 0, *,
                 validate: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for every batch in ``buf``.

    With ``validate`` every batch is CRC-checked and a damaged or torn one raises
    CorruptRecordError; without it only framing is checked.
    """
    end = len(buf)
    while position < end:
        if validate:
            header = validate_batch(buf, position)
        else:
            header = read_header(buf, position)
            if header.batch_length < BATCH_LENGTH_MIN or position + header.size > end:
                raise CorruptRecordError("truncated or malformed batch", position=position)
        yield position, header
        position += header.size


def set_base_offset_and_epoch(buf: bytearray | memoryview, position: int, base_offset: int,
                              partition_leader_epoch: int) -> None:
    """Restamp baseOffset and partitionLeaderEpoch in place (outside the CRC)."""
    _BASE_OFFSET.pack_into(buf, position, base_offset)
    _EPOCH.pack_into(buf, position + 12, partition_leader_epoch)


_PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
_PRODUCER_FIELDS_AT = 43


def set_producer_fields(buf: bytearray, producer_id: int, producer_epoch: int,
                        base_sequence: int, position: int = 0) -> None:
    """Restamp a batch's producer id, epoch and base sequence (inside the CRC: rewritten)."""
    _PRODUCER_FIELDS.pack_into(buf, position + _PRODUCER_FIELDS_AT, producer_id, producer_epoch,
                               base_sequence)
    size = LOG_OVERHEAD + _PREFIX.unpack_from(buf, position)[1]
    # Holding the GIL, as BatchBuilder.build: a producer restamps on its I/O thread.
    struct.pack_into(">I", buf, position + 17, crc32c_holding_gil(
        memoryview(buf)[position + ATTRIBUTES_OFFSET:position + size]))


def batch_crc_valid(buf: BytesLike, position: int = 0) -> bool:
    try:
        validate_batch(buf, position)
    except CorruptRecordError:
        return False
    return True


def compute_crc(buf: BytesLike, position: int, size: int) -> int:
    """CRC32C over attributes..end of the batch at ``position``."""
    return crc32c(memoryview(buf)[position + ATTRIBUTES_OFFSET : position + size])
