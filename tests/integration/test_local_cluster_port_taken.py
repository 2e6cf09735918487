"""`tide cluster up` with free ports (``base_port=0``): a port planned for a process and
taken by another program before the process binds it costs a new plan, not the start.
Seen in CI: a broker "exited during start-up" and three tests errored."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tidewater.tools import local_cluster


def test_a_bind_failure_is_read_only_from_the_last_start(tmp_path):
    log = tmp_path / "broker-1.log"
    log.write_text("--- 2026-12-02 10:00:00 starting broker-1\n"
                   "tide-broker: cannot start: [Errno 98] Address already in use\n"
                   "--- 2026-12-02 10:00:05 starting broker-1\n"
                   "tide-broker: cannot start: the log directory is locked\n")
    assert not local_cluster.failed_to_bind(local_cluster.output_since_start(log, "broker-1"))
    with log.open("a") as f:
        f.write("--- 2026-12-02 10:00:09 starting broker-1\n"
                "tide-broker: cannot start: cannot listen on 127.0.0.1:9292: Failed to bind\n")
    assert local_cluster.failed_to_bind(local_cluster.output_since_start(log, "broker-1"))


@pytest.mark.parametrize("output", [
    # What the broker and the controller print for each of their ports (checked by hand
    # against a held port: Kafka listener, metrics, gRPC, controller gRPC).
    "tide-broker: cannot start: [Errno 98] error while attempting to bind on address "
    "('127.0.0.1', 39283): address already in use",
    "tide-broker: cannot start: [Errno 98] Address already in use",
    "tide-broker: cannot start: cannot listen on 127.0.0.1:39283: Failed to bind to address",
    "CRITICAL controller: controller failed: cannot listen on 127.0.0.1:39283: Failed",
])
def test_each_ports_bind_failure_is_recognised(output):
    assert local_cluster.failed_to_bind(output)


@pytest.mark.timeout(180)
def test_up_plans_again_when_a_planned_port_is_taken_before_it_is_bound(tmp_path, monkeypatch):
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind((local_cluster.HOST, 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real_plan_ports = local_cluster.plan_ports
    plans: list[dict[str, tuple[int, ...]]] = []

    def plan_with_a_taken_port(brokers: int, base_port: int, controllers: int = 1):
        plan = real_plan_ports(brokers, base_port, controllers)
        if not plans:  # the first plan gives broker-1's Kafka listener the held port
            plan["broker-1"] = plan["broker-1"][:3] + (taken,)
        plans.append(plan)
        return plan

    monkeypatch.setattr(local_cluster, "plan_ports", plan_with_a_taken_port)
    # The port is taken after up's own check: the race CI lost.
    monkeypatch.setattr(local_cluster, "port_in_use", lambda port: False)
    cluster = local_cluster.LocalCluster(tmp_path / "c")
    try:
        bootstrap = cluster.up(2, base_port=0)
        assert len(plans) == 2
        kafka_ports = [int(a.rsplit(":", 1)[1])
                       for a in cluster.manifest["kafka_bootstrap"].split(",")]
        assert taken not in kafka_ports and len(kafka_ports) == 2
        assert bootstrap == cluster.bootstrap
        assert all(s.alive for s in cluster.status())
        broker_log = Path(cluster.process("broker-1")["log"]).read_text()
        assert broker_log.count("starting broker-1") == 2
        assert "address already in use" in broker_log.lower()
    finally:
        holder.close()
        if cluster.manifest is not None:
            cluster.down(timeout_s=10)


@pytest.mark.timeout(60)
def test_a_chosen_base_port_is_not_replanned(tmp_path, monkeypatch):
    """The user named the ports: a taken one is reported, not swapped for others."""
    monkeypatch.setattr(local_cluster, "port_in_use", lambda port: True)
    calls: list[int] = []
    real_plan_ports = local_cluster.plan_ports

    def counting(brokers: int, base_port: int, controllers: int = 1):
        calls.append(base_port)
        return real_plan_ports(brokers, base_port, controllers)

    monkeypatch.setattr(local_cluster, "plan_ports", counting)
    with pytest.raises(local_cluster.PortTakenError, match="choose another --base-port"):
        local_cluster.LocalCluster(tmp_path / "c").up(1, base_port=29092)
    assert calls == [29092]
