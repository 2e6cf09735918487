"""Paced acks=all latency of several client shapes, alternated in one cluster.

    .venv/bin/python bench/probes/latency_variants.py [--rate 1000] [--seconds 4] [--blocks 3] \
        [--variant threaded/consumer --variant asyncio/stream ...]

A variant is PRODUCER/RECEIVER for ``tidewater_side.paced_latency``: producer
"threaded" (``Producer`` from a pacer thread) or "asyncio" (``AsyncProducer`` on its
loop); receiver "consumer" (``Consumer.poll``), "aio_consumer" (``AsyncConsumer.poll``
on its loop) or "stream" (the FetchStream read on one loop by the bench,
``bench.fetch_stream_receiver``). One local 3-broker cluster; each block
runs every variant once, in turn, each on a fresh topic (1 partition, RF=3), so a
slow minute of the shared machine falls on all of them alike. Prints every run with
the load average, then the median over blocks of each percentile per variant.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402

DEFAULT_VARIANTS = ("threaded/consumer", "threaded/aio_consumer", "asyncio/consumer",
                    "asyncio/aio_consumer")
FIGURES = (("ack", "p50_ms"), ("ack", "p99_ms"), ("e2e", "p50_ms"), ("e2e", "p99_ms"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--variant", action="append", default=[],
                        help="PRODUCER/RECEIVER (repeatable); default: " + ", ".join(DEFAULT_VARIANTS))
    args = parser.parse_args(argv)
    variants = [tuple(v.split("/", 1)) for v in (args.variant or DEFAULT_VARIANTS)]
    runs: dict[tuple[str, ...], list[dict]] = {v: [] for v in variants}
    count = int(args.rate * args.seconds)
    with tempfile.TemporaryDirectory(prefix="tw-latency-variants-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory)
        try:
            bootstrap = cluster.start()
            print(f"{'block':>5s} {'producer/receiver':20s} {'ack p50':>8s} {'ack p99':>8s} "
                  f"{'e2e p50':>8s} {'e2e p99':>8s} {'rate/s':>7s}  load", flush=True)
            for block in range(args.blocks):
                for variant in variants:
                    topic = f"paced-{block}-{'-'.join(variant)}"
                    cluster.create_topic(topic)
                    result = tidewater_side.paced_latency(
                        bootstrap, topic, args.record_bytes, count, args.rate,
                        producer_kind=variant[0], receiver_kind=variant[1])
                    runs[variant].append(result)
                    values = [getattr(result[kind], attr) for kind, attr in FIGURES]
                    print(f"{block:5d} {'/'.join(variant):20s} "
                          + " ".join(f"{v:8.2f}" for v in values)
                          + f" {result['achieved_rate_per_s']:7.0f}  {os.getloadavg()[0]:.2f}",
                          flush=True)
        finally:
            cluster.stop()
    print("median over blocks (ms):")
    for variant, results in runs.items():
        medians = [statistics.median(getattr(r[kind], attr) for r in results) for kind, attr in FIGURES]
        print(f"      {'/'.join(variant):20s} " + " ".join(f"{v:8.2f}" for v in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
