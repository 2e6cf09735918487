"""client.batch_builder gives exactly proto.records.encode_batch's bytes, record by record."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.batch_builder import BatchBuilder
from proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    SimpleRecord,
    decode_batch,
    encode_batch,
)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

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


def build(recs, compression=COMPRESSION_NONE) -> bytes:
    builder = BatchBuilder()
    for r in recs:
        builder.append(r.key, r.value, r.headers, r.timestamp_ms)
    return builder.build(compression)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_builder_bytes_equal_encode_batch_and_decode_back(recs):
    built = build(recs)
    assert built == encode_batch(recs)
    header, decoded = decode_batch(built)
    assert header.record_count == len(recs)
    assert [(d.offset, d.timestamp, d.key, d.value, d.headers) for d in decoded] == [
        (i, r.timestamp_ms, r.key, r.value, r.headers) for i, r in enumerate(recs)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.sampled_from([COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD]))
def test_compressed_builds_equal_encode_batch(recs, compression):
    built = build(recs, compression)
    assert built == encode_batch(recs, compression=compression)
    assert [d.value for d in decode_batch(built)[1]] == [r.value for r in recs]


def test_many_records_pass_the_small_varint_tables():
    # Offset deltas beyond the lookup table (1 << 14) take the general varint path.
    recs = [SimpleRecord(None, b"v", (), 1000 + i % 3) for i in range(20_000)]
    assert build(recs) == encode_batch(recs)


def test_a_bad_record_raises_and_leaves_the_batch_unchanged():
    builder = BatchBuilder()
    builder.append(b"k", b"v", (), 5)
    before = builder.build()
    with pytest.raises(TypeError):
        builder.append(b"k", "not bytes", (), 6)
    with pytest.raises(ValueError):
        builder.append(None, b"v", (), INT64_MAX + 1)
    with pytest.raises(TypeError):
        builder.append(None, b"v", (), 6.5)
    assert builder.record_count == 1 and builder.build() == before


def test_an_empty_batch_cannot_be_built():
    with pytest.raises(ValueError):
        BatchBuilder().build()
