"""Kafka RecordBatch v2 records: encode and decode, with compression.

``proto/batch.py`` owns the 61-byte batch header; this module owns what follows
it. The records part of a batch is ``recordCount`` records, compressed as one
block when the header's compression bits (attributes & 0x07) say so:
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

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

Compression formats are Kafka's: gzip is a gzip stream (RFC 1952), lz4 the
LZ4 *frame* format with independent 64 KiB blocks (Kafka's
``KafkaLZ4BlockOutputStream``), zstd a zstd frame (with the content size when we
write it; Java producers write none, which we also read). Snappy is written in
the *xerial* framing of Kafka's Java client (``SnappyOutputStream``)::

    header   16 bytes  b"\\x82SNAPPY\\x00", int32 version 1, int32 compatible version 1
    blocks   each: int32 big-endian length, then that many bytes of one raw
             snappy block holding at most 32 KiB of the input

and read in that framing (several concatenated streams too, as xerial's
``SnappyInputStream`` does) or as one raw snappy block (librdkafka, old clients).

Decoding is defensive: every length is checked against the bytes that are
there before anything is allocated, varints are capped at 5 (varint) or 10
(varlong) bytes, decompression stops at ``max_decompressed_bytes``. Anything
wrong is a CorruptRecordError with the batch's position, never a MemoryError
or an IndexError.
"""

from __future__ import annotations

import gzip
import io
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from proto.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    iter_batches,
    validate_batch,
)
from proto.errors import CorruptRecordError, UnsupportedCompressionError

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = (
    0, 1, 2, 3, 4,
)
COMPRESSION_NAMES = {
    COMPRESSION_NONE: "none",
    COMPRESSION_GZIP: "gzip",
    COMPRESSION_SNAPPY: "snappy",
    COMPRESSION_LZ4: "lz4",
    COMPRESSION_ZSTD: "zstd",
}
COMPRESSION_BY_NAME = {name: code for code, name in COMPRESSION_NAMES.items()}

# A batch's records never decompress to more than this by default (Kafka's
# max.message.bytes is ~1 MiB compressed; 64 MiB leaves room for any sane ratio).
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10
# length(1) + attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount
RECORD_BYTES_MIN = 7
LZ4_BLOCK_SIZE_BYTES = 64 * 1024
# xerial's SnappyOutputStream: this magic, then int32 version and compatible version.
SNAPPY_XERIAL_MAGIC = b"\x82SNAPPY\x00"
SNAPPY_BLOCK_SIZE_BYTES = 32 * 1024  # SnappyOutputStream's default block size
_SNAPPY_XERIAL_HEADER = SNAPPY_XERIAL_MAGIC + struct.pack(">ii", 1, 1)
assert len(_SNAPPY_XERIAL_HEADER) == 16
SNAPPY_EXPANSION_MAX = 22  # > 64/3: a 3-byte copy element gives at most 64 bytes
_INT32 = struct.Struct(">i")

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


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

def _zigzag_bytes(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Lengths and offset deltas are almost always small: look their bytes up.
_SMALL_VARINT_MIN, _SMALL_VARINT_MAX = -1, 1 << 13
_SMALL_VARINTS = tuple(_zigzag_bytes(n) for n in range(_SMALL_VARINT_MIN, _SMALL_VARINT_MAX))


def encode_varint(value: int) -> bytes:
    """Zig-zag varint bytes of a signed 64-bit ``value``."""
    if _SMALL_VARINT_MIN <= value < _SMALL_VARINT_MAX:
        return _SMALL_VARINTS[value + 1]
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{value} does not fit a varlong")
    return _zigzag_bytes(value)


def decode_varint(buf, position: int, bytes_max: int = VARLONG_BYTES_MAX) -> tuple[int, int]:
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


# -- compression ---------------------------------------------------------------

def compress(compression: int, data: bytes) -> bytes:
    """The records part compressed as Kafka writes it."""
    if compression == COMPRESSION_NONE:
        return data
    if compression == COMPRESSION_GZIP:
        # mtime=0: the same records always give the same bytes (and CRC).
        return gzip.compress(data, compresslevel=6, mtime=0)
    if compression == COMPRESSION_LZ4:
        import lz4.frame

        return lz4.frame.compress(
            data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
            content_checksum=False, store_size=False,
        )
    if compression == COMPRESSION_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)
    if compression == COMPRESSION_SNAPPY:
        return _snappy_compress(data)
    raise UnsupportedCompressionError(f"unknown compression type {compression}")


def decompress(compression: int, data: bytes,
               max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX) -> bytes:
    """Inverse of :func:`compress`, stopping at ``max_decompressed_bytes``.

    Raises UnsupportedCompressionError for an unknown code and ValueError for
    damaged or oversized data.
    """
    if compression == COMPRESSION_NONE:
        return data
    if compression == COMPRESSION_GZIP:
        return _gunzip(data, max_decompressed_bytes)
    if compression == COMPRESSION_LZ4:
        return _lz4_decompress(data, max_decompressed_bytes)
    if compression == COMPRESSION_ZSTD:
        return _zstd_decompress(data, max_decompressed_bytes)
    if compression == COMPRESSION_SNAPPY:
        return _snappy_decompress(data, max_decompressed_bytes)
    raise UnsupportedCompressionError(f"unknown compression type {compression}")


class DecompressedTooLargeError(ValueError):
    """The records part decompresses to more than the allowed size."""


def _too_large(limit: int) -> DecompressedTooLargeError:
    return DecompressedTooLargeError(f"records decompress to more than {limit} bytes")


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    remaining = data
    try:
        while True:  # a gzip stream may hold several members (Java reads them all)
            d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out += d.decompress(remaining, limit + 1 - len(out))
            if len(out) > limit or d.unconsumed_tail:
                raise _too_large(limit)
            if not d.eof:
                raise ValueError("gzip stream is truncated")
            remaining = d.unused_data
            if not remaining:
                return bytes(out)
    except zlib.error as e:
        raise ValueError(f"gzip: {e}") from e


def _lz4_decompress(data: bytes, limit: int) -> bytes:
    import lz4.frame

    out = bytearray()
    remaining = data
    try:
        while remaining:  # possibly several frames, one after the other
            d = lz4.frame.LZ4FrameDecompressor()
            out += d.decompress(remaining, max_length=limit + 1 - len(out))
            if len(out) > limit or not d.needs_input and not d.eof:
                raise _too_large(limit)
            if not d.eof:
                raise ValueError("lz4 frame is truncated")
            remaining = d.unused_data
    except RuntimeError as e:
        raise ValueError(f"lz4: {e}") from e
    return bytes(out)


def _zstd_decompress(data: bytes, limit: int) -> bytes:
    import zstandard

    try:
        params = zstandard.get_frame_parameters(data)
        if params.content_size not in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR) \
                and params.content_size > limit:
            raise _too_large(limit)
        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(data), read_across_frames=True)
        chunks = []
        total = 0
        while True:  # read() may return less than asked: read until the stream ends
            chunk = reader.read(limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _too_large(limit)
        return b"".join(chunks)
    except zstandard.ZstdError as e:
        raise ValueError(f"zstd: {e}") from e


def _snappy_compress(data: bytes) -> bytes:
    """Xerial framing, as Kafka's Java producer writes snappy."""
    import cramjam

    compress_raw = cramjam.snappy.compress_raw
    view = memoryview(data)
    parts = [_SNAPPY_XERIAL_HEADER]
    for start in range(0, len(data), SNAPPY_BLOCK_SIZE_BYTES):
        block = compress_raw(view[start:start + SNAPPY_BLOCK_SIZE_BYTES])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    """Xerial framing or one raw snappy block. Every block's declared size is
    checked (and summed against ``limit``) before anything is decompressed."""
    import cramjam

    snappy = cramjam.snappy
    try:
        if not data.startswith(SNAPPY_XERIAL_MAGIC):
            size = _snappy_block_size(snappy, data, 0, limit)
            out = bytearray(size)
            if snappy.decompress_raw_into(data, out) != size:
                raise ValueError("snappy block is shorter than it declares")
            return bytes(out)
        blocks = []  # (block, its decompressed size)
        total = 0
        view = memoryview(data)
        pos = len(_SNAPPY_XERIAL_HEADER)
        if len(data) < pos:
            raise ValueError("snappy xerial header is truncated")
        end = len(data)
        while pos < end:
            if data.startswith(SNAPPY_XERIAL_MAGIC, pos):  # a concatenated stream
                pos += len(_SNAPPY_XERIAL_HEADER)
                if pos > end:
                    raise ValueError("snappy xerial header is truncated")
                continue
            if end - pos < _INT32.size:
                raise ValueError("snappy block length is truncated")
            (length,) = _INT32.unpack_from(data, pos)
            pos += _INT32.size
            if length <= 0 or length > end - pos:
                raise ValueError(f"snappy block length {length} with {end - pos} bytes left")
            block = view[pos:pos + length]
            size = _snappy_block_size(snappy, block, total, limit)
            total += size
            blocks.append((block, size))
            pos += length
        out = bytearray(total)
        out_view = memoryview(out)
        at = 0
        for block, size in blocks:
            if snappy.decompress_raw_into(block, out_view[at:at + size]) != size:
                raise ValueError("snappy block is shorter than it declares")
            at += size
        out_view.release()
        return bytes(out)
    except cramjam.DecompressionError as e:
        raise ValueError(str(e)) from e  # cramjam says "snappy: ..."


def _snappy_block_size(snappy, block, before: int, limit: int) -> int:
    """The size a raw snappy block declares, if it can be true and ``before`` bytes
    plus it fit ``limit``.

    Snappy's densest element is a 3-byte copy of 64 bytes, so a block cannot
    decompress to more than 64/3 of its length: a larger claim is damage, refused
    before its buffer is allocated.
    """
    size = snappy.decompress_raw_len(block)
    if size > len(block) * SNAPPY_EXPANSION_MAX:
        raise ValueError(f"snappy block of {len(block)} bytes declares {size} bytes")
    if before + size > limit:
        raise _too_large(limit)
    return size


# -- encoding --------------------------------------------------------------------

def _append_bytes_field(out: bytearray, data) -> None:
    if data is None:
        out += b"\x01"  # varint(-1)
    else:
        out += encode_varint(len(data))
        out += data


def encode_batch(records: Sequence[tuple[bytes | None, bytes | None] | SimpleRecord], *,
                 base_offset: int = 0, partition_leader_epoch: int = -1,
                 compression: int = COMPRESSION_NONE, base_timestamp_ms: int | None = None,
                 producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1) -> bytes:
    """One RecordBatch v2 (magic 2, CreateTime) holding ``records`` in order.

    Records are ``(key, value)`` pairs or SimpleRecord. A record without a
    timestamp gets ``base_timestamp_ms``, or the current time when that is None;
    the batch's baseTimestamp is ``base_timestamp_ms`` or the first record's.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if compression not in COMPRESSION_NAMES:
        raise UnsupportedCompressionError(f"unknown compression type {compression}")
    default_ts = base_timestamp_ms if base_timestamp_ms is not None else int(time.time() * 1000)
    first = records[0]
    if base_timestamp_ms is not None:
        base_ts = base_timestamp_ms
    elif isinstance(first, SimpleRecord) and first.timestamp_ms is not None:
        base_ts = first.timestamp_ms
    else:
        base_ts = default_ts
    max_ts = _INT64_MIN

    body = bytearray()             # one record's bytes after its length field
    out = bytearray(HEADER_SIZE)   # the batch: header placeholder, then the records
    for offset_delta, record in enumerate(records):
        if isinstance(record, SimpleRecord):
            key, value, headers = record.key, record.value, record.headers
            ts = record.timestamp_ms if record.timestamp_ms is not None else default_ts
        else:
            key, value = record
            headers = ()
            ts = default_ts
        if ts > max_ts:
            max_ts = ts
        body.clear()
        body += b"\x00"  # attributes
        body += encode_varint(ts - base_ts)
        body += encode_varint(offset_delta)
        _append_bytes_field(body, key)
        _append_bytes_field(body, value)
        body += encode_varint(len(headers))
        for header_key, header_value in headers:
            name = header_key.encode("utf-8") if isinstance(header_key, str) else header_key
            body += encode_varint(len(name))
            body += name
            _append_bytes_field(body, header_value)
        out += encode_varint(len(body))
        out += body

    batch = out
    if compression != COMPRESSION_NONE:
        compressed = compress(compression, bytes(memoryview(batch)[HEADER_SIZE:]))
        del batch[HEADER_SIZE:]
        batch += compressed
    record_count = len(records)
    _HEADER.pack_into(
        batch, 0, base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0,
        compression, record_count - 1, base_ts, max_ts, producer_id, producer_epoch,
        base_sequence, record_count,
    )
    # One CRC over attributes..end; baseOffset, length and leader epoch lie outside it.
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


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
               topic: str | None = None, partition: int = -1) -> list:
    """Rows for ``header.record_count`` records in ``data[pos:end]`` (already decompressed).

    With ``topic`` None the rows are Record, else ConsumerRecord of ``topic``,
    ``partition`` and the batch's leader epoch. Raises ValueError describing the
    first thing wrong.
    """
    record_count = header.record_count
    if record_count > (end - pos) // RECORD_BYTES_MIN:
        raise ValueError(f"record count {record_count} cannot fit in {end - pos} bytes")
    rows: list = []
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


def _read_record(data: bytes, pos: int, end: int) -> tuple:
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


def _read_headers(data: bytes, pos: int, record_end: int,
                  ) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
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


def _records_part(buf, position: int, header: BatchHeader,
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


def decode_batch(buf, position: int = 0, *,
                 max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX,
                 ) -> tuple[BatchHeader, list[Record]]:
    """The header and records of the batch at ``position``; validates framing and CRC.

    Raises CorruptRecordError (with ``position``) for anything malformed and
    UnsupportedCompressionError for an unknown compression code.
    """
    header = validate_batch(buf, position)
    return header, decode_batch_records(buf, position, header,
                                        max_decompressed_bytes=max_decompressed_bytes)


def decode_batch_records(buf, position: int, header: BatchHeader, *,
                         max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX) -> list[Record]:
    """The records of an already validated batch (for callers that validated it themselves)."""
    return _decode_rows(buf, position, header, max_decompressed_bytes, None, -1)


def decode_consumer_records(buf, position: int, header: BatchHeader, topic: str, partition: int,
                            *, max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX,
                            ) -> list[ConsumerRecord]:
    """The records of an already validated batch as ConsumerRecord of ``topic``-``partition``
    with the batch's leader epoch; errors as :func:`decode_batch_records`."""
    return _decode_rows(buf, position, header, max_decompressed_bytes, topic, partition)


def _decode_rows(buf, position: int, header: BatchHeader, max_decompressed_bytes: int,
                 topic: str | None, partition: int) -> list:
    """:func:`_read_rows` over the batch's records part, damage as CorruptRecordError."""
    try:
        data, start, end = _records_part(buf, position, header, max_decompressed_bytes)
        return _read_rows(data, start, end, header, topic, partition)
    except ValueError as e:
        raise CorruptRecordError(f"bad records in batch: {e}", position=position,
                                 too_large=isinstance(e, DecompressedTooLargeError)) from e


def decode_records(buf) -> Iterator[Record]:
    """Every record of every batch in ``buf``, in order (each batch CRC-checked)."""
    for position, header in iter_batches(buf):
        yield from decode_batch_records(buf, position, header)
