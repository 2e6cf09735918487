"""The records of ``__transaction_state``, byte for byte as Kafka writes them.

Each change a transaction coordinator makes is one record (key, value) in the partition
of the transactional id (``abs(java_string_hash(transactional_id)) % N``), in an ordinary
RecordBatch v2. Kafka's formats (transaction-coordinator/src/main/resources/common/
message/TransactionLogKey.json and TransactionLogValue.json), big-endian:

``TransactionLogKey`` (version 0, the only one): int16 version, transactional_id as an
int16 length + UTF-8.

``TransactionLogValue`` (written as v0; v0 and v1 read). A null value is a tombstone:
the transactional id expired (compaction then drops what came before).

  v0 (classic): int16 version, producer_id int64, producer_epoch int16,
      transaction_timeout_ms int32, transaction_status int8,
      transaction_partitions: int32 count (-1: null), each topic as an int16-length
      string and its partition ids as an int32 count of int32,
      last_update_timestamp_ms int64, start_timestamp_ms int64
  v1 (flexible, KIP-915/KIP-890 part 2): the same fields with compact strings and
      arrays (unsigned varint length + 1, 0: null), then tagged fields per structure;
      tags 0 previous_producer_id int64, 1 next_producer_id int64,
      2 client_transaction_version int16 on the value. Read for a partition a Kafka 4
      broker wrote; the tags are kept where this coordinator has a use for them
      (previous_producer_id) and otherwise skipped.

``transaction_status`` is Kafka's byte for each state: 0 Empty, 1 Ongoing,
2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort, 6 Dead,
7 PrepareEpochFence (the last two are never written; a reader refuses nothing in 0-7).
Reading checks every length against the bytes there and raises ``TxnRecordError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidewater.proto import wire
from tidewater.proto.errors import CorruptRecordError

TXN_KEY_VERSION = 0
TXN_VALUE_VERSION = 0
STATUS_MAX = 7
_I8 = struct.Struct(">b")


class TxnRecordError(CorruptRecordError):
    """A ``__transaction_state`` record this reader cannot parse."""


@dataclass(frozen=True)
class TxnLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    status: int  # Kafka's byte (state.TxnState)
    # topic -> partition ids; empty for states that hold no partitions.
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = -1  # v1 tag 0; v0 has none


@dataclass(frozen=True)
class TxnLogRecord:
    transactional_id: str
    value: TxnLogValue | None  # None: tombstone


def encode_key(record: TxnLogRecord) -> bytes:
    return wire.I16.pack(TXN_KEY_VERSION) + wire.string(record.transactional_id)


def encode_value(record: TxnLogRecord) -> bytes | None:
    v = record.value
    if v is None:
        return None
    if not 0 <= v.status <= STATUS_MAX:
        raise ValueError(f"transaction status {v.status} has no byte")
    parts = [wire.I16.pack(TXN_VALUE_VERSION), wire.I64.pack(v.producer_id),
             wire.I16.pack(v.producer_epoch), wire.I32.pack(v.transaction_timeout_ms),
             _I8.pack(v.status), wire.I32.pack(len(v.partitions))]
    for topic, ids in v.partitions:
        parts += [wire.string(topic), wire.I32.pack(len(ids))]
        parts += [wire.I32.pack(i) for i in ids]
    parts += [wire.I64.pack(v.last_update_timestamp_ms), wire.I64.pack(v.start_timestamp_ms)]
    return b"".join(parts)


def decode(key: bytes | None, value: bytes | None) -> TxnLogRecord:
    """The record a key and value hold; TxnRecordError for what is not one of ours."""
    if key is None:
        raise TxnRecordError("record without a key")
    k = wire.WireReader(key, TxnRecordError)
    version = k.i16()
    if version != TXN_KEY_VERSION:
        raise TxnRecordError(f"TransactionLogKey version {version} is not read")
    transactional_id = k.string()
    k.end()
    return TxnLogRecord(transactional_id, None if value is None else _value(value))


def _value(raw: bytes) -> TxnLogValue:
    r = _Reader(raw, TxnRecordError)
    version = r.i16()
    if version == 0:
        producer_id, epoch, timeout, status = r.i64(), r.i16(), r.i32(), r.i8()
        count = r.i32()
        topics: list[tuple[str, tuple[int, ...]]] = []
        for _ in range(max(count, 0)):  # -1: null, as no partitions
            topic = r.string()
            n = r.count()
            topics.append((topic, tuple(r.i32() for _ in range(n))))
        updated, started = r.i64(), r.i64()
        r.end()
        return _checked(TxnLogValue(producer_id, epoch, timeout, status, tuple(topics),
                                    updated, started))
    if version == 1:
        producer_id, epoch, timeout, status = r.i64(), r.i16(), r.i32(), r.i8()
        count = r.uvarint() - 1
        topics = []
        for _ in range(max(count, 0)):
            topic = r.compact_string()
            n = r.uvarint() - 1
            if n < 0 or n * 4 > len(raw) - r.pos:
                raise TxnRecordError(f"array of {n} partition ids")
            topics.append((topic, tuple(r.i32() for _ in range(n))))
            r.skip_tags()
        updated, started = r.i64(), r.i64()
        tags = r.tags()
        previous = -1
        if 0 in tags:
            if len(tags[0]) != 8:
                raise TxnRecordError("previous_producer_id tag is not 8 bytes")
            previous = int(wire.I64.unpack(tags[0])[0])
        r.end()
        return _checked(TxnLogValue(producer_id, epoch, timeout, status, tuple(topics),
                                    updated, started, previous))
    raise TxnRecordError(f"TransactionLogValue version {version} is not read")


def _checked(value: TxnLogValue) -> TxnLogValue:
    if not 0 <= value.status <= STATUS_MAX:
        raise TxnRecordError(f"transaction status {value.status} is not Kafka's")
    return value


class _Reader(wire.WireReader):
    def i8(self) -> int:
        return int(_I8.unpack(self.take(1))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise TxnRecordError("unsigned varint longer than 5 bytes")

    def compact_string(self) -> str:
        size = self.uvarint() - 1
        if size < 0:
            raise TxnRecordError("null where a string is required")
        try:
            return self.take(size).decode()
        except UnicodeDecodeError as e:
            raise TxnRecordError(f"string is not UTF-8: {e}") from None

    def tags(self) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            found[tag] = self.take(self.uvarint())
        return found

    def skip_tags(self) -> None:
        self.tags()
