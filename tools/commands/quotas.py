"""`tide quotas alter|describe`: client quotas, with kafka-configs.sh's names.

    tide quotas alter --entity-type users --entity-name alice \\
        --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152
    tide quotas alter --entity-type clients --entity-default --delete-config producer_byte_rate
    tide quotas alter --entity-type users --entity-name alice --entity-type clients \\
        --entity-name app --add-config request_percentage=50
    tide quotas describe [--entity-type users [--entity-name alice | --entity-default]]

``--entity-type`` is ``users`` or ``clients``; each is followed by ``--entity-name NAME``
or ``--entity-default`` (Kafka's ``<default>``). Quotas: ``producer_byte_rate`` and
``consumer_byte_rate`` (bytes per second per broker), ``request_percentage`` (percent
of one request handler's time per second).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tidewater.broker.kafka.client_quotas import ENTITY_CLIENT_ID, ENTITY_USER, QUOTA_KEYS
from tidewater.client.admin import AdminClient
from tidewater.proto import tidewater_pb2 as pb
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    security_of,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers

_TYPES = {"users": ENTITY_USER, "clients": ENTITY_CLIENT_ID}
_DEFAULT = object()  # --entity-default


class _EntityAction(argparse.Action):
    """Keeps --entity-type / --entity-name / --entity-default in order, as pairs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parts: list[list[object]] = getattr(namespace, "entity_parts", None) or []
        if option_string == "--entity-type":
            parts.append([values, None])
        elif not parts or parts[-1][1] is not None:
            parser.error(f"{option_string} needs an --entity-type before it")
        else:
            parts[-1][1] = _DEFAULT if option_string == "--entity-default" else values
        namespace.entity_parts = parts


def register(subparsers: Subparsers) -> None:
    quotas = subparsers.add_parser("quotas", help="client quotas (kafka-configs.sh "
                                                  "--entity-type users/clients)")
    sub = quotas.add_subparsers(dest="quotas_command", metavar="ACTION")
    sub.required = True
    for action, helptext, func in (("alter", "set or delete quotas of an entity", cmd_alter),
                                   ("describe", "list quotas", cmd_describe)):
        p = sub.add_parser(action, help=helptext)
        p.set_defaults(entity_parts=[])
        p.add_argument("--entity-type", choices=sorted(_TYPES), action=_EntityAction)
        p.add_argument("--entity-name", action=_EntityAction)
        p.add_argument("--entity-default", nargs=0, action=_EntityAction)
        if action == "alter":
            p.add_argument("--add-config", default="",
                           help="k=v,k=v with k one of " + ", ".join(QUOTA_KEYS))
            p.add_argument("--delete-config", default="", help="k,k")
        else:
            p.add_argument("--json", action="store_true")
        add_bootstrap_argument(p)
        p.set_defaults(func=func)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), **security_of(args))


def _entity(args: argparse.Namespace) -> dict[str, object]:
    """{user / client-id: name, _DEFAULT, or None (any, for describe)}."""
    entity: dict[str, object] = {}
    for kind, name in args.entity_parts:
        if _TYPES[kind] in entity:
            raise CliError(f"--entity-type {kind} given twice", exit_code=2)
        entity[_TYPES[kind]] = name
    return entity


def _parse_add(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise CliError(f"--add-config: expected key=number, not {item!r}",
                           exit_code=2) from None
        if not sep:
            raise CliError(f"--add-config: expected key=number, not {item!r}", exit_code=2)
    return values


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def _label(name: str | None) -> str:
    return "<default>" if name == "" else str(name)


def cmd_alter(args: argparse.Namespace) -> int:
    entity = _entity(args)
    if not entity or any(v is None for v in entity.values()):
        raise CliError("alter needs --entity-type with --entity-name or --entity-default",
                       exit_code=2)
    names = {k: "" if v is _DEFAULT else str(v) for k, v in entity.items()}
    add = _parse_add(args.add_config)
    remove = [k.strip() for k in args.delete_config.split(",") if k.strip()]
    if not add and not remove:
        raise CliError("nothing to alter: give --add-config and/or --delete-config", exit_code=2)
    with _admin(args) as admin, cli_errors("cannot alter quotas"):
        admin.alter_client_quotas(names.get(ENTITY_USER), names.get(ENTITY_CLIENT_ID),
                                  add, remove)
    what = " ".join(f"{k} {_label(v)}" for k, v in names.items())
    print(f"quotas of {what} altered")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    components = []
    for kind, name in _entity(args).items():
        if name is None:
            components.append(pb.ClientQuotaFilterComponent(entity_type=kind, match_type=2))
        elif name is _DEFAULT:
            components.append(pb.ClientQuotaFilterComponent(entity_type=kind, match_type=1))
        else:
            components.append(pb.ClientQuotaFilterComponent(entity_type=kind, match_type=0,
                                                            match=str(name)))
    with _admin(args) as admin, cli_errors("cannot describe quotas"):
        entries = admin.describe_client_quotas(components)
    if args.json:
        print(json.dumps([{"user": u, "client_id": c, "values": v} for u, c, v in entries],
                         indent=2))
        return 0
    for user, client_id, values in entries:
        parts = []
        if user is not None:
            parts.append(f"user {_label(user)}")
        if client_id is not None:
            parts.append(f"client-id {_label(client_id)}")
        settings = ",".join(f"{k}={_number(v)}" for k, v in sorted(values.items()))
        print(f"{' '.join(parts)}\t{settings}")
    return 0
