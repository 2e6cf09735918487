"""``python -m controller`` / ``tide-controller``: run the Tidewater controller.

Exit codes: 0 after SIGTERM/SIGINT, 1 when a fatal error stopped it (metadata
log unreadable, corrupt or not writable at start-up, a crashed internal task),
2 on bad arguments, 1 also when a quorum's Raft directory was never formatted
(``quorum.formatting``: a wiped controller never rejoins as the voter it was), 3 (``server.EXIT_METADATA_NOT_DURABLE``) at once when a
metadata write failed (full disk, I/O error) or a command failed after
appending: the process ends before anything the log lacks is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import uvloop

from tidewater.broker.security.settings import (
    AUTHORIZERS,
    SASL_MECHANISMS,
    SecuritySettings,
    read_user_config,
)
from tidewater.controller.config import ControllerConfig, parse_host_port
from tidewater.controller.server import ControllerServer
from tidewater.proto.errors import InvalidConfigError, TidewaterError
from tidewater.proto.tls import TlsFiles, add_tls_arguments

log = logging.getLogger("controller")


def build_parser() -> argparse.ArgumentParser:
    defaults = ControllerConfig()
    settings = "\n".join(f"  {name} (default {getattr(defaults, attr)})"
                         for name, (attr, _) in sorted(ControllerConfig.SETTABLE.items()))
    parser = argparse.ArgumentParser(
        prog="tide-controller", description="Run the Tidewater controller",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"settings for --set:\n{settings}")
    parser.add_argument("--listen", default="127.0.0.1:9090", help="HOST:PORT for gRPC")
    parser.add_argument("--data-dir", required=True, type=Path,
                        help="directory of the durable metadata log")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="Prometheus /metrics port on the listen host (0: off)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        dest="settings", help="Kafka-named setting, e.g. "
                        "broker.session.timeout.ms=3000 (repeatable)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_tls_arguments(parser)
    parser.add_argument("--sasl-mechanisms", default="",
                        help="comma-separated SASL mechanisms; non-empty: every call must "
                             "authenticate (SASL/PLAIN call metadata against the users' SCRAM "
                             f"credentials, or a certificate with --tls-*); one of "
                             f"{', '.join(SASL_MECHANISMS)}")
    parser.add_argument("--authorizer", default="none", choices=AUTHORIZERS,
                        help="acl: admin calls need Kafka's ACL operations, brokers' calls "
                             "CLUSTER_ACTION on the cluster (super users pass)")
    parser.add_argument("--super-users", default="",
                        help="Kafka's super.users: principals separated by ';' "
                             "(User:admin;User:broker); brokers must authenticate as one")
    parser.add_argument("--bootstrap-user-config", type=Path, action="append", default=[],
                        metavar="FILE",
                        help="Kafka client properties with sasl.username and sasl.password: "
                             "that user gets SCRAM credentials at start-up when it has none "
                             "(as kafka-storage format --add-scram); repeatable")
    parser.add_argument("--format-if-empty", action="store_true",
                        help="with a quorum: format a Raft directory never formatted for "
                             "--initial-controllers (containers, as Kafka's docker image with "
                             "an empty volume); without it such a directory refuses to start")
    parser.add_argument("--initial-controllers", default="",
                        metavar="ID@HOST:PORT:DIRECTORY_ID,...",
                        help="the bootstrap voters --format-if-empty writes (as kafka-storage "
                             "format --initial-controllers)")
    return parser


def config_from_args(args: argparse.Namespace) -> ControllerConfig:
    parse_host_port(args.listen)  # ValueError on a bad address
    if not 0 <= args.metrics_port < 65536:
        raise ValueError(f"--metrics-port {args.metrics_port} is out of range")
    config = ControllerConfig(listen=args.listen, data_dir=args.data_dir,
                              metrics_port=args.metrics_port,
                              tls=TlsFiles.from_flags(args.tls_ca, args.tls_cert, args.tls_key),
                              security=SecuritySettings(
                                  sasl_mechanisms=tuple(m.strip() for m in
                                                        args.sasl_mechanisms.split(",")
                                                        if m.strip()),
                                  authorizer=args.authorizer,
                                  super_users=SecuritySettings.parse_super_users(
                                      args.super_users)),
                              bootstrap_user_configs=tuple(args.bootstrap_user_config),
                              format_if_empty=args.format_if_empty,
                              initial_controllers=args.initial_controllers)
    for path in config.bootstrap_user_configs:
        read_user_config(path)  # ValueError now, not at start-up
    config.apply_settings(args.settings)
    config.validate()
    return config


async def serve(config: ControllerConfig) -> int:
    server = ControllerServer(config)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    try:
        await server.start()
        print(f"controller listening on port {server.port}", flush=True)  # for scripts and tests
        # Not background tasks: two waits on events, awaited at once and cancelled after.
        waiters = [asyncio.ensure_future(stop_requested.wait()),
                   asyncio.ensure_future(server.stopped.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if stop_requested.is_set():
            log.info("signal received: shutting down")
    finally:
        await server.stop()
    if server.failure is not None:
        print(f"tide-controller: stopped after a fatal error: {server.failure!r}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    try:
        config = config_from_args(args)
    except (ValueError, InvalidConfigError) as e:
        print(f"tide-controller: {e}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(serve(config))
    except (TidewaterError, OSError) as e:
        log.critical("controller failed: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
