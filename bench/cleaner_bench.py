"""Log cleaner benchmark: what one compaction of a log costs, against reading its files.

Run:  .venv/bin/python bench/cleaner_bench.py [--quick] [--keys N] [--dir DIR]

A compacted log of 100-byte values, 10 records per batch (uncompressed), keys drawn
uniformly from ``--keys``, 1 MiB segments, is written with ``Log.append_as_leader``,
then cleaned by ``LogCleaner.clean_logs`` (no I/O limit) twice: the first pass over
everything, the second after as many new records again (the first pass's output
is the clean section). Reference: ``os.pread`` of the same files in 1 MiB chunks
(what reading them costs with no decoding at all). Files are in the page cache.
Columns: MB of segment files read per second of wall clock and of this process's CPU,
records read per second, and what the pass kept.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_common import format_table
from tidewater.broker.storage.cleaner import LogCleaner
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

TP = TopicPartition("bench", 0)
CONFIG = LogConfig.from_configs({"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                 "min.cleanable.dirty.ratio": "0"})


def fill(log: Log, records: int, keys: int, rng: random.Random) -> None:
    for _ in range(records // 10):
        batch = [(b"key-%08d" % rng.randrange(keys), rng.randbytes(100)) for _i in range(10)]
        log.append_as_leader(encode_batch(batch, base_timestamp_ms=1000), 0, now_ms=1000)
    log.roll(1000)
    log.flush()


def read_files(log: Log) -> tuple[int, float]:
    """(bytes, seconds) to pread every segment file in 1 MiB chunks."""
    total, start = 0, time.perf_counter()
    for segment in log.segments():
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            position = 0
            while chunk := os.pread(fd, 1 << 20, position):
                position += len(chunk)
        finally:
            os.close(fd)
        total += position
    return total, time.perf_counter() - start


def timed_clean(cleaner: LogCleaner, log: Log) -> tuple[list, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    results = cleaner.clean_logs({TP: log}, {TP: log.log_end_offset}, 10_000)
    return results, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 records instead of 200,000")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    records = 20_000 if args.quick else 200_000
    root = Path(tempfile.mkdtemp(prefix="cleaner-bench-", dir=args.dir))
    rng = random.Random(1)
    rows = []
    try:
        log = Log.open(root / "bench-0", CONFIG, now_ms=0)
        cleaner = LogCleaner(root)
        for name in ("first pass", "second pass"):
            fill(log, records, args.keys, rng)
            size, read_s = read_files(log)
            [result], wall_s, cpu_s = timed_clean(cleaner, log)
            mb = result.bytes_read / 1e6
            rows.append((name, f"{size / 1e6:.1f}", f"{mb / wall_s:.1f}", f"{mb / cpu_s:.1f}",
                         f"{result.filter.records_read / wall_s:,.0f}",
                         f"{result.filter.records_kept:,}", f"{size / 1e6 / read_s:,.0f}"))
        log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"log cleaner: {records:,} records per pass, {args.keys:,} keys, 100-byte values")
    print(format_table(("pass", "log MB", "MB/s", "MB/cpu-s", "records/s", "kept",
                        "pread MB/s"), rows,
                       align_right=(False, True, True, True, True, True, True)))


if __name__ == "__main__":
    main()
