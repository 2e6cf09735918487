"""The broker's own counters and histograms expose what prometheus_client's would."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tidewater.broker.metrics import BrokerMetrics, LocalCounter, LocalHistogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.01, 1, 30)


def _exposition(registry: CollectorRegistry) -> str:
    """The text format with the ``_created`` timestamps blanked (they differ by run)."""
    return re.sub(r"_created(\{[^}]*\})? \S+", r"_created\1 T", generate_latest(registry).decode())


def _drive(counter, labelled, histogram) -> None:
    counter.inc()
    counter.inc(2.5)
    labelled.labels("Fetch", "NOT_LEADER_OR_FOLLOWER").inc()
    labelled.labels("Produce", "CORRUPT_MESSAGE").inc(3)
    labelled.labels("Fetch", "NOT_LEADER_OR_FOLLOWER").inc()
    for value in (0.0001, 0.0005, 0.0007, 0.003, 1.0, 30, 100):
        histogram.labels("ProduceStream").observe(value)
    histogram.labels("ReplicaFetch").observe(0.01)


def test_samples_match_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    _drive(LocalCounter("t_records", "doc", registry=ours),
           LocalCounter("t_errors", "doc", ["rpc", "error"], registry=ours),
           LocalHistogram("t_latency_seconds", "doc", ["rpc"], registry=ours, buckets=BUCKETS))
    _drive(Counter("t_records", "doc", registry=theirs),
           Counter("t_errors", "doc", ["rpc", "error"], registry=theirs),
           Histogram("t_latency_seconds", "doc", ["rpc"], registry=theirs, buckets=BUCKETS))
    assert _exposition(ours) == _exposition(theirs)


def test_counter_refuses_negative_and_wrong_label_count():
    registry = CollectorRegistry()
    counter = LocalCounter("t_c", "doc", registry=registry)
    with pytest.raises(ValueError):
        counter.inc(-1)
    assert counter.value == 0
    labelled = LocalCounter("t_l", "doc", ["rpc"], registry=registry)
    with pytest.raises(ValueError):
        labelled.labels("a", "b")


def test_label_values_are_strings():
    registry = CollectorRegistry()
    counter = LocalCounter("t_c", "doc", ["partition"], registry=registry)
    counter.labels(1).inc()
    counter.labels("1").inc()
    assert 't_c_total{partition="1"} 2.0' in generate_latest(registry).decode()


def test_broker_metrics_names():
    text = generate_latest(BrokerMetrics(7).registry).decode()
    for name in ("isr_shrinks_total", "messages_in_total", "bytes_in_total",
                 "replication_bytes_in_total", "leader_elections_total"):
        assert f"tidewater_broker_{name} 0.0" in text
    for how in ("consumer_read", "follower_read", "scrub"):  # each series there from the start
        assert f'tidewater_broker_corrupt_batches_total{{how="{how}"}} 0.0' in text
