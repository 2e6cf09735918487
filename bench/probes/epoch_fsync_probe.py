"""What a LeaderAndIsr of N new leader epochs costs in checkpoint writes, in turn or at once.

    .venv/bin/python bench/probes/epoch_fsync_probe.py --dir /tmp/epoch-fsync [--partitions 60]

Each partition becoming leader in a new epoch rewrites its leader-epoch-checkpoint with
``write_file_atomically`` (tmp, fsync, rename, fsync the directory) before anything is
served in that epoch. The broker does them one after another on its event loop; this
times the same writes, one per partition directory, in sequence against 8 threads at
once (the disk can join concurrent fsyncs), alternated ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from tidewater.broker.storage.checkpoints import write_file_atomically  # noqa: E402

THREADS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--partitions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, nargs="+", default=[THREADS],
                        help="thread counts to compare with in turn (default: the broker's)")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    paths = [args.dir / f"t-{i}-0" / "leader-epoch-checkpoint" for i in range(args.partitions)]
    for path in paths:
        path.parent.mkdir(parents=True)

    def write_all(epoch: int, threads: int) -> float:
        def write(path: Path) -> None:
            write_file_atomically(path, b"0\n1\n%d 378\n" % epoch)
        started = time.perf_counter()
        if threads == 1:
            for path in paths:
                write(path)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(write, paths))
        return time.perf_counter() - started

    try:
        for r in range(args.rounds):
            cells = [f"in turn {write_all(r * 100, 1) * 1000:.0f} ms"]
            for k, threads in enumerate(args.threads):
                took = write_all(r * 100 + k + 1, threads)
                cells.append(f"{threads} threads {took * 1000:.0f} ms")
            print(f"round {r + 1}: " + ", ".join(cells))
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
