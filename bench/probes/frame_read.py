"""CPU to receive size-prefixed frames: asyncio's StreamReader against FrameConnection.

    .venv/bin/python bench/probes/frame_read.py [--frame-bytes 261599] [--frames 4000] [--rounds 3]

A child process writes ``--frames`` frames of ``--frame-bytes`` over loopback TCP
as fast as it can; this process (uvloop) reads them with one of the two readers
and the table gives this process's CPU µs per frame (user + system, so the
kernel's copy is in both). The readers alternate, ``--rounds`` times each.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench.bench_common import format_table  # noqa: E402

SENDER = """
import socket, sys
port, size, count = map(int, sys.argv[1:4])
frame = size.to_bytes(4, "big") + bytes(size)
with socket.create_connection(("127.0.0.1", port)) as s:
    for _ in range(count):
        s.sendall(frame)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
"""


async def receive(kind: str, frame_bytes: int, frames: int) -> float:
    """CPU seconds of this process to read ``frames`` frames with reader ``kind``."""
    from tidewater.broker.kafka.framing import FrameConnection

    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    cpu_start = [0.0]

    async def consume(read, reply) -> None:
        cpu_start[0] = time.process_time()
        for _ in range(frames):
            frame = await read()
            assert len(frame) == frame_bytes
        done.set_result(time.process_time() - cpu_start[0])
        reply()

    if kind == "StreamReader":
        async def serve(reader, writer):
            async def read():
                size = int.from_bytes(await reader.readexactly(4), "big")
                return await reader.readexactly(size)
            await consume(read, lambda: writer.write(b"x"))
        server = await asyncio.start_server(serve, "127.0.0.1", 0, limit=1024 * 1024)
    else:
        def opened(connection: FrameConnection) -> None:
            loop.create_task(consume(connection.read_frame, lambda: connection.write(b"x")))
        server = await loop.create_server(
            lambda: FrameConnection(opened, frame_bytes_max=64 * 1024 * 1024), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(port), str(frame_bytes),
                               str(frames)])
    try:
        return await asyncio.wait_for(done, 300)
    finally:
        server.close()
        sender.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frame-bytes", type=int, default=261_599)
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import uvloop

    from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers

    tune_malloc_for_large_buffers()  # as the broker does

    rows = []
    for round_number in range(1, args.rounds + 1):
        for kind in ("StreamReader", "FrameConnection"):
            cpu_s = uvloop.run(receive(kind, args.frame_bytes, args.frames))
            rows.append([str(round_number), kind, f"{args.frame_bytes:,}",
                         f"{1e6 * cpu_s / args.frames:,.1f}"])
    print(format_table(["round", "reader", "frame bytes", "CPU µs per frame"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
