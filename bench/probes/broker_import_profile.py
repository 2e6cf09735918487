"""Where a broker's start-up imports go: the interpreter, the libraries every broker
needs (asyncio, ssl, uvloop, grpc, the generated protobuf), and Tidewater's own modules,
with the share spent making dataclasses (Python 3.11's decorator compiles each generated
method on its own: ``__init__``, ``__repr__``, ``__eq__``, frozen ``__setattr__`` ...).

Each row is a fresh interpreter started from this venv, imports as the broker does
(``broker/__main__.py``: gc off, kio kept from importing hypothesis); medians of
``--rounds``. The last table: Tidewater's modules by their own import time
(``-X importtime``), grouped by package.

    .venv/bin/python bench/probes/broker_import_profile.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT_DIR))

from bench.machine_limits import BROKER_IMPORT_PRELUDE  # noqa: E402

INTERPRETER = "pass"
LIBRARIES = ("import asyncio, ssl, logging, uvloop, grpc, grpc.aio\n"
             "from tidewater.proto import tidewater_pb2, tidewater_pb2_grpc")
# As broker/__main__.py imports broker.process: gc off, kio without hypothesis.
BROKER_PLAIN = f"""
import gc
gc.disable()
{BROKER_IMPORT_PRELUDE}
import tidewater.broker.process
"""
# The same with the dataclass decorator timed: prints how many classes, and seconds.
BROKER = """
import dataclasses, time
made = [0, 0.0]
_process_class = dataclasses._process_class
def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
        return _process_class(*args, **kwargs)
    finally:
        made[0] += 1
        made[1] += time.perf_counter() - started
dataclasses._process_class = timed
""" + BROKER_PLAIN + "print(made[0], made[1])\n"


def run(code: str, *flags: str) -> tuple[float, str, str]:
    """CPU seconds (user + system) of a fresh interpreter running ``code``; its output."""
    before = os.times()
    done = subprocess.run([sys.executable, *flags, "-c", code], check=True, cwd=PROJECT_DIR,
                          capture_output=True, text=True, timeout=120)
    after = os.times()
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return cpu, done.stdout, done.stderr


def own_modules_by_package() -> Counter[str]:
    """Self import time in seconds of Tidewater's modules, by package (``-X importtime``)."""
    _, _, trace = run(BROKER_PLAIN, "-X", "importtime")
    by_package: Counter[str] = Counter()
    for line in trace.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if not self_us.isdigit() or not name.startswith("tidewater."):
            continue
        parts = name.split(".")
        package = ".".join(parts[:3] if parts[1] == "broker" else parts[:2])
        by_package[package] += int(self_us) / 1e6
    return by_package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"interpreter": [], "libraries": [], "broker": []}
    made_s: list[float] = []
    made = 0
    for _ in range(args.rounds):
        rows["interpreter"].append(run(INTERPRETER)[0])
        rows["libraries"].append(run(LIBRARIES)[0])
        cpu, out, _ = run(BROKER)
        rows["broker"].append(cpu)
        count, seconds = out.split()
        made, made_s = int(count), [*made_s, float(seconds)]
    load = os.getloadavg()[0]
    print(f"fresh interpreters, CPU s (user + system), median of {args.rounds}; "
          f"load average {load:.2f}")
    print(f"{'what':<62} {'CPU s':>7}")
    print(f"{'-' * 62} {'-' * 7}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{'python -c pass':<62} {med['interpreter']:>7.3f}")
    print(f"{'+ asyncio, ssl, uvloop, grpc, grpc.aio, the generated protobuf':<62} "
          f"{med['libraries']:>7.3f}")
    print(f"{'+ broker.process as the broker imports it':<62} {med['broker']:>7.3f}")
    print(f"{f'  of which making {made} dataclasses (wall s)':<62} "
          f"{statistics.median(made_s):>7.3f}")
    print()
    by_package = own_modules_by_package()
    print(f"{'Tidewater package (self import time, -X importtime)':<52} {'s':>7}")
    print(f"{'-' * 52} {'-' * 7}")
    for package, seconds in by_package.most_common(12):
        print(f"{package:<52} {seconds:>7.3f}")
    rest = sum(seconds for _, seconds in by_package.most_common()[12:])
    print(f"{'the rest':<52} {rest:>7.3f}")
    print(f"{'all':<52} {sum(by_package.values()):>7.3f}")


if __name__ == "__main__":
    main()
