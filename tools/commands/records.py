"""`tide records delete` (kafka-delete-records.sh) and `tide log-dirs` (kafka-log-dirs.sh).

``records delete --offset-json-file FILE`` reads Kafka's file,
``{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}``
(offset -1: the high watermark), moves each partition's log start there and
prints each new low watermark, or the partition's error (the command then
fails). ``log-dirs --describe [--broker-list 1,2] [--topic-list a,b]`` prints
kafka-log-dirs.sh's JSON: per broker its log dir and each replica's size and
offset lag.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from tidewater.client.admin import AdminClient
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
    records = subparsers.add_parser("records", help="delete records below an offset")
    sub = records.add_subparsers(dest="records_command", metavar="ACTION")
    sub.required = True
    delete = sub.add_parser("delete", help="move partitions' log start (kafka-delete-records.sh)")
    delete.add_argument("--offset-json-file", required=True, metavar="FILE",
                        help='{"partitions": [{"topic": T, "partition": P, "offset": O}]}')
    delete.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(delete)
    delete.set_defaults(func=cmd_delete)

    log_dirs = subparsers.add_parser("log-dirs", help="replicas' sizes per broker "
                                                      "(kafka-log-dirs.sh)")
    log_dirs.add_argument("--describe", action="store_true", help="(the only action)")
    log_dirs.add_argument("--broker-list", metavar="1,2", help="default: every broker")
    log_dirs.add_argument("--topic-list", metavar="A,B", help="default: every topic")
    log_dirs.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(log_dirs)
    log_dirs.set_defaults(func=cmd_log_dirs)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(bootstrap_of(args), request_timeout_ms=args.timeout_ms,
                       **security_of(args))


def parse_offsets_json(text: str) -> dict[tuple[str, int], int]:
    """Kafka's offsets file; CliError (exit 2) when it is not one."""
    try:
        document: Any = json.loads(text)
        items = document["partitions"]
        offsets = {(str(p["topic"]), int(p["partition"])): int(p["offset"]) for p in items}
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"bad offsets JSON: {e!r}; expected "
                       '{"partitions": [{"topic": T, "partition": P, "offset": O}]}',
                       exit_code=2) from None
    if len(offsets) != len(items):
        raise CliError("bad offsets JSON: a partition is named twice", exit_code=2)
    return offsets


def cmd_delete(args: argparse.Namespace) -> int:
    try:
        with open(args.offset_json_file, encoding="utf-8") as f:
            offsets = parse_offsets_json(f.read())
    except OSError as e:
        raise CliError(f"cannot read {args.offset_json_file}: {e.strerror}") from None
    print("Executing records delete operation")
    with _admin(args) as admin, cli_errors("cannot delete records"):
        results = admin.delete_records(offsets)
    print("Records delete operation completed:")
    failed = []
    for (topic, number), result in sorted(results.items()):
        if isinstance(result, int):
            print(f"partition: {topic}-{number}\tlow_watermark: {result}")
        else:
            print(f"partition: {topic}-{number}\terror: {describe_error(result)}")
            failed.append(f"{topic}-{number}")
    if failed:
        raise CliError(f"records not deleted from {', '.join(failed)}")
    return 0


def _ids(text: str | None, what: str) -> set[int] | None:
    if not text:
        return None
    try:
        return {int(x) for x in text.split(",")}
    except ValueError:
        raise CliError(f"bad {what} {text!r}: expected ids like 1,2", exit_code=2) from None


def cmd_log_dirs(args: argparse.Namespace) -> int:
    brokers = _ids(args.broker_list, "--broker-list")
    topics = set(args.topic_list.split(",")) if args.topic_list else None
    print("Querying brokers for log directories information")
    with _admin(args) as admin, cli_errors("cannot describe log dirs"):
        described = admin.describe_log_dirs()
    shown = {b: d for b, d in described.items() if brokers is None or b in brokers}
    print("Received log directory information from brokers "
          + ",".join(str(b) for b in sorted(shown)))
    print(json.dumps({"brokers": [
        {"broker": broker_id, "logDirs": [{
            "logDir": log_dir, "error": None, "partitions": [
                {"partition": f"{topic}-{number}", "size": size, "offsetLag": lag,
                 "isFuture": False}
                for (topic, number), (size, lag) in sorted(replicas.items())
                if topics is None or topic in topics]}]}
        for broker_id, (log_dir, replicas) in sorted(shown.items())], "version": 1}))
    return 0
