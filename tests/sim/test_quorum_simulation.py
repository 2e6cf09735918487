"""The cluster simulation with a quorum of 3 controllers (``sim_quorum.py``).

A failing seed prints how to reproduce it alone:
``cd tests && ../.venv/bin/python -m sim.run --controllers 3 --seed N --verbose``.
"""

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tidewater.broker.controller_link.controller_choice import ControllerChoice
from tidewater.controller.quorum.metadata_app import encode_record
from tidewater.controller.quorum.owner import QuorumOwner, scratch_copy
from tidewater.controller.raft import Entry, EntryKind
from tidewater.controller.state_machine import Tx

from .cluster import SimConfig, Simulation, SimulationFailure
from .sim_controller import RUNNING

TESTS_DIR = Path(__file__).resolve().parents[1]


def test_quorum_invariants_hold_through_controller_faults():
    totals = {"controller faults": 0, "epochs with an active controller": 0,
              "controller moved": 0}
    for seed in range(4):
        sim = Simulation(seed, SimConfig.quorum_for_seed(seed))
        result = sim.run()
        assert result.committed_batches > 0, f"seed {seed} committed nothing: it tested nothing"
        totals["controller faults"] += (result.controller_crashes
                                        + result.metadata_write_failures
                                        + result.counters["quorum: controller cuts"])
        totals["epochs with an active controller"] += len(sim.quorum_checker.active_of_epoch)
        totals["controller moved"] += result.counters["controller moved"]
    # Controllers failed, leadership moved between them, and the brokers followed it.
    assert totals["controller faults"] > 4, totals
    assert totals["epochs with an active controller"] > 4, totals
    assert totals["controller moved"] > 0, totals


def test_quorum_seed_reproduces_the_same_run_in_a_fresh_process():
    # The owners run on an asyncio loop: its order must not depend on anything but the seed.
    seed = 1
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        run = subprocess.run([sys.executable, "-m", "sim.run", "--controllers", "3", "--seed",
                              str(seed), "--verbose"],
                             cwd=TESTS_DIR, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        outputs.append([line.rsplit(None, 1)[0] if line.startswith((f"{seed:>6} ", "total:"))
                        else line for line in run.stdout.splitlines()])
    assert outputs[0] == outputs[1]
    assert any("active (controller epoch" in line for line in outputs[0])


def test_active_controller_crashes_and_brokers_follow_the_next():
    """No random controller faults: the active controller is killed twice; each time
    another takes over, the brokers move to it and acks=all writes go on."""
    config = replace(SimConfig.quorum_for_seed(5), controller_crash_per_s=0.0,
                     controller_cut_per_s=0.0, metadata_write_failure_per_s=0.0,
                     crash_per_broker_per_s=0.0, cut_per_s=0.0, recreate_per_s=0.0)
    sim = Simulation(5, config)
    acked_at_crash = []

    def crash_active():
        active = [c for c in sim.quorum.values() if c.state == RUNNING and c.active_epoch]
        assert len(active) == 1, [c.active_epoch for c in sim.quorum.values()]
        acked_at_crash.append(sim.checker.stats.acked)
        active[0].crash(sim.now_ms)

    sim.at(3000, crash_active)
    sim.at(6000, crash_active)
    result = sim.run()
    assert len(sim.quorum_checker.active_of_epoch) >= 3, sim.quorum_checker.active_of_epoch
    assert result.acked > acked_at_crash[1] > acked_at_crash[0] > 0, (acked_at_crash,
                                                                      result.acked)
    assert result.counters["controller moved"] >= 2 * config.broker_count, result.counters


class StandbyDecidesAsActive(QuorumOwner):
    """Broken: a standby takes the leader's LEADER_CHANGE for its own, and so answers
    brokers as the active controller (from its image, for commands that write nothing)."""

    def on_applied(self, entry: Entry) -> None:
        if entry.kind is EntryKind.LEADER_CHANGE and not self.active_epoch:
            self._leader_epoch = entry.epoch
        super().on_applied(entry)


class AnswersBeforeCommit(QuorumOwner):
    """Broken: a command is answered (and its effects routed) once its records are
    proposed, before they commit; the next command runs before they apply."""

    async def _execute(self, command):
        shell = self.shell
        epoch = self.active_epoch
        if shell is None or not epoch:
            raise self._not_active()
        real = self.machine.metadata
        scratch = scratch_copy(real)
        tx = Tx(scratch, shell.node.log_end_offset)
        self.machine.metadata = scratch
        try:
            result = command(tx, self._clock_ms())
        finally:
            self.machine.metadata = real
        if tx.records:
            proposal = asyncio.ensure_future(shell.propose([encode_record(r) for r in tx.records]))
            proposal.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.sleep(0)  # the proposal is appended; its commit is not awaited
        self._on_commit(tx.effects)
        return result


# name -> (Simulation arguments, pinned first seed of 0..19 that catches it)
BROKEN_QUORUM_VARIANTS = {
    "standby-decides-as-active": ({"quorum_owner_class": StandbyDecidesAsActive}, 0),
    "answers-before-commit": ({"quorum_owner_class": AnswersBeforeCommit}, 0),
}


@pytest.mark.parametrize("name", BROKEN_QUORUM_VARIANTS)
def test_broken_quorum_variant_is_caught(name):
    variant, pinned_seed = BROKEN_QUORUM_VARIANTS[name]
    caught = None
    for seed in range(20):
        try:
            Simulation(seed, SimConfig.quorum_for_seed(seed), **variant).run()
        except SimulationFailure as e:
            caught = (seed, str(e))
            break
    assert caught is not None, f"the checks did not catch the broken rule {name}"
    seed, message = caught
    assert seed == pinned_seed, (
        f"{name} is now first caught by seed {seed}, not {pinned_seed} (the random runs "
        f"changed): update BROKEN_QUORUM_VARIANTS and docs/design/architecture.md. "
        f"{message.splitlines()[0]}")
    for argument, value in variant.items():
        assert f"{argument}={value.__name__}" in message
    # The product passes the same seed and set-up: the broken rule is what failed.
    Simulation(seed, SimConfig.quorum_for_seed(seed)).run()


def test_controller_choice_follows_hints_and_the_active_controller():
    choice = ControllerChoice([1, 2, 3])
    assert choice.current_id == 1
    assert choice.on_unavailable(3) and choice.current_id == 3  # the standby's hint
    assert choice.on_unavailable(3) and choice.current_id == 1  # named itself: round the list
    assert choice.on_unavailable(-1) and choice.current_id == 2
    assert not choice.follow_active(2) and choice.current_id == 2  # already there
    assert not choice.follow_active(7) and choice.current_id == 2  # not a listed controller
    assert choice.follow_active(3) and choice.current_id == 3
    single = ControllerChoice([-1])
    assert not single.on_unavailable(2) and not single.follow_active(2)
    assert single.current_id == -1

