"""Followers replicate over the ReplicaFetch stream between real broker processes."""

from __future__ import annotations

import re
import urllib.request

import pytest

from tests.integration.conftest import consume_all, free_port, produce, wait_for
from tidewater.proto import tidewater_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def rpc_count(metrics_text: str, rpc: str) -> float:
    found = re.search(
        rf'tidewater_broker_request_latency_seconds_count\{{[^}}]*rpc="{rpc}"[^}}]*\}} (\S+)',
        metrics_text)
    return float(found.group(1)) if found else 0.0


def test_followers_replicate_acks_all_writes_over_replica_fetch(cluster):
    ports = {broker_id: free_port() for broker_id in (1, 2, 3)}
    c = cluster(3, extra_args=lambda broker_id: ["--metrics-port", str(ports[broker_id])])
    c.create_topic("rf", replication_factor=3)
    leader = c.wait_leader_ready("rf")
    values = [f"v{i}".encode() for i in range(20)]
    for value in values:
        assert produce(leader, "rf", [value], acks=-1).error_code == pb.NONE
    for broker in c.brokers.values():
        wait_for(lambda b=broker: b.replica("rf").log_end_offset == len(values),
                 message=f"broker {broker.broker_id} has every record")

    def scrape(broker_id: int) -> str:
        url = f"http://127.0.0.1:{ports[broker_id]}/metrics"
        return urllib.request.urlopen(url, timeout=2).read().decode()

    # Each answered stream request is one observation; no follower used unary Fetch.
    text = wait_for(lambda: (lambda t: rpc_count(t, "ReplicaFetch") >= 2 * len(values) and t)(
        scrape(leader.broker_id)), message="ReplicaFetch answers counted")
    assert rpc_count(text, "Fetch") == 0
    assert [v for _, v in consume_all(leader, "rf")] == values
    # Within each stream's fetch session: a full request to start, incremental ones after.
    sessions = {kind: float(count) for kind, count in re.findall(
        r'tidewater_broker_replica_fetch_requests_total\{session="(\w+)"\} (\S+)', text)}
    assert sessions.get("full", 0) >= 2  # a stream per follower
    assert sessions.get("incremental", 0) >= len(values)
    assert sessions.get("sessionless", 0) == 0
