"""The seeded fault plan (client/chaos/schedule.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.tools.chaos.schedule import (
    APPLY_ACTION,
    CONTROLLER_FAULTS,
    FAULT_WEIGHTS,
    QUORUM_FAULT_WEIGHTS,
    UNDO_ACTION,
    plan_faults,
)

BROKERS = [1, 2, 3]


def test_same_seed_same_plan_other_seed_other_plan():
    a = plan_faults(7, 120, BROKERS, 3)
    assert a == plan_faults(7, 120, BROKERS, 3)
    assert a != plan_faults(8, 120, BROKERS, 3)
    assert len(a) >= 8  # 110 s of room, faults of 2-8 s with 1-4 s gaps


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), duration_s=st.floats(0, 400), partitions=st.integers(1, 12),
       brokers=st.lists(st.integers(1, 9), min_size=1, max_size=5, unique=True))
def test_faults_are_sequential_and_inside_the_window(seed, duration_s, partitions, brokers):
    plan = plan_faults(seed, duration_s, brokers, partitions, warmup_s=5, cooldown_s=5)
    previous_end = 5.0
    for f in plan:
        assert f.start_s >= previous_end  # one fault at a time
        assert 2.0 <= f.hold_s <= 8.0
        assert f.end_s <= duration_s - 5
        previous_end = f.end_s
        if f.kind == "kill_leader":
            assert 0 <= f.target < partitions
        elif f.kind == "kill_controller":
            assert f.target == "controller"
        else:
            assert f.target in brokers


def test_weights_select_kinds():
    plan = plan_faults(1, 300, BROKERS, 3, weights={"pause_broker": 1, "kill_controller": 0})
    assert plan and {f.kind for f in plan} == {"pause_broker"}
    every = plan_faults(1, 2000, BROKERS, 3)
    assert {f.kind for f in every} == set(FAULT_WEIGHTS)


def test_every_kind_has_an_apply_and_an_undo():
    assert set(APPLY_ACTION) == set(UNDO_ACTION) == set(FAULT_WEIGHTS) | set(QUORUM_FAULT_WEIGHTS)


def test_a_quorum_adds_controller_pauses_and_partitions_on_the_active_and_standbys():
    every = plan_faults(1, 2000, BROKERS, 3, controllers=3)
    assert {f.kind for f in every} == set(FAULT_WEIGHTS) | set(QUORUM_FAULT_WEIGHTS)
    hits = {(f.kind, f.target) for f in every if f.kind in CONTROLLER_FAULTS}
    assert hits == {(k, t) for k in CONTROLLER_FAULTS for t in ("active", "standby")}
    # One controller: the plans it always had (seeded runs keep their faults).
    assert plan_faults(6, 60, BROKERS, 3, controllers=1) == plan_faults(6, 60, BROKERS, 3)
    assert {f.target for f in plan_faults(1, 2000, BROKERS, 3) if f.kind in CONTROLLER_FAULTS} == {
        "controller"}


def test_no_room_no_faults():
    assert plan_faults(1, 10, BROKERS, 3, warmup_s=5, cooldown_s=5) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"broker_ids": []}, "no brokers"),
    ({"partitions": 0}, "at least one partition"),
    ({"weights": {"explode": 1}}, "unknown fault kind"),
    ({"weights": {"kill_broker": 0}}, "weight 0"),
])
def test_bad_plans_are_refused(kwargs, message):
    args = {"seed": 1, "duration_s": 60, "broker_ids": BROKERS, "partitions": 3} | kwargs
    weights = args.pop("weights", None)
    with pytest.raises(ValueError, match=message):
        plan_faults(**args, weights=weights)
