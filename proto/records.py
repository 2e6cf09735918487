"""Kafka RecordBatch v2 records: the record format, and decoding.

``proto/batch.py`` owns the 61-byte batch header; this module owns what follows
it. The records part of a batch is ``recordCount`` records, compressed as one
block when the header's compression bits (attributes & 0x07) say so
(``proto/compression.py``: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).

One record (Kafka's ``DefaultRecord``; varints are zig-zag, as protobuf's sint)::

    length            varint   bytes of the record after this field
    attributes        int8     unused, 0
    timestampDelta    varlong  timestamp - batch baseTimestamp (may be negative)
    offsetDelta       varint   offset - batch baseOffset
    keyLength         varint   -1 = null key
    key               bytes
    valueLength       varint   -1 = null value
    value             bytes
    headersCount      varint
    headers           headersCount times:
        headerKeyLength    varint   (>= 0)
        headerKey          UTF-8 string
        headerValueLength  varint   -1 = null value
        headerValue        bytes

Batches are written by one encoder, ``proto/batch_builder.py``'s BatchBuilder
(record by record, as the producer does); ``encode_batch`` here is that builder
over a list of records.

Decoding is defensive: every length is checked against the bytes that are
there before anything is allocated, varints are capped at 5 (varint) or 10
(varlong) bytes, decompression stops at ``max_decompressed_bytes``. Anything
wrong is a CorruptRecordError with the batch's position, never a MemoryError
or an IndexError.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from tidewater.proto.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    BytesLike,
    iter_batches,
    validate_batch,
)
from tidewater.proto.batch_builder import BatchBuilder

# The compression codes and codecs belong to the record format: callers import them from here too.
from tidewater.proto.compression import (  # noqa: F401 - re-exported
    COMPRESSION_BY_NAME,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    DECOMPRESSED_BYTES_MAX,
    DecompressedTooLargeError,
    compress,
    decompress,
)
from tidewater.proto.errors import CorruptRecordError, UnsupportedCompressionError

VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10
# length(1) + attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount
RECORD_BYTES_MIN = 7

# A decoded record's headers: (name, value) in order.
RecordHeaders: TypeAlias = tuple[tuple[str, bytes | None], ...]


class Record(NamedTuple):
    """One decoded record with its absolute offset and timestamp.

    A tuple (not a frozen dataclass, whose ``__init__`` costs a call of
    ``object.__setattr__`` per field): the decoder builds one per record.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class ConsumerRecord(NamedTuple):
    """A record as the consumer hands it out (``client.consumer.ConsumerRecord``): decoded
    straight into this shape, with its partition and its batch's partitionLeaderEpoch."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    leader_epoch: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class SimpleRecord:
    """A record to encode; ``timestamp_ms=None`` takes the batch's base timestamp (or now)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None


# -- varints -------------------------------------------------------------------

def decode_varint(buf: BytesLike, position: int,
                  bytes_max: int = VARLONG_BYTES_MAX) -> tuple[int, int]:
    """``(value, next_position)`` of the zig-zag varint at ``position``.

    Raises ValueError when the buffer ends first or it is longer than ``bytes_max``.
    """
    end = len(buf)
    shift = 0
    raw = 0
    limit = position + bytes_max
    while True:
        if position >= end:
            raise ValueError("varint runs past the end")
        if position >= limit:
            raise ValueError(f"varint longer than {bytes_max} bytes")
        b = buf[position]
        position += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7


# -- encoding --------------------------------------------------------------------

def encode_batch(records: Sequence[tuple[bytes | None, bytes | None] | SimpleRecord], *,
                 base_offset: int = 0, partition_leader_epoch: int = -1,
                 compression: int = COMPRESSION_NONE, base_timestamp_ms: int | None = None,
                 producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1, attributes: int = 0) -> bytes:
    """One RecordBatch v2 (magic 2, CreateTime) holding ``records`` in order: a BatchBuilder
    given every record at once.

    Records are ``(key, value)`` pairs or SimpleRecord. A record without a
    timestamp gets ``base_timestamp_ms``, or the current time when that is None;
    the batch's baseTimestamp is ``base_timestamp_ms`` or the first record's.
    ``attributes``: bits besides compression (``TRANSACTIONAL_MASK`` for a transaction's).
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if compression not in COMPRESSION_NAMES:  # before any record is encoded
        raise UnsupportedCompressionError(f"unknown compression type {compression}")
    default_ts = base_timestamp_ms if base_timestamp_ms is not None else int(time.time() * 1000)
    builder = BatchBuilder(base_timestamp_ms)
    append = builder.append
    for record in records:
        if isinstance(record, SimpleRecord):
            ts = record.timestamp_ms
            append(record.key, record.value, record.headers, default_ts if ts is None else ts)
        else:
            key, value = record
            append(key, value, (), default_ts)
    return builder.build(compression, base_offset=base_offset,
                         partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
                         producer_epoch=producer_epoch, base_sequence=base_sequence,
                         attributes=attributes)


# -- decoding --------------------------------------------------------------------
#
# The consumer's hot path. Two loops parse the records part of a batch and must
# agree on every input (tests/unit/test_records_fast_path.py checks it):
#
# - the general one, ``_read_record``, checks every field where it is read;
# - the fast one, ``_read_rows``, handles the shape producers write (varints of
#   1-2 bytes) with few checks inline and leaves anything else to
#   ``_read_record``, restarting that record from its first byte. A fast-path
#   record is accepted only when its fields end exactly at the end its length
#   field gives (which lies inside the records part), so a damaged record always
#   reaches ``_read_record``, which raises the precise error. Reading past the
#   end of the buffer (IndexError) also falls back to it.
#
# Rows are built once, straight in the class the caller hands out (``Record`` or
# ``ConsumerRecord``), with ``tuple.__new__``: a NamedTuple's own ``__new__`` is a
# Python function (~0.4 us a record against ~0.25 us), a frozen dataclass's
# ``__init__`` calls ``object.__setattr__`` per field.

_new_row = tuple.__new__


def _read_rows(data: bytes, pos: int, end: int, header: BatchHeader,
               topic: str | None = None, partition: int = -1) -> list[Any]:
    """Rows for ``header.record_count`` records in ``data[pos:end]`` (already decompressed).

    With ``topic`` None the rows are Record, else ConsumerRecord of ``topic``,
    ``partition`` and the batch's leader epoch. Raises ValueError describing the
    first thing wrong.
    """
    record_count = header.record_count
    if record_count > (end - pos) // RECORD_BYTES_MIN:
        raise ValueError(f"record count {record_count} cannot fit in {end - pos} bytes")
    rows: list[Any] = []  # Record, or ConsumerRecord when topic is given
    headers: RecordHeaders
    append = rows.append
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    # LogAppendTime: every record has the batch's max timestamp.
    fixed_ts = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    epoch = header.partition_leader_epoch
    remaining = record_count
    while remaining:
        start = pos
        try:
            while remaining:
                start = pos
                # length: 1 or 2 bytes, positive (raw even); >= 6 for the fields below
                b = data[pos]
                if b < 0x80:
                    length = b >> 1
                    pos += 1
                else:
                    b1 = data[pos + 1]
                    if b1 >= 0x80 or b & 1:
                        break
                    length = ((b & 0x7F) | (b1 << 7)) >> 1
                    pos += 2
                record_end = pos + length
                if b & 1 or length < RECORD_BYTES_MIN - 1 or record_end > end:
                    break
                # attributes (unused) at pos, then timestampDelta (zig-zag, may be negative)
                b = data[pos + 1]
                if b < 0x80:
                    ts_delta = (b >> 1) ^ -(b & 1)
                    pos += 2
                else:
                    b1 = data[pos + 2]
                    if b1 >= 0x80:
                        break
                    raw = (b & 0x7F) | (b1 << 7)
                    ts_delta = (raw >> 1) ^ -(raw & 1)
                    pos += 3
                b = data[pos]
                if b < 0x80:
                    offset_delta = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    b1 = data[pos + 1]
                    if b1 >= 0x80:
                        break
                    raw = (b & 0x7F) | (b1 << 7)
                    offset_delta = (raw >> 1) ^ -(raw & 1)
                    pos += 2
                # key: null (varint -1 = 0x01) or 1-2 byte length
                b = data[pos]
                if b == 1:
                    key = None
                    pos += 1
                elif b < 0x80 and not b & 1:
                    pos += 1
                    key = data[pos:pos + (b >> 1)]
                    pos += b >> 1
                else:
                    b1 = data[pos + 1]
                    if b1 >= 0x80 or b & 1:
                        break
                    n = ((b & 0x7F) | (b1 << 7)) >> 1
                    pos += 2
                    key = data[pos:pos + n]
                    pos += n
                b = data[pos]
                if b == 1:
                    value = None
                    pos += 1
                elif b < 0x80 and not b & 1:
                    pos += 1
                    value = data[pos:pos + (b >> 1)]
                    pos += b >> 1
                else:
                    b1 = data[pos + 1]
                    if b1 >= 0x80 or b & 1:
                        break
                    n = ((b & 0x7F) | (b1 << 7)) >> 1
                    pos += 2
                    value = data[pos:pos + n]
                    pos += n
                if data[pos] == 0:  # headersCount
                    headers = ()
                    pos += 1
                else:
                    try:
                        headers, pos = _read_headers(data, pos, record_end)
                    except ValueError:
                        break  # the general path says what is wrong
                if pos != record_end:  # fields must end exactly where the length says
                    break
                timestamp = base_ts + ts_delta if fixed_ts is None else fixed_ts
                if topic is None:
                    append(_new_row(Record, (base_offset + offset_delta, timestamp, key, value,
                                             headers)))
                else:
                    append(_new_row(ConsumerRecord, (topic, partition, base_offset + offset_delta,
                                                     key, value, timestamp, epoch, headers)))
                remaining -= 1
        except IndexError:
            pass
        if not remaining:
            break
        # Not the common shape (or damaged): the general path reads this record.
        pos = start
        offset_delta, ts_delta, key, value, headers, pos = _read_record(data, pos, end)
        timestamp = base_ts + ts_delta if fixed_ts is None else fixed_ts
        if topic is None:
            append(_new_row(Record, (base_offset + offset_delta, timestamp, key, value, headers)))
        else:
            append(_new_row(ConsumerRecord, (topic, partition, base_offset + offset_delta,
                                             key, value, timestamp, epoch, headers)))
        remaining -= 1
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last of {record_count} records")
    return rows


def _read_rows_general(data: bytes, pos: int, end: int, header: BatchHeader) -> list[Record]:
    """What :func:`_read_rows` returns (as Record), by the general path alone: the
    reference the fast path is tested against."""
    record_count = header.record_count
    if record_count > (end - pos) // RECORD_BYTES_MIN:
        raise ValueError(f"record count {record_count} cannot fit in {end - pos} bytes")
    log_append_time = header.attributes & TIMESTAMP_TYPE_MASK
    rows = []
    for _ in range(record_count):
        offset_delta, ts_delta, key, value, headers, pos = _read_record(data, pos, end)
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp + ts_delta
        rows.append(Record(header.base_offset + offset_delta, timestamp, key, value, headers))
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last of {record_count} records")
    return rows


def _read_record(data: bytes, pos: int, end: int,
                 ) -> tuple[int, int, bytes | None, bytes | None, RecordHeaders, int]:
    """``(offset_delta, timestamp_delta, key, value, headers, next_pos)`` of the record at
    ``pos``, every field checked against the record's length and ``end``."""
    if pos >= end:
        raise ValueError("records end before the record count is reached")
    length, pos = decode_varint(data, pos, VARINT_BYTES_MAX)
    if length < RECORD_BYTES_MIN - 1 or length > end - pos:
        raise ValueError(f"record length {length} with {end - pos} bytes left")
    record_end = pos + length
    # attributes (unused) at pos; the record is >= 6 bytes, so pos + 1 < record_end.
    ts_delta, pos = _read_varint(data, pos + 1, record_end, VARLONG_BYTES_MAX)
    offset_delta, pos = _read_varint(data, pos, record_end)
    key, pos = _read_bytes_field(data, pos, record_end)
    value, pos = _read_bytes_field(data, pos, record_end)
    headers, pos = _read_headers(data, pos, record_end)
    if pos != record_end:
        raise ValueError(f"record says {length} bytes, fields took {length - record_end + pos}")
    return offset_delta, ts_delta, key, value, headers, pos


def _read_varint(data: bytes, pos: int, limit: int,
                 bytes_max: int = VARINT_BYTES_MAX) -> tuple[int, int]:
    if pos >= limit:
        raise ValueError("record ends inside its fields")
    value, pos = decode_varint(data, pos, bytes_max)
    if pos > limit:
        raise ValueError("varint runs past the end of the record")
    return value, pos


def _read_headers(data: bytes, pos: int, record_end: int) -> tuple[RecordHeaders, int]:
    header_count, pos = _read_varint(data, pos, record_end)
    if header_count == 0:
        return (), pos
    # Each header takes at least 2 bytes (two lengths): bounds the loop before it runs.
    if header_count < 0 or header_count > (record_end - pos) // 2:
        raise ValueError(f"header count {header_count} with {record_end - pos} bytes left")
    headers = []
    for _ in range(header_count):
        name_bytes, pos = _read_bytes_field(data, pos, record_end)
        if name_bytes is None:
            raise ValueError("null header key")
        try:
            name = name_bytes.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"header key is not UTF-8: {name_bytes!r}") from e
        header_value, pos = _read_bytes_field(data, pos, record_end)
        headers.append((name, header_value))
    return tuple(headers), pos


def _read_bytes_field(data: bytes, pos: int, limit: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(data, pos, limit)
    if length == -1:
        return None, pos
    if length < -1 or length > limit - pos:
        raise ValueError(f"field length {length} with {limit - pos} bytes left in the record")
    return data[pos:pos + length], pos + length


def _records_part(buf: BytesLike, position: int, header: BatchHeader,
                  max_decompressed_bytes: int) -> tuple[bytes, int, int]:
    """``(data, start, end)``: where the batch's (decompressed) records are. An
    uncompressed batch in a ``bytes`` buffer is read in place, without a copy."""
    start = position + HEADER_SIZE
    end = position + header.size
    compression = header.attributes & COMPRESSION_MASK
    if compression == COMPRESSION_NONE:
        if type(buf) is bytes:
            return buf, start, end
        data = bytes(memoryview(buf)[start:end])
    else:
        data = decompress(compression, bytes(memoryview(buf)[start:end]), max_decompressed_bytes)
    return data, 0, len(data)


def decode_batch(buf: BytesLike, position: int = 0, *,
                 max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX,
                 ) -> tuple[BatchHeader, list[Record]]:
    """The header and records of the batch at ``position``; validates framing and CRC.

    Raises CorruptRecordError (with ``position``) for anything malformed and
    UnsupportedCompressionError for an unknown compression code.
    """
    header = validate_batch(buf, position)
    return header, decode_batch_records(buf, position, header,
                                        max_decompressed_bytes=max_decompressed_bytes)


def decode_batch_records(buf: BytesLike, position: int, header: BatchHeader, *,
                         max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX) -> list[Record]:
    """The records of an already validated batch (for callers that validated it themselves)."""
    return _decode_rows(buf, position, header, max_decompressed_bytes, None, -1)


def decode_consumer_records(buf: BytesLike, position: int, header: BatchHeader, topic: str,
                            partition: int, *,
                            max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX,
                            ) -> list[ConsumerRecord]:
    """The records of an already validated batch as ConsumerRecord of ``topic``-``partition``
    with the batch's leader epoch; errors as :func:`decode_batch_records`."""
    return _decode_rows(buf, position, header, max_decompressed_bytes, topic, partition)


def _decode_rows(buf: BytesLike, position: int, header: BatchHeader,
                 max_decompressed_bytes: int, topic: str | None, partition: int) -> list[Any]:
    """:func:`_read_rows` over the batch's records part, damage as CorruptRecordError."""
    try:
        data, start, end = _records_part(buf, position, header, max_decompressed_bytes)
        return _read_rows(data, start, end, header, topic, partition)
    except ValueError as e:
        raise CorruptRecordError(f"bad records in batch: {e}", position=position,
                                 too_large=isinstance(e, DecompressedTooLargeError)) from e


def decode_records(buf: BytesLike) -> Iterator[Record]:
    """Every record of every batch in ``buf``, in order (each batch CRC-checked)."""
    for position, header in iter_batches(buf):
        yield from decode_batch_records(buf, position, header)
