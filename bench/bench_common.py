"""Shared helpers of the cluster benchmark: percentiles, rates, the result table,
the machine description and ownership of every process the benchmark starts.

``CpuMeter`` sums user + system CPU seconds of a set of processes (from
/proc/<pid>/stat, or getrusage for this process) around a workload: on a shared
machine the CPU cost per megabyte says more about the code than wall-clock time.

``SwitchCounter`` counts the context switches of processes' threads over a run
(from /proc/<pid>/task/<tid>/status), the figure that showed where wake-ups go
when latency percentiles swung with a noisy machine.

Pure helpers (``percentile``, ``latency_summary``, ``format_table``, ``ratio``,
``parse_context_switches``, ``SwitchCounter.record``) are unit-tested in tests/unit/test_bench_common.py.

Result rows (``Row``) are what ``cluster_bench.py`` prints and writes as JSON:
one metric, its unit, the Tidewater value, the peer (NATS JetStream) value,
and a note saying how it was measured. A value of None means "not measured"
(skipped or failed; the note says why).
"""

from __future__ import annotations

import math
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tidewater.proto import grpc_env
from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers

# Benchmarks run the clients as Tidewater's own programs do (proto/grpc_env.py); every
# bench script imports this module before anything imports grpc.
grpc_env.apply()
# MiB-sized produce requests and fetch answers stay off per-call mmap (proto/malloc_tuning.py).
tune_malloc_for_large_buffers()

HOST = "127.0.0.1"
KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB


# ---------------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values, linear interpolation
    between closest ranks (numpy's default). Raises ValueError on no values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return float(sorted_values[low])
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float


def receiver_latencies(parent_end: Any, timeout_s: float) -> list[float]:
    """The e2e latencies (ms) a latency receiver process sends back on ``parent_end``
    (its ``Pipe`` end) once it has every record or its time is up."""
    if not parent_end.poll(timeout_s):
        raise RuntimeError("latency receiver did not answer")
    latencies: list[float] = parent_end.recv()
    return latencies


def paced_latency_result(ack_ms: Sequence[float], e2e_ms: Sequence[float], achieved_rate_per_s: float,
                         failures: Sequence[object]) -> dict[str, Any]:
    """A paced latency run's figures: ack and e2e ``LatencySummary`` (e2e None when
    nothing arrived), records received, the achieved rate; a failed send fails the run."""
    if failures:
        raise RuntimeError(f"{len(failures)} paced sends failed, first: {failures[0]!r}")
    return {"ack": latency_summary(ack_ms), "e2e": latency_summary(e2e_ms) if e2e_ms else None,
            "received": len(e2e_ms), "achieved_rate_per_s": achieved_rate_per_s}


def latency_summary(samples_ms: Sequence[float]) -> LatencySummary:
    """p50 / p99 / p99.9 / max / mean of latency samples in milliseconds."""
    values = sorted(samples_ms)
    if not values:
        raise ValueError("no latency samples")
    return LatencySummary(count=len(values), p50_ms=percentile(values, 50),
                          p99_ms=percentile(values, 99), p999_ms=percentile(values, 99.9),
                          max_ms=values[-1], mean_ms=sum(values) / len(values))


def stop_child(process: Any, join_timeout_s: float = 10) -> None:
    """Join a bench's helper process (a latency receiver, a sender); killed if it has not
    ended within ``join_timeout_s``."""
    process.join(timeout=join_timeout_s)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)


def median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 50)


@dataclass(frozen=True)
class Throughput:
    records: int
    payload_bytes: int
    elapsed_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    cpu_s: float | None = None  # CPU seconds of every process involved (servers and client)

    @property
    def mb_per_s(self) -> float:
        """Payload megabytes (10^6 bytes) per second, as Kafka's and NATS's tools print."""
        return self.payload_bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_cpu_s(self) -> float | None:
        """Payload megabytes per CPU second: throughput per fully used core."""
        if not self.cpu_s:
            return None
        return self.payload_bytes / self.cpu_s / 1e6



def summed(samples: list[Throughput | None]) -> Throughput | None:
    """Samples of one workload as one: records, bytes, seconds and CPU added up (a failed
    sample, None, is left out and its error is in the bench's errors already)."""
    present = [t for t in samples if t is not None]
    if not present:
        return None
    cpu = [t.cpu_s for t in present]
    return Throughput(sum(t.records for t in present), sum(t.payload_bytes for t in present),
                      sum(t.elapsed_s for t in present),
                      None if any(c is None for c in cpu) else sum(c for c in cpu if c is not None))

def ratio(ours: float | None, peer: float | None) -> float | None:
    """ours / peer, or None when either is missing or the peer is zero."""
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


# ---------------------------------------------------------------------- the table


@dataclass
class Row:
    section: str
    metric: str
    unit: str
    tidewater: float | None = None
    peer: float | None = None
    note: str = ""
    # "higher" when a bigger value is better (throughput), "lower" for times.
    better: str = "higher"
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return ratio(self.tidewater, self.peer)

    def to_json(self) -> dict:
        out = asdict(self)
        out["ratio_tidewater_over_peer"] = self.ratio
        return out


def format_value(value: float | None) -> str:
    """Compact human number: 3 significant digits, thousands separated; '-' for None."""
    if value is None:
        return "-"
    if value != value:  # NaN
        return "nan"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude == 0:
        return "0"
    return f"{value:.3f}"


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 align_right: Sequence[bool] | None = None) -> str:
    """Plain-text table: columns padded to their widest cell, a dashed rule under the header.
    ``align_right[i]`` right-aligns column i (numbers); default left."""
    columns = len(headers)
    for row in rows:
        if len(row) != columns:
            raise ValueError(f"row has {len(row)} cells, table has {columns} columns: {row!r}")
    right = list(align_right) if align_right is not None else [False] * columns
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [cells[i].rjust(widths[i]) if right[i] else cells[i].ljust(widths[i])
                 for i in range(columns)]
        return "  ".join(parts).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def results_table(rows: Sequence[Row],
                  earlier: Mapping[tuple[str, str, str], str] | None = None) -> str:
    """The rows; with ``earlier`` ((section, metric, unit) -> text), a column of the
    figures an issue started from beside them (``bench/earlier_figures.py``)."""
    headers: tuple[str, ...] = ("section", "metric", "unit", "tidewater", "nats-js", "tw/peer")
    right: tuple[bool, ...] = (False, False, False, True, True, True)
    cells = [(r.section, r.metric, r.unit, format_value(r.tidewater), format_value(r.peer),
              format_ratio(r.ratio)) for r in rows]
    if earlier is not None:
        headers += ("earlier",)
        right += (True,)
        cells = [(*c, earlier.get((r.section, r.metric, r.unit), ""))
                 for c, r in zip(cells, rows, strict=True)]
    return format_table(headers + ("note",), [(*c, r.note) for c, r in zip(cells, rows,
                                                                             strict=True)],
                        align_right=right + (False,))


# ---------------------------------------------------------------------- the machine


def machine_description() -> dict:
    cpu_model = "unknown"
    try:
        for text_line in open("/proc/cpuinfo", encoding="utf-8"):
            if text_line.startswith("model name"):
                cpu_model = text_line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_total_bytes = (meminfo_bytes() or {}).get("MemTotal")
    return {"nproc": os.cpu_count(), "cpu_model": cpu_model, "kernel": platform.release(),
            "python": platform.python_version(),
            "memory_gib": round(memory_total_bytes / GIB, 1) if memory_total_bytes else None}


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and
    parentheses), from field 3 (state) on; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) from /proc; 0 if it is gone."""
    if pid == os.getpid():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # After the command name: state is field 3, utime field 14, stime field 15 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def cpu_seconds(pids: Sequence[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)


class CpuMeter:
    """CPU seconds a set of processes spends during a block: the cost of the work, which a
    loaded machine does not inflate the way it inflates wall-clock time."""

    def __init__(self, pids: Sequence[int]):
        self.pids = list(pids)
        self.cpu_s = 0.0
        self._start = 0.0

    def __enter__(self) -> CpuMeter:
        self._start = cpu_seconds(self.pids)
        return self

    def __exit__(self, *exc) -> None:
        self.cpu_s = cpu_seconds(self.pids) - self._start


def parse_context_switches(status_text: str) -> int:
    """Voluntary + involuntary context switches from one /proc/<pid>/task/<tid>/status text."""
    total = 0
    for line in status_text.splitlines():
        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
            total += int(line.split(":", 1)[1])
    return total


def _per_thread(pid: int, filename: str) -> dict[int, str]:
    """tid -> the text of /proc/<pid>/task/<tid>/<filename>, for every thread of ``pid``;
    empty if the process is gone, without the threads that end while being read."""
    texts = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return texts
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{filename}", encoding="utf-8") as f:
                texts[int(tid)] = f.read()
        except OSError:
            continue  # the thread ended between the listing and the read
    return texts


def thread_context_switches(pid: int) -> dict[int, int]:
    """tid -> context switches so far, for every thread of ``pid``; empty if it is gone.

    Per thread, because /proc/<pid>/status counts only the process's first thread."""
    return {tid: parse_context_switches(text) for tid, text in _per_thread(pid, "status").items()}


def child_pids(parent_pid: int) -> list[int]:
    """Processes whose parent is ``parent_pid`` (from /proc/<pid>/stat)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and int(fields[1]) == parent_pid:  # ppid is field 4 (man 5 proc)
            children.append(int(entry))
    return children


class SwitchCounter:
    """Context switches of named processes' threads over a run, from repeated samples.

    Each sample keeps every thread's first and latest count, so a thread that starts during
    the run counts from zero and one that ends counts up to the last sample that saw it.
    Counting switches shows a change's effect where latency percentiles swing with the
    machine: each hand-off between threads is two of them."""

    def __init__(self):
        self._first: dict[tuple[str, int], int] = {}
        self._latest: dict[tuple[str, int], int] = {}
        self._started: set[str] = set()

    def sample(self, name: str, pid: int) -> None:
        self.record(name, thread_context_switches(pid))

    def record(self, name: str, counts: dict[int, int]) -> None:
        """One sample of process ``name``: tid -> its context switches so far."""
        known = name in self._started
        self._started.add(name)
        for tid, count in counts.items():
            key = (name, tid)
            if key not in self._first:
                # A thread born after the first sample of its process counts from zero.
                self._first[key] = count if not known else 0
            self._latest[key] = count

    def totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (name, _tid), count in self.by_thread().items():
            totals[name] = totals.get(name, 0) + count
        return totals

    def by_thread(self) -> dict[tuple[str, int], int]:
        """(process name, tid) -> that thread's context switches over the run."""
        return {key: latest - self._first[key] for key, latest in self._latest.items()}


def thread_names(pid: int) -> dict[int, str]:
    """tid -> the thread's name (/proc/<pid>/task/<tid>/comm) for every thread of ``pid``."""
    return {tid: text.strip() for tid, text in _per_thread(pid, "comm").items()}


# A canary pinned to one CPU: sleeps ``sleep_ms`` at a time until stopped and prints
# "<epoch s> <ms late> <cpu>" for every wake-up more than ``late_ms`` late.
CANARY = """
import os, sys, time
sleep_ms, late_ms, cpu = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
while True:
    t0 = time.perf_counter()
    time.sleep(sleep_ms / 1000)
    late = (time.perf_counter() - t0) * 1000 - sleep_ms
    if late > late_ms:
        print(f"{time.time():.4f} {late:.2f} {cpu}", flush=True)
"""


def parse_canary(text: str) -> list[tuple[float, float, int]]:
    """The canaries' lines as (epoch s, ms late, cpu)."""
    return [(float(a), float(b), int(c))
            for a, b, c in (line.split() for line in text.splitlines() if line)]


@dataclass
class MachinePauses:
    """What the canaries saw during a run: wake-ups later than ``pause_ms``."""
    pause_ms: float
    late: list[tuple[float, float, int]]  # (epoch s, ms late, cpu), all above pause_ms

    @property
    def worst_ms(self) -> float:
        return max((ms for _, ms, _ in self.late), default=0.0)

    def describe(self) -> str:
        if not self.late:
            return f"no canary woke > {self.pause_ms:g} ms late"
        cpus = ",".join(str(c) for c in sorted({cpu for _, _, cpu in self.late}))
        return (f"{len(self.late)} canary wake-up(s) > {self.pause_ms:g} ms late, "
                f"worst {self.worst_ms:.0f} ms (CPU {cpus})")


class MachinePauseWatch:
    """One sleeping canary process pinned to each CPU for the length of a block.

    Nothing a workload does delays a sleeping process's wake-up by tens of ms on an
    otherwise working machine, so a canary that wakes that late saw the machine
    itself stand still (a VM whose vCPUs the host did not run, which such a VM may
    not report as steal time). The canaries are stopped by pid when the block ends.
    """

    def __init__(self, sleep_ms: float = 2.0, late_ms: float = 5.0):
        self.sleep_ms, self.late_ms = sleep_ms, late_ms
        self.late: list[tuple[float, float, int]] = []
        self._canaries: list[subprocess.Popen] = []

    def __enter__(self) -> MachinePauseWatch:
        for cpu in sorted(os.sched_getaffinity(0)):
            self._canaries.append(subprocess.Popen(
                [sys.executable, "-c", CANARY, str(self.sleep_ms), str(self.late_ms), str(cpu)],
                stdout=subprocess.PIPE, text=True))
        return self

    def __exit__(self, *exc) -> None:
        text = []
        for canary in self._canaries:
            canary.terminate()  # its lines are flushed as written: none is lost
            try:
                text.append(canary.communicate(timeout=10)[0])
            except subprocess.TimeoutExpired:
                canary.kill()
                text.append(canary.communicate()[0])
        self._canaries = []
        self.late = parse_canary("".join(text))

    def pauses(self, pause_ms: float = 10.0) -> MachinePauses:
        return MachinePauses(pause_ms, [w for w in self.late if w[1] > pause_ms])


def with_machine_pauses(fn, *args, **kwargs) -> dict:
    """Run a latency workload that returns a dict under a MachinePauseWatch; the dict
    gains "machine_pauses" (MachinePauses over 10 ms)."""
    with MachinePauseWatch() as watch:
        result = fn(*args, **kwargs)
    result["machine_pauses"] = watch.pauses()
    return result


def with_cpu(pids: Sequence[int], fn, *args, **kwargs) -> Throughput:
    """Run a workload returning a Throughput; fill in the CPU seconds ``pids`` spent on it."""
    with CpuMeter(pids) as meter:
        result = fn(*args, **kwargs)
    return replace(result, cpu_s=meter.cpu_s)


def meminfo_bytes() -> dict[str, int] | None:
    """/proc/meminfo's kB fields in bytes (None where there is no such file)."""
    try:
        lines = open("/proc/meminfo").read().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            fields[name] = int(words[0]) * 1024
    return fields


def dirty_page_cache_bytes() -> int | None:
    """``Dirty`` + ``Writeback`` from /proc/meminfo (None where there is no such file)."""
    fields = meminfo_bytes()
    if fields is None:
        return None
    return sum(fields.get(name, 0) for name in ("Dirty", "Writeback"))


def settle_page_cache(timeout_s: float = 60.0) -> float:
    """Write back what earlier rows left dirty (``sync``) before a latency row, so the
    row measures the system under its own load, not the kernel's writeback of GiBs an
    earlier throughput row wrote; both systems get it. Returns the seconds it took."""
    started = time.monotonic()
    os.sync()
    while time.monotonic() - started < timeout_s:
        dirty = dirty_page_cache_bytes()
        if dirty is None or dirty < 64 * 1024 * 1024:
            break
        time.sleep(0.2)
    return time.monotonic() - started


def mem_available_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (None where there is no such file or field)."""
    fields = meminfo_bytes()
    return None if fields is None else fields.get("MemAvailable")


PAGE_CACHE_FILL_NAME = "page-cache-fill"


def fill_page_cache(directory, *, reserve_bytes: int = 1 << 30, size_bytes: int | None = None,
                    chunk_bytes: int = 8 << 20) -> int:
    """Fill the page cache with a clean file, as a broker that has run a while has it full
    of older log, so that new log pages come from reclaimed cache. Returns the file's size
    (0 when the memory is not there); the file stays in ``directory`` until the caller
    deletes it.

    Why: in a VM whose balloon hands freed guest memory back to the host (virtio free page
    reporting), a page the guest takes from free memory faults in the host on its first
    write. On the 2-CPU bench VM that made copying records into the page cache several
    times dearer than into reclaimed cache, and the acks=all 1 KiB row swung between ~100
    and ~175 MB/s with the state of memory alone. ``size_bytes`` defaults to MemAvailable
    less ``reserve_bytes``. The file is sparse and read once: its holes read as zeros into
    the page cache, so filling it writes nothing and takes no disk space."""
    if size_bytes is None:
        available = mem_available_bytes()
        if available is None:
            return 0
        size_bytes = available - reserve_bytes
    size_bytes -= size_bytes % chunk_bytes
    if size_bytes < chunk_bytes:
        return 0
    path = os.path.join(directory, PAGE_CACHE_FILL_NAME)
    with open(path, "w+b", buffering=0) as f:
        f.truncate(size_bytes)
        buffer = bytearray(chunk_bytes)
        while f.readinto(buffer):
            pass
    return size_bytes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- processes we own


class OwnedProcesses:
    """Every child the benchmark starts, stopped by pid (never by name): SIGTERM, then
    SIGKILL after ``grace_s``. ``stop_all`` is safe to call twice and on Ctrl-C."""

    def __init__(self) -> None:
        self._children: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], *, log_path: str, cwd: str | None = None,
              env: dict | None = None) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            child = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                     start_new_session=True)
        self._children.append(child)
        return child

    def pids(self) -> list[int]:
        """Pids of the children still tracked (running or not yet reaped)."""
        return [child.pid for child in self._children]

    def stop(self, child: subprocess.Popen, grace_s: float = 5.0,
             sig: int = signal.SIGTERM) -> None:
        if child.poll() is None:
            try:
                child.send_signal(sig)
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
            except ProcessLookupError:
                pass

    def stop_all(self, grace_s: float = 5.0) -> None:
        for child in self._children:
            if child.poll() is None:
                try:
                    child.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for child in self._children:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=5)
        self._children = [c for c in self._children if c.poll() is None]
