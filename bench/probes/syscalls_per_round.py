"""Each broker thread's system calls, context switches and CPU per acks=all round, from perf.

    .venv/bin/python bench/probes/syscalls_per_round.py [--rate 1000] [--seconds 5] [--split]

Starts a local 3-broker cluster (stopped by pid at the end), creates a topic (1
partition, RF=3) and runs ``tidewater_side.paced_latency`` (Producer acks=all,
linger 0, a Consumer process receiving) while ``perf stat --per-thread`` counts,
in every broker thread, the context switches, CPU time and the system calls that
carry gRPC's messages and wake-ups: sendmsg / recvmsg (a message out / in),
epoll_wait (grpc.aio's poller thread waiting on gRPC core), epoll_pwait (uvloop's
loop), write / recvfrom (the poller's byte to the loop per completion-queue event
and the loop reading it back; write also counts eventfd kicks and log appends),
read (the poller's eventfd), futex, pread64 (log reads). Each is printed per round
(one produce request), so two runs of different code compare where percentiles
swing. The clients are counted per thread too, from when their threads are up: the
producer (this process, by Python thread name) and the receiver process (its main
thread polls; the other two are its I/O loop, which sends, and grpc.aio's poller,
which receives). ``--split``: also ``perf record`` the leader and
print its CPU by library (kernel, the interpreter, gRPC core) and its top symbols.
Needs ``perf`` with the syscalls tracepoints (root, or perf_event_paranoid <= -1).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import child_pids  # noqa: E402
from bench.probes.latency_breakdown import request_latency  # noqa: E402

SYSCALLS = ("sendmsg", "recvmsg", "epoll_wait", "epoll_pwait", "write", "recvfrom", "read",
            "futex", "pread64")
EVENTS = ("context-switches", "task-clock", *(f"syscalls:sys_enter_{s}" for s in SYSCALLS))
SHORT = {"context-switches": "switches", "task-clock": "CPU ms"}
PRODUCER, RECEIVER = "producer", "receiver"
CLIENT_IO_THREAD = "tide-client-io"  # the Producer's I/O loop: its threads are up


def perf_stat(pid: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["perf", "stat", "-x", ",", "--per-thread", "-e", ",".join(EVENTS),
                             "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_counts(out: Path) -> dict[int, dict[str, float]]:
    """tid -> event -> count (task-clock in ms), from ``perf stat -x , --per-thread``."""
    counts: dict[int, dict[str, float]] = {}
    for line in out.read_text().splitlines():
        fields = line.split(",")
        try:
            tid, count, event = int(fields[0].rsplit("-", 1)[1]), float(fields[1]), fields[3]
        except (IndexError, ValueError):
            continue  # a comment, or an event perf could not count
        name = SHORT.get(event, event.removeprefix("syscalls:sys_enter_"))
        counts.setdefault(tid, {})[name] = count
    return counts


class ClientAttacher:
    """Attaches ``perf stat`` to the producer (this process) and the receiver process once
    their threads are up (``--per-thread`` counts, one by one, the threads there are when
    it attaches), from a thread polling /proc until both are attached or it is stopped."""

    def __init__(self, directory: Path, perfs: dict[str, tuple[subprocess.Popen[bytes], Path, int]],
                 rounds_now: Callable[[], float]):
        self._directory = directory
        self._perfs = perfs
        self._rounds_now = rounds_now
        self.rounds_at_attach: dict[str, float] = {}  # its counts are per round since then
        self._known = set(child_pids(os.getpid()))  # the receiver is the child started later
        self.producer_names: dict[int, str] = {}  # native thread id -> Python thread name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perf-attacher", daemon=True)
        self._thread.start()

    def _attach(self, name: str, pid: int) -> None:
        out = self._directory / f"{name}.csv"
        self._perfs[name] = (perf_stat(pid, out), out, pid)
        self.rounds_at_attach[name] = self._rounds_now()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set() and (PRODUCER not in self._perfs
                                           or RECEIVER not in self._perfs):
            if RECEIVER not in self._perfs:
                for pid in child_pids(me):
                    if pid not in self._known and _receiver_up(pid):
                        time.sleep(0.3)  # its Consumer's threads start together
                        self._attach(RECEIVER, pid)
                        break
            if PRODUCER not in self._perfs and any(
                    t.name == CLIENT_IO_THREAD for t in threading.enumerate()):
                time.sleep(0.3)
                self.producer_names = {t.native_id: t.name for t in threading.enumerate()
                                       if t.native_id is not None}
                self._attach(PRODUCER, me)
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _receiver_up(pid: int) -> bool:
    """``pid`` is the receiver (a multiprocessing child) and its Consumer's threads run."""
    try:
        return (b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
                and len(os.listdir(f"/proc/{pid}/task")) >= 3)
    except OSError:  # gone meanwhile
        return False


def produce_requests(latency: dict[tuple[str, str], float]) -> float:
    """Produce requests answered so far, from the leader's ``request_latency`` counts."""
    return sum(latency.get((rpc, "count"), 0.0) for rpc in ("ProduceStream", "Produce"))


def print_split(perf_data: Path, top: int) -> None:
    for sort in ("dso", "sym"):
        report = subprocess.run(["perf", "report", "-i", str(perf_data), "--sort", sort, "--stdio"],
                                capture_output=True, text=True, check=False).stdout
        rows = [line for line in report.splitlines() if line.strip() and not line.startswith("#")]
        print(f"-- leader CPU by {'library' if sort == 'dso' else 'symbol'} (perf record)")
        for line in rows[:top]:
            print("  " + line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--split", action="store_true", help="also perf record the leader")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    with tidewater_side.paced_cluster("tw-syscalls-") as (cluster, directory):
        perfs: dict[str, tuple[subprocess.Popen[bytes], Path, int]] = {}
        attacher: ClientAttacher | None = None
        try:
            bootstrap = cluster.bootstrap
            leader = cluster.leader_of("paced")
            processes = cluster.local.manifest["processes"]
            pids = {proc["name"]: proc["pid"] for proc in processes.values()}
            recorder = None
            perf_data = Path(directory) / "leader.perf"
            if args.split:
                recorder = subprocess.Popen(
                    ["perf", "record", "-F", "2000", "-o", str(perf_data), "-p",
                     str(pids[f"broker-{leader}"])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in pids.items():
                if name.startswith("broker-"):
                    out = Path(directory) / f"{name}.csv"
                    perfs[name] = (perf_stat(pid, out), out, pid)
            metrics_port = processes[f"broker-{leader}"]["metrics_port"]
            rpcs_before = request_latency(metrics_port)
            attacher = ClientAttacher(Path(directory), perfs,
                                      lambda: produce_requests(request_latency(metrics_port)))
            result = tidewater_side.paced_latency(bootstrap, "paced", args.record_bytes,
                                                  int(args.rate * args.seconds), args.rate)
            rpcs_after = request_latency(metrics_port)
            attacher.stop()
            for proc in [*(p for p, _, _ in perfs.values()), *([recorder] if recorder else [])]:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
            rounds = produce_requests(rpcs_after) - produce_requests(rpcs_before)
            e2e, ack = result["e2e"], result["ack"]
            print(f"leader broker-{leader}; {rounds:,.0f} rounds (produce requests); "
                  f"load average {os.getloadavg()[0]:.2f}; e2e p50 {e2e.p50_ms:.2f} ms, "
                  f"ack p50 {ack.p50_ms:.2f} ms")
            print("per round:")
            for name, (_, out, pid) in sorted(perfs.items()):
                # The clients' counters started with their threads, some rounds in.
                name_rounds = (produce_requests(rpcs_after) - attacher.rounds_at_attach[name]
                               if name in attacher.rounds_at_attach else rounds)
                role = " (leader)" if name == f"broker-{leader}" else ""
                for tid, counts in sorted(read_counts(out).items()):
                    if counts.get("switches", 0) / name_rounds < 0.1:
                        continue
                    # A broker's main thread runs its event loop; its other busy thread is
                    # grpc.aio's poller (the one with recvmsg).
                    thread = (attacher.producer_names.get(tid, f"thread {tid}")
                              if name == PRODUCER
                              else ("polling thread" if name == RECEIVER else "loop")
                              if tid == pid else f"thread {tid}")
                    print(f"  {name + role + ' / ' + thread:34s} " + "  ".join(
                        f"{event} {count / name_rounds:.2f}" for event, count in counts.items()
                        if count / name_rounds >= 0.05))
            if recorder is not None:
                print_split(perf_data, args.top)
        finally:
            if attacher is not None:
                attacher.stop()
            for proc, _, _ in perfs.values():
                if proc.poll() is None:
                    proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
