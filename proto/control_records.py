"""Kafka's transaction markers: control batches (EndTransactionMarker, ControlRecordType).

A marker is a batch of one record with the control (0x20) and transactional (0x10)
attribute bits, the producer id and epoch of the transaction it ends and base
sequence -1. Its record, all big-endian::

    key    version int16 (0), type int16 (0 ABORT, 1 COMMIT)
    value  version int16 (0), coordinator epoch int32

Kafka readers skip a key of an unknown version/type; so do ours (``None``).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from tidewater.proto.batch import CONTROL_MASK, TRANSACTIONAL_MASK, BatchHeader, BytesLike
from tidewater.proto.batch_builder import BatchBuilder
from tidewater.proto.records import decode_batch_records

CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT = 0, 1
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0
MARKER_ATTRIBUTES = CONTROL_MASK | TRANSACTIONAL_MASK

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
assert _KEY.size == 4 and _VALUE.size == 6


class EndTxnMarker(NamedTuple):
    committed: bool
    coordinator_epoch: int


def encode_marker_batch(producer_id: int, producer_epoch: int, *, committed: bool,
                        coordinator_epoch: int, timestamp_ms: int) -> bytes:
    """One control batch (offset 0, no leader epoch: the leader's append stamps both)."""
    builder = BatchBuilder()
    key = _KEY.pack(CONTROL_KEY_VERSION,
                    CONTROL_TYPE_COMMIT if committed else CONTROL_TYPE_ABORT)
    builder.append(key, _VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch), (),
                   timestamp_ms)
    return builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                         base_sequence=-1, attributes=MARKER_ATTRIBUTES)


def parse_marker(key: bytes | None, value: bytes | None) -> EndTxnMarker | None:
    """The marker a control record holds; None for another control type (or a damaged one)."""
    if key is None or len(key) < _KEY.size:
        return None
    _version, control_type = _KEY.unpack_from(key)
    if control_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        return None
    coordinator_epoch = -1
    if value is not None and len(value) >= _VALUE.size:
        coordinator_epoch = _VALUE.unpack_from(value)[1]
    return EndTxnMarker(control_type == CONTROL_TYPE_COMMIT, coordinator_epoch)


def marker_of_batch(buf: BytesLike, position: int, header: BatchHeader) -> EndTxnMarker | None:
    """The marker of the control batch at ``position`` (None if it holds none)."""
    records = decode_batch_records(buf, position, header)
    if not records:
        return None
    return parse_marker(records[0].key, records[0].value)
