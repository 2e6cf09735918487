"""The machine's floor for one message round trip: raw TCP against a grpc.aio stream.

    .venv/bin/python bench/probes/transport_floor.py [--round-trips 5000] [--bytes 64]

Two processes on 127.0.0.1 play ping-pong one message at a time, first over a
plain TCP socket (TCP_NODELAY, blocking ``sendall``/``recv``), then over a
grpc.aio bidi stream on uvloop (a generic echo handler, bytes in and out, no
protobuf), as Tidewater's client and brokers use it. Prints the round trip's
p50/p99 and the client process's CPU per round trip. Every acks=all record
crosses four such one-way hops in series (request to the leader, data to the
followers, their next fetch to the leader, the answer out), so the gRPC row
times two is the part of a record's latency no broker code can remove here.

The gRPC rows run twice: with gRPC's defaults (socket I/O on its EventEngine
threads) and as every Tidewater process runs it (``proto/grpc_env.py``: the
completion queue's poller thread does the I/O, one thread hand-off less per
message). Both ends of a row run in fresh processes, because gRPC reads the
setting once, when it is first imported.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench.bench_common import format_table, percentile  # noqa: E402

ECHO_METHOD = "/bench.Echo/Stream"


def _tcp_echo_main(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(65536):
        conn.sendall(data)


def tcp_round_trips(count: int, size_bytes: int) -> tuple[list[float], float]:
    """Round trip seconds (sorted) and client CPU seconds per round trip."""
    listener = socket.create_server(("127.0.0.1", 0))
    echo = multiprocessing.get_context("fork").Process(target=_tcp_echo_main, args=(listener,),
                                                       daemon=True)
    echo.start()
    try:
        with socket.create_connection(listener.getsockname()) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            message = b"x" * size_bytes
            times = []
            cpu_start = time.process_time()
            for _ in range(count):
                started = time.perf_counter()
                sock.sendall(message)
                got = 0
                while got < size_bytes:
                    got += len(sock.recv(65536))
                times.append(time.perf_counter() - started)
            cpu_s = (time.process_time() - cpu_start) / count
    finally:
        echo.kill()
        echo.join(5)
        listener.close()
    return sorted(times), cpu_s


def _use_experiments(experiments: str | None) -> None:
    """In a fresh process, before grpc is imported: None = gRPC's defaults."""
    import os

    if experiments is None:
        os.environ.pop("GRPC_EXPERIMENTS", None)
    else:
        os.environ["GRPC_EXPERIMENTS"] = experiments


def _grpc_echo_main(port_pipe, experiments: str | None) -> None:
    _use_experiments(experiments)
    import grpc
    import uvloop

    async def serve() -> None:
        async def echo(request_iterator, context):
            async for message in request_iterator:
                yield message

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_pipe.send(port)
        await server.wait_for_termination()

    uvloop.run(serve())


def _grpc_client_main(port: int, count: int, size_bytes: int, experiments: str | None,
                      result_pipe) -> None:
    _use_experiments(experiments)
    import grpc
    import uvloop

    async def client() -> tuple[list[float], float]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream(ECHO_METHOD)()
            message = b"x" * size_bytes
            for _ in range(100):  # warm-up: connection, first messages
                await call.write(message)
                await call.read()
            times = []
            cpu_start = time.process_time()
            for _ in range(count):
                started = time.perf_counter()
                await call.write(message)
                await call.read()
                times.append(time.perf_counter() - started)
            cpu_s = (time.process_time() - cpu_start) / count
            await call.done_writing()
            return sorted(times), cpu_s

    result_pipe.send(uvloop.run(client()))


def grpc_round_trips(count: int, size_bytes: int, experiments: str | None = None
                     ) -> tuple[list[float], float]:
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    server = ctx.Process(target=_grpc_echo_main, args=(child_end, experiments), daemon=True)
    server.start()
    client = None
    try:
        if not parent_end.poll(30):
            raise RuntimeError("the gRPC echo server did not start")
        port = parent_end.recv()
        client = ctx.Process(target=_grpc_client_main,
                             args=(port, count, size_bytes, experiments, child_end), daemon=True)
        client.start()
        if not parent_end.poll(120):
            raise RuntimeError("the gRPC echo client did not finish")
        return parent_end.recv()
    finally:
        for process in (client, server):
            if process is not None:
                process.kill()
                process.join(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--bytes", type=int, default=64, help="message size")
    args = parser.parse_args(argv)
    rows = []
    from tidewater.proto.grpc_env import GRPC_EXPERIMENTS

    for name, measure in (
            ("raw TCP, blocking sockets", tcp_round_trips),
            ("grpc.aio bidi stream, uvloop, gRPC defaults",
             lambda n, size: grpc_round_trips(n, size, None)),
            ("grpc.aio bidi stream, uvloop, as Tidewater",
             lambda n, size: grpc_round_trips(n, size, GRPC_EXPERIMENTS))):
        times, cpu_s = measure(args.round_trips, args.bytes)
        rows.append((name, f"{percentile(times, 50) * 1e6:,.0f}", f"{percentile(times, 99) * 1e6:,.0f}",
                     f"{cpu_s * 1e6:,.0f}"))
    print(f"{args.round_trips} round trips of {args.bytes} B, one at a time, two processes on 127.0.0.1")
    print(format_table(("transport", "p50 µs", "p99 µs", "client CPU µs"), rows,
                       align_right=(False, True, True, True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
