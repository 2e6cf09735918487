"""The Kafka listener's receive path with its own framing, plaintext against TLS: a uvloop
server whose protocol is ``broker/kafka/framing.py``'s ``FrameConnection`` (a reader task
taking each frame, as the listener's), fed 256 KiB size-prefixed frames (a produce request
each) by another process. ``tls_receive_floor.py`` without the framing; this one with it,
so the difference between the two is what the framing adds under TLS.

    .venv/bin/python bench/probes/tls_frame_receive.py [--mib 512] [--rounds 2]
                                                       [--write-bytes 262144]

``--write-bytes 1046``: the sender writes each frame that much at a time, one TLS record
each, as librdkafka does (see ``tls_receive_floor.py``).

Prints MB/s, the server's CPU ms per MB, and per MB: ``buffer_updated`` calls (each one a
pass of the loop under TLS when it filled the buffer offered) and bytes copied while a
large frame's buffer grows.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from bench.bench_common import KIB, format_table, median
from bench.probes import tls_receive_floor
from tidewater.broker.kafka import framing

FRAME_BYTES = tls_receive_floor.CHUNK_BYTES  # one produce request (batch.size in the bench)


class CountingConnection(framing.FrameConnection):
    """The listener's protocol, counting what the loop asks of it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.updates = 0
        self.grown_bytes = 0

    def buffer_updated(self, nbytes: int) -> None:
        self.updates += 1
        super().buffer_updated(nbytes)

    def _grow_frame(self, *arrived_bytes: int) -> None:  # base: no argument
        self.grown_bytes += self._frame_filled
        super()._grow_frame(*arrived_bytes)


async def measure(context: ssl.SSLContext | None, ca_file: str | None, total_bytes: int,
                  write_bytes: int = FRAME_BYTES) -> tuple[float, float, float, float]:
    loop = asyncio.get_running_loop()
    connections: list[CountingConnection] = []
    received = [0]
    done = loop.create_future()

    async def read(connection: CountingConnection) -> None:
        try:
            while True:
                received[0] += len(await connection.read_frame())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if not done.done():
                done.set_result(None)

    def opened(connection: framing.FrameConnection) -> None:
        loop.create_task(read(connection))  # type: ignore[arg-type]

    def make() -> CountingConnection:
        connection = CountingConnection(opened, frame_bytes_max=100 * 1024 * KIB)
        connections.append(connection)
        return connection

    server = await loop.create_server(make, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    at_start = [0, 0, 0]  # received, buffer_updated calls, grown bytes

    def on_start() -> None:
        at_start[:] = [received[0], connections[0].updates, connections[0].grown_bytes]
    try:
        elapsed, _, cpu = await tls_receive_floor.timed_transfer(
            port, ca_file, total_bytes, lambda: received[0] > 0, on_start, done,
            size_prefixed=True, write_bytes=write_bytes)
    finally:
        server.close()
    already, updates, grown = at_start
    megabytes = (received[0] - already) / 1e6
    return (megabytes / elapsed, cpu * 1e3 / megabytes,
            (connections[0].updates - updates) / megabytes,
            (connections[0].grown_bytes - grown) / 1e6 / megabytes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-bytes", type=int, default=FRAME_BYTES,
                        help="the sender's write size (1046: librdkafka's records under TLS)")
    parser.add_argument("--only", choices=("plaintext", "TLS"), default=None,
                        help="one transport (to profile it)")
    args = parser.parse_args()
    total_bytes = args.mib * 1024 * KIB
    runs: dict[str, list[tuple[float, float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tls-frames-") as tmp:
        context, ca_file = tls_receive_floor.server_context(Path(tmp))
        for _ in range(args.rounds):
            for transport in (args.only,) if args.only else ("plaintext", "TLS"):
                tls = transport == "TLS"
                runs.setdefault(transport, []).append(uvloop.run(measure(
                    context if tls else None, ca_file if tls else None, total_bytes,
                    args.write_bytes)))
    rows = [[transport, *(f"{median([r[i] for r in measured]):,.2f}" for i in range(4))]
            for transport, measured in runs.items()]
    print(f"{args.mib} MiB per run in {FRAME_BYTES // KIB} KiB frames written "
          f"{args.write_bytes:,} B at a time, uvloop "
          f"{uvloop.__version__}, {ssl.OPENSSL_VERSION}; medians of {args.rounds}")
    print(format_table(["transport", "MB/s", "server CPU ms/MB", "buffer_updated per MB",
                        "grow copies MB per MB"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
