"""An incremental RecordBatch v2 builder: the producer's ``MemoryRecordsBuilder``.

``proto.records.encode_batch`` takes every record of a batch at once; the
producer instead appends each record's bytes to its open batch when ``send``
is called, so the sender thread only writes the 61-byte header and the CRC
(``build``). The output is byte-identical to ``encode_batch`` given the same
records as ``SimpleRecord`` with their timestamps (a property test checks it):

    buffer = 61 zero bytes (the header, written by build) + records, each
        length varint | attributes 0 | timestampDelta varlong | offsetDelta varint
        | keyLength varint | key | valueLength varint | value | headersCount varint
        | headers (keyLength, key UTF-8, valueLength, value)

baseTimestamp is the first record's timestamp, maxTimestamp the largest;
compression (``build(compression=...)``) compresses the records part as a
whole, as Kafka does when it closes a batch.

``append`` computes every piece of a record before it writes any, so a bad
record (a key that is not bytes, a timestamp outside int64) raises and leaves
the batch as it was.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from proto.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2
from proto.records import COMPRESSION_NONE, compress, encode_varint

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_CRC = struct.Struct(">I")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# Zig-zag varint bytes of a signed 64-bit value (ValueError outside int64): the codec's own.
zigzag_varint = encode_varint


# Offset deltas, lengths and timestamp deltas are almost always small: look them up.
# 1 << 14 covers every offset delta of a 256 KiB batch of the smallest records.
_SMALL_MIN, _SMALL_MAX = -1, 1 << 14
_SMALL = tuple(zigzag_varint(n) for n in range(_SMALL_MIN, _SMALL_MAX))
_NULL = _SMALL[0]  # varint(-1): a null key or value
_ZERO = _SMALL[1]  # attributes 0, or no headers


def varint(value: int) -> bytes:
    if _SMALL_MIN <= value < _SMALL_MAX:
        return _SMALL[value + 1]
    return zigzag_varint(value)


def _bytes_field(data) -> bytes:
    """Length and bytes of a key, value or header value (-1 for None)."""
    if data is None:
        return _NULL
    return varint(len(data)) + bytes(data)


def _headers_bytes(headers) -> bytes:
    parts = [varint(len(headers))]
    for name, value in headers:
        raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
        parts.append(varint(len(raw)))
        parts.append(raw)
        parts.append(_bytes_field(value))
    return b"".join(parts)


class BatchBuilder:
    """One batch being filled: records appended as bytes, header written by ``build``."""

    __slots__ = ("buffer", "record_count", "base_timestamp_ms", "max_timestamp_ms")

    def __init__(self):
        self.buffer = bytearray(HEADER_SIZE)
        self.record_count = 0
        self.base_timestamp_ms = 0
        self.max_timestamp_ms = _INT64_MIN

    def __len__(self) -> int:
        """Bytes of the batch so far (header included, uncompressed)."""
        return len(self.buffer)

    def append(self, key: bytes | None, value: bytes | None, headers, timestamp_ms: int) -> None:
        """Add one record (``headers``: a sequence of (str, bytes | None); may be empty)."""
        if not _INT64_MIN <= timestamp_ms <= _INT64_MAX:
            raise ValueError(f"timestamp {timestamp_ms} does not fit an int64")
        count = self.record_count
        if count == 0:
            self.base_timestamp_ms = timestamp_ms
        delta = timestamp_ms - self.base_timestamp_ms
        ts = _SMALL[delta + 1] if _SMALL_MIN <= delta < _SMALL_MAX else zigzag_varint(delta)
        od = _SMALL[count + 1] if count < _SMALL_MAX - 1 else zigzag_varint(count)
        if value is None:
            vlen, value = _NULL, b""
        else:
            n = len(value)
            vlen = _SMALL[n + 1] if n < _SMALL_MAX - 1 else zigzag_varint(n)
        if key is None:
            klen, key = _NULL, b""
        else:
            n = len(key)
            klen = _SMALL[n + 1] if n < _SMALL_MAX - 1 else zigzag_varint(n)
        tail = _headers_bytes(headers) if headers else _ZERO
        body = b"".join((_ZERO, ts, od, klen, key, vlen, value, tail))
        n = len(body)
        self.buffer += (_SMALL[n + 1] if n < _SMALL_MAX - 1 else zigzag_varint(n)) + body
        self.record_count = count + 1
        if timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = timestamp_ms

    def build(self, compression: int = COMPRESSION_NONE, *, base_offset: int = 0,
              partition_leader_epoch: int = -1) -> bytes:
        """The finished batch: header and CRC written (records compressed if asked).

        May be called more than once (each call gives the batch as it is then)."""
        count = self.record_count
        if count == 0:
            raise ValueError("a record batch needs at least one record")
        if compression == COMPRESSION_NONE:
            batch = self.buffer
        else:
            batch = bytearray(HEADER_SIZE)
            batch += compress(compression, bytes(memoryview(self.buffer)[HEADER_SIZE:]))
        _HEADER.pack_into(
            batch, 0, base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0,
            compression, count - 1, self.base_timestamp_ms, self.max_timestamp_ms, -1, -1, -1, count)
        _CRC.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
        return bytes(batch)
