"""The Raft quorum simulation: invariants hold over many seeds, and each broken variant of the
core is caught by random search within a step budget (the checks can fail).

Reproduce a seed: ``cd tests && ../.venv/bin/python -m sim.raft_run --seed N --verbose``.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tidewater.controller.raft import RaftNode
from tidewater.controller.raft.storage import RaftStorage

from .raft_cluster import RaftSimConfig, RaftSimulation, RaftSimulationFailure, random_config

pytestmark = pytest.mark.timeout(600)

SEEDS = range(1000, 1024)
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_invariants_hold(seed):
    result = RaftSimulation(seed).run()
    assert result.committed > 0, "nothing was committed: the run tested nothing"
    assert result.elections >= 1
    assert result.crashes or result.partitions or result.messages_dropped, result


def test_five_nodes_with_wipes_snapshots_and_voter_changes():
    totals = {"wipes": 0, "snapshots_installed": 0, "voter_changes": 0, "disk_failures": 0}
    for seed in range(2000, 2006):
        config = random_config(random.Random(seed), nodes=5, wipe_probability=0.5,
                               snapshot_probability=0.02, disk_failure_probability=0.005,
                               crash_probability=0.006)
        result = RaftSimulation(seed, config).run()
        for name in totals:
            totals[name] += getattr(result, name)
    assert all(totals.values()), totals


# ---- broken variants: each must be caught ------------------------------------------


class VoteIgnoresLogEnd(RaftNode):
    def _candidate_log_is_up_to_date(self, last_epoch: int, log_end_offset: int) -> bool:
        return True


class CommitByMinority(RaftNode):
    def _majority_end_offset(self) -> int:
        return self._durable_end  # the leader alone


class CommitEarlierEpochByCounting(RaftNode):
    def _may_commit(self, offset: int) -> bool:
        return True  # Raft figure 8: an earlier epoch's entry counted as committed


def find_violation(node_class: type[RaftNode], want: tuple[str, ...], *, steps_budget: int,
                   **overrides: object) -> RaftSimulationFailure:
    """Run seeds from 0 until a run fails with a message containing one of ``want``."""
    steps = seed = 0
    seen = []
    while steps < steps_budget:
        config = random_config(random.Random(seed), **overrides)
        simulation = RaftSimulation(seed, config, node_class=node_class)
        try:
            simulation.run()
        except RaftSimulationFailure as failure:
            if any(w in str(failure.cause) for w in want):
                return failure
            seen.append(str(failure.cause)[:80])
        steps += simulation.result.steps
        seed += 1
    raise AssertionError(f"{node_class.__name__}: no {want} in {steps} steps (seeds 0..{seed - 1}); "
                         f"other failures: {seen}")


def test_a_vote_that_ignores_log_end_is_caught():
    find_violation(VoteIgnoresLogEnd, ("completeness", "state machine safety"),
                   steps_budget=200_000)


def test_a_commit_by_a_minority_is_caught():
    find_violation(CommitByMinority, ("completeness", "state machine safety"),
                   steps_budget=200_000)


def test_a_commit_of_an_earlier_epoch_by_counting_is_caught():
    # Figure 8 needs a follower that holds the earlier epoch's entry but not the new
    # leader's LEADER_CHANGE entry when the leader dies: one entry per fetch, and a
    # request timeout below the longest round trip (late answers are dropped), keep
    # that window open.
    raft = replace(RaftSimConfig().raft, fetch_timeout_ms=600, election_timeout_ms=300,
                   request_timeout_ms=150, fetch_entries_max=1)
    find_violation(CommitEarlierEpochByCounting, ("completeness", "state machine safety"),
                   steps_budget=300_000, raft=raft)


def test_a_voter_that_forgets_its_vote_is_caught():
    # A wiped disk taken for the voter it was (what KIP-853's directory id prevents): it
    # votes a second time in an epoch, and two nodes lead it.
    find_violation(RaftNode, ("election safety", "two leaders", "second vote"),
                   steps_budget=200_000, wipe_keeps_directory_id=True, wipe_probability=0.8,
                   crash_probability=0.01, crash_mid_ready_probability=0.02, down_ms_max=500)


class SendsBeforePersisting(RaftSimulation):
    """A broken shell: the quorum state reaches the disk only after the messages left."""

    def _persist(self, node_id, ready):
        if ready.quorum_state is None:
            return super()._persist(node_id, ready)
        return super()._persist(node_id, replace(ready, quorum_state=None))


def test_a_vote_sent_before_it_is_durable_is_caught():
    with pytest.raises(RaftSimulationFailure, match="grants epoch"):
        SendsBeforePersisting(0).run()


def test_a_seed_reproduces_the_same_run_in_a_fresh_process():
    # Different hash seeds: nothing may depend on the hashing of str or bytes.
    outputs = []
    for hash_seed in ("1", "2"):
        run = subprocess.run([sys.executable, "-m", "sim.raft_run", "--seed", "1004", "--verbose"],
                             cwd=TESTS_DIR, env=dict(os.environ, PYTHONHASHSEED=hash_seed),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        # the seed's line and the total end with the seconds they took: compare the rest
        outputs.append([line.rsplit(None, 1)[0] if line.startswith((f"{1004:>7} ", "raft sim:"))
                        else line for line in run.stdout.splitlines()])
    assert outputs[0] == outputs[1]
    assert any("leads epoch" in line for line in outputs[0])


class FileBackedSimulation(RaftSimulation):
    """The same runs with every node's Ready also carried out by the real RaftStorage in a
    directory; each restart opens it and must find exactly what the simulated disk holds."""

    def __init__(self, seed: int, config: RaftSimConfig, root: Path):
        self.root = root
        self.storages: dict[int, RaftStorage] = {}
        self.reopened = 0
        super().__init__(seed, config)

    def _start(self, node_id: int) -> None:
        disk = self.disks[node_id]
        directory = self.root / f"node-{node_id}"
        if not (directory / "quorum-state").exists():
            RaftStorage.format(directory, node_id, self.bootstrap_voters,
                               directory_id=disk.directory_id)
        storage = RaftStorage.open(directory)
        assert storage.local_directory_id == disk.directory_id
        assert storage.quorum_state == disk.quorum_state
        assert storage.snapshot == disk.snapshot
        assert (storage.log_start_offset, storage.entries) == (disk.log_start_offset, disk.log)
        self.storages[node_id] = storage
        self.reopened += 1
        super()._start(node_id)

    def _crash(self, node_id: int, why: str) -> None:
        self.storages.pop(node_id).close()
        before = self.disks[node_id]
        super()._crash(node_id, why)
        if self.disks[node_id] is not before:
            shutil.rmtree(self.root / f"node-{node_id}")  # the wipe

    def _persist(self, node_id, ready):
        if not super()._persist(node_id, ready):
            return False
        self.storages[node_id].carry_out(ready)
        return True


def test_the_real_storage_holds_what_the_simulated_disk_holds(tmp_path):
    # Failed writes tear the simulated disk only: they are the recovery tests' business.
    totals = {"crashes": 0, "wipes": 0, "snapshots_taken": 0, "snapshots_installed": 0,
              "voter_changes": 0}
    reopened = 0
    for seed in range(3000, 3006):
        config = random_config(random.Random(seed), disk_failure_probability=0.0,
                               crash_probability=0.01, wipe_probability=0.3,
                               snapshot_probability=0.02)
        simulation = FileBackedSimulation(seed, config, tmp_path / str(seed))
        result = simulation.run()
        assert result.committed > 0
        reopened += simulation.reopened
        for name in totals:
            totals[name] += getattr(result, name)
    assert all(totals.values()) and reopened > 20, (totals, reopened)
