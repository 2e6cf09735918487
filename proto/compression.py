"""Compression of a RecordBatch v2's records part: the codes of the batch header's
attributes bits 0-2 (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) and the codecs.

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

Decompression is defensive: it stops at ``max_decompressed_bytes``
(DecompressedTooLargeError) and reports damaged input as ValueError, which the
record decoder (``proto/records.py``) turns into a CorruptRecordError with the
batch's position. The encoder (``proto/batch_builder.py``) compresses a batch's
records part as a whole, as Kafka does when it closes a batch.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from types import ModuleType

from tidewater.proto.errors import UnsupportedCompressionError

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
# xerial's SnappyOutputStream: this magic, then int32 version and compatible version.
SNAPPY_XERIAL_MAGIC = b"\x82SNAPPY\x00"
SNAPPY_BLOCK_SIZE_BYTES = 32 * 1024  # SnappyOutputStream's default block size
_SNAPPY_XERIAL_HEADER = SNAPPY_XERIAL_MAGIC + struct.pack(">ii", 1, 1)
assert len(_SNAPPY_XERIAL_HEADER) == 16
SNAPPY_EXPANSION_MAX = 22  # > 64/3: a 3-byte copy element gives at most 64 bytes
_INT32 = struct.Struct(">i")


def compress(compression: int, data: bytes, level: int | None = None) -> bytes:
    """The records part compressed as Kafka writes it. ``level``: gzip's (1-9, -1 its
    default 6) or zstd's (-131072..22, default 3), a topic's compression.*.level; the
    other codecs ignore it."""
    if compression == COMPRESSION_NONE:
        return data
    if compression == COMPRESSION_GZIP:
        # mtime=0: the same records always give the same bytes (and CRC).
        gzip_level = 6 if level is None or level == -1 else level
        return gzip.compress(data, compresslevel=gzip_level, mtime=0)
    if compression == COMPRESSION_LZ4:
        import lz4.frame

        compressed: bytes = lz4.frame.compress(  # lz4 ships no type information
            data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
            content_checksum=False, store_size=False,
        )
        return compressed
    if compression == COMPRESSION_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3 if level is None else level,
                                        write_content_size=True).compress(data)
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
    parts: list[bytes | cramjam.Buffer] = [_SNAPPY_XERIAL_HEADER]
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


def _snappy_block_size(snappy: ModuleType, block: bytes | memoryview, before: int,
                       limit: int) -> int:
    """The size a raw snappy block declares, if it can be true and ``before`` bytes
    plus it fit ``limit``.

    Snappy's densest element is a 3-byte copy of 64 bytes, so a block cannot
    decompress to more than 64/3 of its length: a larger claim is damage, refused
    before its buffer is allocated.
    """
    size: int = snappy.decompress_raw_len(block)
    if size > len(block) * SNAPPY_EXPANSION_MAX:
        raise ValueError(f"snappy block of {len(block)} bytes declares {size} bytes")
    if before + size > limit:
        raise _too_large(limit)
    return size
