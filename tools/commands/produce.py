"""`tide produce TOPIC`: each line of stdin becomes one record.

With ``--key-separator SEP`` a line is ``KEY<SEP>VALUE``. Kafka's console
producer flags work too (kafka_flags.py): ``--topic TOPIC``, ``--property
parse.key=true`` with ``--property key.separator=SEP`` (a tab by default) and
``--producer-property acks|compression.type|linger.ms|batch.size|enable.idempotence=VALUE``. With ``--ack-log FILE``
every acknowledged record is appended to FILE as one JSON line
``{"topic", "partition", "offset", "key", "value", "acks"}`` (flushed as it is
acknowledged, so a crash loses no acknowledgement that was written). Exits
non-zero when any record failed, saying how many.

With ``--transactional-id ID`` the records are written in transactions (Tidewater's
transactional producer; acks=all): all of stdin in one, or one per
``--records-per-transaction N`` lines. A transaction with a failed record is aborted
(its records count as failed); the ack log gets a transaction's records only once it
has committed. A fence (another producer took the id) ends the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO, TypedDict

from tidewater.client.producer import Producer, RecordFuture, RecordMetadata, parse_acks
from tidewater.client.transactions import TransactionAbortRequiredError
from tidewater.proto.compression import COMPRESSION_BY_NAME
from tidewater.proto.errors import TidewaterError
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    describe_error,
    security_of,
)
from tidewater.tools.commands.kafka_flags import (
    produce_key_separator,
    producer_options,
    resolve_topic,
    usage_error,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers

# Options Kafka's --producer-property may also set; None in argparse means "not typed".
DEFAULT_ACKS = "all"
DEFAULT_COMPRESSION = "none"
DEFAULT_LINGER_MS = 5
DEFAULT_BATCH_SIZE_BYTES = 16384


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("produce", help="write stdin lines as records")
    parser.add_argument("topic", nargs="?", metavar="TOPIC", help="or --topic TOPIC")
    parser.add_argument("--topic", dest="topic_flag", metavar="TOPIC", help="the topic, as Kafka's tools name it")
    parser.add_argument("--acks", default=None, choices=["0", "1", "all", "-1"],
                        help="0: no wait, 1: leader wrote it, all: the ISR has it (default)")
    parser.add_argument("--partition", type=int, default=None, help="default: by key hash, else sticky")
    parser.add_argument("--key-separator", default=None, metavar="SEP",
                        help="split each line at the first SEP into key and value")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                        help="Kafka's console-producer properties: parse.key=true splits lines at "
                             "key.separator (default: a tab)")
    parser.add_argument("--producer-property", action="append", default=[], metavar="NAME=VALUE",
                        help="Kafka's producer configs acks, compression.type, linger.ms, batch.size, "
                             "enable.idempotence")
    parser.add_argument("--ack-log", default=None, metavar="FILE",
                        help="append one JSON line per acknowledged record")
    parser.add_argument("--batch-size", type=int, default=None, metavar="BYTES",
                        help=f"default: {DEFAULT_BATCH_SIZE_BYTES}")
    parser.add_argument("--linger-ms", type=int, default=None, help=f"default: {DEFAULT_LINGER_MS}")
    parser.add_argument("--compression", default=None, choices=list(COMPRESSION_BY_NAME),
                        help="batch compression, Kafka's codecs (default: none)")
    parser.add_argument("--transactional-id", default=None, metavar="ID",
                        help="write in transactions of this transactional id (acks=all)")
    parser.add_argument("--records-per-transaction", type=int, default=None, metavar="N",
                        help="with --transactional-id: commit every N records "
                             "(default: all of stdin in one transaction)")
    parser.add_argument("--timeout-ms", type=int, default=30000,
                        help="give up on a record not acknowledged within this time")
    add_bootstrap_argument(parser)
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

    def __init__(self, ack_log: TextIO | None, acks_label: str, *,
                 transactional: bool = False) -> None:
        self.ack_log = ack_log
        self.acks_label = acks_label
        self.transactional = transactional  # acks count (and are logged) once committed
        self.lock = threading.Lock()
        self.acked = 0
        self.failed = 0
        self.first_error: str | None = None
        self.pending: list[str] = []  # ack-log lines of the open transaction's acked records

    def end_transaction(self, committed: bool, reason: str = "") -> None:
        """The open transaction's acked records count as acked (committed) or failed."""
        with self.lock:
            pending, self.pending = self.pending, []
            if not committed:
                self.failed += len(pending)
                if self.first_error is None:
                    self.first_error = reason
                return
            self.acked += len(pending)
            if self.ack_log is not None and pending:
                self.ack_log.write("".join(pending))
                self.ack_log.flush()

    def record_failure(self, reason: str) -> None:
        with self.lock:
            self.failed += 1
            if self.first_error is None:
                self.first_error = reason

    def record_failures(self, count: int, error: BaseException | None) -> None:
        """``count`` records the producer could not deliver, ``error`` the first's."""
        if count == 0 or error is None:
            return
        with self.lock:
            self.failed += count
            if self.first_error is None:
                self.first_error = _reason(error)

    def callback(self, key: bytes | None, value: bytes | None) -> Callable[[RecordFuture], None]:
        def done(fut: RecordFuture) -> None:
            exc = fut.exception()
            if exc is not None:
                self.record_failure(_reason(exc))
                return
            meta = fut.result()
            with self.lock:
                if self.transactional:
                    self.pending.append(ack_log_line(meta, key, value, self.acks_label))
                    return
                self.acked += 1
                if self.ack_log is not None:
                    self.ack_log.write(ack_log_line(meta, key, value, self.acks_label))
                    self.ack_log.flush()
        return done


def _reason(error: BaseException) -> str:
    """A failed record's error as the summary line words it."""
    return describe_error(error) if isinstance(error, TidewaterError) else str(error)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _non_negative_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise usage_error(f"{name} must be an integer >= 0, not {text!r}")
    return value


class ProducerSettings(TypedDict):
    acks: str  # "0", "1" or "all"
    compression: str  # a name of COMPRESSION_BY_NAME
    linger_ms: int
    batch_size: int
    enable_idempotence: bool | None  # None: the Producer's default (on with acks=all)


def producer_settings(args: argparse.Namespace) -> ProducerSettings:
    """acks, compression, linger_ms, batch_size from tide's options and Kafka's
    --producer-property, checked, defaults filled in."""
    given = producer_options({"acks": args.acks, "compression": args.compression,
                              "linger_ms": _text(args.linger_ms), "batch_size": _text(args.batch_size),
                              "enable_idempotence": None},
                             args.producer_property)
    acks = given["acks"] or DEFAULT_ACKS
    if acks not in ("0", "1", "all"):
        raise usage_error(f"acks must be 0, 1, all or -1, not {acks!r}")
    compression = given["compression"] or DEFAULT_COMPRESSION
    if compression not in COMPRESSION_BY_NAME:
        raise usage_error(f"compression {compression!r}: expected one of {', '.join(COMPRESSION_BY_NAME)}")
    linger_ms = given["linger_ms"]
    batch_size = given["batch_size"]
    idempotence = given["enable_idempotence"]
    if idempotence not in (None, "true", "false"):
        raise usage_error(f"enable.idempotence must be true or false, not {idempotence!r}")
    if idempotence == "true" and acks != "all":
        raise usage_error("enable.idempotence=true needs acks=all")
    return {
        "acks": acks, "compression": compression,
        "linger_ms": DEFAULT_LINGER_MS if linger_ms is None else _non_negative_int("linger.ms", linger_ms),
        "batch_size": (DEFAULT_BATCH_SIZE_BYTES if batch_size is None
                       else _non_negative_int("batch.size", batch_size)),
        "enable_idempotence": None if idempotence is None else idempotence == "true",
    }


def cmd_produce(args: argparse.Namespace) -> int:
    topic = resolve_topic(args.topic, args.topic_flag)
    settings = producer_settings(args)
    acks_label = settings["acks"]
    separator_text = produce_key_separator(args.key_separator, args.property)
    separator = separator_text.encode() if separator_text is not None else None
    try:
        ack_log = open(args.ack_log, "a", encoding="utf-8", errors="surrogateescape") if args.ack_log else None
    except OSError as e:
        raise CliError(f"cannot open ack log {args.ack_log}: {e.strerror}") from None
    transactional_id = args.transactional_id
    per_transaction = args.records_per_transaction
    if per_transaction is not None and (transactional_id is None or per_transaction < 1):
        raise usage_error("--records-per-transaction needs --transactional-id and N >= 1")
    if transactional_id is not None and settings["acks"] != "all":
        raise usage_error("--transactional-id needs acks=all")
    if transactional_id is not None and settings["enable_idempotence"] is False:
        raise usage_error("--transactional-id needs enable.idempotence (a transactional "
                          "producer is idempotent)")
    results = _Results(ack_log, acks_label, transactional=transactional_id is not None)
    with cli_errors(f"cannot produce to {topic!r}"):
        producer = Producer(bootstrap_of(args), **security_of(args),
                            acks=parse_acks(settings["acks"]),
                            batch_size_bytes=settings["batch_size"], linger_ms=settings["linger_ms"],
                            request_timeout_ms=min(args.timeout_ms, 30000),
                            delivery_timeout_ms=args.timeout_ms, max_block_ms=args.timeout_ms,
                            compression=COMPRESSION_BY_NAME[settings["compression"]],
                            enable_idempotence=settings["enable_idempotence"],
                            transactional_id=transactional_id)
        # Without an ack log or transactions only failures matter, and the producer counts
        # those per batch: no callback per record (they cost about half the client CPU:
        # 2.75-3.30 -> 1.42-1.64 CPU s for 150 MB of 1 KiB lines, docs/benchmarks.md).
        per_record_callbacks = ack_log is not None or transactional_id is not None
        try:
            if transactional_id is not None:
                producer.init_transactions()
            in_transaction = 0  # records sent in the open transaction
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
                if transactional_id is not None and in_transaction == 0:
                    producer.begin_transaction()
                try:
                    fut = producer.send(topic, value, key=key, partition=args.partition)
                except TransactionAbortRequiredError as e:  # its partition was refused
                    results.record_failure(f"line {line_number}: {e}")
                    producer.abort_transaction()
                    results.end_transaction(False, f"transaction aborted: {e}")
                    in_transaction = 0
                    continue
                if per_record_callbacks:
                    fut.add_done_callback(results.callback(key, value))
                in_transaction += 1
                if per_transaction is not None and in_transaction >= per_transaction:
                    _end_transaction(producer, results)
                    in_transaction = 0
            if in_transaction and transactional_id is not None:
                _end_transaction(producer, results)
            producer.flush()
        finally:
            producer.close()
            if ack_log is not None:
                ack_log.close()
            if not per_record_callbacks:
                results.record_failures(producer.records_failed, producer.first_record_error)
    if results.failed:
        raise CliError(f"{results.failed} of {total} records failed (first: {results.first_error})")
    return 0


def _end_transaction(producer: Producer, results: _Results) -> None:
    """Commit the open transaction; one with a failed record is aborted instead."""
    try:
        producer.commit_transaction()
    except TransactionAbortRequiredError as e:
        producer.abort_transaction()
        results.end_transaction(False, f"transaction aborted: {e}")
        return
    results.end_transaction(True)
