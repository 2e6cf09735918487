"""The broker's own counters and histograms expose what prometheus_client's would."""

from __future__ import annotations

import re
import socket
import threading
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tidewater.broker.metrics import BrokerMetrics, FetchSessionView, LocalCounter, LocalHistogram

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


def _sample(metrics: BrokerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value("tidewater_broker_" + name, labels)


def test_topic_series_are_made_once_and_forgotten_with_their_topic():
    m = BrokerMetrics(1)
    series = m.topic_series
    pair = series.ensure_in("orders")
    assert series.ensure_in("orders") is pair and series.produced["orders"] is pair
    assert pair == (m.topic_bytes_in.labels("orders"), m.topic_messages_in.labels("orders"))
    out = series.ensure_out("orders", is_follower=False)
    assert out is m.topic_bytes_out.labels("orders", "consumer")
    assert series.ensure_out("orders", is_follower=True) is not out
    pair[0].inc(100)
    out.inc(40)
    series.ensure_in("kept")[1].inc(2)
    assert _sample(m, "topic_bytes_in_total", topic="orders") == 100
    assert _sample(m, "topic_bytes_out_total", topic="orders", kind="consumer") == 40
    assert _sample(m, "topic_bytes_out_total", topic="orders", kind="replica") == 0
    series.forget_topics_except({"kept"})
    assert series.topics() == {"kept"}
    for name, labels in (("topic_bytes_in_total", {}), ("topic_messages_in_total", {}),
                         ("topic_bytes_out_total", {"kind": "consumer"}),
                         ("topic_bytes_out_total", {"kind": "replica"})):
        assert _sample(m, name, topic="orders", **labels) is None
    assert _sample(m, "topic_messages_in_total", topic="kept") == 2
    # A topic made again starts from zero (a counter reset, as Prometheus expects).
    assert series.ensure_in("orders")[0].value == 0


def test_remove_drops_the_series_as_prometheus_clients_does():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LocalCounter("t_r", "doc", ["topic"], registry=ours)
    other = Counter("t_r", "doc", ["topic"], registry=theirs)
    for counter in (mine, other):
        counter.labels("a").inc()
        counter.labels("b").inc(2)
        counter.remove("a")
    assert _exposition(ours) == _exposition(theirs)
    mine.labels("a").inc(5)
    assert 't_r_total{topic="a"} 5.0' in generate_latest(ours).decode()


async def test_produce_and_fetch_count_per_topic_consumers_and_followers_apart(tmp_path):
    """Through the real produce and fetch paths (ReplicaManager, no sockets)."""
    from tests.unit.test_broker_fakes import make_batch
    from tests.unit.test_broker_replica_manager import (
        CLUSTER_ID,
        TP,
        consumer_fetch,
        follower_fetch,
        lai,
        make_manager,
        produce,
    )
    from tidewater.proto import tidewater_pb2 as pb

    rm, _ = make_manager(tmp_path)
    m = rm.metrics
    await rm.leader_and_isr(lai())
    batch = make_batch(4)
    for _ in range(2):
        out = await rm.produce(produce(acks=1, records=batch))
        assert out.partitions[0].error_code == pb.NONE
    assert _sample(m, "topic_messages_in_total", topic=TP.topic) == 8
    assert _sample(m, "topic_bytes_in_total", topic=TP.topic) == 2 * len(batch)
    # A follower reads both batches (and so moves the high watermark), then a consumer.
    replicated = await rm.fetch(follower_fetch(0))
    assert len(replicated.partitions[0].records) == 2 * len(batch)
    await rm.fetch(follower_fetch(8))
    consumed = await rm.fetch(consumer_fetch(0))
    assert len(consumed.partitions[0].records) == 2 * len(batch)
    assert _sample(m, "topic_bytes_out_total", topic=TP.topic, kind="replica") == 2 * len(batch)
    assert _sample(m, "topic_bytes_out_total", topic=TP.topic, kind="consumer") == 2 * len(batch)
    # An unknown partition counts nothing for its topic.
    await rm.produce(produce(acks=1, topic="nowhere"))
    assert _sample(m, "topic_bytes_in_total", topic="nowhere") is None
    # The topic deleted (a snapshot without it): its series go.
    await rm.update_metadata(pb.UpdateMetadataRequest(controller_epoch=1, cluster_id=CLUSTER_ID,
                                                      metadata_offset=10))
    assert _sample(m, "topic_bytes_in_total", topic=TP.topic) is None


def test_collectors_registered_before_and_after_the_registry_is_built_are_scraped():
    m = BrokerMetrics(3)
    m.leader_elections.inc()
    m.register_fetch_sessions(lambda: FetchSessionView(2, 5, 0, 0, 0, 0, 0))
    assert _sample(m, "leader_elections_total") == 1.0  # builds the registry
    assert _sample(m, "incremental_fetch_sessions") == 2.0
    m.register_replicas(lambda: [])
    assert _sample(m, "under_replicated_partitions", broker="3") == 0.0


def test_metrics_port_is_taken_at_listen_and_a_scrape_waits_for_serve():
    m = BrokerMetrics(4)
    port = m.listen("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):  # the port is ours before serve
            socket.create_server(("127.0.0.1", port)).close()
        scraped: list[str] = []
        scrape = threading.Thread(target=lambda: scraped.append(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()))
        scrape.start()  # connects now, waits in the backlog
        m.serve()
        scrape.join(timeout=30)
        assert scraped and "tidewater_broker_leader_elections_total 0.0" in scraped[0]
    finally:
        m.stop()
    socket.create_server(("127.0.0.1", port)).close()  # stop gave the port back


def test_stop_before_serve_gives_the_port_back():
    m = BrokerMetrics(5)
    port = m.listen("127.0.0.1", 0)
    m.stop()
    socket.create_server(("127.0.0.1", port)).close()


def test_serve_after_stop_serves_nothing():
    m = BrokerMetrics(6)
    port = m.listen("127.0.0.1", 0)
    m.stop()
    m.serve()  # the broker stopped while its serve was on its way: nothing is left open
    socket.create_server(("127.0.0.1", port)).close()
    m.stop()
