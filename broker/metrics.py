"""Prometheus metrics of one broker, in its own registry (prefix ``tidewater_broker_``).

Counters and histograms are updated where things happen; the per-partition
replica gauges are computed at scrape time from a snapshot function, so they
can never go stale when a partition is removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

PREFIX = "tidewater_broker_"


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One local replica's state as the gauges show it."""

    topic: str
    partition: int
    log_end_offset: int
    high_watermark: int
    log_start_offset: int
    leader_epoch: int
    isr_size: int
    is_leader: bool
    under_replicated: bool


class _ReplicaCollector:
    def __init__(self, broker_id: int, snapshot: Callable[[], Iterable[ReplicaSnapshot]]):
        self._broker = str(broker_id)
        self._snapshot = snapshot

    def collect(self):
        labels = ["topic", "partition", "broker"]
        families = {
            name: GaugeMetricFamily(PREFIX + "replica_" + name, doc, labels=labels)
            for name, doc in (
                ("log_end_offset", "Offset the next appended record gets"),
                ("high_watermark", "Committed offset: consumers read below it"),
                ("log_start_offset", "First offset still in the log"),
                ("leader_epoch", "Leader epoch this replica knows"),
                ("isr_size", "ISR size as the leader sees it (0 on followers)"),
                ("is_leader", "1 when this broker leads the partition"),
            )
        }
        under = 0
        for r in self._snapshot():
            values = [r.topic, str(r.partition), self._broker]
            families["log_end_offset"].add_metric(values, r.log_end_offset)
            families["high_watermark"].add_metric(values, r.high_watermark)
            families["log_start_offset"].add_metric(values, r.log_start_offset)
            families["leader_epoch"].add_metric(values, r.leader_epoch)
            families["isr_size"].add_metric(values, r.isr_size)
            families["is_leader"].add_metric(values, 1 if r.is_leader else 0)
            under += 1 if (r.is_leader and r.under_replicated) else 0
        yield from families.values()
        g = GaugeMetricFamily(PREFIX + "under_replicated_partitions",
                              "Partitions led here whose ISR is smaller than the replica set",
                              labels=["broker"])
        g.add_metric([self._broker], under)
        yield g


class BrokerMetrics:
    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self.registry = CollectorRegistry()
        r = self.registry
        self.isr_shrinks = Counter(PREFIX + "isr_shrinks", "ISR shrinks committed", registry=r)
        self.isr_expands = Counter(PREFIX + "isr_expands", "ISR expansions committed", registry=r)
        self.messages_in = Counter(PREFIX + "messages_in", "Records appended by produce",
                                   registry=r)
        self.bytes_in = Counter(PREFIX + "bytes_in", "Batch bytes appended by produce", registry=r)
        self.messages_out = Counter(PREFIX + "messages_out", "Records returned by fetch",
                                    ["kind"], registry=r)
        self.bytes_out = Counter(PREFIX + "bytes_out", "Batch bytes returned by fetch", ["kind"],
                                 registry=r)
        self.replication_bytes_in = Counter(PREFIX + "replication_bytes_in",
                                            "Bytes appended as follower", registry=r)
        self.leader_elections = Counter(PREFIX + "leader_elections",
                                        "Times this broker became leader of a partition",
                                        registry=r)
        self.request_errors = Counter(PREFIX + "request_errors", "Per-partition errors answered",
                                      ["rpc", "error"], registry=r)
        self.request_latency = Histogram(
            PREFIX + "request_latency_seconds", "Time to answer one RPC", ["rpc"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                     10, 30),
        )
        self._http = None

    def register_replicas(self, snapshot: Callable[[], Iterable[ReplicaSnapshot]]) -> None:
        self.registry.register(_ReplicaCollector(self.broker_id, snapshot))

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics on ``host:port`` in a daemon thread (prometheus_client's server)."""
        self._http = start_http_server(port, addr=host, registry=self.registry)

    def stop(self) -> None:
        if self._http is not None:
            server, _thread = self._http
            server.shutdown()
            server.server_close()
            self._http = None
