"""Options of the gRPC channels a broker opens (to the controller and to leaders).

gRPC's default reconnect backoff grows to 120 s; a broker must notice a
restarted controller or leader within about a second, so the backoff is
capped at ``RECONNECT_BACKOFF_MAX_MS``. With TLS configured a broker's
channels trust only the cluster's CA and present the broker's certificate
(``open_channel``'s ``credentials``): the controller and the leaders' INTERNAL
listeners require it.
"""

from __future__ import annotations

import grpc

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


def open_channel(target: str, options: list[tuple[str, int]],
                 credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """An aio channel to ``target``: TLS with ``credentials``, else plaintext."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)
