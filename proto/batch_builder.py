"""The one RecordBatch v2 encoder: an incremental builder (Kafka's ``MemoryRecordsBuilder``).

Records are appended one at a time as bytes (the producer appends each one when
``send`` is called), and ``build`` writes the 61-byte header and the CRC, so
closing a batch costs one header and one CRC, not a pass over its records.
``proto.records.encode_batch`` (every record of a batch at once) is this
builder too. The layouts are in ``proto/batch.py`` (header) and
``proto/records.py`` (records)::

    buffer = 61 zero bytes (the header, written by build) + records, each
        length varint | attributes 0 | timestampDelta varlong | offsetDelta varint
        | keyLength varint | key | valueLength varint | value | headersCount varint
        | headers (keyLength, key UTF-8, valueLength, value)

baseTimestamp is the one given to the builder, else the first record's;
maxTimestamp is the largest record timestamp. ``build`` writes magic 2,
attributes = the compression code (CreateTime, not transactional, not control),
the producer id, epoch and base sequence it is given, and compresses the
records part as a whole when asked (``proto/compression.py``), as Kafka does
when it closes a batch.

The log cleaner (``broker/storage/cleaner_rewrite.py``) re-encodes the records a
compaction keeps through this builder too: each record with its original offset
delta (``append(offset_delta=...)``), and ``build`` given the original batch's
attributes, lastOffsetDelta and maxTimestamp, so offsets, timestamps and producer
sequences stay what they were; a batch with no record left is built only when
asked (``allow_empty``, Kafka keeps a producer's last batch so).

``append`` computes every piece of a record before it writes any, so a bad
record (a key that is not bytes, a timestamp outside int64) raises and leaves
the batch as it was.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeAlias

from tidewater.proto.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2
from tidewater.proto.compression import COMPRESSION_NONE, compress
from tidewater.proto.crc import crc32c_holding_gil

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_CRC = struct.Struct(">I")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_COMPRESSION_MASK = 0x07


def _zigzag_bytes(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Offset deltas, lengths and timestamp deltas are almost always small: look their bytes up.
# 1 << 14 covers every offset delta of a 256 KiB batch of the smallest records.
_SMALL_MIN, _SMALL_MAX = -1, 1 << 14


def _small_varints() -> tuple[bytes, ...]:
    """``_zigzag_bytes(n)`` for n in [_SMALL_MIN, _SMALL_MAX), from one- and two-byte
    pieces: half the CPU of calling it 16,385 times (every process imports this, a
    broker before it serves)."""
    low = [bytes((b,)) for b in range(0x80)]
    high = [bytes((b | 0x80,)) for b in range(0x80)]
    out = [_zigzag_bytes(n) for n in range(_SMALL_MIN, 0)]
    for v in range(0, 2 * _SMALL_MAX, 2):  # zig-zag of n >= 0 is 2n
        if v < 0x80:
            out.append(low[v])
        elif v < 0x4000:
            out.append(high[v & 0x7F] + low[v >> 7])
        else:
            out.append(high[v & 0x7F] + high[(v >> 7) & 0x7F] + low[v >> 14])
    return tuple(out)


# Made by the first BatchBuilder (or encode_varint), not at import: a broker imports this
# before it serves and builds no batch until a producer or the cleaner needs one (issue
# 30's restart time; the table is ~3 ms of CPU).
_SMALL: tuple[bytes, ...] = ()
_NULL = b"\x01"  # varint(-1): a null key or value
_ZERO = b"\x00"  # attributes 0, or no headers


def _small_table() -> tuple[bytes, ...]:
    global _SMALL
    if not _SMALL:
        _SMALL = _small_varints()
    return _SMALL


def encode_varint(value: int) -> bytes:
    """Zig-zag varint bytes of a signed 64-bit ``value`` (ValueError outside int64)."""
    if _SMALL_MIN <= value < _SMALL_MAX:
        return (_SMALL or _small_table())[value + 1]
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{value} does not fit a varlong")
    return _zigzag_bytes(value)


# Record headers as the producer gives them: (name, value), the name str or UTF-8 bytes.
Headers: TypeAlias = Sequence[tuple[str | bytes, bytes | None]]


def _bytes_field(data: bytes | None) -> bytes:
    """Length and bytes of a key, value or header value (-1 for None)."""
    if data is None:
        return _NULL
    return encode_varint(len(data)) + data


def _headers_bytes(headers: Headers) -> bytes:
    parts = [encode_varint(len(headers))]
    for name, value in headers:
        raw = name.encode("utf-8") if isinstance(name, str) else name
        parts.append(encode_varint(len(raw)))
        parts.append(raw)
        parts.append(_bytes_field(value))
    return b"".join(parts)


class BatchBuilder:
    """One batch being filled: records appended as bytes, header written by ``build``."""

    __slots__ = ("buffer", "record_count", "base_timestamp_ms", "max_timestamp_ms")

    def __init__(self, base_timestamp_ms: int | None = None):
        """``base_timestamp_ms``: the batch's baseTimestamp; None takes the first record's."""
        if base_timestamp_ms is not None and not _INT64_MIN <= base_timestamp_ms <= _INT64_MAX:
            raise ValueError(f"timestamp {base_timestamp_ms} does not fit an int64")
        if not _SMALL:
            _small_table()  # append reads it
        self.buffer = bytearray(HEADER_SIZE)
        self.record_count = 0
        self.base_timestamp_ms = base_timestamp_ms  # None until the first record when not given
        self.max_timestamp_ms = _INT64_MIN

    def __len__(self) -> int:
        """Bytes of the batch so far (header included, uncompressed)."""
        return len(self.buffer)

    def append(self, key: bytes | None, value: bytes | None, headers: Headers,
               timestamp_ms: int, offset_delta: int | None = None) -> None:
        """Add one record (``headers``: a sequence of (str, bytes | None); may be empty).
        ``offset_delta``: the record's offset - baseOffset (default: its position in the
        batch); a cleaner keeping a record passes its original one."""
        if not _INT64_MIN <= timestamp_ms <= _INT64_MAX:
            raise ValueError(f"timestamp {timestamp_ms} does not fit an int64")
        count = self.record_count
        base = self.base_timestamp_ms
        if base is None:
            base = timestamp_ms
        delta = timestamp_ms - base
        ts = _SMALL[delta + 1] if _SMALL_MIN <= delta < _SMALL_MAX else encode_varint(delta)
        if offset_delta is None:
            offset_delta = count
        elif not 0 <= offset_delta <= _INT32_MAX:
            raise ValueError(f"offset delta {offset_delta} does not fit an int32")
        od = (_SMALL[offset_delta + 1] if offset_delta < _SMALL_MAX - 1
              else encode_varint(offset_delta))
        if value is None:
            vlen, value = _NULL, b""
        else:
            n = len(value)
            vlen = _SMALL[n + 1] if n < _SMALL_MAX - 1 else encode_varint(n)
        if key is None:
            klen, key = _NULL, b""
        else:
            n = len(key)
            klen = _SMALL[n + 1] if n < _SMALL_MAX - 1 else encode_varint(n)
        tail = _headers_bytes(headers) if headers else _ZERO
        body = b"".join((_ZERO, ts, od, klen, key, vlen, value, tail))
        n = len(body)
        # Nothing raised: from here the record is in the batch (two appends, no concatenated copy).
        buffer = self.buffer
        buffer += _SMALL[n + 1] if n < _SMALL_MAX - 1 else encode_varint(n)
        buffer += body
        self.record_count = count + 1
        self.base_timestamp_ms = base
        if timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = timestamp_ms

    def build(self, compression: int = COMPRESSION_NONE, *, base_offset: int = 0,
              partition_leader_epoch: int = -1, producer_id: int = -1, producer_epoch: int = -1,
              base_sequence: int = -1, attributes: int = 0, last_offset_delta: int | None = None,
              max_timestamp_ms: int | None = None, allow_empty: bool = False,
              level: int | None = None) -> bytes:
        """The finished batch: header and CRC written (records compressed if asked).

        ``attributes``: the bits besides the compression code (timestamp type,
        transactional, control); ``last_offset_delta`` / ``max_timestamp_ms``: a
        rewritten batch's originals (default: from the records appended); ``level``:
        the codec's level (``proto.compression.compress``).
        May be called more than once (each call gives the batch as it is then). Raises
        ValueError for an empty batch (unless ``allow_empty`` with a
        ``last_offset_delta``) and UnsupportedCompressionError for an unknown code.
        """
        count = self.record_count
        if count == 0 and not (allow_empty and last_offset_delta is not None):
            raise ValueError("a record batch needs at least one record")
        if last_offset_delta is None:
            last_offset_delta = count - 1
        if max_timestamp_ms is None:
            max_timestamp_ms = self.max_timestamp_ms
        base_timestamp_ms = self.base_timestamp_ms
        if base_timestamp_ms is None:  # empty: no record gave one
            base_timestamp_ms = max_timestamp_ms
        if compression == COMPRESSION_NONE:
            batch = self.buffer
        else:  # compress raises UnsupportedCompressionError for an unknown code
            batch = bytearray(HEADER_SIZE)
            batch += compress(compression, bytes(memoryview(self.buffer)[HEADER_SIZE:]), level)
        _HEADER.pack_into(
            batch, 0, base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0,
            (attributes & ~_COMPRESSION_MASK) | compression, last_offset_delta, base_timestamp_ms,
            max_timestamp_ms, producer_id, producer_epoch, base_sequence, count)
        # One CRC over attributes..end; baseOffset, length and leader epoch lie outside it.
        # Holding the GIL: a producer's I/O thread builds here while the caller sends
        # (proto/crc.py).
        _CRC.pack_into(batch, CRC_OFFSET,
                       crc32c_holding_gil(memoryview(batch)[ATTRIBUTES_OFFSET:]))
        return bytes(batch)
