"""Property test: the quorum codec round-trips every Raft message, and refuses anything else
with MalformedRaftMessageError (never another exception)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.controller.quorum import codec
from tidewater.controller.quorum.codec import MalformedRaftMessageError
from tidewater.controller.raft import messages as m
from tidewater.controller.raft.messages import Entry, EntryKind, OffsetAndEpoch, VoterKey

pytestmark = pytest.mark.timeout(120)

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
offsets = st.integers(min_value=0, max_value=2**63 - 1)
epochs = st.integers(min_value=0, max_value=2**31)
node_ids = st.integers(min_value=0, max_value=2**31 - 1)
directory_ids = st.binary(min_size=16, max_size=16).map(bytes.hex)
voter_keys = st.builds(VoterKey, node_ids, directory_ids)
offset_epochs = st.builds(OffsetAndEpoch, offsets, epochs)
entries = st.builds(Entry, offsets, epochs, st.sampled_from(EntryKind), st.binary(max_size=64))
leader_ids = st.none() | node_ids

messages = st.one_of(
    st.builds(m.VoteRequest, voter_keys, node_ids, directory_ids, epochs, epochs, offsets,
              st.booleans()),
    st.builds(m.VoteResponse, voter_keys, node_ids, epochs, leader_ids, epochs, st.booleans(),
              st.booleans()),
    st.builds(m.BeginQuorumEpoch, voter_keys, node_ids, directory_ids, epochs),
    st.builds(m.EndQuorumEpoch, voter_keys, node_ids, epochs),
    st.builds(m.FetchRequest, voter_keys, node_ids, epochs, offsets, epochs, int64),
    st.builds(m.FetchResponse, voter_keys, node_ids, epochs, leader_ids, int64,
              st.sampled_from(m.FetchError), offsets,
              st.lists(entries, max_size=4).map(tuple), st.none() | offset_epochs,
              st.none() | offset_epochs),
    st.builds(m.FetchSnapshotRequest, voter_keys, node_ids, epochs, offset_epochs, offsets,
              int64),
    st.builds(m.FetchSnapshotResponse, voter_keys, node_ids, epochs, leader_ids, int64,
              st.sampled_from(m.FetchError), offset_epochs, st.booleans(), offsets, offsets,
              st.frozensets(voter_keys, max_size=5), st.binary(max_size=64)),
)


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(message: m.Message) -> None:
    data = codec.encode(message)
    assert codec.decode(data) == message
    assert codec.encode(codec.decode(data)) == data  # one encoding per message


def _mutations(document: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The document with one field replaced by a value of the wrong shape, or dropped, or
    an extra field added."""
    fields = sorted(document["fields"])
    bad_values = st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.floats(),
                           st.just(2**64), st.just([]), st.just({}), st.just([1, 2, 3, 4, 5]))

    def replace(name: str, value: Any) -> dict[str, Any]:
        changed = dict(document["fields"])
        changed[name] = value
        return {"type": document["type"], "fields": changed}

    def drop(name: str) -> dict[str, Any]:
        changed = dict(document["fields"])
        del changed[name]
        return {"type": document["type"], "fields": changed}

    return st.one_of(
        st.builds(replace, st.sampled_from(fields), bad_values),
        st.builds(drop, st.sampled_from(fields)),
        st.just({"type": document["type"], "fields": {**document["fields"], "extra": 1}}),
        st.just({"type": "Shutdown", "fields": document["fields"]}),
    )


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_malformed_documents_are_refused_with_the_typed_error(data: st.DataObject) -> None:
    message = data.draw(messages)
    document = json.loads(codec.encode(message))
    mutated = data.draw(_mutations(document))
    encoded = json.dumps(mutated).encode()
    try:
        decoded = codec.decode(encoded)
    except MalformedRaftMessageError:
        return
    # Some replacements are still valid (a None where None is allowed, a bool where a bool
    # goes): then the result is a message again, and encodes back to what was sent.
    assert json.loads(codec.encode(decoded)) == mutated


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_the_typed_error(data: bytes) -> None:
    try:
        codec.decode(data)
    except MalformedRaftMessageError:
        pass


def test_specific_refusals() -> None:
    vote = m.BeginQuorumEpoch(VoterKey(1, "ab" * 16), 2, "cd" * 16, 3)
    document = json.loads(codec.encode(vote))
    for field, value, why in [
        ("source", [1, "not-hex"], "directory id"),
        ("source", [1, "AB" * 16], "directory id"),
        ("epoch", 2**63, "int64"),
        ("epoch", True, "int64"),
        ("destination_directory_id", "zz", "directory id"),
    ]:
        bad = {"type": document["type"], "fields": {**document["fields"], field: value}}
        with pytest.raises(MalformedRaftMessageError, match=why):
            codec.decode(json.dumps(bad).encode())
    fetch = m.FetchResponse(VoterKey(1, "ab" * 16), 2, 3, 1, 7, m.FetchError.NONE,
                            entries=(Entry(0, 1, EntryKind.DATA, b"x"),))
    document = json.loads(codec.encode(fetch))
    document["fields"]["entries"][0][2] = 9
    with pytest.raises(MalformedRaftMessageError, match="entry kind"):
        codec.decode(json.dumps(document).encode())
    with pytest.raises(MalformedRaftMessageError, match="over"):
        codec.decode(b" " * (codec.ENCODED_BYTES_MAX + 1))
    with pytest.raises(MalformedRaftMessageError, match="repeated"):
        key = [1, "ab" * 16]
        snapshot = json.loads(codec.encode(m.FetchSnapshotResponse(
            VoterKey(1, "ab" * 16), 2, 3, 1, 7, m.FetchError.NONE, OffsetAndEpoch(5, 1))))
        snapshot["fields"]["voters"] = [key, key]
        codec.decode(json.dumps(snapshot).encode())
