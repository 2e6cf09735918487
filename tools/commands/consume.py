"""`tide consume TOPIC`: print records of one or all partitions.

Plain output prints each value (``--print-key``: key, separator, value);
``--json`` prints one object per record: topic, partition, offset, key, value,
timestamp, leader_epoch, headers. Stops with exit 0 after ``--max-messages``
records or ``--timeout-ms`` without new data.
"""

from __future__ import annotations

import json
import sys
import time

from tidewater.client.consumer import Consumer, ConsumerRecord
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import bootstrap_of, cli_errors
from tidewater.tools.commands.produce import decode_text


def register(subparsers) -> None:
    parser = subparsers.add_parser("consume", help="print records")
    parser.add_argument("topic")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start")
    start.add_argument("--offset", type=int, default=None, help="start at this offset")
    parser.add_argument("--partition", type=int, default=None, help="default: every partition")
    parser.add_argument("--max-messages", type=int, default=None, metavar="N")
    parser.add_argument("--timeout-ms", type=int, default=None,
                        help="stop after this long without new records (default: never)")
    parser.add_argument("--json", action="store_true", help="one JSON object per record")
    parser.add_argument("--print-key", action="store_true")
    parser.add_argument("--key-separator", default="\t", metavar="SEP")
    parser.set_defaults(func=cmd_consume)


def record_to_json(r: ConsumerRecord) -> dict:
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


def cmd_consume(args) -> int:
    if args.max_messages is not None and args.max_messages <= 0:
        raise CliError("--max-messages must be positive", exit_code=2)
    if args.offset is not None and args.offset < 0:
        raise CliError("--offset must be >= 0", exit_code=2)
    out = sys.stdout.buffer
    key_separator = args.key_separator.encode()
    printed = 0
    with cli_errors(f"cannot consume from {args.topic!r}"), \
            Consumer(bootstrap_of(args), auto_offset_reset="earliest") as consumer:
        partitions = consumer.partitions_for(args.topic)
        if args.partition is not None:
            if args.partition not in partitions:
                raise CliError(f"cannot consume from {args.topic!r}: no partition {args.partition} "
                               f"(topic has {len(partitions)})")
            partitions = [args.partition]
        tps = [(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_end()
        last_data = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            poll_ms = 500 if args.timeout_ms is None else max(
                1, min(500, int(args.timeout_ms - (time.monotonic() - last_data) * 1000)))
            remaining = None if args.max_messages is None else args.max_messages - printed
            records = consumer.poll(poll_ms, max_records=remaining)
            if records:
                last_data = time.monotonic()
                for r in records:
                    out.write(format_record(r, as_json=args.json, print_key=args.print_key,
                                            key_separator=key_separator))
                printed += len(records)
                out.flush()
            elif args.timeout_ms is not None and (time.monotonic() - last_data) * 1000 >= args.timeout_ms:
                break
    return 0
