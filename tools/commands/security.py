"""`tide users create|delete|list` and `tide acls add|remove|list`.

Users are SCRAM credentials (kafka-configs.sh --alter --add-config
'SCRAM-SHA-512=[password=...]'): the password is salted and iterated here and
only the derived keys reach the controller; a user can log in with SCRAM-SHA-*
and with PLAIN (checked against the same credential). ACL flags are
kafka-acls.sh's: ``--allow-principal User:alice --operation read --topic
orders`` (``--group``, ``--cluster``, ``--resource-pattern-type prefixed``,
``--deny-principal``, ``--allow-host``/``--deny-host``). ``remove`` deletes
every ACL the flags match (absent flags match anything).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
from typing import TYPE_CHECKING

from tidewater.client.admin import SCRAM_ITERATIONS_DEFAULT, AdminClient
from tidewater.proto import acls as a
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.scram import MECHANISMS
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    security_of,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers

OPERATIONS = {name: number for number, name in a.OPERATION_NAMES.items()}
PATTERNS = {"literal": a.LITERAL, "prefixed": a.PREFIXED, "match": a.PATTERN_MATCH,
            "any": a.PATTERN_ANY}


def register(subparsers: Subparsers) -> None:
    users = subparsers.add_parser("users", help="SCRAM users (SASL/SCRAM and SASL/PLAIN)")
    sub = users.add_subparsers(dest="users_command", metavar="ACTION")
    sub.required = True
    create = sub.add_parser("create", help="add a user or change its password")
    create.add_argument("name")
    create.add_argument("--password", help="default: $TIDE_USER_PASSWORD, else asked for")
    create.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS),
                        help="repeatable; default: both SCRAM-SHA-256 and SCRAM-SHA-512")
    create.add_argument("--iterations", type=int, default=SCRAM_ITERATIONS_DEFAULT)
    add_bootstrap_argument(create)
    create.set_defaults(func=cmd_users_create)
    delete = sub.add_parser("delete", help="remove a user's credentials")
    delete.add_argument("name")
    delete.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS),
                        help="default: every mechanism the user has")
    add_bootstrap_argument(delete)
    delete.set_defaults(func=cmd_users_delete)
    lst = sub.add_parser("list", help="users and their mechanisms (never a password)")
    lst.add_argument("--json", action="store_true")
    add_bootstrap_argument(lst)
    lst.set_defaults(func=cmd_users_list)

    acls = subparsers.add_parser("acls", help="add, remove and list ACLs (kafka-acls.sh flags)")
    sub = acls.add_subparsers(dest="acls_command", metavar="ACTION")
    sub.required = True
    for action, helptext, func in (("add", "add ACLs", cmd_acls_add),
                                   ("remove", "remove every ACL the flags match", cmd_acls_remove),
                                   ("list", "list the ACLs the flags match", cmd_acls_list)):
        p = sub.add_parser(action, help=helptext)
        p.add_argument("--topic", help="a topic (or prefix, or '*')")
        p.add_argument("--group", help="a consumer group (or prefix, or '*')")
        p.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument("--resource-pattern-type", choices=sorted(PATTERNS),
                       default="literal" if action == "add" else "any")
        p.add_argument("--operation", action="append", choices=sorted(OPERATIONS),
                       help="repeatable" + ("" if action != "add" else " (required)"))
        if action == "list":
            p.add_argument("--principal", help="User:NAME")
            p.add_argument("--json", action="store_true")
        else:
            p.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
            p.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
            p.add_argument("--allow-host", action="append", default=[])
            p.add_argument("--deny-host", action="append", default=[])
        add_bootstrap_argument(p)
        p.set_defaults(func=func)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), **security_of(args))


def cmd_users_create(args: argparse.Namespace) -> int:
    password = args.password or os.environ.get("TIDE_USER_PASSWORD")
    if not password:
        password = getpass.getpass(f"password for {args.name}: ")
    if not password:
        raise CliError("a user needs a non-empty password", exit_code=2)
    with _admin(args) as admin, cli_errors(f"cannot create user {args.name}"):
        for mechanism in args.mechanism or sorted(MECHANISMS):
            admin.upsert_scram_user(args.name, password, mechanism, args.iterations)
    print(f"user {args.name}: {', '.join(args.mechanism or sorted(MECHANISMS))}")
    return 0


def cmd_users_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin, cli_errors(f"cannot delete user {args.name}"):
        admin.delete_scram_user(args.name, args.mechanism)
    print(f"deleted user {args.name}")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin, cli_errors("cannot list users"):
        users = admin.describe_scram_users()
    if args.json:
        print(json.dumps({u: [{"mechanism": m, "iterations": i} for m, i in ms]
                          for u, ms in users.items()}, indent=2))
    else:
        for user, mechanisms in sorted(users.items()):
            print(f"{user}\t" + ", ".join(f"{m} ({i} iterations)" for m, i in mechanisms))
    return 0


def _resource(args: argparse.Namespace, *, required: bool) -> tuple[int, str | None]:
    chosen = [(t, n) for t, n in ((a.TOPIC, args.topic), (a.GROUP, args.group),
                                  (a.CLUSTER, a.CLUSTER_NAME if args.cluster else None))
              if n is not None]
    if len(chosen) > 1:
        raise CliError("name one resource: --topic, --group or --cluster", exit_code=2)
    if not chosen:
        if required:
            raise CliError("name a resource: --topic, --group or --cluster", exit_code=2)
        return a.RESOURCE_ANY, None
    return chosen[0]


def _bindings(args: argparse.Namespace) -> list[a.Acl]:
    resource_type, name = _resource(args, required=True)
    assert name is not None
    if not args.operation:
        raise CliError("--operation is required", exit_code=2)
    pattern = PATTERNS[args.resource_pattern_type]
    out = []
    for permission, principals, hosts in ((a.ALLOW, args.allow_principal, args.allow_host),
                                          (a.DENY, args.deny_principal, args.deny_host)):
        for principal in principals:
            for host in hosts or [a.ANY_HOST]:
                for op in args.operation:
                    out.append(a.Acl(resource_type, name, pattern, principal, host,
                                     OPERATIONS[op], permission))
    if not out:
        raise CliError("--allow-principal or --deny-principal is required", exit_code=2)
    return out


def _filters(args: argparse.Namespace, principal: str | None = None) -> list[pb.AclBinding]:
    resource_type, name = _resource(args, required=False)
    pattern_type = PATTERNS[args.resource_pattern_type]
    principals: list[tuple[str | None, int | None]]
    if principal is not None or not hasattr(args, "allow_principal"):
        principals = [(principal, None)]
    else:
        principals = ([(p, a.ALLOW) for p in args.allow_principal]
                      + [(p, a.DENY) for p in args.deny_principal] or [(None, None)])
    return [pb.AclBinding(resource_type=resource_type, resource_name=name or "",
                          pattern_type=pattern_type, principal=p or "",
                          operation=OPERATIONS[op] if op else 0, permission_type=perm or 0)
            for p, perm in principals for op in (args.operation or [None])]


def _line(acl: a.Acl) -> str:
    return acl.describe()


def cmd_acls_add(args: argparse.Namespace) -> int:
    bindings = _bindings(args)
    with _admin(args) as admin, cli_errors("cannot add ACLs"):
        admin.create_acls(bindings)
    for acl in bindings:
        print(f"added: {_line(acl)}")
    return 0


def cmd_acls_remove(args: argparse.Namespace) -> int:
    with _admin(args) as admin, cli_errors("cannot remove ACLs"):
        deleted = admin.delete_acls(_filters(args))
    for acl in deleted:
        print(f"removed: {_line(acl)}")
    if not deleted:
        print("no ACL matched")
    return 0


def cmd_acls_list(args: argparse.Namespace) -> int:
    found: dict[a.Acl, None] = {}
    with _admin(args) as admin, cli_errors("cannot list ACLs"):
        for f in _filters(args, args.principal):
            found.update(dict.fromkeys(admin.describe_acls(f)))
    if args.json:
        print(json.dumps([acl.to_json() for acl in sorted(found)], indent=2))
    else:
        for acl in sorted(found):
            print(_line(acl))
    return 0
