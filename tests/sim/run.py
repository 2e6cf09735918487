"""Run simulation seeds by hand: ``cd tests && ../.venv/bin/python -m sim.run --seed 7 --verbose``."""

from __future__ import annotations

import argparse
import sys
import time

from .cluster import Simulation, SimulationFailure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, action="append",
                        help="seed to run (repeatable); default: --first/--count")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="print the trace as it happens")
    args = parser.parse_args(argv)
    seeds = args.seed if args.seed else range(args.first, args.first + args.count)
    failed = 0
    print(f"{'seed':>6} {'ms':>6} {'acked':>6} {'committed':>9} {'leader chg':>10} "
          f"{'crashes':>7} {'excused':>7} {'msgs':>7} {'dropped':>7} {'secs':>5}")
    for seed in seeds:
        started = time.perf_counter()
        try:
            r = Simulation(seed, verbose=args.verbose).run()
        except SimulationFailure as e:
            failed += 1
            print(f"{seed:>6} FAILED\n{e}")
            continue
        print(f"{seed:>6} {r.end_ms:>6} {r.acked:>6} {r.committed_batches:>9} "
              f"{r.leader_changes:>10} {r.crashes:>7} {len(r.excused_losses):>7} "
              f"{r.messages_sent:>7} {r.messages_dropped:>7} {time.perf_counter() - started:>5.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
