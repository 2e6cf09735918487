"""The Kafka APIs this broker serves, their versions, and their translation to the broker's
own requests (the same ``ReplicaManager`` paths and errors as gRPC).

Advertise only what is implemented: librdkafka changes behaviour by what
ApiVersions lists (it sends telemetry if key 71 is there, and turns
idempotence off without key 22). Versions, as today's clients negotiate them:

===================== ===== ======================================================
API (key)             vers  notes
===================== ===== ======================================================
Produce (0)           0-11  advertised from 0: librdkafka 2.0 drops compression
                            when the minimum is 3; v0-2 (magic 0/1) are refused;
                            log_append_time on LogAppendTime topics; transactional
                            batches (a transactional_id) taken; v10+: KIP-951's
                            current leader and its endpoint on NOT_LEADER_OR_FOLLOWER
                            and FENCED_LEADER_EPOCH; v11 (KIP-890's
                            TRANSACTION_ABORTABLE allowed) answers as v10
Fetch (1)             4-17  sessions (KIP-227, ``fetch_sessions``) from v7; topic ids
                            from v13; KIP-320 epochs; isolation_level:
                            READ_COMMITTED reads below the last stable offset and
                            lists the aborted transactions
ListOffsets (2)       1-7   earliest (-2), latest (-1; the LSO for READ_COMMITTED),
                            by timestamp, max timestamp (-3)
Metadata (3)          0-12  topic IDs from v10; auto-creation (``auto_create``)
OffsetForLeaderEpoch  2-4
(23)
ApiVersions (18)      0-4   an unknown version gets a v0 answer with error 35
CreateTopics (19)     2-7   forwarded to the controller (manual assignments too)
DeleteTopics (20)     1-6   forwarded to the controller; v6 by topic ID too
                            (``delete_topics_plan``)
CreatePartitions (37) 0-3   forwarded, manual assignments too (checked by the controller)
DescribeConfigs (32)  1-4   topics: their own configs and the defaults they take;
                            this broker: its settings (``broker_configs``)
DescribeCluster (60)  0-1   this broker named as the controller (see Metadata)
group APIs            ...   8, 9, 10-16, 42: ``group_apis`` (the group coordinator)
SaslHandshake (17)    0-1   ``sasl``: per-connection SASL (v0: raw tokens follow)
SaslAuthenticate (36) 0-2   ``sasl``
ACLs, SCRAM users     ...   ``security_apis`` (keys 29, 30, 31, 50, 51)
client quotas         ...   ``quota_apis`` (keys 48, 49)
InitProducerId (22)   0-5   ``producer_apis.py``; with a transactional id ``txn_apis.py``
transaction APIs      ...   24, 25, 26, 65, 66: ``txn_apis`` (the transaction coordinator)
DeleteRecords (21)    0-2   the leader's log start moves (``log_apis.py``)
DescribeLogDirs (35)  1-4   the data dir, replicas' sizes (``log_apis.py``)
AlterConfigs (33)     0-2   forwarded: topics, dynamic broker configs
IncrementalAlter-     0-1   forwarded (``config_apis.py``; rules in
Configs (44)                ``controller/config_changes.py``)
ElectLeaders (43)     0-2   forwarded: preferred and unclean elections
AlterPartition-       0-1   forwarded (``reassign_apis.py``; rules in
Reassignments (45)          ``controller/reassignment.py``)
ListPartition-        0     forwarded: the ongoing reassignments
Reassignments (46)
DescribeTopic-        0     ``topic_apis.py``: paginated by a cursor
Partitions (75)
WriteTxnMarkers (27)  0-2   coordinator -> leader: COMMIT/ABORT markers
                            (``marker_apis.py``)
DescribeQuorum (55)   0-2   forwarded: the metadata quorum (``quorum_apis.py``)
===================== ===== ======================================================

Authorization (``Services.allowed``, an authorizer configured): Produce needs
WRITE on each topic (and on the transactional id, when it names one:
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), Fetch READ, ListOffsets and OffsetForLeaderEpoch
DESCRIBE (refused partitions: TOPIC_AUTHORIZATION_FAILED); Metadata lists only
topics the principal may DESCRIBE, and reports a named one it may not as
UNKNOWN_TOPIC_OR_PARTITION (whether it exists or not: nothing leaks); an unknown
topic it may DESCRIBE is auto-created with CREATE on the cluster or the topic, and
is TOPIC_AUTHORIZATION_FAILED without (Kafka's rule);
CreateTopics needs CREATE on the cluster or the topic, DeleteTopics DELETE,
CreatePartitions ALTER, DescribeConfigs DESCRIBE_CONFIGS (topic; the cluster for
brokers), DescribeCluster DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED),
DeleteRecords DELETE on the topic, DescribeLogDirs DESCRIBE on the cluster, DescribeQuorum
DESCRIBE on the cluster.
Metadata (v8+, when asked) and DescribeCluster answer KIP-430's authorized operations
(``acls.authorized_operations``: the bit field of what ``Services.allowed`` grants).

Each ``on_*`` coroutine turns a decoded kio request into an awaitable of the
response values (a plain dict, see ``codec.build``), or None where Kafka sends
no response (Produce with acks=0). Work that must happen in request order on a
connection (a produce's append) is done before the function returns; what may
finish later (an acks=all wait, a long-poll) is in the awaitable.
"""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tidewater.broker.clock import mono_ms
from tidewater.broker.coordinators import Coordinators
from tidewater.broker.kafka import (
    config_apis,
    quorum_apis,
    quota_apis,
    reassign_apis,
    sasl,
    security_apis,
    topic_apis,
)
from tidewater.broker.kafka.auto_create import AutoTopicCreator, name_refusal
from tidewater.broker.kafka.broker_configs import BrokerConfigEntry, describe_values
from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.kafka.coordinator_api_keys import GROUP_VERSIONS, TXN_VERSIONS
from tidewater.broker.kafka.delete_topics_plan import plan_delete_topics
from tidewater.broker.kafka.fetch_session_apis import (
    TOPIC_IDS_FROM,
    replica_id_of,
    session_answer,
    session_read,
    topic_id_of_key,
)
from tidewater.broker.kafka.fetch_session_apis import new_context as session_context
from tidewater.broker.kafka.fetch_sessions import FetchSessionCache
from tidewater.broker.kafka.log_apis import (
    DELETE_RECORDS,
    DELETE_RECORDS_VERSIONS,
    DESCRIBE_LOG_DIRS,
    DESCRIBE_LOG_DIRS_VERSIONS,
    on_delete_records,
    on_describe_log_dirs,
)
from tidewater.broker.kafka.marker_apis import (
    WRITE_TXN_MARKERS,
    WRITE_TXN_MARKERS_VERSIONS,
    on_write_txn_markers,
)
from tidewater.broker.kafka.producer_apis import (
    INIT_PRODUCER_ID,
    INIT_PRODUCER_ID_VERSIONS,
    on_init_producer_id,
)
from tidewater.broker.kafka.producer_state_apis import (
    DESCRIBE_PRODUCERS,
    DESCRIBE_PRODUCERS_VERSIONS,
    on_describe_producers,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.replication.control_rules import client_fetch_refusal
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.serving.fetch import (
    READ_UNCOMMITTED,
    FetchedPartition,
    aborted_transactions_of,
    last_stable_offset_of,
)
from tidewater.broker.storage.topics import COORDINATOR_TOPICS
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import (
    ALTER,
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    authorized_operations,
)
from tidewater.proto.acls import DESCRIBE_CONFIGS as OP_DESCRIBE_CONFIGS
from tidewater.proto.batch import BATCH_LENGTH_MIN, HEADER_SIZE, BytesLike, read_header
from tidewater.proto.compression import COMPRESSION_ZSTD
from tidewater.proto.errors import TidewaterError

if TYPE_CHECKING:
    from tidewater.broker.group.coordinator import GroupCoordinator
    from tidewater.broker.txn.coordinator import TransactionCoordinator

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_FOR_LEADER_EPOCH, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 23, 18, 19, 20
DESCRIBE_CONFIGS, DESCRIBE_CLUSTER, CREATE_PARTITIONS = 32, 60, 37

# api key -> (min, max) advertised.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (0, 11),
    FETCH: (4, 17),
    LIST_OFFSETS: (1, 7),
    METADATA: (0, 12),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    DESCRIBE_CONFIGS: (1, 4),
    DESCRIBE_CLUSTER: (0, 1),
    CREATE_PARTITIONS: (0, 3),
    **GROUP_VERSIONS,
    sasl.SASL_HANDSHAKE: (0, 1),
    sasl.SASL_AUTHENTICATE: (0, 2),
    **security_apis.SUPPORTED,
    **quota_apis.SUPPORTED,
    INIT_PRODUCER_ID: INIT_PRODUCER_ID_VERSIONS,
    **TXN_VERSIONS,
    DELETE_RECORDS: DELETE_RECORDS_VERSIONS,
    DESCRIBE_LOG_DIRS: DESCRIBE_LOG_DIRS_VERSIONS,
    **config_apis.SUPPORTED,
    **reassign_apis.SUPPORTED,
    **quorum_apis.SUPPORTED,
    **topic_apis.SUPPORTED,
    WRITE_TXN_MARKERS: WRITE_TXN_MARKERS_VERSIONS,
    DESCRIBE_PRODUCERS: DESCRIBE_PRODUCERS_VERSIONS,
}
# The lowest version decoded: Produce v0-2 carry message sets (magic 0/1), which a
# RecordBatch v2 log never stores.
DECODED_FROM = {PRODUCE: 3}

NO_TOPIC_ID = uuid.UUID(int=0)
# zstd batches exist for Kafka clients from Produce v7 and Fetch v10 on (KIP-110): an
# older client could not decompress them.
ZSTD_PRODUCE_FROM, ZSTD_FETCH_FROM = 7, 10


def uses_zstd(records: BytesLike) -> bool:
    """Does any whole batch in ``records`` use zstd? Framing only (no CRC check): what is
    malformed is the produce path's to refuse, and a fetch may end in a partial batch."""
    position = 0
    while len(records) - position >= HEADER_SIZE:
        header = read_header(records, position)
        if header.compression == COMPRESSION_ZSTD:
            return True
        if header.batch_length < BATCH_LENGTH_MIN:
            return False
        position += header.size
    return False


@dataclass
class Services:
    """What a Kafka request may reach: the broker's own paths, nothing else."""

    replica_manager: ReplicaManager
    metadata_cache: MetadataCache
    controller: ControllerForwarder  # CreateTopics, DeleteTopics, DescribeCluster, ...
    listener_name: str  # the registration's listener whose addresses Metadata answers
    # Every topic config's value for a topic that does not set it (the broker's defaults).
    topic_config_defaults: Callable[[], dict[str, str]] = dict
    # The group APIs' and transactions' coordinators (broker/group, broker/txn), built at
    # their first use (broker/coordinators.py); None: this broker has none.
    coordinators: Coordinators | None = None
    # Where a topic config a topic does not set comes from: Kafka's ConfigSource of the
    # broker setting it inherits, by topic config name (absent: DEFAULT_CONFIG).
    topic_default_sources: Callable[[], dict[str, int]] = dict
    # This broker's settings as DescribeConfigs lists them (``broker_configs``).
    broker_configs: Callable[[], list[BrokerConfigEntry]] = list
    # The cluster-wide dynamic broker configs that are set (the "" BROKER resource).
    cluster_default_configs: Callable[[], list[BrokerConfigEntry]] = list
    # auto.create.topics.enable (``auto_create``); None: unknown topics stay unknown.
    auto_create: AutoTopicCreator | None = None
    # Who this connection is (``sasl.ConnectionSecurity``; the listener gives each
    # connection its own copy of Services). None: no security, everything allowed.
    connection: sasl.ConnectionSecurity | None = None
    # The client's address as Kafka shows it in a group member's HOST ("/127.0.0.1").
    client_host: str = ""
    # Fetch sessions (KIP-227), one cache per broker: every connection's copy shares it.
    fetch_sessions: FetchSessionCache = field(default_factory=FetchSessionCache)

    @property
    def group_coordinator(self) -> GroupCoordinator | None:
        return self.coordinators.group if self.coordinators is not None else None

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None:
        return self.coordinators.txn if self.coordinators is not None else None

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        """May this connection's principal do ``operation`` (``proto.acls``) on the
        resource? The one authorization hook of every API (groups: READ on GROUP)."""
        return self.connection is None or self.connection.allows(operation, resource_type,
                                                                  name)

    def allowed_on_any(self, operation: int, resource_type: int) -> bool:
        """May it do ``operation`` on SOME resource of the type? (InitProducerId: WRITE on
        any topic, or IDEMPOTENT_WRITE on the cluster, as Kafka since KIP-679.)"""
        return self.connection is None or self.connection.allows_any(operation,
                                                                     resource_type)


Response = dict[str, Any] | None


def _done(value: Response) -> Awaitable[Response]:
    async def answer() -> Response:
        return value
    return answer()


# ---------------------------------------------------------------- ApiVersions

def api_versions_values(error_code: int = pb.NONE) -> dict[str, Any]:
    return {"error_code": error_code, "throttle_time": 0,
            "api_keys": [{"api_key": key, "min_version": low, "max_version": high}
                         for key, (low, high) in sorted(SUPPORTED.items())]}


async def on_api_versions(s: Services, head: RequestHead, body: RequestBody
                         ) -> Awaitable[Response]:
    return _done(api_versions_values())


# ---------------------------------------------------------------- Metadata

def _topic_id(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw) if len(raw) == 16 else NO_TOPIC_ID


async def on_metadata(s: Services, head: RequestHead, body: RequestBody
                     ) -> Awaitable[Response]:
    requested = body.topics
    if requested is not None and head.api_version >= 1 and len(requested) == 0:
        names: list[str] | None = []  # v1+: an empty list asks for no topic
    elif requested is None or len(requested) == 0:
        names = None  # every topic
    else:
        names = [t.name for t in requested if t.name is not None]
    answer = s.metadata_cache.metadata_response(names or [], s.listener_name)
    hidden = {t.name for t in answer.topics if not s.allowed(DESCRIBE, TOPIC, t.name)}
    if hidden:
        kept = [t for t in answer.topics if t.name not in hidden]
        if names:  # named: reported as unknown, existing or not
            kept = [t if t.name not in hidden else pb.TopicMetadata(
                name=t.name, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION) for t in answer.topics]
        del answer.topics[:]
        answer.topics.extend(kept)
    if names:
        # v0-3 have no such field: those clients always allow it, as with Kafka.
        allow = getattr(body, "allow_auto_topic_creation", True)
        _maybe_auto_create(s, answer, hidden, allow)
    # KIP-430 (v8+): what the principal may do, when asked (Int32.MIN otherwise). The
    # cluster's field is in v8-10 only (v11 moved it to DescribeCluster).
    topic_ops = getattr(body, "include_topic_authorized_operations", False)
    cluster_ops = getattr(body, "include_cluster_authorized_operations", False)
    topics = [] if names == [] else [{
        "error_code": t.error_code, "name": t.name, "topic_id": _topic_id(t.topic_id),
        "is_internal": t.name in COORDINATOR_TOPICS,
        "topic_authorized_operations": (
            authorized_operations(s.allowed, TOPIC, t.name)
            if topic_ops and t.error_code == pb.NONE else AUTHORIZED_OPERATIONS_OMITTED),
        "partitions": [{"error_code": p.error_code, "partition_index": p.partition,
                        "leader_id": p.leader, "leader_epoch": p.leader_epoch,
                        "replica_nodes": list(p.replicas), "isr_nodes": list(p.isr),
                        "offline_replicas": list(p.offline_replicas)}
                       for p in t.partitions]}
        for t in answer.topics]
    return _done({
        "throttle_time": 0,
        "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack or None}
                    for b in answer.brokers],
        "cluster_id": answer.cluster_id or None,
        "controller_id": named_controller(s.replica_manager.broker_id,
                                          [b.broker_id for b in answer.brokers]),
        "topics": topics,
        "cluster_authorized_operations": (
            authorized_operations(s.allowed, CLUSTER, CLUSTER_NAME) if cluster_ops
            else AUTHORIZED_OPERATIONS_OMITTED)})


def named_controller(own_id: int, listed: list[int]) -> int:
    """The "controller" a Metadata or DescribeCluster answer names. Admin requests go to
    it, and every broker forwards them to the real one (whose id is no broker's), as
    KRaft brokers do: this broker, when the answer lists it. A broker whose cache does not
    list itself yet (fenced in its last UpdateMetadata, or none came yet: a broker just
    registered) names a listed one, as Kafka's KRaft broker names a live broker of its
    cache, or none (-1): a client cannot connect to an id the answer does not list, and
    librdkafka then waits for that "controller" until its request times out, never
    sending the request (nor asking for metadata again, which -1 makes it do)."""
    if own_id in listed:
        return own_id
    return min(listed) if listed else -1


def _maybe_auto_create(s: Services, answer: pb.MetadataResponse, hidden: set[str],
                       allow: bool) -> None:
    """Kafka's getTopicMetadata for the named topics the cache does not know: an illegal
    name is INVALID_TOPIC_EXCEPTION; a describable one is created when allowed (answered
    UNKNOWN_TOPIC_OR_PARTITION meanwhile), TOPIC_AUTHORIZATION_FAILED without CREATE."""
    known = set(s.metadata_cache.topics())
    creating = allow and s.auto_create is not None and s.auto_create.enabled
    may_create_any = creating and s.allowed(CREATE, CLUSTER, CLUSTER_NAME)
    wanted: list[str] = []
    for t in answer.topics:
        if t.name in known or t.name in hidden:
            continue
        if name_refusal(t.name) is not None:
            t.error_code = pb.INVALID_TOPIC_EXCEPTION
        elif creating and not may_create_any and not s.allowed(CREATE, TOPIC, t.name):
            t.error_code = pb.TOPIC_AUTHORIZATION_FAILED
        elif creating:
            wanted.append(t.name)
    if wanted and s.auto_create is not None:
        s.auto_create.maybe_create(wanted)


# ---------------------------------------------------------------- Produce

def produce_request(body: RequestBody) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=body.acks, timeout_ms=milliseconds(body.timeout),
                                transactional_id=getattr(body, "transactional_id", None) or "")
    for topic in body.topic_data:
        for p in topic.partition_data:
            request.partitions.add(topic=topic.name, partition=p.index,
                                   records=bytes(p.records or b""))
    return request


class _Topical(Protocol):
    """A per-partition answer (produce, fetch, list offsets...)."""

    @property
    def topic(self) -> str: ...


_Answer = TypeVar("_Answer", bound=_Topical)


def by_topic(partitions: Iterable[_Answer], name_key: str, parts_key: str,
             entry: Callable[[_Answer], dict[str, Any]]) -> list[dict[str, Any]]:
    """Kafka's topic -> partitions nesting of per-partition answers, topics in first-seen
    order: ``[{name_key: topic, parts_key: [entry(p), ...]}, ...]``."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for p in partitions:
        grouped.setdefault(p.topic, []).append(entry(p))
    return [{name_key: topic, parts_key: parts} for topic, parts in grouped.items()]


def _log_append_time(p: pb.ProducePartitionResponse) -> int:
    """The broker's timestamp of an appended batch on a LogAppendTime topic, else -1."""
    # Unset (0) on an error answer, -1 from the log on a CreateTime topic.
    return p.log_append_time_ms if p.error_code == pb.NONE and p.log_append_time_ms > 0 else -1


# KIP-951 (Produce v10+): a partition refused because this broker does not lead it names
# the leader this broker knows (tagged ``current_leader``), and the answer carries that
# leader's address (tagged ``node_endpoints``), so the client need not ask Metadata first.
CURRENT_LEADER_PRODUCE_FROM = 10
_LEADER_MOVED = (pb.NOT_LEADER_OR_FOLLOWER, pb.FENCED_LEADER_EPOCH)


def produce_values(response: pb.ProduceResponse,
                   leaders: pb.MetadataResponse | None = None) -> dict[str, Any]:
    """The Produce answer's values; ``leaders`` (v10+: the metadata of the topics with a
    partition whose leader moved) fills KIP-951's current leader and its endpoint."""
    known = {(t.name, p.partition): (p.leader, p.leader_epoch)
             for t in leaders.topics for p in t.partitions} if leaders is not None else {}

    def entry(p: pb.ProducePartitionResponse) -> dict[str, Any]:
        values = {"index": p.partition, "error_code": p.error_code,
                  "base_offset": p.base_offset, "log_append_time": _log_append_time(p),
                  "log_start_offset": p.log_start_offset, "record_errors": [
                      {"batch_index": e.batch_index, "batch_index_error_message": e.message or None}
                      for e in p.record_errors],
                  "error_message": p.error_message or None}
        if leaders is not None and p.error_code in _LEADER_MOVED:
            leader_id, leader_epoch = known.get((p.topic, p.partition), (-1, -1))
            values["current_leader"] = {"leader_id": leader_id, "leader_epoch": leader_epoch}
        return values
    values: dict[str, Any] = {"throttle_time": 0, "responses": by_topic(
        response.partitions, "name", "partition_responses", entry)}
    if leaders is not None:
        named = {known.get((p.topic, p.partition), (-1, -1))[0]
                 for p in response.partitions if p.error_code in _LEADER_MOVED}
        values["node_endpoints"] = [
            {"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack or None}
            for b in leaders.brokers if b.broker_id in named]
    return values


def _leaders_of(s: Services, version: int, response: pb.ProduceResponse
                ) -> pb.MetadataResponse | None:
    """For Produce v10+: this broker's metadata of the topics whose leader moved (None
    otherwise, and for older versions)."""
    if version < CURRENT_LEADER_PRODUCE_FROM:
        return None
    moved = sorted({p.topic for p in response.partitions if p.error_code in _LEADER_MOVED})
    if not moved:
        return pb.MetadataResponse()
    return s.metadata_cache.metadata_response(moved, s.listener_name)


def _refused(p: pb.ProducePartitionData, code: pb.ErrorCode,
             message: str) -> pb.ProducePartitionResponse:
    return pb.ProducePartitionResponse(topic=p.topic, partition=p.partition, error_code=code,
                                       error_message=message, base_offset=-1,
                                       log_start_offset=-1)


async def on_produce(s: Services, head: RequestHead, body: RequestBody
                    ) -> Awaitable[Response]:
    """Appends now (requests on one connection keep their order); the returned awaitable
    is the answer: at once for acks=1, when the ISR has the records for acks=all, None
    (no answer at all) for acks=0."""
    request = produce_request(body)
    refused: list[pb.ProducePartitionResponse] = []
    writable = {name: s.allowed(WRITE, TOPIC, name)
                for name in {p.topic for p in request.partitions}}
    transactional_id = body.transactional_id
    # Kafka's rule: a transactional produce needs WRITE on its transactional id.
    txn_refused = (transactional_id is not None
                   and not s.allowed(WRITE, TRANSACTIONAL_ID, transactional_id))
    if (txn_refused or head.api_version < ZSTD_PRODUCE_FROM
            or not all(writable.values())):
        kept: list[pb.ProducePartitionData] = []
        for p in request.partitions:
            if txn_refused:
                refused.append(_refused(p, pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                        f"needs WRITE on transactional id {transactional_id!r}"))
            elif not writable[p.topic]:
                refused.append(_refused(p, pb.TOPIC_AUTHORIZATION_FAILED,
                                        f"needs WRITE on topic {p.topic!r}"))
            elif head.api_version < ZSTD_PRODUCE_FROM and uses_zstd(p.records):
                refused.append(_refused(p, pb.UNSUPPORTED_COMPRESSION_TYPE,
                                        f"zstd needs Produce v{ZSTD_PRODUCE_FROM}+"))
            else:
                kept.append(p)
        del request.partitions[:]
        request.partitions.extend(kept)
        if not kept:
            all_refused = pb.ProduceResponse(partitions=refused)
            return _done(None if request.acks == 0 else produce_values(
                all_refused, _leaders_of(s, head.api_version, all_refused)))
    if s.auto_create is not None and s.auto_create.enabled:
        # Answered UNKNOWN_TOPIC_OR_PARTITION (retriable) by the append below, as Kafka's.
        known = set(s.metadata_cache.topics())
        unknown = {p.topic for p in request.partitions if p.topic not in known}
        if unknown and not s.allowed(CREATE, CLUSTER, CLUSTER_NAME):
            unknown = {name for name in unknown if s.allowed(CREATE, TOPIC, name)}
        s.auto_create.maybe_create(sorted(unknown))
    rm = s.replica_manager
    response, waits = await rm.produce_append(request)
    response.partitions.extend(refused)
    if request.acks == 0:
        return _done(None)
    if not waits:
        return _done(produce_values(response, _leaders_of(s, head.api_version, response)))
    outcome: asyncio.Future[pb.ProduceResponse] = asyncio.get_running_loop().create_future()

    def settle(done: pb.ProduceResponse) -> None:
        if not outcome.done():
            outcome.set_result(done)
    withdraw = rm.produce_watch(request, response, waits, settle)

    async def answer() -> Response:
        done = await outcome
        return produce_values(done, _leaders_of(s, head.api_version, done))
    # Not a background task: this request's answer, awaited in order by the connection's
    # writer (which handles what it raises), cancelled with the connection.
    task = asyncio.ensure_future(answer())
    # However the answer ends (sent, or the connection gone), the waits go with it.
    task.add_done_callback(lambda _: withdraw())
    return task


# ---------------------------------------------------------------- Fetch

def fetch_request_head(body: RequestBody) -> pb.FetchRequest:
    """A Kafka Fetch's own fields as the broker's request, without its partitions (the
    fetch session's, ``session_read``, are added after)."""
    return pb.FetchRequest(replica_id=-1, replica_broker_epoch=-1,
                           max_wait_ms=milliseconds(body.max_wait), min_bytes=body.min_bytes,
                           max_bytes=body.max_bytes,
                           isolation_level=getattr(body, "isolation_level", READ_UNCOMMITTED))


def fetch_values(results: list[FetchedPartition], version: int = 12) -> dict[str, Any]:
    def entry(p: FetchedPartition) -> dict[str, Any]:
        error_code, records = p.error_code, p.records
        if version < ZSTD_FETCH_FROM and records and uses_zstd(records):
            error_code, records = pb.UNSUPPORTED_COMPRESSION_TYPE, b""
        values: dict[str, Any] = {
            "partition_index": p.partition, "error_code": error_code,
            "high_watermark": p.high_watermark, "last_stable_offset": last_stable_offset_of(p),
            "log_start_offset": p.log_start_offset,
            "aborted_transactions": _aborted_values(p),
            "preferred_read_replica": -1, "records": records}
        if p.diverging is not None:
            values["diverging_epoch"] = {"epoch": p.diverging[0], "end_offset": p.diverging[1]}
        if error_code in (pb.NOT_LEADER_OR_FOLLOWER, pb.FENCED_LEADER_EPOCH):
            values["current_leader"] = {"leader_id": -1, "leader_epoch": p.leader_epoch}
        return values
    responses = by_topic(results, "topic", "partitions", entry)
    if version >= TOPIC_IDS_FROM:  # the answers' ``topic`` is the topic id's string
        for t in responses:
            t["topic_id"] = topic_id_of_key(t["topic"])
    return {"throttle_time": 0, "error_code": pb.NONE, "session_id": 0,
            "responses": responses}


def throttled_fetch_values(values: dict[str, Any]) -> dict[str, Any]:
    """A throttled fetch's answer (KIP-219, Kafka's ``getThrottledResponse``): its top
    level (error code, session id) and no partitions; the records stay unread for the
    next fetch."""
    return {**values, "responses": []}


def _aborted_values(p: FetchedPartition) -> list[dict[str, int]] | None:
    aborted = aborted_transactions_of(p)
    if aborted is None:
        return None
    return [{"producer_id": pid, "first_offset": first} for pid, first in aborted]


async def on_fetch(s: Services, head: RequestHead, body: RequestBody
                  ) -> Awaitable[Response]:
    """Every version through the session cache (``fetch_session_apis``): v4-6 and
    epoch -1 are sessionless full fetches."""
    if code := client_fetch_refusal(replica_id_of(body)):  # followers fetch on BrokerControl
        return _done({"throttle_time": 0, "error_code": code, "session_id": 0,
                      "responses": []})
    version = head.api_version
    try:
        context = session_context(s.fetch_sessions, body, version)
    except TidewaterError as e:  # a session error: the client starts a new session
        return _done({"throttle_time": 0, "error_code": e.error_code, "session_id": 0,
                      "responses": []})
    head_only = fetch_request_head(body)
    read = session_read(context, head_only, version, s.metadata_cache.topic_names_by_id(),
                        lambda topic: s.allowed(READ, TOPIC, topic))

    async def answer() -> Response:
        fetched = (await s.replica_manager.fetch_partitions(read.request)
                   if read.request.partitions else [])
        error_code, session_id, answered = session_answer(
            s.fetch_sessions, context, read, fetched, mono_ms())
        values = fetch_values(answered, version)
        values.update(error_code=error_code, session_id=session_id)
        if error_code != pb.NONE:
            values["responses"] = []
        return values
    return answer()


# ---------------------------------------------------------------- ListOffsets

async def on_list_offsets(s: Services, head: RequestHead, body: RequestBody
                         ) -> Awaitable[Response]:
    request = pb.ListOffsetsRequest(
        replica_id=-1, isolation_level=getattr(body, "isolation_level", READ_UNCOMMITTED))
    denied: list[pb.ListOffsetsPartitionResponse] = []
    for topic in body.topics:
        if not s.allowed(DESCRIBE, TOPIC, topic.name):
            denied += [pb.ListOffsetsPartitionResponse(
                topic=topic.name, partition=p.partition_index,
                error_code=pb.TOPIC_AUTHORIZATION_FAILED, timestamp=-1, offset=-1,
                leader_epoch=-1) for p in topic.partitions]
            continue
        for p in topic.partitions:
            request.partitions.add(topic=topic.name, partition=p.partition_index,
                                   current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                                   timestamp=p.timestamp)
    response = s.replica_manager.list_offsets(request)
    response.partitions.extend(denied)
    return _done({"throttle_time": 0, "topics": by_topic(
        response.partitions, "name", "partitions", lambda p: {
            "partition_index": p.partition, "error_code": p.error_code,
            "timestamp": p.timestamp, "offset": p.offset, "leader_epoch": p.leader_epoch})})


# ---------------------------------------------------------------- OffsetForLeaderEpoch

async def on_offset_for_leader_epoch(s: Services, head: RequestHead, body: RequestBody
                                    ) -> Awaitable[Response]:
    request = pb.OffsetForLeaderEpochRequest(replica_id=-1)
    denied: list[pb.OffsetForLeaderEpochPartitionResponse] = []
    for topic in body.topics:
        if not s.allowed(DESCRIBE, TOPIC, topic.topic):
            denied += [pb.OffsetForLeaderEpochPartitionResponse(
                topic=topic.topic, partition=p.partition,
                error_code=pb.TOPIC_AUTHORIZATION_FAILED, leader_epoch=-1, end_offset=-1)
                for p in topic.partitions]
            continue
        for p in topic.partitions:
            request.partitions.add(topic=topic.topic, partition=p.partition,
                                   current_leader_epoch=getattr(p, "current_leader_epoch", -1),
                                   leader_epoch=p.leader_epoch)
    response = s.replica_manager.offset_for_leader_epoch(request)
    response.partitions.extend(denied)
    return _done({"throttle_time": 0, "topics": by_topic(
        response.partitions, "topic", "partitions", lambda p: {
            "error_code": p.error_code, "partition": p.partition,
            "leader_epoch": p.leader_epoch, "end_offset": p.end_offset})})


# ---------------------------------------------------------------- admin (forwarded)

async def on_create_topics(s: Services, head: RequestHead, body: RequestBody
                          ) -> Awaitable[Response]:
    request = pb.CreateTopicsRequest(timeout_ms=milliseconds(body.timeout),
                                     validate_only=getattr(body, "validate_only", False))
    denied: list[str] = []
    may_create_any = s.allowed(CREATE, CLUSTER, CLUSTER_NAME)
    for t in body.topics:
        if not may_create_any and not s.allowed(CREATE, TOPIC, t.name):
            denied.append(t.name)
            continue
        request.topics.add(name=t.name, num_partitions=t.num_partitions,
                           replication_factor=t.replication_factor,
                           configs={c.name: c.value for c in t.configs if c.value is not None},
                           assignments=[pb.ReplicaList(partition=a.partition_index,
                                                       broker_ids=list(a.broker_ids))
                                        for a in t.assignments or ()])

    async def answer() -> Response:
        response = (await s.controller.CreateTopics(request, None) if request.topics
                    else pb.CreateTopicsResponse())
        results = [{"name": r.name, "topic_id": _topic_id(r.topic_id),
                    "error_code": r.error_code, "error_message": r.error_message or None,
                    "num_partitions": r.num_partitions or -1,
                    "replication_factor": r.replication_factor or -1, "configs": None}
                   for r in response.topics]
        results += [{"name": name, "topic_id": NO_TOPIC_ID,
                     "error_code": pb.TOPIC_AUTHORIZATION_FAILED,
                     "error_message": "needs CREATE on the cluster or the topic",
                     "num_partitions": -1, "replication_factor": -1, "configs": None}
                    for name in denied]
        return {"throttle_time": 0, "topics": results}
    return answer()


async def on_delete_topics(s: Services, head: RequestHead, body: RequestBody
                          ) -> Awaitable[Response]:
    # v1-5 name topics (topic_names); v6 names each by name or by ID (delete_topics_plan).
    entries = ([(t.name, t.topic_id or NO_TOPIC_ID) for t in body.topics]
               if head.api_version >= 6
               else [(name, NO_TOPIC_ID) for name in body.topic_names])
    plan = plan_delete_topics(entries, s.metadata_cache.topic_names_by_id(),
                              lambda name: s.allowed(DELETE, TOPIC, name),
                              lambda name: s.allowed(DESCRIBE, TOPIC, name))
    request = pb.DeleteTopicsRequest(names=plan.names, topic_ids=plan.topic_ids,
                                     timeout_ms=milliseconds(body.timeout))

    async def answer() -> Response:
        response = (await s.controller.DeleteTopics(request, None) if request.names
                    else pb.DeleteTopicsResponse())
        return {"throttle_time": 0, "responses": [
            {"name": r.name or None, "topic_id": _topic_id(r.topic_id),
             "error_code": r.error_code, "error_message": r.error_message or None}
            for r in response.topics] + plan.answered}
    return answer()


# ---------------------------------------------------------------- DescribeConfigs, DescribeCluster

TOPIC_RESOURCE, BROKER_RESOURCE, BROKER_LOGGER_RESOURCE = 2, 4, 8
# Kafka's ConfigSource: set on the topic, or the broker's default it falls back to.
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
# Kafka's ConfigType (DescribeConfigs v3+), by our topic configs' types.
_CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}


def topic_config_entries(own: dict[str, str], defaults: dict[str, str],
                         keys: list[str] | None,
                         default_sources: dict[str, int] | None = None,
                         broker_entries: list[BrokerConfigEntry] | None = None
                         ) -> list[dict[str, Any]]:
    """A topic's configs as DescribeConfigs lists them: each known name (or each of
    ``keys`` that is known), its value and where the value comes from: the topic, else
    the broker setting it inherits (``default_sources``: a dynamic or static one, as
    Kafka's synonyms), else the default. With ``broker_entries`` (synonyms asked for):
    Kafka's precedence list, the topic's own value, then each broker-level layer."""
    from tidewater.proto.broker_dynamic_config import DYNAMIC_BROKER_CONFIGS
    from tidewater.proto.topic_config import TOPIC_CONFIGS
    names = sorted(TOPIC_CONFIGS) if keys is None else [k for k in keys if k in TOPIC_CONFIGS]
    by_topic_name = {DYNAMIC_BROKER_CONFIGS[e.name]: e for e in broker_entries or ()
                     if e.name in DYNAMIC_BROKER_CONFIGS}
    entries: list[dict[str, Any]] = []
    for name in names:
        source = (DYNAMIC_TOPIC_CONFIG if name in own
                  else (default_sources or {}).get(name, DEFAULT_CONFIG))
        # Kafka's default where the broker has none (the configs without effect here).
        value = own.get(name, defaults.get(name, TOPIC_CONFIGS[name].default))
        synonyms = []
        if broker_entries is not None:
            if name in own:
                synonyms.append({"name": name, "value": own[name],
                                 "source": DYNAMIC_TOPIC_CONFIG})
            broker = by_topic_name.get(name)
            if broker is not None:
                synonyms += [{"name": broker.name, "value": v, "source": src}
                             for v, src in broker.dynamic]
                synonyms.append({"name": broker.name, "value": broker.value,
                                 "source": broker.source})
                if broker.source != DEFAULT_CONFIG:
                    synonyms.append({"name": broker.name, "value": broker.default,
                                     "source": DEFAULT_CONFIG})
        entries.append({"name": name, "value": value, "read_only": False,
                        "config_source": source, "is_default": source == DEFAULT_CONFIG,
                        "is_sensitive": False, "synonyms": synonyms,
                        "config_type": _CONFIG_TYPES.get(TOPIC_CONFIGS[name].type, 0),
                        "documentation": None})
    return entries


async def on_describe_configs(s: Services, head: RequestHead, body: RequestBody
                             ) -> Awaitable[Response]:
    results: list[dict[str, Any]] = []
    defaults = s.topic_config_defaults()
    known = set(s.metadata_cache.topics())
    for resource in body.resources:
        result: dict[str, Any] = {"resource_type": resource.resource_type,
                                  "resource_name": resource.resource_name,
                                  "error_code": pb.NONE, "error_message": None, "configs": []}
        keys = None if resource.configuration_keys is None else list(resource.configuration_keys)
        if resource.resource_type == TOPIC_RESOURCE and not s.allowed(
                OP_DESCRIBE_CONFIGS, TOPIC, resource.resource_name):
            result["error_code"] = pb.TOPIC_AUTHORIZATION_FAILED
            result["error_message"] = "needs DESCRIBE_CONFIGS on the topic"
        elif resource.resource_type == TOPIC_RESOURCE:
            if resource.resource_name in known:
                synonyms = getattr(body, "include_synonyms", False)
                result["configs"] = topic_config_entries(
                    s.metadata_cache.topic_configs(resource.resource_name), defaults, keys,
                    s.topic_default_sources(), s.broker_configs() if synonyms else None)
            else:
                result["error_code"] = pb.UNKNOWN_TOPIC_OR_PARTITION
                result["error_message"] = f"topic {resource.resource_name!r} does not exist"
        elif resource.resource_type in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE):
            _describe_broker(s, resource, keys, getattr(body, "include_synonyms", False),
                             result)
        else:
            result["error_code"] = pb.INVALID_REQUEST
            result["error_message"] = (f"resource type {resource.resource_type}: topics (2), "
                                       "brokers (4) and broker loggers (8) are described")
        results.append(result)
    return _done({"throttle_time": 0, "results": results})


def _describe_broker(s: Services, resource: Any, keys: list[str] | None,
                     include_synonyms: bool, result: dict[str, Any]) -> None:
    """A BROKER resource as Kafka's: this broker's own id (an admin client sends it to
    that broker), or "" for the cluster-wide dynamic defaults (those set); needs
    DESCRIBE_CONFIGS on the cluster. BROKER_LOGGER: no loggers are listed."""
    name, own = resource.resource_name, str(s.replica_manager.broker_id)
    if not s.allowed(OP_DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME):
        result["error_code"] = pb.CLUSTER_AUTHORIZATION_FAILED
        result["error_message"] = "needs DESCRIBE_CONFIGS on the cluster"
    elif name not in (own, "") or (name == "" and resource.resource_type != BROKER_RESOURCE):
        result["error_code"] = pb.INVALID_REQUEST
        result["error_message"] = (f"unexpected broker id, expected {own} or empty string, "
                                   f"but received {name!r}")
    elif name == own and resource.resource_type == BROKER_RESOURCE:
        result["configs"] = describe_values(s.broker_configs(), keys, include_synonyms)
    elif name == "":
        result["configs"] = describe_values(s.cluster_default_configs(), keys, include_synonyms)


async def on_describe_cluster(s: Services, head: RequestHead, body: RequestBody
                             ) -> Awaitable[Response]:
    if not s.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
        return _done({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                      "error_message": "needs DESCRIBE on the cluster", "endpoint_type": 1,
                      "cluster_id": "", "controller_id": -1, "brokers": []})
    answer = s.metadata_cache.metadata_response([], s.listener_name)
    return _done({
        "throttle_time": 0, "error_code": pb.NONE, "error_message": None, "endpoint_type": 1,
        "cluster_id": answer.cluster_id,
        "controller_id": named_controller(s.replica_manager.broker_id,
                                          [b.broker_id for b in answer.brokers]),
        "brokers": [{"broker_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack or None}
                    for b in answer.brokers],
        "cluster_authorized_operations": (
            authorized_operations(s.allowed, CLUSTER, CLUSTER_NAME)
            if body.include_cluster_authorized_operations else AUTHORIZED_OPERATIONS_OMITTED)})


async def on_create_partitions(s: Services, head: RequestHead, body: RequestBody
                              ) -> Awaitable[Response]:
    request = pb.CreatePartitionsRequest(timeout_ms=milliseconds(body.timeout),
                                         validate_only=body.validate_only)
    refused: dict[str, tuple[pb.ErrorCode, str]] = {}
    for t in body.topics:
        if not s.allowed(ALTER, TOPIC, t.name):
            refused[t.name] = (pb.TOPIC_AUTHORIZATION_FAILED, "needs ALTER on the topic")
        else:
            request.topics.add(name=t.name, count=t.count, assignments=[
                pb.ReplicaList(broker_ids=list(a.broker_ids)) for a in t.assignments or ()])

    async def answer() -> Response:
        response = (await s.controller.CreatePartitions(request, None) if request.topics
                    else pb.CreatePartitionsResponse())
        results = [{"name": r.name, "error_code": r.error_code,
                    "error_message": r.error_message or None} for r in response.topics]
        results += [{"name": name, "error_code": code, "error_message": message}
                    for name, (code, message) in refused.items()]
        return {"throttle_time": 0, "results": results}
    return answer()


# A request's handler: does its in-order work, then returns the awaitable answer.
Handler = Callable[[Services, RequestHead, RequestBody], Awaitable[Awaitable[Response]]]


def _imported_at_first_request(module: str, table: str, api_key: int) -> Handler:
    """``module``'s handler of ``api_key`` (in its dict ``table``), the module imported at
    the first such request: the group and transaction APIs, whose modules and coordinators
    a broker need not import before it serves (broker/coordinators.py)."""
    def handle(services: Services, head: RequestHead,
               body: RequestBody) -> Awaitable[Awaitable[Response]]:
        handler: Handler = getattr(importlib.import_module(module), table)[api_key]
        return handler(services, head, body)
    return handle

HANDLERS: dict[int, Handler] = {
    API_VERSIONS: on_api_versions,
    METADATA: on_metadata,
    PRODUCE: on_produce,
    FETCH: on_fetch,
    LIST_OFFSETS: on_list_offsets,
    OFFSET_FOR_LEADER_EPOCH: on_offset_for_leader_epoch,
    CREATE_TOPICS: on_create_topics,
    DELETE_TOPICS: on_delete_topics,
    DESCRIBE_CONFIGS: on_describe_configs,
    DESCRIBE_CLUSTER: on_describe_cluster,
    CREATE_PARTITIONS: on_create_partitions,
    **{key: _imported_at_first_request("tidewater.broker.kafka.group_apis", "GROUP_HANDLERS",
                                       key) for key in GROUP_VERSIONS},
    sasl.SASL_HANDSHAKE: sasl.on_sasl_handshake,
    sasl.SASL_AUTHENTICATE: sasl.on_sasl_authenticate,
    **security_apis.HANDLERS,
    **quota_apis.HANDLERS,
    INIT_PRODUCER_ID: on_init_producer_id,
    **{key: _imported_at_first_request("tidewater.broker.kafka.txn_apis", "TXN_HANDLERS", key)
       for key in TXN_VERSIONS},
    DELETE_RECORDS: on_delete_records,
    DESCRIBE_LOG_DIRS: on_describe_log_dirs,
    **config_apis.HANDLERS,
    **reassign_apis.HANDLERS,
    **quorum_apis.HANDLERS,
    **topic_apis.HANDLERS,
    WRITE_TXN_MARKERS: on_write_txn_markers,
    DESCRIBE_PRODUCERS: on_describe_producers,
}
assert set(HANDLERS) == set(SUPPORTED)
