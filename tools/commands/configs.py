"""`tide configs describe|alter` (kafka-configs.sh) and `tide leader-election`
(kafka-leader-election.sh).

``--entity-type topics|brokers`` with ``--entity-name N`` (a topic, or a broker
id) or, for brokers, ``--entity-default`` (the cluster-wide dynamic defaults).
``describe`` prints the entity's own configs, as kafka-configs.sh does (a topic's
configs, a broker's dynamic ones). ``alter --add-config k=v,k2=v2`` sets
values (a list value in brackets: ``cleanup.policy=[compact,delete]``);
``--delete-config k,k2`` removes them, so the default applies again. Both go
in one IncrementalAlterConfigs call: all or nothing for the entity.

``leader-election --election-type preferred|unclean`` with ``--topic T
--partition P`` or ``--all-topic-partitions``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tidewater.client.admin import BROKER_RESOURCE, TOPIC_RESOURCE, AdminClient, ConfigOp
from tidewater.proto.errors import ElectionNotNeededError
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    describe_error,
    security_of,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("configs", help="describe and alter topic and broker configs")
    sub = parser.add_subparsers(dest="configs_command", metavar="ACTION")
    sub.required = True
    for action, helptext in (("describe", "an entity's own (dynamic) configs"),
                             ("alter", "set or delete configs of a topic or broker(s)")):
        p = sub.add_parser(action, help=helptext)
        p.add_argument("--entity-type", required=True, choices=["topics", "brokers"])
        p.add_argument("--entity-name", metavar="NAME", help="a topic, or a broker id")
        p.add_argument("--entity-default", action="store_true",
                       help="brokers: the cluster-wide dynamic defaults")
        if action == "alter":
            p.add_argument("--add-config", action="append", default=[], metavar="K=V,K2=V2",
                           help="configs to set (repeatable); a list value in brackets")
            p.add_argument("--delete-config", action="append", default=[], metavar="K,K2",
                           help="configs to remove (repeatable)")
            p.add_argument("--validate-only", action="store_true",
                           help="check the change; change nothing")
        p.add_argument("--timeout-ms", type=int, default=30000)
        add_bootstrap_argument(p)
        p.set_defaults(func=cmd_describe if action == "describe" else cmd_alter)

    election = subparsers.add_parser("leader-election",
                                     help="elect preferred or unclean partition leaders")
    election.add_argument("--election-type", required=True, type=str.lower,
                          choices=["preferred", "unclean"])
    election.add_argument("--topic", metavar="NAME")
    election.add_argument("--partition", type=int, metavar="N")
    election.add_argument("--all-topic-partitions", action="store_true")
    election.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(election)
    election.set_defaults(func=cmd_leader_election)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), request_timeout_ms=args.timeout_ms,
                       **security_of(args))


def _entity(args: argparse.Namespace) -> tuple[int, str, str]:
    """(resource type, resource name, how to show it) from the entity flags."""
    if args.entity_default and args.entity_name is not None:
        raise CliError("give --entity-name or --entity-default, not both", exit_code=2)
    if args.entity_type == "topics":
        if args.entity_default or not args.entity_name:
            raise CliError("topics need --entity-name TOPIC", exit_code=2)
        return TOPIC_RESOURCE, args.entity_name, f"topic {args.entity_name}"
    if args.entity_default:
        return BROKER_RESOURCE, "", "the default broker"
    if args.entity_name is None or not args.entity_name.isdigit():
        raise CliError("brokers need --entity-name BROKER_ID or --entity-default", exit_code=2)
    return BROKER_RESOURCE, args.entity_name, f"broker {args.entity_name}"


def split_config_list(text: str) -> list[str]:
    """kafka-configs.sh's ``k=v,k2=[a,b]``: commas split pairs except inside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def _set_ops(texts: list[str]) -> list[ConfigOp]:
    ops = []
    for text in texts:
        for pair in split_config_list(text):
            name, sep, value = pair.partition("=")
            if not sep or not name.strip():
                raise CliError(f"bad config {pair!r}: expected KEY=VALUE", exit_code=2)
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            ops.append(ConfigOp(name.strip(), "SET", value))
    return ops


def cmd_describe(args: argparse.Namespace) -> int:
    resource_type, name, shown = _entity(args)
    with _admin(args) as admin, cli_errors(f"cannot describe {shown}"):
        configs = admin.describe_dynamic_configs(resource_type, name)
    kind = "Dynamic configs" if resource_type == BROKER_RESOURCE else "Configs"
    print(f"{kind} for {shown} are:")
    for key, value in configs.items():
        print(f"  {key}={value}")
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    resource_type, name, shown = _entity(args)
    ops = _set_ops(args.add_config)
    ops += [ConfigOp(key, "DELETE") for text in args.delete_config
            for key in split_config_list(text)]
    if not ops:
        raise CliError("nothing to alter: --add-config and/or --delete-config", exit_code=2)
    with _admin(args) as admin, cli_errors(f"cannot alter {shown}"):
        admin.alter_configs(resource_type, name, ops, validate_only=args.validate_only)
    print(f"Completed updating config for {shown}." if not args.validate_only
          else f"The change to {shown} is valid.")
    return 0


def cmd_leader_election(args: argparse.Namespace) -> int:
    if args.all_topic_partitions == (args.topic is not None):
        raise CliError("give --topic T --partition P, or --all-topic-partitions", exit_code=2)
    if args.topic is not None and args.partition is None:
        raise CliError("--topic needs --partition", exit_code=2)
    wanted = None if args.all_topic_partitions else [(args.topic, args.partition)]
    with _admin(args) as admin, cli_errors("cannot elect leaders"):
        results = admin.elect_leaders(args.election_type, wanted)
    elected = sorted(tp for tp, error in results.items() if error is None)
    not_needed = sorted(tp for tp, error in results.items()
                        if isinstance(error, ElectionNotNeededError))
    failed = {tp: error for tp, error in sorted(results.items())
              if error is not None and not isinstance(error, ElectionNotNeededError)}
    if elected:
        print(f"Successfully completed leader election ({args.election_type}) for partitions "
              + ", ".join(f"{t}-{p}" for t, p in elected))
    if not_needed:
        print("Valid replica already elected for partitions "
              + ", ".join(f"{t}-{p}" for t, p in not_needed))
    if not results:
        print("No partition needed an election.")
    if failed:
        raise CliError("election failed for " + "; ".join(
            f"{t}-{p}: {describe_error(error)}" for (t, p), error in failed.items()))
    return 0
