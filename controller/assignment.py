"""Replica assignment for new topics: Kafka's rack-unaware round robin.

Partition p's first replica is broker ``(start + p) % n``; the other replicas
follow at a shift that grows by one every n partitions, so that both leaders
and followers spread evenly. Kafka picks ``start`` and the shift at random; we
derive them from a per-topic sequence number so results are reproducible and
consecutive single-partition topics still get different leaders.
"""

from __future__ import annotations

from collections.abc import Sequence


def assign_replicas(broker_ids: Sequence[int], num_partitions: int, replication_factor: int,
                    *, topic_sequence: int) -> list[tuple[int, ...]]:
    """Replica lists (preferred replica first) for partitions 0..num_partitions-1."""
    brokers = sorted(broker_ids)
    n = len(brokers)
    if not 1 <= replication_factor <= n:
        raise ValueError(f"replication factor {replication_factor} with {n} brokers")
    if num_partitions < 1:
        raise ValueError(f"{num_partitions} partitions")
    start = topic_sequence % n
    shift = (topic_sequence // n) % n
    assignment = []
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            # Kafka's replicaIndex(): the shift is in 1..n-1 so it never hits `first`.
            offset = 1 + (shift + j) % (n - 1)
            replicas.append(brokers[(first + offset) % n])
        assignment.append(tuple(replicas))
    return assignment
