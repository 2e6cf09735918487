"""`tide consume TOPIC`: print records of one or all partitions.

Plain output prints each value (``--print-key``: key, separator, value);
``--json`` prints one object per record: topic, partition, offset, key, value,
timestamp, leader_epoch, headers. Stops with exit 0 after ``--max-messages``
records or ``--timeout-ms`` without new data.

Where to start follows Kafka's console consumer: at the end unless
``--from-beginning`` or ``--offset earliest|latest|N`` (which needs
``--partition``). An offset N outside the partition's offsets starts at the end,
as Kafka's does (its reset policy is ``latest``), and a note on stderr says so.
Kafka's ``--topic``, ``--property print.key=true`` and ``--property
key.separator=SEP`` work too (kafka_flags.py).

``--isolation-level read_committed`` prints only committed transactions' records
(and nothing at or past a transaction still open); the default,
``read_uncommitted``, prints every record (Kafka's ``isolation.level``).

``--group G`` consumes as a member of consumer group G (``tide groups``): the group
shares the topic's partitions among its members, each starts at the group's committed
offset (``--from-beginning``: the log start where the group has none, else the end),
and the offsets of what was printed are committed after each batch and at exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from tidewater.client.consumer import Consumer, ConsumerRecord
from tidewater.client.metadata import TopicPartition
from tidewater.proto.errors import TidewaterError
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    security_of,
)
from tidewater.tools.commands.kafka_flags import (
    consume_key_format,
    parse_offset,
    resolve_topic,
    usage_error,
)
from tidewater.tools.commands.produce import decode_text

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("consume", help="print records")
    parser.add_argument("topic", nargs="?", metavar="TOPIC", help="or --topic TOPIC")
    parser.add_argument("--topic", dest="topic_flag", metavar="TOPIC", help="the topic, as Kafka's tools name it")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start")
    start.add_argument("--offset", type=parse_offset, default=None, metavar="earliest|latest|N",
                       help="where to start in --partition (default: latest, the end)")
    parser.add_argument("--partition", type=int, default=None, help="default: every partition")
    parser.add_argument("--group", default=None, metavar="GROUP",
                        help="consume as a member of this consumer group, committing as it goes")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted",
                        help="read_committed: only committed transactions' records")
    parser.add_argument("--max-messages", type=int, default=None, metavar="N", help="stop after N records")
    parser.add_argument("--timeout-ms", type=int, default=None,
                        help="stop after this long without new records (default: never)")
    parser.add_argument("--json", action="store_true", help="one JSON object per record")
    parser.add_argument("--print-key", action="store_true", help="print KEY<SEP>VALUE")
    parser.add_argument("--key-separator", default=None, metavar="SEP", help="default: a tab")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                        help="Kafka's console-consumer properties: print.key=true, key.separator=SEP")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=cmd_consume)


def record_to_json(r: ConsumerRecord) -> dict[str, object]:
    return {
        "topic": r.topic, "partition": r.partition, "offset": r.offset,
        "key": decode_text(r.key), "value": decode_text(r.value), "timestamp": r.timestamp,
        "leader_epoch": r.leader_epoch,
        "headers": [[name, decode_text(value)] for name, value in r.headers],
    }


def format_record(r: ConsumerRecord, *, as_json: bool, print_key: bool, key_separator: bytes) -> bytes:
    """One output line (with newline). Plain output writes the raw bytes of key and value."""
    if as_json:
        return json.dumps(record_to_json(r)).encode() + b"\n"
    value = r.value or b""
    if print_key:
        return (r.key or b"") + key_separator + value + b"\n"
    return value + b"\n"


def cmd_consume(args: argparse.Namespace) -> int:
    topic = resolve_topic(args.topic, args.topic_flag)
    if args.max_messages is not None and args.max_messages <= 0:
        raise CliError("--max-messages must be positive", exit_code=2)
    if args.offset is not None and args.partition is None:
        raise usage_error("--offset needs --partition (an offset means something in one partition)")
    print_key, key_separator = consume_key_format(args.print_key, args.key_separator, args.property)
    # Kafka's console consumer resets an out-of-range offset to the end, unless --from-beginning.
    reset = "latest" if isinstance(args.offset, int) else "earliest"
    if args.group is not None:
        if args.partition is not None or args.offset is not None:
            raise usage_error("--group takes the group's partitions and offsets: not with "
                              "--partition or --offset")
        return consume_in_group(args, topic, print_key, key_separator)
    with cli_errors(f"cannot consume from {topic!r}"), \
            Consumer(bootstrap_of(args), auto_offset_reset=reset,
                     isolation_level=args.isolation_level, **security_of(args)) as consumer:
        partitions = consumer.partitions_for(topic)
        if args.partition is not None:
            if args.partition not in partitions:
                raise CliError(f"cannot consume from {topic!r}: no partition {args.partition} "
                               f"(topic has {len(partitions)})")
            partitions = [args.partition]
        tps = [(topic, p) for p in partitions]
        consumer.assign(tps)
        if isinstance(args.offset, int):
            seek_offset(consumer, TopicPartition(topic, args.partition), args.offset)
        elif args.from_beginning or args.offset == "earliest":
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_end()
        print_records(consumer, args, print_key, key_separator)
    return 0


def consume_in_group(args: argparse.Namespace, topic: str, print_key: bool, key_separator: str) -> int:
    reset = "earliest" if args.from_beginning else "latest"
    with cli_errors(f"cannot consume from {topic!r} in group {args.group!r}"), \
            Consumer(bootstrap_of(args), auto_offset_reset=reset, group_id=args.group,
                     isolation_level=args.isolation_level,
                     client_id="tide-consume", enable_auto_commit=False,
                     **security_of(args)) as consumer:
        consumer.partitions_for(topic)  # an unknown topic fails here, with its name
        consumer.subscribe([topic])
        try:
            print_records(consumer, args, print_key, key_separator, commit=True)
        finally:
            try:
                consumer.commit()
            except TidewaterError:
                pass  # the group moved on: the partitions' next owner reads them again
    return 0


def print_records(consumer: Consumer, args: argparse.Namespace, print_key: bool, key_separator: str, *,
                  commit: bool = False) -> None:
    """Poll and print until --max-messages or --timeout-ms; with ``commit``, the printed
    records' offsets are committed after each batch (at least once: printed first)."""
    out = sys.stdout.buffer
    printed = 0
    last_data = time.monotonic()
    while args.max_messages is None or printed < args.max_messages:
        poll_ms = 500 if args.timeout_ms is None else max(
            1, min(500, int(args.timeout_ms - (time.monotonic() - last_data) * 1000)))
        remaining = None if args.max_messages is None else args.max_messages - printed
        records = consumer.poll(poll_ms, max_records=remaining)
        if records:
            last_data = time.monotonic()
            for r in records:
                out.write(format_record(r, as_json=args.json, print_key=print_key,
                                        key_separator=key_separator.encode()))
            printed += len(records)
            out.flush()
            if commit:
                try:
                    consumer.commit()
                except TidewaterError:
                    pass  # a rebalance: the next poll rejoins; the records come again
        elif args.timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= args.timeout_ms:
            break


def start_position(offset: int, log_start: int, log_end: int) -> int:
    """Where ``--offset offset`` starts: there, or at the end when the partition holds no
    such offset (Kafka's console consumer: reset policy latest)."""
    return offset if log_start <= offset <= log_end else log_end


def seek_offset(consumer: Consumer, tp: TopicPartition, offset: int) -> None:
    """Seek to ``offset``, or to the end with a note on stderr when it is out of range."""
    starts = consumer.beginning_offsets([tp])
    ends = consumer.end_offsets([tp])
    if tp not in starts or tp not in ends:
        # No leader answered: the reset policy (latest) covers an out-of-range offset.
        consumer.seek(tp, offset)
        return
    position = start_position(offset, starts[tp], ends[tp])
    if position != offset:
        print(f"tide: note: offset {offset} is not in {tp.topic}-{tp.partition} (log start {starts[tp]}, "
              f"end {ends[tp]}): starting at the end, {position}, as Kafka's console consumer does "
              "(--offset earliest starts at the first)", file=sys.stderr, flush=True)
    consumer.seek(tp, position)
