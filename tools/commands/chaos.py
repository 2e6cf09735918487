"""``tide chaos``: a seeded fault-injection run with a verdict (see client/chaos/).

    tide chaos --compose --duration 120 --seed 7 --out build/chaos
    tide chaos --data-dir .demo --duration 60 --seed 1 --out /tmp/chaos

Exit 0 when every acknowledged record is there exactly once and every
replica is identical below the HW (with ``--transactional``: and the app's
read_committed output holds each acknowledged input's output exactly once); 1 otherwise (or when the cluster cannot be
reached or healed); 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tidewater.tools.cli import CliError

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def _range(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(",")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise ValueError(f"expected MIN,MAX seconds, got {text!r}") from None
    if pair[0] <= 0 or pair[1] < pair[0]:
        raise ValueError(f"expected 0 < MIN <= MAX, got {text!r}")
    return pair


def register(subparsers: Subparsers) -> None:
    from tidewater.tools.chaos.schedule import FAULT_WEIGHTS, QUORUM_FAULT_WEIGHTS

    p = subparsers.add_parser(
        "chaos", help="inject seeded faults while producing with acks=all, then verify nothing was lost")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--compose", action="store_true", help="the docker-compose cluster (make up)")
    where.add_argument("--data-dir", type=Path, help="a `tide cluster up` cluster folder")
    p.add_argument("--compose-project", default="tidewater", help="compose project name (default tidewater)")
    p.add_argument("--compose-file", type=Path, default=None, help="(accepted for symmetry; unused)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of faults and traffic (default 60)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault plan (default 1)")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--topic", default="chaos", help="topic to write (created if missing; default chaos)")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--replication-factor", type=int, default=3)
    p.add_argument("--min-insync-replicas", type=int, default=2)
    p.add_argument("--producers", type=int, default=2, help="producer threads (default 2)")
    p.add_argument("--rate", type=float, default=200.0, help="records per second in total (default 200)")
    p.add_argument("--faults", default="",
                   help="fault kinds to use, comma-separated, optionally KIND=WEIGHT "
                        f"(default: {','.join(FAULT_WEIGHTS)}, and with a quorum of "
                        f"controllers also {','.join(set(QUORUM_FAULT_WEIGHTS) - set(FAULT_WEIGHTS))}"
                        ", each controller fault on the active controller or a standby)")
    p.add_argument("--hold", default="2,8", help="MIN,MAX seconds a fault lasts (default 2,8)")
    p.add_argument("--gap", default="1,4", help="MIN,MAX seconds between faults (default 1,4)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before the first fault (default 5)")
    p.add_argument("--scrape-interval-ms", type=int, default=1000)
    p.add_argument("--idempotent", action="store_true",
                   help="idempotent producers with 5 requests in flight that retry (dup must "
                        "stay 0, each producer's records in send order)")
    p.add_argument("--compacted", type=int, default=0, metavar="KEYS",
                   help="write a compacted topic (cleanup.policy=compact, segments cleaned "
                        "while faults happen) with KEYS keys: an acknowledged record may be "
                        "cleaned only under a later one of its key (default 0: a plain topic)")
    p.add_argument("--transactional", type=float, nargs="?", const=20.0, default=0.0,
                   metavar="RATE",
                   help="also run an exactly-once consume-transform-produce app (Kafka "
                        "transactions, confluent-kafka) fed RATE input records per second "
                        "(default 20): outputs lost and duplicated in its read_committed "
                        "output must be 0")
    p.add_argument("--settle-timeout", type=float, default=180.0,
                   help="seconds to wait for full ISRs after healing (default 180)")
    p.set_defaults(func=run)


def parse_faults(text: str) -> dict[str, int] | None:
    """The weights ``--faults`` gives; None (empty): the plan's default for the cluster."""
    from tidewater.tools.chaos.schedule import FAULT_WEIGHTS, QUORUM_FAULT_WEIGHTS

    if not text.strip():
        return None
    known = {**FAULT_WEIGHTS, **QUORUM_FAULT_WEIGHTS}
    weights = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        kind, sep, weight = item.partition("=")
        if kind not in known:
            raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(known)})")
        if sep and (not weight.isdigit()):
            raise ValueError(f"bad weight in {item!r}")
        weights[kind] = int(weight) if sep else known[kind]
    if not any(weights.values()):
        raise ValueError("--faults selects no fault kind")
    return weights


def run(args: argparse.Namespace) -> int:
    from tidewater.proto.errors import TidewaterError
    from tidewater.tools.chaos.runner import ChaosOptions, ChaosRun
    from tidewater.tools.chaos.targets import ChaosTargetError, ComposeCluster, LocalChaosCluster

    try:
        options = ChaosOptions(
            topic=args.topic, duration_s=args.duration, seed=args.seed, out_dir=args.out,
            partitions=args.partitions, replication_factor=args.replication_factor,
            min_insync_replicas=args.min_insync_replicas, producers=args.producers,
            rate_per_s=args.rate, scrape_interval_ms=args.scrape_interval_ms,
            warmup_s=args.warmup, hold_s=_range(args.hold), gap_s=_range(args.gap),
            fault_weights=parse_faults(args.faults), settle_timeout_s=args.settle_timeout,
            idempotent=args.idempotent, compacted_keys=args.compacted,
            transactional_rate_per_s=args.transactional)
        if args.duration <= 0 or args.producers < 1 or args.rate <= 0 or args.scrape_interval_ms <= 0:
            raise ValueError("--duration, --producers, --rate and --scrape-interval-ms must be positive")
        if args.transactional < 0:
            raise ValueError("--transactional RATE must not be negative")
        if args.compacted < 0:
            raise ValueError("--compacted KEYS must not be negative")
    except ValueError as e:
        raise CliError(str(e), exit_code=2) from None
    if (args.out / "run.json").exists():
        raise CliError(f"{args.out} already holds a chaos run; choose another --out")
    try:
        cluster = ComposeCluster(args.compose_project) if args.compose else LocalChaosCluster(args.data_dir)
        verdict = ChaosRun(cluster, options).run()
    except (ChaosTargetError, TidewaterError) as e:
        raise CliError(f"chaos: {' '.join(str(e).split())}") from None
    print(verdict.table())
    print(f"output: {args.out}", file=sys.stderr)
    return 0 if verdict.ok else 1
