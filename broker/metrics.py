"""Prometheus metrics of one broker, in its own registry (prefix ``tidewater_broker_``).

Counters and histograms are updated where things happen; the per-partition
replica gauges are computed at scrape time from a snapshot function, so they
can never go stale when a partition is removed.

The counters and histograms are this module's own (``LocalCounter``,
``LocalHistogram``): an update is an attribute add on the event loop's thread,
and a collector turns them into the samples prometheus_client's ``Counter`` and
``Histogram`` would expose (same names, labels, ``le`` bounds, ``_created``).
prometheus_client's own take a lock and run checks on every update: ~5-6 µs
per ``inc``/``observe`` against ~1 µs here (measured), and the leader makes
about ten updates per acks=all record. Updates come from the event loop only;
the scrape runs in prometheus_client's server thread and reads values without
a lock, which the GIL makes safe for single attribute reads (a scrape may see
a histogram's count one observation ahead of its sum, as with
prometheus_client's per-value locks).

Per-topic counters (Kafka's per-topic ``BytesInPerSec``, ``MessagesInPerSec``,
``BytesOutPerSec`` and ``ReplicationBytesOutPerSec``): the produce and fetch
paths get a topic's series from ``TopicSeries``, one dict probe, and
``labels()`` runs once per topic. A topic the cluster no longer has loses its
series (``forget_topics_except``, on each UpdateMetadata) so that topics
created and deleted over a broker's life do not pile up.
"""

from __future__ import annotations

import bisect
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tidewater.broker.clock import mono_ms
from tidewater.broker.kafka.client_quotas import ClientQuotas
from tidewater.broker.kafka.connection_quotas import REFUSAL_REASONS
from tidewater.broker.security.metrics_listen import listen_metrics
from tidewater.broker.storage.corruption import FOUND_BY
from tidewater.proto.tls import TlsFiles

if TYPE_CHECKING:
    # prometheus_client's package imports its http.server stack (20-25 ms of CPU): loaded
    # for the first scrape or the /metrics server, not before a broker serves (issue 30).
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric
    from prometheus_client.exposition import ThreadingWSGIServer

    from tidewater.broker.security.metrics_http import PasswordCheck

PREFIX = "tidewater_broker_"


class Registers(Protocol):
    def register(self, collector: Any) -> None: ...


class PendingRegistry:
    """Collectors kept until something reads them; then prometheus_client's registry with
    them all (``built``), and later ones go straight to it. Makes a ``BrokerMetrics``
    without importing prometheus_client."""

    def __init__(self) -> None:
        self._collectors: list[Any] = []
        self._registry: CollectorRegistry | None = None

    def register(self, collector: Any) -> None:
        if self._registry is not None:
            self._registry.register(collector)
        else:
            self._collectors.append(collector)

    def built(self) -> CollectorRegistry:
        if self._registry is None:
            from prometheus_client import CollectorRegistry
            registry = CollectorRegistry()
            for collector in self._collectors:
                registry.register(collector)
            self._collectors.clear()
            self._registry = registry
        return self._registry


class _CounterValue:
    """One counter series: ``inc`` is an attribute add."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class _HistogramValue:
    """One histogram series: per-bucket (non-cumulative) counts and the sum."""

    __slots__ = ("_upper_bounds", "counts", "sum", "created")

    def __init__(self, upper_bounds: tuple[float, ...]) -> None:
        self._upper_bounds = upper_bounds
        self.counts = [0] * len(upper_bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        # The first bucket whose upper bound is >= amount (prometheus: le is inclusive).
        self.counts[bisect.bisect_left(self._upper_bounds, amount)] += 1


_Series = TypeVar("_Series", _CounterValue, _HistogramValue)


class _Family(Generic[_Series]):
    """A metric with its label names; ``labels(...)`` gives the series (made on first use).

    An unlabelled family is its own one series: ``inc``/``observe`` on the family."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str],
                 registry: Registers) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[object, ...], _Series] = {}  # label values as given -> series
        self._series: dict[tuple[str, ...], _Series] = {}  # label values as strings -> series
        registry.register(self)

    def remove(self, *values: object) -> None:
        """Drop the series with these label values (prometheus_client's ``remove``)."""
        key = tuple(str(v) for v in values)
        self._series.pop(key, None)
        for given in [k for k in self._children if tuple(str(v) for v in k) == key]:
            del self._children[given]

    def labels(self, *values: object) -> _Series:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: {len(self._labelnames)} label values expected, "
                                 f"got {values!r}")
            key = tuple(str(v) for v in values)
            child = self._series.get(key)
            if child is None:
                child = self._series[key] = self._new_series()
            self._children[values] = child
        return child

    def _new_series(self) -> _Series:
        raise NotImplementedError

    def collect(self) -> list[Metric]:
        from prometheus_client.core import Metric
        metric = Metric(self._name, self._documentation, self.kind)
        for values, series in list(self._series.items()):
            self._add_samples(metric, dict(zip(self._labelnames, values, strict=True)), series)
        return [metric]

    def _add_samples(self, metric: Metric, labels: dict[str, str], series: _Series) -> None:
        raise NotImplementedError


class LocalCounter(_Family[_CounterValue]):
    """prometheus_client ``Counter``'s samples (``_total``, ``_created``), cheaper updates."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 registry: Registers) -> None:
        super().__init__(name, documentation, labelnames, registry)
        if not self._labelnames:
            series = self.labels()
            self.inc = series.inc

    def _new_series(self) -> _CounterValue:
        return _CounterValue()

    @property
    def value(self) -> float:
        """The unlabelled counter's value."""
        return self.labels().value

    def _add_samples(self, metric: Metric, labels: dict[str, str], series: _CounterValue) -> None:
        metric.add_sample(self._name + "_total", labels, series.value)
        metric.add_sample(self._name + "_created", labels, series.created)


class LocalHistogram(_Family[_HistogramValue]):
    """prometheus_client ``Histogram``'s samples (cumulative ``_bucket``, ``_count``, ``_sum``,
    ``_created``), cheaper updates."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 registry: Registers, buckets: Iterable[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._upper_bounds = tuple(bounds)
        self._le_labels: tuple[str, ...] | None = None  # at the first collect: prometheus' text
        super().__init__(name, documentation, labelnames, registry)
        if not self._labelnames:
            self.observe = self.labels().observe

    def _new_series(self) -> _HistogramValue:
        return _HistogramValue(self._upper_bounds)

    def _add_samples(self, metric: Metric, labels: dict[str, str],
                     series: _HistogramValue) -> None:
        counts = list(series.counts)
        total_sum = series.sum
        cumulative = 0.0
        if self._le_labels is None:
            from prometheus_client.utils import floatToGoString
            # floatToGoString is unannotated in prometheus_client (it takes a float).
            self._le_labels = tuple(floatToGoString(b)  # type: ignore[no-untyped-call]
                                    for b in self._upper_bounds)
        for le, count in zip(self._le_labels, counts, strict=True):
            cumulative += count
            metric.add_sample(self._name + "_bucket", {**labels, "le": le}, cumulative)
        metric.add_sample(self._name + "_count", labels, cumulative)
        metric.add_sample(self._name + "_sum", labels, total_sum)
        metric.add_sample(self._name + "_created", labels, series.created)


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

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily
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


class TopicSeries:
    """The per-topic counters' series by topic name, each made once (see the module
    docstring). ``bytes_in[topic]`` etc. after ``ensure(topic)``; the hot paths read the
    dicts directly: ``series.bytes_in.get(topic) or series.ensure_in(topic)``."""

    def __init__(self, bytes_in: LocalCounter, messages_in: LocalCounter,
                 bytes_out: LocalCounter) -> None:
        self._bytes_in = bytes_in
        self._messages_in = messages_in
        self._bytes_out = bytes_out
        # topic -> (bytes in, messages in)
        self.produced: dict[str, tuple[_CounterValue, _CounterValue]] = {}
        # is_follower -> topic -> bytes out ("replica" or "consumer")
        self.fetched: dict[bool, dict[str, _CounterValue]] = {True: {}, False: {}}

    def ensure_in(self, topic: str) -> tuple[_CounterValue, _CounterValue]:
        pair = self.produced.get(topic)
        if pair is None:
            pair = self.produced[topic] = (self._bytes_in.labels(topic),
                                           self._messages_in.labels(topic))
        return pair

    def ensure_out(self, topic: str, is_follower: bool) -> _CounterValue:
        by_topic = self.fetched[is_follower]
        series = by_topic.get(topic)
        if series is None:
            series = by_topic[topic] = self._bytes_out.labels(
                topic, "replica" if is_follower else "consumer")
        return series

    def topics(self) -> set[str]:
        return set(self.produced) | set(self.fetched[True]) | set(self.fetched[False])

    def forget_topics_except(self, kept: set[str]) -> None:
        """Drop every series of a topic not in ``kept`` (the cluster's topics)."""
        for topic in self.topics() - kept:
            if self.produced.pop(topic, None) is not None:
                self._bytes_in.remove(topic)
                self._messages_in.remove(topic)
            for is_follower, by_topic in self.fetched.items():
                if by_topic.pop(topic, None) is not None:
                    self._bytes_out.remove(topic, "replica" if is_follower else "consumer")


class _FetchSessionCollector:
    """Kafka's FetchSessionCache metrics (``NumIncrementalFetchSessions``,
    ``NumIncrementalFetchPartitionsCached``, ``incremental-fetch-session-evictions``) and
    Kafka-client fetches by how they were served, read from the cache at scrape time."""

    def __init__(self, view: Callable[[], FetchSessionView]):
        self._view = view

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        v = self._view()
        yield GaugeMetricFamily(PREFIX + "incremental_fetch_sessions",
                                "Fetch sessions cached (KIP-227)", value=v.sessions)
        yield GaugeMetricFamily(PREFIX + "incremental_fetch_partitions_cached",
                                "Partitions in all cached fetch sessions",
                                value=v.partitions)
        yield CounterMetricFamily(PREFIX + "incremental_fetch_session_evictions",
                                  "Fetch sessions evicted for a new one", value=v.evictions)
        fetches = CounterMetricFamily(
            PREFIX + "kafka_fetches", "Kafka-client fetches by kind: full (opening a "
            "session), incremental, sessionless, session_error (answered 70, 71 or 106)",
            labels=["kind"])
        for kind, count in (("full", v.full), ("incremental", v.incremental),
                            ("sessionless", v.sessionless), ("session_error", v.errors)):
            fetches.add_metric([kind], count)
        yield fetches


class _ClientQuotaCollector:
    """Kafka's client quota metrics (``kafka.server:type=Produce|Fetch,user=,client-id=``
    ``byte-rate`` and ``throttle-time``), read from ``ClientQuotas`` at scrape time:
    one series per rate the broker keeps (per the quota's sharing group, or per user
    and client-id for a client without a quota)."""

    _TYPES = {"producer_byte_rate": "Produce", "consumer_byte_rate": "Fetch",
              "request_percentage": "Request"}

    def __init__(self, quotas: ClientQuotas):
        self._quotas = quotas

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        now_ms = mono_ms()
        rates = GaugeMetricFamily(
            PREFIX + "client_quota_byte_rate", "Bytes per second a client (or the group "
            "sharing its quota) produced or fetched, over Kafka's quota windows",
            labels=["quota_type", "user", "client_id"])
        for key, user, client_id, rate in self._quotas.rates_per_second(now_ms):
            rates.add_metric([self._TYPES[key], user, client_id], rate)
        yield rates
        throttled = CounterMetricFamily(
            PREFIX + "client_quota_throttle_time_ms", "Throttle time answered (KIP-219)",
            labels=["quota_type", "user", "client_id"])
        for (key, user, client_id), ms in list(self._quotas.throttle_time_ms_total.items()):
            throttled.add_metric([self._TYPES[key], user, client_id], ms)
        yield throttled


@dataclass(frozen=True)
class FetchSessionView:
    sessions: int
    partitions: int
    evictions: int
    full: int
    incremental: int
    sessionless: int
    errors: int


class BrokerMetrics:
    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self._pending = PendingRegistry()
        r = self._pending
        self.isr_shrinks = LocalCounter(PREFIX + "isr_shrinks", "ISR shrinks committed",
                                        registry=r)
        self.isr_expands = LocalCounter(PREFIX + "isr_expands", "ISR expansions committed",
                                        registry=r)
        self.messages_in = LocalCounter(PREFIX + "messages_in", "Records appended by produce",
                                        registry=r)
        self.bytes_in = LocalCounter(PREFIX + "bytes_in", "Batch bytes appended by produce",
                                     registry=r)
        self.messages_out = LocalCounter(PREFIX + "messages_out", "Records returned by fetch",
                                         ["kind"], registry=r)
        self.bytes_out = LocalCounter(PREFIX + "bytes_out", "Batch bytes returned by fetch",
                                      ["kind"], registry=r)
        # Per topic, as Kafka's BrokerTopicMetrics: produce and fetch rates per topic.
        self.topic_bytes_in = LocalCounter(
            PREFIX + "topic_bytes_in", "Batch bytes appended by produce, per topic (Kafka's "
            "BytesInPerSec)", ["topic"], registry=r)
        self.topic_messages_in = LocalCounter(
            PREFIX + "topic_messages_in", "Records appended by produce, per topic (Kafka's "
            "MessagesInPerSec)", ["topic"], registry=r)
        self.topic_bytes_out = LocalCounter(
            PREFIX + "topic_bytes_out", "Batch bytes returned by fetch, per topic, to "
            "consumers or follower replicas (Kafka's BytesOutPerSec and "
            "ReplicationBytesOutPerSec)", ["topic", "kind"], registry=r)
        self.topic_series = TopicSeries(self.topic_bytes_in, self.topic_messages_in,
                                        self.topic_bytes_out)
        self.replica_fetch_requests = LocalCounter(
            PREFIX + "replica_fetch_requests", "Follower fetches answered on ReplicaFetch "
            "streams, by fetch session: full (names every partition), incremental (names "
            "what moved), sessionless (a follower of an earlier release)", ["session"],
            registry=r)
        self.replication_bytes_in = LocalCounter(PREFIX + "replication_bytes_in",
                                                 "Bytes appended as follower", registry=r)
        self.leader_elections = LocalCounter(PREFIX + "leader_elections",
                                             "Times this broker became leader of a partition",
                                             registry=r)
        self.replication_decisions = LocalCounter(
            PREFIX + "replication_decisions", "Decisions of the replication core, by kind "
            "(broker/replication/replica.py: truncations, ISR proposals, follower errors, "
            "refused impossible states)", ["decision"], registry=r)
        self.request_errors = LocalCounter(PREFIX + "request_errors",
                                           "Per-partition errors answered", ["rpc", "error"],
                                           registry=r)
        self.corrupt_batches = LocalCounter(
            PREFIX + "corrupt_batches", "Damaged batches found on disk (CRC, framing or offsets), "
            "each counted once, by how it was found", ["how"], registry=r)
        for how in FOUND_BY:  # every series from the start: an alert sees 0 -> 1
            self.corrupt_batches.labels(how)
        self.cleaner_runs = LocalCounter(PREFIX + "cleaner_runs", "Logs compacted by the "
                                         "log cleaner (broker/storage/cleaner.py)", registry=r)
        self.cleaner_bytes = LocalCounter(PREFIX + "cleaner_bytes", "Bytes the log cleaner "
                                          "read and wrote", ["direction"], registry=r)
        self.cleaner_records_removed = LocalCounter(
            PREFIX + "cleaner_records_removed", "Records compaction removed (older values of "
            "a key, expired tombstones)", registry=r)
        self.kafka_connections_refused = LocalCounter(
            PREFIX + "kafka_connections_refused", "Kafka connections closed at once by a "
            "limit (max.connections, max.connections.per.ip, max.connection.creation.rate)",
            ["limit"], registry=r)
        for limit in REFUSAL_REASONS:  # every series from the start: an alert sees 0 -> 1
            self.kafka_connections_refused.labels(limit)
        self.kafka_connections_closed_idle = LocalCounter(
            PREFIX + "kafka_connections_closed_idle", "Kafka connections closed after "
            "connections.max.idle.ms without a complete request or an answer", registry=r)
        self.kafka_failed_authentications = LocalCounter(
            PREFIX + "kafka_failed_authentications", "SASL authentications refused on the "
            "Kafka listeners (each answered after connection.failed.authentication.delay.ms)",
            registry=r)
        self.request_latency = LocalHistogram(
            PREFIX + "request_latency_seconds", "Time to answer one RPC", ["rpc"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                     10, 30),
        )
        self._listening: socket.socket | None = None
        # serve may run in a worker thread while the broker stops: one after the other.
        self._serving_lock = threading.Lock()
        self._http: tuple[ThreadingWSGIServer, threading.Thread] | None = None

    @property
    def registry(self) -> CollectorRegistry:
        """prometheus_client's registry of every collector (imports prometheus_client)."""
        return self._pending.built()

    def register_replicas(self, snapshot: Callable[[], Iterable[ReplicaSnapshot]]) -> None:
        self._pending.register(_ReplicaCollector(self.broker_id, snapshot))

    def register_fetch_sessions(self, view: Callable[[], FetchSessionView]) -> None:
        self._pending.register(_FetchSessionCollector(view))

    def register_client_quotas(self, quotas: ClientQuotas) -> None:
        self._pending.register(_ClientQuotaCollector(quotas))

    def listen(self, host: str, port: int) -> int:
        """Take the /metrics port now (an error if it is in use); ``serve`` answers on it.
        Returns the port bound."""
        self._listening = listen_metrics(host, port)
        return int(self._listening.getsockname()[1])

    def serve(self, *, tls: TlsFiles | None = None, secured: bool = False,
              check_password: PasswordCheck | None = None) -> None:
        """Serve /metrics on ``listen``'s port in a daemon thread: HTTPS with ``tls`` (the
        broker's own certificate), and with TLS or ``secured`` only to a scraper with a
        client certificate of the CA or a user's Basic credentials (``metrics_http``).
        Nothing after ``stop``."""
        from tidewater.broker.security.metrics_http import serve_metrics_on
        with self._serving_lock:
            listening, self._listening = self._listening, None
            if listening is None:
                return  # stopped already (or never listening)
            self._http = serve_metrics_on(self.registry, listening, tls=tls, secured=secured,
                                          check_password=check_password)

    def stop(self) -> None:
        with self._serving_lock:
            if self._listening is not None:  # stopped before serving
                self._listening.close()
                self._listening = None
            if self._http is not None:
                server, _thread = self._http
                server.shutdown()
                server.server_close()
                self._http = None
