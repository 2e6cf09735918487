"""Rules of the Raft core, one event at a time: what each event puts in the Ready."""

from __future__ import annotations

import random

import pytest

from tidewater.controller.raft import (
    Entry,
    EntryKind,
    NotLeaderError,
    ProposalRejectedError,
    QuorumState,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    VoterKey,
)
from tidewater.controller.raft.messages import (
    BeginQuorumEpoch,
    FetchError,
    FetchRequest,
    FetchResponse,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from tidewater.proto.errors import InvariantViolation

pytestmark = pytest.mark.timeout(60)

K1, K2, K3 = VoterKey(1, "1" * 32), VoterKey(2, "2" * 32), VoterKey(3, "3" * 32)
VOTERS = frozenset({K1, K2, K3})
CONFIG = RaftConfig()


def node(key: VoterKey, *, entries: list[Entry] | None = None,
         state: QuorumState = QuorumState()) -> RaftNode:
    return RaftNode(CONFIG, key, random.Random(key.id), 0, bootstrap_voters=VOTERS,
                    quorum_state=state, entries=entries or [])


def drain(n: RaftNode, now_ms: int = 0) -> Ready:
    """One Ready, carried out (the test plays the shell)."""
    ready = n.ready()
    n.advance(ready, now_ms)
    return ready


def log(*epochs: int) -> list[Entry]:
    return [Entry(o, e, EntryKind.DATA, b"x") for o, e in enumerate(epochs)]


def vote_request(source: VoterKey, destination: VoterKey, *, epoch: int, last_epoch: int = 0,
                 end: int = 0, pre_vote: bool = False) -> VoteRequest:
    return VoteRequest(source, destination.id, destination.directory_id, epoch, last_epoch, end,
                       pre_vote)


def test_a_vote_is_persisted_in_the_ready_that_sends_it():
    n = node(K1)
    n.step(vote_request(K2, K1, epoch=1), 10)
    ready = drain(n)
    assert ready.quorum_state == QuorumState(1, K2, None)
    assert ready.send == (VoteResponse(K1, 2, 1, None, 1, False, True),)
    # and once per epoch
    n.step(vote_request(K3, K1, epoch=1), 11)
    assert drain(n).send[0].granted is False


def test_a_vote_request_for_another_directory_id_is_refused():
    # The candidate thinks it asks voter 1 of directory "1...": a wiped node 1 is not it.
    wiped = node(VoterKey(1, "f" * 32))
    wiped.step(vote_request(K2, K1, epoch=1), 10)
    ready = drain(wiped)
    assert ready.send[0].granted is False and ready.quorum_state is None
    assert wiped.epoch == 0


def test_a_vote_compares_the_log_end():
    n = node(K1, entries=log(1, 1, 2))
    n.step(vote_request(K2, K1, epoch=3, last_epoch=1, end=5), 10)  # longer, older epoch
    assert drain(n).send[0].granted is False
    n.step(vote_request(K3, K1, epoch=3, last_epoch=2, end=3), 11)  # same end: up to date
    assert drain(n).send[0].granted is True


def test_a_pre_vote_changes_no_state():
    n = node(K1)
    n.step(vote_request(K2, K1, epoch=5, pre_vote=True), 10)
    ready = drain(n)
    assert ready.quorum_state is None and ready.send[0].granted is True
    assert (n.epoch, n.voted_for) == (0, None)


def elect(n: RaftNode, now_ms: int = 10_000) -> None:
    n.tick(now_ms)
    assert n.role is Role.PROSPECTIVE
    for other in (K2, K3):
        n.step(VoteResponse(other, n.local.id, n.epoch, None, n.epoch + 1, True, True), now_ms)
    assert n.role is Role.CANDIDATE
    n.step(VoteResponse(K2, n.local.id, n.epoch, None, n.epoch, False, True), now_ms)
    assert n.role is Role.LEADER
    drain(n, now_ms)


def test_the_leader_commits_an_earlier_epochs_entry_only_with_one_of_its_own():
    n = node(K1, entries=log(1, 1), state=QuorumState(1, None, None))
    elect(n)
    assert n.epoch == 2 and n.entries(2, 3)[0].kind is EntryKind.LEADER_CHANGE
    # node 2 holds offsets 0..1 (epoch 1) but not the leader's entry at 2: no commit
    n.step(FetchRequest(K2, 1, 2, 2, 1, 7), 10_001)
    drain(n)
    assert n.high_watermark == 0
    n.step(FetchRequest(K2, 1, 2, 3, 2, 8), 10_002)
    ready = drain(n)
    assert n.high_watermark == 3
    assert [e.offset for e in ready.committed] == [0, 1, 2]


def test_the_leader_answers_a_diverging_follower_and_the_follower_truncates():
    leader = node(K1, entries=log(1, 1, 3), state=QuorumState(3, None, None))
    elect(leader)  # epoch 4; log 1,1,3,4
    leader.step(FetchRequest(K2, 1, 4, 4, 2, 9), 10_001)  # follower: 1,1,2,2
    answer = drain(leader).send[-1]
    assert isinstance(answer, FetchResponse) and answer.diverging == OffsetAndEpoch(2, 1)
    follower = node(K2, entries=log(1, 1, 2, 2), state=QuorumState(4, None, 1))
    drain(follower)
    follower._fetch_in_flight = (9, 10_000)  # the fetch the answer is for
    follower.step(answer, 10_002)
    ready = drain(follower)
    assert ready.log_truncate_to == 2 and follower.log_end_offset == 2
    refetch = ready.send[-1]
    assert isinstance(refetch, FetchRequest) and (refetch.fetch_offset, refetch.last_fetched_epoch) == (2, 1)


def test_a_follower_never_truncates_below_its_high_watermark():
    follower = node(K2, entries=log(1, 1, 2, 2), state=QuorumState(4, None, 1))
    drain(follower)
    follower.high_watermark = 3
    follower._fetch_in_flight = (5, 0)
    with pytest.raises(InvariantViolation):
        follower.step(FetchResponse(K1, 2, 4, 1, 5, FetchError.NONE, 3,
                                    diverging=OffsetAndEpoch(2, 1)), 1)


def test_check_quorum_makes_a_leader_without_followers_resign():
    n = node(K1)
    elect(n)
    n.tick(10_000 + CONFIG.fetch_timeout_ms * 3 // 2 - 1)
    assert n.role is Role.LEADER
    n.tick(10_000 + CONFIG.fetch_timeout_ms * 3 // 2)
    assert n.role is Role.RESIGNED
    with pytest.raises(NotLeaderError):
        n.propose([b"late"], 20_000)


def test_two_leaders_of_one_epoch_fail_loudly():
    n = node(K1)
    elect(n)
    with pytest.raises(InvariantViolation):
        n.step(BeginQuorumEpoch(K2, 1, K1.directory_id, n.epoch), 10_001)


def test_no_event_between_ready_and_advance():
    n = node(K1)
    n.step(vote_request(K2, K1, epoch=1), 10)
    n.ready()
    message: Message = vote_request(K3, K1, epoch=2)
    with pytest.raises(InvariantViolation):
        n.step(message, 11)


def test_describe_shows_each_replicas_log_end_and_lag():
    n = node(K1)
    elect(n)
    n.propose([b"a", b"b"], 10_001)
    drain(n)
    n.step(FetchRequest(K2, 1, n.epoch, 1, n.epoch, 3), 10_002)
    drain(n)
    description = n.describe(10_003)
    assert description.leader_id == 1 and description.high_watermark == 1
    by_id = {r.key.id: (r.log_end_offset, r.lag) for r in description.replicas}
    assert by_id == {1: (3, 0), 2: (1, 2), 3: (0, 3)}


# ---- membership (KIP-853) -----------------------------------------------------------


def test_voters_change_one_at_a_time_through_the_log():
    n = node(K1)
    elect(n)
    with pytest.raises(ProposalRejectedError, match="no entry of this epoch"):
        n.change_voters(remove=K3, now_ms=10_001)
    n.step(FetchRequest(K2, 1, n.epoch, n.log_end_offset, n.last_epoch, 1), 10_001)
    drain(n)
    offset = n.change_voters(remove=K3, now_ms=10_002)
    assert n.voters == frozenset({K1, K2})  # in force at once, committed or not
    with pytest.raises(ProposalRejectedError, match="still uncommitted"):
        n.change_voters(add=K3, now_ms=10_003)
    ready = drain(n)
    assert ready.log_append[-1].kind is EntryKind.VOTERS and ready.log_append[-1].offset == offset
    # the new set {1, 2} needs node 2 to commit the entry
    n.step(FetchRequest(K2, 1, n.epoch, offset + 1, n.epoch, 2), 10_004)
    drain(n)
    assert n.high_watermark == offset + 1


def test_a_new_voter_must_catch_up_first():
    n = node(K1)
    elect(n)
    n.step(FetchRequest(K2, 1, n.epoch, n.log_end_offset, n.last_epoch, 1), 10_001)
    drain(n)
    new = VoterKey(4, "4" * 32)
    n.propose([b"r"] * (CONFIG.voter_catch_up_lag_max + 1), 10_002)
    drain(n)
    n.step(FetchRequest(new, 1, n.epoch, 0, 0, 1), 10_003)  # an observer at offset 0
    drain(n)
    with pytest.raises(ProposalRejectedError, match="not caught up"):
        n.change_voters(add=new, now_ms=10_004)
    n.step(FetchRequest(new, 1, n.epoch, n.log_end_offset, n.epoch, 2), 10_005)
    drain(n)
    n.change_voters(add=new, now_ms=10_006)
    assert new in n.voters and len(n.voters) == 4


def test_a_leader_that_removed_itself_resigns_once_the_change_is_committed():
    n = node(K1)
    elect(n)
    n.step(FetchRequest(K2, 1, n.epoch, n.log_end_offset, n.last_epoch, 1), 10_001)
    drain(n)
    offset = n.change_voters(remove=K1, now_ms=10_002)
    drain(n)
    assert n.role is Role.LEADER  # still leads until {2, 3} hold the entry
    n.step(FetchRequest(K2, 1, n.epoch, offset + 1, n.epoch, 2), 10_003)
    n.step(FetchRequest(K3, 1, n.epoch, offset + 1, n.epoch, 2), 10_003)
    drain(n)
    assert n.high_watermark == offset + 1 and n.role is Role.RESIGNED


def test_fetch_answers_and_proposals_are_bounded_in_bytes():
    config = RaftConfig(fetch_bytes_max=10, record_bytes_max=8)
    n = RaftNode(config, K1, random.Random(1), 0, bootstrap_voters=VOTERS,
                 quorum_state=QuorumState())
    elect(n)
    with pytest.raises(ProposalRejectedError, match="larger"):
        n.propose([b"123456789"], 10_001)
    n.propose([b"12345678", b"12345678", b"1"], 10_001)
    drain(n)
    n.step(FetchRequest(K2, 1, n.epoch, 1, n.epoch, 1), 10_002)
    answer = drain(n).send[-1]
    assert isinstance(answer, FetchResponse) and [e.data for e in answer.entries] == [b"12345678"]
