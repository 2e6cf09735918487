"""``codec.build`` (a converter plan per class, worked out once) makes the same kio entity
as the walk over type hints it replaced, kept here as the oracle, for every response
of every API version the listener serves, from values of every kafka type."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tidewater.broker.kafka import apis
from tidewater.broker.kafka.codec import _hints, build, response_type

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def oracle_build(entity_type: Any, values: dict[str, Any]) -> Any:
    hints = _hints(entity_type)
    kwargs = {}
    for f in dataclasses.fields(entity_type):
        if f.name in values:
            kwargs[f.name] = oracle_convert(values[f.name], hints[f.name],
                                            f.metadata.get("kafka_type"))
    return entity_type(**kwargs)


def oracle_convert(value: Any, hint: Any, kafka_type: str | None) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_hint, _) = typing.get_args(hint)
        return tuple(oracle_convert(v, item_hint, kafka_type) for v in value)
    if origin is typing.Union or (origin is not None and type(None) in typing.get_args(hint)):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return oracle_convert(value, inner[0], kafka_type)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return oracle_build(hint, value)
    if kafka_type == "error_code":
        return ErrorCode(int(value))
    if kafka_type == "uuid":
        if isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(bytes=value) if value else None
    if kafka_type == "datetime_i64" and not isinstance(value, datetime.datetime):
        return None if int(value) < 0 else _EPOCH + datetime.timedelta(milliseconds=int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        if isinstance(value, datetime.timedelta):
            return value
        return datetime.timedelta(milliseconds=int(value))
    return value


# Plain values per kafka type, in the forms the APIs hand to build: the variant picks one.
_PLAIN: dict[str | None, tuple[Any, ...]] = {
    "string": ("topic", "other"), "int8": (1, -1), "int16": (3, -1), "int32": (7, -1),
    "int64": (123_456, -1), "uint16": (9, 0), "float64": (0.5, -1.0), "bool": (True, False),
    "bytes": (b"\x01\x02", b""), "records": (b"r" * 40, b""),
    "error_code": (0, 6), "uuid": (uuid.UUID(int=5), b"\x07" * 16),
    "datetime_i64": (1_700_000_000_000, -1),
    "timedelta_i32": (250, datetime.timedelta(milliseconds=30)),
    "timedelta_i64": (86_400_000, datetime.timedelta(seconds=2))}


def plain_values(entity_type: Any, variant: int, depth: int = 0) -> dict[str, Any]:
    """Values for each field of ``entity_type`` (nested entities as dicts, arrays of two),
    a field with a default left out now and then so the default is taken."""
    hints = _hints(entity_type)
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(entity_type)):
        has_default = (f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING)
        if has_default and (i + variant) % 5 == 4:
            continue
        hint, kafka_type = hints[f.name], f.metadata.get("kafka_type")
        values[f.name] = plain_value(hint, kafka_type, variant + i, depth)
    return values


def plain_value(hint: Any, kafka_type: str | None, variant: int, depth: int) -> Any:
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin is tuple:
        return [plain_value(args[0], kafka_type, variant + k, depth) for k in range(2)]
    if origin is not None and len(args) == 1:
        if variant % 3 == 2:
            return None
        return plain_value(args[0], kafka_type, variant, depth)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return plain_values(hint, variant, depth + 1) if depth < 4 else {}
    return _PLAIN[kafka_type][variant % 2]


RESPONSE_TYPES = [(key, version) for key, (low, high) in sorted(apis.SUPPORTED.items())
                  for version in range(max(low, apis.DECODED_FROM.get(key, 0)), high + 1)]


@pytest.mark.parametrize(("api_key", "version"), RESPONSE_TYPES)
def test_build_makes_the_entity_the_hint_walk_made(api_key: int, version: int) -> None:
    entity_type = response_type(api_key, version)
    for variant in range(3):
        values = plain_values(entity_type, variant)
        assert build(entity_type, values) == oracle_build(entity_type, values)


def test_build_converts_each_kafka_type() -> None:
    """Not only equal to the oracle: the conversions themselves (a broken oracle and plan
    alike would pass the test above)."""
    produce = response_type(apis.PRODUCE, 9)
    built = build(produce, {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 6, "base_offset": 5, "log_append_time": -1,
         "log_start_offset": 0, "record_errors": [], "error_message": None}]}],
        "throttle_time": 40})
    partition = built.responses[0].partition_responses[0]
    assert partition.error_code == ErrorCode.not_leader_or_follower
    assert partition.log_append_time is None
    assert built.throttle_time == datetime.timedelta(milliseconds=40)
    appended = build(type(partition), {"index": 0, "error_code": 0, "base_offset": 5,
                                       "log_append_time": 1000, "record_errors": []})
    assert appended.log_append_time == _EPOCH + datetime.timedelta(seconds=1)
