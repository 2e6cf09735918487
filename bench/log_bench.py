"""Log storage benchmark: append, read and recovery-scan throughput against raw disk I/O.

Run:  .venv/bin/python bench/log_bench.py [--quick] [--dir DIR]

Cases (1 KiB incompressible records, no compression):
- append 16 KiB / 256 KiB batches: Log.append_as_leader, one batch per call, Kafka's
  default flush policy (fsync on roll and at the end). Reference: a plain os.write
  loop of the same batch bytes into files of the same segment size, fsynced at each
  "roll" and at the end.
- append 256 KiB, flush.messages=1: every append fsynced; reference os.write + fsync.
- read: Log.read sequentially in 1 MiB fetches; reference os.pread in 1 MiB chunks.
- recovery scan: Log.open without a clean shutdown (every batch CRC-checked, indexes
  rebuilt); reference os.pread of the same files in 8 MiB chunks.

Prints one table. Files are in the page cache for reads and the scan (as right after a
restart of the process, not the machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.storage.log import Log  # noqa: E402
from broker.storage.log_config import LogConfig  # noqa: E402
from proto.records import encode_batch  # noqa: E402

MIB = 1 << 20
RECORD_BYTES = 1024
SEGMENT_BYTES = 128 * MIB


def make_batch(batch_bytes: int) -> bytes:
    count = max(1, batch_bytes // (RECORD_BYTES + 16))
    records = [(None, os.urandom(RECORD_BYTES)) for _ in range(count)]
    return encode_batch(records, base_timestamp_ms=1_700_000_000_000)


def bench_append(directory: Path, batch: bytes, total_bytes: int,
                 flush_messages: int | None) -> tuple[float, int, Log]:
    config = LogConfig(segment_bytes=SEGMENT_BYTES, flush_messages=flush_messages)
    log = Log.open(directory, config, now_ms=0)
    appends = max(1, total_bytes // len(batch))
    start = time.perf_counter()
    for i in range(appends):
        log.append_as_leader(batch, leader_epoch=0, now_ms=i)
    log.flush()
    return time.perf_counter() - start, appends, log


def bench_raw_write(directory: Path, batch: bytes, appends: int, fsync_each: bool) -> float:
    directory.mkdir(parents=True, exist_ok=True)
    view = memoryview(batch)
    start = time.perf_counter()
    segment, size = 0, 0
    fd = os.open(directory / f"{segment:020d}.raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for _ in range(appends):
        if size and size + len(batch) > SEGMENT_BYTES:  # the log rolls here: same fsync
            os.fsync(fd)
            os.close(fd)
            segment, size = segment + 1, 0
            fd = os.open(directory / f"{segment:020d}.raw",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        written = os.write(fd, view)
        while written < len(view):
            written += os.write(fd, view[written:])
        size += len(batch)
        if fsync_each:
            os.fsync(fd)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def bench_read(log: Log) -> tuple[float, int, int]:
    start = time.perf_counter()
    offset, total, fetches = log.log_start_offset, 0, 0
    end = log.log_end_offset
    while offset < end:
        result = log.read(offset, MIB)
        total += len(result.records)
        offset = result.next_offset
        fetches += 1
    return time.perf_counter() - start, total, fetches


def bench_raw_read(directory: Path, suffix: str, chunk_bytes: int) -> tuple[float, int]:
    start = time.perf_counter()
    total = 0
    for path in sorted(directory.glob(f"*{suffix}")):
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while True:
                data = os.pread(fd, chunk_bytes, position)
                if not data:
                    break
                position += len(data)
        finally:
            os.close(fd)
        total += position
    return time.perf_counter() - start, total


def bench_recovery(directory: Path) -> tuple[float, int]:
    start = time.perf_counter()
    log = Log.open(directory, LogConfig(segment_bytes=SEGMENT_BYTES), now_ms=0,
                   recovery_point=0, had_clean_shutdown=False)
    elapsed = time.perf_counter() - start
    size = log.size_bytes
    log.close()
    return elapsed, size


def mb_per_s(size: int, seconds: float) -> float:
    return size / MIB / seconds if seconds > 0 else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (64 MiB per case)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    total_bytes = (64 if args.quick else 512) * MIB
    fsync_bytes = (8 if args.quick else 64) * MIB
    base = Path(tempfile.mkdtemp(prefix="log_bench-", dir=args.dir))
    rows = []
    try:
        for label, batch_bytes in (("16 KiB", 16 * 1024), ("256 KiB", 256 * 1024)):
            batch = make_batch(batch_bytes)
            log_dir = base / f"append{batch_bytes}-0"
            seconds, appends, log = bench_append(log_dir, batch, total_bytes, None)
            size = appends * len(batch)
            raw_seconds = bench_raw_write(base / f"raw{batch_bytes}", batch, appends, False)
            rows.append((f"append {label} batches", mb_per_s(size, seconds), appends / seconds,
                         mb_per_s(size, raw_seconds)))
            read_seconds, read_total, fetches = bench_read(log)
            assert read_total == size, (read_total, size)
            raw_read_seconds, raw_total = bench_raw_read(base / f"raw{batch_bytes}", ".raw", MIB)
            rows.append((f"read {label} batches, 1 MiB fetches", mb_per_s(read_total, read_seconds),
                         read_total / len(batch) / read_seconds,
                         mb_per_s(raw_total, raw_read_seconds)))
            log.close()
            scan_seconds, scan_size = bench_recovery(log_dir)
            raw_scan_seconds, raw_scan_total = bench_raw_read(log_dir, ".log", 8 * MIB)
            rows.append((f"recovery scan {label} batches", mb_per_s(scan_size, scan_seconds),
                         scan_size / len(batch) / scan_seconds,
                         mb_per_s(raw_scan_total, raw_scan_seconds)))
            shutil.rmtree(log_dir)
            shutil.rmtree(base / f"raw{batch_bytes}")
        batch = make_batch(256 * 1024)
        seconds, appends, log = bench_append(base / "fsync-0", batch, fsync_bytes, 1)
        log.close()
        raw_seconds = bench_raw_write(base / "rawfsync", batch, appends, True)
        size = appends * len(batch)
        rows.append(("append 256 KiB, flush.messages=1", mb_per_s(size, seconds),
                     appends / seconds, mb_per_s(size, raw_seconds)))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"log storage benchmark ({'quick' if args.quick else 'full'}: "
          f"{total_bytes // MIB} MiB per case, 1 KiB records, dir {base.parent})")
    header = f"{'case':<38} {'MB/s':>9} {'batches/s':>11} {'raw MB/s':>9} {'vs raw':>7}"
    print(header)
    print("-" * len(header))
    for case, rate, batches_per_s, raw_rate in rows:
        print(f"{case:<38} {rate:>9.0f} {batches_per_s:>11.0f} {raw_rate:>9.0f} "
              f"{rate / raw_rate:>6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
