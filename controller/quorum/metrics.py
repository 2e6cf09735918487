"""Kafka's Raft metrics (``kafka.server:type=raft-metrics``) on a controller's /metrics.

Names are Kafka's with ``-`` as ``_`` and the prefix ``tidewater_raft_``:

=================================  ===========================================================
``current_leader``                 the leader's node id (-1: unknown)
``current_epoch``                  the quorum epoch
``current_vote``                   whom this node voted for in the epoch (-1: no one)
``current_state{state}``           1 for this node's role (leader, follower, candidate, ...)
``high_watermark``                 the committed end of the metadata log (-1: unknown)
``log_end_offset``                 this node's log end offset
``commit_latency_avg`` / ``_max``  ms from a proposal on the leader to its commit, over the
                                   last ``WINDOW_MS`` (NaN without a sample, as Kafka)
``commit_latency_p50`` / ``_p99``  the same samples' median and 99th percentile (nearest
                                   rank; Tidewater's own, Kafka reports avg/max only)
``append_records_rate``            records the leader appended per second, over the window
                                   (``append_records_total`` counts them all)
``election_latency_avg`` / ``_max``  ms a node spent without a known leader before it
                                   learned (or became) one, over the window
``number_unknown_voter_connections``  voters of the log this node has no address for
``voter_lag{voter}``               on the leader only: each voter's entries behind the
                                   leader's log end (``tide quorum describe --replication``)
=================================  ===========================================================

The shell (``shell.py``) feeds it on the event loop after each drain (``observe``),
and with each commit a proposal waited for (``on_committed``). Kafka samples its
windowed statistics in two windows of 30 s; one window of ``WINDOW_MS`` here.
"""

from __future__ import annotations

import math
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge

from tidewater.controller.raft import RaftNode, Role

PREFIX = "tidewater_raft_"
WINDOW_MS = 60_000
SAMPLES_MAX = 10_000  # per window: a burst of commits cannot grow memory without bound


class WindowedStat:
    """avg, max and per-second sum of the samples of the last ``window_ms``."""

    def __init__(self, window_ms: int = WINDOW_MS, samples_max: int = SAMPLES_MAX):
        self.window_ms = window_ms
        self._samples: deque[tuple[int, float]] = deque(maxlen=samples_max)
        self._started_ms: int | None = None

    def record(self, value: float, now_ms: int) -> None:
        if self._started_ms is None:
            self._started_ms = now_ms
        self._samples.append((now_ms, value))

    def _expire(self, now_ms: int) -> None:
        while self._samples and self._samples[0][0] <= now_ms - self.window_ms:
            self._samples.popleft()

    def avg(self, now_ms: int) -> float:
        self._expire(now_ms)
        if not self._samples:
            return math.nan
        return sum(v for _, v in self._samples) / len(self._samples)

    def max(self, now_ms: int) -> float:
        self._expire(now_ms)
        return max((v for _, v in self._samples), default=math.nan)

    def quantile(self, q: float, now_ms: int) -> float:
        """The nearest-rank ``q`` quantile (0 < q <= 1) of the window's samples."""
        self._expire(now_ms)
        if not self._samples:
            return math.nan
        values = sorted(v for _, v in self._samples)
        return values[max(0, math.ceil(q * len(values)) - 1)]

    def rate_per_s(self, now_ms: int) -> float:
        self._expire(now_ms)
        if self._started_ms is None:
            return 0.0
        elapsed_ms = min(self.window_ms, max(1, now_ms - self._started_ms))
        return sum(v for _, v in self._samples) * 1000 / elapsed_ms


class RaftMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.current_leader = Gauge(PREFIX + "current_leader",
                                    "The quorum leader's node id (-1: unknown)", registry=r)
        self.current_epoch = Gauge(PREFIX + "current_epoch", "The quorum epoch", registry=r)
        self.current_vote = Gauge(PREFIX + "current_vote",
                                  "The node this one voted for in the epoch (-1: none)",
                                  registry=r)
        self.current_state = Gauge(PREFIX + "current_state", "1 for this node's Raft role",
                                   ["state"], registry=r)
        self.high_watermark = Gauge(PREFIX + "high_watermark",
                                    "The metadata log's committed end (-1: unknown)", registry=r)
        self.log_end_offset = Gauge(PREFIX + "log_end_offset", "This node's log end offset",
                                    registry=r)
        self.commit_latency_avg = Gauge(PREFIX + "commit_latency_avg",
                                        "Average ms from proposal to commit (window)",
                                        registry=r)
        self.commit_latency_max = Gauge(PREFIX + "commit_latency_max",
                                        "Maximum ms from proposal to commit (window)",
                                        registry=r)
        self.commit_latency_p50 = Gauge(PREFIX + "commit_latency_p50",
                                        "Median ms from proposal to commit (window)",
                                        registry=r)
        self.commit_latency_p99 = Gauge(PREFIX + "commit_latency_p99",
                                        "99th percentile ms from proposal to commit (window)",
                                        registry=r)
        self.append_records_rate = Gauge(PREFIX + "append_records_rate",
                                         "Records appended by the leader per second (window)",
                                         registry=r)
        self.append_records = Counter(PREFIX + "append_records",
                                      "Records appended by this node as leader", registry=r)
        self.election_latency_avg = Gauge(PREFIX + "election_latency_avg",
                                          "Average ms without a known leader (window)",
                                          registry=r)
        self.election_latency_max = Gauge(PREFIX + "election_latency_max",
                                          "Maximum ms without a known leader (window)",
                                          registry=r)
        self.number_unknown_voter_connections = Gauge(
            PREFIX + "number_unknown_voter_connections",
            "Voters of the log this node has no address for", registry=r)
        self.voter_lag = Gauge(PREFIX + "voter_lag",
                               "On the leader: each voter's entries behind its log end",
                               ["voter"], registry=r)
        self._commit_latency = WindowedStat()
        self._appended = WindowedStat()
        self._election_latency = WindowedStat()
        self._leaderless_since_ms: int | None = None
        self._lag_labels: set[str] = set()
        self._state: str | None = None

    def on_appended(self, records: int, now_ms: int) -> None:
        self.append_records.inc(records)
        self._appended.record(records, now_ms)

    def on_committed(self, latency_ms: int, now_ms: int) -> None:
        self._commit_latency.record(latency_ms, now_ms)

    def observe(self, node: RaftNode, known_peers: set[int], now_ms: int) -> None:
        """The gauges from the node's state (on the event loop, after a drain)."""
        leader = node.leader_id
        if leader is None:
            if self._leaderless_since_ms is None:
                self._leaderless_since_ms = now_ms
        elif self._leaderless_since_ms is not None:
            self._election_latency.record(now_ms - self._leaderless_since_ms, now_ms)
            self._leaderless_since_ms = None
        self.current_leader.set(-1 if leader is None else leader)
        self.current_epoch.set(node.epoch)
        self.current_vote.set(-1 if node.voted_for is None else node.voted_for.id)
        state = node.role.value
        if state != self._state:
            for role in Role:
                self.current_state.labels(role.value).set(1 if role.value == state else 0)
            self._state = state
        # A follower knows the high watermark only from its leader's answers; the leader's
        # is exact once its epoch's first entry committed.
        self.high_watermark.set(node.high_watermark if leader is not None else -1)
        self.log_end_offset.set(node.log_end_offset)
        self.commit_latency_avg.set(self._commit_latency.avg(now_ms))
        self.commit_latency_max.set(self._commit_latency.max(now_ms))
        self.commit_latency_p50.set(self._commit_latency.quantile(0.50, now_ms))
        self.commit_latency_p99.set(self._commit_latency.quantile(0.99, now_ms))
        self.append_records_rate.set(self._appended.rate_per_s(now_ms))
        self.election_latency_avg.set(self._election_latency.avg(now_ms))
        self.election_latency_max.set(self._election_latency.max(now_ms))
        self.number_unknown_voter_connections.set(sum(
            1 for v in node.voters if v.id != node.local.id and v.id not in known_peers))
        labels: set[str] = set()
        if node.is_leader:
            for replica in node.describe(now_ms).replicas:
                if replica.is_voter:
                    label = str(replica.key.id)
                    self.voter_lag.labels(label).set(replica.lag)
                    labels.add(label)
        for gone in self._lag_labels - labels:
            self.voter_lag.remove(gone)
        self._lag_labels = labels
