"""Options of the gRPC channels a broker opens (to the controller and to leaders).

gRPC's default reconnect backoff grows to 120 s; a broker must notice a
restarted controller or leader within about a second, so the backoff is
capped at ``RECONNECT_BACKOFF_MAX_MS``. With TLS configured a broker's
channels trust only the cluster's CA and present the broker's certificate
(``proto.tls.open_aio_channel``'s ``credentials``): the controller and the
leaders' INTERNAL listeners require it.
"""

from __future__ import annotations

RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1000


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ]

