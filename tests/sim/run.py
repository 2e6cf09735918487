"""Run simulation seeds by hand: ``cd tests && ../.venv/bin/python -m sim.run --seed 7 --verbose``.

One line per seed, then the totals: steps simulated, the faults injected and
the wall-clock time (``make sim`` runs this over 200 seeds).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

from .cluster import SimConfig, Simulation, SimulationFailure


def main(argv: list[str] | None = None) -> int:
    # The broker's own code logs what it decides (stray replicas moved aside, ...); the
    # simulation's trace tells the story, so those lines are not printed.
    logging.getLogger("tidewater").addHandler(logging.NullHandler())
    logging.getLogger("tidewater").propagate = False
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, action="append",
                        help="seed to run (repeatable); default: --first/--count")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--controllers", type=int, default=1,
                        help="controllers: 1 (the JSON metadata log) or a quorum (3: the "
                             "product's QuorumOwner and Raft, with the quorum's faults)")
    parser.add_argument("--verbose", action="store_true", help="print the trace as it happens")
    parser.add_argument("--counters", action="store_true",
                        help="print the decision paths taken, summed over the seeds")
    parser.add_argument("--min-steps", type=int, default=0,
                        help="fail unless at least this many steps were simulated in all (a "
                             "sweep that silently ran nothing must not pass)")
    args = parser.parse_args(argv)
    seeds = args.seed if args.seed else range(args.first, args.first + args.count)
    failed = 0
    totals: Counter[str] = Counter()
    counters: Counter[str] = Counter()
    started_all = time.perf_counter()
    print(f"{'seed':>6} {'steps':>6} {'acked':>6} {'committed':>9} {'leader chg':>10} "
          f"{'crashes':>7} {'ctl crash':>9} {'ctl disk':>8} {'topics':>6} {'excused':>7} "
          f"{'msgs':>7} {'dropped':>7} {'secs':>5}")
    for seed in seeds:
        started = time.perf_counter()
        try:
            config = (SimConfig.for_seed(seed) if args.controllers == 1
                      else SimConfig.quorum_for_seed(seed, args.controllers))
            r = Simulation(seed, config, verbose=args.verbose).run()
        except SimulationFailure as e:
            failed += 1
            print(f"{seed:>6} FAILED\n{e}")
            continue
        totals.update(seeds=1, steps=r.steps, crashes=r.crashes,
                      controller_crashes=r.controller_crashes,
                      metadata_write_failures=r.metadata_write_failures,
                      topic_incarnations=r.topic_incarnations, leaderships=r.leaderships)
        counters.update(r.counters)
        print(f"{seed:>6} {r.steps:>6} {r.acked:>6} {r.committed_batches:>9} "
              f"{r.leader_changes:>10} {r.crashes:>7} {r.controller_crashes:>9} "
              f"{r.metadata_write_failures:>8} {r.topic_incarnations:>6} "
              f"{len(r.excused_losses):>7} {r.messages_sent:>7} {r.messages_dropped:>7} "
              f"{time.perf_counter() - started:>5.2f}")
    print(f"total: {totals['seeds']} seeds passed, {failed} failed; {totals['steps']} steps; "
          f"{totals['crashes']} broker crashes, {totals['controller_crashes']} controller "
          f"crashes, {totals['metadata_write_failures']} failed metadata writes, "
          f"{totals['topic_incarnations']} topic incarnations, {totals['leaderships']} "
          f"leader epochs led; secs {time.perf_counter() - started_all:.1f}")
    if args.counters:
        for name, count in sorted(counters.items()):
            print(f"  {count:>8}  {name}")
    print(f"sim: {totals['seeds'] + failed} seeds, {totals['steps']} steps, {failed} "
          f"violations")
    min_steps = max(args.min_steps, 1)
    if totals["steps"] < min_steps:
        print(f"sim: only {totals['steps']} steps simulated, fewer than {min_steps}",
              file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
