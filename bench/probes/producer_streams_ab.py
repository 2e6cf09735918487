"""Producer throughput and CPU with requests on ProduceStream against unary Produce.

    .venv/bin/python bench/probes/producer_streams_ab.py [--seconds 4] [--sizes 1024,100] [--rounds 2]

Starts a local 3-broker cluster (stopped at the end), one RF=3 topic per run, and
runs the cluster benchmark's Producer workload (acks=all, 256 KiB batches, linger
5 ms, 5 in flight) alternating ``use_streams`` True/False (load drifts). Prints
MB/s and MB per CPU second over every process (brokers, controller, this client).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.probes.latency_breakdown import cpu_seconds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--sizes", default="1024,100")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tw-streams-ab-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory)
        try:
            bootstrap = cluster.start()
            pids = [p["pid"] for p in cluster.local.manifest["processes"].values()]
            n = 0
            for _ in range(args.rounds):
                for size in (int(s) for s in args.sizes.split(",")):
                    for use_streams in (True, False):
                        n += 1
                        topic = f"ab{n}"
                        cluster.create_topic(topic)
                        before = sum(cpu_seconds(pid) for pid in pids) + time.process_time()
                        t = tidewater_side.producer_throughput(
                            bootstrap, topic, size, -1, args.seconds,
                            producer_options={"use_streams": use_streams})
                        mb_s, mb = t.mb_per_s, t.payload_bytes / 1e6
                        cpu = sum(cpu_seconds(pid) for pid in pids) + time.process_time() - before
                        print(f"{size:5d} B  {'stream' if use_streams else 'unary ':6s}  "
                              f"{mb_s:6.1f} MB/s  {mb / cpu:6.1f} MB/CPU-s  "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
