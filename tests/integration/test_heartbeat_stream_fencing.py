"""The heartbeat stream as a crash detector, with real controller and broker processes.

The controller runs with a session timeout far longer than any wait here, so
only the end of a broker's ``BrokerHeartbeats`` stream can explain a fence.
"""

from __future__ import annotations

import signal
import time

import pytest
from conftest import WAIT_SCALE, produce, wait_for

from tidewater.proto import tidewater_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SESSION_MS = 120_000  # longer than every deadline below, WAIT_SCALE included
WAIT_S = 20  # wait_for stretches it by WAIT_SCALE
assert WAIT_S * WAIT_SCALE * 1000 < SESSION_MS, "raise SESSION_MS with TIDE_TEST_WAIT_SCALE"
LONG_SESSION = {"broker.session.timeout.ms": str(SESSION_MS)}


def fenced_ids(cluster) -> set[int]:
    return {b.broker_id for b in cluster.describe().brokers if b.fenced}


def controller_log(cluster) -> str:
    return cluster.controller.log_path.read_text(errors="replace")


def test_sigkilled_leader_is_fenced_by_its_stream_not_its_session(cluster):
    c = cluster(3, broker_settings=LONG_SESSION, controller_settings=LONG_SESSION)
    c.create_topic("t", replication_factor=3, configs={"min.insync.replicas": "2"})
    leader = c.wait_leader_ready("t", isr_size=3)
    assert produce(leader, "t", [b"before"]).error_code == pb.NONE
    old = c.partition_state("t")

    killed_at = time.monotonic()
    leader.proc.signal(signal.SIGKILL)
    wait_for(lambda: leader.broker_id in fenced_ids(c), WAIT_S, message="killed leader fenced")
    new_leader = c.wait_leader_ready("t", timeout_s=WAIT_S)
    # Semantic, not a speed check: the session could not have expired yet.
    assert (time.monotonic() - killed_at) * 1000 < SESSION_MS
    state = c.partition_state("t")
    assert new_leader.broker_id != leader.broker_id
    assert state.leader_epoch == old.leader_epoch + 1 and leader.broker_id not in state.isr
    assert f"broker {leader.broker_id} fenced: heartbeat stream closed" in controller_log(c)
    assert produce(new_leader, "t", [b"after"]).error_code == pb.NONE

    # The same broker id back as a new process: registered and unfenced again,
    # and its old stream (already gone) cannot fence the new incarnation.
    leader.proc.start()
    c.wait_registered([leader.broker_id])
    c.wait_leader_ready("t", isr_size=3, timeout_s=WAIT_S)
    assert leader.broker_id not in fenced_ids(c)


def test_controlled_shutdown_and_controller_restart_fence_nobody(cluster):
    c = cluster(3, broker_settings=LONG_SESSION, controller_settings=LONG_SESSION)
    c.create_topic("t", replication_factor=3)
    leader = c.wait_leader_ready("t", isr_size=3)

    # The controller's own restart: streams break on the brokers' side, they
    # reconnect to the new controller, nobody is fenced.
    assert c.controller.terminate() == 0
    c.controller.start()
    wait_for(lambda: c.describe().controller_epoch >= 2, WAIT_S, message="controller back")
    for broker in c.brokers.values():
        wait_for(lambda b=broker: "heartbeat stream" in b.proc.log_path.read_text(errors="replace"),
                 WAIT_S, message=f"broker {broker.broker_id} noticed the stream end")
    assert not fenced_ids(c)
    assert produce(leader, "t", [b"x"]).error_code == pb.NONE  # still leading, in its epoch

    # Controlled shutdown (SIGTERM): the broker closes its stream after should_shutdown;
    # that is no crash, so the controller does not fence it (only its session would).
    assert leader.proc.terminate() == 0
    assert "controlled shutdown done" in leader.proc.log_path.read_text(errors="replace")
    new_leader = c.wait_leader_ready("t", timeout_s=WAIT_S)
    assert new_leader.broker_id != leader.broker_id
    described = {b.broker_id: b for b in c.describe().brokers}
    assert not described[leader.broker_id].fenced
    assert described[leader.broker_id].in_controlled_shutdown
    assert "heartbeat stream closed" not in controller_log(c)
