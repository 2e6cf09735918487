"""Per-log configuration, with Kafka's topic config names and defaults.

``LogConfig.from_configs`` takes the string map a topic carries (as in
CreateTopics) and overlays it on a base config; unknown or malformed values
raise InvalidConfigError naming the key, so bad input never half-applies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from tidewater.proto.errors import InvalidConfigError

GIB = 1 << 30
MIB = 1 << 20
DAY_MS = 24 * 60 * 60 * 1000

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
# Smallest segment that can hold a batch header; Kafka allows 14, tests use tiny ones.
SEGMENT_BYTES_MIN = 14
INDEX_ENTRY_BYTES_MAX = 12  # the time index entry, the larger of the two


@dataclass
class LogConfig:
    segment_bytes: int = GIB
    segment_ms: int = 7 * DAY_MS
    retention_bytes: int = -1  # -1: no size limit
    retention_ms: int = 7 * DAY_MS  # -1: no time limit
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * MIB
    flush_messages: int | None = None  # None: flush on roll and checkpoints only
    flush_ms: int | None = None
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def require(ok: bool, key: str, value: object, why: str) -> None:
            if not ok:
                raise InvalidConfigError(f"invalid value {value!r} for {key}: {why}")

        require(SEGMENT_BYTES_MIN <= self.segment_bytes <= INT32_MAX, "segment.bytes",
                self.segment_bytes, f"must be in [{SEGMENT_BYTES_MIN}, {INT32_MAX}]")
        require(self.segment_ms >= 1, "segment.ms", self.segment_ms, "must be >= 1")
        require(self.retention_bytes >= -1, "retention.bytes", self.retention_bytes, "must be >= -1")
        require(self.retention_ms >= -1, "retention.ms", self.retention_ms, "must be >= -1")
        require(self.index_interval_bytes >= 0, "index.interval.bytes",
                self.index_interval_bytes, "must be >= 0")
        require(INDEX_ENTRY_BYTES_MAX <= self.segment_index_bytes <= INT32_MAX,
                "segment.index.bytes", self.segment_index_bytes,
                f"must be in [{INDEX_ENTRY_BYTES_MAX}, {INT32_MAX}]")
        require(self.flush_messages is None or self.flush_messages >= 1, "flush.messages",
                self.flush_messages, "must be >= 1")
        require(self.flush_ms is None or self.flush_ms >= 0, "flush.ms", self.flush_ms,
                "must be >= 0")
        require(self.max_message_bytes >= 0, "max.message.bytes", self.max_message_bytes,
                "must be >= 0")
        require(self.message_timestamp_type in TIMESTAMP_TYPES, "message.timestamp.type",
                self.message_timestamp_type, f"must be one of {', '.join(TIMESTAMP_TYPES)}")

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_configs(cls, configs: Mapping[str, str], base: LogConfig | None = None) -> LogConfig:
        """Overlay Kafka-named string configs on ``base`` (defaults when None)."""
        values = dataclasses.asdict(base if base is not None else cls())
        for key, raw in configs.items():
            spec = _CONFIG_KEYS.get(key)
            if spec is None:
                if key in OTHER_TOPIC_CONFIG_NAMES:
                    continue  # a topic config, but not the log's business
                raise InvalidConfigError(f"unknown topic config {key!r}")
            field, parse = spec
            try:
                values[field] = parse(raw)
            except (TypeError, ValueError):
                raise InvalidConfigError(f"invalid value {raw!r} for {key}") from None
        return cls(**values)

    def to_configs(self) -> dict[str, str]:
        """The Kafka-named string form (what from_configs reads back)."""
        out = {}
        for key, (field, _parse) in _CONFIG_KEYS.items():
            value = getattr(self, field)
            if key in ("flush.messages", "flush.ms") and value is None:
                value = INT64_MAX  # Kafka's "never"
            out[key] = str(value)
        return out


def _parse_int(raw: str) -> int:
    text = str(raw).strip()
    value = int(text, 10)
    if not -(1 << 63) <= value <= INT64_MAX:
        raise ValueError(raw)
    return value


def _parse_flush(raw: str) -> int | None:
    # Kafka's default for both is Long.MAX_VALUE, meaning "never on count/time".
    value = _parse_int(raw)
    return None if value == INT64_MAX else value


def _parse_timestamp_type(raw: str) -> str:
    text = str(raw).strip()
    if text not in TIMESTAMP_TYPES:
        raise ValueError(raw)
    return text


_CONFIG_KEYS: dict[str, tuple[str, object]] = {
    "segment.bytes": ("segment_bytes", _parse_int),
    "segment.ms": ("segment_ms", _parse_int),
    "retention.bytes": ("retention_bytes", _parse_int),
    "retention.ms": ("retention_ms", _parse_int),
    "index.interval.bytes": ("index_interval_bytes", _parse_int),
    "segment.index.bytes": ("segment_index_bytes", _parse_int),
    "flush.messages": ("flush_messages", _parse_flush),
    "flush.ms": ("flush_ms", _parse_flush),
    "max.message.bytes": ("max_message_bytes", _parse_int),
    "message.timestamp.type": ("message_timestamp_type", _parse_timestamp_type),
}
LOG_CONFIG_NAMES = frozenset(_CONFIG_KEYS)
# Topic configs that other parts (replication, producer handling) read.
OTHER_TOPIC_CONFIG_NAMES = frozenset({
    "min.insync.replicas", "unclean.leader.election.enable", "cleanup.policy",
    "compression.type", "message.timestamp.difference.max.ms",
})
