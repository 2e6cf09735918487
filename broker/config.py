"""The broker's configuration: command-line flags and ``--set name=value`` overrides.

Names follow Kafka's. Broker-level settings become fields of ``BrokerConfig``;
topic-level settings (``segment.bytes``, ``retention.ms``, ...) are kept as the
broker's defaults for every topic and are overridden per topic by the configs
the controller sends in LeaderAndIsr. An unknown name or a malformed value is a
``ConfigError`` (``python -m broker`` exits 2 with its one-line message).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.kafka.connection_quotas import (
    KAFKA_INT_MAX,
    ConnectionLimits,
    parse_per_ip_overrides,
)
from tidewater.broker.replication.replica import FollowerOptions
from tidewater.broker.security.inter_broker import CredentialsFileError, InterBrokerCredentials
from tidewater.broker.security.settings import (
    SASL_MECHANISMS,
    SECURITY_SETTING_NAMES,
    SecuritySettings,
    read_user_config,
)
from tidewater.broker.servicers.grpc_limits import check_connection_settings
from tidewater.broker.storage.log_config import LOG_CONFIG_NAMES, LogConfig
from tidewater.proto.broker_dynamic_config import KAFKA_LOG_DEFAULT_NAMES
from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.tls import TlsConfigError, TlsFiles, add_tls_arguments
from tidewater.proto.topic_config import TOPIC_CONFIGS, min_insync_replicas

MIB = 1024 * 1024


class ConfigError(ValueError):
    """A flag or ``--set`` value the broker cannot start with."""


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None


# A rack name: what Kafka's broker.rack carries, kept short and printable (it travels in
# every Metadata answer and is shown by the console).
RACK_CHARS_MAX = 64


def _rack(name: str, value: str) -> str:
    rack = value.strip()
    if len(rack) > RACK_CHARS_MAX or not all(c.isprintable() and not c.isspace() for c in rack):
        raise ConfigError(f"{name}: expected at most {RACK_CHARS_MAX} printable characters "
                          f"without spaces, got {value!r}")
    return rack


def _text(name: str, value: str) -> str:
    return value.strip()


def _bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


# Broker-level names -> (field name, parser). Topic-level names below.
_BROKER_SETTINGS = {
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", _int),
    "min.insync.replicas": ("min_insync_replicas", _int),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _bool),
    "broker.rack": ("broker_rack", _rack),
    "broker.session.timeout.ms": ("broker_session_timeout_ms", _int),
    "broker.heartbeat.interval.ms": ("broker_heartbeat_interval_ms", _int),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", _int),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", _int),
    "replica.fetch.backoff.ms": ("replica_fetch_backoff_ms", _int),
    "message.max.bytes": ("message_max_bytes", _int),
    "log.retention.check.interval.ms": ("log_retention_check_interval_ms", _int),
    "log.flush.offset.checkpoint.interval.ms": ("log_flush_offset_checkpoint_interval_ms", _int),
    "num.recovery.threads.per.data.dir": ("num_recovery_threads_per_data_dir", _int),
    "socket.request.max.bytes": ("socket_request_max_bytes", _int),
    "sasl.server.max.receive.size": ("sasl_server_max_receive_size", _int),
    "controlled.shutdown.timeout.ms": ("controlled_shutdown_timeout_ms", _int),
    "log.scrub.bytes.per.second": ("log_scrub_bytes_per_second", _int),
    "log.scrub.interval.ms": ("log_scrub_interval_ms", _int),
    "offsets.topic.num.partitions": ("offsets_topic_num_partitions", _int),
    "offsets.topic.replication.factor": ("offsets_topic_replication_factor", _int),
    "offsets.commit.timeout.ms": ("offsets_commit_timeout_ms", _int),
    "offsets.retention.minutes": ("offsets_retention_minutes", _int),
    "offsets.retention.check.interval.ms": ("offsets_retention_check_interval_ms", _int),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", _int),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", _int),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", _int),
    "transaction.state.log.num.partitions": ("transaction_state_log_num_partitions", _int),
    "transaction.state.log.replication.factor": ("transaction_state_log_replication_factor",
                                                 _int),
    "transaction.state.log.min.isr": ("transaction_state_log_min_isr", _int),
    "transaction.state.log.segment.bytes": ("transaction_state_log_segment_bytes", _int),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", _int),
    "transactional.id.expiration.ms": ("transactional_id_expiration_ms", _int),
    "transaction.partition.verification.enable": (
        "transaction_partition_verification_enable", _bool),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms", _int),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", _int),
    "log.cleaner.enable": ("log_cleaner_enable", _bool),
    "log.cleaner.io.max.bytes.per.second": ("log_cleaner_io_max_bytes_per_second", _int),
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", _int),
    "auto.create.topics.enable": ("auto_create_topics_enable", _bool),
    "inter.broker.credentials.file": ("inter_broker_credentials_file", _text),
    "metrics.bind.address": ("metrics_bind_address", _text),
    "max.connections": ("max_connections", _int),
    "max.connections.per.ip": ("max_connections_per_ip", _int),
    "max.connections.per.ip.overrides": ("max_connections_per_ip_overrides", _text),
    "max.connection.creation.rate": ("max_connection_creation_rate", _int),
    "connections.max.idle.ms": ("connections_max_idle_ms", _int),
    "max.incremental.fetch.session.cache.slots": (
        "max_incremental_fetch_session_cache_slots", _int),
    "min.incremental.fetch.session.eviction.ms": (
        "min_incremental_fetch_session_eviction_ms", _int),
}

# Kafka name -> BrokerConfig field of every broker-level setting (DescribeConfigs).
BROKER_SETTING_FIELDS = {name: attr for name, (attr, _) in _BROKER_SETTINGS.items()}

# Topic-level log settings (segment.bytes, retention.ms, ...) are accepted as
# defaults for every topic; LogConfig.from_configs checks their values.
_TOPIC_INT_NAMES = frozenset(name for name in LOG_CONFIG_NAMES
                             if TOPIC_CONFIGS[name].type in ("int", "long"))

# Kafka's broker-level names of the topic defaults (``log.segment.bytes`` is the
# default of every topic's ``segment.bytes``); ``--set`` takes either name.
# (``message.max.bytes``, ``min.insync.replicas`` and ``unclean.leader.election.enable``
# are broker settings above, their topic names the per-topic overrides.)
# KAFKA_LOG_DEFAULT_NAMES (proto.broker_dynamic_config) maps them; re-exported here.

# Per-topic names that are not log settings but replication settings.
TOPIC_REPLICATION_NAMES = frozenset({"min.insync.replicas", "unclean.leader.election.enable"})


@dataclass
class BrokerConfig:
    broker_id: int
    listen: tuple[str, int]
    controller: tuple[str, int]
    data_dir: Path
    # Kafka's controller.quorum.bootstrap.servers (``--controller`` with several entries):
    # (node id or -1, host, port) of each controller; empty: ``controller`` alone.
    controller_bootstrap: tuple[tuple[int, str, int], ...] = ()
    advertise: tuple[str, int] | None = None
    external_listen: tuple[str, int] | None = None
    external_advertise: tuple[str, int] | None = None
    # Kafka's binary protocol (broker/kafka); None: no such listener.
    kafka_listen: tuple[str, int] | None = None
    kafka_advertise: tuple[str, int] | None = None
    # A second one with its own advertised address (Kafka's dual listeners: one for
    # clients inside a network, one published to the host).
    kafka_external_listen: tuple[str, int] | None = None
    kafka_external_advertise: tuple[str, int] | None = None
    metrics_port: int = 0
    # Where /metrics listens (with --metrics-port): this host only unless configured, so
    # a broker's metrics are not published on every address it has (0.0.0.0: all).
    metrics_bind_address: str = "127.0.0.1"
    log_level: str = "INFO"
    # Kafka: 30 s. A local cluster wants failures noticed in a few seconds.
    replica_lag_time_max_ms: int = 3000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    broker_session_timeout_ms: int = 3000
    # Kafka's broker.rack: registered with the controller and answered in Metadata;
    # "" is no rack (Kafka's null).
    broker_rack: str = ""
    broker_heartbeat_interval_ms: int = 500
    replica_fetch_max_bytes: int = 8 * MIB  # larger follower fetches: fewer round trips per MB replicated
    # A follower's long-poll returns as soon as data arrives, so acks=all
    # latency does not depend on this; it only bounds an idle round trip.
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_backoff_ms: int = 200
    message_max_bytes: int = 1048588
    log_retention_check_interval_ms: int = 30_000
    log_flush_offset_checkpoint_interval_ms: int = 1000
    # Logs recovered at once after an unclean shutdown (storage/log_manager.py: why not 1).
    num_recovery_threads_per_data_dir: int = 4
    socket_request_max_bytes: int = 100 * MIB
    # Kafka's: the largest request a SASL listener reads from a client not authenticated
    # yet (a larger size prefix closes the connection before anything is read or decoded).
    sasl_server_max_receive_size: int = 524_288
    controlled_shutdown_timeout_ms: int = 5000
    # The background scrub of closed segments (broker/storage/scrub.py); 0 = off. HDFS's
    # block scanner reads 1 MiB/s per volume by default: a TiB in ~12 days, on any disk.
    log_scrub_bytes_per_second: int = MIB
    log_scrub_interval_ms: int = 3_600_000  # from the end of one pass to the next
    # The group coordinator (broker/group), Kafka's names and defaults. The offsets
    # topic is created with these on first use; the replication factor is capped at the
    # live broker count then.
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_commit_timeout_ms: int = 5000  # an acks=all wait for a group's write
    offsets_retention_minutes: int = 7 * 24 * 60  # an empty group's offsets then expire
    offsets_retention_check_interval_ms: int = 600_000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3000
    # The transaction coordinator (broker/txn), Kafka's names and defaults. The
    # transaction state topic is created with these on the first FindCoordinator for a
    # transactional id; the replication factor is capped at the live broker count then,
    # and min.insync.replicas at the replication factor.
    transaction_state_log_num_partitions: int = 50
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_state_log_segment_bytes: int = 100 * MIB
    transaction_max_timeout_ms: int = 900_000  # a producer's transaction.timeout.ms at most
    transactional_id_expiration_ms: int = 604_800_000  # an idle id is then forgotten
    # KIP-890 part 1: a transactional producer's first batch in a partition is appended
    # only once its coordinator confirms the partition is in the ongoing transaction
    # (broker/txn/verification.py).
    transaction_partition_verification_enable: bool = True
    # How often open transactions are checked against their timeout (Kafka: 10 s).
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    # An idempotent producer idle this long is forgotten by every partition (Kafka: 1 day).
    producer_id_expiration_ms: int = 86_400_000
    # The log cleaner of cleanup.policy=compact topics (broker/storage/cleaner.py), Kafka's
    # names: a pass every log.cleaner.backoff.ms, reads + writes at most this many bytes
    # per second (0: no limit, Kafka's default).
    log_cleaner_enable: bool = True
    log_cleaner_io_max_bytes_per_second: int = 0
    log_cleaner_backoff_ms: int = 15_000
    # Kafka clients' Metadata (when they allow it) and Produce create an unknown topic with
    # the controller's num.partitions and default.replication.factor (broker/kafka/auto_create.py).
    auto_create_topics_enable: bool = True
    # Fetch sessions of Kafka clients (KIP-227, broker/kafka/fetch_sessions.py): at most this
    # many sessions (0: none, every fetch is a full fetch); a session unused this long may
    # be evicted for a new one, and younger ones only by a larger session.
    max_incremental_fetch_session_cache_slots: int = 1000
    min_incremental_fetch_session_eviction_ms: int = 120_000
    # Topic-level defaults given with --set (topic config names -> string values).
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # The Kafka names given with --set (DescribeConfigs: STATIC_BROKER_CONFIG, the rest
    # DEFAULT_CONFIG); topic defaults by their topic config names.
    static_names: set[str] = field(default_factory=set)
    # --tls-ca/--tls-cert/--tls-key; None: plaintext everywhere, as before TLS existed.
    tls: TlsFiles | None = None
    # --sasl-mechanisms, --authorizer, --super-users (broker/security/settings.py).
    security: SecuritySettings = field(default_factory=SecuritySettings)
    # The SASL user this broker authenticates as on other brokers' INTERNAL listeners
    # (a Kafka client properties file: sasl.username, sasl.password); "" for none.
    # With SASL or an authorizer, leaders take follower fetches only from a super user
    # (or a principal with CLUSTER_ACTION): broker/security/inter_broker.py.
    inter_broker_credentials_file: str = ""
    # The Kafka listeners' connections (broker/kafka/connection_quotas.py), Kafka's names
    # and defaults: refused beyond these counts and rate; closed after this long idle.
    max_connections: int = KAFKA_INT_MAX
    max_connections_per_ip: int = KAFKA_INT_MAX
    max_connections_per_ip_overrides: str = ""  # host:count,host:count
    max_connection_creation_rate: int = KAFKA_INT_MAX  # per second (KIP-612)
    connections_max_idle_ms: int = 600_000
    # The dynamic broker configs in force here, by their topic config names (AlterConfigs
    # on BROKER resources; ``proto.broker_dynamic_config``): set from each UpdateMetadata,
    # they win over the static topic defaults.
    dynamic_topic_defaults: dict[str, str] = field(default_factory=dict)
    # --controller-sasl-config: (user, password) this broker authenticates as to the
    # controller (SASL/PLAIN call metadata); None: none sent.
    controller_sasl_user: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.advertise is None:
            self.advertise = self.listen
        if self.external_listen is not None and self.external_advertise is None:
            self.external_advertise = self.external_listen
        if self.kafka_listen is not None and self.kafka_advertise is None:
            self.kafka_advertise = self.kafka_listen
        if self.kafka_external_listen is not None and self.kafka_external_advertise is None:
            self.kafka_external_advertise = self.kafka_external_listen

    def kafka_listeners(self) -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
        """(listener name, listen, advertise) of each Kafka-protocol listener."""
        out = []
        if self.kafka_listen is not None and self.kafka_advertise is not None:
            out.append(("KAFKA", self.kafka_listen, self.kafka_advertise))
        if self.kafka_external_listen is not None and self.kafka_external_advertise is not None:
            out.append(("KAFKA_EXTERNAL", self.kafka_external_listen,
                        self.kafka_external_advertise))
        return out

    def apply_settings(self, settings: Mapping[str, str]) -> None:
        """Apply ``name=value`` settings with Kafka names; ConfigError on unknown names."""
        for given, value in settings.items():
            name = KAFKA_LOG_DEFAULT_NAMES.get(given, given)
            self.static_names.add(name)
            if name in SECURITY_SETTING_NAMES:
                try:
                    self.security = self.security.with_setting(name, value)
                except ValueError as e:
                    raise ConfigError(f"{name}: {e}") from None
            elif name in _BROKER_SETTINGS:
                attr, parse = _BROKER_SETTINGS[name]
                setattr(self, attr, parse(name, value))
            elif name in LOG_CONFIG_NAMES:
                if name in _TOPIC_INT_NAMES:
                    _int(name, value)
                self.topic_defaults[name] = value
            else:
                raise ConfigError(f"unknown setting {name!r}")
        try:
            LogConfig.from_configs(self.log_config_overrides())
        except InvalidConfigError as e:
            raise ConfigError(str(e)) from None
        self.validate()

    def validate(self) -> None:
        positive = {
            "replica.lag.time.max.ms": self.replica_lag_time_max_ms,
            "min.insync.replicas": self.min_insync_replicas,
            "broker.session.timeout.ms": self.broker_session_timeout_ms,
            "broker.heartbeat.interval.ms": self.broker_heartbeat_interval_ms,
            "replica.fetch.max.bytes": self.replica_fetch_max_bytes,
            "message.max.bytes": self.message_max_bytes,
            "log.retention.check.interval.ms": self.log_retention_check_interval_ms,
            "log.flush.offset.checkpoint.interval.ms": self.log_flush_offset_checkpoint_interval_ms,
            "num.recovery.threads.per.data.dir": self.num_recovery_threads_per_data_dir,
            "socket.request.max.bytes": self.socket_request_max_bytes,
            "sasl.server.max.receive.size": self.sasl_server_max_receive_size,
            "offsets.topic.num.partitions": self.offsets_topic_num_partitions,
            "offsets.topic.replication.factor": self.offsets_topic_replication_factor,
            "offsets.commit.timeout.ms": self.offsets_commit_timeout_ms,
            "offsets.retention.minutes": self.offsets_retention_minutes,
            "offsets.retention.check.interval.ms": self.offsets_retention_check_interval_ms,
            "group.min.session.timeout.ms": self.group_min_session_timeout_ms,
            "transaction.state.log.num.partitions": self.transaction_state_log_num_partitions,
            "transaction.state.log.replication.factor":
                self.transaction_state_log_replication_factor,
            "transaction.state.log.min.isr": self.transaction_state_log_min_isr,
            "transaction.state.log.segment.bytes": self.transaction_state_log_segment_bytes,
            "transaction.max.timeout.ms": self.transaction_max_timeout_ms,
            "transactional.id.expiration.ms": self.transactional_id_expiration_ms,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms":
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            "producer.id.expiration.ms": self.producer_id_expiration_ms,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        try:  # the gRPC ports' bounds, the controller's check
            check_connection_settings(self.max_connections, self.connections_max_idle_ms)
        except InvalidConfigError as e:
            raise ConfigError(str(e)) from None
        if self.replica_fetch_wait_max_ms < 0:
            raise ConfigError("replica.fetch.wait.max.ms must not be negative")
        if self.group_max_session_timeout_ms < self.group_min_session_timeout_ms:
            raise ConfigError("group.max.session.timeout.ms is below group.min.session.timeout.ms")
        if self.group_initial_rebalance_delay_ms < 0:
            raise ConfigError("group.initial.rebalance.delay.ms must not be negative")
        if self.log_scrub_bytes_per_second < 0:
            raise ConfigError("log.scrub.bytes.per.second must not be negative (0 = off)")
        if self.log_cleaner_io_max_bytes_per_second < 0:
            raise ConfigError("log.cleaner.io.max.bytes.per.second must not be negative "
                              "(0 = no limit)")
        if self.log_cleaner_backoff_ms <= 0:
            raise ConfigError("log.cleaner.backoff.ms must be positive")
        if self.log_scrub_interval_ms < 0:
            raise ConfigError("log.scrub.interval.ms must not be negative")
        if self.max_incremental_fetch_session_cache_slots < 0:
            raise ConfigError("max.incremental.fetch.session.cache.slots must not be negative")
        if self.min_incremental_fetch_session_eviction_ms < 0:
            raise ConfigError("min.incremental.fetch.session.eviction.ms must not be negative")
        if self.broker_id < 0:
            raise ConfigError(f"--broker-id must not be negative, got {self.broker_id}")
        if not self.metrics_bind_address:
            raise ConfigError("metrics.bind.address is empty (0.0.0.0 for every address)")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port out of range: {self.metrics_port}")
        try:
            self.connection_limits  # noqa: B018  (validates)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        inter_broker = self.security.inter_broker_mechanism
        if inter_broker and self.security.sasl_mechanisms \
                and inter_broker not in self.security.sasl_mechanisms:
            # Kafka's rule: the brokers must take what they authenticate to each other with.
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol {inter_broker} is not "
                              f"an enabled mechanism ({','.join(self.security.sasl_mechanisms)})")
        if self.inter_broker_credentials_file:
            try:
                InterBrokerCredentials.read(self.inter_broker_credentials_file)
            except CredentialsFileError as e:
                raise ConfigError(f"inter.broker.credentials.file: {e}") from None

    @property
    def connection_limits(self) -> ConnectionLimits:
        """The Kafka listeners' connection limits; ValueError for a bad value."""
        return ConnectionLimits(
            connections_max=self.max_connections,
            connections_per_ip_max=self.max_connections_per_ip,
            connections_per_ip_overrides=parse_per_ip_overrides(
                self.max_connections_per_ip_overrides),
            connection_creation_rate_max=self.max_connection_creation_rate,
            idle_ms=self.connections_max_idle_ms)

    @property
    def follower_options(self) -> FollowerOptions:
        """How this broker's replicas follow (the replication core's options)."""
        return FollowerOptions(fetch_backoff_ms=self.replica_fetch_backoff_ms)

    def log_config_overrides(self, topic_configs: Mapping[str, str] | None = None) -> dict[str, str]:
        """The log settings for a topic: broker defaults, then the topic's own configs."""
        merged = dict(self.topic_defaults)
        if "max.message.bytes" not in merged:
            merged["max.message.bytes"] = str(self.message_max_bytes)
        for name, value in [*self.dynamic_topic_defaults.items(),
                            *(topic_configs or {}).items()]:
            if name in LOG_CONFIG_NAMES:
                merged[name] = value
        return merged

    def min_insync_replicas_for(self, topic_configs: Mapping[str, str] | None) -> int:
        """The topic's own value (InvalidConfigError when malformed), else the broker's."""
        default = min_insync_replicas(self.dynamic_topic_defaults, self.min_insync_replicas)
        return min_insync_replicas(topic_configs or {}, default)


def parse_host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{flag}: expected HOST:PORT, got {text!r}")
    port_number = _int(flag, port)
    if not 0 <= port_number <= 65535:
        raise ConfigError(f"{flag}: port out of range in {text!r}")
    return host.strip("[]"), port_number


def parse_controllers(text: str, flag: str) -> tuple[tuple[int, str, int], ...]:
    """``HOST:PORT[,...]`` or ``ID@HOST:PORT[,...]`` (ids let a broker follow a standby's
    NOT_CONTROLLER hint straight to the leader) -> ((id or -1, host, port), ...)."""
    controllers: list[tuple[int, str, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, at, address = part.rpartition("@")
        node_id = _int(flag, node) if at else -1
        if at and node_id < 0:
            raise ConfigError(f"{flag}: negative controller id in {part!r}")
        host, port = parse_host_port(address, flag)
        controllers.append((node_id, host, port))
    if not controllers:
        raise ConfigError(f"{flag}: expected HOST:PORT[,HOST:PORT...], got {text!r}")
    ids = [i for i, _, _ in controllers if i >= 0]
    if len(ids) != len(set(ids)):
        raise ConfigError(f"{flag}: a controller id is listed twice in {text!r}")
    return tuple(controllers)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tide-broker", description="A Tidewater broker")
    p.add_argument("--broker-id", type=int, required=True)
    p.add_argument("--listen", required=True, help="HOST:PORT of the INTERNAL listener")
    p.add_argument("--advertise", help="HOST:PORT others use for INTERNAL (default: --listen)")
    p.add_argument("--external-listen", help="HOST:PORT of an optional EXTERNAL listener")
    p.add_argument("--external-advertise", help="advertised EXTERNAL HOST:PORT")
    p.add_argument("--kafka-listen",
                   help="HOST:PORT of an optional listener speaking Kafka's binary protocol")
    p.add_argument("--kafka-advertise",
                   help="HOST:PORT Kafka clients are given (default: --kafka-listen)")
    p.add_argument("--kafka-external-listen",
                   help="HOST:PORT of a second Kafka-protocol listener (e.g. published to a "
                        "host), with its own advertised addresses")
    p.add_argument("--kafka-external-advertise",
                   help="HOST:PORT given to clients of --kafka-external-listen")
    p.add_argument("--controller", required=True,
                   help="HOST:PORT of the controller, or of each controller of a quorum "
                        "(controller.quorum.bootstrap.servers: HOST:PORT,... or "
                        "ID@HOST:PORT,...): the broker follows NOT_CONTROLLER answers")
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port, 0 = off")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="Kafka-named broker or default topic setting (repeatable)")
    add_tls_arguments(p)
    p.add_argument("--sasl-mechanisms", default="",
                   help="comma-separated SASL mechanisms the Kafka listeners require "
                        f"({', '.join(SASL_MECHANISMS)}); empty: no SASL. With --tls-* the "
                        "listeners are SASL_SSL, else SASL_PLAINTEXT")
    p.add_argument("--authorizer", default="none", choices=["none", "acl"],
                   help="acl: check every client request against the cluster's ACLs")
    p.add_argument("--super-users", default="",
                   help="principals allowed everything, ';'-separated (User:admin;User:ops)")
    p.add_argument("--controller-sasl-config", type=Path, default=None, metavar="FILE",
                   help="Kafka client properties (sasl.username, sasl.password) of the user "
                        "this broker authenticates as to a controller with SASL on (a super "
                        "user: the controller takes brokers' calls only with CLUSTER_ACTION)")
    p.add_argument("--allow-everyone-if-no-acl-found", action="store_true",
                   help="a resource no ACL names is open to all (Kafka's "
                        "allow.everyone.if.no.acl.found; default: refused)")
    return p


def parse_settings(items: Sequence[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set expects NAME=VALUE, got {item!r}")
        settings[name.strip()] = value.strip()
    return settings


def config_from_args(argv: Sequence[str] | None = None) -> BrokerConfig:
    """Parse the command line; argparse errors exit 2, bad values raise ConfigError."""
    args = build_arg_parser().parse_args(argv)
    try:
        tls = TlsFiles.from_flags(args.tls_ca, args.tls_cert, args.tls_key)
    except TlsConfigError as e:
        raise ConfigError(str(e)) from None
    config = BrokerConfig(
        broker_id=args.broker_id,
        listen=parse_host_port(args.listen, "--listen"),
        advertise=parse_host_port(args.advertise, "--advertise") if args.advertise else None,
        external_listen=(parse_host_port(args.external_listen, "--external-listen")
                         if args.external_listen else None),
        external_advertise=(parse_host_port(args.external_advertise, "--external-advertise")
                            if args.external_advertise else None),
        kafka_listen=(parse_host_port(args.kafka_listen, "--kafka-listen")
                      if args.kafka_listen else None),
        kafka_advertise=(parse_host_port(args.kafka_advertise, "--kafka-advertise")
                         if args.kafka_advertise else None),
        kafka_external_listen=(
            parse_host_port(args.kafka_external_listen, "--kafka-external-listen")
            if args.kafka_external_listen else None),
        kafka_external_advertise=(
            parse_host_port(args.kafka_external_advertise, "--kafka-external-advertise")
            if args.kafka_external_advertise else None),
        controller=parse_controllers(args.controller, "--controller")[0][1:],
        controller_bootstrap=parse_controllers(args.controller, "--controller"),
        data_dir=args.data_dir,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        tls=tls,
    )
    try:
        config.security = SecuritySettings(
            sasl_mechanisms=tuple(m.strip() for m in args.sasl_mechanisms.split(",")
                                  if m.strip()),
            authorizer=args.authorizer,
            super_users=SecuritySettings.parse_super_users(args.super_users),
            allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found)
        if args.controller_sasl_config is not None:
            config.controller_sasl_user = read_user_config(args.controller_sasl_config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # Kafka's names work with --set too (sasl.enabled.mechanisms, super.users, ...).
    config.apply_settings(parse_settings(args.set))
    return config
