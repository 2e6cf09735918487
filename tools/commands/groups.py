"""`tide groups list|describe G|delete G|reset-offsets G`: consumer groups, as Kafka's
``kafka-consumer-groups.sh`` shows and changes them.

``describe`` prints one line per partition the group has committed or is assigned::

    GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID

(``-`` where there is no value) and, for a group without members, Kafka's note
"Consumer group 'G' has no active members." on stderr. ``--json`` prints the same as
one object. ``reset-offsets`` needs exactly one of ``--to-earliest``, ``--to-latest``,
``--to-offset N``, ``--to-datetime YYYY-MM-DDTHH:mm:SS[.sss]`` (UTC unless it carries
an offset), prints the new offsets, and commits them unless ``--dry-run``; the group
must be empty.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import TYPE_CHECKING

from tidewater.client.group_admin import GroupAdmin
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
    reset = actions.add_parser("reset-offsets", help="move an empty group's committed offsets")
    reset.add_argument("group", metavar="GROUP")
    reset.add_argument("--topic", required=True, metavar="TOPIC")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int, metavar="N")
    target.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    reset.add_argument("--dry-run", action="store_true", help="print, do not commit")
    add_bootstrap_argument(reset)
    reset.set_defaults(func=cmd_reset_offsets)


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


def cmd_reset_offsets(args: argparse.Namespace) -> int:
    offset: int | None = None
    timestamp_ms: int | None = None
    if args.to_earliest:
        to = "earliest"
    elif args.to_latest:
        to = "latest"
    elif args.to_offset is not None:
        if args.to_offset < 0:
            raise CliError("--to-offset must not be negative", exit_code=2)
        to, offset = "offset", args.to_offset
    else:
        to, timestamp_ms = "datetime", parse_datetime_ms(args.to_datetime)
    with cli_errors(f"cannot reset offsets of group {args.group!r}"), _admin(args) as admin:
        targets = admin.reset_offsets(args.group, args.topic, to=to, offset=offset,
                                      timestamp_ms=timestamp_ms, dry_run=args.dry_run)
    print("GROUP  TOPIC  PARTITION  NEW-OFFSET")
    for partition, offset in sorted(targets.items()):
        print(f"{args.group}  {args.topic}  {partition}  {offset}")
    return 0
