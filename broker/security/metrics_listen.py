"""The /metrics port, bound and listening: what the metrics server will accept on.

Apart from ``metrics_http`` so that a broker can take its port as it starts (a port in use
fails the start, as it always has) without importing the HTTP server stack, which it needs
only once it serves (issue 30's restart time). Connections made meanwhile wait in the
backlog and are answered when the server starts.
"""

from __future__ import annotations

import socket

BACKLOG = 5  # socketserver.TCPServer.request_queue_size, what make_server listened with


def listen_metrics(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (0: a free port), set up as
    ``wsgiref.simple_server.make_server`` sets up its own."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HTTPServer
        listening.bind((host, port))
        listening.listen(BACKLOG)
    except OSError:
        listening.close()
        raise
    return listening
