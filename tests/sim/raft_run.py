"""Sweep seeds of the Raft quorum simulation: ``cd tests && ../.venv/bin/python -m sim.raft_run``.

One line per seed, then the totals. ``--min-steps`` fails a sweep that ran fewer
steps than asked (a sweep that silently ran nothing must not pass).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from .raft_cluster import RaftSimulation, RaftSimulationFailure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, action="append", help="seed to run (repeatable)")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="print the trace as it happens")
    parser.add_argument("--min-steps", type=int, default=0)
    args = parser.parse_args(argv)
    seeds = args.seed if args.seed else range(args.first, args.first + args.count)
    totals: Counter[str] = Counter()
    failed = 0
    started_all = time.perf_counter()
    print(f"{'seed':>7} {'nodes':>5} {'steps':>6} {'commit':>6} {'elect':>5} {'crash':>5} "
          f"{'wipe':>4} {'disk':>4} {'part':>4} {'snap':>4} {'inst':>4} {'voter':>5} {'secs':>5}")
    for seed in seeds:
        started = time.perf_counter()
        simulation = RaftSimulation(seed, verbose=args.verbose)
        try:
            r = simulation.run()
        except RaftSimulationFailure as e:
            failed += 1
            print(f"{seed:>7} FAILED\n{e}")
            continue
        totals.update(seeds=1, steps=r.steps, committed=r.committed, crashes=r.crashes,
                      wipes=r.wipes, disk_failures=r.disk_failures,
                      snapshots_installed=r.snapshots_installed, voter_changes=r.voter_changes)
        print(f"{seed:>7} {simulation.config.nodes:>5} {r.steps:>6} {r.committed:>6} "
              f"{r.elections:>5} {r.crashes:>5} {r.wipes:>4} {r.disk_failures:>4} "
              f"{r.partitions:>4} {r.snapshots_taken:>4} {r.snapshots_installed:>4} "
              f"{r.voter_changes:>5} {time.perf_counter() - started:>5.2f}")
    print(f"raft sim: {totals['seeds'] + failed} seeds, {totals['steps']} steps, {failed} "
          f"violations; {totals['committed']} entries committed, {totals['crashes']} crashes, "
          f"{totals['wipes']} wiped disks, {totals['disk_failures']} failed writes, "
          f"{totals['snapshots_installed']} snapshots installed, {totals['voter_changes']} "
          f"voter changes; secs {time.perf_counter() - started_all:.1f}")
    if totals["steps"] < max(args.min_steps, 1):
        print(f"raft sim: only {totals['steps']} steps simulated, fewer than {args.min_steps}",
              file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
