"""The client-side assignors (client/assignors.py): Kafka's range and round-robin rules,
and ConsumerProtocol bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewater.client import assignors


def test_range_gives_contiguous_ranges_and_the_first_members_the_extra():
    members = {"m1": ["t"], "m2": ["t"], "m3": ["t"]}
    out = assignors.range_assign(members, {"t": 7})
    assert out == {"m1": [("t", 0), ("t", 1), ("t", 2)], "m2": [("t", 3), ("t", 4)],
                   "m3": [("t", 5), ("t", 6)]}


def test_range_works_per_topic_among_its_subscribers():
    members = {"a": ["x", "y"], "b": ["y"]}
    out = assignors.range_assign(members, {"x": 2, "y": 2})
    assert out == {"a": [("x", 0), ("x", 1), ("y", 0)], "b": [("y", 1)]}


def test_round_robin_deals_partitions_in_turn_skipping_non_subscribers():
    members = {"a": ["x", "y"], "b": ["y"]}
    out = assignors.round_robin_assign(members, {"x": 2, "y": 3})
    assert out == {"a": [("x", 0), ("x", 1), ("y", 1)], "b": [("y", 0), ("y", 2)]}


@pytest.mark.parametrize("assign", [assignors.range_assign, assignors.round_robin_assign])
@given(st.dictionaries(st.sampled_from(["m1", "m2", "m3", "m4"]),
                       st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, unique=True),
                       min_size=1),
       st.fixed_dictionaries({"x": st.integers(0, 9), "y": st.integers(0, 9),
                              "z": st.integers(0, 9)}))
def test_every_partition_goes_to_exactly_one_subscriber(assign, members, counts):
    out = assign(members, counts)
    given_out = [tp for parts in out.values() for tp in parts]
    subscribed = {t for ts in members.values() for t in ts}
    assert sorted(given_out) == sorted((t, p) for t in subscribed for p in range(counts[t]))
    for member, parts in out.items():
        assert all(t in members[member] for t, _ in parts)
    sizes = [len(parts) for parts in out.values()]
    if len({tuple(ts) for ts in map(sorted, members.values())}) == 1:
        assert max(sizes) - min(sizes) <= len(subscribed)  # balanced per topic


@given(st.lists(st.text(max_size=10), max_size=5))
def test_subscriptions_round_trip(topics):
    assert assignors.decode_subscription(assignors.encode_subscription(topics)) == topics


@given(st.lists(st.tuples(st.text(min_size=1, max_size=5), st.integers(0, 1000)),
                unique=True, max_size=10))
def test_assignments_round_trip(parts):
    assert sorted(assignors.decode_assignment(assignors.encode_assignment(parts))) == \
        sorted(parts)


def test_kafkas_bytes_decode():
    # ConsumerProtocolAssignment v0 for orders [0, 2], no user data, as Kafka writes it.
    raw = (b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x06orders" + b"\x00\x00\x00\x02"
           + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x02" + b"\xff\xff\xff\xff")
    assert assignors.decode_assignment(raw) == [("orders", 0), ("orders", 2)]
    assert assignors.encode_assignment([("orders", 2), ("orders", 0)]) == raw
    with pytest.raises(assignors.ProtocolError):
        assignors.decode_assignment(raw[:9])
