"""Are the rare slow acks Tidewater's, or pauses of the whole machine?

    .venv/bin/python bench/probes/stall_probe.py [--seconds 90] [--rate 1000] [--slow-ms 8]

Starts a local 3-broker cluster (stopped by pid at the end), produces stamped
1 KiB records with acks=all at a paced rate (the Producer's default of one
request in flight, linger 0, as the benchmark's paced rows) and keeps the due
time of every ack slower than ``--slow-ms``. Beside it run canaries, one
process pinned to each CPU, that only sleep 1 ms at a time and note each
wake-up more than ``--canary-late-ms`` late. A slow window in which a canary
was late too was a pause of that CPU (a vCPU the host did not run, which this
kind of VM may not report as steal time: nothing of ours delays a sleeping
process by tens of ms); one that every canary slept through on time was the
cluster's own. It prints each window of slow acks, the latest canary
wake-up of each CPU inside it (cpu:ms) and the verdict (``+s``: seconds since
the brokers started, ``+p s`` since the producer first fetched metadata, to
line a window up with the brokers' or the client's periodic work); then the late wake-ups outside
any window, and the steal time /proc/stat reported over the run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import KIB, MIB, MachinePauseWatch  # noqa: E402
from bench.probes.latency_probe import run_paced, stamped_payload  # noqa: E402

RECORD_BYTES = 1 * KIB

@dataclass
class SlowWindow:
    """Slow acks whose due times lie within ``gap_s`` of each other."""
    start_s: float
    end_s: float
    worst_ms: float
    records: int
    canary: list[tuple[float, float, int]] = field(default_factory=list)  # (epoch s, ms late, cpu)

    @property
    def paused_cpus(self) -> list[int]:
        """The CPUs whose canary was late in this window: empty if the cluster's own."""
        return sorted({cpu for _, _, cpu in self.canary})


def slow_windows(slow: list[tuple[float, float]], gap_s: float = 0.2) -> list[SlowWindow]:
    """Groups (due epoch s, latency ms) of slow acks into windows: a record due within
    ``gap_s`` of the window's last one joins it."""
    windows: list[SlowWindow] = []
    for due_s, latency_ms in sorted(slow):
        last = windows[-1] if windows else None
        if last is not None and due_s - last.end_s <= gap_s:
            last.end_s = due_s
            last.worst_ms = max(last.worst_ms, latency_ms)
            last.records += 1
        else:
            windows.append(SlowWindow(due_s, due_s, latency_ms, 1))
    return windows


def attach_canary(windows: list[SlowWindow], canary: list[tuple[float, float, int]]
                  ) -> list[tuple[float, float, int]]:
    """Puts each late canary wake-up into the window it overlaps and returns the rest.

    A wake-up at ``t`` that was ``late`` ms late stood still from ``t - late``; it
    overlaps a window whose records were due up to its worst latency before it ended."""
    outside = []
    for wake in sorted(canary):
        woke_s, late_ms, _cpu = wake
        stalled_from_s = woke_s - late_ms / 1000
        for w in windows:
            if stalled_from_s <= w.end_s + w.worst_ms / 1000 and woke_s >= w.start_s:
                w.canary.append(wake)
                break
        else:
            outside.append(wake)
    return outside


def steal_ticks() -> int:
    """All CPUs' steal time so far, in clock ticks (/proc/stat's eighth CPU column)."""
    with open("/proc/stat", encoding="ascii") as f:
        return int(f.readline().split()[8])


def probe(seconds: float, rate_per_s: float, slow_ms: float, canary_late_ms: float,
          settings: dict | None = None, metadata_max_age_ms: int | None = None) -> dict:
    from tidewater.client.metadata import MetadataClient
    from tidewater.client.producer import Producer

    slow: list[tuple[float, float]] = []
    failures: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="tw-stall-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory, settings=settings)
        try:
            bootstrap = cluster.start()
            started_s = time.time()  # the brokers' periodic tasks count from about here
            cluster.create_topic("stall")
            metadata = (None if metadata_max_age_ms is None else
                        MetadataClient(bootstrap, metadata_max_age_ms=metadata_max_age_ms))
            producer = Producer(bootstrap, acks=-1, batch_size_bytes=256 * KIB, linger_ms=0,
                                buffer_memory_bytes=64 * MIB, metadata=metadata)
            try:
                producer.send("stall", bytes(RECORD_BYTES), partition=0).result(timeout=30)
                # The producer's metadata was fetched by that first send: its age counts from here.
                producer_started_s = time.time()
                filler = bytes(RECORD_BYTES)

                def on_ack(fut, due_ns: int) -> None:
                    if fut.exception() is not None:
                        failures.append(fut.exception())
                        return
                    latency_ms = (time.time_ns() - due_ns) / 1e6
                    if latency_ms > slow_ms:
                        slow.append((due_ns / 1e9, latency_ms))

                def send_one(_index: int, due_ns: int) -> None:
                    fut = producer.send("stall", stamped_payload(RECORD_BYTES, due_ns, filler),
                                        partition=0)
                    fut.add_done_callback(lambda f, due_ns=due_ns: on_ack(f, due_ns))

                with MachinePauseWatch(sleep_ms=1.0, late_ms=canary_late_ms) as watch:
                    steal_before = steal_ticks()
                    achieved = run_paced(int(seconds * rate_per_s), rate_per_s, send_one)
                    producer.flush(timeout_s=120)
                    steal = steal_ticks() - steal_before
            finally:
                producer.close(timeout_s=30)
        finally:
            cluster.stop()
    if failures:
        raise RuntimeError(f"{len(failures)} sends failed, first: {failures[0]!r}")
    windows = slow_windows(slow)
    outside = attach_canary(windows, watch.late)
    return {"windows": windows, "canary_outside": outside, "steal_ticks": steal,
            "cluster_started_s": started_s, "producer_started_s": producer_started_s,
            "achieved_rate_per_s": achieved, "records": int(seconds * rate_per_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--slow-ms", type=float, default=8, help="an ack slower than this is slow")
    parser.add_argument("--canary-late-ms", type=float, default=5,
                        help="a canary wake-up later than this is noted")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a broker setting for every broker")
    parser.add_argument("--metadata-max-age-ms", type=int, default=None,
                        help="the producer's metadata_max_age_ms (default: the client's)")
    args = parser.parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.set)
    result = probe(args.seconds, args.rate, args.slow_ms, args.canary_late_ms, settings,
                   args.metadata_max_age_ms)
    windows = result["windows"]
    slow_records = sum(w.records for w in windows)
    print(f"{result['records']:,} acks=all records at {result['achieved_rate_per_s']:,.0f}/s; "
          f"{slow_records} slower than {args.slow_ms:g} ms in {len(windows)} windows; "
          f"steal time reported: {result['steal_ticks']} ticks")
    print(f"{'window (UTC)':14s} {'+s':>6s} {'+p s':>6s} {'records':>7s} {'worst ms':>8s}  {'worst canary late (cpu:ms)':28s} verdict")
    for w in windows:
        start = time.strftime("%H:%M:%S", time.gmtime(w.start_s)) + f"{w.start_s % 1:.3f}"[1:]
        worst = {}
        for _, ms, cpu in w.canary:
            worst[cpu] = max(ms, worst.get(cpu, 0.0))
        late = ", ".join(f"{cpu}:{ms:.0f}" for cpu, ms in sorted(worst.items())) or "-"
        cpus = w.paused_cpus
        verdict = (f"CPU {', '.join(map(str, cpus))} paused" if cpus
                   else "canaries on time: the cluster's own")
        since_start_s = w.start_s - result["cluster_started_s"]
        since_producer_s = w.start_s - result["producer_started_s"]
        print(f"{start:14s} {since_start_s:6.1f} {since_producer_s:6.1f} {w.records:7d} {w.worst_ms:8.1f}  {late:28s} {verdict}")
    outside = result["canary_outside"]
    print(f"canary wake-ups late outside the windows: {len(outside)}"
          + (f" (worst {max(ms for _, ms, _ in outside):.0f} ms)" if outside else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
