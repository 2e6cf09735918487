"""CPU microseconds each process spends per record over the Kafka listener at a paced rate.

    .venv/bin/python bench/probes/kafka_cpu_per_record.py [--rates 1000 400] [--paths kafka grpc] [--records 3000]
        [--rounds 1] [--profile-dir DIR] [--set NAME=VALUE]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic
(1 partition, RF=3) and runs the kafka latency row (``kafka_side.paced_latency``:
confluent-kafka acks=all, linger 0, one request in flight, one record per request,
a librdkafka consumer in another process at the topic's end). For each round it
prints e2e p50/p99 and the CPU microseconds per record of every broker (from
/proc/<pid>/stat), the leader marked: the Kafka path's counterpart of
``cpu_per_record.py`` (gRPC, our own Producer). ``--paths kafka grpc`` alternates
with the gRPC row (our Producer and Consumer). ``--profile-dir``: py-spy samples
the leader and one follower during the last round (``--gil --nonblocking``: Python
CPU only) and the busiest frames are printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import kafka_side, tidewater_side  # noqa: E402
from bench.bench_common import process_cpu_s  # noqa: E402
from bench.probes.latency_breakdown import request_latency  # noqa: E402
from bench.probes.profile_broker import (  # noqa: E402
    by_part,
    parse_raw,
    part_table,
    start_py_spy,
    top_table,
)


def start_spies(targets: dict[str, int], out_dir: Path, seconds: float) -> list:
    spies = []
    for role, pid in targets.items():
        path = out_dir / f"{role}.txt"
        spy = start_py_spy(pid, path, max(1, int(seconds)), 250, ["--gil", "--nonblocking"],
                           stderr=subprocess.DEVNULL)
        spies.append((role, spy, path))
    return spies


def print_profiles(spies: list, top: int) -> None:
    for role, spy, path in spies:
        spy.wait(timeout=120)
        if not path.exists():
            print(f"{role}: py-spy wrote nothing")
            continue
        inclusive, own, total = parse_raw(path.read_text())
        print(f"\n== {role}: {total} samples holding the GIL, raw stacks in {path}")
        print("-- by part")
        print(part_table(by_part(own), total))
        print("-- self")
        print(top_table(own, max(1, total), top))
        print("-- inclusive")
        print(top_table(inclusive, max(1, total), top))


def one_round(cluster: tidewater_side.TidewaterCluster, path: str, topic: str,
              pids: dict[str, int], leader_metrics_port: int, records: int, rate_per_s: float,
              spies_args: tuple | None) -> dict:
    spies: list = []
    requests_before = request_latency(leader_metrics_port)
    cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    if spies_args is not None:
        spies = start_spies(*spies_args)
    if path == "kafka":
        result = kafka_side.paced_latency(cluster.local.manifest["kafka_bootstrap"], topic,
                                          1024, records, rate_per_s)
    else:
        result = tidewater_side.paced_latency(cluster.bootstrap, topic, 1024, records,
                                              rate_per_s)
    elapsed = time.perf_counter() - started
    cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in pids.items()}
    requests_after = request_latency(leader_metrics_port)
    # Requests the leader answered per record, by RPC (its request_latency counts).
    requests = {rpc: (count - requests_before.get((rpc, "count"), 0)) / records
                for (rpc, kind), count in requests_after.items() if kind == "count"}
    # And the mean time each took in the leader, read to answer written (its histogram's
    # sum over its count): a produce's is most of an acks=all round.
    in_leader_ms = {rpc: 1000 * (requests_after[(rpc, "sum")]
                                 - requests_before.get((rpc, "sum"), 0)) / (n * records)
                    for rpc, n in requests.items() if n >= 0.01}
    result.update(cpu=cpu, elapsed=elapsed, spies=spies,
                  requests={rpc: n for rpc, n in requests.items() if n >= 0.01},
                  in_leader_ms=in_leader_ms)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0])
    parser.add_argument("--paths", choices=("kafka", "grpc"), nargs="+", default=["kafka"],
                        help="kafka: confluent-kafka at both ends (the kafka latency row); "
                             "grpc: our Producer and Consumer (the gRPC row); alternated")
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile-dir", default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a broker setting for every broker (offsets.topic.num.partitions=1: "
                             "no idle partitions in the follower fetches)")
    args = parser.parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.set)
    import tidewater.broker

    print(f"tidewater from {Path(tidewater.broker.__file__).parent.parent}")
    with tidewater_side.paced_cluster("tw-kafka-cpu-", settings) as (cluster, directory):
        partition = cluster.partition("paced")
        leader_name = f"broker-{partition.leader}"
        processes = cluster.local.manifest["processes"]
        pids = {name: proc["pid"] for name, proc in processes.items()}
        leader_metrics_port = processes[leader_name]["metrics_port"]
        # Warm-up: connections, metadata, __consumer_offsets creation.
        kafka_side.paced_latency(cluster.local.manifest["kafka_bootstrap"], "paced", 1024,
                                 500, 1000.0)
        rows = []
        for round_number in range(1, args.rounds + 1):
            for rate_per_s in args.rates:
                for path in args.paths:
                    spies_args = None
                    if args.profile_dir and round_number == args.rounds:
                        out_dir = Path(args.profile_dir) / f"{path}-{rate_per_s:.0f}"
                        out_dir.mkdir(parents=True, exist_ok=True)
                        follower = next(r for r in partition.replicas
                                        if r != partition.leader)
                        targets = {"leader": pids[leader_name],
                                   "follower": pids[f"broker-{follower}"]}
                        spies_args = (targets, out_dir, args.records / rate_per_s - 1)
                    r = one_round(cluster, path, "paced", pids, leader_metrics_port,
                                  args.records, rate_per_s, spies_args)
                    r.update(round=round_number, path=path, rate=rate_per_s,
                             load=os.getloadavg()[0])
                    rows.append(r)
                    print(f"[probe] round {round_number} {path} {rate_per_s:,.0f}/s: e2e p50 "
                          f"{r['e2e'].p50_ms:.2f} ms", flush=True)
                    if r["spies"]:
                        print(f"\n######## py-spy, {path} at {rate_per_s:,.0f}/s")
                        print_profiles(r["spies"], args.top)
        brokers = sorted(pids, key=lambda name: (name != leader_name, name))
        brokers = [name for name in brokers if name.startswith("broker")]
        print(f"\nacks=all 1 KiB, RF 3, 1 partition; CPU µs per record from /proc "
              f"(leader {leader_name}); load = 1-min load average after the run")
        header = (f"{'round':>5} {'path':5} {'rate/s':>6} {'achieved':>8} {'e2e p50':>7} "
                  f"{'e2e p99':>7} {'ack p50':>7} "
                  + " ".join(f"{name + ('*' if name == leader_name else ''):>9}"
                             for name in brokers) + f" {'load':>5}")
        print(header)
        for r in rows:
            print(f"{r['round']:>5} {r['path']:5} {r['rate']:>6,.0f} "
                  f"{r['achieved_rate_per_s']:>8,.0f} {r['e2e'].p50_ms:>7.2f} "
                  f"{r['e2e'].p99_ms:>7.2f} {r['ack'].p50_ms:>7.2f} "
                  + " ".join(f"{r['cpu'][name] / args.records * 1e6:>9,.0f}"
                             for name in brokers) + f" {r['load']:>5.2f}")
        print("\nrequests the leader answered per record (mean ms in the leader, read to "
              "answer written)")
        for r in rows:
            print(f"  round {r['round']} {r['path']:5} {r['rate']:>6,.0f}/s: " + ", ".join(
                f"{rpc} {n:.2f} ({r['in_leader_ms'][rpc]:.2f})"
                for rpc, n in sorted(r["requests"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
