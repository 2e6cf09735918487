"""Issue 26: who may send Raft messages over mTLS, and the windowed raft-metrics."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry

from tidewater.controller.quorum.metrics import RaftMetrics, WindowedStat
from tidewater.controller.quorum.transport import check_controller_principal
from tidewater.controller.raft import RaftConfig, RaftNode, VoterKey
from tidewater.controller.raft.node import QuorumState
from tidewater.proto.errors import ClusterAuthorizationFailedError
from tidewater.proto.tls import Principal

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("principal", [
    None, Principal("tide-client", "client"), Principal("broker-1", "broker"),
    Principal("controller", ""), Principal("controller-1", "Controller")])
def test_only_a_controller_certificate_may_send_raft_messages(principal):
    with pytest.raises(ClusterAuthorizationFailedError):
        check_controller_principal(principal, source_id=1)


def test_a_per_node_controller_certificate_is_bound_to_its_node():
    check_controller_principal(Principal("controller-2", "controller"), source_id=2)
    check_controller_principal(Principal("controller", "controller"), source_id=7)  # shared one
    with pytest.raises(ClusterAuthorizationFailedError, match="controller-2"):
        check_controller_principal(Principal("controller-2", "controller"), source_id=3)


def test_windowed_stat_forgets_samples_older_than_its_window():
    stat = WindowedStat(window_ms=1000)
    assert math.isnan(stat.avg(0)) and math.isnan(stat.max(0)) and stat.rate_per_s(0) == 0
    stat.record(10, 100)
    stat.record(30, 600)
    assert stat.avg(700) == 20 and stat.max(700) == 30
    assert stat.rate_per_s(1000) == pytest.approx(40 * 1000 / 900)  # 900 ms since the first
    assert stat.avg(1200) == 30  # the first sample left the window
    assert math.isnan(stat.max(1700))


def test_windowed_stat_quantiles_are_nearest_rank_over_the_window():
    stat = WindowedStat(window_ms=1000)
    assert math.isnan(stat.quantile(0.5, 0))
    for i, value in enumerate([5, 1, 4, 2, 3] * 20 + [100]):  # 101 samples
        stat.record(value, i)
    assert stat.quantile(0.50, 200) == 3
    assert stat.quantile(0.99, 200) == 5  # rank 100 of 101
    assert stat.quantile(1.0, 200) == 100
    stat.record(7, 1150)
    assert stat.quantile(0.5, 1160) == 7 and stat.quantile(0.99, 1160) == 7  # the rest expired


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value("tidewater_raft_" + name, labels or None)


def test_a_single_voter_leader_reports_itself_its_commit_and_its_election():
    registry = CollectorRegistry()
    metrics = RaftMetrics(registry)
    local = VoterKey(1, "a" * 32)
    node = RaftNode(RaftConfig(), local, random.Random(1), 0,
                    bootstrap_voters=frozenset({local, VoterKey(2, "b" * 32)}),
                    quorum_state=QuorumState())
    metrics.observe(node, known_peers=set(), now_ms=0)
    assert _sample(registry, "current_leader") == -1
    assert _sample(registry, "high_watermark") == -1
    assert _sample(registry, "number_unknown_voter_connections") == 1  # voter 2: no address
    assert _sample(registry, "current_state", state="unattached") == 1
    # A node learning of leader 2 in epoch 3 after 250 ms without one.
    node.epoch, node.leader_id = 3, 2
    metrics.observe(node, known_peers={2}, now_ms=250)
    assert _sample(registry, "current_leader") == 2
    assert _sample(registry, "current_epoch") == 3
    assert _sample(registry, "election_latency_max") == 250
    assert _sample(registry, "number_unknown_voter_connections") == 0
    assert _sample(registry, "voter_lag", voter="2") is None  # not the leader
    metrics.on_appended(4, 300)
    metrics.on_committed(12, 312)
    metrics.observe(node, known_peers={2}, now_ms=320)
    assert _sample(registry, "append_records_total") == 4
    assert _sample(registry, "commit_latency_avg") == 12
    assert _sample(registry, "commit_latency_p50") == 12
    assert _sample(registry, "commit_latency_p99") == 12
