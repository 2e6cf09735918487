"""`tide console`: the web console of a cluster (tools/console).

    tide console [--listen 127.0.0.1:9800] [--bootstrap-server H:P] [--command-config FILE]
                 [--metrics broker-1=H:P,...  |  --data-dir DIR] [--audit-dir DIR]
                 [--allow-writes] [--tls-cert FILE --tls-key FILE] [--login USER]

The console talks to the cluster through the client library (as every ``tide`` command,
``--bootstrap-server``/``TIDE_BOOTSTRAP_SERVER`` and ``--command-config``) and reads the
brokers' Prometheus endpoints for its charts: ``--metrics`` names them (``broker-N=``
ties an endpoint to broker N), or ``--data-dir`` of a ``tide cluster up`` cluster
gives them (and its bootstrap address and security). Admin actions (create and delete
topics, reset a group's offsets) need ``--allow-writes`` and ask to confirm each.

It listens on 127.0.0.1 by default. ``--tls-cert``/``--tls-key`` serve HTTPS;
``--login USER`` asks every request for USER and the password in
``TIDE_CONSOLE_PASSWORD`` (HTTP Basic: use it with TLS off the local machine).
Prints ``console: URL`` on stdout once it serves; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import add_bootstrap_argument, bootstrap_of, security_of

DEFAULT_LISTEN = "127.0.0.1:9800"
PASSWORD_ENV = "TIDE_CONSOLE_PASSWORD"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("console", help="the web console: overview, topics, records, "
                                                   "groups, live charts")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where to serve (default {DEFAULT_LISTEN}; port 0 picks one)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--metrics", metavar="broker-N=HOST:PORT,...",
                       help="the brokers' Prometheus endpoints, for the charts")
    where.add_argument("--data-dir", type=Path, metavar="DIR",
                       help="a `tide cluster up` cluster: its bootstrap, security and metrics")
    parser.add_argument("--audit-dir", type=Path, metavar="DIR",
                        help="where `tide audit --out` writes: the overview shows its verdict")
    parser.add_argument("--allow-writes", action="store_true",
                        help="allow creating and deleting topics and resetting group offsets "
                             "(each asks to confirm); off by default")
    parser.add_argument("--metrics-interval-ms", type=int, default=2000,
                        help="how often the charts' metrics are scraped (default 2000)")
    parser.add_argument("--lag-interval-ms", type=int, default=10_000,
                        help="how often every group's lag is sampled for the lag charts "
                             "(default 10000; 0: only while a group's page is open)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", metavar="FILE", help="... and this key")
    parser.add_argument("--login", metavar="USER",
                        help=f"ask for USER and the password in {PASSWORD_ENV} (HTTP Basic)")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=run)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise CliError(f"--listen: expected HOST:PORT, got {text!r}", exit_code=2)
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: Any) -> int:
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise CliError(f"the console needs its extra: pip install 'tidewater[console]' ({e})"
                       ) from None
    from tidewater.tools.scrape import (
        ScrapeConfigError,
        ScrapeCredentials,
        ScrapeTarget,
        parse_targets,
    )

    host, port = parse_listen(args.listen)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise CliError("--tls-cert and --tls-key go together", exit_code=2)
    login = None
    if args.login:
        password = os.environ.get(PASSWORD_ENV, "")
        if not password:
            raise CliError(f"--login needs the password in {PASSWORD_ENV}", exit_code=2)
        login = (args.login, password)
    if not _is_loopback(host) and login is None:
        print(f"tide console: warning: listening on {host} without --login: anyone who reaches "
              "it sees the cluster's records", file=sys.stderr)

    targets: list[ScrapeTarget] = []
    if args.data_dir is not None:
        from tidewater.tools.chaos.targets import ChaosTargetError, LocalChaosCluster

        try:
            local = LocalChaosCluster(args.data_dir)
            targets = [t for t in local.metrics_targets() if t.source.startswith("broker-")]
            bootstrap, security = local.bootstrap(), local.client_security()
        except ChaosTargetError as e:
            raise CliError(str(e)) from None
        if getattr(args, "command_config", None):
            security = security_of(args)
    else:
        bootstrap, security = bootstrap_of(args), security_of(args)
        if args.metrics:
            try:
                targets = parse_targets(args.metrics, cafile=security.get("ssl_cafile"),
                                        credentials=ScrapeCredentials.from_security(security))
            except ScrapeConfigError as e:
                raise CliError(f"--metrics: {e}", exit_code=2) from None
    return serve(bootstrap, security, targets, host=host, port=port, login=login,
                 allow_writes=args.allow_writes, audit_dir=args.audit_dir,
                 metrics_interval_ms=args.metrics_interval_ms,
                 lag_interval_ms=args.lag_interval_ms, tls_cert=args.tls_cert,
                 tls_key=args.tls_key)


def serve(bootstrap: str, security: Mapping[str, Any], targets: list[Any], *, host: str, port: int,
          login: tuple[str, str] | None, allow_writes: bool, audit_dir: Path | None,
          metrics_interval_ms: int, lag_interval_ms: int, tls_cert: str | None,
          tls_key: str | None) -> int:
    """Serve the console until SIGTERM or Ctrl-C (uvicorn's own handlers stop it)."""
    import socket

    import uvicorn

    from tidewater.tools.console.app import Console, ConsoleConfig, build_app
    from tidewater.tools.console.cluster_data import ClusterData
    from tidewater.tools.console.metrics import LagSampler, MetricsHistory
    from tidewater.tools.console.records import RecordReader

    # Bind first: a taken port is one line and exit 1, before any client starts.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)
    data = ClusterData(bootstrap, security, audit_dir=audit_dir)
    records = RecordReader(bootstrap, security)
    metrics = MetricsHistory(targets, interval_ms=metrics_interval_ms)
    console = Console(data, records, metrics, ConsoleConfig(
        allow_writes=allow_writes, login=login, bootstrap=bootstrap))
    app = build_app(console)
    bound_port = sock.getsockname()[1]
    scheme = "https" if tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            ssl_certfile=tls_cert, ssl_keyfile=tls_key, timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    lag = LagSampler(console.lag, lambda: [g.group_id for g in data.groups()],
                     lambda group_id: data.group(group_id).total_lag,
                     interval_ms=lag_interval_ms)
    metrics.start()
    lag.start()
    print(f"console: {scheme}://{shown_host}:{bound_port}/", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        lag.stop()
        metrics.stop()
        records.close()
        data.close()
        sock.close()
    return 0
