#!/opt/tidewater/bin/python -I
"""Container health check: exit 0 only when the local process answers a gRPC call.

Usage: tidewater-healthcheck broker|controller|quorum [PORT]

A broker must answer ``tidewater.Broker/Metadata``, the controller
``tidewater.Controller/DescribeCluster``, each with an empty request. A controller
of a quorum (``quorum``, its Raft port, 9093) must answer
``tidewater.ControllerQuorum/DescribeQuorum``: every controller answers it with its
own view, standbys too (they answer the Controller service's calls with
NOT_CONTROLLER, which would leave them unhealthy for good). A port
that accepts connections but does not answer the call fails: that is the point.

Why no grpc import: Docker runs this every few seconds in every container, and
importing grpc costs close to a CPU-second; four containers would keep a core
busy. So this speaks the few bytes of HTTP/2 a unary gRPC call needs, with the
standard library only (about 30 ms):

1. client preface + an empty SETTINGS frame;
2. HEADERS on stream 1 (HPACK literal fields, no compression, no table):
   POST /<service>/<method>, content-type application/grpc, te trailers;
3. DATA on stream 1 with END_STREAM: the gRPC message prefix (flag 0,
   length 0), i.e. an empty protobuf request;
4. read frames: a DATA frame on stream 1 means the handler answered (gRPC
   sends errors as trailers only, without DATA); RST_STREAM, GOAWAY, a
   HEADERS frame ending the stream before any DATA, EOF or the timeout fail.

With TLS (``TIDE_TLS_CA``, ``TIDE_TLS_CERT``, ``TIDE_TLS_KEY`` set, as the
compose TLS override sets them for the process itself) the same bytes go over
TLS with ALPN ``h2``, presenting the process's own certificate (its listeners
require one of the cluster's CA) and checking the server's against the CA.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys

TIMEOUT_S = 3.0
DEFAULT_PORTS = {"broker": 9092, "controller": 9090, "quorum": 9093}
METHODS = {"broker": "/tidewater.Broker/Metadata",
           "controller": "/tidewater.Controller/DescribeCluster",
           "quorum": "/tidewater.ControllerQuorum/DescribeQuorum"}

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


class Unhealthy(Exception):
    pass


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags])
            + (stream & 0x7FFFFFFF).to_bytes(4, "big") + payload)


def hpack_literal(name: str, value: str) -> bytes:
    """Literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    out = bytearray([0x00])
    for text in (name.encode(), value.encode()):
        if len(text) >= 127:
            raise ValueError("header too long for this tiny encoder")
        out.append(len(text))
        out += text
    return bytes(out)


def request_bytes(path: str, authority: str) -> bytes:
    headers = b"".join(hpack_literal(n, v) for n, v in (
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers")))
    return (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, headers)
            + frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00"))


def read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise Unhealthy("connection closed before an answer")
        buf += chunk
    return bytes(buf)


def tls_context(environ=os.environ) -> ssl.SSLContext | None:
    """The client context for the process's own TLS files, or None without TLS."""
    ca, cert, key = (environ.get(n) for n in ("TIDE_TLS_CA", "TIDE_TLS_CERT", "TIDE_TLS_KEY"))
    if not (ca and cert and key):
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    return context


def call(port: int, path: str, context: ssl.SSLContext | None = None) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as raw:
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw
        sock.settimeout(TIMEOUT_S)
        sock.sendall(request_bytes(path, f"127.0.0.1:{port}"))
        while True:
            header = read_exactly(sock, 9)
            length = int.from_bytes(header[:3], "big")
            kind, flags = header[3], header[4]
            stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
            payload = read_exactly(sock, length)
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise Unhealthy("server sent GOAWAY")
            elif stream == 1 and kind == RST_STREAM:
                raise Unhealthy("server reset the call")
            elif stream == 1 and kind == DATA and length >= 5:
                return  # the handler produced a response message
            elif stream == 1 and kind == HEADERS and flags & END_STREAM:
                raise Unhealthy("call answered with an error status (trailers only)")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in DEFAULT_PORTS:
        print("usage: tidewater-healthcheck broker|controller|quorum [PORT]", file=sys.stderr)
        return 2
    role = argv[0]
    port = int(argv[1]) if len(argv) > 1 else DEFAULT_PORTS[role]
    try:
        call(port, METHODS[role], tls_context())
    except (OSError, Unhealthy) as e:  # ssl.SSLError is an OSError
        print(f"unhealthy: {role} on port {port}: {e}", file=sys.stderr)
        return 1
    print(f"healthy: {role} on port {port}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
