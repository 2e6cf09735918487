"""__consumer_offsets record formats (broker/group/records.py): Kafka's bytes, round trips,
and garbage refused with a typed error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidewater.broker.group import records

names = st.text(max_size=20)
nullable = st.none() | names
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)

offset_records = st.builds(records.OffsetCommitRecord, names, names, i32, st.none() | st.builds(
    records.OffsetCommitValue, i64, i32, names, i64))
members = st.builds(records.MemberMetadata, names, nullable, names, names, i32, i32,
                    st.binary(max_size=30), st.binary(max_size=30))
group_records = st.builds(records.GroupMetadataRecord, names, st.none() | st.builds(
    records.GroupMetadataValue, names, i32, nullable, nullable, i64,
    st.lists(members, max_size=4).map(tuple)))


@given(offset_records | group_records)
def test_every_record_round_trips(record):
    assert records.decode(records.encode_key(record), records.encode_value(record)) == record


def test_offset_commit_bytes_are_kafkas():
    record = records.OffsetCommitRecord("g", "t", 2, records.OffsetCommitValue(5, 1, "", 9))
    assert records.encode_key(record) == b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x02"
    assert records.encode_value(record) == (b"\x00\x03" + (5).to_bytes(8, "big")
                                            + (1).to_bytes(4, "big") + b"\x00\x00"
                                            + (9).to_bytes(8, "big"))


def test_older_value_versions_are_read():
    v1 = b"\x00\x01" + (7).to_bytes(8, "big") + b"\x00\x01m" + (3).to_bytes(8, "big") + \
        (-1).to_bytes(8, "big", signed=True)
    record = records.decode(b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x00", v1)
    assert record.value == records.OffsetCommitValue(7, -1, "m", 3)


@given(st.binary(max_size=40), st.none() | st.binary(max_size=80))
def test_garbage_is_refused_with_a_typed_error(key, value):
    try:
        records.decode(key, value)
    except records.GroupRecordError:
        pass
