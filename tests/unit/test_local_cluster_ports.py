"""tools.local_cluster.plan_ports: one plan never gives two processes the same port."""

from __future__ import annotations

import itertools

import pytest

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


@pytest.mark.timeout(30)
def test_a_quorum_plan_gives_each_controller_three_distinct_ports():
    for base in (0, 9000):
        plan = local_cluster.plan_ports(3, base, controllers=3)
        assert [n for n in plan if n.startswith("controller")] == [
            "controller-1", "controller-2", "controller-3"]
        assert all(len(plan[f"controller-{i}"]) == 3 for i in (1, 2, 3))
        ports = [port for planned in plan.values() for port in planned]
        assert len(set(ports)) == len(ports) == 3 * 3 + 3 * 4


@pytest.mark.timeout(30)
def test_controllers_below_one_are_refused(tmp_path):
    cluster = local_cluster.LocalCluster(tmp_path / "c")
    with pytest.raises(local_cluster.LocalClusterError, match="--controllers must be"):
        cluster.up(1, base_port=0, controllers=0)
    assert not (tmp_path / "c" / "cluster.json").exists()  # nothing started


@pytest.mark.timeout(30)
def test_a_quorum_with_tls_gets_one_controller_certificate_per_node(tmp_path):
    from cryptography import x509

    local_cluster.make_tls_files(tmp_path, [1], controllers=3)
    for i in (1, 2, 3):
        cert = x509.load_pem_x509_certificate((tmp_path / f"controller-{i}.pem").read_bytes())
        assert cert.subject.rfc4514_string() == f"OU=controller,CN=controller-{i}"
    assert not (tmp_path / "controller-4.pem").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("security", [{"sasl_mechanisms": ("SCRAM-SHA-512",)},
                                      {"authorizer": "acl"}])
def test_a_quorum_with_sasl_or_acls_but_no_tls_is_refused(tmp_path, security):
    """Its Raft port authenticates by certificate only: without TLS anyone who reaches
    it could vote or propose metadata records."""
    cluster = local_cluster.LocalCluster(tmp_path / "c")
    with pytest.raises(local_cluster.LocalClusterError, match="needs --tls"):
        cluster.up(1, controllers=3, **security)
