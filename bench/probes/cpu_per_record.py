"""CPU microseconds each process spends per record, one record per request.

    .venv/bin/python bench/probes/cpu_per_record.py [--records 2000] [--record-bytes 1024]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic
(1 partition, RF=3) and sends records one at a time with the Producer, each
waiting for its answer, first with acks=1 and then with acks=all. For each it
prints the round trip, the CPU microseconds per record of every process (from
/proc/<pid>/stat; the client's from getrusage) and the leader's own mean time
per RPC from its request_latency histogram.

CPU time is the figure to compare between changes on a shared or loaded
machine: unlike latency percentiles it hardly moves with what else runs. One
record per request is the worst case for per-message costs (gRPC, asyncio,
protobuf), which are what a paced acks=all workload at 1,000 records/s pays.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import process_cpu_s  # noqa: E402
from bench.probes.latency_breakdown import own_cpu_seconds, request_latency  # noqa: E402


def measure(bootstrap: str, topic: str, processes: dict, leader_name: str, acks: int,
            records: int, record_bytes: int) -> None:
    from tidewater.client.producer import Producer

    value = bytes(record_bytes)
    with Producer(bootstrap, acks=acks, linger_ms=0) as producer:
        for _ in range(200):  # warm-up: streams open, code paths hot
            producer.send(topic, value, partition=0).result(timeout=30)
        metrics_before = request_latency(processes[leader_name]["metrics_port"])
        cpu_before = {name: process_cpu_s(proc["pid"]) for name, proc in processes.items()}
        client_before = own_cpu_seconds()
        started = time.perf_counter()
        for _ in range(records):
            producer.send(topic, value, partition=0).result(timeout=30)
        elapsed = time.perf_counter() - started
        client_cpu = own_cpu_seconds() - client_before
        cpu = {name: process_cpu_s(proc["pid"]) - cpu_before[name]
               for name, proc in processes.items()}
        metrics_after = request_latency(processes[leader_name]["metrics_port"])
    label = "all" if acks == -1 else str(acks)
    print(f"acks={label}: round trip {elapsed / records * 1e6:,.0f} µs")
    print(f"  {'process':12s} {'CPU µs/record':>14s}")
    for name in sorted(cpu):
        role = " (leader)" if name == leader_name else ""
        print(f"  {name + role:21s} {cpu[name] / records * 1e6:5,.0f}")
    print(f"  {'client':21s} {client_cpu / records * 1e6:5,.0f}")
    print(f"  {'total':21s} {(sum(cpu.values()) + client_cpu) / records * 1e6:5,.0f}")
    for (rpc, kind), value_after in sorted(metrics_after.items()):
        if kind != "count":
            continue
        count = value_after - metrics_before.get((rpc, "count"), 0)
        if count:
            mean_s = (metrics_after[(rpc, "sum")] - metrics_before.get((rpc, "sum"), 0)) / count
            print(f"  leader {rpc}: {count:,.0f} answered, mean {mean_s * 1e6:,.0f} µs in the broker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--acks", choices=("1", "all", "both"), default="both")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tw-cpu-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory)
        try:
            bootstrap = cluster.start()
            cluster.create_topic("serial")
            leader_name = f"broker-{cluster.leader_of('serial')}"
            processes = dict(cluster.local.manifest["processes"])
            for acks in {"1": (1,), "all": (-1,), "both": (1, -1)}[args.acks]:
                measure(bootstrap, "serial", processes, leader_name, acks, args.records,
                        args.record_bytes)
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
