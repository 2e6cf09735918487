"""Topic configs: the one parser the controller (CreateTopics) and the brokers (LeaderAndIsr) use.

A topic's configs travel as a ``{name: string}`` map: the controller checks
it when the topic is created and stores it; every LeaderAndIsr carries it to
the replicas, which build their ``LogConfig`` from it. Both sides parse it
here, so a topic the controller accepts is one every broker can host.

Names, types and ranges are Kafka's (``TopicConfig`` and its ``LogConfig``
ConfigDef), parsed as Kafka's ``ConfigDef`` parses them: the value is
trimmed; ``int`` is a signed 32-bit and ``long`` a signed 64-bit decimal
(ASCII digits with an optional sign, nothing else: no ``1_000``, ``1e6`` or
``0x10``); ``double`` is a decimal number (Java's ``Double.parseDouble`` without
its ``NaN``, ``Infinity`` and hex forms); ``boolean`` is ``true`` or ``false`` in any case; a ``string``
must be one of its choices exactly; a ``list`` is comma-separated.

================================  =======  ======================  ==================================
name                              type     valid values            note
================================  =======  ======================  ==================================
segment.bytes                     int      [14, 2^31-1]            14: Kafka's smallest record
segment.ms                        long     >= 1
segment.index.bytes               int      [12, 2^31-1]            Kafka: >= 4; 12 holds a time entry
retention.bytes                   long     >= -1                   Kafka: any long; -1 is no limit
retention.ms                      long     >= -1                   -1: no limit
flush.messages                    long     >= 1                    2^63-1 (Kafka's default): never
flush.ms                          long     >= 0                    2^63-1 (Kafka's default): never
index.interval.bytes              int      >= 0
max.message.bytes                 int      >= 0
message.timestamp.type            string   CreateTime, LogAppendTime
min.insync.replicas               int      >= 1
unclean.leader.election.enable    boolean  true, false
cleanup.policy                    list     delete, compact         compact,delete: both
delete.retention.ms               long     >= 0                    tombstones kept this long
min.cleanable.dirty.ratio         double   [0, 1]
min.compaction.lag.ms             long     >= 0                    records younger stay uncompacted
max.compaction.lag.ms             long     >= 1                    2^63-1 (Kafka's default): never
compression.type                  string   uncompressed, zstd,     not producer: the leader rewrites
                                           lz4, snappy, gzip,      other codecs' batches into it
                                           producer                (proto/leader_batches.py)
compression.gzip.level            int      -1, [1, 9]              the rewrite's gzip level
compression.lz4.level             int      [1, 17]                 no effect (python-lz4's default)
compression.zstd.level            int      [-131072, 22]           the rewrite's zstd level
file.delete.delay.ms              long     >= 0                    no effect
segment.jitter.ms                 long     >= 0                    no effect: no jitter
preallocate                       boolean  true, false             no effect
message.timestamp.before.max.ms   long     >= 0                    KIP-937: CreateTime bounds,
message.timestamp.after.max.ms    long     >= 0                    2^63-1 (default): unbounded
message.timestamp.difference      long     >= 0                    deprecated (Kafka 3.6): each
.max.ms                                                            bound above left at 2^63-1
                                                                   takes this value, as Kafka 3.x
leader.replication.throttled      list     *, or PARTITION:BROKER  no effect (no leader-side
.replicas                                  pairs                   throttle)
follower.replication.throttled    list     as above                the replicas that
.replicas                                                          follower.replication.throttled
                                                                   .rate holds (broker/following/
                                                                   throttle.py)
remote.storage.enable             boolean  false                   true: INVALID_CONFIG, as Kafka
                                                                   without tiered storage
local.retention.ms                long     >= -2                   no effect (no tiered storage)
local.retention.bytes             long     >= -2                   no effect
remote.log.copy.disable           boolean  true, false             no effect
remote.log.delete.on.disable      boolean  true, false             no effect
message.format.version            string   a Kafka version:        deprecated: ignored, as Kafka 3.x
                                           0.8.0 ... 3.9-IV0       ignores it from IBP 3.0 on
message.downconversion.enable     boolean  true, false             no effect: no Fetch below v4,
                                                                   nothing to down-convert
================================  =======  ======================  ==================================

Those marked "no effect" are Kafka's topic configs that Tidewater accepts,
stores with the topic and describes (``TopicConfigDef.effect`` False, with
Kafka's default when a topic does not set them) but does not act on. Any other
name is refused. Each value is checked on its own (no rule spans
two configs), and ``LogConfig.validate`` checks its fields against the same
table, so any overlay of valid maps (a broker's defaults, then the topic's
own) is a valid ``LogConfig``. Every refusal is an ``InvalidConfigError``
(INVALID_CONFIG on the wire) whose message names the config. (Kafka refuses a
``min.compaction.lag.ms`` above ``max.compaction.lag.ms``; here both apply: a
segment younger than the minimum is never cleaned, however overdue.)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidewater.proto.errors import InvalidConfigError

GIB = 1 << 30
MIB = 1 << 20
DAY_MS = 24 * 60 * 60 * 1000

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("delete", "compact")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_THROTTLED_REPLICA = r"[0-9]+:[0-9]+"
# Kafka 3.x's MetadataVersion.fromVersionString: a known release ("0.10.2", "2.8", "3.0")
# with an optional "-IVn" sub-version; segments past the release's own ("0.10.0.0",
# "2.8.1") are ignored, as Kafka does. Kafka 3.x ignores the config's value altogether
# (message format v2 always, from inter.broker.protocol.version 3.0 on); Kafka 4 drops it.
_KAFKA_VERSION = (r"(0\.8\.[012]|0\.9\.0|0\.10\.[012]|0\.11\.0|1\.[01]|2\.[0-8]|3\.[0-9])"
                  r"(-IV[0-9]|(\.[0-9]+)*)")
# Smallest segment that can hold a batch header; Kafka allows 14, tests use tiny ones.
SEGMENT_BYTES_MIN = 14
INDEX_ENTRY_BYTES_MAX = 12  # the time index entry, the larger of the two

_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DOUBLE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
# Java's String.trim(): every char <= U+0020 (Python's strip() would also take Unicode spaces).
_TRIMMED = "".join(map(chr, range(0x21)))
_RANGES = {"int": (INT32_MIN, INT32_MAX), "long": (INT64_MIN, INT64_MAX)}


@dataclass(frozen=True)
class TopicConfigDef:
    """One topic config: its Kafka type, valid values and the ``LogConfig`` field it sets."""

    name: str
    type: str  # "int" (32-bit), "long" (64-bit), "double", "boolean", "string", "list"
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    log_field: str | None = None  # None: not a log setting (replication, cleanup)
    default: str | None = None  # Kafka's default, described where no broker default is
    effect: bool = True  # False: accepted and stored, not acted on (README lists them)
    also: tuple[int, ...] = ()  # ints valid outside [minimum, maximum] (gzip's -1)
    item_pattern: str | None = None  # a list's items, when it has no choices
    pattern: str | None = None  # a string's values, when it has no choices
    unsupported: tuple[str, ...] = ()  # parsed values refused here (remote storage)

    def parse(self, raw: str) -> int | float | bool | str:
        """The value of ``raw``; InvalidConfigError naming the config when it is not valid."""
        text = str(raw).strip(_TRIMMED)
        if self.type in _RANGES:
            if not _DECIMAL.fullmatch(text):
                raise self._invalid(raw, f"expected a {self.type} (a decimal integer)")
            value = int(text)
            low, high = _RANGES[self.type]
            if not low <= value <= high:
                raise self._invalid(raw, f"out of the {self.type} range [{low}, {high}]")
            if value not in self.also:
                try:
                    self.check(value, raw)
                except InvalidConfigError:
                    if not self.also:
                        raise
                    also = ", ".join(map(str, self.also))
                    raise self._invalid(raw, f"must be in [{self.minimum}, {self.maximum}] "
                                             f"or one of {also}") from None
            return value
        if self.type == "double":
            if not _DOUBLE.fullmatch(text):
                raise self._invalid(raw, "expected a decimal number")
            number = float(text)
            self.check(number, raw)
            return number
        if self.type == "boolean":
            if text.lower() not in ("true", "false"):
                raise self._invalid(raw, "expected true or false")
            if text.lower() in self.unsupported:
                raise self._invalid(raw, "not supported by Tidewater")
            return text.lower() == "true"
        if self.type == "list" and self.item_pattern is not None:
            items = [item.strip(_TRIMMED) for item in text.split(",")]
            if text and items != ["*"] and not all(
                    re.fullmatch(self.item_pattern, item, re.ASCII) for item in items):
                raise self._invalid(raw, "expected * or a list of PARTITION:BROKER")
            return ",".join(items) if text else ""
        if self.type == "list":
            items = [item.strip(_TRIMMED) for item in text.split(",")]
            if not all(item in self.choices for item in items):
                raise self._invalid(raw, f"expected a list of {', '.join(self.choices)}")
            return ",".join(dict.fromkeys(items))
        if self.type == "string" and self.pattern is not None:
            if not re.fullmatch(self.pattern, text, re.ASCII):
                raise self._invalid(raw, "expected a Kafka version such as 2.8 or 3.0-IV1")
            return text
        if text not in self.choices:
            raise self._invalid(raw, f"must be one of {', '.join(self.choices)}")
        return text

    def check(self, value: object, raw: object = None) -> None:
        """Range/choice check of a parsed value (also used by ``LogConfig.validate``)."""
        shown = value if raw is None else raw
        if self.type in _RANGES and value in self.also:
            return
        if self.type in _RANGES:
            if not isinstance(value, int) or isinstance(value, bool):
                raise self._invalid(shown, f"expected a {self.type}")
            low = self.minimum if self.minimum is not None else _RANGES[self.type][0]
            high = self.maximum if self.maximum is not None else _RANGES[self.type][1]
            if not low <= value <= high:
                raise self._invalid(shown, f"must be in [{low}, {high}]")
        elif self.type == "double":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise self._invalid(shown, "expected a number")
            floor = float("-inf") if self.minimum is None else self.minimum
            ceiling = float("inf") if self.maximum is None else self.maximum
            if not floor <= value <= ceiling:
                raise self._invalid(shown, f"must be in [{floor}, {ceiling}]")
        elif self.type == "list":
            items = str(value).split(",")
            if not value or not all(item in self.choices for item in items):
                raise self._invalid(shown, f"expected a list of {', '.join(self.choices)}")
        elif self.type == "string" and self.pattern is not None:
            if not re.fullmatch(self.pattern, str(value), re.ASCII):
                raise self._invalid(shown, "expected a Kafka version such as 2.8 or 3.0-IV1")
        elif self.type == "string" and value not in self.choices:
            raise self._invalid(shown, f"must be one of {', '.join(self.choices)}")

    def _invalid(self, raw: object, why: str) -> InvalidConfigError:
        return InvalidConfigError(f"invalid value {raw!r} for topic config {self.name}: {why}")


def _defs(*defs: TopicConfigDef) -> dict[str, TopicConfigDef]:
    return {d.name: d for d in defs}


TOPIC_CONFIGS: dict[str, TopicConfigDef] = _defs(
    TopicConfigDef("segment.bytes", "int", SEGMENT_BYTES_MIN, log_field="segment_bytes"),
    TopicConfigDef("segment.ms", "long", 1, log_field="segment_ms"),
    TopicConfigDef("segment.index.bytes", "int", INDEX_ENTRY_BYTES_MAX,
                   log_field="segment_index_bytes"),
    TopicConfigDef("retention.bytes", "long", -1, log_field="retention_bytes"),
    TopicConfigDef("retention.ms", "long", -1, log_field="retention_ms"),
    TopicConfigDef("flush.messages", "long", 1, log_field="flush_messages"),
    TopicConfigDef("flush.ms", "long", 0, log_field="flush_ms"),
    TopicConfigDef("index.interval.bytes", "int", 0, log_field="index_interval_bytes"),
    TopicConfigDef("max.message.bytes", "int", 0, log_field="max_message_bytes"),
    TopicConfigDef("message.timestamp.type", "string", choices=TIMESTAMP_TYPES,
                   log_field="message_timestamp_type"),
    TopicConfigDef("min.insync.replicas", "int", 1),
    TopicConfigDef("unclean.leader.election.enable", "boolean"),
    TopicConfigDef("cleanup.policy", "list", choices=CLEANUP_POLICIES,
                   log_field="cleanup_policy"),
    TopicConfigDef("delete.retention.ms", "long", 0, log_field="delete_retention_ms"),
    TopicConfigDef("min.cleanable.dirty.ratio", "double", 0, 1,
                   log_field="min_cleanable_dirty_ratio"),
    TopicConfigDef("min.compaction.lag.ms", "long", 0, log_field="min_compaction_lag_ms"),
    TopicConfigDef("max.compaction.lag.ms", "long", 1, log_field="max_compaction_lag_ms"),
    # The leader rewrites producer batches into the topic's codec (proto/leader_batches.py).
    TopicConfigDef("compression.type", "string", choices=COMPRESSION_TYPES,
                   log_field="compression_type"),
    TopicConfigDef("compression.gzip.level", "int", 1, 9, also=(-1,),
                   log_field="compression_gzip_level"),
    # python-lz4's frame writer takes no level we could match Kafka's with: stored only.
    TopicConfigDef("compression.lz4.level", "int", 1, 17, default="9", effect=False),
    TopicConfigDef("compression.zstd.level", "int", -131072, 22,
                   log_field="compression_zstd_level"),
    TopicConfigDef("file.delete.delay.ms", "long", 0, default="60000", effect=False),
    TopicConfigDef("segment.jitter.ms", "long", 0, default="0", effect=False),
    TopicConfigDef("preallocate", "boolean", default="false", effect=False),
    TopicConfigDef("message.timestamp.before.max.ms", "long", 0,
                   log_field="message_timestamp_before_max_ms"),
    TopicConfigDef("message.timestamp.after.max.ms", "long", 0,
                   log_field="message_timestamp_after_max_ms"),
    # Kafka 3.x's name for both bounds, deprecated by KIP-937 (3.6) and removed in 4.0:
    # each bound left at its default takes this value, as Kafka 3.6-3.9's LogConfig.
    TopicConfigDef("message.timestamp.difference.max.ms", "long", 0,
                   log_field="message_timestamp_difference_max_ms"),
    TopicConfigDef("leader.replication.throttled.replicas", "list", default="",
                   effect=False, item_pattern=_THROTTLED_REPLICA),
    TopicConfigDef("follower.replication.throttled.replicas", "list", default="",
                   item_pattern=_THROTTLED_REPLICA),
    TopicConfigDef("remote.storage.enable", "boolean", default="false", effect=False,
                   unsupported=("true",)),
    TopicConfigDef("local.retention.ms", "long", -2, default="-2", effect=False),
    TopicConfigDef("local.retention.bytes", "long", -2, default="-2", effect=False),
    TopicConfigDef("remote.log.copy.disable", "boolean", default="false", effect=False),
    TopicConfigDef("remote.log.delete.on.disable", "boolean", default="false", effect=False),
    TopicConfigDef("message.format.version", "string", default="3.0-IV1", effect=False,
                   pattern=_KAFKA_VERSION),
    # Down-conversion serves Fetch v0-v3 (message formats v0/v1); the Kafka listener
    # advertises Fetch from v4, so there is nothing to down-convert. Kafka 4 drops it.
    TopicConfigDef("message.downconversion.enable", "boolean", default="true", effect=False),
)
LOG_CONFIG_NAMES = frozenset(name for name, d in TOPIC_CONFIGS.items() if d.log_field)
# Kafka's "never" for the flush settings; LogConfig holds it as None.
_NEVER_FIELDS = frozenset({"flush_messages", "flush_ms", "max_compaction_lag_ms"})


def parse_topic_config(name: str, raw: str) -> int | float | bool | str:
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidConfigError(f"unknown topic config {name!r}")
    return definition.parse(raw)


def validate_topic_configs(configs: Mapping[str, str]) -> dict[str, int | float | bool | str]:
    """Parse every config of a topic; InvalidConfigError names the first one refused."""
    return {name: parse_topic_config(name, raw) for name, raw in configs.items()}


def min_insync_replicas(configs: Mapping[str, str], default: int) -> int:
    """The topic's ``min.insync.replicas``, ``default`` when it has none."""
    raw = configs.get("min.insync.replicas")
    return default if raw is None else int(parse_topic_config("min.insync.replicas", raw))


def _bound_ms(own_ms: int, difference_max_ms: int) -> int:
    return own_ms if own_ms != INT64_MAX else difference_max_ms


@dataclass
class LogConfig:
    """Per-log settings, Kafka's defaults. ``from_configs`` reads the Kafka-named map."""

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
    cleanup_policy: str = "delete"  # "delete", "compact" or "compact,delete"
    delete_retention_ms: int = DAY_MS
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None  # None: never forces a cleaning (KIP-354)
    # The leader's rewrites (proto/leader_batches.py); "producer": batches kept as sent.
    compression_type: str = "producer"
    compression_gzip_level: int = -1  # -1: zlib's default (6), as Kafka's
    compression_zstd_level: int = 3
    # KIP-937 (CreateTime only); INT64_MAX, Kafka 3.x's default: unbounded, no check.
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_after_max_ms: int = INT64_MAX
    # The pre-KIP-937 bound: what each of the two above takes while it is INT64_MAX.
    message_timestamp_difference_max_ms: int = INT64_MAX

    def __post_init__(self) -> None:
        self.validate()
        # Read on every produce: a plain attribute, not a property (a LogConfig is
        # replaced, never changed in place: ``Log.update_config``, ``dataclasses.replace``).
        # True: the leader must look into a producer's batches before appending them, a
        # codec to rewrite them into or a KIP-937 bound set (``proto/leader_batches.py``).
        # The KIP-937 bounds in force, Kafka 3.6-3.9's LogConfig: a bound left at its
        # default falls back to message.timestamp.difference.max.ms.
        self.timestamp_before_bound_ms = _bound_ms(self.message_timestamp_before_max_ms,
                                                   self.message_timestamp_difference_max_ms)
        self.timestamp_after_bound_ms = _bound_ms(self.message_timestamp_after_max_ms,
                                                  self.message_timestamp_difference_max_ms)
        self.leader_rewrite = (self.compression_type != "producer"
                               or self.timestamp_before_bound_ms != INT64_MAX
                               or self.timestamp_after_bound_ms != INT64_MAX)

    def validate(self) -> None:
        for definition in TOPIC_CONFIGS.values():
            if definition.log_field is None:
                continue
            value = getattr(self, definition.log_field)
            if value is None and definition.log_field in _NEVER_FIELDS:
                continue
            definition.check(value)

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        """The log cleaner compacts this log (its offsets may then have gaps)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def roll_ms(self) -> int:
        """How old the active segment may get: ``segment.ms``, or on a compacted log
        ``max.compaction.lag.ms`` when smaller (the active segment is never cleaned, so
        its records would otherwise wait past that lag; Kafka's maxSegmentMs)."""
        if self.compact and self.max_compaction_lag_ms is not None:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @property
    def delete(self) -> bool:
        """Retention (retention.ms, retention.bytes) deletes old segments of this log."""
        return "delete" in self.cleanup_policy.split(",")

    @classmethod
    def from_configs(cls, configs: Mapping[str, str], base: LogConfig | None = None) -> LogConfig:
        """Overlay Kafka-named string configs on ``base`` (defaults when None).

        Every name must be a topic config (``TOPIC_CONFIGS``); those that are
        not log settings are checked and otherwise ignored.
        """
        values = _init_values(base) if base is not None else dict(_default_init_values())
        for name, raw in configs.items():
            value: int | float | str | None = parse_topic_config(name, raw)
            field = TOPIC_CONFIGS[name].log_field
            if field is None:
                continue
            if field in _NEVER_FIELDS and value == INT64_MAX:
                value = None
            values[field] = value
        return cls(**values)

    def to_configs(self) -> dict[str, str]:
        """The Kafka-named string form (what from_configs reads back)."""
        out = {}
        for name in sorted(LOG_CONFIG_NAMES):
            field = TOPIC_CONFIGS[name].log_field
            assert field is not None  # LOG_CONFIG_NAMES holds log settings only
            value = getattr(self, field)
            out[name] = str(INT64_MAX if value is None else value)
        return out


# What ``LogConfig(...)`` takes. Every field is a scalar: ``from_configs`` copies them as
# they are, where ``dataclasses.asdict`` deep-copied each and a fresh ``LogConfig()`` was
# made and validated for the defaults on every call (a restart's LeaderAndIsr calls it
# once per partition: issue 30, launch -> serving).
_INIT_FIELDS = tuple(f.name for f in dataclasses.fields(LogConfig) if f.init)


def _init_values(config: LogConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in _INIT_FIELDS}


@functools.cache
def _default_init_values() -> dict[str, Any]:
    """The defaults' values, made once (callers copy before changing them)."""
    return _init_values(LogConfig())
