"""Client quotas (issue 29): a producer held to its producer_byte_rate next to an
unthrottled one, on one broker, in the same run.

Run:  .venv/bin/python bench/quota_bench.py [--quota-bytes N] [--seconds S]

Starts a one-broker cluster (``tide cluster up``) in a temporary directory, creates a
one-partition topic, sets ``producer_byte_rate`` on client-id ``throttled`` with
``tide quotas alter``, and runs two confluent-kafka producers at once for
``--seconds``, each sending 1,000-byte values as fast as it may (acks=1,
batch.size 16384): ``throttled`` and ``unthrottled``. The table gives each one's
value bytes per second over the whole run and from ``--steady-from`` seconds on
(after the first second's burst, and past the 11 s at which Kafka's windowed rate, the
throttle before the token bucket, let its first burst through again), and how many
answers carried a throttle time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka

from bench.bench_common import format_table, machine_description

TOPIC = "bench-quotas"
VALUE_BYTES = 1_000
TIDE = [sys.executable, "-m", "tidewater.tools.cli"]


def tide(*args: str, timeout_s: float = 150) -> str:
    done = subprocess.run([*TIDE, *args], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"tide {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def produce_for(bootstrap: str, client_id: str, seconds: float, out: dict) -> None:
    throttles: list[float] = []
    deliveries: list[tuple[float, int]] = []
    started = time.monotonic()

    def on_delivery(error: object, message: confluent_kafka.Message) -> None:
        if error is None:
            deliveries.append((time.monotonic() - started, len(message.value() or b"")))

    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1, "linger.ms": 5,
        "batch.size": 16_384, "queue.buffering.max.kbytes": 1024,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    value = b"x" * VALUE_BYTES
    while time.monotonic() - started < seconds:
        try:
            producer.produce(TOPIC, value=value, on_delivery=on_delivery)
            producer.poll(0)
        except BufferError:
            producer.poll(0.05)
    out.update(seconds=time.monotonic() - started, deliveries=list(deliveries),
               throttles=list(throttles))
    producer.purge()
    producer.flush(5)


def rate(deliveries: list[tuple[float, int]], from_s: float, to_s: float) -> float:
    return sum(n for t, n in deliveries if from_s <= t < to_s) / (to_s - from_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota-bytes", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--steady-from", type=float, default=12.0)
    args = parser.parse_args()
    started_at = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="quota-bench-") as data_dir:
        bootstrap = tide("cluster", "up", "--brokers", "1", "--data-dir", data_dir,
                         "--base-port", "0", "--ready-timeout-s", "60").strip().splitlines()[-1]
        try:
            kafka = _kafka_bootstrap(data_dir)
            tide("topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "1",
                 "--bootstrap-server", bootstrap)
            tide("quotas", "alter", "--entity-type", "clients", "--entity-name", "throttled",
                 "--add-config", f"producer_byte_rate={args.quota_bytes}",
                 "--bootstrap-server", bootstrap)
            results: dict[str, dict] = {"throttled": {}, "unthrottled": {}}
            threads = [threading.Thread(target=produce_for,
                                        args=(kafka, name, args.seconds, out))
                       for name, out in results.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            tide("cluster", "down", "--data-dir", data_dir, "--timeout-s", "10")
    rows = []
    for name, out in results.items():
        quota = args.quota_bytes if name == "throttled" else None
        whole = rate(out["deliveries"], 0, out["seconds"])
        steady = rate(out["deliveries"], args.steady_from, out["seconds"])
        rows.append([name, f"{quota:,}" if quota else "-", f"{whole:,.0f}", f"{steady:,.0f}",
                     f"{steady / quota:.0%}" if quota else "-", str(len(out["throttles"]))])
    machine = machine_description()
    print(f"client quota benchmark (1 broker, {args.seconds:.0f} s, values of {VALUE_BYTES} B, "
          f"{started_at:%Y-%m-%d %H:%M} UTC, load average {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}, {machine['nproc']} CPUs {machine['cpu_model']})")
    print(format_table(["client-id", "quota B/s", "B/s whole run",
                        f"B/s from {args.steady_from:.0f} s", "of quota", "throttled answers"],
                       rows, align_right=[False, True, True, True, True, True]))


def _kafka_bootstrap(data_dir: str) -> str:
    manifest = json.loads((Path(data_dir) / "cluster.json").read_text())
    return str(manifest["kafka_bootstrap"])


if __name__ == "__main__":
    main()
