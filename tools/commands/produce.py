"""`tide produce TOPIC`: each line of stdin becomes one record.

With ``--key-separator SEP`` a line is ``KEY<SEP>VALUE``. With ``--ack-log FILE``
every acknowledged record is appended to FILE as one JSON line
``{"topic", "partition", "offset", "key", "value", "acks"}`` (flushed as it is
acknowledged, so a crash loses no acknowledgement that was written). Exits
non-zero when any record failed, saying how many.
"""

from __future__ import annotations

import json
import sys
import threading

from tidewater.client.producer import Producer, RecordMetadata, parse_acks
from tidewater.proto.errors import TidewaterError
from tidewater.proto.records import COMPRESSION_BY_NAME
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import bootstrap_of, cli_errors, describe_error


def register(subparsers) -> None:
    parser = subparsers.add_parser("produce", help="write stdin lines as records")
    parser.add_argument("topic")
    parser.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"],
                        help="0: no wait, 1: leader wrote it, all: the ISR has it (default)")
    parser.add_argument("--partition", type=int, default=None, help="default: by key hash, else sticky")
    parser.add_argument("--key-separator", default=None, metavar="SEP",
                        help="split each line at the first SEP into key and value")
    parser.add_argument("--ack-log", default=None, metavar="FILE",
                        help="append one JSON line per acknowledged record")
    parser.add_argument("--batch-size", type=int, default=16384, metavar="BYTES")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--compression", default="none", choices=list(COMPRESSION_BY_NAME),
                        help="batch compression, Kafka's codecs (default: none)")
    parser.add_argument("--timeout-ms", type=int, default=30000,
                        help="give up on a record not acknowledged within this time")
    parser.set_defaults(func=cmd_produce)


def decode_text(data: bytes | None) -> str | None:
    """Bytes as text for JSON; undecodable bytes survive as surrogate escapes."""
    return None if data is None else data.decode("utf-8", errors="surrogateescape")


def ack_log_line(meta: RecordMetadata, key: bytes | None, value: bytes | None, acks: str) -> str:
    """One line of the ack log (with its newline)."""
    return json.dumps({
        "topic": meta.topic, "partition": meta.partition, "offset": meta.offset,
        "key": decode_text(key), "value": decode_text(value), "acks": acks,
    }) + "\n"


def split_line(line: bytes, separator: bytes | None) -> tuple[bytes | None, bytes]:
    """A stdin line (without newline) -> (key, value); raises ValueError without the separator."""
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise ValueError(f"no key separator {separator.decode(errors='replace')!r} in line")
    return key, value


class _Results:
    """Counts outcomes and writes the ack log from the producer's callbacks."""

    def __init__(self, ack_log, acks_label: str):
        self.ack_log = ack_log
        self.acks_label = acks_label
        self.lock = threading.Lock()
        self.acked = 0
        self.failed = 0
        self.first_error: str | None = None

    def record_failure(self, reason: str) -> None:
        with self.lock:
            self.failed += 1
            if self.first_error is None:
                self.first_error = reason

    def callback(self, key, value):
        def done(fut):
            exc = fut.exception()
            if exc is not None:
                self.record_failure(describe_error(exc) if isinstance(exc, TidewaterError) else str(exc))
                return
            meta = fut.result()
            with self.lock:
                self.acked += 1
                if self.ack_log is not None:
                    self.ack_log.write(ack_log_line(meta, key, value, self.acks_label))
                    self.ack_log.flush()
        return done


def cmd_produce(args) -> int:
    acks_label = "all" if args.acks in ("all", "-1") else args.acks
    separator = args.key_separator.encode() if args.key_separator is not None else None
    if separator == b"":
        raise CliError("--key-separator must not be empty", exit_code=2)
    try:
        ack_log = open(args.ack_log, "a", encoding="utf-8", errors="surrogateescape") if args.ack_log else None
    except OSError as e:
        raise CliError(f"cannot open ack log {args.ack_log}: {e.strerror}") from None
    results = _Results(ack_log, acks_label)
    with cli_errors(f"cannot produce to {args.topic!r}"):
        producer = Producer(bootstrap_of(args), acks=parse_acks(args.acks),
                            batch_size_bytes=args.batch_size, linger_ms=args.linger_ms,
                            request_timeout_ms=min(args.timeout_ms, 30000),
                            delivery_timeout_ms=args.timeout_ms, max_block_ms=args.timeout_ms,
                            compression=COMPRESSION_BY_NAME[args.compression])
        try:
            total = 0
            for line_number, raw in enumerate(sys.stdin.buffer, start=1):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                if line.endswith(b"\r"):
                    line = line[:-1]
                total += 1
                try:
                    key, value = split_line(line, separator)
                except ValueError as e:
                    results.record_failure(f"line {line_number}: {e}")
                    continue
                fut = producer.send(args.topic, value, key=key, partition=args.partition)
                fut.add_done_callback(results.callback(key, value))
            producer.flush()
        finally:
            producer.close()
            if ack_log is not None:
                ack_log.close()
    if results.failed:
        raise CliError(f"{results.failed} of {total} records failed (first: {results.first_error})")
    return 0
