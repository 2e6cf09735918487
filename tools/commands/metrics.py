"""``tide metrics scrape``: keep a history of every process's /metrics for the audit.

Targets come from exactly one of ``--targets host:port[,NAME=host:port...]``,
``--data-dir DIR`` (a ``tide cluster up`` cluster: its cluster.json) or
``--compose`` (the docker-compose project). The file format is documented in
``client/scrape.py``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import security_of
from tidewater.tools.scrape import (
    ScrapeConfigError,
    ScrapeCredentials,
    Scraper,
    ScrapeTarget,
    parse_targets,
)

if TYPE_CHECKING:
    from tidewater.tools.chaos.targets import ChaosCluster
    from tidewater.tools.cli import Subparsers

DEFAULT_COMPOSE_PROJECT = "tidewater"


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("metrics", help="metrics tools (scrape)")
    sub = parser.add_subparsers(dest="metrics_command", metavar="ACTION")
    sub.required = True
    scrape = sub.add_parser(
        "scrape", help="poll every /metrics endpoint and append timestamped snapshots to files")
    scrape.add_argument("--interval-ms", type=int, default=1000, help="time between scrapes (default 1000)")
    scrape.add_argument("--out", required=True, type=Path, help="folder for <source>.prom files")
    scrape.add_argument("--duration-s", type=float, default=None,
                        help="stop after this many seconds (default: until Ctrl-C / SIGTERM)")
    scrape.add_argument("--timeout-ms", type=int, default=None,
                        help="per-request timeout (default: the interval, at least 500, at most 5000)")
    add_cluster_arguments(scrape)
    scrape.set_defaults(func=run_scrape)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--targets / --data-dir / --compose (shared with ``tide chaos``)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--targets", help="HOST:PORT or NAME=HOST:PORT, comma-separated")
    where.add_argument("--data-dir", type=Path, help="a `tide cluster up` cluster folder")
    where.add_argument("--compose", action="store_true", help="the docker-compose cluster")
    parser.add_argument("--compose-project", default=DEFAULT_COMPOSE_PROJECT,
                        help=f"docker-compose project name (default {DEFAULT_COMPOSE_PROJECT})")


def cluster_from_args(args: argparse.Namespace) -> ChaosCluster | None:
    """The ChaosCluster named by --data-dir / --compose (None for --targets)."""
    from tidewater.tools.chaos.targets import ChaosTargetError, ComposeCluster, LocalChaosCluster

    try:
        if getattr(args, "compose", False):
            return ComposeCluster(args.compose_project)
        if getattr(args, "data_dir", None) is not None:
            return LocalChaosCluster(args.data_dir)
    except ChaosTargetError as e:
        raise CliError(str(e)) from None
    return None


def targets_from_args(args: argparse.Namespace) -> list[ScrapeTarget]:
    from tidewater.tools.chaos.targets import ChaosTargetError

    try:
        if args.targets is not None:  # (an empty list too: parse_targets says what is wrong)
            # https:// targets (brokers with TLS) are checked against --command-config's CA.
            security = security_of(args)
            return parse_targets(args.targets, cafile=security.get("ssl_cafile"),
                                 credentials=ScrapeCredentials.from_security(security))
        cluster = cluster_from_args(args)
        if cluster is None:  # argparse requires one of --targets, --data-dir, --compose
            raise CliError("--targets, --data-dir or --compose is required", exit_code=2)
        targets = cluster.metrics_targets()
    except ScrapeConfigError as e:
        raise CliError(str(e), exit_code=2) from None
    except ChaosTargetError as e:
        raise CliError(str(e)) from None
    if not targets:
        raise CliError("the cluster has no metrics endpoints (started with --metrics-port 0?)")
    return targets


def run_scrape(args: argparse.Namespace) -> int:
    targets = targets_from_args(args)
    try:
        scraper = Scraper(targets, args.out, interval_ms=args.interval_ms, timeout_ms=args.timeout_ms)
    except ScrapeConfigError as e:
        raise CliError(str(e), exit_code=2) from None
    # SIGTERM stops after the current round, like Ctrl-C, so files end on a whole block.
    previous = signal.signal(signal.SIGTERM, lambda *_: scraper.stop())
    print(f"scraping {len(targets)} endpoint(s) every {args.interval_ms} ms into {args.out}: "
          + ", ".join(t.source for t in targets), file=sys.stderr)
    try:
        scraper.run(duration_s=args.duration_s)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        scraper.close()
    print(f"{scraper.rounds} round(s), {scraper.errors} failed scrape(s)", file=sys.stderr)
    return 0
