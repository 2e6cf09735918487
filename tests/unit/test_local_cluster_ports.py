"""tools.local_cluster.plan_ports: one plan never gives two processes the same port."""

from __future__ import annotations

import itertools

from tidewater.tools import local_cluster


def test_a_port_handed_out_twice_by_the_kernel_is_not_used_twice(monkeypatch):
    # The kernel may return a port again once the probe socket is closed (seen in CI:
    # broker-1's listen port came back as broker-2's metrics port, and broker-2 failed).
    answers = itertools.chain([40001, 40001, 40002, 40001, 40003, 40002], itertools.count(40004))
    monkeypatch.setattr(local_cluster, "free_port", lambda: next(answers))
    plan = local_cluster.plan_ports(2, 0)
    ports = [port for planned in plan.values() for port in planned]
    assert len(ports) == 10 and len(set(ports)) == 10


def test_a_base_port_plan_has_distinct_ports():
    plan = local_cluster.plan_ports(2, 9000)
    ports = sorted(port for planned in plan.values() for port in planned)
    assert len(set(ports)) == len(ports) == 10


def test_a_base_port_too_high_for_the_kafka_ports_is_refused():
    import pytest
    with pytest.raises(local_cluster.LocalClusterError, match="65535"):
        local_cluster.plan_ports(3, 60_000)
