"""Where TLS on the Kafka listener's produce path goes, in counts: confluent-kafka
(librdkafka) acks=all 1 KiB into a 3-broker cluster (RF 3, 1 partition), plaintext against
TLS (``tide cluster up --tls``: every port, replication too), alternated.

    .venv/bin/python bench/probes/tls_produce_counts.py [--rounds 2] [--seconds 10]
                                                        [--no-strace]

Per run: MB/s; from librdkafka's statistics, Produce requests per MB and records per
batch (does the client batch differently under TLS?); CPU ms and context switches per
MB of the leader, the followers (mean of two) and the client (this process); then,
unless ``--no-strace``, a short ``strace`` of the client's socket writes: write calls per
MB and the share of them at most 1,100 bytes (under TLS each write is one TLS record).
The strace window is separate from the CPU window (it slows the client). Also prints
the TLS version and cipher the Kafka listener negotiates (with Python's client).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import kafka_side, tidewater_side  # noqa: E402
from bench.bench_common import (  # noqa: E402
    format_table,
    process_cpu_s,
    thread_context_switches,
)

SMALL_WRITE_BYTES = 1100  # a 1 KiB record's payload in its own TLS record is 1,046 bytes


def cpu_ms(pid: int) -> float:
    return process_cpu_s(pid) * 1000


def context_switches(pid: int) -> int:
    return sum(thread_context_switches(pid).values())


def negotiated(bootstrap: str, tls_files: dict) -> str:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=tls_files["ca"])
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    context.check_hostname = False
    with socket.create_connection((host, int(port))) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        name, _version, bits = tls.cipher() or ("?", "?", 0)
        return f"{tls.version()} {name} ({bits} bits)"


def client_writes(pid: int, seconds: float, out: Path) -> tuple[float, float]:
    """(write calls per MB written, share of writes <= SMALL_WRITE_BYTES) of ``pid``."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=write,sendmsg,writev",
                               "-e", "signal=none", "-p", str(pid), "-o", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    tracer.send_signal(2)
    tracer.wait(timeout=30)
    sizes = [int(line.rsplit("= ", 1)[1]) for line in out.read_text().splitlines()
             if line.rsplit("= ", 1)[-1].isdigit()]
    written_mb = sum(sizes) / 1e6
    small = sum(1 for s in sizes if s <= SMALL_WRITE_BYTES)
    return len(sizes) / max(written_mb, 1e-9), small / max(len(sizes), 1)


def run(tls: bool, seconds: float, strace: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tls-produce-counts-"))
    cluster = tidewater_side.TidewaterCluster(work, tls=tls)
    try:
        cluster.start()
        cluster.create_topic("counts")
        p = cluster.partition("counts")
        pids = {"leader": cluster.local.process(p.leader)["pid"], "client": os.getpid(),
                **{f"follower{i}": cluster.local.process(r)["pid"]
                   for i, r in enumerate(r for r in p.replicas if r != p.leader)}}
        bootstrap = cluster.local.manifest["kafka_bootstrap"]
        row: dict = {"tls": tls}
        if tls:
            row["cipher"] = negotiated(bootstrap, cluster.local.manifest["tls"])
        stats: list[dict] = []
        config = {**cluster.kafka_client_config, "statistics.interval.ms": 1000,
                  "stats_cb": lambda text: stats.append(json.loads(text))}
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(t=kafka_side.producer_throughput(
            bootstrap, "counts", 1024, "all", seconds, **config)))
        worker.start()
        time.sleep(2.5)  # past connection set-up and the first statistics
        first = len(stats) - 1
        cpu_before = {role: cpu_ms(pid) for role, pid in pids.items()}
        switches_before = {role: context_switches(pid) for role, pid in pids.items()}
        time.sleep(seconds / 2)
        cpu = {role: cpu_ms(pid) - cpu_before[role] for role, pid in pids.items()}
        switches = {role: context_switches(pid) - switches_before[role] for role, pid in pids.items()}
        last = len(stats) - 1
        if strace:
            row["writes_per_mb"], row["small_writes"] = client_writes(
                os.getpid(), 2, work / "client-writes.txt")
        worker.join()

        def leader_stats(index: int) -> dict:
            return next(b for b in stats[index]["brokers"].values() if b["nodeid"] == p.leader)

        # The window's MB from librdkafka's bytes sent to the leader (statistics come each
        # second: the CPU window is read against the statistics' own window, scaled).
        sent_mb = (leader_stats(last)["txbytes"] - leader_stats(first)["txbytes"]) / 1e6
        stats_window_s = (stats[last]["ts"] - stats[first]["ts"]) / 1e6
        window_mb = sent_mb * (seconds / 2) / stats_window_s
        requests = leader_stats(last)["req"]["Produce"] - leader_stats(first)["req"]["Produce"]
        row.update(mb_per_s=result["t"].mb_per_s, requests_per_mb=requests / sent_mb,
                   records_per_batch=stats[last]["topics"]["counts"]["batchcnt"]["avg"])
        followers = [r for r in pids if r.startswith("follower")]
        for role in ("leader", "client"):
            row[f"{role}_cpu"] = cpu[role] / window_mb
            row[f"{role}_switches"] = switches[role] / window_mb
        row["follower_cpu"] = sum(cpu[r] for r in followers) / len(followers) / window_mb
        row["load"] = os.getloadavg()[0]
        return row
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--no-strace", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for i in range(args.rounds):
        # Alternated, the order flipped each round (the first cluster touches fresh memory).
        for tls in ((True, False) if i % 2 == 0 else (False, True)):
            row = run(tls, args.seconds, not args.no_strace)
            if "cipher" in row:
                print(f"negotiated: {row['cipher']}", flush=True)
            rows.append(row)
    headers = ["run", "MB/s", "Produce/MB", "records/batch", "leader CPU ms/MB",
               "follower CPU ms/MB", "client CPU ms/MB", "leader cs/MB", "client cs/MB",
               "client writes/MB", "writes <=1,100 B", "load"]
    cells = [["TLS" if r["tls"] else "plaintext", f"{r['mb_per_s']:.1f}",
              f"{r['requests_per_mb']:.2f}", f"{r['records_per_batch']:.0f}",
              f"{r['leader_cpu']:.2f}", f"{r['follower_cpu']:.2f}", f"{r['client_cpu']:.2f}",
              f"{r['leader_switches']:.0f}", f"{r['client_switches']:.0f}",
              f"{r['writes_per_mb']:.0f}" if "writes_per_mb" in r else "-",
              f"{100 * r['small_writes']:.0f}%" if "small_writes" in r else "-",
              f"{r['load']:.1f}"] for r in rows]
    print(format_table(headers, cells, [False] + [True] * (len(headers) - 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
