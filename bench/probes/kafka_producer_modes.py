"""How much of the Kafka listener's e2e latency at 1,000/s is the librdkafka producer's
own queueing: the same paced acks=all run twice, the producer calling ``poll(0)`` after
each ``produce`` (as ``cluster_bench``'s kafka row does) or ``flush()`` (the application
waits for each delivery, so librdkafka sends at once), both against one cluster, the same
topic settings and the same librdkafka consumer in another process.

Records carry their *due* time (``latency_probe``), so a producer that falls behind its
pace shows as latency. Needs a running cluster (``tide cluster up``); the modes alternate.

    .venv/bin/python bench/probes/kafka_producer_modes.py \\
        --bootstrap 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094 --replicas 3 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import kafka_side
from bench.bench_common import latency_summary, receiver_latencies, stop_child
from bench.probes.latency_probe import run_paced, stamped_payload

RECORD_BYTES = 1024


def run_mode(bootstrap: str, replicas: int, mode: str, count: int, rate_per_s: float,
             in_flight: int) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"producer-modes-{os.getpid()}-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, replicas)])[topic].result(30)
    # The kafka row's producer, ``in_flight`` requests in flight. Warmed up (its
    # connection and metadata) before the receiver starts at the topic's end.
    producer = kafka_side.latency_producer(bootstrap, in_flight)
    producer.produce(topic, b"warm-up", partition=0)
    producer.flush(30)
    timeout_s = count / rate_per_s + 60
    # The bench's kafka-row receiver: a librdkafka consumer at the topic's end.
    receiver, parent_end = kafka_side.start_latency_receiver(bootstrap, topic, count, timeout_s)
    try:
        filler = os.urandom(RECORD_BYTES)
        failed: list[object] = []

        def on_delivery(error, _message) -> None:
            if error is not None:
                failed.append(error)

        def send_one(_index: int, due_ns: int) -> None:
            producer.produce(topic, stamped_payload(RECORD_BYTES, due_ns, filler), partition=0,
                             on_delivery=on_delivery)
            if mode == "flush":
                producer.flush(30)
            else:
                producer.poll(0)

        achieved = run_paced(count, rate_per_s, send_one)
        producer.flush(60)
        if failed:
            raise RuntimeError(f"{len(failed)} sends failed, first: {failed[0]}")
        e2e_ms = receiver_latencies(parent_end, timeout_s + 30)
    finally:
        stop_child(receiver)
    return {"e2e": latency_summary(e2e_ms), "received": len(e2e_ms), "achieved": achieved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap of a running cluster")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1],
                        help="max.in.flight.requests.per.connection values to compare")
    args = parser.parse_args()
    rows = []
    for round_number in range(1, args.rounds + 1):
        for in_flight in args.in_flight:
            for mode in ("poll", "flush"):
                result = run_mode(args.bootstrap, args.replicas, mode, args.records, args.rate,
                                  in_flight)
                e2e = result["e2e"]
                rows.append((round_number, in_flight, mode, result, os.getloadavg()[0]))
                print(f"[probe] round {round_number} {in_flight} in flight {mode}: e2e p50 "
                      f"{e2e.p50_ms:.2f} ms, p99 {e2e.p99_ms:.2f} ms", flush=True)
    print(f"\nconfluent-kafka acks=all {RECORD_BYTES} B at {args.rate:,.0f}/s, RF {args.replicas}, "
          "linger.ms 0; librdkafka consumer in another process")
    print(f"{'round':>5}  {'in flight':>9}  {'producer after produce()':<28} {'received':>8} "
          f"{'achieved/s':>10} {'e2e p50 ms':>10} {'e2e p99 ms':>10} {'load':>5}")
    for round_number, in_flight, mode, result, load in rows:
        e2e = result["e2e"]
        what = "poll(0) (the bench)" if mode == "poll" else "flush() (waits for delivery)"
        print(f"{round_number:>5}  {in_flight:>9}  {what:<28} {result['received']:>8} "
              f"{result['achieved']:>10,.0f} {e2e.p50_ms:>10.2f} {e2e.p99_ms:>10.2f} {load:>5.1f}")


if __name__ == "__main__":
    main()
