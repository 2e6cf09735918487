"""Profile the brokers (and optionally this client) during one acks=all produce run.

    .venv/bin/python bench/probes/profile_broker.py [--seconds 15] [--record-bytes 1024]
                                             [--mode pipelined|producer|kafka-produce|kafka-consume]
                                             [--out-dir DIR] [--tls]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic
with 1 partition and RF=3, drives it with acks=all (``pipelined``: pre-encoded
256 KiB batches, 8 in flight; ``producer``: client.producer.Producer;
``kafka-produce``: confluent-kafka over the Kafka listener; ``kafka-consume``:
confluent-kafka reading back, from the start and again, a topic filled first) and
samples the partition leader, one follower and the client process (``--tls``: the
cluster of `tide cluster up --tls`, clients with its certificate) with
py-spy (``pip install py-spy``; needs ptrace, i.e. root or CAP_SYS_PTRACE).

Writes ``DIR/<role>.txt`` (py-spy raw format: one ``frame;frame;... count``
line per distinct stack) and prints, per process, the functions with the most
samples on the stack (inclusive) and at the top of the stack (self).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import format_table  # noqa: E402

# Leaf frames (and frames anywhere on the stack) that mean "waiting", not working: with
# --native, py-spy reports threads blocked in these as samples like any other.
IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll (", "select (", "clock_nanosleep", "nanosleep")
WAITING_FRAMES = ("PyThread_acquire_lock_timed", "Condition.wait", "Event.wait", "select_poll_poll")


def py_spy_path() -> str:
    """py-spy on the PATH, else beside this interpreter (a venv's own)."""
    return shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def start_py_spy(pid: int, out: Path, duration_s: int, rate: int, flags: Sequence[str],
                 stderr: int = subprocess.PIPE) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` for ``duration_s`` into ``out`` (raw format), with
    ``flags`` such as --gil, --nonblocking, --native; the caller waits for it."""
    return subprocess.Popen([py_spy_path(), "record", "--pid", str(pid), "--duration",
                             str(duration_s), "--format", "raw", "--output", str(out),
                             "--rate", str(rate), *flags],
                            stdout=subprocess.DEVNULL, stderr=stderr)


def is_idle(frames: list[str]) -> bool:
    return (frames[-1].startswith(IDLE_LEAVES)
            or any(f.startswith(WAITING_FRAMES) for f in frames))


def parse_raw(text: str, *, busy_only: bool = False) -> tuple[Counter, Counter, int]:
    """(inclusive samples per frame, self samples per frame, total samples) of a py-spy raw
    file; ``busy_only`` drops samples of threads waiting in poll/epoll/sleep/locks."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if busy_only and is_idle(frames):
            continue
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return inclusive, own, total


# Where a sample's leaf frame lives -> the part of the broker it is charged to (first match).
# The stream handlers' own lines in grpc_server.py are almost all the awaited gRPC calls
# (``context.write``, the stream reader), whose C code py-spy charges to the calling line.
PARTS = (
    ("gRPC calls (grpc/, the stream handlers' lines)", ("grpc/", "broker/servicers/")),
    ("Kafka codec (codec.py, kio)", ("broker/kafka/codec.py", "kio/")),
    ("Kafka listener, the rest", ("broker/kafka/",)),
    ("fetch serving (fetch path, purgatory, wire)", ("broker/serving/fetch", "broker/serving/purgatory",
                                                     "broker/serving/replica_fetch_wire")),
    ("produce serving", ("broker/serving/",)),
    ("replication core and fetcher", ("broker/replication/", "broker/following/")),
    ("replica manager, partitions, carrier", ("broker/replicas/",)),
    ("storage and batches", ("broker/storage/", "proto/")),
    ("metrics, clock", ("broker/metrics", "prometheus_client/", "broker/clock")),
    ("the loop itself and asyncio", ("asyncio/", "uvloop/")),
)


def by_part(own: Counter) -> Counter:
    """Samples per part of ``PARTS`` from ``parse_raw``'s self samples per leaf frame, by
    the leaf frame's file; "other" for the rest (dataclass-made ``__init__``s, the stdlib)."""
    parts: Counter = Counter()
    for leaf, count in own.items():
        where = leaf.rsplit("(", 1)[-1]
        parts[next((name for name, prefixes in PARTS
                    if any(prefix in where for prefix in prefixes)), "other")] += count
    return parts


def part_table(parts: Counter, total: int) -> str:
    rows = [(f"{100 * c / max(1, total):5.1f}%", name) for name, c in parts.most_common()]
    return format_table(("samples", "part (leaf frame's file)"), rows, align_right=(True, False))


def top_table(counter: Counter, total: int, n: int) -> str:
    rows = [(f"{100 * c / total:5.1f}%", frame[:140]) for frame, c in counter.most_common(n)]
    return format_table(("samples", "frame"), rows, align_right=(True, False))


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far, from /proc (py-spy samples a thread in
    a system call as busy: this tells the kernel's share apart)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--mode", choices=("pipelined", "producer", "kafka-produce", "kafka-consume"), default="pipelined")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL (Python CPU)")
    parser.add_argument("--native", action="store_true", help="include C frames (gRPC core, uvloop)")
    parser.add_argument("--tls", action="store_true", help="TLS on every port (tide cluster up --tls)")
    args = parser.parse_args(argv)
    if not Path(py_spy_path()).exists():
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="tide-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tide-profile-cluster-"))
    cluster = tidewater_side.TidewaterCluster(work, tls=args.tls)
    spies: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        cluster.start()
        cluster.create_topic("profile")
        p = cluster.partition("profile")
        follower = next(r for r in p.replicas if r != p.leader)
        import os

        targets = {"leader": cluster.local.process(p.leader)["pid"],
                   "follower": cluster.local.process(follower)["pid"], "client": os.getpid()}
        result: dict = {}

        kafka_bootstrap = cluster.local.manifest["kafka_bootstrap"]
        if args.mode == "kafka-consume":
            from bench import kafka_side

            kafka_side.producer_throughput(kafka_bootstrap, "profile", args.record_bytes, "all", 10,
                                           **cluster.kafka_client_config)

        def drive() -> None:
            if args.mode == "kafka-produce":
                from bench import kafka_side

                result["t"] = kafka_side.producer_throughput(
                    kafka_bootstrap, "profile", args.record_bytes, "all", args.seconds + 2,
                    **cluster.kafka_client_config)
            elif args.mode == "kafka-consume":
                from bench import kafka_side

                deadline = time.monotonic() + args.seconds + 2
                while time.monotonic() < deadline:  # read the topic again until profiled
                    result["t"] = kafka_side.consume_throughput(kafka_bootstrap, "profile",
                                                                **cluster.kafka_client_config)
            elif args.mode == "pipelined":
                if args.tls:
                    raise SystemExit("--mode pipelined has no TLS client: use producer")
                result["t"] = tidewater_side.pipelined_throughput(
                    cluster.bootstrap, "profile", args.record_bytes, -1, args.seconds + 2)
            else:
                result["t"] = tidewater_side.producer_throughput(
                    cluster.bootstrap, "profile", args.record_bytes, -1, args.seconds + 2,
                    producer_options=cluster.client_security)

        worker = threading.Thread(target=drive)
        worker.start()
        time.sleep(1)  # past connection set-up
        cpu_before = {role: cpu_seconds(pid) for role, pid in targets.items()}
        window_start = time.monotonic()
        for role, pid in targets.items():
            path = out_dir / f"{role}.txt"
            spy = start_py_spy(pid, path, int(args.seconds), 200,
                               [*([] if args.native else ["--nonblocking"]),
                                *(["--gil"] if args.gil else []),
                                *(["--native"] if args.native else [])])
            spies.append((role, spy, path))
        for _role, spy, _path in spies:
            spy.wait(timeout=args.seconds + 60)
        window_s = time.monotonic() - window_start
        cpu_after = {role: cpu_seconds(pid) for role, pid in targets.items()}
        worker.join()
        t = result.get("t")
        if t is not None:
            print(f"{args.mode} acks=all {args.record_bytes} B: {t.records_per_s:,.0f} rec/s, "
                  f"{t.mb_per_s:.1f} MB/s")
        print(f"CPU over the {window_s:.1f} s profiled (user / system, in cores):")
        for role in targets:
            user = cpu_after[role][0] - cpu_before[role][0]
            system = cpu_after[role][1] - cpu_before[role][1]
            print(f"  {role:9} {user / window_s:.2f} / {system / window_s:.2f}")
        for role, spy, path in spies:
            if not path.exists():
                print(f"{role}: py-spy failed: {spy.stderr.read().decode(errors='replace')[-500:]}")
                continue
            text = path.read_text()
            all_samples = parse_raw(text)[2]
            inclusive, own, total = parse_raw(text, busy_only=True)
            if total == 0:
                print(f"\n== {role}: no busy samples of {all_samples}")
                continue
            print(f"\n== {role} (pid {targets[role]}), {total} busy of {all_samples} samples "
                  f"({100 * total / max(1, all_samples):.0f}%), raw stacks in {path}")
            print("-- self (top of stack)")
            print(top_table(own, total, args.top))
            print("-- inclusive (anywhere on the stack)")
            print(top_table(inclusive, total, args.top))
    finally:
        for _role, spy, _path in spies:
            if spy.poll() is None:
                spy.kill()
                spy.wait(timeout=5)
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
