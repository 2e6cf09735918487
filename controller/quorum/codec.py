"""The Raft core's messages on the wire: ``encode(message) -> bytes``, ``decode(bytes)``.

The message classes of ``controller/raft/messages.py`` are the only definition of
what a message holds: this codec walks a message's dataclass fields and their
type annotations, so a field added there is carried without a change here (and a
field of a type this codec does not know fails the round-trip test at once).

Format: UTF-8 JSON ``{"type": <class name>, "fields": {<field>: <value>}}`` where
a value is, by the field's annotated type: ``int``/``bool``/``str`` as JSON's;
``bytes`` base64; ``VoterKey`` ``[id, directory_id]``; ``OffsetAndEpoch``
(``SnapshotId``) ``[offset, epoch]``; ``Entry`` ``[offset, epoch, kind,
base64 data]``; an enum its value; ``X | None`` null or X; ``tuple[X, ...]`` and
``frozenset[X]`` a list. JSON costs bytes over a packed layout, but these
messages are small (a fetch answer is bounded by ``fetch_bytes_max``), and
every byte of it is readable in a packet capture.

``decode`` trusts nothing: the peer may be buggy or hostile. Anything that is
not exactly a message (unknown type, a missing or extra field, a wrong JSON
type, an int outside int64, a directory id that is not 32 hex digits, an
unknown entry kind, more than ``ENCODED_BYTES_MAX``) raises
``MalformedRaftMessageError`` (INVALID_REQUEST), never a ``KeyError`` or a
``ValueError`` from the inside.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import json
import types
import typing
from typing import Any, get_args, get_origin

from tidewater.controller.raft import messages as raft_messages
from tidewater.controller.raft.messages import Entry, EntryKind, Message, OffsetAndEpoch, VoterKey
from tidewater.proto.errors import InvalidRequestError

# A fetch answer is at most fetch_bytes_max of entries (plus one entry of any size up to
# record_bytes_max), base64 grows it by 4/3: 8 MiB leaves room for the defaults (1 MiB).
ENCODED_BYTES_MAX = 8 * 1024 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DIRECTORY_ID_HEX_DIGITS = 32
STRING_CHARS_MAX = 64

MESSAGE_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (
        raft_messages.VoteRequest, raft_messages.VoteResponse,
        raft_messages.BeginQuorumEpoch, raft_messages.EndQuorumEpoch,
        raft_messages.FetchRequest, raft_messages.FetchResponse,
        raft_messages.FetchSnapshotRequest, raft_messages.FetchSnapshotResponse)
}
assert set(MESSAGE_CLASSES.values()) == set(get_args(Message)), "codec misses a message class"


class MalformedRaftMessageError(InvalidRequestError):
    """Bytes from a peer that are not a Raft message (the peer's fault, not ours)."""


_FIELD_TYPES: dict[type[Any], dict[str, Any]] = {
    cls: typing.get_type_hints(cls, vars(raft_messages)) for cls in MESSAGE_CLASSES.values()
}


def _to_json(value: Any, annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return _to_json(value, inner)
    if origin in (tuple, frozenset):
        inner = get_args(annotation)[0]
        items = sorted(value) if origin is frozenset else value
        return [_to_json(item, inner) for item in items]
    if annotation is bytes:
        return base64.b64encode(value).decode("ascii")
    if annotation is VoterKey:
        return [value.id, value.directory_id]
    if annotation is OffsetAndEpoch:
        return [value.offset, value.epoch]
    if annotation is Entry:
        return [value.offset, value.epoch, int(value.kind),
                base64.b64encode(value.data).decode("ascii")]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return value.value
    if annotation in (int, bool, str):
        return value
    raise TypeError(f"the codec cannot encode a field of type {annotation!r}")


def encode(message: Message) -> bytes:
    cls = type(message)
    hints = _FIELD_TYPES[cls]
    fields = {f.name: _to_json(getattr(message, f.name), hints[f.name])
              for f in dataclasses.fields(message)}
    return json.dumps({"type": cls.__name__, "fields": fields},
                      separators=(",", ":")).encode()


def _fail(message: str) -> typing.NoReturn:
    raise MalformedRaftMessageError(message)


def _int(value: Any) -> int:
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        _fail(f"expected an int64, got {value!r:.40}")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not str:
        _fail("expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        _fail("malformed base64")


def _pair(value: Any, length: int) -> list[Any]:
    if type(value) is not list or len(value) != length:
        _fail(f"expected a list of {length}, got {value!r:.40}")
    return value


def _directory_id(value: Any) -> str:
    if (type(value) is not str or len(value) != DIRECTORY_ID_HEX_DIGITS
            or any(c not in "0123456789abcdef" for c in value)):
        _fail(f"a directory id is {DIRECTORY_ID_HEX_DIGITS} lowercase hex digits, "
              f"got {value!r:.40}")
    return value


def _from_json(value: Any, annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return _from_json(value, inner)
    if origin in (tuple, frozenset):
        if type(value) is not list:
            _fail(f"expected a list, got {value!r:.40}")
        inner = get_args(annotation)[0]
        items = [_from_json(item, inner) for item in value]
        if origin is tuple:
            return tuple(items)
        result = frozenset(items)
        if len(result) != len(items):
            _fail("a set with a repeated member")
        return result
    if annotation is bytes:
        return _bytes(value)
    if annotation is VoterKey:
        node_id, directory_id = _pair(value, 2)
        return VoterKey(_int(node_id), _directory_id(directory_id))
    if annotation is OffsetAndEpoch:
        offset, epoch = _pair(value, 2)
        return OffsetAndEpoch(_int(offset), _int(epoch))
    if annotation is Entry:
        offset, epoch, kind, data = _pair(value, 4)
        try:
            entry_kind = EntryKind(_int(kind))
        except ValueError:
            _fail(f"unknown entry kind {kind!r}")
        return Entry(_int(offset), _int(epoch), entry_kind, _bytes(data))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(value)
        except ValueError:
            _fail(f"{value!r:.40} is not a {annotation.__name__}")
    if annotation is int:
        return _int(value)
    if annotation is bool:
        if type(value) is not bool:
            _fail(f"expected a bool, got {value!r:.40}")
        return value
    if annotation is str:
        # destination_directory_id is the only str field: a directory id, or "" for none
        if value == "":
            return value
        return _directory_id(value)
    raise TypeError(f"the codec cannot decode a field of type {annotation!r}")


def decode(data: bytes) -> Message:
    if len(data) > ENCODED_BYTES_MAX:
        _fail(f"a message of {len(data)} bytes is over {ENCODED_BYTES_MAX}")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        _fail(f"not JSON: {e}")
    if type(document) is not dict or set(document) != {"type", "fields"}:
        _fail("expected {type, fields}")
    cls = MESSAGE_CLASSES.get(document["type"]) if type(document["type"]) is str else None
    if cls is None:
        _fail(f"unknown message type {document['type']!r:.40}")
    fields = document["fields"]
    hints = _FIELD_TYPES[cls]
    if type(fields) is not dict or set(fields) != set(hints):
        _fail(f"{cls.__name__} needs exactly the fields {sorted(hints)}")
    message: Message = cls(**{name: _from_json(fields[name], hints[name]) for name in hints})
    return message
