"""Every election and ISR rule of controller/election.py."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.controller.election import (
    NO_LEADER,
    PartitionRecord,
    alter_partition,
    elect,
    maybe_preferred_leader,
    new_partition,
    on_broker_fenced,
    on_broker_unfenced,
    on_controlled_shutdown,
    on_replica_corrupt,
)
from tidewater.proto import tidewater_pb2 as pb


def rec(replicas=(1, 2, 3), isr=None, leader=None, leader_epoch=5, partition_epoch=7):
    isr = tuple(replicas) if isr is None else tuple(isr)
    leader = isr[0] if leader is None else leader
    return PartitionRecord("t", 0, tuple(replicas), isr, leader, leader_epoch, partition_epoch)


# ---------------------------------------------------------------- record invariants

def test_record_rejects_leader_outside_isr():
    with pytest.raises(AssertionError):
        PartitionRecord("t", 0, (1, 2), (2,), 1, 0, 0)


def test_record_rejects_empty_isr():
    with pytest.raises(AssertionError):
        PartitionRecord("t", 0, (1, 2), (), NO_LEADER, 0, 0)


def test_new_partition_isr_is_live_replicas_leader_first_live():
    p = new_partition("t", 3, (2, 1, 3), live={1, 3})
    assert p.isr == (1, 3) and p.leader == 1 and p.leader_epoch == 0 and p.partition_epoch == 0
    assert p.replicas == (2, 1, 3)
    p = new_partition("t", 0, (2, 1), live={1, 2})
    assert p.leader == 2 and p.isr == (2, 1)


def test_new_partition_without_live_replica_is_offline():
    p = new_partition("t", 0, (1, 2), live=set())
    assert p.offline and p.isr == (1, 2)


# ---------------------------------------------------------------- elect

def test_elect_keeps_live_leader():
    assert elect(rec(leader=2, isr=(1, 2, 3)), {1, 2, 3}, unclean_allowed=False) is None


def test_elect_prefers_replica_order_among_live_isr():
    p = rec(replicas=(1, 2, 3), isr=(3, 2, 1), leader=1)
    change = elect(p, {2, 3}, unclean_allowed=False)
    assert change.record.leader == 2  # replicas order, not ISR order
    assert change.record.leader_epoch == 6 and change.record.partition_epoch == 8
    assert change.leader_changed and not change.unclean
    assert change.record.isr == (3, 2, 1)


def test_elect_offline_when_no_live_isr_member():
    p = rec(replicas=(1, 2, 3), isr=(1,), leader=1)
    change = elect(p, {2, 3}, unclean_allowed=False)
    assert change.record.leader == NO_LEADER and change.record.offline
    assert change.record.isr == (1,)  # never empty
    assert change.record.leader_epoch == 6 and change.record.partition_epoch == 8
    # already offline: nothing more to do
    assert elect(change.record, {2, 3}, unclean_allowed=False) is None


def test_elect_unclean_takes_any_live_replica_with_isr_of_itself():
    p = rec(replicas=(1, 2, 3), isr=(1,), leader=NO_LEADER)
    change = elect(p, {3}, unclean_allowed=True)
    assert change.unclean and change.leader_changed
    assert change.record.leader == 3 and change.record.isr == (3,)
    assert change.record.leader_epoch == 6


def test_elect_prefers_clean_over_unclean():
    p = rec(replicas=(1, 2, 3), isr=(1, 3), leader=NO_LEADER)
    change = elect(p, {2, 3}, unclean_allowed=True)
    assert change.record.leader == 3 and not change.unclean and change.record.isr == (1, 3)


def test_elect_nothing_live_unclean_stays_offline():
    p = rec(replicas=(1, 2), isr=(1,), leader=NO_LEADER)
    assert elect(p, set(), unclean_allowed=True) is None


# ---------------------------------------------------------------- fencing

def test_fenced_follower_leaves_isr_partition_epoch_only():
    p = rec(replicas=(1, 2, 3), leader=1)
    change = on_broker_fenced(p, 3, {1, 2}, unclean_allowed=False)
    assert change.record.isr == (1, 2) and change.record.leader == 1
    assert change.record.leader_epoch == 5 and change.record.partition_epoch == 8
    assert not change.leader_changed


def test_fenced_leader_moves_leadership_and_leaves_isr():
    p = rec(replicas=(1, 2, 3), leader=1)
    change = on_broker_fenced(p, 1, {2, 3}, unclean_allowed=False)
    assert change.record.leader == 2 and change.record.isr == (2, 3)
    assert change.record.leader_epoch == 6 and change.record.partition_epoch == 8
    assert change.leader_changed and not change.unclean


def test_fenced_broker_even_if_still_in_live_set_is_not_reelected():
    p = rec(replicas=(1, 2), leader=1)
    change = on_broker_fenced(p, 1, {1, 2}, unclean_allowed=False)
    assert change.record.leader == 2


def test_fenced_last_isr_member_stays_in_isr_and_partition_goes_offline():
    p = rec(replicas=(1, 2), isr=(1,), leader=1)
    change = on_broker_fenced(p, 1, {2}, unclean_allowed=False)
    assert change.record.offline and change.record.isr == (1,)
    assert change.record.leader_epoch == 6


def test_fenced_last_isr_member_unclean_elects_live_replica():
    p = rec(replicas=(1, 2), isr=(1,), leader=1)
    change = on_broker_fenced(p, 1, {2}, unclean_allowed=True)
    assert change.unclean and change.record.leader == 2 and change.record.isr == (2,)


def test_fenced_non_replica_changes_nothing():
    assert on_broker_fenced(rec(replicas=(1, 2)), 9, {1, 2}, unclean_allowed=False) is None


def test_fenced_replica_outside_isr_changes_nothing():
    p = rec(replicas=(1, 2, 3), isr=(1, 2), leader=1)
    assert on_broker_fenced(p, 3, {1, 2}, unclean_allowed=False) is None


def test_fenced_on_offline_partition_last_member_changes_nothing():
    p = rec(replicas=(1, 2), isr=(1,), leader=NO_LEADER)
    assert on_broker_fenced(p, 1, {2}, unclean_allowed=False) is None


# ---------------------------------------------------------------- unfencing

def test_unfenced_isr_member_revives_offline_partition():
    p = rec(replicas=(1, 2), isr=(1,), leader=NO_LEADER, leader_epoch=6)
    change = on_broker_unfenced(p, 1, {1, 2}, unclean_allowed=False)
    assert change.record.leader == 1 and change.record.leader_epoch == 7 and not change.unclean


def test_unfenced_non_isr_replica_needs_unclean():
    p = rec(replicas=(1, 2), isr=(1,), leader=NO_LEADER)
    assert on_broker_unfenced(p, 2, {2}, unclean_allowed=False) is None
    change = on_broker_unfenced(p, 2, {2}, unclean_allowed=True)
    assert change.unclean and change.record.leader == 2 and change.record.isr == (2,)


def test_unfenced_does_not_touch_led_partition():
    assert on_broker_unfenced(rec(leader=2, isr=(2, 3)), 1, {1, 2, 3}, unclean_allowed=True) is None


def test_unfenced_non_replica_changes_nothing():
    p = rec(replicas=(1, 2), isr=(1,), leader=NO_LEADER)
    assert on_broker_unfenced(p, 5, {5}, unclean_allowed=True) is None


# ---------------------------------------------------------------- controlled shutdown

def test_controlled_shutdown_moves_leader_and_leaves_isr():
    p = rec(replicas=(1, 2, 3), leader=1)
    change = on_controlled_shutdown(p, 1, {1, 2, 3})
    assert change.record.leader == 2 and change.record.isr == (2, 3)
    assert change.record.leader_epoch == 6


def test_controlled_shutdown_follower_leaves_isr():
    change = on_controlled_shutdown(rec(replicas=(1, 2), leader=1), 2, {1, 2})
    assert change.record.isr == (1,) and change.record.leader == 1 and not change.leader_changed


def test_controlled_shutdown_of_sole_isr_member_goes_offline_unless_unclean_allowed():
    p = rec(replicas=(1, 2), isr=(1,), leader=1)
    change = on_controlled_shutdown(p, 1, {1, 2})
    assert change.record.offline and change.record.isr == (1,) and not change.unclean
    change = on_controlled_shutdown(p, 1, {1, 2}, unclean_allowed=True)
    assert change.record.leader == 2 and change.record.isr == (2,) and change.unclean


# ---------------------------------------------------------------- preferred leader

def test_preferred_leader_moves_back_when_live_and_in_isr():
    p = rec(replicas=(1, 2, 3), isr=(2, 3, 1), leader=2)
    change = maybe_preferred_leader(p, {1, 2, 3})
    assert change.record.leader == 1 and change.record.leader_epoch == 6
    assert change.record.partition_epoch == 8 and change.record.isr == (2, 3, 1)


def test_preferred_leader_waits_for_isr_membership_and_liveness():
    assert maybe_preferred_leader(rec(replicas=(1, 2), isr=(2,), leader=2), {1, 2}) is None
    assert maybe_preferred_leader(rec(replicas=(1, 2), isr=(2, 1), leader=2), {2}) is None
    assert maybe_preferred_leader(rec(replicas=(1, 2), leader=1), {1, 2}) is None


# ---------------------------------------------------------------- AlterPartition

def alter(p, **kw):
    args = dict(leader_id=p.leader, leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch, new_isr=p.isr, live={1, 2, 3})
    args.update(kw)
    return alter_partition(p, **args)


def test_alter_shrink_accepted_bumps_partition_epoch_only():
    p = rec(replicas=(1, 2, 3), leader=1)
    code, new = alter(p, new_isr=(1, 2))
    assert code == pb.NONE and new.isr == (1, 2)
    assert new.partition_epoch == 8 and new.leader_epoch == 5 and new.leader == 1


def test_alter_expand_accepted():
    p = rec(replicas=(1, 2, 3), isr=(1,), leader=1)
    code, new = alter(p, new_isr=(1, 3))
    assert code == pb.NONE and new.isr == (1, 3) and new.partition_epoch == 8


def test_alter_stale_partition_epoch_rejected():
    p = rec(leader=1)
    code, new = alter(p, partition_epoch=6, new_isr=(1, 2))
    assert code == pb.INVALID_UPDATE_VERSION and new == p


def test_alter_stale_leader_epoch_fenced():
    p = rec(leader=1)
    assert alter(p, leader_epoch=4, new_isr=(1, 2))[0] == pb.FENCED_LEADER_EPOCH
    assert alter(p, leader_epoch=6, new_isr=(1, 2))[0] == pb.FENCED_LEADER_EPOCH


def test_alter_from_non_leader_rejected():
    assert alter(rec(leader=1), leader_id=2, new_isr=(1, 2))[0] == pb.NOT_LEADER_OR_FOLLOWER


def test_alter_isr_must_contain_leader_without_duplicates():
    p = rec(leader=1)
    assert alter(p, new_isr=(2, 3))[0] == pb.INVALID_REQUEST
    assert alter(p, new_isr=(1, 1))[0] == pb.INVALID_REQUEST
    assert alter(p, new_isr=())[0] == pb.INVALID_REQUEST


def test_alter_only_replicas_and_live_joiners():
    p = rec(replicas=(1, 2, 3), isr=(1, 2), leader=1)
    assert alter(p, new_isr=(1, 2, 4))[0] == pb.INELIGIBLE_REPLICA
    assert alter(p, new_isr=(1, 2, 3), live={1, 2})[0] == pb.INELIGIBLE_REPLICA
    # an existing member need not be live to stay (it is being fenced separately)
    assert alter(p, new_isr=(1, 2), live={1})[0] == pb.NONE


def test_alter_same_isr_changes_nothing():
    p = rec(leader=1)
    code, new = alter(p)
    assert code == pb.NONE and new is p


# ---------------------------------------------------------------- corrupt replica reports

# (replicas, isr, leader, reporter, live, epochs ok, expected code, new leader, new isr);
# the record's epochs are leader 5, partition 7. "epochs" is what the report carries.
CORRUPT_CASES = [
    # a follower leaves the ISR; the leader keeps leading
    ((1, 2, 3), (1, 2, 3), 1, 2, {1, 2, 3}, (5, 7), pb.NONE, 1, (1, 3)),
    # the leader leaves: the first live ISR member in replica order takes over
    ((1, 2, 3), (1, 2, 3), 1, 1, {1, 2, 3}, (5, 7), pb.NONE, 2, (2, 3)),
    ((1, 2, 3), (1, 2, 3), 1, 1, {1, 3}, (5, 7), pb.NONE, 3, (2, 3)),
    # ... and a live replica outside the ISR never does (clean only)
    ((1, 2, 3), (1, 2), 1, 1, {1, 3}, (5, 7), pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, None, None),
    # the last ISR member keeps its copy, leader or not
    ((1, 2), (1,), 1, 1, {1, 2}, (5, 7), pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, None, None),
    ((1, 2), (2,), NO_LEADER, 2, {1}, (5, 7), pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, None, None),
    # an offline partition loses the reporter from its ISR, stays offline
    ((1, 2, 3), (2, 3), NO_LEADER, 2, set(), (5, 7), pb.NONE, NO_LEADER, (3,)),
    # refusals
    ((1, 2, 3), (1, 2), 1, 3, {1, 2, 3}, (5, 7), pb.INELIGIBLE_REPLICA, None, None),
    ((1, 2), (1, 2), 1, 4, {1, 2, 4}, (5, 7), pb.NOT_LEADER_OR_FOLLOWER, None, None),
    ((1, 2, 3), (1, 2, 3), 1, 2, {1, 2, 3}, (4, 7), pb.FENCED_LEADER_EPOCH, None, None),
    ((1, 2, 3), (1, 2, 3), 1, 2, {1, 2, 3}, (6, 7), pb.FENCED_LEADER_EPOCH, None, None),
    ((1, 2, 3), (1, 2, 3), 1, 2, {1, 2, 3}, (5, 6), pb.INVALID_UPDATE_VERSION, None, None),
    ((1, 2, 3), (1, 2, 3), 1, 1, {1, 2, 3}, (5, 8), pb.INVALID_UPDATE_VERSION, None, None),
]


@pytest.mark.parametrize("replicas,isr,leader,reporter,live,epochs,code,new_leader,new_isr",
                         CORRUPT_CASES)
def test_replica_corrupt(replicas, isr, leader, reporter, live, epochs, code, new_leader,
                         new_isr):
    p = rec(replicas=replicas, isr=isr, leader=leader)
    got, change = on_replica_corrupt(p, reporter, leader_epoch=epochs[0],
                                     partition_epoch=epochs[1], live=live)
    assert got == code
    if code != pb.NONE:
        assert change is None
        return
    new = change.record
    assert (new.leader, new.isr) == (new_leader, new_isr)
    assert not change.unclean and change.leader_changed == (new_leader != leader)
    assert new.partition_epoch == 8 and new.leader_epoch == (6 if change.leader_changed else 5)
    # the same report again is stale: it names the epochs before the change
    assert on_replica_corrupt(new, reporter, leader_epoch=epochs[0], partition_epoch=epochs[1],
                              live=live)[1] is None


# ---------------------------------------------------------------- properties

@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 4))
    replicas = tuple(draw(st.permutations(range(1, n + 1))))
    isr = tuple(draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True)))
    leader = draw(st.sampled_from(isr + (NO_LEADER,)))
    p = PartitionRecord("t", 0, replicas, isr, leader, 3, 4)
    live = set(draw(st.lists(st.integers(1, 5), unique=True)))
    events = draw(st.lists(st.tuples(st.sampled_from(["fence", "unfence", "shutdown", "prefer",
                                                      "elect", "corrupt"]),
                                     st.integers(1, 5), st.booleans()), max_size=12))
    return p, live, events


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_epochs_monotonic_and_leader_always_live_isr_member(scenario):
    p, live, events = scenario
    for kind, broker, unclean in events:
        if kind == "fence":
            live.discard(broker)
            change = on_broker_fenced(p, broker, live, unclean_allowed=unclean)
        elif kind == "unfence":
            live.add(broker)
            change = on_broker_unfenced(p, broker, live, unclean_allowed=unclean)
        elif kind == "shutdown":
            change = on_controlled_shutdown(p, broker, live, unclean_allowed=unclean)
            live.discard(broker)
        elif kind == "prefer":
            change = maybe_preferred_leader(p, live)
        elif kind == "corrupt":
            code, change = on_replica_corrupt(p, broker, leader_epoch=p.leader_epoch,
                                              partition_epoch=p.partition_epoch, live=live)
            assert (code == pb.NONE) == (change is not None)
            if change is not None:  # out of the ISR, nothing new in it, never unclean
                assert broker not in change.record.isr and not change.unclean
                assert set(change.record.isr) < set(p.isr)
        else:
            change = elect(p, live, unclean_allowed=unclean)
        if change is None:
            continue
        new = change.record
        assert new.partition_epoch == p.partition_epoch + 1
        assert new.leader_epoch == p.leader_epoch + (1 if new.leader != p.leader else 0)
        assert change.leader_changed == (new.leader != p.leader)
        assert new.isr  # never empty (also asserted by the record itself)
        if change.leader_changed and new.leader != NO_LEADER:
            assert new.leader in live and new.leader in new.isr
        if change.unclean:
            assert new.isr == (new.leader,)
        p = new
