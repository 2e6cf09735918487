"""ReplicaState's smaller decisions, called directly: which replicas a tick concerns, what
a follower asks in OffsetForLeaderEpoch, what a ListOffsets asker may see, how long an
acks=all wait lasts, persist failures outside a follower's cycle, broken invariants.
(The scripted scenarios are in test_replica_state.py.)"""

import pytest

from tidewater.broker.replication.ready import (
    EMPTY,
    STOP_FETCHING,
    AppendFetched,
    AssignEpoch,
    Truncate,
)
from tidewater.broker.replication.replica import (
    ACKS_ALL_WAIT_MS_MAX,
    LeaderAndIsrState,
    ReplicaState,
    acks_all_wait_ms,
)
from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FencedLeaderEpochError,
    InvariantViolation,
    NotLeaderOrFollowerError,
    UnknownLeaderEpochError,
)


class Log:
    def __init__(self, leo=0, epochs=()):
        self.log_start_offset = 0
        self.log_end_offset = leo
        self.leader_epoch_cache = LeaderEpochCache(None, list(epochs))


def replica(broker=1, leo=10, epochs=((0, 0),), hw=0):
    return ReplicaState("t", 0, local_broker_id=broker, log=Log(leo, epochs), high_watermark=hw,
                        min_insync_replicas=1, replica_lag_time_max_ms=1000)


def state(leader, epoch=3, isr=(1, 2)):
    return LeaderAndIsrState("t", 0, leader, epoch, epoch, (1, 2), isr)


# ---------------------------------------------------------------- tick: every replica

def test_tick_of_a_replica_with_nothing_to_do_is_the_empty_ready():
    r = replica()
    assert r.tick(1000) is EMPTY  # no role
    r.on_leader_and_isr(state(leader=2), 0)
    assert r.follower is not None
    assert r.tick(2000) is EMPTY  # a follower: the shell ticks it all the same
    r.on_leader_and_isr(state(leader=-1, epoch=4, isr=(1,)), 0)
    assert r.tick(3000) is EMPTY  # offline


def test_tick_of_a_corrupt_follower_cuts_below_the_batch():
    r = replica()
    r.on_leader_and_isr(state(leader=2, isr=(2,)), 0)  # a follower out of the ISR
    ready = r.on_corrupt_batch(4, 0)
    assert ready.persist == (Truncate(4, below_corrupt_batch=True),)
    r.on_persist_failure(ready.persist[0], 0)  # the cut failed: owed again
    assert r.corrupt_from == 4
    ready = r.tick(r.options.fetch_backoff_ms)
    assert ready.persist == (Truncate(4, below_corrupt_batch=True),)


# ---------------------------------------------------------------- OffsetForLeaderEpoch asked

def test_offset_for_leader_epoch_request_is_the_followed_epoch_and_the_log_latest():
    r = replica(epochs=((0, 0), (2, 6)))
    assert r.offset_for_leader_epoch_request() is None  # follows nobody
    r.on_leader_and_isr(state(leader=2, epoch=5), 0)
    assert r.offset_for_leader_epoch_request() == (5, 2)
    r.log.leader_epoch_cache.truncate_from_end(6)  # a truncation took epoch 2 away
    assert r.offset_for_leader_epoch_request() == (5, 0)


# ---------------------------------------------------------------- ListOffsets visibility

def test_list_offsets_consumer_sees_below_the_hw_a_replica_the_whole_log():
    r = replica(leo=10)
    r.on_leader_and_isr(state(leader=1, isr=(1, 2)), 0)
    r.on_follower_fetch(2, 3, 4, -1, 0)  # the follower holds 4: HW 4
    assert r.high_watermark == 4
    assert r.check_list_offsets(3, consumer=True) == 4
    assert r.check_list_offsets(-1, consumer=False) == 10


def test_list_offsets_fencing():
    r = replica()
    r.on_leader_and_isr(state(leader=2), 0)
    with pytest.raises(FencedLeaderEpochError):
        r.check_list_offsets(2, consumer=False)
    with pytest.raises(UnknownLeaderEpochError):
        r.check_list_offsets(4, consumer=False)
    assert r.check_list_offsets(3, consumer=False) == 10  # a follower answers a replica
    with pytest.raises(NotLeaderOrFollowerError):
        r.check_list_offsets(3, consumer=True)  # a consumer asks the leader only


# ---------------------------------------------------------------- acks=all wait

def test_acks_all_wait_is_bounded():
    assert acks_all_wait_ms(1500) == 1500
    assert acks_all_wait_ms(0) == 0
    assert acks_all_wait_ms(-5) == 0
    assert acks_all_wait_ms(2**31 - 1) == ACKS_ALL_WAIT_MS_MAX


# ---------------------------------------------------------------- persist failures

def test_a_persist_failure_without_a_follower_cycle_ends_every_part():
    r = replica()
    r.on_leader_and_isr(state(leader=1), 0)
    ready = r.on_persist_failure(AssignEpoch(3, 10), 5)
    assert r.leader is None and r.follower is None and r.role == "none"
    assert ready.fetch is STOP_FETCHING and ready.leadership_changed and ready.alarms
    # Anything else with no follower cycle to go back to: no role either.
    assert r.on_persist_failure(AppendFetched(), 6).leadership_changed


def test_a_failed_leader_append_on_a_replica_that_does_not_lead_changes_nothing():
    assert replica().on_leader_append_failure(0) is EMPTY


def test_a_failed_leader_append_fails_the_leaderships_waits():
    r = replica(leo=0)
    r.on_leader_and_isr(state(leader=1), 0)
    r.on_local_append(3, 0, waiter_id=7, required_offset=3, timeout_ms=1000)
    ready = r.on_leader_append_failure(1)
    assert ready.completed == ((7, pb.NOT_LEADER_OR_FOLLOWER),)
    assert r.leader is None and r.waiting == 0


# ---------------------------------------------------------------- invariants

@pytest.mark.parametrize("call", [
    lambda r: r._note_isr_change((1,), None),
    lambda r: r._maybe_send_alter(0, None),
    lambda r: r.on_local_append(5, 0),
])
def test_a_broken_invariant_raises_invariant_violation(call):
    with pytest.raises(InvariantViolation):
        call(replica())  # each is a leader's step, on a replica that leads nothing


# ---------------------------------------------------------------- a failed write, retried

def test_a_leader_whose_epoch_write_failed_takes_its_role_again_after_a_backoff():
    r = replica()
    ready = r.on_leader_and_isr(state(leader=1), 0)
    assert any(isinstance(op, AssignEpoch) for op in ready.persist)
    stopped = r.on_persist_failure(AssignEpoch(3, 10), 100)
    assert r.leader is None and stopped.fetch == STOP_FETCHING
    assert "storage_failures" in stopped.counters
    assert r.tick(599) is EMPTY  # the backoff (500 ms) is not over
    again = r.tick(600)
    assert r.leader is not None and r.leader_epoch == 3
    assert [op for op in again.persist if isinstance(op, AssignEpoch)] == [AssignEpoch(3, 10)]
    assert "storage_retries" in again.counters
    # It fails again: the backoff doubles.
    r.on_persist_failure(AssignEpoch(3, 10), 700)
    assert r.tick(1699) is EMPTY and r.tick(1700).persist


def test_a_new_state_from_the_controller_replaces_a_pending_retry():
    r = replica()
    r.on_leader_and_isr(state(leader=1), 0)
    r.on_leader_append_failure(100)
    assert r.leader is None
    r.on_leader_and_isr(state(leader=2, epoch=4), 200)  # the controller moved leadership
    assert r.follower is not None
    assert r.tick(10_000) is EMPTY  # no retry of the old leadership
    assert r.follower is not None and r.leader is None
