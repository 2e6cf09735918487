"""Benchmark: the audit's batch-level rules over a dump of at least 1 GiB, on local[2].

    .venv/bin/python bench/audit_bench.py [--size-gib 1.0] [--batch-bytes 2048]
        [--records-per-batch 2] [--master local[2]] [--dir DIR] [--keep] [--runs 2]

Builds the dump with the project's own log writer (broker/storage Log,
``append_as_follower`` of pre-encoded batches: few, large records per batch),
then times, each in its own Spark job:

- ``reader`` : the audit's own reader alone, in this process, over every segment
  (no Spark): the per-core ceiling, for batch rows (what ``scan`` hands Spark)
  and for segment summaries (what the batch-level rules hand Spark);
- ``scan``   : tidewater-log read into Spark (Arrow batches) and counted;
- ``rules``  : the batch-level rules (batch_crc_and_framing, offsets_contiguous,
  epochs_monotonic) end to end: read, CRC every batch, check order within and
  across segments, count the violations. The reader decides them per segment
  (tidewater-log level ``segment``), so Spark gets one row per segment.
- ``all rules``: every rule of the full job over the same dump (no metrics or
  ack log given, so the three rules that need them are skipped), as ``tide
  audit`` runs them (batch rows not cached: replicas_agree_below_hw is the one
  rule that reads them, once), and with the batch rows cached in Spark's memory
  first (what the job did before; kept to show the cache does not pay).

Spark is warmed up first on a small dump (the first job of a session pays for
JIT compilation and Python worker start-up), and each stage runs ``--runs``
times (default 2) with the last run shown (the first run of a query shape on
1 GiB still pays for compiling its hot loops), so the table shows steady-state
throughput. Prints a table of batches/s, records/s and MiB/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

GIB = 1 << 30
MIB = 1 << 20
NOW_MS = 1_700_000_000_000
BROKERS = (1, 2, 3)
PARTITIONS = 4
APPEND_BYTES = 1 * MIB  # batches handed to one append_as_follower call


def build(root: Path, size_bytes: int, batch_bytes: int, records_per_batch: int) -> dict:
    value_bytes = max(1, (batch_bytes - 61) // records_per_batch - 12)
    template = bytearray(encode_batch([(b"k%d" % i, bytes(value_bytes))
                                       for i in range(records_per_batch)],
                                      base_offset=0, partition_leader_epoch=0,
                                      base_timestamp_ms=NOW_MS))
    size = len(template)
    replicas = len(BROKERS) * PARTITIONS
    per_replica_batches = -(-size_bytes // (size * replicas))
    per_append = max(1, APPEND_BYTES // size)
    config = LogConfig(segment_bytes=128 * MIB)
    for broker in BROKERS:
        manager = LogManager(root / f"broker-{broker}", config)
        manager.load(NOW_MS)
        hws = {}
        for p in range(PARTITIONS):
            tp = TopicPartition("bench", p)
            log = manager.get_or_create(tp, config, NOW_MS)
            written = 0
            chunk = bytearray(size * per_append)
            while written < per_replica_batches:
                n = min(per_append, per_replica_batches - written)
                for i in range(n):
                    # baseOffset and epoch lie outside the CRC: restamp a copy of one batch.
                    chunk[i * size:(i + 1) * size] = template
                    struct.pack_into(">q", chunk, i * size, (written + i) * records_per_batch)
                    struct.pack_into(">i", chunk, i * size + 12, (written + i) * 4 // per_replica_batches)
                log.append_as_follower(bytes(chunk[:n * size]), NOW_MS)
                written += n
            hws[tp] = log.log_end_offset
        manager.checkpoint_high_watermarks(hws)
        manager.shutdown()
    batches = per_replica_batches * replicas
    return {"batches": batches, "records": batches * records_per_batch,
            "bytes": sum(f.stat().st_size for f in root.glob("broker-*/*/*.log"))}


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and every descendant, dead ones included.

    Spark runs in a child JVM with Python workers below it; on a shared, busy
    machine their CPU time says more about the audit's cost than the wall clock.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        # utime stime cutime cstime: reaped children count in their parent
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    me = os.getpid()
    total = 0.0
    for pid in times:
        p = pid
        while p in parents and p != me and p > 1:
            p = parents[p]
        if p == me:
            total += times[pid]
    return total


def time_reader(root: Path, summaries: bool = False) -> float:
    """Seconds to read every segment into batch rows (or segment summaries), no Spark."""
    from tidewater.audit import reader

    started = time.perf_counter()
    count = 0
    for segment in reader.discover([root]).segments:
        if summaries:
            count += reader.summarize_segment_file(segment)[1]
        else:
            for rows in reader.scan_segment_file(segment.path):
                count += len(rows)
    return time.perf_counter() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--batch-bytes", type=int, default=2048)
    ap.add_argument("--records-per-batch", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", type=Path, default=None, help="where to build (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the dump afterwards")
    ap.add_argument("--runs", type=int, default=2,
                    help="runs of each stage; the table shows the last (default 2)")
    args = ap.parse_args(argv)

    root = args.dir or Path(tempfile.mkdtemp(prefix="tidewater-audit-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        shape = build(root, int(args.size_gib * GIB), args.batch_bytes, args.records_per_batch)
        build_s = time.perf_counter() - started
        print(f"built {shape['bytes'] / GIB:.2f} GiB, {shape['batches']:,} batches in "
              f"{build_s:.1f} s under {root}", file=sys.stderr)

        from tidewater.audit import rules
        from tidewater.audit.job import load_inputs
        from tidewater.audit.session import local_session

        spark = local_session(args.master)
        timings = []

        def measure(label: str, run) -> None:
            """Run ``run`` --runs times; keep the last (earlier runs warm the JIT up)."""
            for _ in range(args.runs):
                started, cpu = time.perf_counter(), tree_cpu_seconds()
                run()
                seconds, cpu_s = time.perf_counter() - started, tree_cpu_seconds() - cpu
            timings.append((label, seconds, cpu_s))

        for summaries, label in ((False, "batch rows"), (True, "segment summaries")):
            measure(f"reader, {label} (1 process, no Spark)",
                    lambda summaries=summaries: time_reader(root, summaries))

        from pyspark.sql import functions as F

        # Warm up on a small dump: the first Spark job pays for the JVM's JIT and the
        # Python workers' start (a minute on a busy 2-core machine); measure steady state.
        warm_root = root.with_name(root.name + "-warm-up")
        build(warm_root, 8 * MIB, args.batch_bytes, args.records_per_batch)
        started = time.perf_counter()
        for cache, chosen in ((False, rules.BATCH_LEVEL_RULES), (True, rules.RULES)):
            warm_inputs, _inv = load_inputs(spark, [str(warm_root)], [], [],
                                            cache_batches=cache)
            rules.run_rules(warm_inputs, chosen)
            spark.catalog.clearCache()
        warm_s = time.perf_counter() - started
        spark.catalog.clearCache()
        shutil.rmtree(warm_root, ignore_errors=True)

        def scan() -> None:
            scanned = (spark.read.format("tidewater-log").load(str(root))
                       .agg(F.count("*"), F.sum("record_count")).first())
            assert scanned[0] == shape["batches"] and scanned[1] == shape["records"], scanned

        measure(f"scan into Spark ({args.master})", scan)

        def audit(chosen, cache: bool) -> None:
            inputs, _inventory = load_inputs(spark, [str(root)], [], [], cache_batches=cache)
            results = rules.run_rules(inputs, chosen)
            failed = [r.name for r in results.rules if not r.passed]
            assert not failed, failed
            assert results.derived.total_batches == shape["batches"]
            spark.catalog.clearCache()

        for chosen, cache, label in (
                (rules.BATCH_LEVEL_RULES, False, "batch-level rules"),
                (rules.RULES, False, "all rules, as in the full job"),
                (rules.RULES, True, "all rules, batch rows cached first")):
            measure(f"{label} ({args.master})",
                    lambda chosen=chosen, cache=cache: audit(chosen, cache))
        spark.stop()

        print()
        print(f"Audit benchmark: {shape['bytes'] / GIB:.2f} GiB, {shape['batches']:,} batches, "
              f"{shape['records']:,} records ({args.batch_bytes} B batches, "
              f"{args.records_per_batch} records each), {len(BROKERS)} brokers x "
              f"{PARTITIONS} partitions")
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {platform.system()}")
        print(f"(first Spark run, warm-up on 8 MiB, not in the table: {warm_s:.1f} s; "
              f"each stage run {args.runs} times, the last shown)")
        print()
        print("| stage | wall s | batches/s | records/s | MiB/s | CPU s | batches per CPU s |")
        print("|---|---|---|---|---|---|---|")
        for name, seconds, cpu_s in timings:
            print(f"| {name} | {seconds:.2f} | {shape['batches'] / seconds:,.0f} | "
                  f"{shape['records'] / seconds:,.0f} | {shape['bytes'] / MIB / seconds:,.0f} | "
                  f"{cpu_s:.1f} | {shape['batches'] / max(cpu_s, 1e-9):,.0f} |")
        print("CPU s: user + system time of this process, the Spark JVM and its Python "
              "workers; on an idle machine wall time approaches CPU s / cores.")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
