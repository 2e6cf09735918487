"""Topic IDs (Kafka's KIP-516): the identity of one topic incarnation.

A topic deleted and created again under the same name is a different
incarnation with a different ID, so a broker can tell its logs apart. An ID is
16 bytes (a UUID). On the wire (``bytes topic_id`` fields) it travels as those
16 bytes, as Kafka's UUID type does; people, files (``partition.metadata``)
and the controller's JSON records see it as Kafka shows it: URL-safe base64
without padding, 22 characters (``Uuid.toString``).

The all-zero UUID means "no ID" in Kafka and ``...0001`` is reserved for its
metadata topic; neither is ever made here, and neither is accepted as a topic's ID.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable

from tidewater.proto.errors import InvalidRequestError

TOPIC_ID_BYTES = 16
TOPIC_ID_TEXT_LENGTH = 22
ZERO_TOPIC_ID = bytes(TOPIC_ID_BYTES)
METADATA_TOPIC_ID = bytes(TOPIC_ID_BYTES - 1) + b"\x01"  # Kafka's reserved ID
_RESERVED = (ZERO_TOPIC_ID, METADATA_TOPIC_ID)


def new_topic_id(uuid4: Callable[[], uuid.UUID] = uuid.uuid4) -> bytes:
    """A random ID (UUID v4), never a reserved one and never one whose text starts with '-'
    (Kafka avoids those: a command line would take them for an option). ``uuid4``: the
    source of UUIDs (the simulation passes a seeded one)."""
    while True:
        candidate = uuid4().bytes
        if candidate not in _RESERVED and not topic_id_to_text(candidate).startswith("-"):
            return candidate


def is_valid_topic_id(topic_id: bytes) -> bool:
    return len(topic_id) == TOPIC_ID_BYTES and topic_id not in _RESERVED


def check_topic_id(topic_id: bytes, *, what: str = "topic_id") -> bytes:
    """``topic_id`` if it is a usable ID, else InvalidRequestError saying why."""
    if len(topic_id) != TOPIC_ID_BYTES:
        raise InvalidRequestError(f"{what} must be {TOPIC_ID_BYTES} bytes, got {len(topic_id)}")
    if topic_id in _RESERVED:
        raise InvalidRequestError(f"{what} {topic_id_to_text(topic_id)} is reserved")
    return topic_id


def topic_id_to_text(topic_id: bytes) -> str:
    """Kafka's form: URL-safe base64 of the 16 bytes without padding (22 characters)."""
    if len(topic_id) != TOPIC_ID_BYTES:
        raise ValueError(f"a topic ID is {TOPIC_ID_BYTES} bytes, got {len(topic_id)}")
    return base64.urlsafe_b64encode(topic_id).decode("ascii").rstrip("=")


def topic_id_from_text(text: str) -> bytes:
    """Inverse of ``topic_id_to_text``; ValueError for anything else."""
    if len(text) != TOPIC_ID_TEXT_LENGTH or not text.isascii():
        raise ValueError(f"not a topic ID (22 base64url characters): {text!r}")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not a topic ID (22 base64url characters): {text!r}") from e
    if topic_id_to_text(raw) != text:  # non-canonical trailing bits
        raise ValueError(f"not a canonical topic ID: {text!r}")
    return raw

