"""The quorum's settings, named as Kafka's: ``controller.quorum.voters``, ``node.id``.

``--voters 1@host:port,2@host:port,...`` (``controller.quorum.voters``) says
where each voter listens; which incarnation of a voter votes (its directory id,
KIP-853) comes from the log, or before any VOTERS entry from the bootstrap set
written by ``format --initial-controllers 1@host:port:DIRID,...``. Observers
(``--observers``, same syntax as ``--voters``) are the other controllers allowed
to send Raft messages: a node that is to be added as a voter first runs as one.

The Raft port's connections are capped and expired as the controller's own port's
(``max.connections``, ``connections.max.idle.ms``; ``broker.servicers.grpc_limits``):
``run --max-connections/--connections-max-idle-ms``, or the controller's settings.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.servicers.grpc_limits import (
    CONNECTIONS_MAX_IDLE_MS,
    CONTROLLER_MAX_CONNECTIONS,
    check_connection_settings,
)
from tidewater.controller.raft import RaftConfig, VoterKey
from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.tls import TlsMaterial


def static_directory_id(node_id: int) -> str:
    """The directory id a single controller (no quorum, no Raft directory) shows in
    DescribeQuorum answers. Never a quorum voter's: those are random, drawn at format
    time (``formatting``), so a wiped voter cannot come back under its old id."""
    return uuid.uuid5(uuid.NAMESPACE_OID, f"tidewater-controller-{node_id}").hex

_ENDPOINT = re.compile(r"^(\d+)@([^:@,\s]+):(\d+)$")
_INITIAL = re.compile(r"^(\d+)@([^:@,\s]+):(\d+):([0-9a-f]{32})$")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _check_port(port: int, text: str) -> None:
    if not 0 < port < 65536:
        raise InvalidConfigError(f"port out of range in {text!r}")


def parse_endpoints(text: str) -> dict[int, Endpoint]:
    """``1@host:port,2@host:port`` -> {1: Endpoint, 2: Endpoint}."""
    endpoints: dict[int, Endpoint] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _ENDPOINT.match(part)
        if match is None:
            raise InvalidConfigError(f"expected ID@HOST:PORT, got {part!r}")
        node_id, host, port = int(match.group(1)), match.group(2), int(match.group(3))
        _check_port(port, part)
        if node_id in endpoints:
            raise InvalidConfigError(f"node {node_id} is listed twice")
        endpoints[node_id] = Endpoint(host, port)
    return endpoints


def parse_initial_controllers(text: str) -> frozenset[VoterKey]:
    """Kafka's ``--initial-controllers 1@host:port:DIRECTORY_ID,...``: the bootstrap voters."""
    voters: dict[int, VoterKey] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _INITIAL.match(part)
        if match is None:
            raise InvalidConfigError(f"expected ID@HOST:PORT:DIRECTORY_ID (32 hex digits), "
                                     f"got {part!r}")
        _check_port(int(match.group(3)), part)
        node_id = int(match.group(1))
        if node_id in voters:
            raise InvalidConfigError(f"node {node_id} is listed twice")
        voters[node_id] = VoterKey(node_id, match.group(4))
    if not voters:
        raise InvalidConfigError("no initial controllers")
    return frozenset(voters.values())


@dataclass(frozen=True)
class QuorumConfig:
    node_id: int
    data_dir: Path
    voters: dict[int, Endpoint]  # controller.quorum.voters
    observers: dict[int, Endpoint] = field(default_factory=dict)
    listen: Endpoint | None = None  # default: our own entry in voters/observers
    raft: RaftConfig = RaftConfig()
    # The controller's TLS identity (--tls-*): set, the Raft port speaks mTLS only and its
    # peers must present a controller certificate of the same CA (``transport``).
    tls: TlsMaterial | None = None
    # Whether a client certificate (role client) may change the voter set: true when the
    # cluster has no authorizer (a client certificate is then an admin's, as on the
    # controller's own port); with ACLs only a controller certificate may.
    clients_may_change_voters: bool = True
    tick_interval_ms: int = 20
    # A node takes a snapshot (and the log behind it is cut) once this many entries were
    # applied since the last one: it bounds the log on disk and how far a replica replays.
    snapshot_interval_entries: int = 1000
    peer_queue_messages_max: int = 256  # per peer: older Raft messages are dropped past it
    peer_batch_messages_max: int = 64  # messages per RaftMessages call
    propose_timeout_ms_default: int = 5000
    propose_timeout_ms_max: int = 60_000
    proposals_in_flight_max: int = 1024
    read_records_max: int = 10_000
    # The Raft port's max.connections and connections.max.idle.ms (peers' fetches keep
    # their connections busy; an idle one is closed and reopened on the next call).
    max_connections: int = CONTROLLER_MAX_CONNECTIONS
    connections_max_idle_ms: int = CONNECTIONS_MAX_IDLE_MS

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise InvalidConfigError("node.id must not be negative")
        check_connection_settings(self.max_connections, self.connections_max_idle_ms)
        overlap = set(self.voters) & set(self.observers)
        if overlap:
            raise InvalidConfigError(f"nodes {sorted(overlap)} are both voters and observers")
        if self.listen_endpoint is None:
            raise InvalidConfigError(f"node {self.node_id} is in neither voters nor observers, "
                                     f"and no listen address is given")

    @property
    def listen_endpoint(self) -> Endpoint | None:
        return self.listen or self.voters.get(self.node_id) or self.observers.get(self.node_id)

    @property
    def peers(self) -> dict[int, Endpoint]:
        """Every other controller we may send to and accept Raft messages from."""
        return {i: e for i, e in {**self.voters, **self.observers}.items() if i != self.node_id}
