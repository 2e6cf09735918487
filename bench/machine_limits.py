"""The machine's limits, measured in the same run for context: sequential disk
writes and loopback TCP throughput.

- ``disk_write``: append ``total_bytes`` to one new file in ``chunk_bytes``
  writes, like a log segment. ``fsync="none"`` leaves the bytes in the page
  cache (what Tidewater's brokers do by default: flush.messages / flush.ms
  unset, like Kafka; JetStream also syncs only every 2 minutes by default),
  ``"end"`` adds one fsync before the clock stops, ``"each"`` fsyncs after
  every chunk. The file is deleted afterwards.
- ``page_cache_growth``: writes ``total_bytes`` into files kept until the end, so every
  GiB needs memory the page cache did not hold, and times the part after the first
  ``skip_bytes``: past the pool of pages recently freed (and so still backed by the host).
  In a VM that hands freed memory back to its host (free page reporting), each new page
  then faults in the host on first touch, which the guest sees as system CPU; with the page
  cache filled first, the pages come from reclaimed cache instead. The machine's own floor
  for a broker writing new log, in the memory state the run has.
- ``python_import_s``: a fresh interpreter importing a module (the broker's
  start-up floor).
- ``loopback_tcp``: a receiver process reads into one reused buffer
  (``recv_into``) while this process ``sendall``s chunks to 127.0.0.1; the
  clock runs until the receiver has counted every byte.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_common import HOST, KIB, Throughput

FSYNC_MODES = ("none", "end", "each")

# What broker/__main__.py runs before it imports broker.process: kio kept from importing
# hypothesis, which a dev venv has (0.72 s against 0.27 s without, 2026-11-29).
BROKER_IMPORT_PRELUDE = ("import tidewater.broker.__main__ as main\n"
                         "main.import_kafka_types_without_hypothesis()")


def python_import_s(module: str, *, cwd: str | Path | None = None, before: str = "") -> float:
    """Seconds for a fresh interpreter to start, run ``before`` and import ``module`` (what
    every broker restart pays before it can load a single log)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"{before}\nimport {module}"], check=True, cwd=cwd,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def disk_write(directory: str | Path, total_bytes: int, *, chunk_bytes: int = 256 * KIB,
               fsync: str = "none") -> Throughput:
    if fsync not in FSYNC_MODES:
        raise ValueError(f"fsync must be one of {FSYNC_MODES}")
    if total_bytes <= 0 or chunk_bytes <= 0:
        raise ValueError("total_bytes and chunk_bytes must be positive")
    path = Path(directory) / f"disk-write-{os.getpid()}-{time.monotonic_ns()}.bin"
    chunk = os.urandom(chunk_bytes)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        start = time.perf_counter()
        while written < total_bytes:
            view = memoryview(chunk)[: min(chunk_bytes, total_bytes - written)]
            while view:
                n = os.write(fd, view)
                view = view[n:]
                written += n
            if fsync == "each":
                os.fsync(fd)
        if fsync == "end":
            os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return Throughput(records=written // chunk_bytes, payload_bytes=written, elapsed_s=elapsed)


def page_cache_growth(directory: str | Path, total_bytes: int, skip_bytes: int, *,
                      chunk_bytes: int = 256 * KIB) -> tuple[Throughput, float]:
    """The write rate of the bytes after ``skip_bytes``, and this process's system CPU
    seconds for them. The files are deleted afterwards."""
    if not 0 <= skip_bytes < total_bytes:
        raise ValueError("skip_bytes must be below total_bytes")
    chunk = os.urandom(chunk_bytes)
    file_bytes = 256 * 1024 * KIB  # several files, as a log's segments
    paths: list[Path] = []
    written = 0
    start = 0.0
    system_start = 0.0
    try:
        while written < total_bytes:
            path = Path(directory) / f"page-cache-growth-{os.getpid()}-{len(paths)}.bin"
            paths.append(path)
            with open(path, "xb", buffering=0) as f:
                in_file = 0
                while in_file < file_bytes and written < total_bytes:
                    if written == skip_bytes:
                        start, system_start = time.perf_counter(), os.times().system
                    f.write(chunk)
                    in_file += chunk_bytes
                    written += chunk_bytes
        elapsed = time.perf_counter() - start
        system_s = os.times().system - system_start
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    measured = written - skip_bytes
    return (Throughput(records=measured // chunk_bytes, payload_bytes=measured,
                       elapsed_s=elapsed), system_s)


def _receive(listener_fd_port: int, total_bytes: int, chunk_bytes: int, conn) -> None:
    with socket.create_connection((HOST, listener_fd_port)) as sock:
        buffer = bytearray(chunk_bytes)
        received = 0
        while received < total_bytes:
            n = sock.recv_into(buffer)
            if n == 0:
                break
            received += n
        conn.send(received)
        conn.close()


def loopback_tcp(total_bytes: int, *, chunk_bytes: int = 256 * KIB,
                 timeout_s: float = 60.0) -> Throughput:
    """Loopback TCP throughput between this process (sender) and a spawned receiver."""
    ctx = multiprocessing.get_context("spawn")  # never fork a process holding gRPC threads
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((HOST, 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        parent_end, child_end = ctx.Pipe()
        receiver = ctx.Process(target=_receive, args=(port, total_bytes, chunk_bytes, child_end),
                               daemon=True)
        receiver.start()
        try:
            listener.settimeout(timeout_s)
            sock, _ = listener.accept()
            chunk = os.urandom(chunk_bytes)
            with sock:
                start = time.perf_counter()
                sent = 0
                while sent < total_bytes:
                    part = chunk if total_bytes - sent >= chunk_bytes else chunk[: total_bytes - sent]
                    sock.sendall(part)
                    sent += len(part)
                if not parent_end.poll(timeout_s):
                    raise TimeoutError("loopback receiver did not finish")
                received = parent_end.recv()
                elapsed = time.perf_counter() - start
        finally:
            receiver.join(timeout=5)
            if receiver.is_alive():
                receiver.kill()
                receiver.join(timeout=5)
    if received != total_bytes:
        raise RuntimeError(f"loopback receiver got {received} of {total_bytes} bytes")
    return Throughput(records=total_bytes // chunk_bytes, payload_bytes=total_bytes, elapsed_s=elapsed)
