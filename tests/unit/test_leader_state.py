"""LeadershipState: HW, ISR shrink/expand timing, pending AlterPartition, acks=all, min.insync."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.replication.leader_state import LeadershipState
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    InvariantViolation,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)

LAG_MS = 3000
T0 = 1_000_000


def leader(*, isr=(1, 2, 3), replicas=(1, 2, 3), hw=0, leo=0, epoch_start=None, min_isr=1,
           now=T0, partition_epoch=0):
    return LeadershipState(
        local_broker_id=1, replicas=replicas, isr=isr, leader_epoch=5,
        partition_epoch=partition_epoch, high_watermark=hw, log_end_offset=leo,
        epoch_start_offset=leo if epoch_start is None else epoch_start,
        min_insync_replicas=min_isr, replica_lag_time_max_ms=LAG_MS, now_ms=now)


# ---------------------------------------------------------------- high watermark

def test_hw_is_min_of_isr_log_end_offsets():
    s = leader(leo=10)
    assert s.high_watermark == 0
    assert s.on_local_append(15, T0) is False  # followers' LEOs unknown yet
    assert s.on_follower_fetch(2, 10, T0 + 1).high_watermark_changed is False
    decision = s.on_follower_fetch(3, 7, T0 + 2)
    assert decision.high_watermark_changed is True and s.high_watermark == 7
    s.on_follower_fetch(3, 15, T0 + 3)
    assert s.high_watermark == 10  # follower 2 is at 10
    s.on_follower_fetch(2, 15, T0 + 4)
    assert s.high_watermark == 15


def test_new_leader_waits_for_every_isr_follower_to_fetch_in_its_epoch():
    # As a follower it had HW 5; the old leader's followers were all at 10.
    s = leader(hw=5, leo=10)
    assert s.high_watermark == 5
    assert [f.log_end_offset for f in s.followers.values()] == [-1, -1]
    s.on_follower_fetch(2, 10, T0 + 1)
    assert s.high_watermark == 5  # 3 has not fetched in this epoch
    assert not s.followers[3].has_fetched
    s.on_follower_fetch(3, 10, T0 + 2)
    assert s.high_watermark == 10


def test_hw_never_moves_backwards():
    s = leader(isr=(1, 2), replicas=(1, 2), leo=10)
    s.on_follower_fetch(2, 10, T0 + 1)
    assert s.high_watermark == 10
    # The follower truncated (e.g. to its own HW) and fetches from lower down.
    assert s.on_follower_fetch(2, 4, T0 + 2).high_watermark_changed is False
    assert s.high_watermark == 10


def test_leader_alone_in_isr_commits_on_append():
    s = leader(isr=(1,), leo=3)
    assert s.high_watermark == 3  # computed at construction
    assert s.on_local_append(8, T0) is True
    assert s.high_watermark == 8


def test_hw_does_not_move_below_min_isr():
    s = leader(isr=(1,), leo=0, min_isr=2)
    assert s.on_local_append(5, T0) is False and s.high_watermark == 0
    # min(min.insync.replicas, RF): with RF 1 a min ISR of 2 cannot block forever.
    single = leader(isr=(1,), replicas=(1,), leo=0, min_isr=2)
    assert single.on_local_append(5, T0) is True and single.high_watermark == 5


def test_pending_expansion_does_not_lift_the_min_isr_gate():
    s = leader(isr=(1,), replicas=(1, 2), leo=5, min_isr=2)
    assert s.high_watermark == 0
    assert s.on_follower_fetch(2, 5, T0 + 1).propose_isr == (1, 2)
    assert s.high_watermark == 0  # the joiner is not in the committed ISR yet
    assert s.on_alter_partition_committed((1, 2), 1, T0 + 2) is True
    assert s.high_watermark == 5


def test_checkpointed_hw_past_the_log_is_clamped():
    s = leader(isr=(1, 2), replicas=(1, 2), hw=12, leo=9)
    assert s.high_watermark == 9


def test_constructor_rejects_leader_outside_isr():
    with pytest.raises(InvariantViolation):
        leader(isr=(2, 3))


# ---------------------------------------------------------------- caught-up rule

def test_caught_up_at_this_fetch_or_the_previous_one():
    s = leader(isr=(1, 2), replicas=(1, 2), leo=10)
    f = s.followers[2]
    assert f.last_caught_up_ms == T0  # ISR members start caught up at the leadership start
    s.on_follower_fetch(2, 10, T0 + 100)  # reached the leader's LEO (10) now
    assert f.last_caught_up_ms == T0 + 100
    s.on_local_append(20, T0 + 200)
    s.on_follower_fetch(2, 10, T0 + 500)  # 10 == leader LEO at the previous fetch
    assert f.last_caught_up_ms == T0 + 100  # caught up as of that previous fetch
    s.on_local_append(30, T0 + 600)
    s.on_follower_fetch(2, 20, T0 + 900)  # 20 == leader LEO at the previous fetch (T0+500)
    assert f.last_caught_up_ms == T0 + 500
    s.on_follower_fetch(2, 25, T0 + 1000)  # 25 < 30: neither now nor at the previous fetch
    assert f.last_caught_up_ms == T0 + 500


# ---------------------------------------------------------------- shrink

def test_shrink_exactly_after_replica_lag_time_max():
    s = leader(leo=10)
    s.on_follower_fetch(2, 10, T0 + 1000)
    assert s.maybe_shrink_isr(T0 + LAG_MS) is None  # 3: exactly max lag, still in
    assert s.maybe_shrink_isr(T0 + LAG_MS + 1) == (1, 2)
    assert s.pending_isr is not None and not s.pending_isr.is_expansion
    assert s.isr == (1, 2, 3)  # used only once the controller accepts


def test_shrink_never_drops_the_leader_and_caught_up_followers_stay():
    s = leader(leo=10)
    for t in range(T0 + 1000, T0 + 10_000, 1000):
        s.on_follower_fetch(2, 10, t)
        s.on_follower_fetch(3, 10, t)
        assert s.maybe_shrink_isr(t) is None


def test_pending_shrink_keeps_old_isr_for_hw_until_committed():
    s = leader(leo=10)
    s.on_follower_fetch(2, 10, T0 + 1)
    s.on_follower_fetch(3, 4, T0 + 2)
    assert s.high_watermark == 4
    s.on_follower_fetch(2, 10, T0 + LAG_MS)
    assert s.maybe_shrink_isr(T0 + LAG_MS + 3) == (1, 2)
    s.on_follower_fetch(2, 10, T0 + LAG_MS + 4)
    assert s.high_watermark == 4  # 3 still counts while the shrink is pending
    assert s.maybe_shrink_isr(T0 + LAG_MS + 5) is None  # one change in flight
    assert s.on_alter_partition_committed((1, 2), 1, T0 + LAG_MS + 6) is True
    assert s.isr == (1, 2) and s.partition_epoch == 1 and s.high_watermark == 10
    assert s.pending_isr is None


def test_failed_alter_partition_allows_a_new_proposal():
    s = leader(leo=10)
    assert s.maybe_shrink_isr(T0 + LAG_MS + 1) == (1,)
    s.on_alter_partition_failed()
    assert s.pending_isr is None and s.isr == (1, 2, 3)
    assert s.maybe_shrink_isr(T0 + LAG_MS + 2) == (1,)


# ---------------------------------------------------------------- expand

def test_expand_needs_hw_and_epoch_start_offset():
    # Leader became leader at LEO 10 (epoch start 10), HW 6, only itself in the ISR.
    s = leader(isr=(1,), hw=6, leo=10, min_isr=1)
    assert s.high_watermark == 10  # alone in the ISR
    assert s.on_follower_fetch(2, 8, T0 + 1).propose_isr is None  # below HW
    s2 = leader(isr=(1, 3), hw=6, leo=12, epoch_start=10)
    assert s2.on_follower_fetch(2, 7, T0 + 1).propose_isr is None  # HW is 6 but epoch start 10
    assert s2.on_follower_fetch(2, 10, T0 + 2).propose_isr == (1, 3, 2)
    assert s2.pending_isr.is_expansion and s2.maximal_isr == (1, 3, 2) and s2.isr == (1, 3)


def test_pending_expansion_counts_the_joiner_for_hw():
    s = leader(isr=(1,), replicas=(1, 2), leo=10)
    assert s.high_watermark == 10
    assert s.on_follower_fetch(2, 10, T0 + 1).propose_isr == (1, 2)
    s.on_local_append(20, T0 + 2)
    assert s.high_watermark == 10  # the joiner (maximal ISR) is at 10
    s.on_follower_fetch(2, 15, T0 + 3)
    assert s.high_watermark == 15
    assert s.on_alter_partition_committed((1, 2), 1, T0 + 4) is False
    assert s.isr == (1, 2) and s.pending_isr is None


def test_caught_up_follower_about_to_join_holds_the_hw():
    s = leader(isr=(1,), leo=10)
    assert s.on_follower_fetch(2, 10, T0 + 1).propose_isr == (1, 2)
    # 3 is caught up too but cannot be proposed while 2's expansion is in flight.
    assert s.on_follower_fetch(3, 10, T0 + 2).propose_isr is None
    s.on_local_append(20, T0 + 3)
    s.on_follower_fetch(2, 20, T0 + 4)
    assert s.high_watermark == 10  # 3 is about to join: wait for it
    s.on_follower_fetch(2, 20, T0 + 2 + LAG_MS + 1)
    assert s.high_watermark == 20  # 3 stopped being caught up: no longer waited for


def test_follower_not_yet_fetched_outside_isr_never_holds_the_hw():
    s = leader(isr=(1, 2), leo=10, now=0)  # time 0: "never" must not look recent
    s.on_follower_fetch(2, 10, 5)
    assert s.high_watermark == 10


# ---------------------------------------------------------------- controller updates

def test_leader_and_isr_update_removes_fenced_follower():
    s = leader(leo=10, partition_epoch=3)
    s.on_follower_fetch(2, 10, T0 + 1)
    assert s.maybe_shrink_isr(T0 + 2) is None
    assert s.on_leader_and_isr_update((1, 2, 3), 3, T0 + 3) is False  # stale: ignored
    assert s.on_leader_and_isr_update((1, 2), 4, T0 + 4) is True
    assert s.isr == (1, 2) and s.partition_epoch == 4 and s.high_watermark == 10


def test_leader_and_isr_update_with_new_replicas_follows_a_reassignment():
    """KIP-455 in one leader epoch: an added replica is a follower that must catch up
    before the leader proposes it; a removed one is forgotten."""
    s = leader(leo=10, partition_epoch=3)
    with pytest.raises(NotLeaderOrFollowerError):
        s.on_follower_fetch(4, 0, T0 + 1)
    s.on_leader_and_isr_update((1, 2, 3), 4, T0 + 2, replicas=(2, 3, 4, 1))
    assert s.replicas == (2, 3, 4, 1) and s.isr == (1, 2, 3)
    assert s.on_follower_fetch(4, 0, T0 + 3).propose_isr is None  # behind
    s.on_follower_fetch(2, 10, T0 + 4)
    s.on_follower_fetch(3, 10, T0 + 4)
    assert s.on_follower_fetch(4, 10, T0 + 5).propose_isr == (1, 2, 3, 4)
    s.on_leader_and_isr_update((1, 2, 4), 5, T0 + 6, replicas=(1, 2, 4))
    assert set(s.followers) == {2, 4} and s.isr == (1, 2, 4)
    with pytest.raises(NotLeaderOrFollowerError):
        s.on_follower_fetch(3, 10, T0 + 7)
    with pytest.raises(InvariantViolation):
        s.on_leader_and_isr_update((2, 4), 6, T0 + 8, replicas=(2, 4))


def test_leader_and_isr_update_supersedes_pending_change():
    s = leader(leo=10, partition_epoch=3)
    assert s.maybe_shrink_isr(T0 + LAG_MS + 1) == (1,)
    s.on_leader_and_isr_update((1, 2), 4, T0 + LAG_MS + 2)
    assert s.pending_isr is None and s.isr == (1, 2)
    # An answer to the superseded proposal carrying an older partition epoch is ignored.
    assert s.on_alter_partition_committed((1,), 3, T0 + LAG_MS + 3) is False
    assert s.isr == (1, 2)


def test_fetch_from_unknown_replica_or_out_of_range():
    s = leader(leo=10)
    with pytest.raises(NotLeaderOrFollowerError):
        s.on_follower_fetch(9, 0, T0)
    with pytest.raises(OffsetOutOfRangeError):
        s.on_follower_fetch(2, 11, T0)
    assert s.followers[2].log_end_offset == -1  # a refused fetch changes nothing


# ---------------------------------------------------------------- acks=all

def test_under_min_isr_is_the_committed_isr_below_the_minimum():
    # ReplicaState.check_append refuses acks=all by this (acks_all_precheck.txt).
    assert leader(isr=(1,), leo=0, min_isr=2).is_under_min_isr
    assert not leader(isr=(1, 2), leo=0, min_isr=2).is_under_min_isr


def test_acks_all_waits_for_hw_then_answers():
    s = leader(leo=0, min_isr=2)
    assert not s.is_under_min_isr
    s.on_local_append(5, T0)
    assert s.acks_all_result(5) is None
    s.on_follower_fetch(2, 5, T0 + 1)
    assert s.acks_all_result(5) is None
    s.on_follower_fetch(3, 5, T0 + 2)
    assert s.acks_all_result(5) == pb.NONE


def test_acks_all_not_enough_replicas_after_append():
    s = leader(leo=0, min_isr=2)
    s.on_local_append(5, T0)
    s.on_follower_fetch(2, 5, T0 + 1)
    # 3 is fenced: the controller shrinks the ISR to (1, 2); HW reaches 5.
    s.on_leader_and_isr_update((1, 2), 1, T0 + 2)
    assert s.acks_all_result(5) == pb.NONE
    s.on_local_append(8, T0 + 3)
    assert s.acks_all_result(8) is None
    # Then 2 goes too: the append is below the HW only thanks to the leader alone.
    s.on_leader_and_isr_update((1,), 2, T0 + 4)
    assert s.high_watermark == 5  # under min ISR the HW stays put
    assert s.acks_all_result(5) == pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert s.acks_all_result(8) is None


# ---------------------------------------------------------------- properties

events = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 5)),
    st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 40)),
    st.tuples(st.just("shrink"), st.just(0)),
    st.tuples(st.just("commit"), st.just(0)),
    st.tuples(st.just("fail"), st.just(0)),
    st.tuples(st.just("tick"), st.integers(0, 2 * LAG_MS)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(events, st.integers(1, 3), st.integers(0, 20))
def test_hw_monotone_and_bounded_by_maximal_isr(script, min_isr, start_leo):
    s = leader(leo=start_leo, min_isr=min_isr, hw=0)
    now = T0
    for event in script:
        before = s.high_watermark
        kind = event[0]
        if kind == "append":
            s.on_local_append(s.log_end_offset + event[1], now)
        elif kind == "fetch":
            s.on_follower_fetch(event[1], min(event[2], s.log_end_offset), now)
        elif kind == "shrink":
            s.maybe_shrink_isr(now)
        elif kind == "commit" and s.pending_isr is not None:
            s.on_alter_partition_committed(s.pending_isr.proposed_isr, s.partition_epoch + 1, now)
        elif kind == "fail":
            s.on_alter_partition_failed()
        elif kind == "tick":
            now += event[1]
        assert s.high_watermark >= before
        assert s.high_watermark <= s.log_end_offset
        assert 1 in s.isr and 1 in s.maximal_isr
        for replica_id in s.maximal_isr:
            if replica_id != 1:
                follower = s.followers[replica_id]
                if s.high_watermark > 0:
                    # Committed data is on every ISR member: it fetched in this leadership.
                    assert follower.has_fetched
        if len(s.isr) < min_isr and s.high_watermark > before:
            pytest.fail("HW advanced below min ISR")
