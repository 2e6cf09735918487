"""A broker's own settings as Kafka's DescribeConfigs lists a BROKER resource.

Each setting under Kafka's name (``BrokerConfig``'s ``--set`` names; the topic
defaults under Kafka's broker-level names, ``log.segment.bytes`` for
``segment.bytes``), its value on this broker, and its source: DYNAMIC_BROKER_CONFIG
when AlterConfigs set it for this broker, DYNAMIC_DEFAULT_BROKER_CONFIG when set for
every broker (the "" resource), STATIC_BROKER_CONFIG when given with ``--set``
(Kafka: server.properties), DEFAULT_CONFIG otherwise. The dynamic ones
(``proto.broker_dynamic_config``) are not read-only; every other entry is.
Synonyms, when asked for, are Kafka's precedence list: the value in force
first, then each value it overrides, down to the default.

The "" resource (the cluster-wide dynamic defaults) lists only what is set there.

Tidewater's own settings (``log.scrub.*``) are listed too, under their names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidewater.broker.config import BROKER_SETTING_FIELDS, BrokerConfig
from tidewater.proto.broker_dynamic_config import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_CONFIGS,
    KAFKA_LOG_DEFAULT_NAMES,
    STORED_DYNAMIC_BROKER_CONFIGS,
    is_dynamic_broker_config,
)
from tidewater.proto.topic_config import TOPIC_CONFIGS, LogConfig

# Kafka's ConfigSource numbers.
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = (
    2, 3, 4, 5)
# Kafka's ConfigType numbers (DescribeConfigs v3+).
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST = 1, 2, 3, 4, 5, 6, 7
PASSWORD = 9
_TOPIC_TYPES = {"boolean": BOOLEAN, "string": STRING, "int": INT, "long": LONG,
                "double": DOUBLE, "list": LIST, "short": SHORT, "password": PASSWORD}
# Broker settings Kafka types other than INT (booleans are BOOLEAN by their parser).
_LONG_SETTINGS = frozenset({
    "replica.lag.time.max.ms", "log.retention.check.interval.ms",
    "offsets.retention.check.interval.ms", "log.cleaner.backoff.ms",
    "log.scrub.bytes.per.second", "log.scrub.interval.ms",
    "log.cleaner.io.max.bytes.per.second", "controlled.shutdown.timeout.ms"})
_SHORT_SETTINGS = frozenset({"offsets.topic.replication.factor"})


@dataclass(frozen=True)
class BrokerConfigEntry:
    name: str
    value: str
    source: int  # STATIC_BROKER_CONFIG or DEFAULT_CONFIG (before dynamic overrides)
    config_type: int
    default: str  # the value without --set (the DEFAULT_CONFIG synonym)
    # The dynamic values above it, highest precedence first: (value, source).
    dynamic: tuple[tuple[str, int], ...] = ()

    @property
    def value_in_force(self) -> str:
        return self.dynamic[0][0] if self.dynamic else self.value

    @property
    def source_in_force(self) -> int:
        return self.dynamic[0][1] if self.dynamic else self.source


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def broker_config_entries(config: BrokerConfig, log_defaults: LogConfig,
                          dynamic: Mapping[str, Mapping[str, str]] | None = None
                          ) -> list[BrokerConfigEntry]:
    """Every setting of this broker, sorted by name. ``log_defaults``: the static topic
    defaults (the log manager's default LogConfig); ``dynamic``: the dynamic broker configs
    by resource name ("" every broker)."""
    entries = _static_entries(config, log_defaults)
    own = (dynamic or {}).get(str(config.broker_id), {})
    every = (dynamic or {}).get(CLUSTER_DEFAULT, {})
    # Stored-only dynamic configs (no effect here) appear once set, here or cluster-wide.
    listed = {e.name for e in entries}
    for scope in (own, every):
        for name in scope:
            if name in STORED_DYNAMIC_BROKER_CONFIGS and name not in listed:
                entries.append(BrokerConfigEntry(
                    name, "", DEFAULT_CONFIG,
                    _TOPIC_TYPES[STORED_DYNAMIC_BROKER_CONFIGS[name]], ""))
                listed.add(name)
    entries.sort(key=lambda e: e.name)
    out = []
    for e in entries:
        layers = [(own[e.name], DYNAMIC_BROKER_CONFIG)] if e.name in own else []
        if e.name in every:
            layers.append((every[e.name], DYNAMIC_DEFAULT_BROKER_CONFIG))
        out.append(dataclasses.replace(e, dynamic=tuple(layers)))
    return out


def topic_default_sources(config: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]]
                          ) -> dict[str, int]:
    """The ConfigSource of each topic config's broker-level default that is not Kafka's
    default, by topic config name: this broker's dynamic value, the cluster-wide dynamic
    one, or a ``--set`` one."""
    own = dynamic.get(str(config.broker_id), {})
    every = dynamic.get(CLUSTER_DEFAULT, {})
    out = {}
    for broker_name, topic_name in DYNAMIC_BROKER_CONFIGS.items():
        if broker_name in own:
            out[topic_name] = DYNAMIC_BROKER_CONFIG
        elif broker_name in every:
            out[topic_name] = DYNAMIC_DEFAULT_BROKER_CONFIG
        elif topic_name in config.static_names or broker_name in config.static_names:
            out[topic_name] = STATIC_BROKER_CONFIG
    return out


def cluster_default_entries(entries: list[BrokerConfigEntry],
                            dynamic: Mapping[str, Mapping[str, str]]) -> list[BrokerConfigEntry]:
    """The "" resource: the cluster-wide dynamic defaults that are set, alone."""
    every = dynamic.get(CLUSTER_DEFAULT, {})
    return [dataclasses.replace(e, dynamic=((every[e.name], DYNAMIC_DEFAULT_BROKER_CONFIG),))
            for e in entries if e.name in every]


def _static_entries(config: BrokerConfig, log_defaults: LogConfig) -> list[BrokerConfigEntry]:
    defaults = {f.name: f.default for f in dataclasses.fields(BrokerConfig)
                if f.default is not dataclasses.MISSING}
    entries = [BrokerConfigEntry("broker.id", str(config.broker_id), STATIC_BROKER_CONFIG,
                                 INT, "-1")]
    for name, attr in BROKER_SETTING_FIELDS.items():
        value = getattr(config, attr)
        config_type = (BOOLEAN if isinstance(value, bool) else STRING if isinstance(value, str)
                       else LONG if name in _LONG_SETTINGS
                       else SHORT if name in _SHORT_SETTINGS else INT)
        entries.append(BrokerConfigEntry(
            name, _text(value), STATIC_BROKER_CONFIG if name in config.static_names
            else DEFAULT_CONFIG, config_type, _text(defaults.get(attr, value))))
    in_force, kafka_defaults = log_defaults.to_configs(), LogConfig().to_configs()
    for name, topic_name in KAFKA_LOG_DEFAULT_NAMES.items():
        entries.append(BrokerConfigEntry(
            name, in_force[topic_name], STATIC_BROKER_CONFIG
            if topic_name in config.static_names else DEFAULT_CONFIG,
            _TOPIC_TYPES[TOPIC_CONFIGS[topic_name].type], kafka_defaults[topic_name]))
    return sorted(entries, key=lambda e: e.name)


def describe_values(entries: list[BrokerConfigEntry], keys: list[str] | None,
                    include_synonyms: bool) -> list[dict[str, Any]]:
    """DescribeConfigs' ``configs`` of a BROKER resource (``keys`` None: all)."""
    wanted = None if keys is None else set(keys)
    out = []
    for e in entries:
        if wanted is not None and e.name not in wanted:
            continue
        synonyms = []
        if include_synonyms:
            synonyms += [{"name": e.name, "value": value, "source": source}
                         for value, source in e.dynamic]
            synonyms.append({"name": e.name, "value": e.value, "source": e.source})
            if e.source != DEFAULT_CONFIG:
                synonyms.append({"name": e.name, "value": e.default, "source": DEFAULT_CONFIG})
        source = e.source_in_force
        sensitive = e.config_type == PASSWORD  # as Kafka: never described in clear
        if sensitive:
            synonyms = [{**s, "value": None} for s in synonyms]
        out.append({"name": e.name, "value": None if sensitive else e.value_in_force,
                    "read_only": not is_dynamic_broker_config(e.name),
                    "config_source": source, "is_default": source == DEFAULT_CONFIG,
                    "is_sensitive": sensitive, "synonyms": synonyms,
                    "config_type": e.config_type, "documentation": None})
    return out
