"""Does creating partitions stop the brokers' other work? Loop stalls and acks=all
latency while a topic of many partitions, or the first consumer group, is created.

    .venv/bin/python bench/probes/creation_stall.py [--partitions 50] [--rounds 2]

Starts a local 3-broker cluster (stopped by pid at the end) with the topic "paced"
(1 partition, RF 3). Beside each event below run:

- one pinger per broker: a Kafka ApiVersions v0 on its own connection every 2 ms, its
  round trip timed. The answer needs the broker's event loop, so the longest round trip
  is the longest time that loop served nothing;
- a librdkafka producer writing 1 KiB records to "paced" with acks=all every 4 ms
  (linger 0), each delivery's latency from its send.

The events, each in a window of ``--window-s`` seconds from its start: ``idle``
(nothing), ``topic`` (a topic of ``--partitions`` partitions, RF 3, created through
the Kafka listener with confluent-kafka's AdminClient), ``group`` (a librdkafka
consumer of a new group assigns "paced": its coordinator lookup creates
``__consumer_offsets``, 50 partitions by default, on first use) and ``delete`` (the
topic of ``topic`` deleted). ``--rounds`` runs the four in a new cluster each.
Printed per event: each broker's longest ApiVersions round trip and the producer's
ack p50, p99 and max in the window.

For an A/B, run it with each checkout's venv python in turn (both in one sitting).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402

EVENTS = ("idle", "topic", "group", "delete")
PING_INTERVAL_S = 0.002
SEND_INTERVAL_S = 0.004
_API_VERSIONS = 18


def ping_loop(address: str, round_trips: list[tuple[float, float]], stop: threading.Event) -> None:
    """ApiVersions v0 on one connection until ``stop``: (monotonic s, round trip ms) each."""
    host, port = address.rsplit(":", 1)
    client_id = b"creation-stall"
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        correlation_id = 0
        while not stop.is_set():
            correlation_id += 1
            body = struct.pack(">hhih", _API_VERSIONS, 0, correlation_id, len(client_id)) + client_id
            started = time.perf_counter()
            connection.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", connection.recv(4, socket.MSG_WAITALL))[0]
            connection.recv(size, socket.MSG_WAITALL)
            round_trips.append((time.monotonic(), (time.perf_counter() - started) * 1000))
            time.sleep(PING_INTERVAL_S)


def produce_loop(bootstrap: str, acks_ms: list[tuple[float, float]], stop: threading.Event) -> None:
    """acks=all 1 KiB records to "paced" every SEND_INTERVAL_S: (send time, ack ms) each."""
    from bench.kafka_side import latency_producer

    producer = latency_producer(bootstrap)
    value = os.urandom(1024)
    producer.produce("paced", value, partition=0)
    producer.flush(30)  # metadata and connections warm
    while not stop.is_set():
        sent = time.monotonic()
        producer.produce("paced", value, partition=0, on_delivery=lambda error, _m, sent=sent:
                         acks_ms.append((sent, (time.monotonic() - sent) * 1000))
                         if error is None else None)
        producer.poll(0)
        time.sleep(SEND_INTERVAL_S)
    producer.flush(30)


def run_event(event: str, bootstrap: str, partitions: int, name: str) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    if event == "topic":
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(name, partitions, 3)])[name].result(60)
    elif event == "delete":
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([name])[name].result(60)
    elif event == "group":
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                             "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition("paced", 0, OFFSET_END)])
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                consumer.poll(0.1)
        finally:
            consumer.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_round(round_index: int, partitions: int, window_s: float) -> list[tuple]:
    rows = []
    with tidewater_side.paced_cluster("creation-stall-") as (cluster, _directory):
        manifest = cluster.local.manifest
        bootstrap = manifest["kafka_bootstrap"]
        brokers = sorted((proc["name"], proc["kafka"]) for proc in manifest["processes"].values()
                         if proc["name"].startswith("broker-"))
        stop = threading.Event()
        round_trips: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in brokers}
        acks_ms: list[tuple[float, float]] = []
        threads = [threading.Thread(target=ping_loop, args=(address, round_trips[name], stop),
                                    daemon=True) for name, address in brokers]
        threads.append(threading.Thread(target=produce_loop, args=(bootstrap, acks_ms, stop),
                                        daemon=True))
        for thread in threads:
            thread.start()
        try:
            time.sleep(2)  # the cluster's own start-up work done, the producer warm
            for event in EVENTS:
                started = time.monotonic()
                utc = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
                topic = f"stall-{'topic' if event == 'delete' else event}-{round_index}"
                run_event(event, bootstrap, partitions, topic)
                time.sleep(max(0.0, started + window_s - time.monotonic()))
                ended = time.monotonic()
                longest = [max((ms for at, ms in round_trips[name] if started <= at < ended),
                               default=float("nan")) for name, _ in brokers]
                acks = [ms for at, ms in acks_ms if started <= at < ended]
                rows.append((round_index + 1, event, utc, os.getloadavg()[0], longest,
                             statistics.median(acks) if acks else float("nan"),
                             percentile(acks, 0.99) if acks else float("nan"),
                             max(acks, default=float("nan")), len(acks)))
                print(f"[probe] round {round_index + 1} {event}: {rows[-1]}", file=sys.stderr,
                      flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    rows = [row for i in range(args.rounds) for row in run_round(i, args.partitions, args.window_s)]
    print(f"longest ApiVersions round trip per broker and acks=all latency (1 KiB every "
          f"{SEND_INTERVAL_S * 1000:.0f} ms) in a {args.window_s:.0f} s window from each event; "
          f"topic: {args.partitions} partitions, RF 3; {sys.executable}")
    print("| round | event | UTC | load | longest loop round trip ms (broker 1 / 2 / 3) "
          "| ack p50 ms | ack p99 ms | ack max ms | acks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for round_number, event, utc, load, longest, p50, p99, worst, count in rows:
        print(f"| {round_number} | {event} | {utc} | {load:.2f} | "
              f"{' / '.join(f'{ms:.0f}' for ms in longest)} | {p50:.2f} | {p99:.1f} | "
              f"{worst:.1f} | {count:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
