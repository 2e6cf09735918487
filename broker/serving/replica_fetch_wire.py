"""ReplicaFetch's answer on the wire: FetchResponse's protobuf bytes, written and read here.

A follower's fetch answer is mostly records (up to ``replica.fetch.max.bytes`` per
partition). Through protobuf's Python messages the records were copied four times on the
leader (into the message, by upb's encoder, into the serialized ``bytes``, by gRPC) and
three times on the follower (by gRPC, by upb's parse, by ``.records``): ~9% of a leader's
CPU at 100 MB/s. Here the leader writes the wire bytes from its ``FetchedPartition``
tuples, the records joined in once (``encode_fetch_response``), and the follower reads
them as memoryview slices of the bytes gRPC hands over (``decode_fetch_response``); only
gRPC's own copy remains on each side. ReplicaFetch is registered with these in place of
protobuf's serializer (``server.build_server``) and deserializer
(``fetcher._LeaderStubs``); the bytes are the same protobuf message, so any peer may
parse them with ``pb.FetchResponse``.

The message (proto3, ``proto/tidewater.proto``)::

    FetchResponse
       1 error_code        varint     ErrorCode; omitted when NONE (0)
       2 partitions        len-delim  FetchPartitionResponse, once per partition
       3 session_held      varint     1: the leader holds the stream's fetch session
                                      (``replica_fetch_session``); omitted when false
    FetchPartitionResponse
       1 topic             len-delim  UTF-8
       2 partition         varint     int32
       3 error_code        varint     ErrorCode
       4 error_message     len-delim  UTF-8
       5 high_watermark    varint     int64
       6 log_start_offset  varint     int64
       7 log_end_offset    varint     int64
       8 leader_epoch      varint     int32
       9 diverging_epoch   len-delim  EpochEndOffset; present only when diverged
      10 records           len-delim  whole RecordBatches
    EpochEndOffset
       1 epoch             varint     int32
       2 end_offset        varint     int64

A field is a key (a varint: field number << 3 | wire type; 0 varint, 1 fixed 8 bytes, 2
length-delimited: a varint length then the bytes, 5 fixed 4 bytes) then its value. A
varint holds 7 bits per byte, least significant first, the high bit set on every byte
but the last; 10 bytes at most. A negative int32 or int64 is written as its 64-bit
two's complement (10 bytes); an int32 is read back from the low 32 bits. proto3 omits
a scalar field that is zero or empty (a present submessage is written even if empty).

Only the partitions whose records are worth it (``BY_HAND_RECORDS_BYTES`` and more) are
written and read by hand. A follower's answer names every partition it follows, most
with no records, and for those protobuf's C code is cheaper than this module's Python
(~0.6 against ~3 microseconds a partition to read, ~0.9 against ~1.6 to write) while
copying their few bytes costs little: each run of consecutive small partitions goes
through protobuf as one FetchResponse (a message's encoding followed by another's parses
as their merge, so the runs and the partitions between them join up in order), and an
answer under ``BY_HAND_ANSWER_BYTES`` is parsed by protobuf whole. Either way the bytes
are the ones protobuf writes and the tuples the ones it parses.

Reading takes what protobuf takes from a well-behaved peer: fields in any order, the
last of a repeated scalar wins, a repeated submessage is merged, and fields unknown here
(or of an unexpected wire type) are skipped. Anything else (a varint or length running
past its end, a varint over 10 bytes, field number 0, groups, text that is not UTF-8)
raises ``MalformedFetchResponseError``: the fetcher drops that stream as broken. What
this reader accepts, protobuf parses to the same message (a property test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tidewater.broker.serving.fetch import FetchedPartition, fetch_response
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import BytesLike

# A partition's records from which it is written and read by hand
# (bench/probes/fetch_wire_codec.py: the Python costs ~1 (writing) and ~2.5 (reading)
# microseconds a partition more than protobuf; protobuf's two extra copies of the records
# on each side cost about as much at ~60 KiB in a warm cache, sooner in a broker's cold
# one), and an answer below which protobuf parses it whole.
BY_HAND_RECORDS_BYTES = 32 * 1024
BY_HAND_ANSWER_BYTES = 64 * 1024

_UINT64 = (1 << 64) - 1
_INT64_SIGN = 1 << 63
_UINT32 = (1 << 32) - 1
_INT32_SIGN = 1 << 31
VARINT_BYTES_MAX = 10
_TAG_MAX = _UINT32  # protobuf keys are 32-bit
_TAG_BYTES_MAX = 5

# Wire types, and the keys written (field number << 3 | wire type).
_VARINT, _FIXED64, _LEN, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_RESPONSE_ERROR_CODE, _RESPONSE_PARTITION = b"\x08", b"\x12"
_TOPIC, _PARTITION, _ERROR_CODE, _ERROR_MESSAGE = b"\x0a", b"\x10", b"\x18", b"\x22"
_HIGH_WATERMARK, _LOG_START_OFFSET, _LOG_END_OFFSET = b"\x28", b"\x30", b"\x38"
_LEADER_EPOCH, _DIVERGING_EPOCH, _RECORDS = b"\x40", b"\x4a", b"\x52"
_EPOCH, _END_OFFSET = b"\x08", b"\x10"
_SESSION_HELD = b"\x18\x01"  # FetchResponse.session_held = true, after the partitions

_ONE_BYTE = [bytes((i,)) for i in range(0x80)]
_NO_RECORDS = memoryview(b"")


class MalformedFetchResponseError(Exception):
    """The bytes received are not a FetchResponse (the leader's fault, or the path's)."""


class FetchAnswer(NamedTuple):
    """A FetchResponse as the follower reads it."""

    error_code: int  # request-level
    partitions: list[FetchedPartition]
    session_held: bool  # the leader holds the stream's fetch session


def encode_fetch_response(partitions: Sequence[FetchedPartition], error_code: int = 0,
                          by_hand_bytes: int = BY_HAND_RECORDS_BYTES,
                          session_held: bool = False) -> bytes:
    """The FetchResponse wire bytes of ``fetch.fetch_response(partitions)`` (with
    ``error_code`` at the request level, and ``session_held``): partitions with
    ``by_hand_bytes`` of records and more written here (their records copied once, by the
    join), the runs between them by protobuf."""
    if session_held:  # field 3 after field 2, as protobuf writes them
        return encode_fetch_response(partitions, error_code, by_hand_bytes) + _SESSION_HELD
    parts: list[BytesLike] = []
    if error_code:
        parts.append(_RESPONSE_ERROR_CODE + _varint(error_code))
    run: list[FetchedPartition] = []
    for partition in partitions:
        if len(partition.records) < by_hand_bytes:
            run.append(partition)
            continue
        if run:
            parts.append(fetch_response(run).SerializeToString())
            run = []
        _append_partition(parts, partition)
    if run:
        if not parts:
            return fetch_response(run).SerializeToString()
        parts.append(fetch_response(run).SerializeToString())
    return b"".join(parts)


def decode_fetch_response(raw: bytes, by_hand_bytes: int = BY_HAND_RECORDS_BYTES,
                          whole_below: int = BY_HAND_ANSWER_BYTES) -> FetchAnswer:
    """The ``FetchAnswer`` of FetchResponse bytes: the
    partitions of ``by_hand_bytes`` and more read here (records sliced, not copied), the
    runs between them by protobuf (all of it under ``whole_below`` bytes).
    MalformedFetchResponseError if it is not one."""
    if not isinstance(raw, bytes):
        raise MalformedFetchResponseError(f"expected bytes, got {type(raw).__name__}")
    if len(raw) < whole_below:
        return decode_by_protobuf(raw)
    view = memoryview(raw)
    error_code = 0
    session_held = False
    partitions: list[FetchedPartition] = []
    run_start = -1  # where the run of small partitions being gathered starts
    position, end = 0, len(raw)
    while position < end:
        key_at = position
        field, wire_type, position = _read_key(raw, position, end)
        if field == 2 and wire_type == _LEN:
            start, position = _read_length(raw, position, end)
            if position - start < by_hand_bytes:
                if run_start < 0:
                    run_start = key_at
                continue
            if run_start >= 0:
                partitions += decode_by_protobuf(raw[run_start:key_at])[1]
                run_start = -1
            partitions.append(_read_partition(raw, view, start, position))
            continue
        if run_start >= 0:
            partitions += decode_by_protobuf(raw[run_start:key_at])[1]
            run_start = -1
        if field == 1 and wire_type == _VARINT:
            value, position = _read_varint(raw, position, end)
            error_code = _int32(value)
        elif field == 3 and wire_type == _VARINT:
            value, position = _read_varint(raw, position, end)
            session_held = value != 0
        else:
            position = _skip(raw, wire_type, position, end)
    if run_start >= 0:
        partitions += decode_by_protobuf(raw[run_start:])[1]
    return FetchAnswer(error_code, partitions, session_held)


def decode_by_protobuf(raw: bytes) -> FetchAnswer:
    """``decode_fetch_response``'s answer through protobuf's parser (the records copied)."""
    try:
        message = pb.FetchResponse.FromString(raw)
    except Exception as e:  # protobuf's DecodeError, or what its C code raises instead
        raise MalformedFetchResponseError(f"not a FetchResponse: {e}") from None
    new, view = tuple.__new__, FetchedPartition  # __new__ by hand: ~0.2 us less each
    return FetchAnswer(message.error_code, [
        new(view, (p.topic, p.partition, p.error_code, p.error_message, p.high_watermark,
                   p.log_start_offset, p.log_end_offset, p.leader_epoch, p.records,
                   (p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
                   if p.HasField("diverging_epoch") else None))
        for p in message.partitions], message.session_held)


# ---------------------------------------------------------------- writing

def _varint(value: int) -> bytes:
    """``value`` (an int32 or int64; negative as its 64-bit two's complement) as a varint."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    value &= _UINT64
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _text(key: bytes, value: str) -> bytes:
    raw = value.encode()
    return key + _varint(len(raw)) + raw


def encode_by_hand(partitions: Sequence[FetchedPartition], error_code: int = 0) -> bytes:
    """``encode_fetch_response``'s bytes, every partition written here."""
    parts: list[BytesLike] = []
    if error_code:
        parts.append(_RESPONSE_ERROR_CODE + _varint(error_code))
    for partition in partitions:
        _append_partition(parts, partition)
    return b"".join(parts)


def _append_partition(parts: list[BytesLike], fetched: FetchedPartition) -> None:
    """One partition's field of a FetchResponse, as pieces: its records by reference."""
    (topic, partition, code, message, high_watermark, log_start_offset, log_end_offset,
     leader_epoch, records, diverging) = fetched
    append = parts.append
    head = bytearray()
    if topic:
        head += _text(_TOPIC, topic)
    if partition:
        head += _PARTITION + _varint(partition)
    if code:
        head += _ERROR_CODE + _varint(code)
    if message:
        head += _text(_ERROR_MESSAGE, message)
    if high_watermark:
        head += _HIGH_WATERMARK + _varint(high_watermark)
    if log_start_offset:
        head += _LOG_START_OFFSET + _varint(log_start_offset)
    if log_end_offset:
        head += _LOG_END_OFFSET + _varint(log_end_offset)
    if leader_epoch:
        head += _LEADER_EPOCH + _varint(leader_epoch)
    if diverging is not None:
        epoch, end_offset = diverging
        body = ((_EPOCH + _varint(epoch) if epoch else b"")
                + (_END_OFFSET + _varint(end_offset) if end_offset else b""))
        head += _DIVERGING_EPOCH + _varint(len(body)) + body
    if records:
        head += _RECORDS + _varint(len(records))
    append(_RESPONSE_PARTITION + _varint(len(head) + len(records)))
    append(head)
    if records:
        append(records)


# ---------------------------------------------------------------- reading

def _read_varint(raw: bytes, position: int, end: int,
                 bytes_max: int = VARINT_BYTES_MAX) -> tuple[int, int]:
    """(value as an unsigned 64-bit int, next position) of the varint at ``position``."""
    if position < end:
        byte = raw[position]
        if byte < 0x80:
            return byte, position + 1
    value = shift = 0
    start = position
    while position < end:
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _UINT64, position
        shift += 7
        if position - start >= bytes_max:
            raise MalformedFetchResponseError(f"varint longer than {bytes_max} bytes at {start}")
    raise MalformedFetchResponseError(f"varint at {start} runs past the end ({end})")


def _int32(value: int) -> int:
    value &= _UINT32
    return value - (1 << 32) if value & _INT32_SIGN else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value & _INT64_SIGN else value


def _read_key(raw: bytes, position: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, next position) of the key at ``position``."""
    key, position = _read_varint(raw, position, end, _TAG_BYTES_MAX)
    if key > _TAG_MAX or key >> 3 == 0:
        raise MalformedFetchResponseError(f"bad field key {key} before {position}")
    return key >> 3, key & 7, position


def _read_length(raw: bytes, position: int, end: int) -> tuple[int, int]:
    """(start, end) of the length-delimited value whose length is at ``position``."""
    size, position = _read_varint(raw, position, end)
    if size > end - position:
        raise MalformedFetchResponseError(
            f"{size} bytes at {position} run past the end ({end})")
    return position, position + size


def _skip(raw: bytes, wire_type: int, position: int, end: int) -> int:
    """The position after a value of ``wire_type`` at ``position`` (a field not read)."""
    if wire_type == _VARINT:
        return _read_varint(raw, position, end)[1]
    if wire_type == _LEN:
        return _read_length(raw, position, end)[1]
    size = 8 if wire_type == _FIXED64 else 4 if wire_type == _FIXED32 else 0
    if not size:
        raise MalformedFetchResponseError(f"wire type {wire_type} at {position} not supported")
    if size > end - position:
        raise MalformedFetchResponseError(f"fixed field at {position} runs past the end ({end})")
    return position + size


def _read_text(raw: bytes, start: int, end: int) -> str:
    try:
        return raw[start:end].decode()
    except UnicodeDecodeError as e:
        raise MalformedFetchResponseError(f"text at {start} is not UTF-8: {e}") from None


def _read_epoch_end_offset(raw: bytes, position: int, end: int,
                           merged: tuple[int, int]) -> tuple[int, int]:
    epoch, end_offset = merged
    while position < end:
        field, wire_type, position = _read_key(raw, position, end)
        if wire_type == _VARINT and field in (1, 2):
            value, position = _read_varint(raw, position, end)
            if field == 1:
                epoch = _int32(value)
            else:
                end_offset = _int64(value)
        else:
            position = _skip(raw, wire_type, position, end)
    return epoch, end_offset


# A FetchPartitionResponse's varint fields by key byte: (slot in the tuple, bits).
_PARTITION_VARINTS = {0x10: (1, 32), 0x18: (2, 32), 0x28: (4, 64), 0x30: (5, 64),
                      0x38: (6, 64), 0x40: (7, 32)}
_TOPIC_KEY, _ERROR_MESSAGE_KEY, _DIVERGING_KEY, _RECORDS_KEY = 0x0A, 0x22, 0x4A, 0x52
_ABORTED_TRANSACTIONS_FIELD = 12  # FetchPartitionResponse.aborted_transactions


def _read_partition(raw: bytes, view: memoryview, position: int,
                    end: int) -> FetchedPartition:
    """One FetchPartitionResponse in ``raw[position:end]``. The keys protobuf writes for
    these fields are one byte each: they are dispatched on directly, and a one-byte
    varint is read inline (this runs once per partition of every answer)."""
    # FetchedPartition's fields by index (``_make``); the diverging one is read back.
    fields: list[object] = ["", 0, 0, "", 0, 0, 0, 0, _NO_RECORDS, None]
    varints = _PARTITION_VARINTS
    while position < end:
        key = raw[position]
        found = varints.get(key)
        if found is not None:
            value = raw[position + 1] if position + 1 < end else 0x80
            if value < 0x80:
                position += 2
            else:
                value, position = _read_varint(raw, position + 1, end)
                if found[1] == 32:
                    value = _int32(value)
                elif value & _INT64_SIGN:
                    value -= 1 << 64
            fields[found[0]] = value
        elif key == _RECORDS_KEY:
            start, position = _read_length(raw, position + 1, end)
            fields[8] = view[start:position]
        elif key == _TOPIC_KEY or key == _ERROR_MESSAGE_KEY:
            start, position = _read_length(raw, position + 1, end)
            fields[0 if key == _TOPIC_KEY else 3] = _read_text(raw, start, position)
        elif key == _DIVERGING_KEY:
            start, position = _read_length(raw, position + 1, end)
            fields[9] = _read_epoch_end_offset(raw, start, position, _diverging(fields))
        else:  # another field, or a key written in more bytes than needed
            field, wire_type, position = _read_key(raw, position, end)
            if wire_type == _VARINT and 2 <= field <= 8 and field != 4:
                value, position = _read_varint(raw, position, end)
                fields[field - 1] = _int32(value) if field in (2, 3, 8) else _int64(value)
            elif wire_type == _LEN and field in (1, 4, 9, 10):
                position = _read_partition_len_field(raw, view, field, position, end, fields)
            elif wire_type == _LEN and field == _ABORTED_TRANSACTIONS_FIELD:
                # A consumer's field (a leader never sends it to a follower), checked as
                # protobuf checks an AbortedTransaction (two varints), then dropped.
                start, position = _read_length(raw, position, end)
                _read_epoch_end_offset(raw, start, position, (0, 0))
            else:
                position = _skip(raw, wire_type, position, end)
    return FetchedPartition._make(fields)


def _read_partition_len_field(raw: bytes, view: memoryview, field: int, position: int,
                              end: int, fields: list[object]) -> int:
    start, position = _read_length(raw, position, end)
    if field == 10:
        fields[8] = view[start:position]
    elif field == 9:
        fields[9] = _read_epoch_end_offset(raw, start, position, _diverging(fields))
    else:
        fields[field - 1] = _read_text(raw, start, position)
    return position


def _diverging(fields: list[object]) -> tuple[int, int]:
    """The (epoch, end offset) read so far into ``fields`` (a repeated field merges), or
    (0, 0): protobuf's defaults."""
    diverging = fields[9]
    if diverging is None:
        return 0, 0
    assert isinstance(diverging, tuple), diverging
    return diverging


def decode_by_hand(raw: bytes) -> FetchAnswer:
    """``decode_fetch_response`` read here: the records are slices of ``raw``, not copies."""
    view = memoryview(raw)
    error_code = 0
    session_held = False
    partitions: list[FetchedPartition] = []
    position, end = 0, len(raw)
    while position < end:
        field, wire_type, position = _read_key(raw, position, end)
        if field == 2 and wire_type == _LEN:
            start, position = _read_length(raw, position, end)
            partitions.append(_read_partition(raw, view, start, position))
        elif field == 1 and wire_type == _VARINT:
            value, position = _read_varint(raw, position, end)
            error_code = _int32(value)
        elif field == 3 and wire_type == _VARINT:
            value, position = _read_varint(raw, position, end)
            session_held = value != 0
        else:
            position = _skip(raw, wire_type, position, end)
    return FetchAnswer(error_code, partitions, session_held)
