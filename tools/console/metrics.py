"""The last minutes of the brokers' Prometheus metrics, for the console's live charts.

A background thread scrapes every target's ``/metrics`` each ``interval_ms`` (2 s) and
keeps, per source, the last ``history_s`` (5 min) of the few counters the charts need,
read straight from the text exposition (only the lines of those names are parsed:
a broker with thousands of replicas serves thousands of gauge lines). The charts show
rates between consecutive scrapes:

==========================  ==================================================
chart                       from
==========================  ==================================================
produce bytes/s             ``tidewater_broker_bytes_in_total``
fetch bytes/s (consumers)   ``tidewater_broker_bytes_out_total{kind="consumer"}``
requests/s                  ``tidewater_broker_request_latency_seconds_count``, all RPCs
ISR shrinks/s               ``tidewater_broker_isr_shrinks_total``
p99 produce latency (ms)    the ``..._request_latency_seconds_bucket`` deltas of the
                            RPCs whose name holds ``Produce`` (gRPC and Kafka's)
==========================  ==================================================

and, per topic (the topics list and a topic's page), summed over the brokers:

==========================  ==================================================
produce records/s           ``tidewater_broker_topic_messages_in_total{topic}``
produce bytes/s             ``tidewater_broker_topic_bytes_in_total{topic}``
fetch bytes/s (consumers)   ``tidewater_broker_topic_bytes_out_total{topic,
                            kind="consumer"}`` (followers' fetches left out)
==========================  ==================================================

A topic's series first seen in a scrape counted from zero since the one before (the
broker makes it on the topic's first produce or fetch).

A counter that goes down (a restarted broker) starts its rate again from the next
scrape; a scrape that fails leaves a gap in that broker's lines and marks it down.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tidewater.proto.errors import TidewaterError
from tidewater.tools.scrape import ScrapeTarget, fetch_metrics

INTERVAL_MS_DEFAULT = 2000
HISTORY_S_DEFAULT = 300
SCRAPE_TIMEOUT_S = 1.5
PREFIX = "tidewater_broker_"

CHARTS: dict[str, str] = {
    "produce_bytes": "Produce bytes/s",
    "fetch_bytes": "Fetch bytes/s (consumers)",
    "requests": "Requests/s",
    "isr_shrinks": "ISR shrinks/s",
    "p99_produce_ms": "p99 produce latency (ms)",
    # KIP-219 throttle time the broker answered clients over their quotas, all quota
    # types and clients summed: ms of delay per second (1000: one client always waiting).
    "throttle_ms": "Quota throttle time (ms/s)",
}

_COUNTERS = {
    PREFIX + "bytes_in_total": "produce_bytes",
    PREFIX + "isr_shrinks_total": "isr_shrinks",
    PREFIX + "client_quota_throttle_time_ms_total": "throttle_ms",
}


@dataclass(slots=True)
class Sample:
    """What one scrape of one source read."""

    unix_ms: int
    ok: bool
    error: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    produce_buckets: dict[str, float] = field(default_factory=dict)  # le -> cumulative count
    # topic -> (records in, bytes in, consumer bytes out), this broker's counters
    topics: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicRate:
    """A topic's produce and consumer-fetch rates over the last scrape interval."""

    records_in: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0


# The per-topic counters: name -> index in ``Sample.topics[topic]``.
_TOPIC_COUNTERS = {
    PREFIX + "topic_messages_in_total": 0,
    PREFIX + "topic_bytes_in_total": 1,
    PREFIX + "topic_bytes_out_total": 2,
}


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split('",'):
        name, _eq, value = part.partition('="')
        out[name.strip().lstrip(",")] = value.rstrip('"')
    return out


def parse_sample(text: str, unix_ms: int) -> Sample:
    """The counters the charts need from one exposition (other lines are skipped unread)."""
    s = Sample(unix_ms, True)
    counters = s.counters
    counters.update(produce_bytes=0.0, fetch_bytes=0.0, requests=0.0, isr_shrinks=0.0,
                    throttle_ms=0.0)
    topics = s.topics
    for line in text.splitlines():
        # The replica gauges, a few lines per partition, are most of a big broker's
        # exposition and none of what is read here: skipped on the first characters.
        if not line.startswith(PREFIX) or line.startswith("replica_", len(PREFIX)):
            continue
        head, _sp, value_text = line.rpartition(" ")
        name, _brace, label_text = head.partition("{")
        try:
            value = float(value_text)
        except ValueError:
            continue
        if name in _COUNTERS:
            counters[_COUNTERS[name]] += value
        elif name == PREFIX + "bytes_out_total":
            if 'kind="consumer"' in label_text:
                counters["fetch_bytes"] += value
        elif name == PREFIX + "request_latency_seconds_count":
            counters["requests"] += value
        elif name == PREFIX + "request_latency_seconds_bucket":
            if "Produce" in label_text:
                le = _labels(label_text.rstrip("}")).get("le", "")
                s.produce_buckets[le] = s.produce_buckets.get(le, 0.0) + value
        elif name in _TOPIC_COUNTERS:
            labels = _labels(label_text.rstrip("}"))
            if labels.get("kind", "consumer") != "consumer":
                continue  # a follower's fetches: replication, not the topic's readers
            values = topics.get(labels.get("topic", ""))
            if values is None:
                values = topics[labels.get("topic", "")] = [0.0, 0.0, 0.0]
            values[_TOPIC_COUNTERS[name]] += value
    return s


def _quantile(buckets: dict[str, float], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative ``le -> count`` (seconds)."""
    bounds = sorted((float(le), count) for le, count in buckets.items())
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in bounds:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count)
        previous_bound, previous_count = bound, count
    return previous_bound


def rate_point(before: Sample, after: Sample, chart: str) -> float | None:
    """The value of ``chart`` between two consecutive ok samples (None: no value)."""
    seconds = (after.unix_ms - before.unix_ms) / 1000
    if seconds <= 0 or not (before.ok and after.ok):
        return None
    if chart == "p99_produce_ms":
        delta = {le: after.produce_buckets.get(le, 0.0) - before.produce_buckets.get(le, 0.0)
                 for le in after.produce_buckets}
        if any(v < 0 for v in delta.values()):
            return None
        p99 = _quantile(delta, 0.99)
        return 0.0 if p99 is None else p99 * 1000
    diff = after.counters.get(chart, 0.0) - before.counters.get(chart, 0.0)
    return None if diff < 0 else diff / seconds


_ZEROS = (0.0, 0.0, 0.0)


class MetricsHistory:
    """Scrapes ``targets`` in a background thread; ``series`` and ``topic_rates`` read it."""

    def __init__(self, targets: list[ScrapeTarget], *, interval_ms: int = INTERVAL_MS_DEFAULT,
                 history_s: int = HISTORY_S_DEFAULT) -> None:
        self.targets = list(targets)
        self.interval_ms = interval_ms
        self.history_s = history_s
        points = max(2, history_s * 1000 // interval_ms + 1)
        self._samples: dict[str, deque[Sample]] = {t.source: deque(maxlen=points)
                                                   for t in self.targets}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.targets)),
                                        thread_name_prefix="console-scrape")

    def start(self) -> None:
        if self.targets and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-metrics",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_ms / 1000 - (time.monotonic() - started)))

    @staticmethod
    def _scrape(target: ScrapeTarget) -> Sample:
        unix_ms = int(time.time() * 1000)
        try:
            text = fetch_metrics(target.url, SCRAPE_TIMEOUT_S, target.cafile,
                                 target.credentials)
        except (OSError, ValueError) as e:
            return Sample(unix_ms, False, " ".join(str(e).split())[:200])
        return parse_sample(text, unix_ms)

    def scrape_once(self) -> None:
        results = list(self._pool.map(self._scrape, self.targets))
        with self._lock:
            for target, sample in zip(self.targets, results, strict=True):
                self._samples[target.source].append(sample)

    # ------------------------------------------------------------------ reading

    def status(self) -> dict[str, Sample | None]:
        """source -> its latest sample (None before the first scrape)."""
        with self._lock:
            return {source: (q[-1] if q else None) for source, q in self._samples.items()}

    def series(self, chart: str) -> dict[str, list[tuple[int, float | None]]]:
        """source -> [(unix_ms, value or None for a gap)], oldest first."""
        if chart not in CHARTS:
            raise KeyError(chart)
        with self._lock:
            copies = {source: list(q) for source, q in self._samples.items()}
        out: dict[str, list[tuple[int, float | None]]] = {}
        for source, samples in copies.items():
            out[source] = [(after.unix_ms, rate_point(before, after, chart))
                           for before, after in zip(samples, samples[1:], strict=False)]
        return out

    def topic_rates(self) -> dict[str, TopicRate]:
        """topic -> its rates over the last scrape interval, summed over the brokers."""
        sums: dict[str, list[float]] = {}
        with self._lock:
            pairs = [(q[-2], q[-1]) for q in self._samples.values() if len(q) >= 2]
        for before, after in pairs:
            seconds = (after.unix_ms - before.unix_ms) / 1000
            if not (before.ok and after.ok) or seconds <= 0:
                continue
            for topic, now in after.topics.items():
                then = before.topics.get(topic, _ZEROS)
                diffs = [a - b for a, b in zip(now, then, strict=True)]
                if any(d < 0 for d in diffs):
                    continue  # the broker restarted or forgot the topic: from the next scrape
                total = sums.setdefault(topic, [0.0, 0.0, 0.0])
                for i, d in enumerate(diffs):
                    total[i] += d / seconds
        return {topic: TopicRate(*values) for topic, values in sums.items()}


class LagHistory:
    """A group's total lag as the console saw it each time it asked: the group page's
    lag chart. Bounded: ``groups_max`` groups, ``points_max`` points each."""

    def __init__(self, groups_max: int = 100, points_max: int = 300) -> None:
        self._points: dict[str, deque[tuple[int, float | None]]] = {}
        self._groups_max = groups_max
        self._points_max = points_max
        self._lock = threading.Lock()

    def add(self, group_id: str, unix_ms: int, lag: int | None) -> None:
        with self._lock:
            if group_id not in self._points and len(self._points) >= self._groups_max:
                self._points.pop(next(iter(self._points)))
            q = self._points.setdefault(group_id, deque(maxlen=self._points_max))
            q.append((unix_ms, None if lag is None else float(lag)))

    def series(self, group_id: str) -> list[tuple[int, float | None]]:
        with self._lock:
            return list(self._points.get(group_id, ()))


class LagSampler:
    """Adds every group's total lag to a ``LagHistory`` each ``interval_ms`` (10 s) in a
    background thread, so a group page opened now shows the minutes before it. At most
    ``groups_max`` groups a round (the first by name); a round that fails (the cluster
    not answering) is skipped. The page itself adds a point each time it refreshes."""

    def __init__(self, history: LagHistory, list_groups: Callable[[], list[str]],
                 lag_of: Callable[[str], int | None], *, interval_ms: int = 10_000,
                 groups_max: int = 50) -> None:
        self.history = history
        self._list_groups = list_groups
        self._lag_of = lag_of
        self.interval_ms = interval_ms
        self.groups_max = groups_max
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval_ms > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-lag", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def sample_once(self) -> None:
        try:
            groups = sorted(self._list_groups())[:self.groups_max]
        except (TidewaterError, OSError):  # the cluster did not answer: the next round tries
            return
        for group_id in groups:
            if self._stop.is_set():
                return
            try:
                lag = self._lag_of(group_id)
            except (TidewaterError, OSError):  # its coordinator did not answer: a gap
                lag = None
            self.history.add(group_id, int(time.time() * 1000), lag)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_ms / 1000 - (time.monotonic() - started)))
