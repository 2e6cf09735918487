"""Kafka's request and response frames, encoded and decoded with ``kio``.

Wire format (Kafka's protocol guide): every request and response is a frame,
a 4-byte big-endian size followed by that many bytes. A request starts with
its header: api_key (int16), api_version (int16), correlation_id (int32),
client_id (nullable string) and, for a flexible (KIP-482) version, tagged
fields. A response starts with the correlation_id and, for a flexible
version other than ApiVersions', tagged fields. The bodies are the
per-version schemas Kafka generates from its JSON; ``kio`` carries them, so no
per-version struct is written by hand here.

``build(cls, values)`` makes a kio entity of whichever version from one plain
dict holding the fields of every version: a field the version lacks is
dropped, one it has but the dict lacks takes the schema's default, and plain
values become kio's types (error codes, UUIDs, durations). So each API's
translation is written once, not once per version. kio writes tagged fields
only when they differ from their defaults (Debian's librdkafka 2.0.2 refuses
an ApiVersions v3 answer carrying default tagged fields).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import struct
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import Reader
from kio.serial.writers import Writer
from kio.static.constants import EntityType
from kio.static.protocol import Entity, RequestHeader, RequestPayload, ResponsePayload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from tidewater.broker.kafka.schemas import EXTRA_SCHEMAS
from tidewater.proto.errors import InvalidRequestError, TidewaterError, UnsupportedVersionError

API_VERSIONS_KEY = 18
_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_SIZE = struct.Struct(">i")
_Built = TypeVar("_Built", bound="DataclassInstance")

# A decoded request's body as the APIs (``apis.HANDLERS``) take it: an instance of the
# kio class of the API version the client sent, picked at run time. One handler serves
# every version of its API and reads fields by name (``getattr`` with a default where
# some version lacks the field), so no static type narrower than this describes it.
RequestBody: TypeAlias = Any


class UnknownApiKeyError(TidewaterError):
    """A request for an API this broker does not serve: the connection is closed."""

    error_code = InvalidRequestError.error_code


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHead:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_head(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame's body; InvalidRequestError
    if it is too short to hold them."""
    if len(frame) < _HEAD.size:
        raise InvalidRequestError(f"request of {len(frame)} bytes has no header")
    api_key, api_version, correlation_id = _HEAD.unpack_from(frame)
    return api_key, api_version, correlation_id


@cache
def _request_type(api_key: int, api_version: int) -> type[RequestPayload]:
    extra = EXTRA_SCHEMAS.get((api_key, api_version))
    module = (importlib.import_module(extra[0]) if extra is not None
              else load_payload_module(api_key, api_version, EntityType.request))
    entity_type: type[RequestPayload] = module.__dict__[_payload_class_name(module, "Request")]
    return entity_type


@cache
def _response_type(api_key: int, api_version: int) -> type[ResponsePayload]:
    extra = EXTRA_SCHEMAS.get((api_key, api_version))
    module = (importlib.import_module(extra[1]) if extra is not None
              else load_payload_module(api_key, api_version, EntityType.response))
    entity_type: type[ResponsePayload] = module.__dict__[
        _payload_class_name(module, "Response")]
    return entity_type


def _payload_class_name(module: ModuleType, suffix: str) -> str:
    for name, value in vars(module).items():
        if (isinstance(value, type) and name.endswith(suffix)
                and getattr(value, "__type__", None) in (EntityType.request, EntityType.response)):
            return name
    raise LookupError(f"no {suffix} class in {module.__name__}")


def response_type(api_key: int, api_version: int) -> type[ResponsePayload]:
    return _response_type(api_key, api_version)


def request_type(api_key: int, api_version: int) -> type[RequestPayload]:
    return _request_type(api_key, api_version)


def encode_request(api_key: int, api_version: int, correlation_id: int, values: dict[str, Any],
                   client_id: str | None = "tidewater") -> bytes:
    """A request frame, size prefix included (what a client sends; tests use it)."""
    entity_type = _request_type(api_key, api_version)
    # Typed as any entity: mypy's Hashable check of a cached function's argument fails
    # on the union of the two header types.
    header_type: type[Entity] = entity_type.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_values = {"request_api_key": api_key, "request_api_version": api_version,
                     "correlation_id": correlation_id, "client_id": client_id}
    _writer(header_type)(out, build(header_type, header_values))
    _writer(entity_type)(out, build(entity_type, values))
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Entity]:
    """(correlation_id, body) of a response frame without its size prefix (tests use it)."""
    entity_type = _response_type(api_key, api_version)
    (correlation_id,) = _SIZE.unpack_from(frame)
    offset = 4
    if api_key != API_VERSIONS_KEY and entity_type.__flexible__:
        offset += 1  # an empty tagged-field section
    body, used = _reader(entity_type)(frame, offset)
    if offset + used != len(frame):
        raise ValueError(f"{len(frame) - offset - used} bytes after the response body")
    return correlation_id, body


@cache
def _reader(entity_type: type[Entity]) -> Reader[Entity]:
    return entity_reader(entity_type)


@cache
def _writer(entity_type: type[Entity]) -> Writer[Entity]:
    return entity_writer(entity_type)


def decode_request(frame: bytes | memoryview, supported: dict[int, tuple[int, int]]
                   ) -> tuple[RequestHead, Entity]:
    """The head and body of one request frame (without its size prefix).

    UnknownApiKeyError: an API key not in ``supported`` (close the connection).
    UnsupportedVersionError: a version outside what is advertised (answer it).
    InvalidRequestError: bytes that do not parse (close the connection).
    """
    api_key, api_version, correlation_id = peek_head(frame)
    if api_key not in supported:
        raise UnknownApiKeyError(f"API key {api_key} is not served here")
    low, high = supported[api_key]
    if not low <= api_version <= high:
        raise UnsupportedVersionError(f"API key {api_key} version {api_version} is not "
                                      f"supported ({low}..{high})")
    try:
        request_type = _request_type(api_key, api_version)
        # kio's native reader allocates for a length before it checks that the bytes are
        # there (a 100-byte frame claiming a 200 GB array aborted the process: make fuzz),
        # and takes a null (-1) for any string or array, nullable or not. Every length is
        # checked against the frame and the schema first, in Python.
        header_type: type[Entity] = request_type.__header_schema__  # as in encode_request
        end = check_lengths(header_type, frame, 0)
        check_lengths(request_type, frame, end)
        header, used = _reader(header_type)(frame, 0)
        body, body_used = _reader(request_type)(frame, used)
    except InvalidRequestError:
        raise
    except Exception as e:  # kio's own errors (ValueError, UnicodeDecodeError, native ones)
        raise InvalidRequestError(f"API key {api_key} v{api_version} does not parse: "
                                  f"{type(e).__name__}: {e}") from e
    # Bytes after the body are ignored, as Kafka's own parser does: librdkafka 2.16
    # sends three after a Metadata v12 asking for every topic.
    assert isinstance(header, RequestHeader), type(header)
    return RequestHead(api_key, api_version, correlation_id, header.client_id), body


# Values at least this long (records) are kept by reference in a response's parts, not
# copied into one buffer: a fetch answer's records then reach the socket in one copy.
BY_REFERENCE_BYTES_MIN = 4096


class _Parts:
    """kio's write target for a response: small writes gathered in a buffer, large ones
    kept as they are; ``parts`` are the frame in order."""

    __slots__ = ("parts", "_small", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self._small = bytearray()
        self.size = 0

    def write(self, data: bytes) -> int:
        n = len(data)
        if n >= BY_REFERENCE_BYTES_MIN:
            if self._small:
                self.parts.append(bytes(self._small))
                self._small.clear()
            self.parts.append(data)
        else:
            self._small += data
        self.size += n
        return n

    def finish(self) -> list[bytes]:
        if self._small:
            self.parts.append(bytes(self._small))
            self._small.clear()
        return self.parts


def encode_response_parts(head: RequestHead, body: ResponsePayload) -> list[bytes]:
    """The response frame, size prefix included, for ``body`` answering ``head``, as
    parts to write in order (``transport.writelines``: no join of the records)."""
    out = _Parts()
    out.write(_SIZE.pack(head.correlation_id))
    # ApiVersions answers with header v0 even when flexible (KIP-511): a client that
    # sent a version we do not know must still read the answer.
    if head.api_key != API_VERSIONS_KEY and type(body).__flexible__:
        out.write(b"\0")  # no tagged fields in the response header
    # kio's writers only call ``write`` on their target.
    _writer(type(body))(cast(IO[bytes], out), body)
    size = out.size
    parts = out.finish()
    parts[0] = _SIZE.pack(size) + parts[0]
    return parts


def encode_response(head: RequestHead, body: ResponsePayload) -> bytes:
    """The response frame, size prefix included, for ``body`` answering ``head``."""
    return b"".join(encode_response_parts(head, body))


# ---------------------------------------------------------------- length checks

_FIXED_SIZES = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1, "uuid": 16,
                "float64": 8, "error_code": 2, "timedelta_i32": 4, "timedelta_i64": 8,
                "datetime_i64": 8, "uint16": 2, "uint32": 4, "uint64": 8}
_VARIABLE = ("string", "bytes", "records")


class _Truncated(Exception):
    """A length (or a null) the frame and the schema do not allow."""


_Buffer: TypeAlias = "bytes | memoryview"
# One step of a length walk: (frame, offset, the frame's length) -> the offset after it.
_Step: TypeAlias = typing.Callable[[_Buffer, int, int], int]
_LENGTH_INT16, _LENGTH_INT32 = struct.Struct(">h").unpack_from, struct.Struct(">i").unpack_from


def _uvarint(buf: bytes | memoryview, offset: int, end: int) -> tuple[int, int]:
    if offset >= end:
        raise _Truncated("varint past the end")
    byte = buf[offset]
    if byte < 0x80:  # the usual one-byte length
        return byte, offset + 1
    value, shift = byte & 0x7F, 7
    while True:
        offset += 1
        if offset >= end:
            raise _Truncated("varint past the end")
        byte = buf[offset]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset + 1
        shift += 7
        if shift > 35:
            raise _Truncated("varint longer than 5 bytes")


@cache
def _wire_fields(entity_type: type[Entity]) -> tuple[tuple[str, str | None, bool, bool, Any], ...]:
    """(name, kafka type, nullable, is array, nested type) per untagged field, in wire
    order. (A nullable struct, DescribeTopicPartitions' cursor, starts with a marker byte.)"""
    hints = _hints(entity_type)
    out = []
    for f in dataclasses.fields(entity_type):
        if "tag" in f.metadata:
            continue  # tagged fields are skipped by their own sizes
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        item = next(a for a in args if a is not type(None)) if nullable else hint
        is_array = typing.get_origin(item) is tuple
        if is_array:
            item = typing.get_args(item)[0]
        nested = item if dataclasses.is_dataclass(item) else None
        out.append((f.name, f.metadata.get("kafka_type"), nullable, is_array, nested))
    return tuple(out)


def check_lengths(entity_type: type[Entity], buf: bytes | memoryview, offset: int) -> int:
    """Walk ``entity_type``'s encoding in ``buf`` from ``offset`` checking that every length
    (strings, bytes, arrays, tagged fields) fits in what is left and that no field the
    schema does not let be null is; returns the end offset. InvalidRequestError otherwise.
    No value is decoded: that is kio's job."""
    try:
        return _checker(entity_type)(buf, offset, len(buf))
    except _Truncated as e:
        raise InvalidRequestError(f"{entity_type.__name__}: {e}") from None


@cache
def _checker(entity_type: type[Entity]) -> _Step:
    """``entity_type``'s walk, planned once per class: a step per field chosen by its wire
    type when the class is first met, consecutive fixed-size fields one step, then the
    tagged fields. (Walking the schema's field list and dispatching on each field's type
    on every request cost 5-8 of the 10-11 µs a Produce's decode took; kio's own reader
    takes ~1.2.)"""
    flexible = bool(entity_type.__flexible__)
    # The request header's client_id keeps its int16 length even in header v2.
    compact = flexible and entity_type.__name__ != "RequestHeader"
    steps: list[_Step] = []
    fixed_bytes, fixed_name = 0, ""
    for name, kafka_type, nullable, is_array, nested in _wire_fields(entity_type):
        if not is_array and nested is None and kafka_type in _FIXED_SIZES:
            fixed_bytes += _FIXED_SIZES[kafka_type]
            fixed_name = name
            continue
        if fixed_bytes:
            steps.append(_fixed_step(fixed_bytes, fixed_name))
            fixed_bytes = 0
        steps.append(_array_step(kafka_type, nested, nullable, compact, name) if is_array
                     else _value_step(kafka_type, nested, nullable, compact, name))
    if fixed_bytes:
        steps.append(_fixed_step(fixed_bytes, fixed_name))
    if flexible:
        steps.append(_tagged_fields_step)
    planned = tuple(steps)

    def walk(buf: _Buffer, offset: int, end: int) -> int:
        for step in planned:
            offset = step(buf, offset, end)
        return offset
    return walk


def _fixed_step(size: int, name: str) -> _Step:
    def fixed(buf: _Buffer, offset: int, end: int) -> int:
        offset += size
        if offset > end:
            raise _Truncated(f"{name} past the end")
        return offset
    return fixed


def _length_step(compact: bool, wide: bool) -> typing.Callable[[_Buffer, int, int],
                                                               tuple[int, int]]:
    """(length or -1 for null, offset after it): compact uvarint N+1, else int16/int32."""
    if compact:
        def compact_length(buf: _Buffer, offset: int, end: int) -> tuple[int, int]:
            raw, offset = _uvarint(buf, offset, end)
            return raw - 1, offset
        return compact_length
    size, unpack = (4, _LENGTH_INT32) if wide else (2, _LENGTH_INT16)

    def fixed_length(buf: _Buffer, offset: int, end: int) -> tuple[int, int]:
        if offset + size > end:
            raise _Truncated("length past the end")
        return unpack(buf, offset)[0], offset + size
    return fixed_length


def _value_step(kafka_type: str | None, nested: Any, nullable: bool, compact: bool,
                name: str) -> _Step:
    if nested is not None:
        inner = _checker(nested)
        if not nullable:
            return inner

        def nullable_struct(buf: _Buffer, offset: int, end: int) -> int:
            # Kafka's nullable struct: int8 -1 for null, 1 then the struct.
            if offset >= end:
                raise _Truncated(f"{name} past the end")
            return offset + 1 if buf[offset] >= 0x80 else inner(buf, offset + 1, end)
        return nullable_struct
    if kafka_type in _FIXED_SIZES:
        return _fixed_step(_FIXED_SIZES[kafka_type], name)
    if kafka_type in _VARIABLE:
        length = _length_step(compact, wide=kafka_type != "string")

        def variable(buf: _Buffer, offset: int, end: int) -> int:
            size, offset = length(buf, offset, end)
            if size < 0:
                if not nullable:
                    raise _Truncated(f"{name} is null")
                return offset
            offset += size
            if offset > end:
                raise _Truncated(f"{name} past the end")
            return offset
        return variable

    def unknown(buf: _Buffer, offset: int, end: int) -> int:
        raise _Truncated(f"{name}: unknown wire type {kafka_type!r}")
    return unknown


def _array_step(kafka_type: str | None, nested: Any, nullable: bool, compact: bool,
                name: str) -> _Step:
    count_of = _length_step(compact, wide=True)
    item_bytes = _FIXED_SIZES.get(kafka_type) if nested is None else None  # type: ignore[arg-type]
    element = _value_step(kafka_type, nested, False, compact, name)  # never null

    def array(buf: _Buffer, offset: int, end: int) -> int:
        count, offset = count_of(buf, offset, end)
        if count < 0:
            if not nullable:
                raise _Truncated(f"{name} is null")
            return offset
        if count > end - offset:  # every element takes at least one byte
            raise _Truncated(f"{name}: {count} elements in {end - offset} bytes")
        if item_bytes is not None:  # fixed-size elements: one step for all
            offset += count * item_bytes
            if offset > end:
                raise _Truncated(f"{name} past the end")
            return offset
        for _ in range(count):
            offset = element(buf, offset, end)
        return offset
    return array


def _tagged_fields_step(buf: _Buffer, offset: int, end: int) -> int:
    tags, offset = _uvarint(buf, offset, end)
    for _ in range(tags):
        _tag, offset = _uvarint(buf, offset, end)
        size, offset = _uvarint(buf, offset, end)
        offset += size
        if offset > end:
            raise _Truncated("tagged field past the end")
    return offset


# ---------------------------------------------------------------- building entities

def build(entity_type: type[_Built], values: Mapping[str, Any]) -> _Built:
    """An entity of ``entity_type`` from ``values`` (see the module docstring)."""
    kwargs = {}
    for name, convert in _build_plan(entity_type):
        if name in values:
            value = values[name]
            kwargs[name] = None if value is None else convert(value)
    return entity_type(**kwargs)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_Convert: TypeAlias = typing.Callable[[Any], Any]  # a value that is not None -> kio's


@cache
def _hints(entity_type: type[DataclassInstance]) -> dict[str, Any]:
    return typing.get_type_hints(entity_type)


@cache
def _build_plan(entity_type: type[DataclassInstance]) -> tuple[tuple[str, _Convert], ...]:
    """(field name, its converter) per field of ``entity_type``: what the type hints and
    kafka types decide is worked out once per class, not per value (every answer was
    built by walking ``typing`` per field: 26-28 us a Produce or Fetch answer)."""
    hints = _hints(entity_type)
    return tuple((f.name, _converter(hints[f.name], f.metadata.get("kafka_type")))
                 for f in dataclasses.fields(entity_type))


def _converter(hint: Any, kafka_type: str | None) -> _Convert:
    """How a plain value (not None) of a field typed ``hint`` becomes kio's: a tuple's
    items one by one, an optional's as its one type, a dict as the nested entity, and
    error codes, UUIDs and durations by their kafka type; anything else as it is."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_hint, _) = typing.get_args(hint)
        item = _converter(item_hint, kafka_type)
        return lambda value: tuple(None if v is None else item(v) for v in value)
    if origin is typing.Union or (origin is not None and type(None) in typing.get_args(hint)):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return _converter(inner[0], kafka_type)
    scalar = _SCALAR_CONVERTERS.get(kafka_type, _as_is)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        nested = hint

        def entity(value: Any) -> Any:
            return build(nested, value) if isinstance(value, dict) else scalar(value)
        return entity
    return scalar


def _as_is(value: Any) -> Any:
    return value


def _error_code(value: Any) -> ErrorCode:
    return ErrorCode(int(value))


def _uuid(value: Any) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(bytes=value) if value else None


def _datetime(value: Any) -> datetime.datetime | None:
    if isinstance(value, datetime.datetime):
        return value
    # Epoch milliseconds; negative (Kafka's -1: none) is kio's None.
    return None if int(value) < 0 else _EPOCH + datetime.timedelta(milliseconds=int(value))


def _timedelta(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=int(value))


_SCALAR_CONVERTERS: dict[str | None, _Convert] = {
    "error_code": _error_code, "uuid": _uuid, "datetime_i64": _datetime,
    "timedelta_i32": _timedelta, "timedelta_i64": _timedelta}


def milliseconds(value: Any) -> int:
    """A kio duration (timedelta) or plain number as whole milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)
