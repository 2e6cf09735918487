"""The floor of TLS on the Kafka listener's receive path: a uvloop server with a
``BufferedProtocol`` (as ``broker/kafka/framing.py``) receiving bytes from another process,
plaintext against TLS (the cluster's own kind of certificate, ``tools/certs.py``), and the
server's CPU per MB. No broker code runs: what TLS through asyncio's memory-BIO SSL protocol
costs before any request is parsed.

    .venv/bin/python bench/probes/tls_receive_floor.py [--mib 1024] [--rounds 2]
                                                       [--write-bytes 262144]

``--write-bytes 1046``: the sender writes that much at a time with TCP_NODELAY, so each
write is one TLS record and one segment, as librdkafka sends a produce request under TLS
(one ``SSL_write`` per buffer segment: each 1 KiB payload is a record of its own).

Prints one table: MB/s and the server process's CPU ms per MB (user and total) for each
transport and receive buffer size, alternated ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import multiprocessing
import os
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from bench.bench_common import KIB, format_table, median, stop_child
from tidewater.tools import certs

CHUNK_BYTES = 256 * KIB  # the sender's writes: a 256 KiB produce request at a time
BUFFER_SIZES = (64 * KIB, 1024 * KIB)


def send(port: int, ca_file: str | None, total_bytes: int, size_prefixed: bool = False,
         write_bytes: int = CHUNK_BYTES) -> None:
    """In a process of its own: ``total_bytes`` to ``port`` in 256 KiB chunks (TLS when
    ``ca_file``), each a size-prefixed frame when ``size_prefixed`` (a produce request),
    written ``write_bytes`` at a time (smaller: with TCP_NODELAY, as librdkafka)."""
    sock: socket.socket = socket.create_connection(("127.0.0.1", port))
    if write_bytes < CHUNK_BYTES:  # small writes as librdkafka's: each its own segment
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ca_file is not None:
        sock = ssl.create_default_context(cafile=ca_file).wrap_socket(
            sock, server_hostname="localhost")
    chunk = ((CHUNK_BYTES.to_bytes(4, "big") if size_prefixed else b"")
             + os.urandom(CHUNK_BYTES))
    pieces = [memoryview(chunk)[i:i + write_bytes] for i in range(0, len(chunk), write_bytes)]
    sent = 0
    while sent < total_bytes:
        for piece in pieces:
            sock.sendall(piece)
        sent += len(chunk)
    sock.close()


def server_context(directory: Path) -> tuple[ssl.SSLContext, str]:
    """A TLS server context with a broker certificate of a new CA (files in
    ``directory``), and the CA file a sender trusts."""
    now = datetime.datetime.now(datetime.UTC)
    ca = certs.make_ca(now=now)
    server_cert = certs.issue(ca, name="broker-1", role="broker", now=now)
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_file.write_bytes(ca.cert_pem)
    cert_file.write_bytes(server_cert.cert_pem)
    key_file.write_bytes(server_cert.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context, str(ca_file)


async def timed_transfer(port: int, ca_file: str | None, total_bytes: int,
                         started: Callable[[], bool], on_start: Callable[[], None],
                         done: asyncio.Future[None], size_prefixed: bool = False,
                         write_bytes: int = CHUNK_BYTES) -> tuple[float, float, float]:
    """A sender process to ``port``; from when ``started()`` (past start-up and the
    handshake; ``on_start`` then) until ``done``: (seconds, this process's user CPU s,
    its total CPU s)."""
    sender = multiprocessing.get_context("spawn").Process(
        target=send, args=(port, ca_file, total_bytes, size_prefixed, write_bytes))
    sender.start()
    try:
        while not started():
            await asyncio.sleep(0.001)
        cpu_before, start = os.times(), time.perf_counter()
        on_start()
        await asyncio.wait_for(done, 120)
        elapsed, cpu_after = time.perf_counter() - start, os.times()
    finally:
        stop_child(sender, join_timeout_s=30)
    user = cpu_after.user - cpu_before.user
    return elapsed, user, user + cpu_after.system - cpu_before.system


class Receiver(asyncio.BufferedProtocol):
    def __init__(self, done: asyncio.Future, buffer_bytes: int, total_bytes: int):
        self.buffer = memoryview(bytearray(buffer_bytes))
        self.received = 0
        self.total_bytes = total_bytes
        self.done = done

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self.received >= self.total_bytes and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def measure(context: ssl.SSLContext | None, ca_file: str | None, buffer_bytes: int,
                  total_bytes: int, write_bytes: int = CHUNK_BYTES) -> tuple[float, float, float]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    receivers: list[Receiver] = []

    def make() -> Receiver:
        receiver = Receiver(done, buffer_bytes, total_bytes)
        receivers.append(receiver)
        return receiver

    server = await loop.create_server(make, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    already = [0]
    try:
        elapsed, user, total = await timed_transfer(
            port, ca_file, total_bytes, lambda: bool(receivers) and receivers[0].received > 0,
            lambda: already.__setitem__(0, receivers[0].received), done,
            write_bytes=write_bytes)
    finally:
        server.close()
    megabytes = (receivers[0].received - already[0]) / 1e6
    return megabytes / elapsed, user * 1e3 / megabytes, total * 1e3 / megabytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-bytes", type=int, default=CHUNK_BYTES,
                        help="the sender's write size (1046: librdkafka's records under TLS)")
    args = parser.parse_args()
    total_bytes = args.mib * 1024 * KIB
    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tls-floor-") as tmp:
        context, ca_file = server_context(Path(tmp))
        for _ in range(args.rounds):
            for transport in ("plaintext", "TLS"):
                for buffer_bytes in BUFFER_SIZES:
                    tls = transport == "TLS"
                    result = uvloop.run(measure(context if tls else None,
                                                ca_file if tls else None,
                                                buffer_bytes, total_bytes, args.write_bytes))
                    runs.setdefault((transport, buffer_bytes), []).append(result)
    rows = [[transport, f"{buffer_bytes // KIB} KiB",
             f"{median([r[0] for r in measured]):,.0f}",
             f"{median([r[1] for r in measured]):.2f}", f"{median([r[2] for r in measured]):.2f}"]
            for (transport, buffer_bytes), measured in runs.items()]
    print(f"{args.mib} MiB per run from another process in {args.write_bytes:,} B writes, "
          f"uvloop {uvloop.__version__}, {ssl.OPENSSL_VERSION}; medians of {args.rounds}")
    print(format_table(["transport", "receive buffer", "MB/s", "server user ms/MB",
                        "server CPU ms/MB"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
