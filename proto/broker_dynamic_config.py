"""The broker configs that AlterConfigs may change at run time (Kafka's dynamic ones).

Each is the broker-wide default of a topic config (Kafka's ``LogConfig`` synonyms:
``log.retention.ms`` is the default of every topic's ``retention.ms``), so its
value is parsed and checked by the topic config parser under the topic name.
Kafka lets all of these change cluster-wide (the "" resource, its
``--entity-default``) and per broker. Any other broker config is read-only here:
AlterConfigs refuses it (INVALID_REQUEST, as Kafka's "Cannot update these
configs dynamically").

Precedence, as Kafka's DynamicBrokerConfig: the broker's own dynamic value,
then the cluster-wide dynamic default, then the static ``--set`` value, then
the default.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.topic_config import parse_topic_config

# Kafka's broker-level names of the topic defaults (``log.segment.bytes`` is the
# default of every topic's ``segment.bytes``).
KAFKA_LOG_DEFAULT_NAMES = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.retention.bytes": "retention.bytes",
    "log.retention.ms": "retention.ms",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
}

# Dynamic broker config -> the topic config it is the default of.
DYNAMIC_BROKER_CONFIGS = {
    **KAFKA_LOG_DEFAULT_NAMES,
    "message.max.bytes": "max.message.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

CLUSTER_DEFAULT = ""  # the resource name of the cluster-wide dynamic defaults


def validate_dynamic_broker_config(name: str, raw: str) -> None:
    """InvalidConfigError when ``raw`` is not a valid value of dynamic config ``name``."""
    topic_name = DYNAMIC_BROKER_CONFIGS[name]
    try:
        parse_topic_config(topic_name, raw)
    except InvalidConfigError as e:
        raise InvalidConfigError(f"invalid value {raw!r} for broker config {name}: "
                                 f"{str(e).rpartition(': ')[2]}") from None


def dynamic_topic_defaults(overrides: Mapping[str, Mapping[str, str]],
                           broker_id: int) -> dict[str, str]:
    """The topic-named defaults the dynamic broker configs set for ``broker_id``: the
    cluster-wide ones, overlaid by the broker's own."""
    merged = {**overrides.get(CLUSTER_DEFAULT, {}), **overrides.get(str(broker_id), {})}
    return {DYNAMIC_BROKER_CONFIGS[name]: value for name, value in merged.items()
            if name in DYNAMIC_BROKER_CONFIGS}
