"""Admin client: create, delete, list and describe topics; describe the cluster; SCRAM
users and ACLs.

Admin calls go to any broker's ``Controller`` service (brokers forward them to
the active controller). Per-replica log state (LEO, HW, log start offset)
comes from each broker's ``DescribeReplicas``, asked in parallel; a broker
that does not answer leaves its replicas' state unknown (-1), it does not fail
the whole description.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from tidewater.client.metadata import (
    Address,
    MetadataClient,
    TopicPartition,
    client_metadata,
    format_address,
    rpc_call,
    rpc_error_to_typed,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import Acl
from tidewater.proto.errors import (
    ClusterAuthorizationFailedError,
    TidewaterError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from tidewater.proto.scram import credential_to_pb, make_credential
from tidewater.proto.topic_id import TOPIC_ID_BYTES, topic_id_to_text

# A hung (e.g. SIGSTOPped) broker must not stall a describe: its replicas show -1 instead.
REPLICA_STATE_TIMEOUT_MS = 5000
SCRAM_ITERATIONS_DEFAULT = 8192  # Kafka's kafka-configs.sh default for SCRAM users


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1  # -1: cluster default
    replication_factor: int = -1
    configs: dict[str, str] = field(default_factory=dict)
    # Manual assignment: partition i's replicas, preferred first (then num_partitions and
    # replication_factor stay -1).
    replica_assignment: tuple[tuple[int, ...], ...] = ()


# Kafka's ConfigSource numbers (DescribeConfigs), by the names this client shows.
CONFIG_SOURCE_NAMES = {1: "topic", 2: "dynamic broker", 3: "dynamic default",
                       4: "static broker", 5: "default"}


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """A topic config as a broker applies it: its value and where the value comes from
    (``CONFIG_SOURCE_NAMES``: set on the topic, a broker's setting, or the default)."""

    name: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id as its coordinator describes it (ListTransactions)."""

    transactional_id: str
    coordinator: int  # the broker id that answered
    state: str  # Kafka's name: Empty, Ongoing, PrepareCommit, CompleteCommit, ...
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_timestamp_ms: int  # -1: no transaction open
    partitions: tuple[tuple[str, int], ...]

    @property
    def open(self) -> bool:
        return self.state in ("Ongoing", "PrepareCommit", "PrepareAbort")

    def hanging(self, now_ms: int) -> bool:
        """Open for longer than its timeout: the coordinator should have aborted it."""
        return (self.open and self.start_timestamp_ms >= 0
                and now_ms - self.start_timestamp_ms > self.timeout_ms)


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    broker_epoch: int
    listeners: dict[str, str]  # listener name -> host:port
    fenced: bool
    in_controlled_shutdown: bool
    rack: str = ""  # broker.rack; "" for none


@dataclass(frozen=True, slots=True)
class ReplicaState:
    broker: int
    log_end_offset: int = -1
    high_watermark: int = -1
    log_start_offset: int = -1
    is_leader: bool = False
    size_bytes: int = -1
    # A read_committed consumer's limit: the first offset of the oldest open transaction,
    # else the high watermark (-1: unknown, or a broker that does not report it).
    last_stable_offset: int = -1


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: bool
    replicas_state: tuple[ReplicaState, ...] = ()

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """An ongoing reassignment (Kafka's OngoingPartitionReassignment)."""

    replicas: tuple[int, ...]  # the union of the original and the target replicas
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicDescriptionInfo:
    name: str
    configs: dict[str, str]
    partitions: tuple[PartitionDescription, ...]
    topic_id: str = ""  # this incarnation's ID, Kafka's 22-character form ("" if unknown)


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    controller_epoch: int
    brokers: tuple[BrokerDescription, ...]
    topics: tuple[TopicDescriptionInfo, ...]
    unclean_elections_total: int = 0

    @property
    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics)

    def offline_partitions(self) -> list[tuple[str, int]]:
        return [(t.name, p.partition) for t in self.topics for p in t.partitions if p.offline or p.leader < 0]

    def under_replicated_partitions(self) -> list[tuple[str, int]]:
        return [(t.name, p.partition) for t in self.topics for p in t.partitions if p.under_replicated]


TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4  # Kafka's ConfigResource types
# Kafka's AlterConfigOp types and ElectionType values.
CONFIG_OPERATIONS = {"SET": 0, "DELETE": 1, "APPEND": 2, "SUBTRACT": 3}
ELECTION_TYPES = {"preferred": 0, "unclean": 1}


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One IncrementalAlterConfigs alteration: SET, DELETE, APPEND or SUBTRACT."""

    name: str
    operation: str = "SET"
    value: str = ""


class TopicOperationError(TidewaterError):
    """Some topics of a create/delete failed; ``errors`` maps name -> typed error."""

    def __init__(self, errors: dict[str, TidewaterError]):
        self.errors = errors
        first = next(iter(errors.values()))
        self.error_code = first.error_code
        super().__init__("; ".join(f"{name}: {err}" for name, err in errors.items()))


class _Result(Protocol):
    """An answer's per-item result (a topic, an ACL, a SCRAM user...)."""

    @property
    def error_code(self) -> int: ...

    @property
    def error_message(self) -> str: ...


class _TopicResult(_Result, Protocol):
    @property
    def name(self) -> str: ...


class AdminClient:
    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 30000,
                 metadata: MetadataClient | None = None,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None):
        self.request_timeout_ms = request_timeout_ms
        # TLS settings (client/security.py, Kafka's names); a given ``metadata``'s pool
        # has its own.
        _security, self.metadata = client_metadata(
            bootstrap, metadata, request_timeout_ms, security_protocol, ssl_cafile, ssl_certfile,
            ssl_keyfile, sasl_mechanism=sasl_mechanism, sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password)

    # ------------------------------------------------------------------ topics

    def create_topics(self, topics: list[NewTopic], *, validate_only: bool = False
                      ) -> dict[str, TidewaterError | None]:
        """Create topics; per name, None or the typed error. Nothing raised for per-topic errors."""
        request = pb.CreateTopicsRequest(
            timeout_ms=self.request_timeout_ms, validate_only=validate_only,
            topics=[pb.CreatableTopic(
                name=t.name, num_partitions=t.num_partitions,
                replication_factor=t.replication_factor, configs=dict(t.configs),
                assignments=[pb.ReplicaList(partition=i, broker_ids=list(replicas))
                             for i, replicas in enumerate(t.replica_assignment)])
                for t in topics])
        resp: pb.CreateTopicsResponse = self._controller_call("CreateTopics", request)
        self.metadata.invalidate()
        return self._topic_results(resp.topics)

    def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                     configs: dict[str, str] | None = None) -> None:
        """Create one topic; raises its typed error."""
        self._raise_failures(self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, dict(configs or {}))]))

    def create_partitions(self, new_totals: dict[str, int], *, validate_only: bool = False,
                          assignments: dict[str, list[list[int]]] | None = None
                          ) -> dict[str, TidewaterError | None]:
        """Grow each topic to ``new_totals[topic]`` partitions (Kafka's CreatePartitions:
        never fewer); ``assignments[topic]``: the new partitions' replicas, in order (else
        spread over the live brokers). Per name, None or the typed error."""
        manual = assignments or {}
        request = pb.CreatePartitionsRequest(
            timeout_ms=self.request_timeout_ms, validate_only=validate_only,
            topics=[pb.CreatePartitionsTopic(
                name=name, count=count,
                assignments=[pb.ReplicaList(broker_ids=r) for r in manual.get(name, [])])
                for name, count in new_totals.items()])
        resp: pb.CreatePartitionsResponse = self._controller_call("CreatePartitions", request)
        self.metadata.invalidate()
        return self._topic_results(resp.topics)

    def delete_topics(self, names: list[str]) -> dict[str, TidewaterError | None]:
        request = pb.DeleteTopicsRequest(names=list(names), timeout_ms=self.request_timeout_ms)
        resp: pb.DeleteTopicsResponse = self._controller_call("DeleteTopics", request)
        self.metadata.invalidate()
        return self._topic_results(resp.topics)

    def delete_topic(self, name: str) -> None:
        self._raise_failures(self.delete_topics([name]))

    def list_topics(self) -> list[str]:
        try:
            return sorted(t.name for t in self.describe_cluster().topics)
        except ClusterAuthorizationFailedError:
            # No DESCRIBE on the cluster (ACLs): the topics this principal may describe,
            # from Metadata, as kafka-topics.sh --list shows them.
            timeout_s = self.request_timeout_ms / 1000

            def ask(address: Address) -> pb.MetadataResponse:
                response: pb.MetadataResponse = rpc_call(
                    self.metadata.pool.broker(address).Metadata, pb.MetadataRequest(),
                    timeout_s=timeout_s, address=address)
                return response
            return sorted(t.name for t in self.metadata.any_broker_call(ask).topics)

    def describe_cluster(self) -> ClusterDescription:
        resp: pb.DescribeClusterResponse = self._controller_call("DescribeCluster", pb.DescribeClusterRequest())
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code, f"DescribeCluster: {pb.ErrorCode.Name(resp.error_code)}")
        brokers = tuple(
            BrokerDescription(
                broker_id=b.broker_id, broker_epoch=b.broker_epoch,
                listeners={li.name: f"{li.host}:{li.port}" for li in b.listeners},
                fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown, rack=b.rack)
            for b in sorted(resp.brokers, key=lambda b: b.broker_id))
        topics = tuple(
            TopicDescriptionInfo(
                name=t.name, configs=dict(t.configs),
                partitions=tuple(_partition_description(p)
                                 for p in sorted(t.partitions, key=lambda p: p.partition)),
                topic_id=(topic_id_to_text(t.topic_id) if len(t.topic_id) == TOPIC_ID_BYTES
                          else ""))
            for t in sorted(resp.topics, key=lambda t: t.name))
        return ClusterDescription(
            cluster_id=resp.cluster_id, controller_id=resp.controller_id,
            controller_epoch=resp.controller_epoch, brokers=brokers, topics=topics,
            unclean_elections_total=resp.unclean_elections_total)

    def describe_topics(self, names: list[str] | None = None, *, with_replica_state: bool = True
                        ) -> list[TopicDescriptionInfo]:
        """Topics (all when ``names`` is empty) with per-replica LEO/HW/log start.

        Raises UnknownTopicOrPartitionError naming every missing topic.
        """
        cluster = self.describe_cluster()
        by_name = {t.name: t for t in cluster.topics}
        if names:
            missing = [n for n in names if n not in by_name]
            if missing:
                raise UnknownTopicOrPartitionError("unknown topic(s): " + ", ".join(missing))
            topics = [by_name[n] for n in names]
        else:
            topics = list(cluster.topics)
        if not with_replica_state or not topics:
            return topics
        states = self.describe_replicas([t.name for t in topics])
        out = []
        for t in topics:
            parts = []
            for p in t.partitions:
                rs = tuple(states.get((t.name, p.partition, b), ReplicaState(broker=b)) for b in p.replicas)
                parts.append(_replace_replicas_state(p, rs))
            out.append(TopicDescriptionInfo(t.name, t.configs, tuple(parts), t.topic_id))
        return out

    def describe_replicas(self, topics: list[str], broker_ids: Iterable[int] | None = None
                          ) -> dict[tuple[str, int, int], ReplicaState]:
        """(topic, partition, broker) -> ReplicaState, from every broker that answers.

        ``broker_ids``: the brokers the caller knows are up (DescribeCluster's unfenced
        ones); when the cached metadata (younger than metadata_max_age_ms) has an
        address for each, its brokers are asked without a Metadata request first
        (which, from an admin client tracking no topics, describes every partition of
        the cluster: at 1,000 partitions a quarter of the console's snapshot). A broker that does not answer marks the
        metadata stale, so the next call asks afresh (it may have moved)."""
        cached = self.metadata.fresh_snapshot()
        if (cached is not None and broker_ids is not None
                and set(broker_ids) <= cached.brokers.keys()):
            brokers = cached.brokers
        else:
            brokers = self.metadata.refresh().brokers
        request = pb.DescribeReplicasRequest(topics=list(topics))
        calls = []
        for broker_id, address in brokers.items():
            calls.append((broker_id, address, self.metadata.pool.broker(address).DescribeReplicas.future(
                request, timeout=min(self.request_timeout_ms, REPLICA_STATE_TIMEOUT_MS) / 1000)))
        out: dict[tuple[str, int, int], ReplicaState] = {}
        for broker_id, _address, call in calls:
            try:
                resp = call.result()
            except grpc.RpcError:
                self.metadata.invalidate()
                continue  # that broker's replicas stay unknown
            answering = resp.broker_id if resp.broker_id else broker_id
            for r in resp.replicas:
                out[(r.topic, r.partition, answering)] = ReplicaState(
                    broker=answering, log_end_offset=r.log_end_offset, high_watermark=r.high_watermark,
                    log_start_offset=r.log_start_offset, is_leader=r.is_leader, size_bytes=r.size_bytes,
                    last_stable_offset=r.last_stable_offset if r.HasField("last_stable_offset")
                    else -1)
        return out

    def describe_topic_configs(self, topic: str) -> list[DescribedConfig]:
        """Every config of ``topic`` as a broker applies it (Kafka's DescribeConfigs): its
        value and source, so a broker's ``--set`` or a dynamic default shows as such.
        Raises the typed error (unknown topic, not authorized)."""
        request = pb.DescribeTopicConfigsRequest(topics=[topic])
        timeout_s = self.request_timeout_ms / 1000

        def call(address: Address) -> pb.DescribeTopicConfigsResponse:
            response: pb.DescribeTopicConfigsResponse = rpc_call(
                self.metadata.pool.broker(address).DescribeTopicConfigs, request,
                timeout_s=timeout_s, address=address)
            return response

        [result] = self.metadata.any_broker_call(call).topics
        if result.error_code != pb.NONE:
            raise error_for_code(result.error_code, result.error_message)
        return [DescribedConfig(c.name, c.value, CONFIG_SOURCE_NAMES.get(c.source, str(c.source)))
                for c in result.configs]

    def list_transactions(self) -> list[TransactionDescription]:
        """Every transactional id, from each broker's ListTransactions (each coordinates
        some): sorted by id. A broker that does not answer leaves its ids out; one still
        loading its coordinator state may list only some (CoordinatorLoadInProgressError
        when it lists none)."""
        snap = self.metadata.refresh()
        timeout_s = min(self.request_timeout_ms, REPLICA_STATE_TIMEOUT_MS) / 1000
        calls = [(broker_id, self.metadata.pool.broker(address).ListTransactions.future(
            pb.ListTransactionsRequest(), timeout=timeout_s))
            for broker_id, address in snap.brokers.items()]
        out: list[TransactionDescription] = []
        loading: TidewaterError | None = None
        for broker_id, call in calls:
            try:
                resp: pb.ListTransactionsResponse = call.result()
            except grpc.RpcError:
                continue  # that broker's transactional ids stay unknown
            if resp.error_code != pb.NONE and not resp.transactions:
                loading = error_for_code(resp.error_code, f"ListTransactions on broker "
                                         f"{broker_id}: {pb.ErrorCode.Name(resp.error_code)}")
            out += [TransactionDescription(
                t.transactional_id, resp.broker_id or broker_id, t.state, t.producer_id,
                t.producer_epoch, t.timeout_ms, t.start_timestamp_ms,
                tuple((p.topic, p.partition) for p in t.partitions)) for t in resp.transactions]
        if not out and loading is not None:
            raise loading
        return sorted(out, key=lambda t: t.transactional_id)

    def delete_records(self, offsets: dict[tuple[str, int], int]
                       ) -> dict[tuple[str, int], int | TidewaterError]:
        """Kafka's DeleteRecords: move each partition's log start to ``offsets[(topic,
        partition)]`` (-1: its high watermark); per partition, the new low watermark or the
        typed error. Each partition goes to its leader."""
        self.metadata.refresh(sorted({topic for topic, _ in offsets}))
        by_leader: dict[Address, pb.DeleteRecordsRequest] = {}
        out: dict[tuple[str, int], int | TidewaterError] = {}
        for (topic, number), offset in offsets.items():
            try:
                leader = self.metadata.leader_for(TopicPartition(topic, number))
            except TidewaterError as e:
                out[(topic, number)] = e
                continue
            if leader is None:
                out[(topic, number)] = error_for_code(
                    pb.LEADER_NOT_AVAILABLE, f"{topic}-{number} has no leader")
                continue
            request = by_leader.setdefault(leader.address, pb.DeleteRecordsRequest(
                timeout_ms=self.request_timeout_ms))
            request.partitions.add(topic=topic, partition=number, offset=offset)
        for address, request in by_leader.items():
            response: pb.DeleteRecordsResponse = rpc_call(
                self.metadata.pool.broker(address).DeleteRecords, request,
                timeout_s=self.request_timeout_ms / 1000 + 5, address=address)
            for r in response.partitions:
                out[(r.topic, r.partition)] = r.low_watermark if r.error_code == pb.NONE else (
                    error_for_code(r.error_code, r.error_message or
                                   pb.ErrorCode.Name(r.error_code)))
        return out

    def describe_log_dirs(self) -> dict[int, tuple[str, dict[tuple[str, int], tuple[int, int]]]]:
        """kafka-log-dirs.sh --describe: broker id -> (its log dir, (topic, partition) ->
        (size in bytes, offset lag)), from every broker that answers."""
        snap = self.metadata.refresh()
        out: dict[int, tuple[str, dict[tuple[str, int], tuple[int, int]]]] = {}
        for broker_id, address in sorted(snap.brokers.items()):
            try:
                resp: pb.DescribeReplicasResponse = rpc_call(
                    self.metadata.pool.broker(address).DescribeReplicas,
                    pb.DescribeReplicasRequest(), timeout_s=self.request_timeout_ms / 1000,
                    address=address)
            except TidewaterError:
                continue  # a broker that does not answer is left out, as kafka-log-dirs.sh
            out[broker_id] = (resp.log_dir, {
                (r.topic, r.partition): (r.size_bytes,
                                         max(r.high_watermark - r.log_end_offset, 0))
                for r in resp.replicas})
        return out

    # ------------------------------------------------------------------ users and ACLs
    # (controller/security_records.py). The password never leaves this process: the
    # credential is salted and iterated here (proto/scram.py).

    def upsert_scram_user(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512",
                          iterations: int = SCRAM_ITERATIONS_DEFAULT) -> None:
        credential = credential_to_pb(user, make_credential(mechanism, password,
                                                            iterations=iterations))
        resp: pb.AlterUserScramCredentialsResponse = self._controller_call("AlterUserScramCredentials",
                                     pb.AlterUserScramCredentialsRequest(upsertions=[credential]))
        self._raise_first(resp.results)

    def delete_scram_user(self, user: str, mechanisms: list[str] | None = None) -> None:
        """Delete ``mechanisms`` (default: every one the user has) of ``user``."""
        if mechanisms is None:
            mechanisms = [m for m, _ in self.describe_scram_users([user]).get(user, [])]
            if not mechanisms:
                raise error_for_code(pb.RESOURCE_NOT_FOUND, f"no user {user!r}")
        resp: pb.AlterUserScramCredentialsResponse = self._controller_call("AlterUserScramCredentials",
                                     pb.AlterUserScramCredentialsRequest(deletions=[
                                         pb.ScramCredential(user=user, mechanism=m)
                                         for m in mechanisms]))
        self._raise_first(resp.results)

    def describe_scram_users(self, users: list[str] | None = None
                             ) -> dict[str, list[tuple[str, int]]]:
        """user -> [(mechanism, iterations)]; a named user without any is left out."""
        resp: pb.DescribeUserScramCredentialsResponse = self._controller_call("DescribeUserScramCredentials",
                                     pb.DescribeUserScramCredentialsRequest(users=users or []))
        for u in resp.users:
            if u.error_code not in (pb.NONE, pb.RESOURCE_NOT_FOUND):
                raise error_for_code(u.error_code, pb.ErrorCode.Name(u.error_code))
        return {u.user: list(zip(u.mechanisms, u.iterations, strict=False))
                for u in resp.users if u.error_code == pb.NONE}

    def create_acls(self, acls: list[Acl]) -> None:
        resp: pb.CreateAclsResponse = self._controller_call("CreateAcls", pb.CreateAclsRequest(
            creations=[a.to_pb() for a in acls]))
        self._raise_first(resp.results)

    def describe_acls(self, acl_filter: pb.AclBinding | None = None) -> list[Acl]:
        resp: pb.DescribeAclsResponse = self._controller_call("DescribeAcls",
                                     pb.DescribeAclsRequest(filter=acl_filter or pb.AclBinding()))
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code, resp.error_message)
        return [Acl.from_pb(b) for b in resp.acls]

    def delete_acls(self, filters: list[pb.AclBinding]) -> list[Acl]:
        """Every ACL the filters matched, now deleted."""
        resp: pb.DeleteAclsResponse = self._controller_call("DeleteAcls", pb.DeleteAclsRequest(filters=filters))
        self._raise_first(resp.results)
        return [Acl.from_pb(b) for r in resp.results for b in r.deleted]

    # ------------------------------------------------------------------ client quotas
    # (controller/quota_records.py; Kafka's AlterClientQuotas / DescribeClientQuotas).
    # An entity part of None is absent, "" is <default>.

    def alter_client_quotas(self, user: str | None, client_id: str | None,
                            set_values: dict[str, float] | None = None,
                            remove_keys: list[str] | None = None,
                            validate_only: bool = False) -> None:
        entity = pb.ClientQuotaEntity()
        if user is not None:
            entity.user = user
        if client_id is not None:
            entity.client_id = client_id
        ops = [pb.ClientQuotaOp(key=k, value=v) for k, v in (set_values or {}).items()]
        ops += [pb.ClientQuotaOp(key=k, remove=True) for k in remove_keys or []]
        resp: pb.AlterClientQuotasResponse = self._controller_call(
            "AlterClientQuotas", pb.AlterClientQuotasRequest(
                alterations=[pb.ClientQuotaAlteration(entity=entity, ops=ops)],
                validate_only=validate_only))
        self._raise_first(resp.results)

    def describe_client_quotas(self, components: list[pb.ClientQuotaFilterComponent]
                               | None = None, strict: bool = False,
                               ) -> list[tuple[str | None, str | None, dict[str, float]]]:
        """(user, client-id, {quota: value}) of every entity the filter matches."""
        resp: pb.DescribeClientQuotasResponse = self._controller_call(
            "DescribeClientQuotas", pb.DescribeClientQuotasRequest(
                components=components or [], strict=strict))
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code, resp.error_message
                                 or pb.ErrorCode.Name(resp.error_code))
        return [(e.entity.user if e.entity.HasField("user") else None,
                 e.entity.client_id if e.entity.HasField("client_id") else None,
                 dict(e.values)) for e in resp.entries]

    @staticmethod
    def _raise_first(results: Iterable[_Result]) -> None:
        for r in results:
            if r.error_code != pb.NONE:
                raise error_for_code(r.error_code, r.error_message or
                                     pb.ErrorCode.Name(r.error_code))

    # ------------------------------------------------------------------ internals

    # The RPC is named, and the generated stubs are untyped: the answer is Any, and callers
    # annotate the response type they expect.
    def _controller_call(self, method: str, request: Message) -> Any:
        timeout_s = self.request_timeout_ms / 1000 + 5

        def call(address: Address) -> Any:
            return rpc_call(getattr(self.metadata.pool.controller(address), method), request,
                            timeout_s=timeout_s, address=address)

        try:
            return self.metadata.any_broker_call(call, retry_on_timeout=method == "DescribeCluster")
        except grpc.RpcError as e:  # pragma: no cover - rpc_call converts these
            raise rpc_error_to_typed(e) from None

    # ------------------------------------------------------------------ configs, leaders

    def alter_configs(self, resource_type: int, name: str, ops: list[ConfigOp], *,
                      validate_only: bool = False) -> None:
        """Kafka's IncrementalAlterConfigs on one resource: a topic (TOPIC_RESOURCE), a
        broker id or "" for every broker (BROKER_RESOURCE); raises its typed error."""
        unknown = [op.operation for op in ops if op.operation not in CONFIG_OPERATIONS]
        if unknown:
            raise ValueError(f"unknown config operations {unknown}: "
                             f"{', '.join(CONFIG_OPERATIONS)}")
        request = pb.AlterConfigsRequest(validate_only=validate_only, incremental=True)
        request.resources.add(resource_type=resource_type, resource_name=name, alterations=[
            pb.ConfigAlteration(name=op.name, operation=CONFIG_OPERATIONS[op.operation],
                                value=op.value, value_null=op.operation == "DELETE")
            for op in ops])
        resp: pb.AlterConfigsResponse = self._controller_call("AlterConfigs", request)
        self.metadata.invalidate()
        self._raise_first(resp.results)

    def describe_dynamic_configs(self, resource_type: int, name: str) -> dict[str, str]:
        """A resource's own configs (kafka-configs.sh --describe): a topic's, or the
        dynamic broker configs of a broker id or of "" (every broker)."""
        cluster = self._controller_call("DescribeCluster", pb.DescribeClusterRequest())
        if cluster.error_code != pb.NONE:
            raise error_for_code(cluster.error_code,
                                 f"DescribeCluster: {pb.ErrorCode.Name(cluster.error_code)}")
        if resource_type == TOPIC_RESOURCE:
            for t in cluster.topics:
                if t.name == name:
                    return dict(sorted(t.configs.items()))
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        if resource_type != BROKER_RESOURCE:
            raise ValueError(f"resource type {resource_type}: topics (2) or brokers (4)")
        for override in cluster.broker_configs:
            if override.resource_name == name:
                return dict(sorted(override.configs.items()))
        return {}

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], TidewaterError | None]:
        """Kafka's ElectLeaders ("preferred" or "unclean") of ``partitions`` (None: every
        partition; those needing no election are then left out); per partition, None or
        the typed error (ElectionNotNeeded among them)."""
        request = pb.ElectLeadersRequest(election_type=ELECTION_TYPES[election_type],
                                         timeout_ms=self.request_timeout_ms,
                                         all_partitions=partitions is None)
        for topic, number in partitions or ():
            request.partitions.add(topic=topic, partition=number)
        resp: pb.ElectLeadersResponse = self._controller_call("ElectLeaders", request)
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code,
                                 f"ElectLeaders: {pb.ErrorCode.Name(resp.error_code)}")
        self.metadata.invalidate()
        return {(r.topic, r.partition): None if r.error_code == pb.NONE else error_for_code(
                    r.error_code, r.error_message or pb.ErrorCode.Name(r.error_code))
                for r in resp.results}

    def alter_partition_reassignments(
            self, targets: dict[tuple[str, int], list[int] | None],
    ) -> dict[tuple[str, int], TidewaterError | None]:
        """Kafka's AlterPartitionReassignments (KIP-455): move each partition to its target
        replicas (None: cancel its ongoing reassignment); per partition, None or the typed
        error (InvalidReplicaAssignmentError, NoReassignmentInProgressError, ...). Returns
        once the controller has started the move; ``list_partition_reassignments`` shows
        it until the new replicas caught up and the old ones are removed."""
        request = pb.AlterPartitionReassignmentsRequest(timeout_ms=self.request_timeout_ms)
        for (topic, number), replicas in targets.items():
            request.partitions.add(topic=topic, partition=number, replicas=replicas or [],
                                   cancel=replicas is None)
        resp: pb.AlterPartitionReassignmentsResponse = self._controller_call(
            "AlterPartitionReassignments", request)
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code, resp.error_message or
                                 f"AlterPartitionReassignments: {pb.ErrorCode.Name(resp.error_code)}")
        self.metadata.invalidate()
        return {(r.topic, r.partition): None if r.error_code == pb.NONE else error_for_code(
                    r.error_code, r.error_message or pb.ErrorCode.Name(r.error_code))
                for r in resp.results}

    def list_partition_reassignments(self, partitions: list[tuple[str, int]] | None = None
                                     ) -> dict[tuple[str, int], PartitionReassignment]:
        """The ongoing reassignments among ``partitions`` (None: all)."""
        request = pb.ListPartitionReassignmentsRequest(all_partitions=partitions is None)
        for topic, number in partitions or ():
            request.partitions.add(topic=topic, partition=number)
        resp: pb.ListPartitionReassignmentsResponse = self._controller_call(
            "ListPartitionReassignments", request)
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code, resp.error_message or
                                 f"ListPartitionReassignments: {pb.ErrorCode.Name(resp.error_code)}")
        return {(r.topic, r.partition): PartitionReassignment(
                    tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas))
                for r in resp.reassignments}

    def describe_metadata_quorum(self) -> pb.DescribeQuorumResponse:
        """Kafka's ``describeMetadataQuorum``: the metadata quorum leader's view, through
        a broker (forwarded to the active controller; DESCRIBE on the cluster)."""
        resp: pb.DescribeQuorumResponse = self._controller_call(
            "DescribeQuorum", pb.DescribeQuorumRequest())
        if resp.error_code != pb.NONE:
            raise error_for_code(resp.error_code,
                                 f"DescribeQuorum: {pb.ErrorCode.Name(resp.error_code)}")
        return resp

    @staticmethod
    def _topic_results(results: Iterable[_TopicResult]) -> dict[str, TidewaterError | None]:
        out: dict[str, TidewaterError | None] = {}
        for r in results:
            if r.error_code == pb.NONE:
                out[r.name] = None
            else:
                out[r.name] = error_for_code(
                    r.error_code, r.error_message or pb.ErrorCode.Name(r.error_code))
        return out

    @staticmethod
    def _raise_failures(results: dict[str, TidewaterError | None]) -> None:
        errors = {name: e for name, e in results.items() if e is not None}
        if len(errors) == 1:
            raise next(iter(errors.values()))
        if errors:
            raise TopicOperationError(errors)

    def close(self) -> None:
        self.metadata.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _partition_description(p: pb.PartitionState) -> PartitionDescription:
    return PartitionDescription(
        partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch, replicas=tuple(p.replicas), isr=tuple(p.isr),
        offline=p.offline or p.leader < 0)


def _replace_replicas_state(p: PartitionDescription, rs: tuple[ReplicaState, ...]) -> PartitionDescription:
    return PartitionDescription(p.partition, p.leader, p.leader_epoch, p.partition_epoch,
                                p.replicas, p.isr, p.offline, rs)


def topic_to_json(t: TopicDescriptionInfo) -> dict[str, object]:
    """The JSON shape of ``tide topics describe --json``."""
    return {
        "name": t.name,
        "topic_id": t.topic_id,
        "configs": dict(sorted(t.configs.items())),
        "partitions": [
            {
                "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch, "replicas": list(p.replicas),
                "isr": list(p.isr), "offline": p.offline,
                "replicas_state": [
                    {"broker": r.broker, "log_end_offset": r.log_end_offset,
                     "high_watermark": r.high_watermark, "log_start_offset": r.log_start_offset}
                    for r in p.replicas_state],
            }
            for p in t.partitions
        ],
    }


def cluster_to_json(c: ClusterDescription) -> dict[str, object]:
    """The JSON shape of ``tide cluster describe --json``."""
    return {
        "cluster_id": c.cluster_id,
        "controller": {"id": c.controller_id, "epoch": c.controller_epoch},
        "brokers": [
            {"id": b.broker_id, "epoch": b.broker_epoch, "addresses": b.listeners,
             "fenced": b.fenced, "in_controlled_shutdown": b.in_controlled_shutdown,
             "rack": b.rack or None}
            for b in c.brokers],
        "topic_count": len(c.topics),
        "partition_count": c.partition_count,
        "offline_partitions": [f"{t}-{p}" for t, p in c.offline_partitions()],
        "under_replicated_partitions": [f"{t}-{p}" for t, p in c.under_replicated_partitions()],
        "unclean_elections_total": c.unclean_elections_total,
    }


__all__ = [
    "AdminClient", "NewTopic", "ClusterDescription", "TopicDescriptionInfo", "PartitionDescription",
    "ReplicaState", "BrokerDescription", "TopicOperationError", "topic_to_json", "cluster_to_json",
    "format_address",
]
