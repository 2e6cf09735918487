"""CPU per request of the asyncio producer (``client.aio_producer``) on ProduceStream.

    .venv/bin/python bench/probes/aio_producer_cpu.py [--count 3000] [--acks 1] [--rounds 2]
        [--loop asyncio|uvloop]

Starts a local 1-broker cluster (stopped at the end), creates an RF=1 topic and,
per round, sends ``count`` single-record requests (1 KiB, linger 0) with one
``AsyncProducer`` in one asyncio loop, one at a time (each awaited before the
next). Prints a table of the client process's CPU (``time.process_time``, all
its threads) and the broker's (/proc/<pid>/stat) per request, in microseconds,
and the round trip. (Unary ``Produce`` against the stream, on the raw stubs:
``bench/probes/client_stream_micro.py``.)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import format_table, process_cpu_s  # noqa: E402

WARMUP_REQUESTS = 200  # channel and stream open, code paths hot


async def run_round(bootstrap: str, broker_pid: int, acks: int, count: int,
                    record_bytes: int) -> tuple[float, float, float]:
    """(client µs, broker µs, round trip µs) per request."""
    from tidewater.client.aio_producer import AsyncProducer

    value = bytes(record_bytes)
    async with AsyncProducer(bootstrap, acks=acks, linger_ms=0) as producer:
        for _ in range(WARMUP_REQUESTS):
            await (await producer.send("micro", value, partition=0))
        broker_before, client_before = process_cpu_s(broker_pid), time.process_time()
        started = time.perf_counter()
        for _ in range(count):
            await (await producer.send("micro", value, partition=0))
        elapsed_s = time.perf_counter() - started
        client_s = time.process_time() - client_before
        broker_s = process_cpu_s(broker_pid) - broker_before
    return client_s / count * 1e6, broker_s / count * 1e6, elapsed_s / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--acks", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2, help="runs, each its own row")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the caller's event loop (the producer runs on it)")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    rows = []
    with tempfile.TemporaryDirectory(prefix="tw-aio-producer-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory, brokers=1)
        try:
            bootstrap = cluster.start()
            cluster.create_topic("micro", replication_factor=1)
            pid = next(p["pid"] for p in cluster.local.manifest["processes"].values()
                       if p["name"].startswith("broker-"))
            for n in range(1, args.rounds + 1):
                client_us, broker_us, round_trip_us = asyncio.run(
                    run_round(bootstrap, pid, args.acks, args.count, args.record_bytes))
                rows.append((str(n), f"{client_us:,.0f}", f"{broker_us:,.0f}",
                             f"{client_us + broker_us:,.0f}", f"{round_trip_us:,.0f}"))
                print(f"round {n}: done", file=sys.stderr, flush=True)
        finally:
            cluster.stop()
    print(f"AsyncProducer, {args.count} requests of one {args.record_bytes} B record, "
          f"acks={args.acks}, one at a time, {args.loop} loop")
    print(format_table(("round", "client CPU µs/req", "broker CPU µs/req", "sum µs/req",
                        "round trip µs"), rows, align_right=(False, True, True, True, True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
