"""Snappy (Kafka's codec 2): the xerial framing we write, raw snappy we also read,
damaged or oversized data as CorruptRecordError, and kafka-python on both sides."""

from __future__ import annotations

import struct
import warnings

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.proto.batch import HEADER_SIZE, compute_crc
from tidewater.proto.compression import SNAPPY_BLOCK_SIZE_BYTES, SNAPPY_XERIAL_MAGIC
from tidewater.proto.errors import CorruptRecordError
from tidewater.proto.records import (
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    DecompressedTooLargeError,
    Record,
    SimpleRecord,
    compress,
    decode_batch,
    decompress,
    encode_batch,
)

XERIAL_HEADER = SNAPPY_XERIAL_MAGIC + struct.pack(">ii", 1, 1)


def xerial_blocks(data: bytes) -> list[bytes]:
    """The raw snappy blocks of a xerial stream, walked independently of the codec."""
    assert data[:16] == XERIAL_HEADER
    blocks, pos = [], 16
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        blocks.append(data[pos + 4:pos + 4 + length])
        pos += 4 + length
    assert pos == len(data)
    return blocks


def with_records_part(records: list[tuple[bytes, bytes]], part: bytes,
                      compression: int = COMPRESSION_SNAPPY) -> bytes:
    """A valid batch header (length, attributes, CRC) around any records part."""
    batch = bytearray(encode_batch(records, base_timestamp_ms=1_700_000_000_000)[:HEADER_SIZE])
    batch += part
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    (attributes,) = struct.unpack_from(">h", batch, 21)
    struct.pack_into(">h", batch, 21, (attributes & ~0x07) | compression)
    struct.pack_into(">I", batch, 17, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


def records_part(records: list[tuple[bytes, bytes]]) -> bytes:
    return encode_batch(records, base_timestamp_ms=1_700_000_000_000)[HEADER_SIZE:]


RECORDS = [(b"k%d" % i, b"value-%d-" % i + b"x" * 300) for i in range(200)]  # > 32 KiB: 2+ blocks


# -- the codec -------------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000), st.integers(0, 3 * SNAPPY_BLOCK_SIZE_BYTES), st.binary(max_size=50))
def test_round_trip(head, repeats, tail):
    data = head + b"ab" * (repeats // 2) + tail  # crosses block boundaries
    compressed = compress(COMPRESSION_SNAPPY, data)
    assert decompress(COMPRESSION_SNAPPY, compressed) == data
    assert decompress(COMPRESSION_SNAPPY, compressed, max_decompressed_bytes=len(data)) == data
    if data:
        with pytest.raises(DecompressedTooLargeError):
            decompress(COMPRESSION_SNAPPY, compressed, max_decompressed_bytes=len(data) - 1)


def test_we_write_xerial_framing_with_32_kib_blocks():
    data = bytes(range(256)) * 300  # 76,800 bytes: blocks of 32 KiB, 32 KiB, 11 KiB
    blocks = xerial_blocks(compress(COMPRESSION_SNAPPY, data))
    sizes = [len(cramjam.snappy.decompress_raw(b)) for b in blocks]
    assert sizes == [32768, 32768, len(data) - 65536]
    assert b"".join(bytes(cramjam.snappy.decompress_raw(b)) for b in blocks) == data
    assert compress(COMPRESSION_SNAPPY, b"") == XERIAL_HEADER  # no blocks at all
    assert decompress(COMPRESSION_SNAPPY, XERIAL_HEADER) == b""


def test_raw_snappy_is_read():
    data = records_part(RECORDS)
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert not raw.startswith(SNAPPY_XERIAL_MAGIC)
    assert decompress(COMPRESSION_SNAPPY, raw) == data
    header, decoded = decode_batch(with_records_part(RECORDS, raw))
    assert header.compression == COMPRESSION_SNAPPY
    assert [(r.key, r.value) for r in decoded] == RECORDS


def test_concatenated_xerial_streams_are_read():
    # xerial's SnappyInputStream reads a stream that is several streams back to back.
    data = records_part(RECORDS)
    cut = 1000
    part = compress(COMPRESSION_SNAPPY, data[:cut]) + compress(COMPRESSION_SNAPPY, data[cut:])
    _header, decoded = decode_batch(with_records_part(RECORDS, part))
    assert [(r.key, r.value) for r in decoded] == RECORDS


def test_encode_and_decode_a_snappy_batch():
    batch = encode_batch(RECORDS, compression=COMPRESSION_SNAPPY, base_offset=7)
    assert len(batch) < len(encode_batch(RECORDS))
    header, decoded = decode_batch(batch)
    assert header.compression == COMPRESSION_SNAPPY
    assert [(r.offset, r.key, r.value) for r in decoded] == [
        (7 + i, k, v) for i, (k, v) in enumerate(RECORDS)]


# -- damaged and oversized data -----------------------------------------------------------

def test_every_truncation_is_corrupt():
    part = compress(COMPRESSION_SNAPPY, records_part(RECORDS))
    block_ends = {16}
    pos = 16
    while pos < len(part):
        pos += 4 + struct.unpack_from(">i", part, pos)[0]
        block_ends.add(pos)
    for cut in range(0, len(part)):
        batch = with_records_part(RECORDS, part[:cut])
        with pytest.raises(CorruptRecordError) as info:
            decode_batch(batch)
        assert info.value.position == 0
        if cut not in block_ends:  # the framing itself is cut (else: records are missing)
            with pytest.raises(ValueError):
                decompress(COMPRESSION_SNAPPY, part[:cut])


@pytest.mark.parametrize("part", [
    b"",                                                      # no data at all
    b"\x82SNAPPY",                                            # the magic, cut
    XERIAL_HEADER[:12],                                       # the header, cut
    XERIAL_HEADER + b"\x00\x00",                              # a block length, cut
    XERIAL_HEADER + struct.pack(">i", -5) + b"abcde",         # negative block length
    XERIAL_HEADER + struct.pack(">i", 0),                     # empty block
    XERIAL_HEADER + struct.pack(">i", 100) + b"\x05abc",      # block runs past the end
    XERIAL_HEADER + struct.pack(">i", 5) + b"\x05\x10abc",    # block shorter than it declares
    XERIAL_HEADER + struct.pack(">i", 3) + b"\xff\xff\xff",   # length varint never ends
    b"\x0a\x00\xff\xff\xff\xff",                              # raw: copy before any output
    XERIAL_HEADER + XERIAL_HEADER[:10],                       # a concatenated header, cut
])
def test_damaged_snappy_is_corrupt(part):
    with pytest.raises(ValueError):
        decompress(COMPRESSION_SNAPPY, part)
    with pytest.raises(CorruptRecordError):
        decode_batch(with_records_part([(b"k", b"v")], part))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_garbage_only_ever_raises_value_error(garbage, framed):
    part = XERIAL_HEADER + garbage if framed else garbage
    try:
        decompress(COMPRESSION_SNAPPY, part, max_decompressed_bytes=1 << 20)
    except ValueError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_flipped_bytes_give_records_or_corrupt_record_error(data):
    part = bytearray(compress(COMPRESSION_SNAPPY, records_part(RECORDS[:20])))
    for _ in range(data.draw(st.integers(1, 4))):
        part[data.draw(st.integers(0, len(part) - 1))] = data.draw(st.integers(0, 255))
    try:
        _header, decoded = decode_batch(with_records_part(RECORDS[:20], bytes(part)),
                                        max_decompressed_bytes=1 << 20)
    except CorruptRecordError:
        return
    assert len(decoded) == 20


def test_declared_sizes_are_checked_before_decompressing():
    # A block claims 4 GiB (varint 0xffffffff) but holds nothing: refused from the
    # declared size alone, with no 4 GiB buffer and no MemoryError.
    huge = b"\xff\xff\xff\xff\x0f\x00"
    for part in (huge, XERIAL_HEADER + struct.pack(">i", len(huge)) + huge):
        with pytest.raises(ValueError, match="declares 4294967295 bytes"):
            decompress(COMPRESSION_SNAPPY, part, max_decompressed_bytes=1 << 40)
        with pytest.raises(CorruptRecordError) as info:
            decode_batch(with_records_part([(b"k", b"v")], part))
        assert not info.value.too_large  # damage, not a big batch
    # A claim snappy can reach (64 bytes per 3-byte copy) is believed until the limit.
    zeros = b"\0" * 1_000_000
    dense = bytes(cramjam.snappy.compress_raw(zeros))
    assert len(dense) * 21 < len(zeros)
    assert decompress(COMPRESSION_SNAPPY, dense) == zeros
    with pytest.raises(DecompressedTooLargeError, match="more than 999999 bytes"):
        decompress(COMPRESSION_SNAPPY, dense, max_decompressed_bytes=999_999)
    # Blocks each under the limit whose sum is over it.
    data = b"z" * (3 * SNAPPY_BLOCK_SIZE_BYTES)
    with pytest.raises(DecompressedTooLargeError):
        decompress(COMPRESSION_SNAPPY, compress(COMPRESSION_SNAPPY, data),
                   max_decompressed_bytes=2 * SNAPPY_BLOCK_SIZE_BYTES + 1)
    batch = encode_batch(RECORDS, compression=COMPRESSION_SNAPPY)
    with pytest.raises(CorruptRecordError, match="decompress to more than"):
        decode_batch(batch, max_decompressed_bytes=1000)


# -- an independent implementation: kafka-python ------------------------------------------

try:  # a dev dependency; only these cross-checks need it
    with warnings.catch_warnings():  # kafka-python's import warns about importlib.resources
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka.codec as kafka_codec
        from kafka.record import default_records as kafka_records
except ImportError:  # pragma: no cover
    kafka_records = None
needs_kafka_python = pytest.mark.skipif(kafka_records is None, reason="kafka-python not installed")


class CramjamSnappy:
    """python-snappy's two functions kafka-python calls, on cramjam (which is all
    python-snappy >= 0.7 is). kafka-python's own code does the xerial framing."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


@pytest.fixture(scope="module")
def kafka_python_snappy():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka_codec, "snappy", CramjamSnappy)
        yield


def kafka_python_batch(records: list[SimpleRecord], compression: int) -> bytes:
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset, record in enumerate(records):
        builder.append(offset, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


compressible_records = st.lists(
    st.builds(SimpleRecord,
              key=st.none() | st.binary(max_size=20),
              value=st.none() | st.binary(max_size=40).map(lambda b: b * 20),
              headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)),
                               max_size=2).map(tuple),
              timestamp_ms=st.integers(0, 2**41)),
    min_size=1, max_size=120)


@needs_kafka_python
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compressible_records)
def test_we_read_kafka_python_snappy_batches(kafka_python_snappy, records):
    batch = kafka_python_batch(records, COMPRESSION_SNAPPY)
    header, decoded = decode_batch(batch)
    if header.compression == COMPRESSION_SNAPPY:  # kafka-python keeps a batch raw when that is smaller
        assert batch[HEADER_SIZE:].startswith(XERIAL_HEADER)
    else:
        assert header.compression == COMPRESSION_NONE
    assert decoded == [
        Record(i, r.timestamp_ms, r.key, r.value, r.headers) for i, r in enumerate(records)]


@needs_kafka_python
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(compressible_records, st.integers(0, 2**40))
def test_kafka_python_reads_our_snappy_batches(kafka_python_snappy, records, base_offset):
    batch = encode_batch(records, base_offset=base_offset, compression=COMPRESSION_SNAPPY)
    theirs = kafka_records.DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert theirs.compression_type == COMPRESSION_SNAPPY
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in theirs] == [
        (base_offset + i, r.timestamp_ms, r.key, r.value, list(r.headers))
        for i, r in enumerate(records)]


@needs_kafka_python
def test_big_kafka_python_snappy_batch_both_ways(kafka_python_snappy):
    records = [SimpleRecord(b"k%d" % i, b"v%d-" % i + b"y" * 700, (("h", b"v"),), 1_700_000_000_000 + i)
               for i in range(500)]  # ~350 KiB: many xerial blocks
    batch = kafka_python_batch(records, COMPRESSION_SNAPPY)
    header, decoded = decode_batch(batch)
    assert header.compression == COMPRESSION_SNAPPY and len(xerial_blocks(batch[HEADER_SIZE:])) > 5
    assert [r.value for r in decoded] == [r.value for r in records]
    ours = encode_batch(records, compression=COMPRESSION_SNAPPY)
    assert [r.value for r in kafka_records.DefaultRecordBatch(ours)] == [r.value for r in records]
    # Same framing, same block size, same snappy: the same bytes.
    assert ours[HEADER_SIZE:] == batch[HEADER_SIZE:]


@needs_kafka_python
def test_kafka_python_raw_snappy_is_read(kafka_python_snappy):
    data = records_part(RECORDS)
    raw = kafka_codec.snappy_encode(data, xerial_compatible=False)
    _header, decoded = decode_batch(with_records_part(RECORDS, raw))
    assert [(r.key, r.value) for r in decoded] == RECORDS
