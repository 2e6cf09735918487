"""Validation of CreateTopics input: topic names and per-topic configs (Kafka rules).

Each check raises a typed error that becomes the topic's ErrorCode:
``InvalidTopicError`` (INVALID_TOPIC_EXCEPTION) or ``InvalidConfigError``
(INVALID_CONFIG). Nothing is stored before every check passed. Topic configs
are checked by ``tidewater.proto.topic_config``, the parser the brokers build
their logs' settings with: a topic created here is one every broker can host.
"""

from __future__ import annotations

import re

from tidewater.proto.errors import InvalidTopicError
from tidewater.proto.topic_config import validate_topic_configs

__all__ = ["TOPIC_NAME_LENGTH_MAX", "collision_key", "validate_topic_configs",
           "validate_topic_name"]

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
