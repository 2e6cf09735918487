"""Cluster metadata for clients: bootstrap, Metadata refresh, leader lookup, channel pool.

A client knows a cluster only through a bootstrap list (``host:port[,host:port]``).
``MetadataClient.refresh`` asks any reachable broker (known brokers first, then
the bootstrap list) for ``Metadata`` and keeps the answer as an immutable
``ClusterMetadata`` snapshot. Producers and consumers look partition leaders up
in that snapshot and call ``invalidate``/``refresh`` when a broker tells them
the snapshot is stale (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH) or a connection fails.

A snapshot that is merely older than ``metadata_max_age_ms`` is still used, and
a refresh runs in a background thread, as Kafka's producer refreshes in its
network thread: a ``send`` never waits for the periodic refresh, which a paused
broker would stretch to the request timeout. Only a missing or stale snapshot
(an error said a leader moved, or a new topic is tracked) is refreshed in the
caller's thread.

``ChannelPool`` keeps one gRPC channel per broker address for the life of the
client, because opening a channel per request costs a TCP and HTTP/2 handshake
(and a TLS one with ``security``: ``client/security.py``; a pool has one
security setting, so clients with different ones never share a channel).

gRPC transport failures become ``BrokerConnectionError`` (wire code
NETWORK_EXCEPTION, retriable, invalid metadata) at one place: ``rpc_call``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import grpc
from google.protobuf.message import Message

from tidewater.client.security import PLAINTEXT, ClientSecurity, sync_channel
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    ClusterAuthorizationFailedError,
    RequestTimedOutError,
    TidewaterError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from tidewater.proto.scram import REAUTHENTICATE_HINT, SaslAuthenticationError

Address = tuple[str, int]
T = TypeVar("T")

# gRPC messages can carry big fetch answers; the default 4 MiB receive limit is too small.
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
    # Reconnect quickly after a broker restarts instead of gRPC's default 1 s..120 s backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 100),
]


class BrokerConnectionError(TidewaterError):
    """A broker could not be reached or the call died in transport (client side only)."""

    error_code = pb.NETWORK_EXCEPTION
    retriable = True
    invalid_metadata = True


class TopicPartition(NamedTuple):
    topic: str
    partition: int


def parse_address(text: str) -> Address:
    """``host:port`` -> (host, port); raises ValueError with the bad text."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def parse_bootstrap(text: str) -> list[Address]:
    """``host:port[,host:port...]`` -> addresses; raises ValueError."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty bootstrap server list")
    return [parse_address(p) for p in parts]


def format_address(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


class ChannelPool:
    """One gRPC channel (and stubs) per broker address, reused until ``close``; every
    channel plaintext or TLS as ``security`` says."""

    def __init__(self, security: ClientSecurity = PLAINTEXT):
        self.security = security
        self._lock = threading.Lock()
        self._channels: dict[Address, grpc.Channel] = {}
        self._broker_stubs: dict[Address, pb_grpc.BrokerStub] = {}
        self._controller_stubs: dict[Address, pb_grpc.ControllerStub] = {}
        self.closed = False

    def channel(self, address: Address) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = sync_channel(format_address(address), self.security, CHANNEL_OPTIONS)
                self._channels[address] = ch
            return ch

    def broker(self, address: Address) -> pb_grpc.BrokerStub:
        stub = self._broker_stubs.get(address)
        if stub is None:
            stub = pb_grpc.BrokerStub(self.channel(address))
            self._broker_stubs[address] = stub
        return stub

    def controller(self, address: Address) -> pb_grpc.ControllerStub:
        stub = self._controller_stubs.get(address)
        if stub is None:
            stub = pb_grpc.ControllerStub(self.channel(address))
            self._controller_stubs[address] = stub
        return stub

    def close(self) -> None:
        with self._lock:
            self.closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._broker_stubs.clear()
            self._controller_stubs.clear()
        for ch in channels:
            ch.close()


def rpc_error_to_typed(err: grpc.RpcError, address: Address | None = None) -> TidewaterError:
    """Map a gRPC transport failure to a typed client error."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    where = f" {format_address(address)}" if address else ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOutError(f"request to{where} timed out")
    if code == grpc.StatusCode.UNAVAILABLE:
        return BrokerConnectionError(f"broker{where} unavailable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED and REAUTHENTICATE_HINT in (details or ""):
        # The session ended (expired, or the server forgot it), not the credentials: the
        # channel authenticates again on its next call (the session was dropped), so a
        # stream ended this way is reopened as after a lost connection.
        return BrokerConnectionError(f"broker{where} ended the SASL session: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        # Not a connection problem: another broker would refuse the same credentials.
        return SaslAuthenticationError(f"broker{where} refused the credentials: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnsupportedVersionError(f"broker{where} does not implement this call: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ClusterAuthorizationFailedError(f"{where.strip() or 'server'} refused: {details}")
    return BrokerConnectionError(f"call to{where} failed: {code.name if code else '?'} {details}")


def rpc_call(fn: Callable[..., T], request: Message, *, timeout_s: float, address: Address | None = None) -> T:
    """Call a unary stub method, turning gRPC failures into typed errors."""
    try:
        return fn(request, timeout=timeout_s)
    except grpc.RpcError as e:
        raise rpc_error_to_typed(e, address) from None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int  # -1: no leader
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error_code: int = pb.NONE


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One Metadata answer, never mutated."""

    brokers: dict[int, Address]
    controller_id: int
    topics: dict[str, TopicInfo]
    cluster_id: str = ""
    fetched_at_s: float = 0.0

    @classmethod
    def from_response(cls, resp: pb.MetadataResponse, now_s: float) -> ClusterMetadata:
        brokers = {b.broker_id: (b.host, b.port) for b in resp.brokers}
        topics = {}
        for t in resp.topics:
            parts = {
                p.partition: PartitionInfo(
                    partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replicas), isr=tuple(p.isr),
                    offline_replicas=tuple(p.offline_replicas), error_code=p.error_code,
                )
                for p in t.partitions
            }
            topics[t.name] = TopicInfo(name=t.name, error_code=t.error_code, partitions=parts)
        return cls(brokers=brokers, controller_id=resp.controller_id, topics=topics,
                   cluster_id=resp.cluster_id, fetched_at_s=now_s)


class LeaderInfo(NamedTuple):
    broker_id: int
    address: Address
    leader_epoch: int


log = logging.getLogger(__name__)

# Between two background refreshes that failed (Kafka's retry.backoff.ms for metadata).
BACKGROUND_REFRESH_BACKOFF_S = 0.1


class MetadataClient:
    """Bootstrap, Metadata refresh and leader lookup, shared by one client's threads."""

    def __init__(self, bootstrap: str | list[Address], *, pool: ChannelPool | None = None,
                 request_timeout_ms: int = 5000, metadata_max_age_ms: int = 30000,
                 security: ClientSecurity = PLAINTEXT):
        """``security``: for the pool made here (a given ``pool`` has its own)."""
        self.bootstrap = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
        self.pool = pool or ChannelPool(security)
        self.request_timeout_ms = request_timeout_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._lock = threading.Lock()
        self._snapshot: ClusterMetadata | None = None
        self._stale = True
        # Counts invalidations: a refresh clears ``_stale`` only if none came while it
        # was asking, so an answer sent before a leader moved cannot hide the move.
        self._invalidations = 0
        self._installed_asked_at_s = 0.0  # when the installed snapshot was asked for
        self._last_good: Address | None = None
        # Topics this client cares about; refreshes ask only for these (empty: all).
        self._topics: set[str] = set()
        self._background: threading.Thread | None = None
        self._background_not_before_s = 0.0

    @property
    def snapshot(self) -> ClusterMetadata | None:
        return self._snapshot

    def fresh_snapshot(self) -> ClusterMetadata | None:
        """The snapshot when neither stale nor older than metadata_max_age_ms, else None
        (never asks the cluster)."""
        snap = self._snapshot
        if snap is None or self._stale or self.is_aged(snap):
            return None
        return snap

    def add_topics(self, topics: Iterable[str]) -> None:
        with self._lock:
            new = set(topics) - self._topics
            if new:
                self._topics |= new
                self._stale = True
                self._invalidations += 1

    def invalidate(self) -> None:
        """Mark the snapshot stale; the next ``current`` refreshes it."""
        with self._lock:
            self._stale = True
            self._invalidations += 1

    def is_aged(self, snap: ClusterMetadata) -> bool:
        return (time.monotonic() - snap.fetched_at_s) * 1000 > self.metadata_max_age_ms

    def candidate_addresses(self) -> list[Address]:
        """Known brokers (shuffled) then the bootstrap list: where to send Metadata or admin calls."""
        snap = self._snapshot
        known = list(snap.brokers.values()) if snap else []
        random.shuffle(known)
        # The broker that answered last goes first: a hung one costs a timeout only once.
        first = [self._last_good] if self._last_good else []
        seen: set[Address] = set()
        out = []
        for a in first + known + self.bootstrap:
            if a not in seen:
                seen.add(a)
                out.append(a)
        return out

    def any_broker_call(self, call: Callable[[Address], T], *, retry_on_timeout: bool = True) -> T:
        """Run ``call(address)`` on the first broker that answers; raise the last connection error.

        A timed-out call moves on to the next broker only with ``retry_on_timeout`` (for calls
        that are safe to repeat: a timed-out CreateTopics may have happened)."""
        last: TidewaterError | None = None
        for address in self.candidate_addresses():
            try:
                result = call(address)
            except (BrokerConnectionError, RequestTimedOutError) as e:
                if isinstance(e, RequestTimedOutError) and not retry_on_timeout:
                    raise
                last = e
                if self._last_good == address:
                    self._last_good = None
                continue
            self._last_good = address
            return result
        raise BrokerConnectionError(
            "no broker reachable (tried "
            + ", ".join(format_address(a) for a in self.candidate_addresses()) + ")"
            + (f": {last}" if last else "")
        )

    def refresh(self, topics: list[str] | None = None) -> ClusterMetadata:
        """Fetch Metadata now (for ``topics``, or the tracked topics, or all)."""
        if topics:
            self.add_topics(topics)
        with self._lock:
            tracked = sorted(self._topics)  # copied under the lock: other threads add topics
            invalidations = self._invalidations
        request = pb.MetadataRequest(topics=tracked)
        timeout_s = self.request_timeout_ms / 1000

        def ask(address: Address) -> pb.MetadataResponse:
            response: pb.MetadataResponse = rpc_call(
                self.pool.broker(address).Metadata, request, timeout_s=timeout_s, address=address)
            return response

        asked_at_s = time.monotonic()
        resp = self.any_broker_call(ask)
        snap = ClusterMetadata.from_response(resp, time.monotonic())
        with self._lock:
            # Two refreshes may overlap (a background one, a caller's): keep the later asked.
            if asked_at_s >= self._installed_asked_at_s:
                self._snapshot, self._installed_asked_at_s = snap, asked_at_s
                if invalidations == self._invalidations:
                    self._stale = False
            installed = self._snapshot
            assert installed is not None  # this one, or one asked for later
            return installed

    def current(self) -> ClusterMetadata:
        """The snapshot: refreshed first when there is none or it is stale; one only older
        than metadata_max_age_ms is returned as it is, with a refresh started in the
        background."""
        snap = self._snapshot
        if snap is None or self._stale:
            return self.refresh()
        if self.is_aged(snap):
            self.refresh_in_background()
        return snap

    def refresh_in_background(self) -> None:
        """Start a refresh in a daemon thread, unless one runs, one failed within
        BACKGROUND_REFRESH_BACKOFF_S, or the client is closed. Never blocks."""
        with self._lock:
            now_s = time.monotonic()
            if (self._background is not None or now_s < self._background_not_before_s
                    or self.pool.closed):
                return
            self._background = threading.Thread(target=self._background_refresh,
                                                name="tide-metadata-refresh", daemon=True)
            self._background.start()

    def _background_refresh(self) -> None:
        failed = False
        try:
            self.refresh()
        except Exception as e:  # the snapshot stays; the next use retries
            failed = True
            log.debug("background metadata refresh failed: %s", e)
        finally:
            with self._lock:
                self._background = None
                if failed:
                    self._background_not_before_s = (time.monotonic()
                                                     + BACKGROUND_REFRESH_BACKOFF_S)

    def cached_partitions(self, topic: str) -> dict[int, PartitionInfo] | None:
        """The producer's fast path: partitions of ``topic`` from a snapshot that is not
        stale (an aged one starts a background refresh), else None."""
        snap = self._snapshot
        if snap is None or self._stale or topic not in self._topics:
            return None
        info = snap.topics.get(topic)
        if info is None or info.error_code != pb.NONE or not info.partitions:
            return None
        if self.is_aged(snap):
            self.refresh_in_background()
        return info.partitions

    def cached_leader_for(self, tp: TopicPartition) -> LeaderInfo | None:
        """Leader of ``tp`` from the snapshot, never refreshing in this thread (so never
        blocking; an aged snapshot starts a background refresh): None when the snapshot
        is stale or has no leader for it."""
        parts = self.cached_partitions(tp.topic)
        p = parts.get(tp.partition) if parts else None
        return None if p is None else self._leader_of(p)

    def partitions_for(self, topic: str) -> dict[int, PartitionInfo]:
        """Partitions of ``topic``; raises UnknownTopicOrPartitionError (or the topic's error)."""
        if topic not in self._topics:  # the producer's sender asks per request: skip the lock
            self.add_topics([topic])
        snap = self.current()
        info = snap.topics.get(topic)
        if info is None or info.error_code != pb.NONE or not info.partitions:
            if info is not None and info.error_code not in (pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION):
                raise error_for_code(info.error_code, f"topic {topic!r}: {pb.ErrorCode.Name(info.error_code)}")
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return info.partitions

    def leader_for(self, tp: TopicPartition) -> LeaderInfo | None:
        """Leader of ``tp`` from the current snapshot, or None when it has none (offline or unknown broker)."""
        parts = self.partitions_for(tp.topic)
        p = parts.get(tp.partition)
        if p is None:
            raise UnknownTopicOrPartitionError(f"unknown partition {tp.topic}-{tp.partition}")
        return self._leader_of(p)

    def _leader_of(self, p: PartitionInfo) -> LeaderInfo | None:
        """``p``'s leader with its address, or None (no leader, or a broker not in the snapshot)."""
        if p.leader < 0:
            return None
        address = self._snapshot.brokers.get(p.leader) if self._snapshot else None
        return None if address is None else LeaderInfo(p.leader, address, p.leader_epoch)

    def broker_address(self, broker_id: int) -> Address | None:
        snap = self._snapshot
        return snap.brokers.get(broker_id) if snap else None

    def close(self) -> None:
        self.pool.close()


def client_metadata(bootstrap: str, metadata: MetadataClient | None, request_timeout_ms: int,
                    security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                    ssl_certfile: str | None = None, ssl_keyfile: str | None = None, *,
                    sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                    sasl_plain_password: str | None = None, metadata_max_age_ms: int = 30000
                    ) -> tuple[ClientSecurity, MetadataClient]:
    """A client's security settings (Kafka's names, ``ClientSecurity.from_options``) and its
    metadata client: ``metadata`` if given (its pool has security of its own), else one
    made here for ``bootstrap`` with those settings."""
    security = ClientSecurity.from_options(
        security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile, sasl_mechanism=sasl_mechanism,
        sasl_plain_username=sasl_plain_username, sasl_plain_password=sasl_plain_password)
    return security, metadata or MetadataClient(
        bootstrap, request_timeout_ms=min(request_timeout_ms, 10000), security=security,
        metadata_max_age_ms=metadata_max_age_ms)
