"""How many Kafka connections a broker takes, from whom, how fast, and for how long idle
(Kafka's ``SocketServer.ConnectionQuotas`` and ``Selector``'s idle expiry).

Pure bookkeeping, no sockets; the listener (``server.py``) asks ``admit(host, now_ms)``
for each accepted connection and calls ``release(host)`` when it ends. Kafka's names
and defaults:

| setting | default | here |
|---|---|---|
| ``max.connections`` | 2147483647 | connections over every Kafka listener of the broker |
| ``max.connections.per.ip`` | 2147483647 | connections from one address |
| ``max.connections.per.ip.overrides`` | "" | ``host:count,host:count`` (IPv6: the last ``:`` splits) |
| ``max.connection.creation.rate`` | 2147483647 | new connections per second (KIP-612), a token bucket holding one second's worth |
| ``connections.max.idle.ms`` | 600000 | a connection that completes no request and is sent no answer for this long is closed, a frame still arriving included |

Where Kafka's acceptor stops accepting (``max.connections``) or delays (the creation
rate), this listener accepts and closes at once: asyncio's server owns the accept
loop, and a closed refused socket costs the broker nothing after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidewater.proto.errors import InvariantViolation

KAFKA_INT_MAX = 2_147_483_647

REFUSED_TOTAL = "max.connections"
REFUSED_PER_IP = "max.connections.per.ip"
REFUSED_RATE = "max.connection.creation.rate"
REFUSAL_REASONS = (REFUSED_TOTAL, REFUSED_PER_IP, REFUSED_RATE)


def parse_per_ip_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host:count`` pairs separated by commas;
    ValueError."""
    overrides: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host.strip() or not count.strip().isdigit():
            raise ValueError(f"expected host:count, not {item!r}")
        overrides[host.strip().strip("[]")] = int(count)
    return overrides


@dataclass(frozen=True)
class ConnectionLimits:
    connections_max: int = KAFKA_INT_MAX
    connections_per_ip_max: int = KAFKA_INT_MAX
    connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    connection_creation_rate_max: int = KAFKA_INT_MAX  # per second
    idle_ms: int = 600_000

    def __post_init__(self) -> None:
        for name, value in (("max.connections", self.connections_max),
                            ("max.connections.per.ip", self.connections_per_ip_max),
                            ("max.connection.creation.rate", self.connection_creation_rate_max),
                            ("connections.max.idle.ms", self.idle_ms)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        for host, count in self.connections_per_ip_overrides.items():
            if count < 0:
                raise ValueError(f"max.connections.per.ip.overrides: {host} has {count}")

    def per_ip_max(self, host: str) -> int:
        return self.connections_per_ip_overrides.get(host, self.connections_per_ip_max)


class ConnectionQuotas:
    """The open connections by address, and the creation-rate bucket. One owner: the
    broker's event loop (every Kafka listener of a broker shares one)."""

    def __init__(self, limits: ConnectionLimits, now_ms: int) -> None:
        self.limits = limits
        self.total = 0
        self.by_host: dict[str, int] = {}
        rate = limits.connection_creation_rate_max
        self._tokens = float(rate)
        self._refilled_ms = now_ms

    def admit(self, host: str, now_ms: int) -> str | None:
        """Take a new connection from ``host`` (counted until ``release``), or the name of
        the limit that refuses it (nothing counted)."""
        rate = self.limits.connection_creation_rate_max
        elapsed_ms = max(0, now_ms - self._refilled_ms)
        self._tokens = min(float(rate), self._tokens + elapsed_ms * rate / 1000)
        self._refilled_ms = now_ms
        if self._tokens < 1:
            return REFUSED_RATE
        if self.total >= self.limits.connections_max:
            return REFUSED_TOTAL
        if self.by_host.get(host, 0) >= self.limits.per_ip_max(host):
            return REFUSED_PER_IP
        self._tokens -= 1
        self.total += 1
        self.by_host[host] = self.by_host.get(host, 0) + 1
        return None

    def release(self, host: str) -> None:
        count = self.by_host.get(host, 0)
        if count <= 0 or self.total <= 0:
            raise InvariantViolation(f"released a connection from {host} never admitted")
        self.total -= 1
        if count == 1:
            del self.by_host[host]
        else:
            self.by_host[host] = count - 1
