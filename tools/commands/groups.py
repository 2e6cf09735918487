"""`tide groups list|describe G|delete G|reset-offsets|delete-offsets`: consumer groups,
as Kafka's ``kafka-consumer-groups.sh`` shows and changes them.

``describe`` prints one line per partition the group has committed or is assigned::

    GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID

(``-`` where there is no value) and, for a group without members, Kafka's note
"Consumer group 'G' has no active members." on stderr. ``--json`` prints the same as
one object.

``reset-offsets`` (``GROUP`` or ``--all-groups``; ``--topic T[:P,P...]``, repeatable, or
``--all-topics``: every partition the group has committed) takes exactly one of
``--to-earliest``, ``--to-latest``, ``--to-current``, ``--to-offset N``, ``--shift-by N``,
``--to-datetime YYYY-MM-DDTHH:mm:SS[.sss]`` (UTC unless it carries an offset) and
``--by-duration PnDTnHnMnS`` (ISO-8601, back from now), and prints the plan::

    GROUP  TOPIC  PARTITION  NEW-OFFSET

As Kafka, it is a dry run unless ``--execute`` (without ``--dry-run`` or ``--execute`` it
says so on stderr), offsets are clamped to the log, and the group must be empty.

``delete-offsets GROUP --topic T[:P,P...]`` is Kafka's ``--delete-offsets`` (OffsetDelete):
the group's committed offsets of those partitions go, when the group is empty or its
members do not subscribe to the topic. It prints ``TOPIC PARTITION STATUS`` (Successful,
or Error: CODE) and exits 1 when a partition's offset could not be deleted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from tidewater.client.group_admin import GroupAdmin
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


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("groups", help="list, describe, delete consumer groups; "
                                                  "reset their offsets")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="every consumer group")
    listing.add_argument("--json", action="store_true")
    add_bootstrap_argument(listing)
    listing.set_defaults(func=cmd_list)
    describe = actions.add_parser("describe", help="members, committed offsets and lag")
    describe.add_argument("group", metavar="GROUP")
    describe.add_argument("--json", action="store_true")
    add_bootstrap_argument(describe)
    describe.set_defaults(func=cmd_describe)
    delete = actions.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group", metavar="GROUP")
    add_bootstrap_argument(delete)
    delete.set_defaults(func=cmd_delete)
    reset = actions.add_parser("reset-offsets", help="move an empty group's committed offsets "
                                                     "(a dry run unless --execute)")
    reset.add_argument("group", metavar="GROUP", nargs="?")
    reset.add_argument("--all-groups", action="store_true", help="every group")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P...]",
                       help="a topic, or some of its partitions; repeatable")
    scope.add_argument("--all-topics", action="store_true",
                       help="every partition the group has committed offsets for")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-current", action="store_true")
    target.add_argument("--to-offset", type=int, metavar="N")
    target.add_argument("--shift-by", type=int, metavar="N", help="committed + N (N < 0: back)")
    target.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    target.add_argument("--by-duration", metavar="PnDTnHnMnS",
                        help="the first record at most this long ago (ISO-8601 duration)")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan only (default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    add_bootstrap_argument(reset)
    reset.set_defaults(func=cmd_reset_offsets)
    drop = actions.add_parser("delete-offsets",
                              help="delete a group's committed offsets of some topics")
    drop.add_argument("group", metavar="GROUP")
    drop.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,P...]",
                      help="a topic, or some of its partitions; repeatable")
    add_bootstrap_argument(drop)
    drop.set_defaults(func=cmd_delete_offsets)


def _admin(args: argparse.Namespace) -> GroupAdmin:
    return GroupAdmin(bootstrap_of(args), **security_of(args))


def cmd_list(args: argparse.Namespace) -> int:
    with cli_errors("cannot list groups"), _admin(args) as admin:
        groups = admin.list_groups()
    if args.json:
        print(json.dumps({"groups": [{"group": g.group_id, "state": g.state,
                                      "protocol_type": g.protocol_type} for g in groups]}))
    else:
        for g in groups:
            print(g.group_id)
    return 0


def _cell(value: object) -> str:
    return "-" if value is None or value == "" or value == -1 else str(value)


def cmd_describe(args: argparse.Namespace) -> int:
    with cli_errors(f"cannot describe group {args.group!r}"), _admin(args) as admin:
        d = admin.describe_group(args.group)
    members = {m.member_id: m for m in d.members}
    if args.json:
        print(json.dumps({
            "group": d.group_id, "state": d.state, "protocol": d.protocol,
            "members": [{"member_id": m.member_id, "client_id": m.client_id,
                         "host": m.client_host,
                         "partitions": [list(tp) for tp in m.partitions]} for m in d.members],
            "partitions": [{"topic": p.topic, "partition": p.partition,
                            "committed_offset": p.committed, "log_end_offset": p.log_end_offset,
                            "lag": p.lag, "member_id": p.member_id} for p in d.partitions]}))
        return 0
    if d.state == "Dead":
        raise CliError(f"group {args.group!r} does not exist")
    if not d.members:
        print(f"Consumer group '{d.group_id}' has no active members.", file=sys.stderr)
    header = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
              "CONSUMER-ID", "HOST", "CLIENT-ID")
    rows = [header]
    for p in d.partitions:
        m = members.get(p.member_id)
        rows.append((d.group_id, p.topic, str(p.partition), _cell(p.committed),
                     _cell(p.log_end_offset), _cell(p.lag), _cell(p.member_id),
                     _cell(m.client_host if m else None), _cell(m.client_id if m else None)))
    for m in d.members:  # members holding nothing still show, as Kafka prints them
        if not m.partitions:
            rows.append((d.group_id, "-", "-", "-", "-", "-", m.member_id,
                         _cell(m.client_host), _cell(m.client_id)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with cli_errors(f"cannot delete group {args.group!r}"), _admin(args) as admin:
        admin.delete_group(args.group)
    print(f"Deletion of requested consumer groups ('{args.group}') was successful.")
    return 0


def parse_datetime_ms(text: str) -> int:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--to-datetime: expected YYYY-MM-DDTHH:mm:SS[.sss], got {text!r}",
                       exit_code=2) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


# java.time.Duration.parse's form: PnDTnHnMn.nS, each part optional, signs allowed.
_DURATION = re.compile(r"([-+]?)P(?:([-+]?[0-9]+)D)?(?:T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?"
                       r"(?:([-+]?[0-9]+)(?:[.,]([0-9]{1,9}))?S)?)?", re.ASCII | re.IGNORECASE)


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration as Java's ``Duration.parse`` takes it
    (``P1D``, ``PT2H30M``, ``PT0.5S``); CliError (exit 2) otherwise."""
    m = _DURATION.fullmatch(text)
    if m is None or text.upper().endswith("T") or not any(m.group(i) for i in range(2, 6)):
        raise CliError(f"--by-duration: expected an ISO-8601 duration such as P1DT2H30M, "
                       f"got {text!r}", exit_code=2)
    sign, days, hours, minutes, seconds, fraction = m.groups()
    ms = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes or 0)) * 60_000
    seconds_ms = int(seconds or 0) * 1000
    if fraction:
        part = int(fraction.ljust(9, "0")[:3])
        seconds_ms += -part if (seconds or "").startswith("-") else part
    ms += seconds_ms
    return -ms if sign == "-" else ms


def parse_topic_partitions(specs: list[str]) -> dict[str, list[int] | None]:
    """``--topic`` values: ``t`` (every partition) or ``t:0,1`` -> {topic: partitions}."""
    chosen: dict[str, list[int] | None] = {}
    for spec in specs:
        topic, sep, listed = spec.partition(":")
        if not topic:
            raise CliError(f"--topic: no topic name in {spec!r}", exit_code=2)
        if not sep:
            chosen[topic] = None
            continue
        try:
            partitions = [int(p) for p in listed.split(",")]
        except ValueError:
            raise CliError(f"--topic: expected TOPIC:PARTITION[,PARTITION...], got {spec!r}",
                           exit_code=2) from None
        if any(p < 0 for p in partitions):
            raise CliError(f"--topic: negative partition in {spec!r}", exit_code=2)
        if topic in chosen and chosen[topic] is None:
            continue
        chosen[topic] = sorted(set(chosen.get(topic) or []) | set(partitions))
    return chosen


def _reset_target(args: argparse.Namespace) -> dict[str, Any]:
    if args.to_earliest:
        return {"to": "earliest"}
    if args.to_latest:
        return {"to": "latest"}
    if args.to_current:
        return {"to": "current"}
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise CliError("--to-offset must not be negative", exit_code=2)
        return {"to": "offset", "offset": args.to_offset}
    if args.shift_by is not None:
        return {"to": "shift", "shift": args.shift_by}
    if args.by_duration is not None:
        now_ms = int(time.time() * 1000)
        return {"to": "datetime", "timestamp_ms": now_ms - parse_duration_ms(args.by_duration)}
    return {"to": "datetime", "timestamp_ms": parse_datetime_ms(args.to_datetime)}


def cmd_reset_offsets(args: argparse.Namespace) -> int:
    if (args.group is None) == (not args.all_groups):
        raise CliError("reset-offsets needs a GROUP or --all-groups (not both)", exit_code=2)
    target = _reset_target(args)
    partitions = None if args.all_topics else parse_topic_partitions(args.topic)
    if not args.execute and not args.dry_run:
        print("WARN: No action will be performed as the --execute option is missing. "
              "Add --execute to commit the new offsets, or --dry-run to say a dry run is "
              "meant.", file=sys.stderr)
    rows: list[tuple[str, str, str, str]] = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
    with cli_errors("cannot reset offsets"), _admin(args) as admin:
        groups = ([g.group_id for g in admin.list_groups()] if args.all_groups
                  else [args.group])
        for group in groups:
            try:
                plan = admin.plan_reset(group, partitions, **target)
            except ValueError as e:
                raise CliError(f"cannot reset offsets of group {group!r}: {e}") from None
            if args.execute and plan:
                admin.commit_offsets(group, plan)
            rows += [(group, t, str(p), str(o)) for (t, p), o in sorted(plan.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_delete_offsets(args: argparse.Namespace) -> int:
    partitions = parse_topic_partitions(args.topic)
    with cli_errors(f"cannot delete offsets of group {args.group!r}"), _admin(args) as admin:
        results = admin.delete_offsets(args.group, partitions)
    rows = [("TOPIC", "PARTITION", "STATUS")]
    rows += [(t, str(p), "Successful" if code == pb.NONE else f"Error: {pb.ErrorCode.Name(code)}")
             for (t, p), code in sorted(results.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0 if all(code == pb.NONE for code in results.values()) else 1
