"""proto.batch_builder, the one RecordBatch v2 encoder (``encode_batch`` is it too).

What it writes decodes back to the records it was given, equals kafka-python's
bytes for the same inputs, and equals frozen vectors, so the format cannot drift.
"""

import gzip
import subprocess
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.proto.batch import HEADER_SIZE, validate_batch
from tidewater.proto.batch_builder import BatchBuilder
from tidewater.proto.errors import UnsupportedCompressionError
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    SimpleRecord,
    decode_batch,
    decompress,
    encode_batch,
)

try:  # a dev dependency; only the cross-check needs it
    with warnings.catch_warnings():  # kafka-python's import warns about importlib.resources
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record import default_records as kafka_records
except ImportError:  # pragma: no cover
    kafka_records = None
needs_kafka_python = pytest.mark.skipif(kafka_records is None, reason="kafka-python not installed")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
INT32_MAX = (1 << 31) - 1

# Long values (past the varint lookup table's 16,383) cheaply: a short blob repeated.
blobs = st.one_of(st.none(), st.binary(max_size=300),
                  st.binary(min_size=1, max_size=20).map(lambda b: b * 1000))
headers = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=40))),
                   max_size=3).map(tuple)
timestamps = st.one_of(
    st.integers(min_value=1_700_000_000_000, max_value=1_700_000_100_000),  # deltas small and large
    st.integers(min_value=INT64_MIN // 2, max_value=INT64_MAX // 2))
records = st.lists(st.builds(SimpleRecord, key=blobs, value=blobs, headers=headers, timestamp_ms=timestamps),
                   min_size=1, max_size=25)
producer_states = st.tuples(st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 15) - 1),
                            st.integers(-1, INT32_MAX))


def build(recs, compression=COMPRESSION_NONE, base_timestamp_ms=None, **header) -> bytes:
    builder = BatchBuilder(base_timestamp_ms)
    for r in recs:
        builder.append(r.key, r.value, r.headers, r.timestamp_ms)
    return builder.build(compression, **header)


def decoded(batch: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_batch(batch)[1]]


def expected(recs, base_offset=0) -> list[tuple]:
    return [(base_offset + i, r.timestamp_ms, r.key, r.value, r.headers) for i, r in enumerate(recs)]


def kafka_python_batch(recs, producer_id=-1, producer_epoch=-1, base_sequence=-1) -> bytes:
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=COMPRESSION_NONE, is_transactional=False, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 30)
    for offset, r in enumerate(recs):
        builder.append(offset, r.timestamp_ms, r.key, r.value, list(r.headers))
    return bytes(builder.build())


@needs_kafka_python
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, producer_states)
def test_bytes_decode_back_and_equal_kafka_python(recs, producer_state):
    producer_id, producer_epoch, base_sequence = producer_state
    # kafka-python leaves baseOffset and partitionLeaderEpoch 0: ask for the same.
    ours = encode_batch(recs, partition_leader_epoch=0, producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=base_sequence)
    assert ours == kafka_python_batch(recs, producer_id, producer_epoch, base_sequence)
    assert build(recs, partition_leader_epoch=0, producer_id=producer_id,
                 producer_epoch=producer_epoch, base_sequence=base_sequence) == ours
    header = validate_batch(ours)
    assert (header.record_count, header.last_offset_delta) == (len(recs), len(recs) - 1)
    assert header.base_timestamp == recs[0].timestamp_ms
    assert header.max_timestamp == max(r.timestamp_ms for r in recs)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer_state
    assert decoded(ours) == expected(recs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.sampled_from([COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]),
       st.integers(0, 1 << 40), st.integers(-1, INT32_MAX))
def test_compressed_batch_is_the_plain_one_with_its_records_part_compressed(
        recs, compression, base_offset, leader_epoch):
    plain = encode_batch(recs, base_offset=base_offset, partition_leader_epoch=leader_epoch)
    packed = encode_batch(recs, compression=compression, base_offset=base_offset,
                          partition_leader_epoch=leader_epoch)
    assert build(recs, compression, base_offset=base_offset,
                 partition_leader_epoch=leader_epoch) == packed
    plain_header, packed_header = validate_batch(plain), validate_batch(packed)
    assert packed_header.compression == compression
    assert packed_header._replace(batch_length=0, crc=0, attributes=0) == \
        plain_header._replace(batch_length=0, crc=0, attributes=0)
    assert decompress(compression, packed[HEADER_SIZE:]) == plain[HEADER_SIZE:]
    assert decoded(packed) == expected(recs, base_offset)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, timestamps)
def test_an_explicit_base_timestamp_gives_deltas_from_it(recs, base_timestamp_ms):
    batch = build(recs, base_timestamp_ms=base_timestamp_ms)
    assert validate_batch(batch).base_timestamp == base_timestamp_ms
    assert decoded(batch) == expected(recs)
    assert encode_batch(recs, base_timestamp_ms=base_timestamp_ms) == batch


# Frozen bytes: the format itself, written once and checked by hand against the layout.
GOLDEN_RECORDS = [
    SimpleRecord(b"key-0", b"value-0", (("h1", b"x"), ("h\u00e9", None)), 1_700_000_000_500),
    SimpleRecord(None, b"", (), 1_700_000_000_000),  # a negative timestamp delta
    SimpleRecord(b"", None, (), 1_700_000_123_456),  # a 3-byte delta
    SimpleRecord(b"k", b"v" * 70, (), 1_700_000_000_501),  # 2-byte value and record lengths
]
GOLDEN_HEADER = dict(base_offset=1234, partition_leader_epoch=7, producer_id=99, producer_epoch=3,
                     base_sequence=40)
GOLDEN = bytes.fromhex(
    "00000000000004d2000000af0000000702033974680000000000030000018bcfe569f40000018bcf"
    "e74a40000000000000006300030000002800000004380000000a6b65792d300e76616c75652d3004"
    "04683102780668c3a9010e00e70702010000100098810f040001009c01000206026b8c0176767676"
    + "76" * 66 + "00")
# Pairs, no timestamps: every record takes the explicit base timestamp.
GOLDEN_PAIRS = bytes.fromhex(
    "000000000000000500000045ffffffff02458071eb0000000000010000018bcfe568000000018bcfe568"
    "00ffffffffffffffffffffffffffff0000000216000000010a68656c6c6f000e000002026b0100")


def test_golden_bytes():
    assert encode_batch(GOLDEN_RECORDS, **GOLDEN_HEADER) == GOLDEN
    assert build(GOLDEN_RECORDS, **GOLDEN_HEADER) == GOLDEN
    assert encode_batch([(None, b"hello"), (b"k", None)], base_timestamp_ms=1_700_000_000_000,
                        base_offset=5) == GOLDEN_PAIRS


def test_golden_gzip_header_and_records_part():
    # The codec's own bytes may change with zlib; the header and what they decompress to may not.
    batch = encode_batch(GOLDEN_RECORDS, compression=COMPRESSION_GZIP, **GOLDEN_HEADER)
    assert batch[:8] == GOLDEN[:8] and batch[12:17] == GOLDEN[12:17]
    assert batch[21:23] == b"\x00\x01" and batch[23:HEADER_SIZE] == GOLDEN[23:HEADER_SIZE]
    assert gzip.decompress(batch[HEADER_SIZE:]) == GOLDEN[HEADER_SIZE:]
    assert validate_batch(batch).batch_length == len(batch) - 12


def test_many_records_pass_the_small_varint_tables():
    # Offset deltas beyond the lookup table (1 << 14) take the general varint path.
    recs = [SimpleRecord(None, b"v", (), 1000 + i % 3) for i in range(20_000)]
    batch = build(recs)
    assert batch == encode_batch(recs)
    assert decoded(batch) == expected(recs)


def test_a_bad_record_raises_and_leaves_the_batch_unchanged():
    builder = BatchBuilder()
    with pytest.raises(TypeError):
        builder.append(b"k", "not bytes", (), 3)  # a failed first record fixes no base timestamp
    builder.append(b"k", b"v", (), 5)
    before = builder.build()
    assert validate_batch(before).base_timestamp == 5
    with pytest.raises(TypeError):
        builder.append(b"k", "not bytes", (), 6)
    with pytest.raises(TypeError):
        builder.append(b"k", b"v", ((7, b"header key not str or bytes"),), 6)
    with pytest.raises(ValueError):
        builder.append(None, b"v", (), INT64_MAX + 1)
    with pytest.raises(TypeError):
        builder.append(None, b"v", (), 6.5)
    assert builder.record_count == 1 and builder.build() == before


def test_empty_batches_and_unknown_codecs_are_refused():
    with pytest.raises(ValueError):
        BatchBuilder().build()
    with pytest.raises(ValueError):
        encode_batch([])
    builder = BatchBuilder()
    builder.append(None, b"v", (), 1)
    with pytest.raises(UnsupportedCompressionError):
        builder.build(7)
    with pytest.raises(UnsupportedCompressionError):
        encode_batch([(None, b"v")], compression=7)
    with pytest.raises(ValueError):
        BatchBuilder(INT64_MAX + 1)


def test_small_varint_table_is_made_by_the_first_builder_not_at_import():
    """Issue 30: a broker imports the builder before it serves and builds no batch then."""
    code = ("from tidewater.proto import batch_builder as b\n"
            "assert b._SMALL == (), 'made at import'\n"
            "b.BatchBuilder()\n"
            "assert len(b._SMALL) == b._SMALL_MAX - b._SMALL_MIN\n"
            "assert (b._NULL, b._ZERO) == (b._SMALL[0], b._SMALL[1])\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_small_varint_table_is_the_zigzag_of_each_value():
    from tidewater.proto import batch_builder
    batch_builder.BatchBuilder()
    expected = tuple(batch_builder._zigzag_bytes(n)
                     for n in range(batch_builder._SMALL_MIN, batch_builder._SMALL_MAX))
    assert batch_builder._SMALL == expected
    assert batch_builder.encode_varint(127 // 2) == b"\x7e"
    assert batch_builder.encode_varint(64) == b"\x80\x01"
    assert batch_builder.encode_varint((1 << 14) - 1) == b"\xfe\xff\x01"
