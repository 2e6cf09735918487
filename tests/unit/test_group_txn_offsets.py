"""TxnOffsetCommit in the group coordinator: offsets held per producer until the
transaction's marker; the transactional batch the shell writes."""

from __future__ import annotations

import pytest

from tidewater.broker.group import records
from tidewater.broker.group.coordinator import control_marker_committed, write_batch
from tidewater.broker.group.state import CommitAnswer, GroupCoordinatorState
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK, read_header, validate_batch

pytestmark = pytest.mark.timeout(30)

OFFSETS = {("t", 0): (42, 3, "meta"), ("t", 1): (7, 3, "")}


def commit(state: GroupCoordinatorState, producer_id: int, code: pb.ErrorCode = pb.NONE,
           **checks):
    ready = state.txn_commit_offsets("tok", 100, group_id="g", producer_id=producer_id,
                                     producer_epoch=2, generation_id=checks.get("generation", -1),
                                     member_id=checks.get("member", ""),
                                     group_instance_id=None, offsets=OFFSETS)
    if not ready.writes:
        return ready.replies, None
    [write] = ready.writes
    done = state.on_write_done(write.write_id, code, 100)
    return done.replies, write


def test_offsets_are_held_until_a_commit_marker():
    state = GroupCoordinatorState()
    replies, write = commit(state, 9)
    assert replies == [("tok", CommitAnswer({("t", 0): pb.NONE, ("t", 1): pb.NONE}))]
    assert write is not None and write.producer == (9, 2)
    assert state.fetch_offsets("g", None) == {}
    state.complete_txn(9, True)
    fetched = state.fetch_offsets("g", [("t", 0)])
    assert fetched[("t", 0)] is not None and fetched[("t", 0)].offset == 42
    assert state.pending_txn_offsets == {}


def test_an_abort_marker_drops_them_and_other_producers_are_untouched():
    state = GroupCoordinatorState()
    commit(state, 9)
    commit(state, 10)
    state.complete_txn(9, False)
    assert state.fetch_offsets("g", None) == {}
    state.complete_txn(10, True)
    assert set(state.fetch_offsets("g", None)) == {("t", 0), ("t", 1)}


def test_held_offsets_make_their_partitions_unstable_until_the_marker():
    """KIP-447: OffsetFetch with require_stable answers a held partition
    UNSTABLE_OFFSET_COMMIT (the consumer retries) instead of the older offset."""
    state = GroupCoordinatorState()
    assert state.unstable_partitions("g") == set()
    commit(state, 9)
    assert state.unstable_partitions("g") == {("t", 0), ("t", 1)}
    assert state.unstable_partitions("other") == set()
    state.complete_txn(9, True)
    assert state.unstable_partitions("g") == set()
    commit(state, 10)
    state.complete_txn(10, False)
    assert state.unstable_partitions("g") == set()


def test_a_failed_write_holds_nothing():
    state = GroupCoordinatorState()
    replies, _ = commit(state, 9, pb.NOT_LEADER_OR_FOLLOWER)
    assert replies == [("tok", CommitAnswer({("t", 0): pb.NOT_COORDINATOR,
                                             ("t", 1): pb.NOT_COORDINATOR}))]
    assert state.pending_txn_offsets == {}


def test_a_named_generation_is_checked_kip_447():
    state = GroupCoordinatorState()
    replies, write = commit(state, 9, generation=4, member="m")
    assert write is None
    assert replies == [("tok", CommitAnswer({("t", 0): pb.ILLEGAL_GENERATION,
                                             ("t", 1): pb.ILLEGAL_GENERATION}))]


def test_loading_replays_held_offsets_then_the_marker():
    state = GroupCoordinatorState()
    record = records.OffsetCommitRecord("g", "t", 0, records.OffsetCommitValue(5, -1, "", 1))
    state.replay_txn_offset(record, 9)
    assert state.fetch_offsets("g", None) == {}
    state.complete_txn(9, True)
    assert state.fetch_offsets("g", [("t", 0)])[("t", 0)].offset == 5


def test_the_shell_writes_kafkas_transactional_batch_without_a_sequence():
    state = GroupCoordinatorState()
    ready = state.txn_commit_offsets("tok", 100, group_id="g", producer_id=9, producer_epoch=2,
                                     generation_id=-1, member_id="", group_instance_id=None,
                                     offsets=OFFSETS)
    batch = write_batch(ready.writes[0])
    validate_batch(batch)  # the CRC covers the rewritten attributes and producer fields
    header = read_header(batch)
    assert header.attributes & TRANSACTIONAL_MASK and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, -1)


def test_control_record_keys():
    assert control_marker_committed(b"\x00\x00\x00\x01") is True
    assert control_marker_committed(b"\x00\x00\x00\x00") is False
    assert control_marker_committed(b"\x00\x00\x00\x05") is None
    assert control_marker_committed(None) is None
