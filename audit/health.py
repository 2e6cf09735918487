"""Partition health over time from replica gauge samples (pure Python, no Spark).

Input rows are the pivoted replica samples (rules.replica_samples): one per
(timestamp_ms, broker_id, topic, partition) with log_end_offset,
high_watermark, leader_epoch, isr_size, is_leader (any may be None).

For each partition the timeline is the sorted set of sample times of any of
its replicas. At each time a broker counts as leader when its latest sample
at or before that time, no older than ``stale_ms``, says is_leader=1. The
partition is offline over an interval with no leader, under-replicated over
an interval whose leader reports an ISR smaller than the replicas seen for
the partition. ISR shrinks and expands are decreases and increases of a
leader's isr_size within one (broker, leader epoch).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    timestamp_ms: int
    broker_id: int
    topic: str
    partition: int
    log_end_offset: float | None
    high_watermark: float | None
    leader_epoch: float | None
    isr_size: float | None
    is_leader: float | None


def _median_interval_ms(times: list[int]) -> int:
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1000


def partition_health(samples: Iterable[ReplicaSample]) -> list[dict]:
    """One summary dict per partition (sorted by topic, partition)."""
    by_partition: dict[tuple[str, int], list[ReplicaSample]] = defaultdict(list)
    for s in samples:
        by_partition[(s.topic, s.partition)].append(s)
    out = []
    for (topic, partition), rows in sorted(by_partition.items()):
        rows.sort(key=lambda s: (s.timestamp_ms, s.broker_id))
        brokers = sorted({s.broker_id for s in rows})
        per_broker: dict[int, list[ReplicaSample]] = defaultdict(list)
        for s in rows:
            per_broker[s.broker_id].append(s)
        times = sorted({s.timestamp_ms for s in rows})
        stale_ms = 3 * max(_median_interval_ms(sorted({s.timestamp_ms for s in per_broker[b]}))
                           for b in brokers)
        latest: dict[int, ReplicaSample] = {}
        offline_ms = under_replicated_ms = 0
        idx = 0
        for i, t in enumerate(times):
            while idx < len(rows) and rows[idx].timestamp_ms <= t:
                latest[rows[idx].broker_id] = rows[idx]
                idx += 1
            if i + 1 == len(times):
                break
            dt = times[i + 1] - t
            leaders = [s for s in latest.values()
                       if s.is_leader == 1 and t - s.timestamp_ms <= stale_ms]
            if not leaders:
                offline_ms += dt
            elif any(s.isr_size is not None and s.isr_size < len(brokers) for s in leaders):
                under_replicated_ms += dt
        shrinks = expands = 0
        for series in per_broker.values():
            prev = None
            for s in series:
                if s.is_leader != 1 or s.isr_size is None:
                    prev = None
                    continue
                if prev is not None and prev.leader_epoch == s.leader_epoch:
                    shrinks += s.isr_size < prev.isr_size
                    expands += s.isr_size > prev.isr_size
                prev = s
        out.append({
            "topic": topic, "partition": partition, "replicas_seen": len(brokers),
            "observed_ms": times[-1] - times[0] if times else 0,
            "offline_ms": offline_ms, "under_replicated_ms": under_replicated_ms,
            "isr_shrinks": int(shrinks), "isr_expands": int(expands),
            "leader_epochs_seen": sorted({int(s.leader_epoch) for s in rows
                                          if s.is_leader == 1 and s.leader_epoch is not None}),
        })
    return out


def under_replicated_timeline(samples: Iterable[ReplicaSample]) -> list[tuple[int, int]]:
    """(time, partitions whose leader reports a short ISR) at each leader sample time."""
    rows = sorted(samples, key=lambda s: s.timestamp_ms)
    replicas: dict[tuple[str, int], set[int]] = defaultdict(set)
    for s in rows:
        replicas[(s.topic, s.partition)].add(s.broker_id)
    state: dict[tuple[str, int], bool] = {}
    out: list[tuple[int, int]] = []
    for s in rows:
        if s.is_leader != 1 or s.isr_size is None:
            continue
        state[(s.topic, s.partition)] = s.isr_size < len(replicas[(s.topic, s.partition)])
        count = sum(state.values())
        if out and out[-1][0] == s.timestamp_ms:
            out[-1] = (s.timestamp_ms, count)
        else:
            out.append((s.timestamp_ms, count))
    return out
