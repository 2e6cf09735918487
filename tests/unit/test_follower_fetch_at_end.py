"""The short way a leader records a follower fetch that asks what the previous one asked
(``ReplicaState.on_follower_fetch_at_end``): whenever it says it applies, the full
``on_follower_fetch`` would have answered the same and left the same state."""

from __future__ import annotations

import copy
import re
from dataclasses import fields

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_replica_state import PropertyHarness, event_lines

_FETCH = re.compile(r"follower-fetch replica=(\d+) epoch=(\d+) offset=(\d+)")


def leader_view(replica) -> tuple:
    leader = replica.leader
    return (leader.high_watermark, leader.isr, leader.pending_isr,
            {r: copy.copy(f) for r, f in leader.followers.items()})


def replay(lines: list[str]) -> int:
    """Play a random life; before each follower fetch, ask the short way on a copy of the
    replica, and where it applies check the full fetch against it. Returns how often it
    applied."""
    h = PropertyHarness()
    applied = 0
    for line in lines:
        match = _FETCH.match(line)
        replica = h.replica
        if match is None or replica is None or replica.leader is None:
            h.run(line)
            continue
        replica_id, epoch, offset = (int(g) for g in match.groups())
        before = leader_view(replica)
        short = replica.on_follower_fetch_at_end(replica_id, epoch, offset, -1, h.now_ms,
                                                 broker_epoch=-1, log_start_offset=-1)
        after_short = leader_view(replica)
        if short:  # put the follower back as it was, for the full fetch
            follower = replica.leader.followers[replica_id]
            for name in fields(follower):
                setattr(follower, name.name, getattr(before[3][replica_id], name.name))
        assert leader_view(replica) == before  # declined: nothing changed
        out = h.run(line.replace(" isr-eligible=false", ""))  # eligibility: moot in the ISR
        if not short:
            continue
        applied += 1
        assert out[0] == f"answer: records from {offset}, hw={offset}", out
        assert not any(line.startswith(("alter-partition", "completed", "hw-moved"))
                       for line in out), out
        assert leader_view(h.replica) == after_short
    return applied


@st.composite
def settled_lives(draw) -> list[str]:
    """Lives where followers fetch at the log end again and again (where the short way
    applies), with what can make it not apply between: appends, ISR and epoch changes,
    a follower behind, time passing (lag), min.insync.replicas."""
    lines = [f"init broker=1 min-isr={draw(st.integers(1, 3))} lag=500", "now 0",
             "leader-and-isr leader=1 epoch=1 pe=next replicas=1,2,3 isr=1,2,3"]
    leader_epoch, leo, now = 1, 0, 0
    for _ in range(draw(st.integers(5, 40))):
        now += draw(st.sampled_from([0, 10, 300, 600]))
        lines.append(f"now {now}")
        kind = draw(st.sampled_from(["fetch", "fetch", "fetch", "fetch", "append", "isr",
                                     "lai", "behind", "tick"]))
        if kind == "fetch":
            lines.append(f"follower-fetch replica={draw(st.sampled_from([2, 3]))} "
                         f"epoch={leader_epoch} offset={leo}")
        elif kind == "append":
            leo += draw(st.integers(1, 3))
            lines.append(f"append leo={leo} acks=1")
        elif kind == "behind":
            lines.append(f"follower-fetch replica={draw(st.sampled_from([2, 3]))} "
                         f"epoch={leader_epoch} offset={draw(st.integers(0, leo))}")
        elif kind == "tick":
            lines.append("tick")
        else:
            if kind == "lai":
                leader_epoch += 1
            isr = sorted({1} | draw(st.sets(st.sampled_from([2, 3]))))
            lines.append(f"leader-and-isr leader=1 epoch={leader_epoch} pe=next "
                         f"replicas=1,2,3 isr={','.join(map(str, isr))}")
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lines())
def test_the_short_way_changes_what_the_full_fetch_changes(lines):
    replay(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settled_lives())
def test_the_short_way_changes_what_the_full_fetch_changes_where_it_applies(lines):
    replay(lines)


def test_the_short_way_applies_to_a_caught_up_isr_follower_only():
    lines = ["init broker=1 min-isr=1 lag=500", "now 0",
             "leader-and-isr leader=1 epoch=1 pe=next replicas=1,2,3 isr=1,2",
             "append leo=3 acks=1",
             "follower-fetch replica=2 epoch=1 offset=3",  # catches up: HW 3
             "now 10",
             "follower-fetch replica=2 epoch=1 offset=3",  # again: the short way
             "follower-fetch replica=3 epoch=1 offset=3",  # not in the ISR: in full
             "follower-fetch replica=3 epoch=1 offset=3"]  # its expansion pending: in full
    assert replay(lines) == 1
