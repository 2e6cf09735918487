"""Benchmark: the audit at scale, >= 10 GiB of segments, on local[2] and a 2-worker cluster.

    .venv/bin/python bench/audit_scale_bench.py [--size-gib 10] [--partitions 16]
        [--segment-mib 1024] [--batch-bytes 2048] [--dir DIR] [--keep]
        [--masters local,cluster] [--skip-memory]

(``make bench-audit``; BENCH_ARGS="--size-gib 1" for a quick run.)

1. Writes the dump: 3 brokers' data dirs, ``--partitions`` partitions of one
   topic on each, every replica the same batches (RecordBatch v2 from the
   project's encoder, proto/records.py ``encode_batch``, one template batch
   restamped with its baseOffset and epoch, which lie outside the CRC), in
   segment files of up to ``--segment-mib``, with the leader-epoch-checkpoint,
   partition.metadata, meta.properties and the offset checkpoints a broker
   leaves. Segment files are written directly: much faster than producing.
2. Memory: reads one segment of 64 MiB and one of ``--segment-mib`` with the
   audit's reader (batch rows and segment summaries) in a fresh process each,
   and prints the peak RSS: it stays flat as segments grow.
3. Runs ``tide audit`` (every rule; no metrics or ack log, so the three rules
   that need them are skipped) on a quarter of the partitions and on all of
   them, on ``local[2]`` and on a standalone cluster of 2 workers with 1 core
   each (audit/standalone.py, as make spark-up), and prints wall seconds,
   batches/s, seconds per GiB and the peak RSS of the Spark processes (the JVMs
   and the Python workers, sampled every 0.25 s). Two sizes show whether the
   cost is linear. Each run starts its own driver, so it includes Spark's
   start-up and first-job warm-up, as for a user.

The dump is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tidewater.proto.records import encode_batch  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
BROKERS = (1, 2, 3)
TOPIC = "scale"
EPOCHS = 4  # leader epochs per partition, in equal runs of batches
RECORDS_PER_BATCH = 2
NOW_MS = 1_700_000_000_000
WRITE_CHUNK_BYTES = 16 * MIB


def template_batch(batch_bytes: int) -> bytes:
    value_bytes = max(1, (batch_bytes - 61) // RECORDS_PER_BATCH - 12)
    return encode_batch([(b"k%d" % i, bytes(value_bytes)) for i in range(RECORDS_PER_BATCH)],
                        base_offset=0, partition_leader_epoch=0, base_timestamp_ms=NOW_MS)


def _topic_id_text(partition_topic: str) -> str:
    raw = hashlib.blake2b(partition_topic.encode(), digest_size=16).digest()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _checkpoint(entries: list[str]) -> str:
    return "0\n" + f"{len(entries)}\n" + "".join(e + "\n" for e in entries)


def build(root: Path, size_bytes: int, partitions: int, segment_bytes: int,
          batch_bytes: int, first_partition: int = 0) -> dict:
    """Write partitions first_partition..partitions-1 of a dump of ``size_bytes`` in all
    (the offset checkpoints cover partitions 0..partitions-1); returns its shape."""
    template = template_batch(batch_bytes)
    size = len(template)
    per_partition = -(-size_bytes // (size * partitions * len(BROKERS)))  # batches
    per_segment = max(1, segment_bytes // size)
    per_chunk = max(1, WRITE_CHUNK_BYTES // size)
    chunk = bytearray(template * per_chunk)
    topic_id = _topic_id_text(TOPIC)
    for broker in BROKERS:
        data_dir = root / f"broker-{broker}"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "meta.properties").write_text(f"version=0\nbroker.id={broker}\n")
    for p in range(first_partition, partitions):
        dirs = [root / f"broker-{b}" / f"{TOPIC}-{p}" for b in BROKERS]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
            (d / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
        epoch_starts = []
        written = 0
        while written < per_partition:
            in_segment = min(per_segment, per_partition - written)
            name = f"{written * RECORDS_PER_BATCH:020d}.log"
            files = [open(d / name, "wb") for d in dirs]
            done = 0
            while done < in_segment:
                n = min(per_chunk, in_segment - done)
                for i in range(n):
                    index = written + done + i
                    epoch = index * EPOCHS // per_partition
                    if not epoch_starts or epoch_starts[-1][0] != epoch:
                        epoch_starts.append((epoch, index * RECORDS_PER_BATCH))
                    struct.pack_into(">q", chunk, i * size, index * RECORDS_PER_BATCH)
                    struct.pack_into(">i", chunk, i * size + 12, epoch)
                view = memoryview(chunk)[:n * size]
                for f in files:
                    f.write(view)
                view.release()
                done += n
            for f in files:
                f.close()
            written += in_segment
        for d in dirs:
            (d / "leader-epoch-checkpoint").write_text(
                _checkpoint([f"{e} {o}" for e, o in epoch_starts]))
    hw = per_partition * RECORDS_PER_BATCH
    for broker in BROKERS:
        data_dir = root / f"broker-{broker}"
        entries = [f"{TOPIC} {p} {hw}" for p in range(partitions)]
        (data_dir / "replication-offset-checkpoint").write_text(_checkpoint(entries))
        (data_dir / "recovery-point-offset-checkpoint").write_text(_checkpoint(entries))
        (data_dir / "log-start-offset-checkpoint").write_text(
            _checkpoint([f"{TOPIC} {p} 0" for p in range(partitions)]))
    total = sum(f.stat().st_size for f in root.glob("broker-*/*/*.log"))
    return {"batches": per_partition * partitions * len(BROKERS), "bytes": total,
            "segments": len(list(root.glob("broker-*/*/*.log"))), "batch_bytes": size,
            "replica_bytes": per_partition * size}


# ---------------------------------------------------------------- memory

_READ_ONE = """
import resource, sys, time
from tidewater.audit import reader
path, base = sys.argv[1], int(sys.argv[2])
size = __import__("os").path.getsize(path)
seg = reader.SegmentFile(1, "", "t", 0, path, base, size)
started = time.perf_counter()
rows = sum(len(chunk) for chunk in reader.scan_segment_file(path))
summary = reader.summarize_segment_file(seg)
print(rows, summary[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      time.perf_counter() - started)
"""


def reader_memory(root: Path, segment_bytes: int, batch_bytes: int) -> list[tuple]:
    """(segment MiB, batches, peak RSS MiB, seconds) reading one segment of each size."""
    out = []
    template = template_batch(batch_bytes)
    for size in sorted({64 * MIB, min(256 * MIB, segment_bytes), segment_bytes}):
        folder = root / "memory" / f"{TOPIC}-0"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{0:020d}.log"
        count = size // len(template)
        chunk = bytearray(template * min(count, WRITE_CHUNK_BYTES // len(template)))
        per_chunk = len(chunk) // len(template)
        with open(path, "wb") as f:
            done = 0
            while done < count:
                n = min(per_chunk, count - done)
                for i in range(n):
                    struct.pack_into(">q", chunk, i * len(template),
                                     (done + i) * RECORDS_PER_BATCH)
                f.write(memoryview(chunk)[:n * len(template)])
                done += n
        proc = subprocess.run([sys.executable, "-c", _READ_ONE, str(path), "0"],
                              capture_output=True, text=True, check=True)
        rows, batches, maxrss_kib, seconds = proc.stdout.split()
        assert int(rows) == int(batches) == count, proc.stdout
        out.append((path.stat().st_size / MIB, count, int(maxrss_kib) / 1024, float(seconds)))
        path.unlink()
    shutil.rmtree(root / "memory", ignore_errors=True)
    return out


# ---------------------------------------------------------------- audit runs


class ProcessSampler:
    """Peak RSS (MiB) of the JVMs and Python processes under some root pids, and their
    CPU seconds (user + system, each process's last sample, minus what it had used
    when sampling started: the cluster's long-lived master and worker JVMs)."""

    def __init__(self, roots: list[int], interval_s: float = 0.25):
        self.roots = roots
        self.interval_s = interval_s
        self.peak_total = self.peak_jvm = self.peak_python = 0.0
        self._cpu_first: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        return sum(last - self._cpu_first.get(pid, 0.0) for pid, last in self._cpu_last.items())

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        tick = os.sysconf("SC_CLK_TCK")
        first = True
        while not self._stop.is_set():
            parents, rss, kind, cpu = {}, {}, {}, {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        head, tail = f.read().rsplit(")", 1)
                    fields = tail.split()
                except OSError:
                    continue
                pid = int(entry)
                parents[pid] = int(fields[1])
                rss[pid] = int(fields[21]) * page / MIB
                kind[pid] = head.split("(", 1)[1]
                cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
            total = jvm = python = 0.0
            for pid in rss:
                p = pid
                while p in parents and p not in self.roots and p > 1:
                    p = parents[p]
                if p in self.roots:
                    if first:
                        self._cpu_first[pid] = cpu[pid]
                    self._cpu_last[pid] = cpu[pid]
                    total += rss[pid]
                    if kind[pid] == "java":
                        jvm = max(jvm, rss[pid])
                    elif kind[pid].startswith("python"):
                        python = max(python, rss[pid])
            self.peak_total = max(self.peak_total, total)
            self.peak_jvm = max(self.peak_jvm, jvm)
            self.peak_python = max(self.peak_python, python)
            first = False
            self._stop.wait(self.interval_s)


def run_audit(paths: list[Path], master: str, out: Path, extra_roots: list[int]) -> dict:
    tide = str(Path(sys.executable).with_name("tide"))
    cmd = [tide, "audit", *map(str, paths), "--out", str(out), "--master", master]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with ProcessSampler([proc.pid, *extra_roots]) as rss:
        output, _ = proc.communicate()
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"tide audit exited {proc.returncode}:\n{output[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    checked = next(r["checked"] for r in report["rules"] if r["name"] == "batch_crc_and_framing")
    return {"wall_s": wall_s, "elapsed_s": report["elapsed_s"], "batches": checked,
            "bytes": report["inputs"]["segment_bytes"], "rss": rss}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--segment-mib", type=int, default=1024)
    ap.add_argument("--batch-bytes", type=int, default=2048)
    ap.add_argument("--masters", default="local,cluster",
                    help="comma-separated: local (local[2]) and/or cluster (2 workers)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args(argv)

    root = args.dir or Path(tempfile.mkdtemp(prefix="tidewater-audit-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    from tidewater.audit import standalone

    state_dir = root / "spark-state"
    try:
        # A quarter of the partitions first (audited), then the rest: two sizes, one dump.
        size = int(args.size_gib * GIB)
        steps = [("1/4 of the partitions", max(1, args.partitions // 4)),
                 ("all partitions", args.partitions)]
        masters = {"local": "local[2]"}
        extra_roots: list[int] = []
        if "cluster" in args.masters:
            state = standalone.up(state_dir, standalone.free_port(), workers=2,
                                  worker_cores=1, worker_memory="2g")
            masters["cluster"] = state.master_url
            extra_roots = list(state.pids.values())
        if "local" not in args.masters:
            del masters["local"]
        memory = []
        rows = []
        build_s = 0.0
        built = 0
        shape: dict = {}
        for label, partitions in steps:
            started = time.perf_counter()
            part_size = size * partitions // args.partitions
            shape = build(root / "dump", part_size, partitions, args.segment_mib * MIB,
                          args.batch_bytes, first_partition=built)
            built = partitions
            build_s += time.perf_counter() - started
            print(f"built {shape['bytes'] / GIB:.2f} GiB: {shape['batches']:,} batches of "
                  f"{shape['batch_bytes']} B in {shape['segments']} segments",
                  file=sys.stderr, flush=True)
            data_dirs = sorted((root / "dump").glob("broker-*"))
            for name, master in masters.items():
                out = root / f"out-{name}-{partitions}"
                result = run_audit(data_dirs, master, out, extra_roots if name == "cluster"
                                   else [])
                assert result["batches"] == shape["batches"], (result, shape)
                rows.append((name, master, label, result))
                print(f"{master} {label}: {result['wall_s']:.1f} s", file=sys.stderr,
                      flush=True)
        standalone.down(state_dir)
        if not args.skip_memory:
            memory = reader_memory(root, args.segment_mib * MIB, args.batch_bytes)

        print()
        print(f"Audit at scale: {shape['bytes'] / GIB:.2f} GiB, {shape['batches']:,} batches "
              f"({shape['batch_bytes']} B, {RECORDS_PER_BATCH} records each), "
              f"{len(BROKERS)} brokers x {args.partitions} partitions of "
              f"{shape['replica_bytes'] / MIB:,.0f} MiB, {shape['segments']} segments "
              f"(at most {args.segment_mib} MiB each)")
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
              f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GIB:.0f} GiB RAM, "
              f"Python {platform.python_version()}, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"dump written in {build_s:.1f} s "
              f"({shape['bytes'] / MIB / max(build_s, 1e-9):,.0f} MiB/s)")
        if memory:
            print()
            print("| reader over one segment (fresh process) | batches | peak RSS MiB | s |")
            print("|---|---|---|---|")
            for mib, count, rss_mib, seconds in memory:
                print(f"| {mib:,.0f} MiB segment: batch rows, then summary | {count:,} | "
                      f"{rss_mib:,.0f} | {seconds:.1f} |")
        print()
        print("| master | input | GiB | batches | wall s | audit s | batches/s | s/GiB | CPU s | "
              "batches per CPU s | peak RSS MiB: all / largest JVM / largest Python |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for _name, master, label, r in rows:
            gib = r["bytes"] / GIB
            rss = r["rss"]
            print(f"| {master} | {label} | {gib:.2f} | {r['batches']:,} | {r['wall_s']:.1f} | "
                  f"{r['elapsed_s']:.1f} | {r['batches'] / r['elapsed_s']:,.0f} | "
                  f"{r['elapsed_s'] / gib:.2f} | {rss.cpu_s:.0f} | "
                  f"{r['batches'] / max(rss.cpu_s, 1e-9):,.0f} | "
                  f"{rss.peak_total:,.0f} / {rss.peak_jvm:,.0f} / "
                  f"{rss.peak_python:,.0f} |")
        print("wall s: the tide audit process from start to exit (JVM start included); "
              "audit s: report.json's elapsed_s (read, every rule, report), what batches/s "
              "and s/GiB use. CPU s: user + system time of the driver, executors and "
              "Python workers (sampled every 0.25 s).")
    finally:
        if state_dir.exists():
            standalone.down(state_dir)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
