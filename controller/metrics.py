"""Prometheus metrics of the controller (names prefixed ``tidewater_controller_``).

Gauges are recomputed from the image after every committed command (cheap:
one pass over the partitions); counters count what happened in this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tidewater.broker.security.metrics_http import PasswordCheck, serve_metrics
from tidewater.controller.state_machine import ControllerStateMachine, Effects
from tidewater.proto.tls import TlsFiles

PREFIX = "tidewater_controller_"


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.active_controller = Gauge(PREFIX + "active_controller",
                                       "1 while this controller is active", registry=r)
        self.controller_epoch = Gauge(PREFIX + "controller_epoch", "Current controller epoch",
                                      registry=r)
        self.offline_partitions = Gauge(PREFIX + "offline_partitions",
                                        "Partitions without a leader", registry=r)
        self.under_replicated_partitions = Gauge(
            PREFIX + "under_replicated_partitions", "Partitions whose ISR is smaller than replicas",
            registry=r)
        self.registered_brokers = Gauge(PREFIX + "registered_brokers", "Brokers ever registered",
                                        registry=r)
        self.fenced_brokers = Gauge(PREFIX + "fenced_brokers", "Registered brokers now fenced",
                                    registry=r)
        self.topics = Gauge(PREFIX + "topics", "Topics", registry=r)
        self.partitions = Gauge(PREFIX + "partitions", "Partitions of all topics", registry=r)
        self.leader_elections = Counter(PREFIX + "leader_elections",
                                        "Leader changes decided by this controller", registry=r)
        self.unclean_leader_elections = Counter(
            PREFIX + "unclean_leader_elections", "Leaders elected from outside the ISR", registry=r)
        self.isr_changes = Counter(PREFIX + "isr_changes", "ISR changes committed", registry=r)
        self.brokers_fenced = Counter(
            PREFIX + "brokers_fenced", "Brokers fenced by this controller, by what detected it "
            "(session_timeout, heartbeat_stream_closed)", ["reason"], registry=r)
        self.requests_delivered = Counter(PREFIX + "broker_requests_delivered",
                                          "Requests delivered to brokers", ["request"], registry=r)
        self.corrupt_replica_reports = Counter(
            PREFIX + "corrupt_replica_reports", "Replicas brokers reported corrupt (a batch "
            "failing its CRC), by the answer (NONE: it left the ISR)", ["result"], registry=r)
        self.broker_partition_errors = Counter(
            PREFIX + "broker_partition_errors", "Partitions a broker refused in a LeaderAndIsr "
            "or StopReplica, by request and error code", ["request", "error"], registry=r)
        self.request_latency = Histogram(
            PREFIX + "request_latency_seconds", "Controller RPC latency", ["rpc"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))

    def on_commit(self, machine: ControllerStateMachine, effects: Effects) -> None:
        if effects.leader_elections:
            self.leader_elections.inc(effects.leader_elections)
        if effects.unclean_leader_elections:
            self.unclean_leader_elections.inc(effects.unclean_leader_elections)
        if effects.isr_changes:
            self.isr_changes.inc(effects.isr_changes)
        if effects.metadata_changed:
            self.refresh(machine)

    def refresh(self, machine: ControllerStateMachine) -> None:
        metadata = machine.metadata
        offline = under = total = 0
        for p in metadata.all_partitions():
            total += 1
            offline += p.offline
            under += p.under_replicated
        self.offline_partitions.set(offline)
        self.under_replicated_partitions.set(under)
        self.partitions.set(total)
        self.topics.set(len(metadata.topics))
        self.registered_brokers.set(len(metadata.brokers))
        self.fenced_brokers.set(sum(b.fenced for b in metadata.brokers.values()))
        self.controller_epoch.set(metadata.controller_epoch)

    @contextmanager
    def time_rpc(self, rpc: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.request_latency.labels(rpc).observe(time.perf_counter() - start)

    def serve(self, port: int, addr: str = "127.0.0.1", *, tls: TlsFiles | None = None,
              secured: bool = False, check_password: PasswordCheck | None = None
              ) -> tuple[WSGIServer, threading.Thread]:
        """Expose /metrics on ``addr:port``: HTTPS with ``tls`` (the controller's own
        certificate), and with TLS or ``secured`` only to a scraper with a client
        certificate of the CA or a user's Basic credentials (``metrics_http``)."""
        return serve_metrics(self.registry, addr, port, tls=tls, secured=secured,
                             check_password=check_password)
