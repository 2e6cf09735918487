"""Topic names, partitions and the partition directory names built from them.

A partition replica lives in one directory per data dir, named
``<topic>-<partition>`` (Kafka's layout), e.g. ``orders-3``. Topic names follow
Kafka's rules: 1 to 249 characters from ``[a-zA-Z0-9._-]``, and never ``.`` or
``..``. Because a legal name cannot contain ``/`` or be ``.``/``..``, a
directory name built from a validated topic always stays inside its data dir.
Topics may themselves contain ``-``, so a directory name is split on its LAST
``-``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tidewater.proto.errors import InvalidTopicError

TOPIC_NAME_LENGTH_MAX = 249
# The group coordinator's topic (broker/group): written by the broker only. A client's
# produce to it is refused (Kafka: INVALID_TOPIC_EXCEPTION), so no one forges a commit.
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's Topic.isInternal: never created on a client's request, never deleted
# (``__share_group_state`` is reserved for later).
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC,
                             "__share_group_state"})
# The coordinators' topics (broker/group, broker/txn): refused to clients' produce.
COORDINATOR_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def validate_topic_name(name: str) -> None:
    """Raise InvalidTopicError unless ``name`` is a legal Kafka topic name."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters, the maximum is {TOPIC_NAME_LENGTH_MAX}"
        )
    if _LEGAL_TOPIC_NAME.fullmatch(name) is None:
        raise InvalidTopicError(
            f"topic name {name!r} contains characters other than ASCII letters, digits, '.', '_', '-'"
        )


def validate_topic_partition(tp: TopicPartition) -> None:
    """Raise InvalidTopicError for an illegal topic or a negative partition."""
    validate_topic_name(tp.topic)
    if not isinstance(tp.partition, int) or isinstance(tp.partition, bool) or tp.partition < 0:
        raise InvalidTopicError(f"partition must be a non-negative integer, got {tp.partition!r}")


def log_dir_name(tp: TopicPartition) -> str:
    """``<topic>-<partition>``; validates first so no path is built from bad input."""
    validate_topic_partition(tp)
    return f"{tp.topic}-{tp.partition}"


def parse_log_dir_name(name: str) -> TopicPartition:
    """Inverse of log_dir_name; raises ValueError for anything that is not one."""
    topic, sep, partition_text = name.rpartition("-")
    if not sep or not topic:
        raise ValueError(f"not a partition directory name: {name!r}")
    # Digits only: int() would also accept "+1", " 1" or "1_0".
    if not partition_text.isascii() or not partition_text.isdigit():
        raise ValueError(f"not a partition directory name (bad partition): {name!r}")
    partition = int(partition_text)
    if str(partition) != partition_text:
        raise ValueError(f"not a partition directory name (leading zeros): {name!r}")
    try:
        validate_topic_name(topic)
    except InvalidTopicError as e:
        raise ValueError(f"not a partition directory name: {name!r}: {e}") from None
    return TopicPartition(topic, partition)
