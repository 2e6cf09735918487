"""Validation of CreateTopics input: topic names and per-topic configs (Kafka rules).

Each check raises a typed error that becomes the topic's ErrorCode:
``InvalidTopicError`` (INVALID_TOPIC_EXCEPTION) or ``InvalidConfigError``
(INVALID_CONFIG). Nothing is stored before every check passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tidewater.proto.errors import InvalidConfigError, InvalidTopicError

TOPIC_NAME_LENGTH_MAX = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1..249 chars of [a-zA-Z0-9._-], not "." or ".."."""
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters, the limit is {TOPIC_NAME_LENGTH_MAX}")
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


def collision_key(name: str) -> str:
    """Kafka refuses topics whose names differ only in '.' vs '_' (metric names clash)."""
    return name.replace(".", "_")


def _int_at_least(minimum: int) -> Callable[[str], None]:
    def check(value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise ValueError(f"must be >= {minimum}, got {number}")
    return check


def _one_of(*allowed: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
    return check


def _boolean(value: str) -> None:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")


# Kafka topic config name -> check of its value (Kafka's own lower bounds).
TOPIC_CONFIG_CHECKS: dict[str, Callable[[str], None]] = {
    "min.insync.replicas": _int_at_least(1),
    "unclean.leader.election.enable": _boolean,
    "segment.bytes": _int_at_least(14),
    "segment.ms": _int_at_least(1),
    "retention.ms": _int_at_least(-1),
    "retention.bytes": _int_at_least(-1),
    "max.message.bytes": _int_at_least(0),
    "flush.messages": _int_at_least(1),
    "flush.ms": _int_at_least(0),
    "index.interval.bytes": _int_at_least(0),
    "message.timestamp.type": _one_of("CreateTime", "LogAppendTime"),
    # Compaction is not implemented: only the delete policy is accepted.
    "cleanup.policy": _one_of("delete"),
}


def validate_topic_configs(configs: Mapping[str, str]) -> None:
    for name, value in configs.items():
        check = TOPIC_CONFIG_CHECKS.get(name)
        if check is None:
            raise InvalidConfigError(f"unknown topic config {name!r}")
        try:
            check(value)
        except ValueError as e:
            raise InvalidConfigError(f"{name}: {e}") from None
