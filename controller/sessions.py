"""Broker sessions: when each broker last heartbeated, and who is shutting down.

Not durable on purpose: a restarted controller gives every broker it knows a
fresh session (as KRaft does on failover), twice as long as usual, so a broker
is fenced only after it stayed silent for two session timeouts under the new
controller (its channel may need a while to reconnect).
"""

from __future__ import annotations

from collections.abc import Iterable


class BrokerSessions:
    def __init__(self, session_timeout_ms: int):
        self.session_timeout_ms = session_timeout_ms
        self._last_heartbeat_ms: dict[int, int] = {}
        self._in_controlled_shutdown: set[int] = set()

    def touch(self, broker_id: int, now_ms: int) -> None:
        self._last_heartbeat_ms[broker_id] = now_ms

    def begin_controlled_shutdown(self, broker_id: int) -> None:
        self._in_controlled_shutdown.add(broker_id)

    def in_controlled_shutdown(self, broker_id: int) -> bool:
        return broker_id in self._in_controlled_shutdown

    def reset(self, broker_id: int, now_ms: int) -> None:
        """A new registration: a fresh session, not shutting down."""
        self._in_controlled_shutdown.discard(broker_id)
        self._last_heartbeat_ms[broker_id] = now_ms

    def end(self, broker_id: int) -> None:
        """The broker was fenced: forget its session."""
        self._in_controlled_shutdown.discard(broker_id)
        self._last_heartbeat_ms.pop(broker_id, None)

    def expired(self, broker_ids: Iterable[int], now_ms: int) -> list[int]:
        """Those of ``broker_ids`` silent for longer than the session timeout."""
        deadline = now_ms - self.session_timeout_ms
        return sorted(b for b in broker_ids if self._last_heartbeat_ms.get(b, -1) < deadline)
