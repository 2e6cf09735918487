"""The idempotent producer's bookkeeping (client/idempotence.py, pure) and the accumulator
pieces it relies on: numbering, the answer table, epoch bumps, retries back in creation
order, restamped batches that still pass their CRC, the drain limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.client.accumulator import RecordAccumulator
from tidewater.client.idempotence import (
    BATCHES_IN_FLIGHT_MAX,
    EPOCH_MAX,
    SEQUENCE_MAX,
    IdempotentState,
    drain_count_max,
    next_sequence,
)
from tidewater.client.metadata import TopicPartition
from tidewater.client.producer import idempotence_enabled
from tidewater.proto.batch import read_header, validate_batch
from tidewater.proto.errors import (
    InvalidProducerEpochError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)

TP = TopicPartition("t", 0)


def batches(accumulator, count, records=2):
    out = []
    for _ in range(count):
        for _ in range(records):
            accumulator.add(TP, None, b"v", (), 1000, 0)
        out += accumulator.drain_many(TP, 1 << 20)
    return out


def numbered(n=3, records=2):
    state = IdempotentState()
    state.set_producer_id(42, 0)
    acc = RecordAccumulator(batch_size_bytes=1 << 20)
    got = batches(acc, n, records)
    for b in got:
        state.assign(b)
    return state, acc, got


def test_batches_are_numbered_in_order_and_keep_their_numbers_on_a_retry():
    state, _acc, (a, b, c) = numbered()
    assert [(x.producer_id, x.producer_epoch, x.base_sequence) for x in (a, b, c)] == [
        (42, 0, 0), (42, 0, 2), (42, 0, 4)]
    assert state.assign(b) == (42, 0, 2)  # a retry: the same numbers
    assert next_sequence(SEQUENCE_MAX, 1) == 0 and next_sequence(SEQUENCE_MAX - 1, 3) == 1


def test_the_answer_table():
    state, _acc, (a, b, c) = numbered()
    assert state.decide(a, NotLeaderOrFollowerError("moved")) == "retry"
    assert state.decide(b, OutOfOrderSequenceError("gap")) == "retry"  # a is unresolved
    assert state.decide(a, OutOfOrderSequenceError("lost state")) == "bump"  # next expected
    assert state.decide(a, UnknownProducerIdError("expired")) == "bump"
    assert state.decide(a, InvalidProducerEpochError("old")) == "fail"
    state.on_acked(a)
    assert state.decide(b, OutOfOrderSequenceError("now b is next")) == "bump"
    state.bump(TP)
    assert state.decide(c, OutOfOrderSequenceError("older epoch")) == "retry"
    assert state.assign(c) == (42, 1, 0)  # renumbered in the new epoch


def test_an_epoch_past_the_maximum_asks_for_a_new_producer_id():
    state, _acc, (a, *_rest) = numbered()
    state.partitions[TP].epoch = EPOCH_MAX
    state.bump(TP)
    assert not state.has_producer_id
    state.set_producer_id(43, 0)
    assert state.assign(a) == (43, 0, 0)


def test_retries_go_back_in_creation_order_and_restamped_batches_pass_their_crc():
    state, acc, (a, b, c) = numbered()
    for x in (a, b, c):
        x.close(0)
    acc.add(TP, None, b"new", (), 1000, 0)  # a new batch queued behind
    acc.reenqueue(c, 0, 0)  # answers come back out of order
    acc.reenqueue(a, 0, 0)
    acc.reenqueue(b, 0, 0)
    assert acc.first_is_retry(TP)
    assert [x.base_sequence for x in acc.drain_many(TP, 1 << 20)] == [0, 2, 4, -1]
    state.bump(TP)
    state.assign(b)
    encoded = b.close(0)
    validate_batch(encoded)  # the CRC was redone
    header = read_header(encoded)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 1, 0)


def test_the_window_counts_from_the_oldest_unacked_batch():
    """Acks that come out of order do not open the window: the broker remembers five
    batches, and the oldest unacked one must stay among them for its retry."""
    state = IdempotentState()
    state.set_producer_id(7, 0)
    acc = RecordAccumulator(batch_size_bytes=10)
    for _ in range(BATCHES_IN_FLIGHT_MAX):
        acc.add(TP, None, b"x" * 20, (), 1000, 0)
    batches = acc.drain_many(TP, 1 << 20, None)
    for b in batches:
        state.assign(b)
    assert state.window_batches(TP) == BATCHES_IN_FLIGHT_MAX
    for b in batches[1:]:  # every answer but the first one's
        state.on_acked(b)
    assert state.window_batches(TP) == BATCHES_IN_FLIGHT_MAX
    assert drain_count_max(state, False, state.window_batches(TP)) == 0
    state.assign(batches[0])  # a retry keeps its numbers and adds nothing
    assert state.window_batches(TP) == BATCHES_IN_FLIGHT_MAX
    state.on_acked(batches[0])
    assert state.window_batches(TP) == 0
    state.bump(TP)
    assert state.window_batches(TP) == 0


def test_drain_limits():
    assert drain_count_max(None, True, 9) is None
    state = IdempotentState()
    assert drain_count_max(state, True, 0) == 1  # a retry goes alone
    assert drain_count_max(state, False, 2) == BATCHES_IN_FLIGHT_MAX - 2
    acc = RecordAccumulator(batch_size_bytes=10)
    for _ in range(4):
        acc.add(TP, None, b"x" * 20, (), 1000, 0)  # a batch each
    assert len(acc.drain_many(TP, 1 << 20, 3)) == 3


@pytest.mark.parametrize("enable,acks,retries,in_flight,expected", [
    (None, -1, 5, 5, True), (None, 1, 5, 1, False), (None, -1, 0, 1, False),
    (None, -1, 5, 6, False), (False, -1, 5, 1, False), (True, -1, 5, 5, True)])
def test_idempotence_is_on_by_default_with_acks_all(enable, acks, retries, in_flight, expected):
    assert idempotence_enabled(enable, acks, retries, in_flight) is expected


@pytest.mark.parametrize("acks,retries,in_flight", [(1, 5, 1), (0, 5, 1), (-1, 0, 1), (-1, 5, 6)])
def test_asking_for_idempotence_with_a_setting_that_rules_it_out_is_an_error(acks, retries,
                                                                             in_flight):
    with pytest.raises(ValueError):
        idempotence_enabled(True, acks, retries, in_flight)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["ack", "fail_head", "lost_state"]), max_size=30))
def test_sequences_of_one_epoch_stay_contiguous(events):
    """Whatever happens, the batches numbered in one epoch carry contiguous sequences in
    creation order: what the broker needs to take them."""
    state = IdempotentState()
    state.set_producer_id(1, 0)
    acc = RecordAccumulator(batch_size_bytes=1 << 20)
    pending = []
    for event in events:
        (b,) = batches(acc, 1, records=3)
        state.assign(b)
        pending.append(b)
        head = pending[0]
        if event == "ack":
            state.on_acked(head)
            pending.pop(0)
        elif event == "lost_state" and state.decide(head, UnknownProducerIdError("x")) == "bump":
            state.bump(TP)
            for x in pending:
                state.assign(x)
        elif event == "fail_head" and state.decide(head, InvalidProducerEpochError("x")) == "fail":
            pending.pop(0)
            state.bump(TP)  # its sequences are unresolved: the rest are renumbered
            for x in pending:
                state.assign(x)
        by_epoch = {}
        for x in pending:
            by_epoch.setdefault(x.producer_epoch, []).append(x)
        for group in by_epoch.values():
            for earlier, later in zip(group, group[1:], strict=False):
                assert later.base_sequence == next_sequence(earlier.base_sequence,
                                                            earlier.record_count)
