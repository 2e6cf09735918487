"""Random command sequences against the controller state machine; invariants after each step.

Each example runs on a real metadata log and ends with a restart that must
replay to the same image.
"""

import tempfile
from pathlib import Path

from controller_harness import Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidewater.controller.election import NO_LEADER
from tidewater.proto import tidewater_pb2 as pb

BROKERS = (1, 2, 3)

steps = st.lists(st.one_of(
    st.tuples(st.just("register"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("heartbeat"), st.sampled_from(BROKERS)),
    st.tuples(st.just("silence"), st.sets(st.sampled_from(BROKERS), max_size=2)),
    st.tuples(st.just("create"), st.integers(0, 2), st.integers(1, 3), st.integers(1, 3),
              st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 2)),
    st.tuples(st.just("alter"), st.integers(0, 2), st.randoms(use_true_random=False),
              st.booleans()),
    st.tuples(st.just("shutdown"), st.sampled_from(BROKERS)),
    st.tuples(st.just("preferred"),),
    st.tuples(st.just("restart"),),
), min_size=5, max_size=30)


def check_invariants(h, previous):
    machine = h.machine
    live = machine.live_broker_ids()
    unfenced = machine.metadata.unfenced_broker_ids()
    current = {}
    for p in machine.metadata.all_partitions():
        key = (p.topic, p.partition)
        current[key] = p
        assert p.isr and set(p.isr) <= set(p.replicas)
        if p.leader != NO_LEADER:
            assert p.leader in p.isr
            assert p.leader in live, (p, live)
        else:
            unclean = machine.config.unclean_allowed(machine.metadata.topics[p.topic].configs)
            candidates = set(p.replicas if unclean else p.isr)
            assert not candidates & live, (p, live)
        for member in p.isr:
            assert member in unfenced or p.isr == (member,), (p, unfenced)
        old = previous.get(key)
        if old is not None:
            assert p.leader_epoch >= old.leader_epoch
            assert p.partition_epoch >= old.partition_epoch
            if p.leader != old.leader:
                assert p.leader_epoch > old.leader_epoch
            if p != old:
                assert p.partition_epoch > old.partition_epoch
    return current


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_random_operations_keep_invariants_and_replay(operations):
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), settings=["num.partitions=2"])
        for broker in BROKERS:  # start from a running cluster so topics can be created
            h.register(broker, incarnation="inc-1")
        incarnations = dict.fromkeys(BROKERS, 1)
        silent = set()
        previous = {}
        try:
            for op in operations:
                kind = op[0]
                if kind == "register":
                    _, broker, new_process = op
                    if new_process or broker not in incarnations:
                        incarnations[broker] = incarnations.get(broker, 0) + 1
                    h.register(broker, incarnation=f"inc-{incarnations[broker]}")
                    silent.discard(broker)
                elif kind == "heartbeat":
                    if op[1] in h.epochs:
                        h.heartbeat(op[1])
                        silent.discard(op[1])
                elif kind == "silence":
                    silent = set(op[1])
                    h.advance(3500, *silent)  # past the session timeout: silent ones are fenced
                elif kind == "create":
                    _, n, partitions, rf, unclean = op
                    h.create(f"t{n}", partitions=partitions, rf=rf,
                             configs={"unclean.leader.election.enable": str(unclean).lower()})
                elif kind == "delete":
                    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=[f"t{op[1]}"]))
                    previous = {k: v for k, v in previous.items() if k[0] != f"t{op[1]}"}
                elif kind == "alter":
                    _, n, rnd, stale = op
                    p = h.partition(f"t{n}", 0)
                    if p is not None and p.leader != NO_LEADER:
                        others = [r for r in p.replicas if r != p.leader]
                        new_isr = [p.leader] + rnd.sample(others, rnd.randint(0, len(others)))
                        h.alter(p.leader, p, new_isr,
                                partition_epoch=p.partition_epoch - 1 if stale else None)
                elif kind == "shutdown":
                    if op[1] in h.epochs:
                        h.heartbeat(op[1], want_shutdown=True)
                elif kind == "preferred":
                    h.owner.run_now(h.machine.preferred_leader_check)
                elif kind == "restart":
                    epochs = h.epochs
                    h = h.restart()
                    h.epochs = epochs
                previous = check_invariants(h, previous)
            before = h.describe()
            epochs = h.epochs
            h = h.restart()
            h.epochs = epochs
            after = h.describe()
            before.controller_epoch = after.controller_epoch
            # A restart may only elect leaders for partitions left offline by
            # brokers that were shutting down; everything else is identical.
            elected = 0
            for t_before, t_after in zip(before.topics, after.topics, strict=True):
                for p_before, p_after in zip(t_before.partitions, t_after.partitions,
                                             strict=True):
                    if p_before != p_after:
                        assert p_before.leader == -1 and p_after.leader != -1
                        p_before.CopyFrom(p_after)
                        elected += 1
            assert 0 <= after.unclean_elections_total - before.unclean_elections_total <= elected
            before.unclean_elections_total = after.unclean_elections_total
            for b in before.brokers:
                b.in_controlled_shutdown = False
            assert after == before
            check_invariants(h, previous)
        finally:
            h.log.close()
