"""Where an acks=all record's milliseconds and CPU go at a paced rate.

    .venv/bin/python bench/probes/latency_breakdown.py [--rate 1000] [--seconds 3] [--record-bytes 1024] [--threads]
        [--producer threaded|asyncio] [--receiver consumer|aio_consumer|stream]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic
(1 partition, RF=3), runs ``tidewater_side.paced_latency`` (Producer acks=all,
linger 0, a Consumer process receiving) and prints the latency percentiles
next to the CPU seconds each process spent per second of the run (from
/proc/<pid>/stat), so a run that is CPU-bound on 2 cores shows as such: the
sum over processes near the core count means queueing, not round trips.
It also prints the context switches per round (one produce request) of every
process, all threads summed (sampled from /proc every 250 ms; the sampler's own
4 wake-ups a second fall on this process): on a machine whose speed swings,
these counts compare two versions of the code where the percentiles cannot
(``--threads``: per thread, the main one marked, this process's by their Python names).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import threading
import time
import urllib.request
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import SwitchCounter, child_pids, process_cpu_s, thread_names  # noqa: E402
from bench.probes.profile_broker import parse_raw, start_py_spy, top_table  # noqa: E402

_LATENCY_LINE = re.compile(
    r'tidewater_broker_request_latency_seconds_(sum|count)\{rpc="([\w:]+)"\} (\S+)')


def request_latency(metrics_port: int) -> dict[tuple[str, str], float]:
    """(rpc, "sum" | "count") -> value, from a broker's /metrics (Kafka APIs as "kafka:Fetch")."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    return {(m.group(2), m.group(1)): float(m.group(3))
            for m in map(_LATENCY_LINE.match, text.decode().splitlines()) if m}


def own_cpu_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


PRODUCER = "client: producer (this process)"
RECEIVER = "client: receiver process"


class SwitchSampler:
    """Samples the context switches of the cluster's processes, this process and its other
    children (the receiver) every ``interval_s`` in a thread, until stopped."""

    def __init__(self, cluster_pids: dict[str, int], interval_s: float = 0.25):
        self.counter = SwitchCounter()
        self.names: dict[tuple[str, int], str] = {}  # (process, tid) -> thread name
        self._cluster_pids = cluster_pids
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="switch-sampler", daemon=True)

    def _sample_one(self, name: str, pid: int) -> None:
        self.counter.sample(name, pid)
        # Python threads do not name their OS threads: this process's own are named from
        # threading, the others by their OS name, the first thread as "main".
        python_names = ({t.native_id: t.name for t in threading.enumerate()}
                        if pid == os.getpid() else {})
        for tid, thread in thread_names(pid).items():
            label = "main" if tid == pid else python_names.get(tid, thread)
            self.names.setdefault((name, tid), f"{label} ({tid})")

    def _sample(self) -> None:
        for name, pid in self._cluster_pids.items():
            self._sample_one(name, pid)
        self._sample_one(PRODUCER, os.getpid())
        cluster = set(self._cluster_pids.values())
        for pid in child_pids(os.getpid()):
            if pid not in cluster:
                self._sample_one(RECEIVER, pid)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def __enter__(self) -> SwitchSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--profile", choices=("leader", "follower"), default=None,
                        help="py-spy (GIL samples) that broker during the run; prints the top frames")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--profile-out", default=None, help="also keep the raw py-spy file here")
    parser.add_argument("--native", action="store_true",
                        help="profile every thread with C frames (gRPC core, uvloop), not GIL only")
    parser.add_argument("--threads", action="store_true",
                        help="also print the context switches per round of each thread (by name)")
    parser.add_argument("--producer", choices=tidewater_side.PRODUCERS, default="threaded",
                        help="threaded: Producer from a pacer thread; asyncio: AsyncProducer on its loop")
    parser.add_argument("--receiver", choices=tuple(tidewater_side.RECEIVERS), default="consumer",
                        help="consumer: Consumer.poll; aio_consumer: AsyncConsumer.poll; "
                             "stream: the FetchStream read on one loop by the bench")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a broker setting for every broker")
    args = parser.parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.set)
    with tidewater_side.paced_cluster("tw-latency-", settings) as (cluster, directory):
        bootstrap = cluster.bootstrap
        leader = cluster.leader_of("paced")
        pids = {proc["name"]: proc["pid"] for proc in cluster.local.manifest["processes"].values()}
        before = {name: process_cpu_s(pid) for name, pid in pids.items()}
        metrics_port = cluster.local.manifest["processes"][f"broker-{leader}"]["metrics_port"]
        rpcs_before = request_latency(metrics_port)
        spy, spy_out = None, Path(directory) / "spy.txt"
        if args.profile:
            target = leader if args.profile == "leader" else next(
                int(n.split("-")[1]) for n in pids if n.startswith("broker-")
                and int(n.split("-")[1]) != leader)
            spy = start_py_spy(pids[f"broker-{target}"], spy_out, int(args.seconds) + 2, 500,
                               ["--native", "--threads"] if args.native
                               else ["--gil", "--nonblocking"])
        client_before = own_cpu_seconds()
        started = time.perf_counter()
        started_wall = time.time()
        with SwitchSampler(pids) as sampler:
            result = tidewater_side.paced_latency(bootstrap, "paced", args.record_bytes,
                                                  int(args.rate * args.seconds), args.rate,
                                                  producer_kind=args.producer,
                                                  receiver_kind=args.receiver)
        elapsed = time.perf_counter() - started
        if spy is not None:
            spy.wait(timeout=60)
        cpu = {name: process_cpu_s(pid) - before[name] for name, pid in pids.items()}
        rpcs = {rpc: value - rpcs_before.get((rpc, kind), 0.0)
                for (rpc, kind), value in request_latency(metrics_port).items() if kind == "count"}
        cpu["client (producer + receiver)"] = own_cpu_seconds() - client_before
        profile_text = spy_out.read_text() if spy is not None and spy_out.exists() else None
        if profile_text is not None and args.profile_out:
            Path(args.profile_out).write_text(profile_text)
    print(f"run window (epoch s) {started_wall:.3f} {started_wall + elapsed:.3f}")
    print(f"producer {args.producer}, receiver {args.receiver}")
    print(f"load average {os.getloadavg()[0]:.2f}; run {elapsed:.1f} s; leader broker-{leader}; "
          f"achieved {result['achieved_rate_per_s']:,.0f}/s")
    for kind in ("ack", "e2e"):
        s = result[kind]
        if s is not None:
            print(f"{kind:4s} p50 {s.p50_ms:6.2f} ms  p99 {s.p99_ms:6.2f} ms  p99.9 {s.p999_ms:6.2f} ms")
    print("leader answers per second: " + ", ".join(
        f"{rpc} {count / elapsed:,.0f}" for rpc, count in sorted(rpcs.items()) if count))
    print("CPU seconds per second of run (2 cores = 2.0):")
    for name, seconds in sorted(cpu.items()):
        print(f"  {name:30s} {seconds / elapsed:5.2f}")
    print(f"  {'total':30s} {sum(cpu.values()) / elapsed:5.2f}")
    rounds = rpcs.get("ProduceStream", 0) + rpcs.get("Produce", 0)
    if rounds:
        # A round is one produce request: what one replication round costs in wake-ups.
        switches = sampler.counter.totals()
        print(f"context switches per round ({rounds:,.0f} produce requests; all threads):")
        for name, count in sorted(switches.items()):
            print(f"  {name:32s} {count / rounds:5.1f}")
        print(f"  {'total':32s} {sum(switches.values()) / rounds:5.1f}")
        if args.threads:
            print("  by thread (process / thread (tid)), 0.1 a round or more:")
            for key, count in sorted(sampler.counter.by_thread().items()):
                if count / rounds >= 0.1:
                    label = f"{key[0]} / {sampler.names.get(key, key[1])}"
                    print(f"    {label:56s} {count / rounds:5.1f}")
    if profile_text is not None:
        inclusive, own, total = parse_raw(profile_text, busy_only=args.native)
        kind = "busy thread" if args.native else "GIL"
        print(f"-- {args.profile} py-spy, {total} {kind} samples; self (top of stack)")
        print(top_table(own, total, args.top))
        print("-- inclusive (anywhere on the stack)")
        print(top_table(inclusive, total, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
