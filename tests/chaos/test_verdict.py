"""Judging a chaos run (client/chaos/verdict.py) and the leader monitor's rule."""

from __future__ import annotations

import pytest

from tidewater.tools.chaos.monitor import leaderless
from tidewater.tools.chaos.replicas import ReplicaComparison
from tidewater.tools.chaos.verdict import (
    controller_failovers,
    judge,
    judge_group,
    judge_transactional,
)

pytestmark = pytest.mark.timeout(60)

P = "run1-p"
SAME = ReplicaComparison(True, "")


def run(consumed, acked, sent=None, replicas=None, notes=None):
    sent = sent if sent is not None else {v: p for v, (p, _) in acked.items()}
    return judge(partitions=[0, 1], value_prefix=P, sent=sent, acked=acked, consumed=consumed,
                 no_leader_s={0: 1.5}, replicas=replicas or {0: SAME, 1: SAME}, notes=notes)


def test_everything_acknowledged_is_there_once():
    acked = {f"{P}0-1": (0, 0), f"{P}0-2": (1, 0), f"{P}0-3": (0, 1)}
    consumed = {0: [(0, f"{P}0-1"), (1, f"{P}0-3")], 1: [(0, f"{P}0-2")]}
    v = run(consumed, acked)
    assert v.ok
    assert [(p.partition, p.acked, p.no_leader_s) for p in v.partitions] == [(0, 2, 1.5), (1, 1, 0.0)]
    assert v.table().splitlines()[-1] == "VERDICT: PASS"


def test_lost_record_fails():
    acked = {f"{P}0-1": (0, 0), f"{P}0-2": (0, 1)}
    v = run({0: [(0, f"{P}0-1")], 1: []}, acked)
    assert not v.ok
    assert v.partitions[0].lost == 1
    assert f"lost {P}0-2@1" in v.partitions[0].examples
    assert v.table().splitlines()[-1] == "VERDICT: FAIL"


def test_record_at_another_offset_fails():
    v = run({0: [(0, "other"), (1, f"{P}0-1")], 1: []}, {f"{P}0-1": (0, 0)})
    assert not v.ok and v.partitions[0].moved == 1 and v.partitions[0].lost == 0


def test_duplicate_fails():
    v = run({0: [(0, f"{P}0-1"), (1, f"{P}0-1")], 1: []}, {f"{P}0-1": (0, 0)})
    assert not v.ok and v.partitions[0].duplicates == 1


def test_unacknowledged_but_present_is_fine_and_counted():
    sent = {f"{P}0-1": 0, f"{P}0-2": 0}
    v = run({0: [(0, f"{P}0-1"), (1, f"{P}0-2")], 1: []}, {f"{P}0-1": (0, 0)}, sent=sent)
    assert v.ok and v.partitions[0].unacked_present == 1


def test_never_sent_value_with_our_prefix_fails_other_records_are_ignored():
    v = run({0: [(0, "from-an-earlier-run"), (1, f"{P}9-9")], 1: []}, {})
    assert not v.ok and v.partitions[0].unknown == 1
    assert run({0: [(0, "from-an-earlier-run")], 1: []}, {}).ok


def test_diverged_replicas_or_run_problems_fail():
    v = run({0: [], 1: []}, {}, replicas={0: SAME, 1: ReplicaComparison(False, "brokers 1 and 2 differ")})
    assert not v.ok and "partition 1 replicas: brokers 1 and 2 differ" in v.table()
    v = run({0: [], 1: []}, {}, notes=["not settled"])
    assert not v.ok and "problem: not settled" in v.table()


def test_leaderless_rule():
    assert leaderless(None, [0, 1], set()) == {0, 1}
    assert leaderless({0: 1, 1: -1}, [0, 1], set()) == {1}
    assert leaderless({0: 1, 1: 2}, [0, 1], {2}) == {1}
    assert leaderless({0: 1}, [0, 1], set()) == {1}


def test_the_group_verdict_passes_when_everything_acked_was_consumed_and_commits_rose():
    acked = {"r-1": (0, 0), "r-2": (0, 1), "r-3": (1, 0)}
    group = judge_group("g", acked, {(0, 0), (0, 1), (1, 0), (1, 1)}, {0: [1, 2, 2], 1: [1]})
    assert group.ok and group.commits_seen == 4
    assert "every acknowledged record consumed by the group; commits never went backwards" \
        in group.line()
    v = ok_verdict()
    v.group = group
    assert v.ok and "commits never went backwards" in v.table()


def test_the_group_verdict_fails_on_an_unconsumed_record_or_a_commit_going_back():
    acked = {"r-1": (0, 0), "r-2": (0, 1)}
    missed = judge_group("g", acked, {(0, 0)}, {0: [1]})
    assert not missed.ok and missed.not_consumed == 1 and "r-2@0/1" in missed.line()
    back = judge_group("g", acked, {(0, 0), (0, 1)}, {0: [2, 1]})
    assert not back.ok and back.backwards == ["partition 0: 2 -> 1"]
    v = ok_verdict()
    v.group = back
    assert not v.ok and "VERDICT: FAIL" in v.table()


def ok_verdict():
    acked = {f"{P}0-1": (0, 0)}
    return run({0: [(0, f"{P}0-1")], 1: []}, acked)
def test_a_producers_records_out_of_send_order_fail():
    acked = {f"{P}0-000000001": (0, 0), f"{P}0-000000002": (0, 1), f"{P}1-000000001": (0, 2)}
    in_order = {0: [(0, f"{P}0-000000001"), (1, f"{P}0-000000002"), (2, f"{P}1-000000001")], 1: []}
    assert run(in_order, acked).ok
    swapped = {0: [(0, f"{P}0-000000002"), (1, f"{P}0-000000001"), (2, f"{P}1-000000001")], 1: []}
    v = run(swapped, {f"{P}0-000000002": (0, 0), f"{P}0-000000001": (0, 1),
                      f"{P}1-000000001": (0, 2)})
    assert not v.ok and v.partitions[0].out_of_order == 1
    assert "order" in v.table().splitlines()[0]


def test_a_compacted_run_counts_records_cleaned_under_a_later_one_of_their_key():
    # keys=2: seq 0 and 2 share key k0, 1 and 3 share k1
    acked = {f"{P}0-0": (0, 0), f"{P}0-1": (0, 1), f"{P}0-2": (0, 2), f"{P}0-3": (0, 3)}
    sent = {v: 0 for v in acked}

    def compacted(consumed):
        return judge(partitions=[0], value_prefix=P, sent=sent, acked=acked, consumed=consumed,
                     no_leader_s={}, replicas={0: SAME}, keys=2)
    v = compacted({0: [(2, f"{P}0-2"), (3, f"{P}0-3")]})  # 0 and 1 cleaned
    assert v.ok and v.partitions[0].compacted == 2 and v.partitions[0].lost == 0
    assert "compacted" in v.table().splitlines()[0]
    v = compacted({0: [(1, f"{P}0-1"), (2, f"{P}0-2")]})  # the last of k1 missing: lost
    assert not v.ok and v.partitions[0].lost == 1 and v.partitions[0].compacted == 1
    # a plain run counts the same absences as lost
    assert run({0: [(2, f"{P}0-2"), (3, f"{P}0-3")], 1: []}, acked).partitions[0].lost == 2
    assert "compacted" not in run({0: [], 1: []}, {}).table().splitlines()[0]


def test_the_group_is_excused_only_for_compacted_records():
    from tidewater.tools.chaos.verdict import compacted_away

    acked = {f"{P}0-0": (0, 0), f"{P}0-1": (0, 1), f"{P}0-2": (0, 2)}
    consumed = {0: [(1, f"{P}0-1"), (2, f"{P}0-2")]}
    excused = compacted_away(acked, consumed, P, keys=2)
    assert excused == {(0, 0)}
    group = judge_group("g", acked, consumed={(0, 2)}, committed={}, excused=excused)
    assert not group.ok and group.not_consumed == 1  # (0, 1) is the last of k1: no excuse
    assert judge_group("g", acked, {(0, 1), (0, 2)}, {}, excused).ok


IN = "run1-in-"


def txn_judge(outputs, acked, sent=None):
    return judge_transactional(input_prefix=IN, output_prefix="out-",
                               sent=sent if sent is not None else set(acked), acked=set(acked),
                               outputs=outputs, transactions_committed=3,
                               transactions_aborted=1)


def test_the_transactional_verdict_passes_with_each_acked_inputs_output_once():
    acked = [f"{IN}000000000", f"{IN}000000001"]
    # An unacknowledged input's output is the ambiguity of a failed send (fine); another
    # run's output is ignored.
    v = txn_judge([f"out-{IN}000000001", f"out-{IN}000000000", f"out-{IN}000000002",
                   "out-run0-in-000000000"], acked, sent={*acked, f"{IN}000000002"})
    assert (v.lost, v.duplicated, v.unknown, v.outputs, v.inputs_acked) == (0, 0, 0, 3, 2)
    assert v.ok
    assert "lost 0, duplicated 0" in v.line() and "3 transactions committed, 1 aborted" in v.line()


def test_the_transactional_verdict_counts_lost_duplicated_and_unknown_outputs():
    acked = [f"{IN}000000000", f"{IN}000000001", f"{IN}000000002"]
    v = txn_judge([f"out-{IN}000000000", f"out-{IN}000000000", f"out-{IN}000000000",
                   f"out-{IN}000000001", f"out-{IN}000000009"], acked)
    assert (v.lost, v.duplicated, v.unknown) == (1, 2, 1)
    assert not v.ok
    assert f"lost {IN}000000002" in v.examples and f"dup {IN}000000000 x3" in v.examples


def test_an_input_written_twice_by_the_feeders_client_needs_two_outputs():
    """librdkafka re-sends a batch whose messages timed out under a new epoch from
    sequence 0 (confluentinc/librdkafka#4953): the input topic holds that input twice,
    the app processes both copies, and that is exactly once per input record."""
    acked = [f"{IN}000000000", f"{IN}000000001"]
    inputs = [f"{IN}000000000", f"{IN}000000000", f"{IN}000000001"]
    both = [f"out-{IN}000000000", f"out-{IN}000000000", f"out-{IN}000000001"]
    v = judge_transactional(input_prefix=IN, output_prefix="out-", sent=set(acked),
                            acked=set(acked), outputs=both, inputs=inputs)
    assert (v.lost, v.duplicated, v.inputs_written_twice) == (0, 0, 1) and v.ok
    assert "1 extra copies of inputs sent once" in v.line()
    # A third output of the twice-written input is a duplicate.
    v = judge_transactional(input_prefix=IN, output_prefix="out-", sent=set(acked),
                            acked=set(acked), outputs=[*both, f"out-{IN}000000000"],
                            inputs=inputs)
    assert v.duplicated == 1 and not v.ok
    assert f"dup {IN}000000000 x3 (x2 in the input)" in v.examples
    # Without the input read back, every input counts once (the verdict as before).
    assert txn_judge(both, acked).duplicated == 1


def test_a_transactional_failure_fails_the_whole_verdict_and_shows_in_the_table():
    base = run({0: [(0, f"{P}0-1")], 1: []}, {f"{P}0-1": (0, 0)})
    assert base.ok
    base.transactional = txn_judge([], [f"{IN}000000000"])
    assert not base.ok
    table = base.table()
    assert "transactional: 1 inputs acked, 0 outputs read_committed, lost 1" in table
    assert table.splitlines()[-1] == "VERDICT: FAIL"
    assert base.to_json()["transactional"]["lost"] == 1


def _exposition(active: int, epoch: int) -> str:
    return ("# TYPE tidewater_controller_active_controller gauge\n"
            f"tidewater_controller_active_controller {float(active)}\n"
            "# TYPE tidewater_controller_controller_epoch gauge\n"
            f"tidewater_controller_controller_epoch {float(epoch)}\n"
            "tidewater_controller_controller_epoch_extra 9.0\n")


def test_controller_failovers_are_the_active_epochs_after_the_first():
    samples = {
        "controller": [(1000, _exposition(1, 4)), (2000, _exposition(1, 4)), (5000, _exposition(0, 6))],
        "controller-2": [(1000, _exposition(0, 4)), (3000, _exposition(1, 6)), (4000, _exposition(1, 6))],
        "controller-3": [(3500, _exposition(1, 9)), (900, "")],  # a late leader; a torn scrape
    }
    v = controller_failovers(samples)
    assert v.active_epochs == [(4, "controller"), (6, "controller-2"), (9, "controller-3")]
    assert v.failovers == 2
    assert "2 controller failover(s)" in v.line() and "6 controller-2" in v.line()
    assert controller_failovers({"controller": [(1, _exposition(1, 2))]}).failovers == 0
    assert controller_failovers({"controller": []}).failovers == 0
    # In the verdict: its JSON and its table.
    verdict = run({0: [], 1: []}, {})
    verdict.controllers = v
    assert verdict.to_json()["controllers"]["failovers"] == 2
    assert "controller failover(s)" in verdict.table()
