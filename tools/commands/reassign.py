"""`tide reassign generate|execute|verify|cancel` (kafka-reassign-partitions.sh).

The JSON files are Kafka's:

* ``--topics-to-move-json-file``: ``{"version": 1, "topics": [{"topic": "t"}]}``
* ``--reassignment-json-file``: ``{"version": 1, "partitions": [{"topic": "t",
  "partition": 0, "replicas": [1, 2, 3]}]}`` (``log_dirs`` is taken and ignored:
  one data directory per broker)

``generate --topics-to-move-json-file F --broker-list 1,2,3`` prints the current
assignment and a proposed one over the listed brokers (same replication factor,
spread as a new topic's); it changes nothing. ``execute --reassignment-json-file F``
prints the current assignment (to keep for a rollback) and starts the moves
(AlterPartitionReassignments). ``verify`` says per partition whether its move is
completed or still in progress (exit 1 while any is in progress or failed).
``cancel`` (Kafka's ``--cancel``) reverts the ongoing moves of the file's
partitions.

``execute --throttle BYTES_PER_S`` throttles the copying as Kafka's tool does: the
rate goes into ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` of every broker of the moving partitions
(old and new replicas), and each moving topic gets
``leader.replication.throttled.replicas`` (its current replicas) and
``follower.replication.throttled.replicas`` (the replicas being added), as
``PARTITION:BROKER`` lists. (Only the follower side has an effect here.) ``verify``
removes all of them once every move of the file is complete ("Throttle was
removed.").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidewater.client.admin import BROKER_RESOURCE, TOPIC_RESOURCE, AdminClient, ConfigOp
from tidewater.controller.assignment import assign_replicas
from tidewater.proto.errors import TidewaterError
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

REASSIGNMENT_ITEMS_MAX = 10_000
BROKER_THROTTLES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
TOPIC_THROTTLES = ("leader.replication.throttled.replicas",
                   "follower.replication.throttled.replicas")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("reassign", help="move partitions to other brokers "
                                                    "(kafka-reassign-partitions.sh)")
    sub = parser.add_subparsers(dest="reassign_command", metavar="ACTION")
    sub.required = True
    generate = sub.add_parser("generate", help="propose an assignment over a broker list")
    generate.add_argument("--topics-to-move-json-file", required=True, metavar="FILE")
    generate.add_argument("--broker-list", required=True, metavar="1,2,3")
    generate.set_defaults(func=cmd_generate)
    for action, helptext, func in (
            ("execute", "start the moves of a reassignment file", cmd_execute),
            ("verify", "are the moves of a reassignment file complete?", cmd_verify),
            ("cancel", "revert the ongoing moves of a reassignment file", cmd_cancel)):
        p = sub.add_parser(action, help=helptext)
        p.add_argument("--reassignment-json-file", required=True, metavar="FILE")
        p.set_defaults(func=func)
        if action == "execute":
            p.add_argument("--throttle", type=int, metavar="BYTES_PER_S",
                           help="cap the copying (follower.replication.throttled.rate)")
    for p in (generate, *(sub.choices[a] for a in ("execute", "verify", "cancel"))):
        p.add_argument("--timeout-ms", type=int, default=30000)
        add_bootstrap_argument(p)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), request_timeout_ms=args.timeout_ms,
                       **security_of(args))


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}", exit_code=2) from None
    except json.JSONDecodeError as e:
        raise CliError(f"{path} is not JSON: {e}", exit_code=2) from None


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in value):
        raise CliError(f"{what}: expected a list of broker ids, got {value!r}", exit_code=2)
    return value


def read_reassignment(path: str) -> dict[tuple[str, int], list[int]]:
    """Kafka's reassignment JSON: (topic, partition) -> target replicas."""
    data = _read_json(path)
    items = data.get("partitions") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise CliError(f"{path}: expected {{\"partitions\": [...]}} with at least one "
                       "partition", exit_code=2)
    if len(items) > REASSIGNMENT_ITEMS_MAX:
        raise CliError(f"{path}: more than {REASSIGNMENT_ITEMS_MAX} partitions", exit_code=2)
    out: dict[tuple[str, int], list[int]] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("topic"), str) or not (
                isinstance(item.get("partition"), int)):
            raise CliError(f"{path}: each partition needs \"topic\" and \"partition\", got "
                           f"{item!r}", exit_code=2)
        key = (item["topic"], item["partition"])
        if key in out:
            raise CliError(f"{path}: partition {key[0]}-{key[1]} appears twice", exit_code=2)
        out[key] = _int_list(item.get("replicas"), f"{key[0]}-{key[1]}")
    return out


def _assignment_json(assignment: dict[tuple[str, int], list[int]]) -> str:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": n, "replicas": replicas,
         "log_dirs": ["any"] * len(replicas)}
        for (t, n), replicas in sorted(assignment.items())]})


def _current(admin: AdminClient, topics: list[str]) -> dict[tuple[str, int], list[int]]:
    """The partitions' replicas now (mid-reassignment: the target, as Kafka prints it)."""
    ongoing = admin.list_partition_reassignments()
    out = {}
    for t in admin.describe_topics(topics, with_replica_state=False):
        for p in t.partitions:
            moving = ongoing.get((t.name, p.partition))
            out[(t.name, p.partition)] = [r for r in p.replicas if moving is None
                                          or r not in moving.removing_replicas]
    return out


def cmd_generate(args: argparse.Namespace) -> int:
    data = _read_json(args.topics_to_move_json_file)
    entries = data.get("topics") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and isinstance(e.get("topic"), str) for e in entries):
        raise CliError(f"{args.topics_to_move_json_file}: expected {{\"topics\": "
                       "[{\"topic\": NAME}, ...]}", exit_code=2)
    try:
        brokers = sorted({int(b) for b in args.broker_list.split(",") if b.strip()})
    except ValueError:
        raise CliError(f"bad --broker-list {args.broker_list!r}: expected 1,2,3",
                       exit_code=2) from None
    topics = list(dict.fromkeys(e["topic"] for e in entries))
    with _admin(args) as admin, cli_errors("cannot generate a reassignment"):
        known = {b.broker_id for b in admin.describe_cluster().brokers}
        unknown = [b for b in brokers if b not in known]
        if unknown:
            raise CliError(f"--broker-list names brokers that are not registered: {unknown}",
                           exit_code=2)
        current = _current(admin, topics)
    proposed: dict[tuple[str, int], list[int]] = {}
    for sequence, topic in enumerate(topics):
        numbers = sorted(n for t, n in current if t == topic)
        factor = len(current[(topic, numbers[0])])
        if factor > len(brokers):
            raise CliError(f"topic {topic} has replication factor {factor}, more than the "
                           f"{len(brokers)} brokers listed", exit_code=2)
        for n, replicas in zip(numbers, assign_replicas(brokers, len(numbers), factor,
                                                        topic_sequence=sequence), strict=True):
            proposed[(topic, n)] = list(replicas)
    print("Current partition replica assignment")
    print(_assignment_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(_assignment_json(proposed))
    return 0


def cmd_execute(args: argparse.Namespace) -> int:
    targets = read_reassignment(args.reassignment_json_file)
    with _admin(args) as admin, cli_errors("cannot start the reassignment"):
        current = _current(admin, sorted({t for t, _ in targets}))
        missing = [f"{t}-{n}" for t, n in targets if (t, n) not in current]
        if missing:
            raise CliError("unknown partitions: " + ", ".join(missing))
        if args.throttle is not None:
            if args.throttle <= 0:
                raise CliError("--throttle must be a positive number of bytes/s", exit_code=2)
            _set_throttles(admin, current, targets, args.throttle)
        results = admin.alter_partition_reassignments(dict(targets))
    print("Current partition replica assignment")
    print()
    print(_assignment_json({k: current[k] for k in targets}))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    return _report(results, "Successfully started partition reassignments for ",
                   "reassignment refused for ")


def cmd_verify(args: argparse.Namespace) -> int:
    targets = read_reassignment(args.reassignment_json_file)
    with _admin(args) as admin, cli_errors("cannot verify the reassignment"):
        ongoing = admin.list_partition_reassignments()
        described = {(t.name, p.partition): list(p.replicas)
                     for t in admin.describe_topics(sorted({t for t, _ in targets}),
                                                    with_replica_state=False)
                     for p in t.partitions}
    print("Status of partition reassignment:")
    done = True
    complete = True
    for (topic, number), target in sorted(targets.items()):
        name = f"{topic}-{number}"
        if (topic, number) in ongoing:
            print(f"Reassignment of partition {name} is still in progress.")
            done = complete = False
        elif described.get((topic, number)) == target:
            print(f"Reassignment of partition {name} is completed.")
        else:
            print(f"There is no active reassignment of partition {name}, but replica set is "
                  f"{described.get((topic, number))} rather than {target}.")
            done = False
    if complete:
        with _admin(args) as admin, cli_errors("cannot remove the throttles"):
            if _clear_throttles(admin, sorted({t for t, _ in targets})):
                print("Throttle was removed.")
    return 0 if done else 1


def _set_throttles(admin: AdminClient, current: dict[tuple[str, int], list[int]],
                   targets: dict[tuple[str, int], list[int]], rate: int) -> None:
    leaders: dict[str, list[str]] = {}
    followers: dict[str, list[str]] = {}
    brokers: set[int] = set()
    for (topic, number), target in targets.items():
        now = current[(topic, number)]
        brokers.update(now, target)
        leaders.setdefault(topic, []).extend(f"{number}:{b}" for b in now)
        followers.setdefault(topic, []).extend(f"{number}:{b}" for b in target if b not in now)
    for broker_id in sorted(brokers):
        admin.alter_configs(BROKER_RESOURCE, str(broker_id),
                            [ConfigOp(name, "SET", str(rate)) for name in BROKER_THROTTLES])
    for topic in sorted(leaders):
        ops = [ConfigOp(TOPIC_THROTTLES[0], "SET", ",".join(leaders[topic]))]
        if followers[topic]:
            ops.append(ConfigOp(TOPIC_THROTTLES[1], "SET", ",".join(followers[topic])))
        admin.alter_configs(TOPIC_RESOURCE, topic, ops)
    print(f"The inter-broker throttle limit was set to {rate} B/s")


def _clear_throttles(admin: AdminClient, topics: list[str]) -> bool:
    """Remove the throttle configs (every broker's rates, the topics' replica lists);
    True when there was any."""
    removed = False
    for broker in admin.describe_cluster().brokers:
        own = admin.describe_dynamic_configs(BROKER_RESOURCE, str(broker.broker_id))
        names = [n for n in BROKER_THROTTLES if n in own]
        if names:
            admin.alter_configs(BROKER_RESOURCE, str(broker.broker_id),
                                [ConfigOp(n, "DELETE") for n in names])
            removed = True
    for topic in topics:
        own = admin.describe_dynamic_configs(TOPIC_RESOURCE, topic)
        names = [n for n in TOPIC_THROTTLES if n in own]
        if names:
            admin.alter_configs(TOPIC_RESOURCE, topic, [ConfigOp(n, "DELETE") for n in names])
            removed = True
    return removed


def cmd_cancel(args: argparse.Namespace) -> int:
    targets = read_reassignment(args.reassignment_json_file)
    with _admin(args) as admin, cli_errors("cannot cancel the reassignment"):
        results = admin.alter_partition_reassignments({tp: None for tp in targets})
    return _report(results, "Successfully cancelled partition reassignments for: ",
                   "cancel refused for ")


def _report(results: Mapping[tuple[str, int], TidewaterError | None], done: str,
            refused: str) -> int:
    """Print the partitions whose change was taken after ``done``; raise a CliError
    naming each refused one after ``refused``; 0 when none was."""
    taken = [f"{t}-{n}" for (t, n), e in sorted(results.items()) if e is None]
    failed = {tp: e for tp, e in sorted(results.items()) if e is not None}
    if taken:
        print(done + ",".join(taken))
    if failed:
        raise CliError(refused + "; ".join(
            f"{t}-{n}: {describe_error(e)}" for (t, n), e in failed.items()))
    return 0
