"""Which client end makes the Kafka latency row slower than the gRPC row: the producer
or the consumer.

    .venv/bin/python bench/probes/kafka_client_ends.py [--records 3000] [--rounds 2]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic (1
partition, RF 3) and sends ``--records`` stamped 1 KiB records at 1,000/s, acks=all,
with each pairing of the two rows' clients, alternated round by round on the one
cluster:

- producer: ``kafka`` (confluent-kafka, the Kafka row's: linger 0, one request in
  flight, its delivery reports served by ``poll(0)`` after each send) or ``tidewater``
  (the threaded ``Producer``, the gRPC row's: linger 0, one request in flight);
- receiver: ``kafka`` (a librdkafka consumer at the topic's end, the Kafka row's) or
  ``tidewater`` (the threaded ``Consumer``, the gRPC row's), each in its own process.

The four pairings share everything else (the cluster, the topic, the pacer), so the
differences between rows say which end carries the Kafka row's extra latency. Beside
each: the leader's Produce requests per record and their mean time from read to answer
written (its ``/metrics``), the server's part of a round whichever listener took it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import kafka_side, tidewater_side  # noqa: E402
from bench.bench_common import (  # noqa: E402
    format_table,
    paced_latency_result,
    receiver_latencies,
    stop_child,
)
from bench.probes.latency_breakdown import request_latency  # noqa: E402

TOPIC = "paced"
RECORD_BYTES = 1024
ENDS = ("kafka", "tidewater")


def one_run(cluster: tidewater_side.TidewaterCluster, producer: str, receiver: str,
            count: int, rate_per_s: float) -> dict:
    kafka_bootstrap = cluster.local.manifest["kafka_bootstrap"]
    timeout_s = count / rate_per_s + 60
    if receiver == "kafka":
        # One more: the kafka producer's warm-up record may reach it first.
        child, parent_end = kafka_side.start_latency_receiver(kafka_bootstrap, TOPIC, count + 1,
                                                              timeout_s)
    else:
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding gRPC threads
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=tidewater_side.RECEIVERS["consumer"],
                            args=(cluster.bootstrap, TOPIC, count, timeout_s, child_end),
                            daemon=True)
        child.start()
        if not parent_end.poll(60) or parent_end.recv() != "ready":
            stop_child(child)
            raise RuntimeError("latency receiver did not start")
    ack_ms: list[float] = []
    failures: list = []
    try:
        if producer == "kafka":
            achieved = kafka_side.paced_sends(kafka_bootstrap, TOPIC, RECORD_BYTES, count,
                                              rate_per_s, ack_ms, failures)
        else:
            achieved = tidewater_side._paced_threaded_sends(
                cluster.bootstrap, TOPIC, RECORD_BYTES, count, rate_per_s, 1, ack_ms, failures)
        e2e_ms = receiver_latencies(parent_end, timeout_s)[-count:]  # not a warm-up record
    finally:
        stop_child(child)
    return paced_latency_result(ack_ms, e2e_ms, achieved, failures)


def produce_served(port: int) -> tuple[float, float]:
    """(Produce requests answered, seconds spent on them) so far, both listeners."""
    served = request_latency(port)
    return (sum(v for (rpc, kind), v in served.items()
                if kind == "count" and rpc in ("kafka:Produce", "ProduceStream")),
            sum(v for (rpc, kind), v in served.items()
                if kind == "sum" and rpc in ("kafka:Produce", "ProduceStream")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    rows = []
    with tidewater_side.paced_cluster("tw-client-ends-", {}) as (cluster, _directory):
        leader = cluster.partition(TOPIC).leader
        port = cluster.local.manifest["processes"][f"broker-{leader}"]["metrics_port"]
        # Warm-up: connections, metadata, the consumer group's coordinator.
        kafka_side.paced_latency(cluster.local.manifest["kafka_bootstrap"], TOPIC, RECORD_BYTES,
                                 500, args.rate)
        for round_number in range(1, args.rounds + 1):
            for producer in ENDS:
                for receiver in ENDS:
                    count_before, seconds_before = produce_served(port)
                    r = one_run(cluster, producer, receiver, args.records, args.rate)
                    count, seconds = produce_served(port)
                    served = count - count_before
                    rows.append((
                        str(round_number), producer, receiver, f"{r['e2e'].p50_ms:.2f}",
                        f"{r['e2e'].p99_ms:.2f}", f"{r['ack'].p50_ms:.2f}",
                        f"{served / args.records:.2f}",
                        f"{1000 * (seconds - seconds_before) / max(served, 1):.2f}",
                        f"{os.getloadavg()[0]:.2f}"))
                    print(f"[probe] round {round_number} {producer} -> {receiver}: e2e p50 "
                          f"{r['e2e'].p50_ms:.2f} ms", flush=True)
    print(f"\n{args.records} records of {RECORD_BYTES} B at {args.rate:,.0f}/s, acks=all, RF 3, "
          "1 partition; producer and receiver ends paired, alternated on one cluster")
    print(format_table(("round", "producer", "receiver", "e2e p50 ms", "e2e p99 ms",
                        "ack p50 ms", "Produce/record", "Produce ms in leader", "load"), rows,
                       align_right=(True, False, False, True, True, True, True, True, True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
