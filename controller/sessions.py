"""Broker sessions: when each broker last heartbeated, on which stream, and who is shutting down.

Not durable on purpose: a restarted controller, or a new active controller of
the quorum, gives every broker it knows a fresh session counted from the moment
it became active (as KRaft does on failover), so a broker that stays silent
under the new controller is fenced one session timeout after the takeover.

Heartbeat streams: a broker sends its heartbeats on one ``BrokerHeartbeats``
stream. Each stream gets an id from the service; the session remembers the
stream that carried the broker's latest heartbeat. When a stream ends, the
broker is fenced at once only if (``stream_end_fences``):

* that stream carried its latest heartbeat (a newer stream since then means
  the broker is alive and moved on), and
* it did not finish a controlled shutdown (``should_shutdown`` answered: the
  broker closes its stream on purpose and exits; its session expiring later
  fences it without any hurry, as it leads nothing).

The broker epoch and fenced checks live in the state machine, which owns the
registrations. A paused or partitioned broker keeps its connection (and
stream) open: the session timeout stays the detector for those.
"""

from __future__ import annotations

from collections.abc import Iterable


class BrokerSessions:
    def __init__(self, session_timeout_ms: int):
        self.session_timeout_ms = session_timeout_ms
        self._last_heartbeat_ms: dict[int, int] = {}
        self._in_controlled_shutdown: set[int] = set()
        self._shutdown_done: set[int] = set()
        self._stream_of: dict[int, int | None] = {}  # stream of the latest heartbeat (None: none)

    def touch(self, broker_id: int, now_ms: int, stream_id: int | None = None) -> None:
        self._last_heartbeat_ms[broker_id] = now_ms
        self._stream_of[broker_id] = stream_id

    def begin_controlled_shutdown(self, broker_id: int) -> None:
        self._in_controlled_shutdown.add(broker_id)

    def in_controlled_shutdown(self, broker_id: int) -> bool:
        return broker_id in self._in_controlled_shutdown

    def finish_controlled_shutdown(self, broker_id: int) -> None:
        """``should_shutdown`` was answered: the broker may now close its stream and exit."""
        self._shutdown_done.add(broker_id)

    def stream_end_fences(self, broker_id: int, stream_id: int) -> bool:
        """Whether the end of heartbeat stream ``stream_id`` means the broker is gone."""
        return (self._stream_of.get(broker_id) == stream_id
                and broker_id not in self._shutdown_done)

    def alive(self, broker_id: int, now_ms: int) -> bool:
        """Whether the broker's registered incarnation still holds its session: it
        heartbeated (or registered) within the session timeout, was not fenced since, and
        did not finish a controlled shutdown (a broker that did is on its way out and may
        be restarted at once)."""
        last_ms = self._last_heartbeat_ms.get(broker_id)
        return (last_ms is not None and broker_id not in self._shutdown_done
                and last_ms >= now_ms - self.session_timeout_ms)

    def reset(self, broker_id: int, now_ms: int) -> None:
        """A new registration: a fresh session, not shutting down, no stream yet."""
        self._in_controlled_shutdown.discard(broker_id)
        self._shutdown_done.discard(broker_id)
        self._stream_of.pop(broker_id, None)
        self._last_heartbeat_ms[broker_id] = now_ms

    def end(self, broker_id: int) -> None:
        """The broker was fenced: forget its session."""
        self._in_controlled_shutdown.discard(broker_id)
        self._shutdown_done.discard(broker_id)
        self._stream_of.pop(broker_id, None)
        self._last_heartbeat_ms.pop(broker_id, None)

    def expired(self, broker_ids: Iterable[int], now_ms: int) -> list[int]:
        """Those of ``broker_ids`` silent for longer than the session timeout."""
        deadline = now_ms - self.session_timeout_ms
        return sorted(b for b in broker_ids if self._last_heartbeat_ms.get(b, -1) < deadline)
