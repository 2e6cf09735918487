"""The follower side of Kafka's replication throttle (KIP-73): plain code, time passed in.

Kafka's settings, as ``kafka-reassign-partitions.sh --throttle`` sets them:

* ``follower.replication.throttled.rate`` (dynamic broker config, bytes/s; the
  broker's own value over the cluster-wide one; unset: no throttle) caps the
  bytes this broker fetches as a follower for the throttled replicas;
* ``follower.replication.throttled.replicas`` (topic config): ``*`` (every replica
  of the topic) or ``PARTITION:BROKER`` items; a replica is throttled when its
  partition is listed with this broker's id.

As Kafka's ``ReplicaFetcherThread``, a throttled partition is left out of a fetch
while the quota is exceeded, and the bytes fetched for throttled partitions are
counted against it; unthrottled partitions (the ISR's usual traffic) are never
held. The quota is a token bucket: ``rate`` bytes of credit a second, at most one
second's worth saved up; an answer that overdraws it holds the throttled
partitions until the credit is back above zero, so over any long interval the
throttled bytes are at most ``rate`` per second plus one answer and one second's
burst. (``leader.replication.throttled.rate``, the leader side, is not applied:
stored and described only.)
"""

from __future__ import annotations

from collections.abc import Mapping

FOLLOWER_RATE = "follower.replication.throttled.rate"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
CLUSTER_DEFAULT = ""  # the cluster-wide dynamic broker configs' resource name


def follower_rate(overrides: Mapping[str, Mapping[str, str]], broker_id: int) -> int | None:
    """This broker's ``follower.replication.throttled.rate`` (bytes/s), None when unset.
    The values were checked as longs by the controller; a non-positive one is no limit."""
    raw = overrides.get(str(broker_id), {}).get(
        FOLLOWER_RATE, overrides.get(CLUSTER_DEFAULT, {}).get(FOLLOWER_RATE))
    if raw is None:
        return None
    rate = int(raw)
    return rate if rate > 0 else None


def is_throttled(listed: str, partition: int, broker_id: int) -> bool:
    """Is replica (``partition``, ``broker_id``) named by a throttled-replicas value?"""
    items = [item.strip() for item in listed.split(",") if item.strip()]
    if items == ["*"]:
        return True
    return f"{partition}:{broker_id}" in {item.replace(" ", "") for item in items}


class ReplicationQuota:
    """A bytes/s token bucket; ``rate`` None: unlimited."""

    def __init__(self, rate: int | None = None):
        self._rate: int | None = None
        self._credit = 0.0
        self._at_ms: int | None = None
        self.set_rate(rate)

    @property
    def rate(self) -> int | None:
        return self._rate

    def set_rate(self, rate: int | None) -> None:
        if rate == self._rate:
            return
        self._rate = rate
        self._credit = float(rate or 0)  # a new rate starts with one second's credit
        self._at_ms = None

    def _refill(self, now_ms: int) -> None:
        if self._rate is None:
            return
        if self._at_ms is not None and now_ms > self._at_ms:
            self._credit = min(float(self._rate),
                               self._credit + self._rate * (now_ms - self._at_ms) / 1000)
        if self._at_ms is None or now_ms > self._at_ms:
            self._at_ms = now_ms

    def record(self, size_bytes: int, now_ms: int) -> None:
        """Bytes fetched for throttled replicas."""
        if self._rate is None or size_bytes <= 0:
            return
        self._refill(now_ms)
        self._credit -= size_bytes

    def delay_ms(self, now_ms: int) -> int:
        """0 when throttled replicas may fetch now; else how long they wait."""
        if self._rate is None:
            return 0
        self._refill(now_ms)
        if self._credit >= 0:
            return 0
        return int(-self._credit * 1000 / self._rate) + 1
