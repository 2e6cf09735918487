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
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "log.message.timestamp.difference.max.ms": "message.timestamp.difference.max.ms",
    "compression.type": "compression.type",  # Kafka's broker name is the topic's
}

# Dynamic broker config -> the topic config it is the default of.
DYNAMIC_BROKER_CONFIGS = {
    **KAFKA_LOG_DEFAULT_NAMES,
    "message.max.bytes": "max.message.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

CLUSTER_DEFAULT = ""  # the resource name of the cluster-wide dynamic defaults

# Kafka's other dynamic broker configs (DynamicBrokerConfig's reconfigurables: thread
# pools, listener security, cleaner, throttles) with their Kafka types. None has an
# effect here (Tidewater has no such thread pool, Kerberos, or leader-side throttle) but
# transaction.partition.verification.enable and follower.replication.throttled.rate
# (broker/following/throttle.py reads it): they are accepted with their type checked,
# kept in the metadata log and described with their source, so tools that set them
# work; the README lists them.
STORED_DYNAMIC_BROKER_CONFIGS: dict[str, str] = {
    "background.threads": "int",
    "num.io.threads": "int",
    "num.network.threads": "int",
    "num.replica.fetchers": "int",
    "num.recovery.threads.per.data.dir": "int",
    "log.cleaner.threads": "int",
    "log.cleaner.dedupe.buffer.size": "long",
    "log.cleaner.io.buffer.size": "int",
    "log.cleaner.io.buffer.load.factor": "double",
    "log.cleaner.io.max.bytes.per.second": "double",
    "log.cleaner.backoff.ms": "long",
    "log.preallocate": "boolean",
    "log.message.downconversion.enable": "boolean",
    "leader.replication.throttled.rate": "long",
    "follower.replication.throttled.rate": "long",
    "replica.alter.log.dirs.io.max.bytes.per.second": "long",
    "metric.reporters": "list",
    "max.connections": "int",
    "max.connections.per.ip": "int",
    "max.connections.per.ip.overrides": "string",
    "max.connection.creation.rate": "int",
    "sasl.enabled.mechanisms": "list",
    "sasl.jaas.config": "password",
    "sasl.kerberos.kinit.cmd": "string",
    "sasl.kerberos.min.time.before.relogin": "long",
    "sasl.kerberos.principal.to.local.rules": "list",
    "sasl.kerberos.service.name": "string",
    "sasl.kerberos.ticket.renew.jitter": "double",
    "sasl.kerberos.ticket.renew.window.factor": "double",
    "sasl.login.refresh.buffer.seconds": "short",
    "sasl.login.refresh.min.period.seconds": "short",
    "sasl.login.refresh.window.factor": "double",
    "sasl.login.refresh.window.jitter": "double",
    "producer.id.expiration.ms": "int",
    # The one in force (KIP-890, ``ReplicaManager.update_metadata``: ``dynamic_flag``).
    "transaction.partition.verification.enable": "boolean",
}


def is_dynamic_broker_config(name: str) -> bool:
    """May AlterConfigs change broker config ``name`` (with or without an effect here)?"""
    return name in DYNAMIC_BROKER_CONFIGS or name in STORED_DYNAMIC_BROKER_CONFIGS


def validate_dynamic_broker_config(name: str, raw: str) -> None:
    """InvalidConfigError when ``raw`` is not a valid value of dynamic config ``name``."""
    if name in STORED_DYNAMIC_BROKER_CONFIGS:
        _check_type(name, STORED_DYNAMIC_BROKER_CONFIGS[name], raw)
        return
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


TXN_VERIFICATION = "transaction.partition.verification.enable"


def dynamic_flag(overrides: Mapping[str, Mapping[str, str]], broker_id: int, name: str,
                 static: bool) -> bool:
    """A boolean broker config in force on ``broker_id``: its own dynamic value, else the
    cluster-wide one, else ``static`` (``--set`` or the default)."""
    merged = {**overrides.get(CLUSTER_DEFAULT, {}), **overrides.get(str(broker_id), {})}
    raw = merged.get(name)
    return static if raw is None else raw.strip().lower() == "true"


def _check_type(name: str, kind: str, raw: str) -> None:
    value = raw.strip()
    try:
        if kind in ("int", "long", "short"):
            int(value)
        elif kind == "double":
            float(value)
        elif kind == "boolean" and value.lower() not in ("true", "false"):
            raise ValueError(value)
    except ValueError:
        raise InvalidConfigError(f"invalid value {raw!r} for broker config {name}: "
                                 f"expected a {kind}") from None
