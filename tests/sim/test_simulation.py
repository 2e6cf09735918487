"""The seeded cluster simulation: invariants hold for many seeds, and the checks can fail.

A failing seed prints how to reproduce it alone:
``cd tests && ../.venv/bin/python -m sim.run --seed N --verbose``.
"""

import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.broker.replication.follower import TruncationStep
from tidewater.broker.replication.leader_state import LeaderPartitionState, PendingIsrChange
from tidewater.broker.replication.replica import ReplicaState

from .cluster import SimConfig, Simulation, SimulationFailure
from .network import CONTROLLER
from .sim_broker import LEADER, BrokerConfig

SEEDS = range(40)
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_invariants_hold(seed):
    result = Simulation(seed).run()
    assert result.committed_batches > 0, "the run committed nothing: it tested nothing"
    assert result.crashes > 0 or result.leader_changes > 0


def test_seed_reproduces_the_same_run_in_a_fresh_process():
    # Different hash seeds: nothing may depend on set/dict order of strings.
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        run = subprocess.run([sys.executable, "-m", "sim.run", "--seed", "3"], cwd=TESTS_DIR,
                             env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        outputs.append([line.split()[:-1] for line in run.stdout.splitlines()])  # minus secs
    assert outputs[0] == outputs[1]


def test_same_seed_same_trace_in_process():
    first, second = Simulation(5, trace_lines=10_000), Simulation(5, trace_lines=10_000)
    assert first.run() == second.run()
    assert list(first._trace) == list(second._trace)


# ---------------------------------------------------------------- broken variants are caught
# Each breaks one rule of the replication reference inside the broker's own core
# (ReplicaState and the LeaderPartitionState it builds); the simulation runs it exactly
# as it runs the product.

class HighWatermarkIgnoresIsr(LeaderPartitionState):
    """Broken HW rule: commits whatever the leader has, as if it were alone."""

    def maybe_advance_high_watermark(self, now_ms):
        if self.log_end_offset > self.high_watermark:
            self.high_watermark = self.log_end_offset
            return True
        return False


class NewLeaderTrustsOldFollowerOffsets(LeaderPartitionState):
    """Broken HW rule: a new leader assumes its ISR followers already hold its whole log."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for follower in self.followers.values():
            if follower.replica_id in self.isr:
                follower.log_end_offset = self.log_end_offset
                follower.has_fetched = True
        self.maybe_advance_high_watermark(kwargs["now_ms"])


class ExpandsIsrBehindHighWatermark(LeaderPartitionState):
    """Broken ISR expansion: any follower that fetches joins, however far behind."""

    def _maybe_expand_isr(self, follower):
        if self.pending_isr is not None or follower.replica_id in self.isr:
            return None
        proposed = self.isr + (follower.replica_id,)
        self.pending_isr = PendingIsrChange(proposed, is_expansion=True)
        return proposed


def with_leader_state(cls):
    return type(f"ReplicaWith{cls.__name__}", (ReplicaState,), {"leader_state_class": cls})


HW_IGNORES_ISR = with_leader_state(HighWatermarkIgnoresIsr)
NEW_LEADER_TRUSTS_OLD_OFFSETS = with_leader_state(NewLeaderTrustsOldFollowerOffsets)
EXPANDS_ISR_BEHIND_HW = with_leader_state(ExpandsIsrBehindHighWatermark)


class TruncatesToHighWatermark(ReplicaState):
    """Broken truncation (pre-KIP-101): ignore the leader's answer, cut to the own HW."""

    def _truncation_step(self, answer):
        return TruncationStep(min(self.high_watermark, self.log.log_end_offset), done=True)

    _diverging_step = _truncation_step


class TruncatesByOffsetOnly(ReplicaState):
    """Broken truncation (KIP-101 without KIP-279): trust the leader's offset, never
    compare epochs."""

    def _truncation_step(self, answer):
        epoch, end_offset = answer
        log_end_offset = self.log.log_end_offset
        if end_offset == -1:
            return TruncationStep(min(self.high_watermark, log_end_offset), done=True)
        return TruncationStep(min(end_offset, log_end_offset), done=True)

    _diverging_step = _truncation_step


class IgnoresLeaderEpochFencing(ReplicaState):
    """Broken fencing (pre-KIP-320): a request's current_leader_epoch is not checked, so a
    leader serves a follower still in an older epoch from its stale position."""

    def check_epoch(self, current_leader_epoch, *, require_leader):
        super().check_epoch(-1, require_leader=require_leader)


SAFETY_WORDS = ("StrongIsr", "committed", "HW went backwards", "epoch went down",
                "not contiguous", "epoch cache")


def first_safety_failure(seeds, replica_class, configure=lambda config: config):
    for seed in seeds:
        try:
            Simulation(seed, configure(SimConfig.for_seed(seed)), replica_class=replica_class).run()
        except SimulationFailure as e:
            message = str(e)
            if any(word in message.splitlines()[0] for word in SAFETY_WORDS):
                return seed, message
    return None, None


def without_last_fetched_epoch(config):
    """Pre-KIP-320 fetches: the leader's epoch fencing is the only guard left."""
    return replace(config, broker=replace(config.broker, send_last_fetched_epoch=False))


# (the rule of replication.md it breaks, the variant, how seeds are set up); the seed that
# catches each is printed by `pytest -s` and listed in docs/design/architecture.md.
BROKEN_VARIANTS = {
    "hw-ignores-isr": (HW_IGNORES_ISR, lambda c: c),
    "hw-new-leader-trusts-old-offsets": (NEW_LEADER_TRUSTS_OLD_OFFSETS, lambda c: c),
    "isr-expands-behind-hw": (EXPANDS_ISR_BEHIND_HW, lambda c: c),
    "truncate-to-hw": (TruncatesToHighWatermark, lambda c: c),
    "fencing-ignores-leader-epoch": (IgnoresLeaderEpochFencing, without_last_fetched_epoch),
}


@pytest.mark.parametrize("name", BROKEN_VARIANTS)
def test_broken_variant_is_caught(name):
    replica_class, configure = BROKEN_VARIANTS[name]
    seed, message = first_safety_failure(range(40), replica_class, configure)
    assert seed is not None, f"the invariant checks did not catch the broken rule {name}"
    print(f"{name}: caught by seed {seed}: {message.splitlines()[0]}")
    first_line = message.splitlines()[0]
    assert first_line.startswith(f"seed {seed} at "), first_line
    assert f"reproduce: Simulation({seed}, <the config below>, " in message
    assert f"replica_class={replica_class.__name__}" in message


# ---------------------------------------------------------------- scripted scenarios

def scripted_config(broker_count, *, min_insync_replicas=1, use_offset_for_leader_epoch=True,
                    send_last_fetched_epoch=True, chaos_ms=6000, replica_lag_time_max_ms=10_000):
    return SimConfig(
        broker_count=broker_count, partition_count=1, chaos_ms=chaos_ms, settle_ms=4000,
        loss_probability=0.0, delay_ms_min=1, delay_ms_max=5, crash_per_broker_per_s=0.0,
        cut_per_s=0.0, produce_per_partition_per_s=0.0, preferred_leader_interval_ms=10**9,
        broker=BrokerConfig(min_insync_replicas=min_insync_replicas,
                            replica_lag_time_max_ms=replica_lag_time_max_ms,
                            use_offset_for_leader_epoch=use_offset_for_leader_epoch,
                            send_last_fetched_epoch=send_last_fetched_epoch))


# (use_offset_for_leader_epoch, send_last_fetched_epoch): how a new follower finds where to cut
TRUNCATION_MODES = {
    "offset-for-leader-epoch": (True, True),
    "diverging-epoch-on-fetch-only": (False, True),
    "offset-for-leader-epoch-only": (True, False),
}


def fast_leader_changes_scenario(sim):
    """KIP-279's divergence: F led epoch 1 without records X gave L in epoch 0.

    X=1 leads epoch 0 and writes 0..2 to everyone, then 3..4 reach only L=3
    (the link X-F is cut). X crashes; F=2 (first in replica order, still in
    the ISR) leads epoch 1 and writes offset 3; F crashes before anyone copies
    it; L leads epoch 2 and writes offset 5. When F returns it asks for epoch
    1: L answers (0, 5), but F's own epoch 0 ended at 3, so F must cut to 3.
    Trusting the offset alone keeps F's epoch-1 record at 3 under L's epoch-0
    record at 4.
    """
    tp = ("t", 0)
    for at in (300, 350, 400):
        sim.at(at, lambda: sim.produce(tp))
    sim.at(1000, lambda: sim.cut(1, 2, 10**9))
    sim.at(1050, lambda: sim.produce(tp))
    sim.at(1100, lambda: sim.produce(tp))
    sim.at(1300, lambda: sim.cut(2, 3, 10**9))
    sim.at(1305, lambda: sim.crash(1, lose_unflushed=False))
    sim.at(2200, lambda: sim.produce(tp))   # to F, leader in epoch 1
    sim.at(2400, lambda: sim.crash(2, lose_unflushed=False))
    sim.at(3300, lambda: sim.produce(tp))   # to L, leader in epoch 2
    sim.at(3500, sim.heal)
    sim.at(3500, lambda: sim.restart(2))
    sim.at(3600, lambda: sim.restart(1))


@pytest.mark.parametrize("mode", TRUNCATION_MODES)
def test_fast_leader_changes_converge(mode):
    ofle, last_fetched = TRUNCATION_MODES[mode]
    sim = Simulation(0, scripted_config(3, use_offset_for_leader_epoch=ofle,
                                        send_last_fetched_epoch=last_fetched))
    fast_leader_changes_scenario(sim)
    sim.run()
    leader_log = sim.brokers[3].partitions[("t", 0)].log
    assert [(b.base_offset, b.epoch) for b in leader_log.batches] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 2)]
    assert leader_log.cache.entries() == [(0, 0), (2, 5)]


def test_fast_leader_changes_catch_offset_only_truncation():
    # Without KIP-320's check on fetch, trusting the offset alone lets F keep its
    # epoch-1 record at 3 and append L's epoch-0 record at 4 after it.
    sim = Simulation(0, scripted_config(3, send_last_fetched_epoch=False),
                     replica_class=TruncatesByOffsetOnly)
    fast_leader_changes_scenario(sim)
    with pytest.raises(SimulationFailure, match="epoch went down"):
        sim.run()


def test_offset_only_truncation_livelocks_against_kip320_leader():
    # With last_fetched_epoch the leader keeps answering diverging_epoch (0, 5),
    # offset-only truncation never cuts, and the follower never catches up.
    sim = Simulation(0, scripted_config(3, use_offset_for_leader_epoch=False),
                     replica_class=TruncatesByOffsetOnly)
    fast_leader_changes_scenario(sim)
    with pytest.raises(SimulationFailure, match="did not recover"):
        sim.run()


@pytest.mark.parametrize("mode", TRUNCATION_MODES)
def test_follower_without_the_leaders_epoch_asks_again(mode):
    """Three leaders in a row, each missing the previous one's last record.

    Epoch 0 (leader 1) writes 0..4 everywhere. Epoch 1 (leader 2) writes 5,
    copied by 3 only. Epoch 2 (leader 1, cut off from 2 and 3) writes its own
    5. Epoch 3 (leader 3) writes 6. Broker 1 asks with epoch 2, gets (1, 6),
    but never had epoch 1: its own answer is (0, 5), so it cuts to 5 and asks
    again with epoch 0 (reference rule 2, E_F != E_L).
    """
    ofle, last_fetched = TRUNCATION_MODES[mode]
    sim = Simulation(0, scripted_config(3, use_offset_for_leader_epoch=ofle,
                                        send_last_fetched_epoch=last_fetched))
    tp = ("t", 0)
    for i in range(5):
        sim.at(300 + 20 * i, lambda: sim.produce(tp))
    sim.at(1000, lambda: sim.cut(1, CONTROLLER, 700))      # 1 fenced: 2 leads epoch 1
    sim.at(2500, lambda: sim.cut(1, 2, 10**9))
    sim.at(2600, lambda: sim.produce(tp))                    # 2 writes 5, only 3 copies it
    sim.at(2900, lambda: (sim.cut(2, CONTROLLER, 10**9), sim.cut(2, 3, 10**9),
                          sim.cut(1, 3, 10**9)))           # 2 fenced: 1 leads epoch 2
    sim.at(3700, lambda: sim.produce(tp))                    # 1 writes its own 5
    sim.at(3900, lambda: sim.cut(1, CONTROLLER, 10**9))    # 1 fenced: 3 leads epoch 3
    sim.at(4600, sim.heal)
    sim.at(4700, lambda: sim.produce(tp))
    result = sim.run()
    if ofle:
        assert result.counters.get("truncation_ask_again") == 1
    else:
        assert result.counters.get("diverging_not_done") == 1
    for broker in sim.brokers.values():
        log = broker.partitions[tp].log
        assert [(b.base_offset, b.epoch) for b in log.batches] == [
            (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 3)]
        assert log.cache.entries() == [(0, 0), (1, 5), (3, 6)]


def test_random_runs_exercise_the_decision_paths():
    totals = Counter()
    for seed in range(8):
        totals.update(Simulation(seed).run().counters)
    for path in ("truncation_done", "truncation_to_high_watermark", "diverging_done",
                 "follower_truncations", "isr_proposals_expand", "isr_proposals_shrink",
                 "isr_expands", "isr_shrinks", "leader_elections", "produce NONE",
                 "produce NOT_ENOUGH_REPLICAS", "produce NOT_LEADER_OR_FOLLOWER",
                 "produce REQUEST_TIMED_OUT", "serve fetch FENCED_LEADER_EPOCH"):
        assert totals[path] > 0, f"no run took the path {path!r}: {totals}"


def test_unclean_shutdown_of_both_keeps_committed_records():
    """replication.md scenario 2: both brokers stop, one loses the tail of its segment.

    Broker 2 comes back first without committed records 5..9. Its new
    registration takes it out of the ISR, so it is never elected: the
    partition stays offline (writes are refused) until broker 1 returns, and
    then broker 2 copies 5..9 back.
    """
    sim = Simulation(0, scripted_config(2))
    tp = ("t", 0)
    for i in range(10):
        sim.at(300 + 20 * i, lambda: sim.produce(tp))
    sim.at(1000, lambda: sim.crash(2, keep_offset=5))   # the follower's file lost 5..9
    sim.at(1000, lambda: sim.crash(1, lose_unflushed=False))
    sim.at(1200, lambda: sim.restart(2))
    for i in range(9):
        sim.at(1400 + 200 * i, lambda: sim.produce(tp))
    sim.at(3500, lambda: sim.restart(1))
    result = sim.run()
    assert result.excused_losses == []
    logs = [b.partitions[tp].log for b in sim.brokers.values()]
    assert logs[0].batches == logs[1].batches
    assert logs[0].log_end_offset >= 10
    # Broker 2 lost committed records in the crash: it must not have led before catching up.
    assert [b.payload_id for b in logs[0].batches[:10]] == list(range(1, 11))


def test_fast_leader_bounces_keep_both_logs_equal():
    """replication.md scenario 4: rounds of {write 1, bounce follower, bounce leader}."""
    sim = Simulation(0, scripted_config(2, chaos_ms=5 * 3000 + 500))
    tp = ("t", 0)
    snapshots = []

    def bounce(role):
        leader = sim.controller.records[tp].leader
        victim = leader if role == "leader" else next(b for b in sim.brokers if b != leader)
        sim.crash(victim, lose_unflushed=False)
        sim.at(sim.now_ms + 100, lambda: sim.restart(victim))

    def snapshot():
        logs = [b.partitions[tp].log for b in sim.brokers.values()]
        snapshots.append(([log.log_end_offset for log in logs], logs[0].batches == logs[1].batches,
                          sim.checker.stats.acked))

    for round_start in range(300, 300 + 5 * 3000, 3000):
        sim.at(round_start, lambda: sim.produce(tp))
        sim.at(round_start + 500, lambda: bounce("follower"))
        sim.at(round_start + 1500, lambda: bounce("leader"))
        sim.at(round_start + 2900, snapshot)
    sim.run()
    assert len(snapshots) == 5
    for written, (leos, equal, acked) in enumerate(snapshots, start=1):
        assert equal and leos == [written, written], snapshots
        assert acked == written
    assert any(b.partitions[tp].role == LEADER for b in sim.brokers.values())


def test_default_config_is_valid():
    config = SimConfig.for_seed(1)
    assert replace(config, partition_count=1).partition_count == 1
    assert 1 <= config.partition_count <= 3


# ---------------------------------------------------------------- generated set-ups

@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), min_insync_replicas=st.integers(1, 3),
       mode=st.sampled_from(sorted(TRUNCATION_MODES)), partition_count=st.integers(1, 3),
       loss_probability=st.sampled_from([0.0, 0.05, 0.1]),
       crash_per_broker_per_s=st.sampled_from([0.2, 1.0]),
       preferred_leader_interval_ms=st.sampled_from([200, 2000]))
def test_generated_setups_keep_invariants(seed, min_insync_replicas, mode, partition_count,
                                          loss_probability, crash_per_broker_per_s,
                                          preferred_leader_interval_ms):
    ofle, last_fetched = TRUNCATION_MODES[mode]
    base = SimConfig.for_seed(seed)
    config = replace(
        base, chaos_ms=5000, settle_ms=4000, partition_count=partition_count,
        loss_probability=loss_probability, crash_per_broker_per_s=crash_per_broker_per_s,
        preferred_leader_interval_ms=preferred_leader_interval_ms,
        broker=replace(base.broker, min_insync_replicas=min_insync_replicas,
                       use_offset_for_leader_epoch=ofle, send_last_fetched_epoch=last_fetched))
    Simulation(seed, config).run()  # SimulationFailure names the seed and the config
