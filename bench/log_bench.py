"""Log storage benchmark: append, read and recovery-scan throughput against raw disk I/O.

Run:  .venv/bin/python bench/log_bench.py [--quick] [--repeat N] [--dir DIR]
      .venv/bin/python bench/log_bench.py --per-record [--repeat N]
      .venv/bin/python bench/log_bench.py --stall [--stall-gib G] [--seconds S]
                                          [--stall-segment-kib K]

Cases (1 KiB incompressible records, no compression):
- append 16 KiB / 256 KiB batches: Log.append_as_leader, one batch per call, Kafka's
  default flush policy (fsync on roll and at the end). Reference: a plain os.write
  loop of the same batch bytes into files of the same segment size, fsynced at each
  "roll" and at the end.
- append 256 KiB, flush.messages=1: every append fsynced; reference os.write + fsync.
- read: Log.read sequentially in 1 MiB fetches; reference os.pread in 1 MiB chunks of
  the same files.
- recovery scan: Log.open without a clean shutdown (every batch CRC-checked, indexes
  rebuilt and written); reference os.pread of the same files in 8 MiB chunks.
- scrub: one pass of the background scrub (``broker/storage/scrub.py``) over the
  closed segments with the rate unbounded: what checking a MB costs (the broker
  runs it at ``log.scrub.bytes.per.second``); reference os.pread of the same files
  in 1 MiB chunks (the scrub's read size).

Reads check every batch they return (framing, offsets, CRC-32C): the read rows
include that check; ``--per-record``'s fetch read too.

``--per-record``: CPU microseconds of one leader append, one fetch read (1 MiB max,
from where the previous read ended) and one follower append of a 1 KiB single-record
batch: the broker's storage work per record at one record per request. Best of
``--repeat`` runs (default 5): on a shared machine noise only ever adds.

``--stall``: the recovery-point checkpoint against appends while GiBs are written
back. ``dd`` writes ``--stall-gib`` GiB (page cache, then the disk) while this
process appends 1 KiB records at 1,000/s to one log and a thread runs the HW and
recovery-point checkpoints every 0.5 s (the broker's every 1 s and 30 s, sped up).
Shows the append latency and how long the checkpoint held the log's lock (which
appends on the broker's event loop wait for): the part the storage code controls;
the rest of a slow append is the kernel (journal, dirty-page throttling) or CPU.
``--stall-segment-kib`` makes the log's segments that small so appends roll (a 256
KiB segment rolls about every 0.25 s at 1,000 records/s); the appends that rolled
are then reported on their own: a roll runs inside the append, under the lock.

The log and its reference run interleaved (rounds of ~4 MiB, or one fetch each), so
both see the same machine load; with --repeat each cell is the best of the runs.
Each case is measured by wall clock and by this process's CPU time.
Files are in the page cache for reads and the scan (as after a process restart).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.scrub import SCRUB_CHUNK_BYTES, LogScrubber
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

MIB = 1 << 20
RECORD_BYTES = 1024
SEGMENT_BYTES = 128 * MIB
ROUND_BYTES = 4 * MIB


class Clock:
    """Wall time and this process's CPU time (user + system), summed over intervals.

    On a shared machine wall time mostly measures the wait for a core; CPU time
    measures what the code costs. The table shows both.
    """

    def __init__(self):
        self.wall = self.cpu = 0.0
        self._wall = self._cpu = 0.0

    def __enter__(self):
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu


def make_batch(batch_bytes: int) -> bytes:
    count = max(1, batch_bytes // (RECORD_BYTES + 16))
    records = [(None, os.urandom(RECORD_BYTES)) for _ in range(count)]
    return encode_batch(records, base_timestamp_ms=1_700_000_000_000)


class RawWriter:
    """os.write of the same bytes, with the log's file layout and fsync points."""

    def __init__(self, directory: Path, fsync_each: bool):
        directory.mkdir(parents=True)
        self.directory, self.fsync_each = directory, fsync_each
        self.segment, self.size = 0, 0
        self.fd = self._open()

    def _open(self) -> int:
        return os.open(self.directory / f"{self.segment:020d}.raw",
                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, data: bytes) -> None:
        if self.size and self.size + len(data) > SEGMENT_BYTES:  # the log rolls here
            os.fsync(self.fd)
            os.close(self.fd)
            self.segment, self.size = self.segment + 1, 0
            self.fd = self._open()
        view = memoryview(data)
        written = os.write(self.fd, view)
        while written < len(view):
            written += os.write(self.fd, view[written:])
        self.size += len(data)
        if self.fsync_each:
            os.fsync(self.fd)

    def finish(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


def bench_append(base: Path, name: str, batch: bytes, total_bytes: int,
                 flush_messages: int | None) -> tuple[Clock, Clock, int, Log, Path]:
    log_dir = base / f"{name}-0"
    log = Log.open(log_dir, LogConfig(segment_bytes=SEGMENT_BYTES, flush_messages=flush_messages),
                   now_ms=0)
    raw = RawWriter(base / f"{name}-raw", fsync_each=flush_messages == 1)
    appends = max(1, total_bytes // len(batch))
    per_round = max(1, ROUND_BYTES // len(batch))
    log_clock, raw_clock = Clock(), Clock()
    done = 0
    while done < appends:
        n = min(per_round, appends - done)
        with log_clock:
            for i in range(done, done + n):
                log.append_as_leader(batch, leader_epoch=0, now_ms=i)
        with raw_clock:
            for _ in range(n):
                raw.write(batch)
        done += n
    with log_clock:
        log.flush()
    with raw_clock:
        raw.finish()
    return log_clock, raw_clock, appends, log, base / f"{name}-raw"


def bench_read(log: Log, raw_dir: Path) -> tuple[Clock, Clock, int]:
    raw_fds = [os.open(p, os.O_RDONLY) for p in sorted(raw_dir.glob("*.raw"))]
    raw_index, raw_position = 0, 0
    log_clock, raw_clock = Clock(), Clock()
    offset, total = log.log_start_offset, 0
    end = log.log_end_offset
    try:
        while offset < end or raw_index < len(raw_fds):
            if offset < end:
                with log_clock:
                    result = log.read(offset, MIB)
                total += len(result.records)
                offset = result.next_offset
            if raw_index < len(raw_fds):
                with raw_clock:
                    data = os.pread(raw_fds[raw_index], MIB, raw_position)
                raw_position += len(data)
                if len(data) < MIB:
                    raw_index, raw_position = raw_index + 1, 0
    finally:
        for fd in raw_fds:
            os.close(fd)
    return log_clock, raw_clock, total


def read_files(directory: Path, suffix: str, chunk_bytes: int) -> int:
    """The raw reference of a scan: read every file into one reused buffer."""
    buffer = memoryview(bytearray(chunk_bytes))
    total = 0
    for path in sorted(directory.glob(f"*{suffix}")):
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while n := os.preadv(fd, [buffer], position):
                position += n
        finally:
            os.close(fd)
        total += position
    return total


def bench_recovery(log_dir: Path) -> tuple[Clock, Clock, int]:
    scan_clock, raw_clock = Clock(), Clock()
    with scan_clock:
        log = Log.open(log_dir, LogConfig(segment_bytes=SEGMENT_BYTES), now_ms=0,
                       recovery_point=0, had_clean_shutdown=False)
    size = log.size_bytes
    log.close()
    with raw_clock:
        read_files(log_dir, ".log", 8 * MIB)
    return scan_clock, raw_clock, size


def bench_scrub(log_dir: Path) -> tuple[Clock, Clock, int]:
    """One scrub pass over the closed segments (rate unbounded) against reading them."""
    log = Log.open(log_dir, LogConfig(segment_bytes=SEGMENT_BYTES), now_ms=0,
                   had_clean_shutdown=True)
    log.roll(now_ms=0)  # every byte in a closed segment: the scrub's to check
    closed = log.segments()[:-1]
    size = sum(s.size_bytes for s in closed)
    found: list = []
    scrubber = LogScrubber(lambda: {TopicPartition("bench", 0): log},
                           lambda tp, batch: found.append(batch), bytes_per_second=1 << 50,
                           interval_ms=3_600_000, now_ms=0)
    scrub_clock, raw_clock = Clock(), Clock()
    with scrub_clock:
        now = 0
        while scrubber.schedule.passes_done == 0:
            now += scrubber.step(now)
    scrubber.close()
    assert not found and scrubber.schedule.bytes_verified == size, found
    buffer = memoryview(bytearray(SCRUB_CHUNK_BYTES))
    with raw_clock:
        for segment in closed:
            fd = os.open(segment.log_path, os.O_RDONLY)
            try:
                position = 0
                while n := os.preadv(fd, [buffer], position):
                    position += n
            finally:
                os.close(fd)
    log.close()
    return scrub_clock, raw_clock, size


def mb_per_s(size: int, seconds: float) -> float:
    return size / MIB / seconds if seconds > 0 else float("inf")


def row(case: str, size: int, batch_size: int, log_clock: Clock, raw_clock: Clock) -> tuple:
    """(case, wall MB/s, batches/s, raw wall MB/s, CPU MB/s, raw CPU MB/s)"""
    return (case, mb_per_s(size, log_clock.wall), size / batch_size / log_clock.wall,
            mb_per_s(size, raw_clock.wall), mb_per_s(size, log_clock.cpu),
            mb_per_s(size, raw_clock.cpu))


def run_once(base: Path, total_bytes: int, fsync_bytes: int) -> list[tuple]:
    rows = []
    for label, batch_bytes in (("16 KiB", 16 * 1024), ("256 KiB", 256 * 1024)):
        batch = make_batch(batch_bytes)
        name = f"append{batch_bytes}"
        log_clock, raw_clock, appends, log, raw_dir = bench_append(base, name, batch, total_bytes,
                                                                   None)
        size = appends * len(batch)
        rows.append(row(f"append {label} batches", size, len(batch), log_clock, raw_clock))
        log_clock, raw_clock, read_total = bench_read(log, raw_dir)
        assert read_total == size, (read_total, size)
        rows.append(row(f"read {label} batches, 1 MiB fetches", size, len(batch), log_clock,
                        raw_clock))
        log.close()
        scan_clock, raw_clock, scan_size = bench_recovery(log.dir)
        rows.append(row(f"recovery scan {label} batches", scan_size, len(batch), scan_clock,
                        raw_clock))
        scrub_clock, raw_clock, scrub_size = bench_scrub(log.dir)
        rows.append(row(f"scrub {label} batches", scrub_size, len(batch), scrub_clock,
                        raw_clock))
        shutil.rmtree(log.dir)
        shutil.rmtree(raw_dir)
    batch = make_batch(256 * 1024)
    log_clock, raw_clock, appends, log, raw_dir = bench_append(base, "fsync", batch, fsync_bytes, 1)
    log.close()
    rows.append(row("append 256 KiB, flush.messages=1", appends * len(batch), len(batch),
                    log_clock, raw_clock))
    shutil.rmtree(log.dir)
    shutil.rmtree(raw_dir)
    return rows


def per_record(base: Path, records: int) -> tuple[float, float, float]:
    """CPU us of (leader append, fetch read, follower append), one 1 KiB record each."""
    batch = make_batch(RECORD_BYTES)
    leader = Log.open(base / "leader-0", LogConfig(), now_ms=0)
    follower = Log.open(base / "follower-0", LogConfig(), now_ms=0)
    append_s = read_s = follower_s = 0.0
    clock = time.process_time
    fetch_offset = 0
    try:
        for i in range(records):
            t0 = clock()
            leader.append_as_leader(batch, 3, i)
            t1 = clock()
            fetched = leader.read(fetch_offset, MIB)
            t2 = clock()
            follower.append_as_follower(fetched.records, i)
            t3 = clock()
            fetch_offset = fetched.next_offset
            append_s, read_s, follower_s = append_s + t1 - t0, read_s + t2 - t1, follower_s + t3 - t2
        assert follower.log_end_offset == records
    finally:
        leader.close()
        follower.close()
        shutil.rmtree(base / "leader-0")
        shutil.rmtree(base / "follower-0")
    return append_s / records * 1e6, read_s / records * 1e6, follower_s / records * 1e6


class TimedLock:
    """Stands in for a Log's RLock: how long threads other than main held it."""

    def __init__(self):
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self.holds: list[float] = []

    def __enter__(self):
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._since = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0 and threading.current_thread() is not threading.main_thread():
            self.holds.append(time.perf_counter() - self._since)
        self._lock.release()

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        self._lock.release()


def stall(base: Path, dirty_gib: float, seconds: float, segment_kib: int | None) -> str:
    config = LogConfig() if segment_kib is None else LogConfig(segment_bytes=segment_kib * 1024)
    manager = LogManager(base / "data", config)
    manager.load(now_ms=0)
    tp = TopicPartition("hot", 0)
    hot = manager.get_or_create(tp, config, now_ms=0)
    hot._lock = TimedLock()  # measuring who holds it
    batch = make_batch(RECORD_BYTES)
    writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={base / 'dirty'}", "bs=1M",
                               f"count={int(dirty_gib * 1024)}"], stderr=subprocess.DEVNULL)
    checkpoints: list[float] = []
    stop = threading.Event()

    def checkpoint_loop():
        while not stop.wait(0.5):
            started = time.perf_counter()
            manager.checkpoint_high_watermarks({tp: hot.log_end_offset})
            manager.checkpoint_recovery_points()
            checkpoints.append(time.perf_counter() - started)

    thread = threading.Thread(target=checkpoint_loop, daemon=True)
    thread.start()
    appends: list[float] = []
    rolls: list[float] = []  # the appends that rolled the active segment
    start = time.perf_counter()
    try:
        i = 0
        while time.perf_counter() - start < seconds:
            wait = start + i / 1000 - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            active = hot.active_segment
            t = time.perf_counter()
            hot.append_as_leader(batch, 0, i)
            appends.append(time.perf_counter() - t)
            if hot.active_segment is not active:
                rolls.append(appends[-1])
            i += 1
    finally:
        stop.set()
        thread.join()
        writer.kill()
        writer.wait()
        manager.shutdown()
    appends.sort()
    rolls.sort()
    holds = hot._lock.holds or [0.0]

    def ms(q: float) -> float:
        return appends[min(len(appends) - 1, int(q * len(appends)))] * 1e3

    return (f"{len(appends)} appends at 1,000/s with {dirty_gib:g} GiB written alongside: "
            f"append ms p50 {ms(0.5):.3f} p99 {ms(0.99):.2f} p99.9 {ms(0.999):.2f} "
            f"max {appends[-1] * 1e3:.1f}\n"
            f"{len(checkpoints)} checkpoints: median {statistics.median(checkpoints or [0]) * 1e3:.0f}"
            f" ms, max {max(checkpoints or [0]) * 1e3:.0f} ms; the log's lock held by other threads "
            f"{len(holds)} times, median {statistics.median(holds) * 1e3:.3f} ms, "
            f"max {max(holds) * 1e3:.2f} ms"
            + (f"\n{len(rolls)} appends rolled ({segment_kib} KiB segments): ms median "
               f"{statistics.median(rolls) * 1e3:.3f} p90 {rolls[int(0.9 * len(rolls))] * 1e3:.2f}"
               f" max {rolls[-1] * 1e3:.1f}" if rolls else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (64 MiB per case, once)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs; each cell shows the best (default 3, 1 with --quick)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--per-record", action="store_true",
                        help="CPU us per 1 KiB single-record append / read / follower append")
    parser.add_argument("--stall", action="store_true",
                        help="appends while a checkpoint runs and GiBs are written back")
    parser.add_argument("--stall-gib", type=float, default=3.0, help="GiB written by dd (--stall)")
    parser.add_argument("--seconds", type=float, default=15.0, help="append time (--stall)")
    parser.add_argument("--stall-segment-kib", type=int, default=None,
                        help="segment.bytes in KiB, so appends roll (--stall; default 1 GiB)")
    args = parser.parse_args()
    if args.per_record or args.stall:
        base = Path(tempfile.mkdtemp(prefix="log_bench-", dir=args.dir))
        load_before = os.getloadavg()[0]
        try:
            if args.stall:
                print(stall(base, args.stall_gib, args.seconds, args.stall_segment_kib))
            else:
                runs = [per_record(base, 20_000) for _ in range(args.repeat or 5)]
                best = [min(run[k] for run in runs) for k in range(3)]
                print(f"CPU us per 1 KiB record, best of {len(runs)} x 20,000: leader append "
                      f"{best[0]:.2f}, fetch read {best[1]:.2f}, follower append {best[2]:.2f}")
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
        return 0
    total_bytes = (64 if args.quick else 512) * MIB
    fsync_bytes = (8 if args.quick else 64) * MIB
    repeat = args.repeat or (1 if args.quick else 3)
    base = Path(tempfile.mkdtemp(prefix="log_bench-", dir=args.dir))
    best: list[list] = []
    load_before = os.getloadavg()[0]
    try:
        for _ in range(repeat):
            for i, new_row in enumerate(run_once(base, total_bytes, fsync_bytes)):
                if i == len(best):
                    best.append(list(new_row))
                else:  # best of the runs, column by column (noise only ever slows)
                    best[i] = [new_row[0], *(max(a, b) for a, b in zip(best[i][1:], new_row[1:],
                                                                       strict=True))]
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"log storage benchmark ({'quick' if args.quick else 'full'}: "
          f"{total_bytes // MIB} MiB per case, 1 KiB records, best of {repeat}, "
          f"dir {base.parent}, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f})")
    header = (f"{'case':<34} {'MB/s':>7} {'batches/s':>9} {'raw MB/s':>8} {'vs raw':>6}"
              f" | {'CPU MB/s':>8} {'raw CPU':>8} {'vs raw':>6}")
    print(header)
    print("-" * len(header))
    for case, rate, batches_per_s, raw_rate, cpu_rate, raw_cpu_rate in best:
        print(f"{case:<34} {rate:>7.0f} {batches_per_s:>9.0f} {raw_rate:>8.0f} "
              f"{rate / raw_rate:>6.0%} | {cpu_rate:>8.0f} {raw_cpu_rate:>8.0f} "
              f"{cpu_rate / raw_cpu_rate:>6.0%}")
    print("MB/s: wall clock. CPU MB/s: bytes per second of this process's CPU time "
          "(user + system); on a busy machine the wall numbers mostly measure waiting.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
