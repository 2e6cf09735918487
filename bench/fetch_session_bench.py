"""Fetch sessions (KIP-227): broker and consumer CPU per poll for a consumer of 100
partitions, with and without a session, in the same run.

Run:  .venv/bin/python bench/fetch_session_bench.py [--partitions N] [--polls N]
                                                    [--rounds N] [--client raw|kafka-python]

Starts a one-broker cluster (``tide cluster up``) in a temporary directory, creates a
topic of ``--partitions`` partitions with a few records in each, and polls it from
offsets at the end of every partition: the steady state of a caught-up consumer,
where a poll brings nothing new.

- ``raw`` (default): Fetch v12 frames on one connection (``codec.encode_request``),
  max_wait 0 so each poll is answered at once. "session": one full fetch opens a
  session, then incremental fetches naming no partition; "sessionless": every fetch
  names every partition with session epoch -1 (what aiokafka and librdkafka send).
- ``kafka-python``: its KafkaConsumer with ``enable_incremental_fetch_sessions`` true
  or false (fetch.max.wait.ms 0), polls counted from the broker's metrics.

The two modes alternate in ``--rounds`` rounds of ``--polls`` polls each, so both see
the same machine load. Broker CPU is user + system seconds of the broker process from
/proc (all threads, the metrics server's too) over each round; the consumer's is this
process's own over the same polls (it runs nothing else meanwhile: kafka-python's
consumer without a group has no thread of its own). The table gives the broker's total
over all rounds, both per fetch, and the answer's size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_common import format_table, machine_description, process_cpu_s
from tidewater.broker.kafka.codec import decode_response, encode_request

FETCH = 1
TOPIC = "bench-wide"
TIDE = [sys.executable, "-m", "tidewater.tools.cli"]


def tide(*args: str, timeout_s: float = 120) -> str:
    done = subprocess.run([*TIDE, *args], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"tide {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


class RawConsumer:
    """Fetch v12 on one connection, from the given offsets."""

    def __init__(self, address: str, offsets: dict[int, int]):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.offsets = offsets
        self.correlation_id = 0
        self.session_id, self.epoch = 0, 0

    def _call(self, values: dict) -> tuple[object, int]:
        self.correlation_id += 1
        self.sock.sendall(encode_request(FETCH, 12, self.correlation_id, values))
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        _, body = decode_response(FETCH, 12, frame)
        return body, size

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise SystemExit("the broker closed the connection")
            out += chunk
        return bytes(out)

    def poll(self, *, session: bool) -> int:
        """One fetch; the answer's size in bytes."""
        if session and self.epoch > 0:
            partitions: dict[int, int] = {}  # nothing changed: an empty incremental fetch
            session_id, epoch = self.session_id, self.epoch
        else:
            partitions = self.offsets
            session_id, epoch = (0, 0) if session else (0, -1)
        values = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 50 << 20,
                  "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
                  "rack_id": "", "forgotten_topics_data": [],
                  "topics": [{"topic": TOPIC, "partitions": [{
                      "partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                      "last_fetched_epoch": -1, "log_start_offset": -1,
                      "partition_max_bytes": 1 << 20} for p, offset in partitions.items()]}]
                  if partitions else []}
        body, size = self._call(values)
        if body.error_code != 0:  # type: ignore[attr-defined]
            raise SystemExit(f"fetch answered error {body.error_code}")  # type: ignore[attr-defined]
        if session:
            if self.epoch == 0:
                self.session_id = body.session_id  # type: ignore[attr-defined]
                if self.session_id == 0:
                    raise SystemExit("the broker opened no session")
            self.epoch += 1
        return size


def kafka_python_rounds(address: str, partitions: int, polls: int, session: bool
                        ) -> object:
    import kafka
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=[address], enable_auto_commit=False, fetch_max_wait_ms=0,
        enable_incremental_fetch_sessions=session)
    consumer.assign([kafka.TopicPartition(TOPIC, p) for p in range(partitions)])
    consumer.seek_to_end()
    consumer.poll(timeout_ms=500)
    return consumer


def fetch_counts(metrics_port: int) -> float:
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                  timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("tidewater_broker_kafka_fetches_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--polls", type=int, default=300, help="polls per round and mode")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--client", choices=("raw", "kafka-python"), default="raw")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="fetch-session-bench-"))
    tide("cluster", "up", "--brokers", "1", "--data-dir", str(data_dir), "--base-port", "0",
         "--ready-timeout-s", "60", timeout_s=150)
    try:
        manifest = json.loads((data_dir / "cluster.json").read_text())
        [broker] = [p for p in manifest["processes"].values() if p["kind"] == "broker"]
        bootstrap = manifest["bootstrap"]
        tide("--bootstrap", bootstrap, "topics", "create", TOPIC, "--partitions",
             str(args.partitions), "--replication-factor", "1")
        import confluent_kafka
        producer = confluent_kafka.Producer({"bootstrap.servers": broker["kafka"]})
        for p in range(args.partitions):
            for _ in range(3):
                producer.produce(TOPIC, value=b"x" * 100, partition=p)
        if producer.flush(60) != 0:
            raise SystemExit("records not acknowledged")
        del producer  # its connections closed before the cluster goes down
        offsets = dict.fromkeys(range(args.partitions), 3)

        cpu_s = {"session": 0.0, "sessionless": 0.0}
        client_cpu_s = {"session": 0.0, "sessionless": 0.0}
        me = os.getpid()
        polls = {"session": 0, "sessionless": 0}
        answer_bytes = {"session": 0, "sessionless": 0}
        load_before = os.getloadavg()[0]
        started = time.time()
        if args.client == "raw":
            consumers = {mode: RawConsumer(broker["kafka"], offsets) for mode in cpu_s}
            for mode, c in consumers.items():  # the session's full fetch, not measured
                c.poll(session=mode == "session")
            for _ in range(args.rounds):
                for mode, c in consumers.items():
                    before = process_cpu_s(broker["pid"])
                    client_before = process_cpu_s(me)
                    for _ in range(args.polls):
                        answer_bytes[mode] += c.poll(session=mode == "session")
                    client_cpu_s[mode] += process_cpu_s(me) - client_before
                    cpu_s[mode] += process_cpu_s(broker["pid"]) - before
                    polls[mode] += args.polls
        else:
            kafka_consumers = {mode: kafka_python_rounds(broker["kafka"], args.partitions,
                                                         args.polls, mode == "session")
                               for mode in cpu_s}
            for _ in range(args.rounds):
                for mode, kc in kafka_consumers.items():
                    fetches_before = fetch_counts(broker["metrics_port"])
                    before = process_cpu_s(broker["pid"])
                    client_before = process_cpu_s(me)
                    for _ in range(args.polls):
                        kc.poll(timeout_ms=0)  # type: ignore[attr-defined]
                    client_cpu_s[mode] += process_cpu_s(me) - client_before
                    cpu_s[mode] += process_cpu_s(broker["pid"]) - before
                    polls[mode] += int(fetch_counts(broker["metrics_port"]) - fetches_before)
            for kc in kafka_consumers.values():
                kc.close()  # type: ignore[attr-defined]
        elapsed_s = time.time() - started

        machine = machine_description()
        print(f"fetch session benchmark ({args.client}, {args.partitions} partitions, "
              f"{args.rounds} rounds x {args.polls} polls per mode, caught-up consumer, "
              f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
              f"{elapsed_s:.0f} s, load average {load_before:.1f} -> "
              f"{os.getloadavg()[0]:.1f}, {machine['nproc']} CPUs {machine['cpu_model']})")
        rows = []
        for mode in ("sessionless", "session"):
            per_poll_us = cpu_s[mode] / polls[mode] * 1e6 if polls[mode] else float("nan")
            client_us = (client_cpu_s[mode] / polls[mode] * 1e6 if polls[mode]
                         else float("nan"))
            size = (f"{answer_bytes[mode] / polls[mode]:.0f}"
                    if args.client == "raw" and polls[mode] else "-")
            rows.append((mode, str(polls[mode]), f"{cpu_s[mode]:.2f}", f"{per_poll_us:.0f}",
                         f"{client_us:.0f}", size))
        print(format_table(("mode", "fetches", "broker CPU s", "CPU us/fetch",
                            "consumer CPU us/fetch", "answer bytes/fetch"), rows,
                           align_right=(False, True, True, True, True, True)))
        for name, spent in (("broker", cpu_s), ("consumer", client_cpu_s)):
            if polls["session"] and polls["sessionless"] and spent["session"] > 0:
                ratio = (spent["sessionless"] / polls["sessionless"]) / (
                    spent["session"] / polls["session"])
                print(f"sessionless / session {name} CPU per fetch: {ratio:.1f}x")
    finally:
        tide("cluster", "down", "--data-dir", str(data_dir), "--timeout-s", "10")


if __name__ == "__main__":
    main()
