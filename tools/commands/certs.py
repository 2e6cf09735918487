"""`tide certs init|issue`: a cluster CA and the certificates it signs (tools/certs.py).

    tide certs init --dir DIR
    tide certs issue --dir DIR --name broker-1 --role broker [--host H ...]
    tide certs cluster --dir DIR --brokers 3 [--controllers 3] [--host H ...] [--names-as-hosts]

``init`` writes ``DIR/ca.pem`` and ``DIR/ca.key`` (0600); ``issue`` writes
``DIR/<name>.pem`` and ``DIR/<name>.key`` (0600), subject ``CN=<name>,
OU=<role>``, for the hosts given (127.0.0.1 and localhost by default). A
broker's certificate must be named ``broker-<id>``: the controller takes a
broker's registration only from the certificate naming its id. ``cluster``
makes what a whole cluster needs at once (kept where already there): the CA,
``controller`` (and ``controller-2..N`` with ``--controllers N``: a quorum),
``broker-1..N`` and ``client``, and ``client.properties``
for ``--command-config``; ``--names-as-hosts`` adds each member's own name to
the hosts it serves as (compose service names: ``make up TLS=1`` uses it).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tidewater.tools import certs
from tidewater.tools.cli import CliError

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("certs", help="make a cluster CA and issue certificates")
    sub = parser.add_subparsers(dest="certs_command", metavar="ACTION")
    sub.required = True

    init = sub.add_parser("init", help="make a CA: DIR/ca.pem and DIR/ca.key")
    init.add_argument("--dir", required=True, type=Path)
    init.set_defaults(func=cmd_init)

    issue = sub.add_parser("issue", help="a certificate and key signed by DIR's CA")
    issue.add_argument("--dir", required=True, type=Path, help="the CA's directory (tide certs init)")
    issue.add_argument("--name", required=True,
                       help="the subject's CN; brokers: broker-<id>; also the files' name")
    issue.add_argument("--role", required=True, choices=certs.ROLES, help="the subject's OU")
    issue.add_argument("--host", action="append", default=[], metavar="HOST",
                       help="IP or DNS name to serve as (repeatable; default 127.0.0.1 and "
                            "localhost)")
    issue.set_defaults(func=cmd_issue)

    cluster = sub.add_parser("cluster", help="a CA and every certificate a cluster needs, "
                                             "with client.properties")
    cluster.add_argument("--dir", required=True, type=Path)
    cluster.add_argument("--brokers", type=int, default=3, help="broker ids 1..N (default 3)")
    cluster.add_argument("--controllers", type=int, default=1,
                         help="controller nodes: node 1's certificate is `controller`, "
                              "the others' controller-2..N (default 1)")
    cluster.add_argument("--host", action="append", default=[], metavar="HOST",
                         help="IP or DNS name every member serves as (repeatable; default "
                              "127.0.0.1 and localhost)")
    cluster.add_argument("--names-as-hosts", action="store_true",
                         help="each member also serves as its own name (controller, "
                              "broker-<id>): compose service names")
    cluster.set_defaults(func=cmd_cluster)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def cmd_init(args: argparse.Namespace) -> int:
    try:
        path = certs.init_ca_dir(args.dir, now=_now())
    except (certs.CertError, OSError) as e:
        raise CliError(f"certs init: {e}") from None
    print(path)
    return 0


def cmd_issue(args: argparse.Namespace) -> int:
    hosts = tuple(args.host) or certs.DEFAULT_HOSTS
    try:
        cert_path, key_path = certs.issue_to_dir(args.dir, name=args.name, role=args.role,
                                                 hosts=hosts, now=_now())
    except (certs.CertError, OSError) as e:
        raise CliError(f"certs issue: {e}") from None
    print(cert_path)
    print(key_path)
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        raise CliError(f"certs cluster: --brokers must be at least 1, got {args.brokers}")
    if args.controllers < 1:
        raise CliError(f"certs cluster: --controllers must be at least 1, "
                       f"got {args.controllers}")
    hosts = tuple(args.host) or certs.DEFAULT_HOSTS
    try:
        entry = certs.make_cluster_dir(args.dir, list(range(1, args.brokers + 1)), hosts=hosts,
                                       names_as_hosts=args.names_as_hosts,
                                       controllers=args.controllers, now=_now())
    except (certs.CertError, OSError) as e:
        raise CliError(f"certs cluster: {e}") from None
    print(entry["command_config"])
    return 0
