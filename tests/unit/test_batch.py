"""proto/batch.py: header reads, validation, iteration and in-place restamping."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.proto.batch import (
    BATCH_LENGTH_MIN,
    HEADER_SIZE,
    LOG_OVERHEAD,
    batch_crc_valid,
    compute_crc,
    iter_batches,
    peek_batch_size,
    read_header,
    set_base_offset_and_epoch,
    validate_batch,
)
from tidewater.proto.errors import CorruptRecordError
from tidewater.proto.records import COMPRESSION_GZIP, SimpleRecord, decode_batch, encode_batch


def three_batches() -> tuple[bytes, list[int]]:
    batches = [
        encode_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0, partition_leader_epoch=0,
                     base_timestamp_ms=10),
        encode_batch([(None, b"3" * 100)], base_offset=2, partition_leader_epoch=1,
                     compression=COMPRESSION_GZIP, base_timestamp_ms=20),
        encode_batch([SimpleRecord(b"c", None, (("h", b"v"),), 30)] * 3, base_offset=3,
                     partition_leader_epoch=1),
    ]
    positions = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    return b"".join(batches), positions


def test_header_fields_and_properties():
    batch = encode_batch([SimpleRecord(b"a", b"1", (), 5), SimpleRecord(b"b", b"2", (), 9)],
                         base_offset=40, partition_leader_epoch=3, compression=COMPRESSION_GZIP,
                         producer_id=7, producer_epoch=2, base_sequence=100)
    header = validate_batch(batch)
    assert header == read_header(batch)
    assert (header.base_offset, header.partition_leader_epoch, header.magic) == (40, 3, 2)
    assert header.batch_length == len(batch) - LOG_OVERHEAD
    assert header.size == len(batch) == peek_batch_size(batch)
    assert (header.last_offset_delta, header.last_offset, header.next_offset) == (1, 41, 42)
    assert (header.base_timestamp, header.max_timestamp) == (5, 9)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 100)
    assert header.record_count == 2
    assert header.compression == COMPRESSION_GZIP
    assert header.timestamp_type == 0
    assert not header.is_control
    assert header.crc == compute_crc(batch, 0, len(batch))
    assert batch_crc_valid(batch)


def test_iter_batches_yields_positions_and_headers():
    buf, positions = three_batches()
    found = list(iter_batches(buf))
    assert [p for p, _ in found] == positions
    assert [h.base_offset for _, h in found] == [0, 2, 3]
    assert [h.partition_leader_epoch for _, h in found] == [0, 1, 1]
    assert [p for p, _ in iter_batches(buf, validate=False)] == positions
    assert [p for p, _ in iter_batches(buf, positions[1])] == positions[1:]
    assert list(iter_batches(b"")) == []


def test_restamp_changes_offset_and_epoch_but_not_crc():
    buf, positions = three_batches()
    restamped = bytearray(buf)
    for i, position in enumerate(positions):
        set_base_offset_and_epoch(restamped, position, 1000 + 10 * i, 77)
    for i, (position, header) in enumerate(iter_batches(restamped)):
        original = read_header(buf, position)
        assert header.crc == original.crc
        assert (header.base_offset, header.partition_leader_epoch) == (1000 + 10 * i, 77)
        # Records are relative to the new base offset.
        _, records = decode_batch(restamped, position)
        assert records[0].offset == 1000 + 10 * i
    # Only the 8 + 4 stamped bytes changed in each batch.
    diff = [i for i in range(len(buf)) if buf[i] != restamped[i]]
    assert all(any(p <= i < p + 8 or p + 12 <= i < p + 16 for p in positions) for i in diff)


def test_restamp_through_memoryview():
    batch = bytearray(encode_batch([(b"a", b"1")], base_timestamp_ms=1))
    set_base_offset_and_epoch(memoryview(batch), 0, 2**40, 2**31 - 1)
    header = validate_batch(batch)
    assert (header.base_offset, header.partition_leader_epoch) == (2**40, 2**31 - 1)


def test_every_torn_tail_raises_with_the_torn_batch_position():
    buf, positions = three_batches()
    last = positions[-1]
    for cut in range(last + 1, len(buf)):
        with pytest.raises(CorruptRecordError) as info:
            list(iter_batches(buf[:cut]))
        assert info.value.position == last
        with pytest.raises(CorruptRecordError) as info:
            list(iter_batches(buf[:cut], validate=False))
        assert info.value.position == last


def test_truncated_header_reads():
    batch = encode_batch([(b"a", b"1")], base_timestamp_ms=1)
    with pytest.raises(CorruptRecordError, match="truncated batch header"):
        read_header(batch[: HEADER_SIZE - 1])
    assert peek_batch_size(batch[: LOG_OVERHEAD - 1]) is None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_flipped_bit_in_crc_range_fails_crc(data):
    buf, positions = three_batches()
    damaged = bytearray(buf)
    batch_index = data.draw(st.integers(0, 2))
    position = positions[batch_index]
    end = positions[batch_index + 1] if batch_index < 2 else len(buf)
    index = data.draw(st.integers(position + 21, end - 1))   # attributes..end: under the CRC
    damaged[index] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(damaged))
    assert info.value.position == position
    assert not batch_crc_valid(damaged, position)


def test_stored_crc_damage_is_a_mismatch():
    batch = bytearray(encode_batch([(b"a", b"1")], base_timestamp_ms=1))
    batch[18] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        validate_batch(batch)


def test_wrong_magic():
    batch = bytearray(encode_batch([(b"a", b"1")], base_timestamp_ms=1))
    batch[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        validate_batch(batch)


@pytest.mark.parametrize("batch_length", [-1, 0, BATCH_LENGTH_MIN - 1])
def test_batch_length_below_minimum(batch_length):
    batch = bytearray(encode_batch([(b"a", b"1")], base_timestamp_ms=1))
    struct.pack_into(">i", batch, 8, batch_length)
    with pytest.raises(CorruptRecordError, match="below minimum"):
        validate_batch(batch)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(batch, validate=False))


def test_batch_length_beyond_buffer_is_truncation():
    batch = bytearray(encode_batch([(b"a", b"1")], base_timestamp_ms=1))
    struct.pack_into(">i", batch, 8, 2**31 - 1)   # absurd length: an error, never an allocation
    with pytest.raises(CorruptRecordError, match="truncated"):
        validate_batch(batch)


def test_max_size_flags_too_large():
    batch = encode_batch([(b"a", b"x" * 1000)], base_timestamp_ms=1)
    with pytest.raises(CorruptRecordError) as info:
        validate_batch(batch, max_size=len(batch) - 1)
    assert info.value.too_large
    assert validate_batch(batch, max_size=len(batch)).size == len(batch)


def test_error_position_in_a_later_batch_and_with_path():
    buf, positions = three_batches()
    err = CorruptRecordError("x", position=positions[2], path="/d/0.log")
    assert str(err) == f"x at /d/0.log:{positions[2]}"
    damaged = bytearray(buf)
    damaged[positions[1] + 16] = 0   # magic of the second batch
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(damaged))
    assert info.value.position == positions[1]
