"""The records decoder's fast path agrees with its general path, on good and damaged bytes.

``proto.records._read_rows`` decodes the common record shape inline and hands any
other record to ``_read_record``; ``_read_rows_general`` uses ``_read_record``
alone. Both must return the same records for every input, or both reject it.
"""

from __future__ import annotations

import struct
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidewater.proto.records as records_module
from tidewater.proto.batch import HEADER_SIZE, read_header
from tidewater.proto.errors import CorruptRecordError
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    ConsumerRecord,
    Record,
    SimpleRecord,
    _read_rows,
    _read_rows_general,
    decode_batch,
    decode_batch_records,
    decode_consumer_records,
    encode_batch,
)

pytestmark = pytest.mark.timeout(120)

try:  # a dev dependency; only the cross-check needs it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.record import default_records as kafka_records
except ImportError:  # pragma: no cover
    kafka_records = None

# Lengths around the 1-, 2- and 3-byte varint boundaries (63/64 and 8191/8192 bytes),
# timestamps before and after the base one, and headers now and then.
sizes = st.sampled_from([0, 1, 63, 64, 100, 1024, 8191, 8192, 9000])
record_strategy = st.builds(
    SimpleRecord,
    key=st.none() | sizes.map(lambda n: b"k" * n) | st.binary(max_size=70),
    value=st.none() | sizes.map(lambda n: b"v" * n) | st.binary(max_size=200),
    headers=st.one_of(st.just(()), st.lists(
        st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=80)), max_size=3).map(tuple)),
    timestamp_ms=st.integers(1_700_000_000_000 - 2**20, 1_700_000_000_000 + 2**30),
)
batches = st.builds(
    lambda recs, base_offset, epoch: encode_batch(recs, base_offset=base_offset,
                                                  partition_leader_epoch=epoch),
    st.lists(record_strategy, min_size=1, max_size=12), st.integers(0, 2**40), st.integers(0, 2**20))


def both_paths(data: bytes, header) -> tuple[object, object]:
    """(fast result, general result); a result is the rows or the ValueError's type."""
    out = []
    for read in (_read_rows, _read_rows_general):
        try:
            out.append(read(data, HEADER_SIZE, len(data), header))
        except ValueError:
            out.append(ValueError)
    return out[0], out[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_fast_and_general_paths_agree(batch):
    fast, general = both_paths(batch, read_header(batch))
    assert fast == general
    assert all(type(r) is Record for r in fast)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches, st.data())
def test_paths_agree_on_damaged_records(batch, data):
    """Damage inside the records part (bytes changed, the length or count wrong): the two
    paths decode the same records or both reject the bytes."""
    damaged = bytearray(batch)
    body = len(damaged) - HEADER_SIZE
    for _ in range(data.draw(st.integers(1, 3))):
        where = HEADER_SIZE + data.draw(st.integers(0, body - 1))
        damaged[where] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF]))
    cut = data.draw(st.integers(0, 4))
    if cut:
        del damaged[-cut:]
    header = read_header(bytes(damaged))
    count_change = data.draw(st.sampled_from([0, 0, 1, -1]))
    if count_change:
        header = header._replace(record_count=max(0, header.record_count + count_change))
    fast, general = both_paths(bytes(damaged), header)
    assert fast == general
    # Decoded in place inside a fetch answer, the bytes after the batch change nothing.
    followed = bytes(damaged) + data.draw(st.sampled_from([b"\x80" * 16, b"\x00" * 16, batch]))
    try:
        in_place = _read_rows(followed, HEADER_SIZE, len(damaged), header)
    except ValueError:
        in_place = ValueError
    assert in_place == fast


def test_common_shape_never_reaches_the_general_path(monkeypatch):
    """What producers write (null key, 1-2 byte lengths, no headers) is decoded inline."""
    def general(*args):
        raise AssertionError("general path used")

    monkeypatch.setattr(records_module, "_read_record", general)
    batch = encode_batch([(None, bytes([i]) * (i * 40)) for i in range(150)], base_offset=10,
                         base_timestamp_ms=5)
    header, records = decode_batch(batch)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (10 + i, 5, None, bytes([i]) * (i * 40), ()) for i in range(150)]


def test_uncommon_records_mixed_into_a_batch_use_the_general_path_for_those_only(monkeypatch):
    calls = []
    real = records_module._read_record

    def counting(data, pos, end):
        calls.append(pos)
        return real(data, pos, end)

    monkeypatch.setattr(records_module, "_read_record", counting)
    records = [SimpleRecord(None, b"small", (), 1000), SimpleRecord(b"k", b"x" * 10000, (), 1001),
               SimpleRecord(None, b"small", (("h", b"v"),), 1002),
               SimpleRecord(None, b"t", (), 1000 + 2**20)]
    header, decoded = decode_batch(encode_batch(records))
    assert decoded == [Record(i, r.timestamp_ms, r.key, r.value, r.headers)
                       for i, r in enumerate(records)]
    assert len(calls) == 2  # the 10000-byte value and the 3-byte timestamp delta


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4,
                                         COMPRESSION_ZSTD])
def test_consumer_records_match_records(compression):
    records = [SimpleRecord(None if i % 3 else b"key%d" % i, b"v" * i, (("n", b"%d" % i),) if i % 5 == 0
                            else (), 2000 + i) for i in range(100)]
    batch = encode_batch(records, base_offset=500, partition_leader_epoch=7, compression=compression)
    buf = b"\x00" * 13 + batch  # not at position 0: positions inside a fetch answer
    header = read_header(buf, 13)
    plain = decode_batch_records(buf, 13, header)
    consumer = decode_consumer_records(buf, 13, header, "topic", 4)
    assert all(type(r) is ConsumerRecord for r in consumer)
    assert consumer == [ConsumerRecord("topic", 4, r.offset, r.key, r.value, r.timestamp, 7, r.headers)
                        for r in plain]
    assert consumer[5].offset == 505 and consumer[5].timestamp == 2005
    assert consumer[5].headers == (("n", b"5"),) and consumer[5].leader_epoch == 7


def test_records_are_bytes_not_views_and_keyword_construction_works():
    batch = encode_batch([(b"k", b"v")])
    [record] = decode_batch(memoryview(batch))[1]
    assert type(record.key) is bytes and type(record.value) is bytes
    assert record == Record(offset=0, timestamp=record.timestamp, key=b"k", value=b"v")
    assert record._replace(offset=3).offset == 3


def test_record_running_into_the_next_batch_is_corrupt():
    """An uncompressed batch is decoded in place inside the fetch answer: a record whose
    fields run past its batch must not take bytes of the next one."""
    first = bytearray(encode_batch([(None, b"a" * 30)]))
    second = encode_batch([(None, b"b" * 30)], base_offset=1)
    first[HEADER_SIZE + 5] = 0x7E  # value length 63 instead of 30: past the batch end
    buf = bytes(first) + second
    with pytest.raises(CorruptRecordError):
        decode_batch_records(buf, 0, read_header(buf, 0))


@pytest.mark.skipif(kafka_records is None, reason="kafka-python not installed")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_strategy, min_size=1, max_size=8))
def test_fast_path_agrees_with_kafka_python(records):
    builder = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30)
    for offset, r in enumerate(records):
        builder.append(offset, r.timestamp_ms, r.key, r.value, list(r.headers))
    batch = bytes(builder.build())
    ours = decode_batch(batch)[1]
    theirs = [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers))
              for r in kafka_records.DefaultRecordBatch(batch)]
    assert [tuple(r) for r in ours] == theirs


def test_record_count_beyond_the_bytes_is_rejected_by_both_paths():
    batch = bytearray(encode_batch([(None, b"x")]))
    struct.pack_into(">i", batch, 57, 1000)
    header = read_header(bytes(batch))
    assert both_paths(bytes(batch), header) == (ValueError, ValueError)


def test_record_length_must_match_its_fields_even_when_the_slack_is_a_record():
    """Record A's length is stretched over record B (a valid record): taking A's fields and
    then B as the second record would be wrong; both paths reject A."""
    batch = bytearray(encode_batch([(None, b"a"), (None, b"b")]))
    a_length = batch[HEADER_SIZE] >> 1
    b_size = 1 + a_length  # same shape: B's length byte plus its fields
    batch[HEADER_SIZE] = (a_length + b_size) << 1
    header = read_header(bytes(batch))
    assert header.record_count == 2
    assert both_paths(bytes(batch), header) == (ValueError, ValueError)
