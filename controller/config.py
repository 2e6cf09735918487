"""Controller settings, set with ``--set name=value`` using Kafka's names.

Defaults suit a local cluster: a broker silent for 3 s is fenced (Kafka: 9 s
in KRaft, 18 s with ZooKeeper). That timeout only matters for a paused,
partitioned or hung broker: a broker whose process died is fenced as soon as
its heartbeat stream ends (see ``controller.service``), so failover after a
crash takes tens of milliseconds.

``max.connections`` and ``connections.max.idle.ms`` (Kafka's names) limit the
controller's gRPC port and, with a quorum, its Raft port, each counted alone
(``broker.servicers.grpc_limits``): a connection beyond the cap is closed by gRPC
before its handshake, and one with no call open for the idle time is sent GOAWAY. A
broker's heartbeat stream is a call open, so a live broker's connection never idles.
The default cap is 1,000 per port, not Kafka's none: only members and admin tools
connect here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from tidewater.broker.security.settings import SecuritySettings
from tidewater.broker.servicers.grpc_limits import (
    CONNECTIONS_MAX_IDLE_MS,
    CONTROLLER_MAX_CONNECTIONS,
    check_connection_settings,
)
from tidewater.controller.quorum.config import (
    Endpoint,
    QuorumConfig,
    parse_endpoints,
    parse_initial_controllers,
)
from tidewater.controller.quorum.formatting import raft_directory
from tidewater.controller.raft import RaftConfig
from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.tls import TlsFiles, TlsMaterial
from tidewater.proto.topic_config import parse_topic_config, validate_topic_configs


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return lowered == "true"


@dataclass
class ControllerConfig:
    listen: str = "127.0.0.1:9090"
    data_dir: Path = Path("controller-data")
    metrics_port: int = 0  # 0: no metrics endpoint
    # Where /metrics listens (metrics.bind.address): loopback unless told otherwise, as the
    # brokers'; HTTPS with the controller's certificate when it has TLS.
    metrics_bind_address: str = "127.0.0.1"
    node_id: int = 3000  # the controller's id in requests to brokers (Kafka KRaft style)
    broker_session_timeout_ms: int = 3000
    unclean_leader_election_enable: bool = False
    default_replication_factor: int = 1
    num_partitions: int = 1
    min_insync_replicas: int = 1  # default topic config
    leader_imbalance_check_interval_seconds: float = 5.0
    auto_leader_rebalance_enable: bool = True  # periodic preferred leader election
    # How long senders wait to coalesce changes into one request, and retry limits.
    sender_debounce_ms: int = 5
    sender_retry_backoff_ms: int = 50
    sender_retry_backoff_max_ms: int = 1000
    sender_request_timeout_ms: int = 5000
    metadata_queue_size_max: int = 1024
    metadata_compaction_records_min: int = 10_000  # compact at start-up beyond this
    shutdown_grace_seconds: float = 2.0
    # Both ports' connections (the controller's and the Raft port's, each its own count).
    max_connections: int = CONTROLLER_MAX_CONNECTIONS
    connections_max_idle_ms: int = CONNECTIONS_MAX_IDLE_MS
    extra: dict[str, str] = field(default_factory=dict)
    # --tls-ca/--tls-cert/--tls-key; None: plaintext, as before TLS existed.
    tls: TlsFiles | None = None
    # --sasl-mechanisms, --authorizer, --super-users: who may call (``controller.access``).
    security: SecuritySettings = field(default_factory=SecuritySettings)
    # --bootstrap-user-config (repeatable): users (sasl.username, sasl.password) given
    # SCRAM credentials at start-up when they have none, as `kafka-storage format
    # --add-scram`.
    bootstrap_user_configs: tuple[Path, ...] = ()
    # controller.quorum.voters (ID@HOST:PORT,...: each voter's Raft address): set, the
    # metadata lives in the Raft quorum (``controller.quorum``) and this controller is
    # active only while it leads it; empty, the single-controller JSON log as before.
    quorum_voters: str = ""
    # controller.quorum.listen (HOST:PORT): where this controller's Raft service binds;
    # empty: its own entry in the voters. A container binds 0.0.0.0 (its voter entry's
    # host name is the address a network disconnect/connect may change).
    quorum_listen: str = ""
    quorum_election_timeout_ms: int = 1000
    quorum_fetch_timeout_ms: int = 2000
    # --format-if-empty with --initial-controllers ID@HOST:PORT:DIRID,...: a Raft directory
    # never formatted is formatted at start (containers, as Kafka's docker image does with
    # an empty volume); without it such a directory refuses to start (``quorum.formatting``).
    format_if_empty: bool = False
    initial_controllers: str = ""

    # Kafka name -> (attribute, parser)
    SETTABLE: ClassVar[dict[str, tuple[str, Callable[[str], object]]]] = {
        "node.id": ("node_id", int),
        "metrics.bind.address": ("metrics_bind_address", str),
        "broker.session.timeout.ms": ("broker_session_timeout_ms", int),
        "unclean.leader.election.enable": ("unclean_leader_election_enable", _bool),
        "default.replication.factor": ("default_replication_factor", int),
        "num.partitions": ("num_partitions", int),
        "min.insync.replicas": ("min_insync_replicas", int),
        "leader.imbalance.check.interval.seconds": ("leader_imbalance_check_interval_seconds",
                                                    float),
        "auto.leader.rebalance.enable": ("auto_leader_rebalance_enable", _bool),
        "controller.sender.debounce.ms": ("sender_debounce_ms", int),
        "controller.metadata.compaction.records.min": ("metadata_compaction_records_min", int),
        "controller.sender.retry.backoff.ms": ("sender_retry_backoff_ms", int),
        "controller.sender.retry.backoff.max.ms": ("sender_retry_backoff_max_ms", int),
        "controller.sender.request.timeout.ms": ("sender_request_timeout_ms", int),
        "controller.quorum.voters": ("quorum_voters", str),
        "controller.quorum.listen": ("quorum_listen", str),
        "controller.quorum.election.timeout.ms": ("quorum_election_timeout_ms", int),
        "controller.quorum.fetch.timeout.ms": ("quorum_fetch_timeout_ms", int),
        "max.connections": ("max_connections", int),
        "connections.max.idle.ms": ("connections_max_idle_ms", int),
    }

    def set(self, name: str, value: str) -> None:
        """Apply one Kafka-named setting; raises InvalidConfigError on an unknown name or bad value."""
        if name not in self.SETTABLE:
            known = ", ".join(sorted(self.SETTABLE))
            raise InvalidConfigError(f"unknown setting {name!r} (known: {known})")
        attr, parse = self.SETTABLE[name]
        try:
            parsed = parse(value)
        except ValueError as e:
            raise InvalidConfigError(f"{name}: {e}") from e
        setattr(self, attr, parsed)
        self.validate()

    def apply_settings(self, settings: Iterable[str]) -> None:
        for item in settings:
            name, sep, value = item.partition("=")
            if not sep:
                raise InvalidConfigError(f"--set expects name=value, got {item!r}")
            self.set(name.strip(), value.strip())

    def validate(self) -> None:
        positive = ("broker_session_timeout_ms", "default_replication_factor", "num_partitions",
                    "min_insync_replicas", "leader_imbalance_check_interval_seconds",
                    "sender_retry_backoff_ms", "sender_retry_backoff_max_ms",
                    "sender_request_timeout_ms", "metadata_compaction_records_min",
                    "quorum_election_timeout_ms", "quorum_fetch_timeout_ms")
        names = {attr: name for name, (attr, _) in self.SETTABLE.items()}
        for f in fields(self):
            if f.name in positive and getattr(self, f.name) <= 0:
                raise InvalidConfigError(f"{names.get(f.name, f.name)} must be > 0")
        if not self.metrics_bind_address:
            raise InvalidConfigError("metrics.bind.address is empty (0.0.0.0 for every address)")
        check_connection_settings(self.max_connections, self.connections_max_idle_ms)
        if self.sender_debounce_ms < 0:
            raise InvalidConfigError("controller.sender.debounce.ms must be >= 0")
        if self.quorum_voters:
            parse_endpoints(self.quorum_voters)  # node.id is checked at start (any order)
        if self.format_if_empty and not self.initial_controllers:
            raise InvalidConfigError("--format-if-empty needs --initial-controllers")
        if self.initial_controllers:
            parse_initial_controllers(self.initial_controllers)
        validate_topic_configs(self.default_topic_configs())  # e.g. min.insync.replicas > 2^31-1

    def quorum_config(self, tls: TlsMaterial | None = None) -> QuorumConfig:
        """The Raft node's settings (``controller.quorum.voters`` must be set): its files
        go in ``<data-dir>/raft``; this controller's ``node.id`` must be a voter. ``tls``
        (the controller's loaded ``--tls-*``): Raft traffic over mTLS, controllers only."""
        voters = parse_endpoints(self.quorum_voters)
        if self.node_id not in voters:
            raise InvalidConfigError(f"controller.quorum.voters does not list node.id "
                                     f"{self.node_id}")
        listen = None
        if self.quorum_listen:
            try:
                host, port = parse_host_port(self.quorum_listen)
            except ValueError as e:
                raise InvalidConfigError(f"controller.quorum.listen: {e}") from None
            listen = Endpoint(host, port)
        return QuorumConfig(node_id=self.node_id, data_dir=raft_directory(self.data_dir),
                            voters=voters, tls=tls, listen=listen,
                            clients_may_change_voters=self.security.authorizer == "none",
                            max_connections=self.max_connections,
                            connections_max_idle_ms=self.connections_max_idle_ms,
                            raft=RaftConfig(election_timeout_ms=self.quorum_election_timeout_ms,
                                            fetch_timeout_ms=self.quorum_fetch_timeout_ms))

    def default_topic_configs(self) -> dict[str, str]:
        """Configs every new topic gets unless its request overrides them."""
        return {"min.insync.replicas": str(self.min_insync_replicas)}

    def unclean_allowed(self, topic_configs: dict[str, str]) -> bool:
        """Per-topic unclean.leader.election.enable wins over the cluster setting."""
        value = topic_configs.get("unclean.leader.election.enable")
        if value is None:
            return self.unclean_leader_election_enable
        # The topic config parser: " TRUE " is true here as it was when the topic was created.
        return bool(parse_topic_config("unclean.leader.election.enable", value))


def parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)

