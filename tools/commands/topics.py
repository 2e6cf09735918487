"""`tide topics create|list|describe|alter|delete`.

Topics are named positionally (``tide topics create orders``) or with Kafka's
``--topic orders``; ``--partitions``, ``--replication-factor`` and ``--config``
are kafka-topics.sh's flags. ``alter --partitions N`` adds partitions up to N in
all, as ``kafka-topics.sh --alter`` does (never fewer). ``--replica-assignment 1:2,2:3``
places each (new) partition's replicas by hand; ``create --if-not-exists`` and
``delete --if-exists`` make those cases no error, as kafka-topics.sh's flags.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tidewater.client.admin import AdminClient, NewTopic, topic_to_json
from tidewater.proto.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    describe_error,
    parse_configs,
    security_of,
)
from tidewater.tools.commands.kafka_flags import resolve_topic, resolve_topics, usage_error

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("topics", help="create, list, describe and delete topics")
    sub = parser.add_subparsers(dest="topics_command", metavar="ACTION")
    sub.required = True

    create = sub.add_parser("create", help="create a topic")
    create.add_argument("name", nargs="?", metavar="NAME", help="or --topic NAME")
    create.add_argument("--topic", metavar="NAME", help="the topic, as kafka-topics.sh names it")
    create.add_argument("--partitions", type=int, default=-1,
                        help="-1 (the default) means the cluster's num.partitions")
    create.add_argument("--replication-factor", type=int, default=-1,
                        help="-1 (the default) means the cluster's default.replication.factor")
    create.add_argument("--config", action="append", metavar="KEY=VALUE", default=[],
                        help="topic config, repeatable (e.g. min.insync.replicas=2)")
    create.add_argument("--replica-assignment", metavar="B:B,B:B",
                        help="each partition's brokers, preferred first (kafka-topics.sh's: "
                             "partitions split by ',', brokers by ':')")
    create.add_argument("--if-not-exists", action="store_true",
                        help="an existing topic is not an error")
    create.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(create)
    create.set_defaults(func=cmd_create)

    lst = sub.add_parser("list", help="list topic names")
    lst.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(lst)
    lst.set_defaults(func=cmd_list)

    describe = sub.add_parser("describe", help="partitions, leaders, epochs, ISR and replica offsets")
    describe.add_argument("names", nargs="*", metavar="NAME", help="default: every topic")
    describe.add_argument("--topic", action="append", default=[], metavar="NAME",
                          help="also describe NAME (repeatable)")
    describe.add_argument("--json", action="store_true", help="one JSON document")
    describe.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(describe)
    describe.set_defaults(func=cmd_describe)

    alter = sub.add_parser("alter", help="add partitions to a topic")
    alter.add_argument("name", nargs="?", metavar="NAME", help="or --topic NAME")
    alter.add_argument("--topic", metavar="NAME", help="the topic, as kafka-topics.sh names it")
    alter.add_argument("--partitions", type=int, required=True,
                       help="the new number of partitions in all (more than it has)")
    alter.add_argument("--replica-assignment", metavar="B:B,B:B",
                       help="the new partitions' brokers, in order")
    alter.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(alter)
    alter.set_defaults(func=cmd_alter)

    delete = sub.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="*", metavar="NAME")
    delete.add_argument("--topic", action="append", default=[], metavar="NAME",
                        help="also delete NAME (repeatable)")
    delete.add_argument("--if-exists", action="store_true",
                        help="a topic that does not exist is not an error")
    delete.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(delete)
    delete.set_defaults(func=cmd_delete)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), request_timeout_ms=args.timeout_ms,
                       **security_of(args))


def cmd_create(args: argparse.Namespace) -> int:
    name = resolve_topic(args.name, args.topic)
    if args.partitions == 0 or args.partitions < -1:
        raise CliError(f"--partitions must be positive (or -1: the cluster's default), not {args.partitions}",
                       exit_code=2)
    if args.replication_factor == 0 or args.replication_factor < -1:
        raise CliError("--replication-factor must be positive (or -1: the cluster's default), "
                       f"not {args.replication_factor}", exit_code=2)
    configs = parse_configs(args.config)
    assignment = parse_replica_assignment(args.replica_assignment)
    if assignment and (args.partitions != -1 or args.replication_factor != -1):
        raise CliError("--replica-assignment sets the partitions and the replication factor: "
                       "give neither --partitions nor --replication-factor", exit_code=2)
    with _admin(args) as admin, cli_errors(f"cannot create topic {name!r}"):
        error = admin.create_topics([NewTopic(name, args.partitions, args.replication_factor,
                                              configs, assignment)])[name]
        if isinstance(error, TopicAlreadyExistsError) and args.if_not_exists:
            return 0
        if error is not None:
            raise error
    print(f"Created topic {name}.")
    return 0


def parse_replica_assignment(text: str | None) -> tuple[tuple[int, ...], ...]:
    """kafka-topics.sh's ``1:2,2:3``: partition 0 on brokers 1 and 2, partition 1 on 2
    and 3 (the first broker of each is its preferred leader)."""
    if not text:
        return ()
    try:
        return tuple(tuple(int(b) for b in part.split(":")) for part in text.split(","))
    except ValueError:
        raise CliError(f"bad --replica-assignment {text!r}: expected broker ids like 1:2,2:3",
                       exit_code=2) from None


def cmd_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin, cli_errors("cannot list topics"):
        names = admin.list_topics()
    for name in names:
        print(name)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin, cli_errors("cannot describe topics"):
        topics = admin.describe_topics(resolve_topics(args.names, args.topic) or None)
    if args.json:
        print(json.dumps({"topics": [topic_to_json(t) for t in topics]}, indent=2))
        return 0
    for t in topics:
        configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
        print(f"Topic: {t.name}\tTopicId: {t.topic_id or 'none'}\t"
              f"PartitionCount: {len(t.partitions)}\t"
              f"ReplicationFactor: {len(t.partitions[0].replicas) if t.partitions else 0}\t"
              f"Configs: {configs}")
        for p in t.partitions:
            state = " ".join(
                f"{r.broker}:leo={r.log_end_offset},hw={r.high_watermark},start={r.log_start_offset}"
                for r in p.replicas_state)
            print(f"\tPartition: {p.partition}\tLeader: {p.leader if p.leader >= 0 else 'none'}\t"
                  f"LeaderEpoch: {p.leader_epoch}\tPartitionEpoch: {p.partition_epoch}\t"
                  f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
                  + ("\tOffline" if p.offline else "") + (f"\tState: {state}" if state else ""))
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    name = resolve_topic(args.name, args.topic)
    if args.partitions < 1:
        raise CliError(f"--partitions must be positive, not {args.partitions}", exit_code=2)
    with _admin(args) as admin, cli_errors(f"cannot add partitions to {name!r}"):
        manual = [list(r) for r in parse_replica_assignment(args.replica_assignment)]
        error = admin.create_partitions({name: args.partitions},
                                        assignments={name: manual} if manual else None
                                        ).get(name)
        if error is not None:
            raise error
    print(f"Topic {name} now has {args.partitions} partitions.")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    names = resolve_topics(args.names, args.topic)
    if not names:
        raise usage_error("which topics? NAME... or --topic NAME")
    with _admin(args) as admin, cli_errors("cannot delete topics"):
        results = admin.delete_topics(names)
    failed = {name: err for name, err in results.items() if err is not None
              and not (args.if_exists and isinstance(err, UnknownTopicOrPartitionError))}
    for name in names:
        if name in results and results[name] is None:
            print(f"Deleted topic {name}.")
    if failed:
        raise CliError("cannot delete " + "; ".join(
            f"{name!r}: {describe_error(err)}" for name, err in failed.items()))
    return 0


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)
