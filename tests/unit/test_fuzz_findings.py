"""The bugs in the controller's file readers that ``make fuzz`` found (malformed VOTERS
data) or writing its targets showed (deeply nested JSON in ``metadata.log``), each
through its real reader: a typed corruption error, not a ValueError or RecursionError
from inside."""

from __future__ import annotations

import struct

import crc32c
import pytest

from tidewater.controller.metadata_log import FILE_NAME, MetadataLog, encode_frame
from tidewater.controller.raft.messages import (
    MalformedVotersError,
    VoterKey,
    decode_voters,
    encode_voters,
)
from tidewater.proto.errors import CorruptFileError, CorruptRecordError

pytestmark = pytest.mark.timeout(30)


def test_voters_round_trip():
    voters = frozenset({VoterKey(1, "ab" * 16), VoterKey(2147483647, "CD" * 16)})
    assert decode_voters(encode_voters(voters)) == voters


@pytest.mark.parametrize("data", [
    b"\xff",  # not UTF-8: was UnicodeDecodeError
    b"x:" + b"ab" * 16,  # was ValueError from int()
    b"1:",  # was ValueError
    b"",
    b"1:ab",  # a directory id the quorum-state and snapshot files cannot hold
    b"2147483648:" + b"ab" * 16,  # no int32
    b"-1:" + b"ab" * 16,
    b"1:" + b"ab" * 16 + b",",
    b"1:" + b"zz" * 16,
])
def test_malformed_voters_are_typed(data):
    with pytest.raises(MalformedVotersError):
        decode_voters(data)
    assert issubclass(MalformedVotersError, CorruptRecordError)


def test_deeply_nested_json_record_is_corruption(tmp_path):
    """A CRC-valid record of 100,000 "[" followed by a good one: was RecursionError out
    of MetadataLog.open."""
    payload = b"[" * 100_000
    frame = struct.pack(">II", len(payload), crc32c.crc32c(payload)) + payload
    (tmp_path / FILE_NAME).write_bytes(frame + encode_frame({"type": "x"}))
    with pytest.raises(CorruptFileError, match="RecursionError"):
        MetadataLog.open(tmp_path)
