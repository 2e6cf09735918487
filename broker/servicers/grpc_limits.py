"""What one of the broker's gRPC listeners lets a connection hold (issue 29); the
controller's port and its Raft port use the same limits.

The Kafka listener counts, limits and expires its connections itself
(``broker.kafka.connection_quotas``); a gRPC listener's connections are gRPC core's,
so its limits are channel arguments, set here in one place:

- ``grpc.server_handshake_timeout_ms``: a connection that has not finished its
  handshake (TLS, and the HTTP/2 preface and SETTINGS) within this long is closed. A
  raw TCP connection that sends nothing, or a byte a second, is gone after it
  (gRPC's defaults close it after 60 s, when it has not acknowledged the server's
  SETTINGS; the handshake timeout itself defaults to 120 s).
- ``grpc.max_concurrent_streams``: HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, the calls
  one connection may have open at once; a client's further calls wait on its side
  until one ends. Without it one connection could open calls without end, each a
  handler task here.
- ``grpc.max_connection_idle_ms``: a connection with no call open this long is sent
  GOAWAY (Kafka's ``connections.max.idle.ms``, the same setting); a real client
  reconnects on its next call.
- Keepalive: the server pings a quiet connection every ``keepalive_time_ms`` and
  closes it when no answer comes within ``keepalive_timeout_ms`` (a peer gone
  without a FIN holds nothing for long); a client that pings more often than every
  ``min_ping_interval_ms`` without data is answered GOAWAY after
  ``max_ping_strikes`` (gRPC's keepalive enforcement; Tidewater's clients send no
  pings).

- ``grpc.max_allowed_incoming_connections``: Kafka's ``max.connections`` for this
  listener: a connection accepted beyond it is closed at once by gRPC core (before its
  handshake), until one of the open ones closes. Counted per gRPC server (listener), not
  across the broker's listeners as Kafka does; on INTERNAL the members' connections
  count too. gRPC core has no per-address limit: ``max.connections.per.ip`` applies to
  the Kafka listeners only. The controller's two ports take ``max.connections`` and
  ``connections.max.idle.ms`` too (``controller.config``), each port counted alone, with
  a default bound (``CONTROLLER_MAX_CONNECTIONS``) where the brokers keep Kafka's none.

Kept at gRPC core's defaults: calls that have arrived but not yet been taken up by the
event loop wait in core; beyond ``grpc.server.max_pending_requests`` (1,000) of them, new
calls are ended CANCELLED at random, all of them at the hard limit (3,000). A burst of
thousands of new calls on a busy broker is so shed in gRPC core, before it costs the loop
anything; a Tidewater client takes such an end as a lost connection (retriable
``BrokerConnectionError``, ``client.streams``) and opens the stream again
(``tests/cli/test_grpc_flood.py`` meets it).

A connection's age is not limited: the clients' FetchStream/ProduceStream and the
followers' ReplicaFetch are streams meant to last as long as the process.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidewater.proto.errors import InvalidConfigError, InvariantViolation

CONNECTIONS_UNLIMITED = 2**31 - 1  # Kafka's default max.connections
# The controller's ports are reached by the brokers, the other controllers and admin
# tools: a few connections each. A bound far above that still stops a flood there.
CONTROLLER_MAX_CONNECTIONS = 1_000
CONNECTIONS_MAX_IDLE_MS = 600_000  # Kafka's default connections.max.idle.ms


def check_connection_settings(max_connections: int, connections_max_idle_ms: int) -> None:
    """``max.connections`` and ``connections.max.idle.ms`` of a gRPC port: 1 to 2^31-1
    (gRPC's channel arguments are C ints: a larger one stops the server's creation;
    2^31-1 connections is no limit). InvalidConfigError otherwise."""
    for name, value in (("max.connections", max_connections),
                        ("connections.max.idle.ms", connections_max_idle_ms)):
        if not 0 < value <= CONNECTIONS_UNLIMITED:
            raise InvalidConfigError(f"{name} must be between 1 and {CONNECTIONS_UNLIMITED}, "
                                     f"not {value}")


@dataclass(frozen=True)
class GrpcLimits:
    handshake_timeout_ms: int = 10_000
    max_concurrent_streams: int = 100
    max_connection_idle_ms: int = CONNECTIONS_MAX_IDLE_MS
    keepalive_time_ms: int = 300_000
    keepalive_timeout_ms: int = 20_000
    min_ping_interval_ms: int = 60_000
    max_ping_strikes: int = 2
    max_connections: int = CONNECTIONS_UNLIMITED

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise InvariantViolation(f"gRPC limit {name} = {value}")

    def options(self) -> list[tuple[str, int]]:
        """The channel arguments for ``grpc.aio.server(options=...)``."""
        return [
            ("grpc.server_handshake_timeout_ms", self.handshake_timeout_ms),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.max_connection_idle_ms", self.max_connection_idle_ms),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.http2.min_ping_interval_without_data_ms", self.min_ping_interval_ms),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
        ] + ([("grpc.max_allowed_incoming_connections", self.max_connections)]
             # gRPC core aborts the process on a limit of INT_MAX (it must be below).
             if self.max_connections < CONNECTIONS_UNLIMITED else [])
