"""Which librdkafka settings move the Kafka listener's e2e latency at 1,000/s.

    .venv/bin/python bench/probes/kafka_latency_settings.py [--seconds 4] [--rounds 3]

Starts a local 3-broker cluster (stopped at the end), then runs ``kafka_side.paced_latency``
(the cluster_bench kafka row: acks=all 1 KiB, linger 0, one request in flight, a
librdkafka consumer in another process) once per variant per round, the variants
alternating, each on a fresh RF=3 topic. The variants are settings a latency-minded
Kafka user would set:

- ``socket.nagle.disable=true`` on both clients (librdkafka's default is false: Nagle on);
- the consumer's ``fetch.wait.max.ms`` lowered (a parked fetch is answered when data
  arrives anyway, so this only bounds an empty fetch);
- the consumer's ``fetch.queue.backoff.ms=0`` (librdkafka waits this long before the next
  fetch when its local queue is over its thresholds; these runs stay far below them);
- 5 produce requests in flight instead of 1 (the default with idempotence).

Beside the latencies, from the leader's ``/metrics``: the Produce requests it answered per
record and their mean time from decode to answer (the server's part of a produce round).
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

from bench import kafka_side, tidewater_side  # noqa: E402
from bench.bench_common import format_table  # noqa: E402
from bench.probes.latency_breakdown import request_latency  # noqa: E402

NAGLE_OFF = {"socket.nagle.disable": True}
# name -> (producer settings, consumer settings), added to the bench row's own.
VARIANTS: dict[str, tuple[dict, dict]] = {
    "bench row (librdkafka defaults)": ({}, {}),
    "socket.nagle.disable both ends": (NAGLE_OFF, NAGLE_OFF),
    "nagle off + fetch.wait.max.ms 10 + fetch.queue.backoff.ms 0": (
        NAGLE_OFF, {**NAGLE_OFF, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 0}),
    "5 requests in flight": ({"max.in.flight.requests.per.connection": 5}, {}),
}
PRODUCE = "kafka:Produce"


def produce_served(cluster: tidewater_side.TidewaterCluster, topic: str) -> tuple[float, float]:
    """(Produce requests answered, seconds spent on them) so far by ``topic``'s leader."""
    leader = cluster.leader_of(topic)
    port = cluster.local.manifest["processes"][f"broker-{leader}"]["metrics_port"]
    served = request_latency(port)
    return served.get((PRODUCE, "count"), 0.0), served.get((PRODUCE, "sum"), 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--only", nargs="+", choices=range(len(VARIANTS)), type=int,
                        default=list(range(len(VARIANTS))), help="variant indexes to run")
    args = parser.parse_args(argv)
    names = [name for index, name in enumerate(VARIANTS) if index in args.only]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tw-kafka-latency-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory)
        try:
            cluster.start()
            bootstrap = cluster.local.manifest["kafka_bootstrap"]
            # Not reported: the first run after the cluster's start is slower whatever it sets.
            cluster.create_topic("kafka-latency-warm-up")
            kafka_side.paced_latency(bootstrap, "kafka-latency-warm-up", args.record_bytes,
                                     int(args.rate), args.rate)
            for round_number in range(1, args.rounds + 1):
                for index, name in enumerate(names):
                    topic = f"kafka-latency-{round_number}-{index}"
                    cluster.create_topic(topic)
                    producer_config, consumer_config = VARIANTS[name]
                    utc = time.strftime("%H:%M:%S", time.gmtime())
                    count_before, seconds_before = produce_served(cluster, topic)
                    records = int(args.rate * args.seconds)
                    result = kafka_side.paced_latency(
                        bootstrap, topic, args.record_bytes, records, args.rate,
                        producer_config=producer_config, consumer_config=consumer_config)
                    count_after, seconds_after = produce_served(cluster, topic)
                    produces = count_after - count_before
                    e2e, ack = result["e2e"], result["ack"]
                    rows.append((str(round_number), name, utc, f"{os.getloadavg()[0]:.2f}",
                                 f"{result['achieved_rate_per_s']:,.0f}", f"{e2e.p50_ms:.2f}",
                                 f"{e2e.p99_ms:.2f}", f"{ack.p50_ms:.2f}", f"{ack.p99_ms:.2f}",
                                 f"{produces / (records + 1):.2f}",
                                 f"{1000 * (seconds_after - seconds_before) / max(produces, 1):.2f}"))
                    print(" ".join(rows[-1]), flush=True)
        finally:
            cluster.stop()
    print(f"confluent-kafka acks=all {args.record_bytes} B at {args.rate:,.0f}/s for {args.seconds} s, "
          "RF 3, linger.ms 0, one request in flight unless the settings say; consumer in another "
          "process; Produce: the leader's requests per record (the warm-up record included) "
          "and their mean ms from decode to answer")
    print(format_table(("round", "settings", "UTC", "load", "achieved/s", "e2e p50 ms", "e2e p99 ms",
                        "ack p50 ms", "ack p99 ms", "Produce/record", "Produce ms"), rows,
                       align_right=(True, False, False, True, True, True, True, True, True, True,
                                    True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
