"""ReplicaFetch's hand-written FetchResponse bytes against protobuf's own encoding and parsing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.serving.fetch import FetchedPartition, fetch_response
from tidewater.broker.serving.replica_fetch_wire import (
    BY_HAND_ANSWER_BYTES,
    BY_HAND_RECORDS_BYTES,
    MalformedFetchResponseError,
    decode_by_hand,
    decode_by_protobuf,
    decode_fetch_response,
    encode_by_hand,
    encode_fetch_response,
)
from tidewater.proto import tidewater_pb2 as pb

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
# Small values (one-byte varints, zero omitted) as often as the extremes.
SMALL = st.integers(-2, 200)
int32s = st.one_of(SMALL, INT32)
int64s = st.one_of(SMALL, INT64)

fetched_partitions = st.builds(
    FetchedPartition,
    topic=st.text(max_size=20), partition=int32s,
    error_code=st.one_of(st.sampled_from(pb.ErrorCode.values()), INT32),
    error_message=st.text(max_size=40),
    high_watermark=int64s, log_start_offset=int64s, log_end_offset=int64s,
    leader_epoch=int32s,
    records=st.one_of(st.just(b""), st.binary(max_size=300), st.binary(min_size=200, max_size=20_000)),
    diverging=st.one_of(st.none(), st.tuples(int32s, int64s)))
answers = st.lists(fetched_partitions, max_size=5)
# Records bytes from which a partition is written and read by hand: all, some, none.
by_hand_bytes = st.sampled_from([0, 1, 300, 5_000, BY_HAND_RECORDS_BYTES])


def as_fetched(view: FetchedPartition) -> FetchedPartition:
    """A decoded answer with its records as bytes (a memoryview where read by hand)."""
    return view._replace(records=bytes(view.records))


def pb_partitions(response: pb.FetchResponse) -> list[FetchedPartition]:
    """What protobuf parsed, as the tuples compared (diverging by HasField, as read)."""
    return [FetchedPartition(
        p.topic, p.partition, p.error_code, p.error_message, p.high_watermark,
        p.log_start_offset, p.log_end_offset, p.leader_epoch, p.records,
        (p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
        if p.HasField("diverging_epoch") else None) for p in response.partitions]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers, by_hand_bytes, st.booleans())
def test_encoded_answer_parses_to_the_message_fetch_response_builds(results, threshold, held):
    wire = encode_by_hand(results)
    assert pb.FetchResponse.FromString(wire) == fetch_response(results)
    # And the same bytes protobuf writes (proto3: fields in number order, zeros omitted),
    # so the partitions may be written either way, in runs.
    assert wire == fetch_response(results).SerializeToString(deterministic=True)
    assert encode_fetch_response(results, by_hand_bytes=threshold) == wire
    expected = fetch_response(results)
    expected.session_held = held
    assert encode_fetch_response(results, by_hand_bytes=threshold, session_held=held) \
        == expected.SerializeToString(deterministic=True)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.sampled_from(pb.ErrorCode.values()), INT32), answers, by_hand_bytes)
def test_request_level_error_code_is_encoded(code, results, threshold):
    expected = fetch_response(results)
    expected.error_code = code
    assert pb.FetchResponse.FromString(encode_by_hand(results, error_code=code)) == expected
    assert pb.FetchResponse.FromString(
        encode_fetch_response(results, error_code=code, by_hand_bytes=threshold)) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.sampled_from(pb.ErrorCode.values()), INT32), answers, by_hand_bytes,
       st.booleans())
def test_decoded_answer_is_what_protobuf_parses(code, results, threshold, held):
    message = fetch_response(results)
    message.error_code = code
    message.session_held = held
    wire = message.SerializeToString()
    error_code, partitions, session_held = decode_by_hand(wire)
    assert error_code == code
    assert session_held is held
    assert [as_fetched(p) for p in partitions] == results == pb_partitions(message)
    for p in partitions:  # slices of the bytes received, not copies
        assert isinstance(p.records, memoryview)
        assert p.records.obj is wire or not p.records
    assert decode_by_protobuf(wire) == (error_code, [as_fetched(p) for p in partitions], held)
    mixed = decode_fetch_response(wire, by_hand_bytes=threshold, whole_below=0)
    assert mixed == decode_by_protobuf(wire)  # in runs: the same, in order
    assert decode_fetch_response(wire) == decode_by_protobuf(wire)


def test_partitions_with_records_worth_it_are_read_by_hand():
    big = FetchedPartition("t", 0, 0, "", 9, 0, 9, 1, b"r" * BY_HAND_ANSWER_BYTES, None)
    small = big._replace(partition=1, records=b"r")
    wire = encode_fetch_response([small, small, big, small])
    read = decode_fetch_response(wire)[1]
    assert [type(p.records) for p in read] == [bytes, bytes, memoryview, bytes]
    assert [p.partition for p in read] == [1, 1, 0, 1]
    small_answer = encode_fetch_response([big._replace(records=b"r" * BY_HAND_RECORDS_BYTES)])
    assert len(small_answer) < BY_HAND_ANSWER_BYTES  # parsed whole, by protobuf
    assert isinstance(decode_fetch_response(small_answer)[1][0].records, bytes)


def test_decoder_takes_what_a_protobuf_peer_may_send():
    """Fields out of order, repeated (the last wins, a submessage merges), and fields or
    wire types it does not know (skipped), as protobuf parses them."""
    partition = (b"\x52\x03abc"  # records first
                 + b"\x10\x05\x10\x07"  # partition twice: 7
                 + b"\x4a\x02\x08\x04" + b"\x4a\x02\x10\x09"  # diverging in two parts: (4, 9)
                 + b"\x0a\x01t"
                 + b"\x58\x01"  # field 11: unknown varint
                 + b"\x0a\x01u"  # topic again: "u"
                 + b"\x21" + b"\x00" * 8  # field 4 (error_message) as fixed64: skipped
                 + b"\x1d\x00\x00\x00\x00")  # field 3 as fixed32: skipped
    wire = (b"\x12" + bytes([len(partition)]) + partition
            + b"\x08\x03")  # request-level error code after the partition
    expected = pb.FetchResponse.FromString(wire)
    error_code, partitions, _ = decode_by_hand(wire)
    assert error_code == expected.error_code == 3
    assert [as_fetched(p) for p in partitions] == pb_partitions(expected)
    assert as_fetched(partitions[0]) == FetchedPartition("u", 7, 0, "", 0, 0, 0, 0, b"abc", (4, 9))


@pytest.mark.parametrize("wire", [
    b"\x12",  # a length missing
    b"\x12\x05\x0a\x01",  # a partition longer than what is left
    b"\x12\x03\x0a\x05t",  # a topic running past its partition
    b"\x12\x02\x10\x80",  # a varint running past its partition
    b"\x08" + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
    b"\x00\x01",  # field number 0
    b"\x0c",  # an end of group never started (wire type 4)
    b"\x0f",  # wire type 7
    b"\x12\x03\x0a\x01\xff",  # a topic not UTF-8
    b"\x12\x04\x22\x02\xc3\x28",  # an error message not UTF-8
    b"\x12\x04\x4a\x02\x08\x80",  # a diverging epoch cut inside its varint
    b"\x80\x80\x80\x80\x80\x01\x00",  # a key longer than 5 bytes
])
def test_malformed_answers_raise_the_typed_error(wire):
    with pytest.raises(MalformedFetchResponseError):
        decode_by_hand(wire)
    with pytest.raises(MalformedFetchResponseError):
        decode_fetch_response(wire, by_hand_bytes=0, whole_below=0)
    with pytest.raises(MalformedFetchResponseError):  # protobuf refuses them too
        decode_by_protobuf(wire)
    with pytest.raises(MalformedFetchResponseError):
        decode_fetch_response(wire)


def test_groups_are_refused_though_protobuf_skips_them():
    """No FetchResponse has a group; a peer writing one is not one we know."""
    assert pb.FetchResponse.FromString(b"\x5b\x5c").ListFields() == []  # field 11, skipped
    with pytest.raises(MalformedFetchResponseError):
        decode_by_hand(b"\x5b\x5c")


def test_not_bytes_raises_the_typed_error():
    with pytest.raises(MalformedFetchResponseError):
        decode_fetch_response(None)  # type: ignore[arg-type]


def check_against_protobuf(wire: bytes) -> None:
    """Either the typed error, or exactly what protobuf parses (never another exception),
    read by hand and in runs."""
    for decode in (decode_by_hand,
                   lambda raw: decode_fetch_response(raw, by_hand_bytes=8, whole_below=0)):
        try:
            error_code, partitions, session_held = decode(wire)
        except MalformedFetchResponseError:
            continue
        expected = pb.FetchResponse.FromString(wire)
        assert error_code == expected.error_code
        assert session_held is expected.session_held
        assert [as_fetched(p) for p in partitions] == pb_partitions(expected)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_the_typed_error_or_parses_as_protobuf_does(wire):
    check_against_protobuf(wire)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers.filter(bool), st.data())
def test_damaged_answers_raise_the_typed_error_or_parse_as_protobuf_does(results, data):
    wire = bytearray(encode_by_hand(results))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(wire) - 1))
        how = data.draw(st.sampled_from(("flip", "cut", "insert")))
        if how == "flip":
            wire[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del wire[at:]
            if not wire:
                break
        else:
            wire[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    check_against_protobuf(bytes(wire))
