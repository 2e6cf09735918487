"""The RecordBatch v2 record codec: byte vectors, compression, limits, and kafka-python."""

from __future__ import annotations

import gzip
import struct
import warnings

import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.proto.batch import HEADER_SIZE, validate_batch
from tidewater.proto.batch_builder import encode_varint
from tidewater.proto.errors import CorruptRecordError, UnsupportedCompressionError
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    Record,
    SimpleRecord,
    decode_batch,
    decode_records,
    decode_varint,
    encode_batch,
)

CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD]


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected 0x82F63B78): independent of the crc32c package."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def restamp_crc(batch: bytearray) -> bytes:
    """Recompute the CRC after a test changed bytes inside the CRC'd range."""
    struct.pack_into(">I", batch, 17, crc32c_reference(bytes(batch[21:])))
    return bytes(batch)


def test_crc_reference_is_right():
    assert crc32c_reference(b"123456789") == 0xE3069283  # the standard check value


# -- varints -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (-2, b"\x03"), (63, b"\x7e"),
        (-64, b"\x7f"), (64, b"\x80\x01"), (300, b"\xd8\x04"), (8191, b"\xfe\x7f"),
        (8192, b"\x80\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"), (-(2**31), b"\xff\xff\xff\xff\x0f"),
        (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"), (-(2**63), b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_known_encodings(value, encoded):
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_round_trip(value):
    encoded = b"\xaa" + encode_varint(value)
    assert decode_varint(encoded, 1) == (value, len(encoded))


def test_varint_limits():
    with pytest.raises(ValueError):
        encode_varint(2**63)
    with pytest.raises(ValueError):
        decode_varint(b"\x80\x80", 0)                  # runs past the end
    with pytest.raises(ValueError):
        decode_varint(b"\xff" * 5 + b"\x01", 0, 5)     # 6 bytes for a varint
    with pytest.raises(ValueError):
        decode_varint(b"\xff" * 11, 0)                 # 11 bytes for a varlong


# -- known bytes ---------------------------------------------------------------

# Hand-assembled batch: base offset 7, leader epoch 5, one record key b"k" value b"v"
# at timestamp 1000, no producer; every field spelled out.
KNOWN_RECORD = bytes.fromhex(
    "10"    # length 8 (zig-zag 16)
    "00"    # attributes
    "00"    # timestampDelta 0
    "00"    # offsetDelta 0
    "026b"  # key length 1, "k"
    "0276"  # value length 1, "v"
    "00"    # no headers
)
KNOWN_AFTER_CRC = (
    bytes.fromhex(
        "0000"                # attributes: no compression, CreateTime
        "00000000"            # lastOffsetDelta 0
        "00000000000003e8"    # baseTimestamp 1000
        "00000000000003e8"    # maxTimestamp 1000
        "ffffffffffffffff"    # producerId -1
        "ffff"                # producerEpoch -1
        "ffffffff"            # baseSequence -1
        "00000001"            # recordCount 1
    )
    + KNOWN_RECORD
)
KNOWN_BATCH = (
    bytes.fromhex(
        "0000000000000007"    # baseOffset 7
        "0000003a"            # batchLength 58 = 61 - 12 + 9
        "00000005"            # partitionLeaderEpoch 5
        "02"                  # magic 2
    )
    + struct.pack(">I", crc32c_reference(KNOWN_AFTER_CRC))
    + KNOWN_AFTER_CRC
)


def test_encode_matches_hand_assembled_bytes():
    batch = encode_batch([(b"k", b"v")], base_offset=7, partition_leader_epoch=5,
                         base_timestamp_ms=1000)
    assert batch == KNOWN_BATCH


def test_decode_hand_assembled_bytes():
    header, records = decode_batch(KNOWN_BATCH)
    assert (header.base_offset, header.partition_leader_epoch, header.record_count) == (7, 5, 1)
    assert records == [Record(offset=7, timestamp=1000, key=b"k", value=b"v", headers=())]


def test_known_bytes_with_headers_nulls_and_negative_delta():
    batch = encode_batch(
        [
            SimpleRecord(None, b"", (("a", b"1"), ("é", None)), timestamp_ms=1000),
            SimpleRecord(b"", None, timestamp_ms=999),
        ],
        base_timestamp_ms=1000,
    )
    first = bytes.fromhex(
        "00" "00" "00"      # attributes, timestampDelta 0, offsetDelta 0
        "01"                # key null
        "00"                # value length 0
        "04"                # 2 headers
        "02" "61" "02" "31"  # "a" -> b"1"
        "04" "c3a9" "01"    # "é" (2 UTF-8 bytes) -> null
    )
    second = bytes.fromhex("00" "01" "02" "00" "01" "00")  # ts delta -1, offset delta 1
    expected = (bytes([len(first) * 2]) + first + bytes([len(second) * 2]) + second)
    assert batch[HEADER_SIZE:] == expected
    header, records = decode_batch(batch)
    assert header.max_timestamp == 1000 and header.base_timestamp == 1000
    assert records == [
        Record(0, 1000, None, b"", (("a", b"1"), ("é", None))),
        Record(1, 999, b"", None, ()),
    ]


# -- round trips ---------------------------------------------------------------

def sample_records():
    return [
        SimpleRecord(b"key-0", b"value-0" * 50, (("trace", b"abc"), ("empty", b""),
                                                 ("none", None)), timestamp_ms=5_000),
        SimpleRecord(None, b"no key" * 50, timestamp_ms=4_000),        # negative delta
        SimpleRecord(b"no value", None, timestamp_ms=6_000),
        SimpleRecord(b"", b"", timestamp_ms=-1),                       # ts before epoch
        SimpleRecord(b"\x00\xff" * 40, bytes(range(256)) * 4, timestamp_ms=5_000),
    ]


@pytest.mark.parametrize("compression", CODECS)
def test_round_trip_every_codec(compression):
    records = sample_records()
    batch = encode_batch(records, base_offset=100, partition_leader_epoch=9,
                         compression=compression, producer_id=42, producer_epoch=3,
                         base_sequence=11)
    header, decoded = decode_batch(batch)
    assert header.compression == compression
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 11)
    assert header.last_offset_delta == len(records) - 1
    assert header.base_timestamp == 5_000  # the first record's
    assert header.max_timestamp == 6_000
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == [
        (100 + i, s.timestamp_ms, s.key, s.value, s.headers) for i, s in enumerate(records)
    ]
    if compression != COMPRESSION_NONE:
        assert len(batch) < len(encode_batch(records))


@pytest.mark.parametrize("compression", CODECS)
def test_large_batch_spanning_many_compression_blocks(compression):
    # lz4 writes 64 KiB blocks; this needs several.
    records = [(str(i).encode(), (b"%08d" % i) * 2000) for i in range(20)]
    batch = encode_batch(records, compression=compression, base_timestamp_ms=1)
    assert [(r.key, r.value) for r in decode_batch(batch)[1]] == list(records)


def test_default_timestamps(monkeypatch):
    monkeypatch.setattr("tidewater.proto.records.time.time", lambda: 1234.5678)
    header, records = decode_batch(encode_batch([(b"a", b"b"), SimpleRecord(None, b"c", (), 7)]))
    assert header.base_timestamp == 1234567
    assert [r.timestamp for r in records] == [1234567, 7]
    # An explicit base timestamp also stamps records that have none.
    header, records = decode_batch(encode_batch([(b"a", b"b")], base_timestamp_ms=50))
    assert header.base_timestamp == header.max_timestamp == records[0].timestamp == 50


def test_log_append_time_uses_max_timestamp():
    batch = bytearray(encode_batch([SimpleRecord(b"a", b"1", (), 10),
                                    SimpleRecord(b"b", b"2", (), 20)]))
    struct.pack_into(">h", batch, 21, 0x08)          # LogAppendTime
    struct.pack_into(">q", batch, 35, 99)            # maxTimestamp set by the broker
    header, records = decode_batch(restamp_crc(batch))
    assert header.timestamp_type == 1
    assert [r.timestamp for r in records] == [99, 99]


def test_decode_records_spans_batches():
    buf = (encode_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0, base_timestamp_ms=1)
           + encode_batch([(b"c", b"3")], base_offset=2, compression=COMPRESSION_GZIP,
                          base_timestamp_ms=1))
    assert [(r.offset, r.key) for r in decode_records(buf)] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert list(decode_records(b"")) == []


def test_decode_at_position_and_from_memoryview():
    first = encode_batch([(b"a", b"1")], base_timestamp_ms=1)
    second = encode_batch([(b"b", b"2")], base_offset=1, base_timestamp_ms=1)
    header, records = decode_batch(memoryview(first + second), len(first))
    assert header.base_offset == 1 and records[0].key == b"b"


def test_encode_rejects_nonsense():
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(UnsupportedCompressionError):
        encode_batch([(b"a", b"b")], compression=7)


def test_unknown_codecs_are_unsupported_on_decode():  # snappy: tests/unit/test_records_snappy.py
    for code in (5, 6, 7):
        batch = bytearray(encode_batch([(b"a", b"b")], base_timestamp_ms=1))
        struct.pack_into(">h", batch, 21, code)
        with pytest.raises(UnsupportedCompressionError):
            decode_batch(restamp_crc(batch))


def test_compression_names():
    assert COMPRESSION_NAMES == {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


# -- corrupt input ---------------------------------------------------------------

def batch_with_records_part(records_part: bytes, *, record_count: int = 1,
                            compression: int = COMPRESSION_NONE) -> bytes:
    """A batch with a valid header and CRC around arbitrary records bytes."""
    batch = bytearray(encode_batch([(b"a", b"b")], base_timestamp_ms=1))
    del batch[HEADER_SIZE:]
    batch += records_part
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, compression)
    struct.pack_into(">i", batch, 23, max(record_count - 1, 0))
    struct.pack_into(">i", batch, 57, record_count)
    return restamp_crc(batch)


@pytest.mark.parametrize(
    ("records_part", "record_count", "reason"),
    [
        (b"", 1, "cannot fit"),
        (KNOWN_RECORD, 2, "cannot fit"),                            # count above what is there
        (KNOWN_RECORD + b"\x00" * 7, 1, "bytes after the last"),    # trailing garbage
        (b"\xfe\xff\xff\xff\x07" + b"\x00" * 10, 1, "record length"),   # ~1 GiB record
        (b"\xff\xff\xff\xff\xff\x01" + b"\x00" * 10, 1, "varint"),     # 6-byte varint
        (bytes.fromhex("10 00 00 00 feffffff0f 00 00 00 00"), 1, "field length"),  # 2 GiB key
        (bytes.fromhex("10 00 00 00 03 00 00 00 00 00"), 1, "field length"),  # key length -2
        (bytes.fromhex("0e 00 00 00 01 01 7e 00 00"), 1, "header count"),    # 63 headers
        (bytes.fromhex("0e 00 00 00 01 01 01 00 00"), 1, "header count"),    # -1 headers
        (bytes.fromhex("10 00 00 00 01 01 02 01 01"), 1, "null header key"),
        (bytes.fromhex("10 00 00 00 01 01 02 02 ff 01"), 1, "not UTF-8"),
        (bytes.fromhex("12 00 00 00 02 6b 02 76 00 00"), 1, "fields took"),  # length too long
    ],
)
def test_corrupt_records_are_typed_errors(records_part, record_count, reason):
    batch = batch_with_records_part(records_part, record_count=record_count)
    validate_batch(batch)  # the header and CRC are fine: only the records are bad
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(batch)
    assert reason in str(info.value)
    assert info.value.position == 0


def test_huge_record_count_in_header_is_rejected_before_parsing():
    batch = batch_with_records_part(KNOWN_RECORD, record_count=2**31 - 1)
    with pytest.raises(CorruptRecordError, match="cannot fit"):
        decode_batch(batch)


def test_crc_mismatch_names_position():
    first = encode_batch([(b"a", b"1")], base_timestamp_ms=1)
    second = bytearray(encode_batch([(b"b", b"2")], base_offset=1, base_timestamp_ms=1))
    second[-1] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        list(decode_records(first + bytes(second)))
    assert info.value.position == len(first)


@pytest.mark.parametrize("compression", [COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_damaged_compressed_data_is_corrupt(compression):
    batch = bytearray(encode_batch(sample_records(), compression=compression))
    for cut in (HEADER_SIZE + 5, len(batch) - 3):
        damaged = bytearray(batch[:cut])
        struct.pack_into(">i", damaged, 8, len(damaged) - 12)
        with pytest.raises(CorruptRecordError):
            decode_batch(restamp_crc(damaged))
    garbage = batch_with_records_part(b"\x00" * 40, compression=compression)
    with pytest.raises(CorruptRecordError):
        decode_batch(garbage)


@pytest.mark.parametrize(
    ("compression", "compressed"),
    [
        (COMPRESSION_GZIP, lambda raw: gzip.compress(raw)),
        (COMPRESSION_LZ4, lambda raw: lz4.frame.compress(raw)),
        (COMPRESSION_ZSTD, lambda raw: zstandard.ZstdCompressor().compress(raw)),
        # A Java producer's zstd frame carries no content size.
        (COMPRESSION_ZSTD,
         lambda raw: zstandard.ZstdCompressor(write_content_size=False).compress(raw)),
    ],
)
def test_decompression_is_capped(compression, compressed):
    raw = KNOWN_RECORD + b"\x00" * (4 * 1024 * 1024)   # 4 MiB of zeros compress to little
    batch = batch_with_records_part(compressed(raw), compression=compression)
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(batch, max_decompressed_bytes=1024 * 1024)
    assert info.value.too_large
    # Under the cap the same data only fails for its trailing zeros.
    with pytest.raises(CorruptRecordError, match="bytes after the last"):
        decode_batch(batch, max_decompressed_bytes=8 * 1024 * 1024)


def test_zstd_without_content_size_decodes():
    raw = encode_batch(sample_records(), base_timestamp_ms=1)[HEADER_SIZE:]
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    batch = batch_with_records_part(frame, record_count=5, compression=COMPRESSION_ZSTD)
    assert len(decode_batch(batch)[1]) == 5


def test_concatenated_gzip_members_decode():
    raw = encode_batch(sample_records(), base_timestamp_ms=1)[HEADER_SIZE:]
    half = len(raw) // 2
    members = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    batch = batch_with_records_part(members, record_count=5, compression=COMPRESSION_GZIP)
    assert len(decode_batch(batch)[1]) == 5


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CODECS), st.data())
def test_any_byte_damage_is_a_corrupt_record_error_or_decodes(compression, data):
    # Damage inside the records, CRC fixed up: decode must fail typed, never crash.
    batch = bytearray(encode_batch(sample_records(), compression=compression))
    flips = data.draw(st.lists(st.tuples(st.integers(HEADER_SIZE, len(batch) - 1),
                                         st.integers(1, 255)), min_size=1, max_size=4))
    for index, mask in flips:
        batch[index] ^= mask
    try:
        decode_batch(restamp_crc(batch))
    except CorruptRecordError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 50), st.sampled_from(CODECS))
def test_random_records_bytes_never_crash(records_part, record_count, compression):
    batch = batch_with_records_part(records_part, record_count=record_count,
                                    compression=compression)
    try:
        decode_batch(batch)
    except CorruptRecordError:
        pass


# -- an independent implementation: kafka-python ------------------------------------

try:  # a dev dependency; only these cross-checks need it
    with warnings.catch_warnings():  # kafka-python's import warns about importlib.resources
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record import default_records as kafka_records
except ImportError:  # pragma: no cover
    kafka_records = None
needs_kafka_python = pytest.mark.skipif(kafka_records is None, reason="kafka-python not installed")

record_strategy = st.builds(
    SimpleRecord,
    key=st.none() | st.binary(max_size=30),
    value=st.none() | st.binary(max_size=300),
    headers=st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)),
                     max_size=3).map(tuple),
    timestamp_ms=st.integers(0, 2**41),
)


def kafka_python_batch(records: list[SimpleRecord], compression: int) -> bytes:
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset, record in enumerate(records):
        builder.append(offset, record.timestamp_ms, record.key, record.value,
                       list(record.headers))
    return bytes(builder.build())


@needs_kafka_python
@settings(max_examples=60, deadline=None)
@given(st.lists(record_strategy, min_size=1, max_size=10), st.sampled_from(CODECS),
       st.integers(0, 2**40), st.integers(0, 2**31 - 1))
def test_kafka_python_reads_our_batches(records, compression, base_offset, leader_epoch):
    batch = encode_batch(records, base_offset=base_offset, partition_leader_epoch=leader_epoch,
                         compression=compression)
    theirs = kafka_records.DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    assert theirs.base_offset == base_offset
    assert theirs.leader_epoch == leader_epoch
    assert theirs.compression_type == compression
    assert theirs.max_timestamp == max(r.timestamp_ms for r in records)
    assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in theirs] == [
        (base_offset + i, s.timestamp_ms, s.key, s.value, list(s.headers))
        for i, s in enumerate(records)
    ]


@needs_kafka_python
@settings(max_examples=60, deadline=None)
@given(st.lists(record_strategy, min_size=1, max_size=10), st.sampled_from(CODECS))
def test_we_read_kafka_python_batches(records, compression):
    batch = kafka_python_batch(records, compression)
    header, decoded = decode_batch(batch)
    assert header.record_count == len(records)
    assert decoded == [
        Record(i, s.timestamp_ms, s.key, s.value, s.headers) for i, s in enumerate(records)
    ]


@needs_kafka_python
@pytest.mark.parametrize("compression", CODECS)
def test_kafka_python_compressed_batch_is_read(compression):
    # Compressible values so kafka-python really compresses (it falls back to none otherwise).
    records = [SimpleRecord(b"k%d" % i, b"x" * 500, (("h", b"v"),), 1_700_000_000_000 + i)
               for i in range(50)]
    batch = kafka_python_batch(records, compression)
    header, decoded = decode_batch(batch)
    assert header.compression == compression
    assert [r.value for r in decoded] == [b"x" * 500] * 50
    ours = encode_batch(records, compression=compression)
    assert [r.value for r in kafka_records.DefaultRecordBatch(ours)] == [b"x" * 500] * 50


@needs_kafka_python
def test_uncompressed_bytes_equal_kafka_python_bytes():
    # Same inputs, same bytes: both follow the format to the byte (kafka-python leaves the
    # leader epoch 0 and base offset 0, so we ask for the same).
    records = sample_records()
    theirs = kafka_python_batch(records, COMPRESSION_NONE)
    ours = encode_batch(records, partition_leader_epoch=0)
    assert ours == theirs
