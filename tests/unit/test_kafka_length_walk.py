"""The planned length walk (``codec.check_lengths``) against the walk it replaced.

``check_lengths`` runs before kio's reader on every Kafka request: it is what keeps a
forged length from making kio allocate for bytes that are not there (``make fuzz`` found
a 100-byte frame claiming a 200 GB array). It is now planned once per class; the
reference below is the earlier walk, which read the schema's field list on every call,
kept here as the oracle: on every seed request of the fuzz corpus, cut short and with
bytes changed, both must stop at the same offset or both refuse.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.kafka.codec import _wire_fields, check_lengths, peek_head, request_type
from tidewater.proto.errors import InvalidRequestError

CORPUS = Path(__file__).parents[1] / "fuzz/corpus/kafka_request"
SEEDS = sorted(CORPUS.glob("seed-*"))

_FIXED_SIZES = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1, "uuid": 16,
                "float64": 8, "error_code": 2, "timedelta_i32": 4, "timedelta_i64": 8,
                "datetime_i64": 8, "uint16": 2, "uint32": 4, "uint64": 8}


class Refused(Exception):
    pass


def _uvarint(buf, offset):
    value = shift = 0
    while True:
        if offset >= len(buf):
            raise Refused
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 35:
            raise Refused


def _length(buf, offset, compact, wide):
    if compact:
        raw, offset = _uvarint(buf, offset)
        return raw - 1, offset
    size = 4 if wide else 2
    if offset + size > len(buf):
        raise Refused
    return int.from_bytes(buf[offset:offset + size], "big", signed=True), offset + size


def reference_walk(entity_type, buf, offset):
    flexible = bool(entity_type.__flexible__)
    compact = flexible and entity_type.__name__ != "RequestHeader"
    for _name, kafka_type, nullable, is_array, nested in _wire_fields(entity_type):
        if is_array:
            count, offset = _length(buf, offset, compact, wide=True)
            if count < 0 and not nullable:
                raise Refused
            if count > len(buf) - offset:
                raise Refused
            for _ in range(max(count, 0)):
                offset = _walk_one(kafka_type, nested, False, buf, offset, compact)
        else:
            offset = _walk_one(kafka_type, nested, nullable, buf, offset, compact)
    if flexible:
        tags, offset = _uvarint(buf, offset)
        for _ in range(tags):
            _tag, offset = _uvarint(buf, offset)
            size, offset = _uvarint(buf, offset)
            offset += size
            if offset > len(buf):
                raise Refused
    return offset


def _walk_one(kafka_type, nested, nullable, buf, offset, compact):
    if nested is not None and nullable:
        if offset >= len(buf):
            raise Refused
        marker = int.from_bytes(bytes(buf[offset:offset + 1]), "big", signed=True)
        return offset + 1 if marker < 0 else reference_walk(nested, buf, offset + 1)
    if nested is not None:
        return reference_walk(nested, buf, offset)
    if kafka_type in _FIXED_SIZES:
        offset += _FIXED_SIZES[kafka_type]
    elif kafka_type in ("string", "bytes", "records"):
        size, offset = _length(buf, offset, compact, wide=kafka_type != "string")
        if size < 0 and not nullable:
            raise Refused
        offset += max(size, 0)
    else:
        raise Refused
    if offset > len(buf):
        raise Refused
    return offset


def outcomes(entity_type, frame, offset):
    """(the planned walk's end or "refused", the reference's end or "refused")."""
    try:
        planned = check_lengths(entity_type, frame, offset)
    except InvalidRequestError:
        planned = "refused"
    try:
        reference = reference_walk(entity_type, frame, offset)
    except Refused:
        reference = "refused"
    return planned, reference


def walks(frame):
    """(entity type, offset) of the header's walk and, where the header passes, the body's."""
    api_key, api_version, _ = peek_head(frame)
    body_type = request_type(api_key, api_version)
    header_type = body_type.__header_schema__
    out = [(header_type, 0)]
    try:
        out.append((body_type, reference_walk(header_type, frame, 0)))
    except Refused:
        pass
    return out


def test_the_corpus_has_seeds_of_the_hot_apis():
    names = {seed.name for seed in SEEDS}
    assert {"seed-key0-v9", "seed-key1-v12", "seed-key1-v13"} <= names  # Produce, Fetch


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_every_seed_and_every_cut_of_it_walks_as_before(seed):
    frame = seed.read_bytes()
    for entity_type, offset in walks(frame):
        planned, reference = outcomes(entity_type, frame, offset)
        assert planned == reference != "refused"
    for cut in range(8, len(frame)):  # a frame cut short: the same offset or both refuse
        short = frame[:cut]
        for entity_type, offset in walks(short):
            planned, reference = outcomes(entity_type, short, offset)
            assert planned == reference


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS), data=st.data())
def test_changed_bytes_walk_as_before(seed, data):
    frame = bytearray(seed.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(8, len(frame) - 1))  # past the API key and version
        frame[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF,
                                               data.draw(st.integers(0, 255))]))
    for entity_type, offset in walks(bytes(frame)):
        planned, reference = outcomes(entity_type, bytes(frame), offset)
        assert planned == reference
    view = memoryview(bytes(frame))  # the listener may hand on a view of its buffer
    for entity_type, offset in walks(bytes(frame)):
        assert outcomes(entity_type, view, offset) == outcomes(entity_type, bytes(frame), offset)


def test_a_forged_array_length_is_refused_before_it_is_walked():
    frame = (CORPUS / "crash-fetch-v12-200gb-array").read_bytes()
    api_key, api_version, _ = peek_head(frame)
    body_type = request_type(api_key, api_version)
    end = check_lengths(body_type.__header_schema__, frame, 0)
    with pytest.raises(InvalidRequestError, match="elements in"):
        check_lengths(body_type, frame, end)


def test_fixed_fields_in_a_row_are_one_step_yet_a_cut_inside_them_is_refused():
    frame = (CORPUS / "seed-key0-v9").read_bytes()  # Produce v9: acks, timeout in a row
    api_key, api_version, _ = peek_head(frame)
    body_type = request_type(api_key, api_version)
    fields = [f.name for f in dataclasses.fields(body_type)]
    assert fields[:3] == ["transactional_id", "acks", "timeout"]
    end = check_lengths(body_type.__header_schema__, frame, 0)
    assert frame[end] < 0x80  # a one-byte compact length: N + 1, 0 for null
    after_id = end + 1 + max(frame[end] - 1, 0)
    for cut in range(after_id, after_id + 6):  # inside int16 acks + int32 timeout
        with pytest.raises(InvalidRequestError, match="past the end"):
            check_lengths(body_type, frame[:cut], end)
