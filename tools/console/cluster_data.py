"""What the console's pages show, gathered from the cluster through Tidewater's clients.

Every page asks the cluster afresh, but one *snapshot* (DescribeCluster from the
controller plus every broker's DescribeReplicas, the two calls ``tide topics
describe`` makes) is shared by the requests of the next ``snapshot_max_age_ms``
(1 s): a browser that opens the overview, the topics list and a topic page in a
row costs the cluster one description, and a broker killed shows as fenced at
most that long after the controller fenced it. The snapshot also holds the
controller quorum as its leader describes it (DescribeQuorum, Kafka key 55,
through a broker: ``tide quorum describe``'s answer), or why it could not be had:
the overview shows leader, epoch, high watermark and each voter's log end and lag.

A snapshot is DescribeCluster, and meanwhile (in a small pool: the page waits for the
slowest call, not for their sum) DescribeQuorum and every broker's DescribeReplicas of
all topics, asked of the brokers up at the last snapshot (again, after DescribeCluster,
if one came up since). The topic page asks DescribeTopicConfigs meanwhile too, and
turns only the shown page of partitions (``paging.PartitionPage``) into rows; the
group page likewise (``group_lag``).

The clients are synchronous; the application calls these methods in worker threads
(Starlette's threadpool). ``AdminClient`` is safe to share between threads; the
group admin's consumer is not, so its calls go one at a time under a lock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewater.client.admin import (
    AdminClient,
    BrokerDescription,
    ClusterDescription,
    DescribedConfig,
    PartitionDescription,
    ReplicaState,
    TopicDescriptionInfo,
    TransactionDescription,
)
from tidewater.client.group_admin import GroupAdmin
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError
from tidewater.proto.topic_config import TOPIC_CONFIGS, LogConfig
from tidewater.tools.console.group_lag import GroupPage, group_page
from tidewater.tools.console.paging import PARTITIONS_PER_PAGE, PartitionPage

log = logging.getLogger(__name__)
SNAPSHOT_MAX_AGE_MS = 1000
REQUEST_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as described at ``taken_unix_ms``."""

    cluster: ClusterDescription
    replicas: dict[tuple[str, int, int], ReplicaState]  # (topic, partition, broker)
    answered: frozenset[int]  # brokers whose DescribeReplicas answered
    taken_unix_ms: int
    quorum: Quorum | None = None  # None: DescribeQuorum failed (``quorum_error`` says why)
    quorum_error: str = ""

    def replica(self, topic: str, partition: int, broker: int) -> ReplicaState:
        return self.replicas.get((topic, partition, broker), ReplicaState(broker=broker))

    def leader_state(self, topic: str, p: PartitionDescription) -> ReplicaState | None:
        if p.leader < 0:
            return None
        state = self.replicas.get((topic, p.partition, p.leader))
        return state if state is not None and state.high_watermark >= 0 else None


@dataclass(frozen=True, slots=True)
class QuorumReplicaRow:
    """One controller as the quorum leader sees it (``tide quorum describe --replication``)."""

    node_id: int
    directory_id: str
    role: str  # "leader", "follower" (a voter), "observer"
    log_end_offset: int
    lag: int  # the leader's log end minus this one's
    last_fetch_age_ms: int  # -1: never fetched (the leader itself: -1 or 0)


@dataclass(frozen=True, slots=True)
class Quorum:
    """The metadata quorum: its leader, epoch, high watermark and every replica."""

    leader_id: int
    epoch: int
    high_watermark: int
    replicas: tuple[QuorumReplicaRow, ...]  # the leader first, then voters, then observers

    @property
    def voter_count(self) -> int:
        return sum(r.role != "observer" for r in self.replicas)

    @staticmethod
    def of(d: pb.DescribeQuorumResponse) -> Quorum:
        def role(r: pb.QuorumReplicaState) -> str:
            if r.replica.id == d.leader_id:
                return "leader"
            return "follower" if r.is_voter else "observer"

        order = {"leader": 0, "follower": 1, "observer": 2}
        rows = sorted((QuorumReplicaRow(r.replica.id, r.replica.directory_id, role(r),
                                        r.log_end_offset, r.lag, r.last_fetch_age_ms)
                       for r in d.replicas), key=lambda row: (order[row.role], row.node_id))
        return Quorum(d.leader_id, d.epoch, d.high_watermark, tuple(rows))


@dataclass(frozen=True, slots=True)
class BrokerRow:
    broker_id: int
    address: str
    fenced: bool
    in_controlled_shutdown: bool
    partitions_led: int
    replicas: int
    disk_bytes: int | None  # None: the broker did not answer DescribeReplicas
    rack: str = ""  # broker.rack; "" for none

    @property
    def status(self) -> str:
        if self.fenced:
            return "down (fenced)"
        if self.in_controlled_shutdown:
            return "shutting down"
        return "alive"


@dataclass(frozen=True, slots=True)
class PartitionRef:
    topic: str
    partition: int
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicProblem:
    """A topic's under-replicated (or offline) partitions, as the overview lists them."""

    topic: str
    partitions: tuple[int, ...]
    partition_count: int
    missing_brokers: tuple[int, ...]  # replicas not in the ISR, over those partitions


def by_topic(refs: list[PartitionRef], counts: dict[str, int]) -> tuple[TopicProblem, ...]:
    """Grouped per topic; the cluster's own topics (``__consumer_offsets``) last."""
    grouped: dict[str, list[PartitionRef]] = {}
    for ref in refs:
        grouped.setdefault(ref.topic, []).append(ref)
    return tuple(
        TopicProblem(topic, tuple(r.partition for r in group), counts.get(topic, 0),
                     tuple(sorted({b for r in group for b in r.replicas if b not in r.isr})))
        for topic, group in sorted(grouped.items(), key=lambda kv: (kv[0].startswith("__"),
                                                                    kv[0])))


@dataclass(frozen=True, slots=True)
class AuditSummary:
    passed: bool
    failing: tuple[str, ...]
    rules: int
    report_html: Path | None
    modified_unix_ms: int


@dataclass(frozen=True, slots=True)
class Overview:
    cluster_id: str
    controller_id: int
    controller_epoch: int
    brokers: tuple[BrokerRow, ...]
    topic_count: int
    partition_count: int
    under_replicated: tuple[PartitionRef, ...]
    offline: tuple[PartitionRef, ...]
    unclean_elections_total: int
    audit: AuditSummary | None
    taken_unix_ms: int
    under_replicated_by_topic: tuple[TopicProblem, ...] = ()
    offline_by_topic: tuple[TopicProblem, ...] = ()
    quorum: Quorum | None = None
    quorum_error: str = ""


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    partitions: int
    replication_factor: int
    size_bytes: int | None  # the leaders' replicas; None when no leader answered
    records: int | None  # high watermark - log start, summed over partitions (leaders)
    under_replicated: int
    offline: int


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    broker: int
    is_leader: bool
    in_isr: bool
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PartitionRow:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: bool
    under_replicated: bool
    log_start_offset: int  # the leader's; -1 unknown
    high_watermark: int
    log_end_offset: int
    replica_rows: tuple[ReplicaRow, ...]
    # The leader's: below the high watermark while a transaction is open on it; -1 unknown.
    last_stable_offset: int = -1


@dataclass(frozen=True, slots=True)
class TransactionsPage:
    transactions: tuple[TransactionDescription, ...]
    now_ms: int  # wall clock: a transaction open longer than its timeout is hanging
    error: str  # "" when every broker answered or some listed

    @property
    def open_count(self) -> int:
        return sum(1 for t in self.transactions if t.open)

    @property
    def hanging_count(self) -> int:
        return sum(1 for t in self.transactions if t.hanging(self.now_ms))


@dataclass(frozen=True, slots=True)
class QuotaRow:
    user: str  # "<default>": every user's default; "" when the entity has no user part
    client_id: str  # likewise
    values: dict[str, float]  # producer_byte_rate, consumer_byte_rate, request_percentage


@dataclass(frozen=True, slots=True)
class QuotasPage:
    rows: tuple[QuotaRow, ...]
    keys: tuple[str, ...]  # every quota key some row sets: the table's columns
    error: str


def _entity_label(name: str | None) -> str:
    """A client quota entity's part as ``tide quotas`` prints it."""
    return "" if name is None else "<default>" if name == "" else name


@dataclass(frozen=True, slots=True)
class ConfigRow:
    name: str
    value: str
    # Where the value comes from, as the brokers' DescribeConfigs says (client.admin's
    # CONFIG_SOURCE_NAMES): "topic", "dynamic broker", "dynamic default", "static broker",
    # "default"; "default?" when no broker described it (Kafka's default, shown here).
    source: str


@dataclass(frozen=True, slots=True)
class TopicDetail:
    name: str
    topic_id: str
    partitions: tuple[PartitionRow, ...]  # the shown page's (``shown``)
    configs: tuple[ConfigRow, ...]
    taken_unix_ms: int
    shown: PartitionPage = PartitionPage(0, 1, 0)
    partition_ids: tuple[int, ...] = ()  # every partition of the topic
    # The whole topic's, not only the shown page's: (partition, page index).
    under_replicated: tuple[tuple[int, int], ...] = ()
    offline: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class GroupRow:
    group_id: str
    state: str
    protocol_type: str


class UnknownTopic(LookupError):
    pass


class ClusterData:
    """The console's one door to the cluster."""

    def __init__(self, bootstrap: str, security: Mapping[str, Any] | None = None, *,
                 snapshot_max_age_ms: int = SNAPSHOT_MAX_AGE_MS,
                 audit_dir: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.security: dict[str, Any] = dict(security or {})
        self.snapshot_max_age_ms = snapshot_max_age_ms
        self.audit_dir = audit_dir
        self.admin = AdminClient(bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, **self.security)
        self._group_admin: GroupAdmin | None = None
        self._group_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        # Calls that need nothing from DescribeCluster's answer (DescribeQuorum, DescribeReplicas,
        # DescribeTopicConfigs)
        # run here meanwhile, so a page waits for the slowest call, not for their sum.
        self._beside = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-beside")
        self._up_brokers: frozenset[int] | None = None  # unfenced at the last snapshot

    def close(self) -> None:
        self._beside.shutdown(wait=False, cancel_futures=True)
        self.admin.close()
        with self._group_lock:
            if self._group_admin is not None:
                self._group_admin.close()
                self._group_admin = None

    # ------------------------------------------------------------------ snapshot

    def snapshot(self, *, fresh: bool = False) -> Snapshot:
        """The shared description, at most ``snapshot_max_age_ms`` old (``fresh``: new)."""
        with self._snapshot_lock:
            now_ms = int(time.time() * 1000)
            current = self._snapshot
            if (not fresh and current is not None
                    and now_ms - current.taken_unix_ms < self.snapshot_max_age_ms):
                return current
            asked_quorum = self._beside.submit(self._quorum)
            # Every topic's replicas (an empty list: all), asked of the brokers up at the
            # last snapshot while DescribeCluster runs; again if a broker came up since.
            known_up = self._up_brokers
            asked_replicas = (self._beside.submit(self.admin.describe_replicas, [], known_up)
                              if known_up is not None else None)
            cluster = self.admin.describe_cluster()
            up = frozenset(b.broker_id for b in cluster.brokers if not b.fenced)
            if asked_replicas is None or known_up is None or not up <= known_up:
                if asked_replicas is not None:
                    asked_replicas.cancel()
                replicas = self.admin.describe_replicas([], up)
            else:
                replicas = asked_replicas.result()
            self._up_brokers = up
            answered = frozenset(b for (_t, _p, b) in replicas)
            quorum, quorum_error = asked_quorum.result()
            self._snapshot = Snapshot(cluster, replicas, answered, now_ms, quorum, quorum_error)
            return self._snapshot

    def _quorum(self) -> tuple[Quorum | None, str]:
        """The quorum leader's DescribeQuorum (a failover under way: no leader to answer,
        which the overview says instead of failing the page)."""
        try:
            return Quorum.of(self.admin.describe_metadata_quorum()), ""
        except TidewaterError as e:
            return None, f"{type(e).__name__}: {e}"

    def invalidate(self) -> None:
        with self._snapshot_lock:
            self._snapshot = None

    # ------------------------------------------------------------------ pages

    def overview(self) -> Overview:
        snap = self.snapshot()
        c = snap.cluster
        led: dict[int, int] = {}
        hosted: dict[int, int] = {}
        disk: dict[int, int] = {}
        for t in c.topics:
            for p in t.partitions:
                if p.leader >= 0:
                    led[p.leader] = led.get(p.leader, 0) + 1
                for b in p.replicas:
                    hosted[b] = hosted.get(b, 0) + 1
        for (_t, _p, b), r in snap.replicas.items():
            if r.size_bytes >= 0:
                disk[b] = disk.get(b, 0) + r.size_bytes
        brokers = tuple(
            BrokerRow(b.broker_id, _address(b), b.fenced, b.in_controlled_shutdown,
                      led.get(b.broker_id, 0), hosted.get(b.broker_id, 0),
                      disk.get(b.broker_id, 0) if b.broker_id in snap.answered else None,
                      b.rack)
            for b in c.brokers)
        under, offline = [], []
        for t in c.topics:
            for p in t.partitions:
                ref = PartitionRef(t.name, p.partition, p.leader, p.isr, p.replicas)
                if p.offline or p.leader < 0:
                    offline.append(ref)
                elif p.under_replicated:
                    under.append(ref)
        counts = {t.name: len(t.partitions) for t in c.topics}
        return Overview(c.cluster_id, c.controller_id, c.controller_epoch, brokers,
                        len(c.topics), c.partition_count, tuple(under), tuple(offline),
                        c.unclean_elections_total, self.audit(), snap.taken_unix_ms,
                        by_topic(under, counts), by_topic(offline, counts),
                        snap.quorum, snap.quorum_error)

    def topics(self) -> list[TopicRow]:
        snap = self.snapshot()
        rows = []
        for t in snap.cluster.topics:
            size = records = 0
            known = False
            for p in t.partitions:
                state = snap.leader_state(t.name, p)
                if state is None:
                    continue
                known = True
                size += max(0, state.size_bytes)
                records += max(0, state.high_watermark - max(0, state.log_start_offset))
            rows.append(TopicRow(
                t.name, len(t.partitions),
                len(t.partitions[0].replicas) if t.partitions else 0,
                size if known else None, records if known else None,
                sum(1 for p in t.partitions if p.under_replicated and not p.offline),
                sum(1 for p in t.partitions if p.offline or p.leader < 0)))
        return rows

    def topic(self, name: str, page: int | None = None, per_page: int | None = None,
              showing: int | None = None) -> TopicDetail:
        """The topic with one page of its partitions described row by row (``page``,
        0-based; without it the page holding partition ``showing``, else the first)."""
        asked_configs = self._beside.submit(self.admin.describe_topic_configs, name)
        snap = self.snapshot()
        found = [t for t in snap.cluster.topics if t.name == name]
        if not found:
            asked_configs.cancel()
            raise UnknownTopic(name)
        t = found[0]
        ids = tuple(p.partition for p in t.partitions)
        position = ids.index(showing) if showing in ids else None
        shown = PartitionPage.of(len(ids), page, per_page or PARTITIONS_PER_PAGE, position)
        return TopicDetail(
            t.name, t.topic_id,
            tuple(self._partition_row(snap, t, p) for p in t.partitions[shown.first:shown.stop]),
            self._config_rows(t, asked_configs), snap.taken_unix_ms, shown, ids,
            tuple((p.partition, shown.index_of(i)) for i, p in enumerate(t.partitions)
                  if p.under_replicated and not (p.offline or p.leader < 0)),
            tuple((p.partition, shown.index_of(i)) for i, p in enumerate(t.partitions)
                  if p.offline or p.leader < 0))

    def _config_rows(self, t: TopicDescriptionInfo, asked: Future[list[DescribedConfig]]
                     ) -> tuple[ConfigRow, ...]:
        """The topic's configs as a broker applies them (DescribeTopicConfigs: a broker's
        ``--set`` or a dynamic default shows with its source); the controller's view of
        what the topic sets when no broker answers."""
        try:
            described = asked.result()
        except TidewaterError as e:
            log.info("DescribeTopicConfigs of %s failed (%s): the configs the topic sets "
                     "and Kafka's defaults are shown", t.name, e)
            return config_rows(t.configs)
        return tuple(ConfigRow(c.name, c.value, c.source) for c in described)

    @staticmethod
    def _partition_row(snap: Snapshot, t: TopicDescriptionInfo,
                       p: PartitionDescription) -> PartitionRow:
        rows = tuple(
            ReplicaRow(b, b == p.leader, b in p.isr, r.log_start_offset, r.high_watermark,
                       r.log_end_offset, r.size_bytes)
            for b in p.replicas for r in [snap.replica(t.name, p.partition, b)])
        leader = snap.leader_state(t.name, p)
        return PartitionRow(
            p.partition, p.leader, p.leader_epoch, p.replicas, p.isr, p.offline or p.leader < 0,
            p.under_replicated,
            leader.log_start_offset if leader else -1, leader.high_watermark if leader else -1,
            leader.log_end_offset if leader else -1, rows,
            leader.last_stable_offset if leader else -1)

    # ------------------------------------------------------------------ transactions

    def transactions(self) -> TransactionsPage:
        """Every transactional id its coordinator lists, open ones first."""
        now_ms = int(time.time() * 1000)
        try:
            listed = self.admin.list_transactions()
        except TidewaterError as e:
            return TransactionsPage((), now_ms, str(e))
        ordered = sorted(listed, key=lambda t: (not t.open, t.transactional_id))
        return TransactionsPage(tuple(ordered), now_ms, "")

    # ------------------------------------------------------------------ quotas

    def quotas(self) -> QuotasPage:
        """Every client quota the controller holds (DescribeClientQuotas, no filter)."""
        try:
            entries = self.admin.describe_client_quotas()
        except TidewaterError as e:
            return QuotasPage((), (), str(e))
        rows = tuple(sorted(
            (QuotaRow(_entity_label(user), _entity_label(client_id), values)
             for user, client_id, values in entries),
            key=lambda r: (r.user, r.client_id)))
        keys = tuple(sorted({k for r in rows for k in r.values}))
        return QuotasPage(rows, keys, "")

    # ------------------------------------------------------------------ groups

    def _groups(self) -> GroupAdmin:
        if self._group_admin is None:
            self._group_admin = GroupAdmin(self.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                           **self.security)
        return self._group_admin

    def groups(self) -> list[GroupRow]:
        with self._group_lock:
            listing = self._groups().list_groups()
        return [GroupRow(g.group_id, g.state, g.protocol_type) for g in listing]

    def group(self, group_id: str, page: int | None = None,
              per_page: int | None = None, member_page: int | None = None,
              members_per_page: int | None = None) -> GroupPage:
        """The group, with one page of its partitions' lag (``page``, 0-based; the
        first without one) and its totals over all of them, and one page of its
        members (``member_page``)."""
        with self._group_lock:
            d = self._groups().describe_group(group_id)
        return group_page(d, page, per_page, member_page, members_per_page)

    def reset_offsets(self, group_id: str, topic: str, to: str,
                      offset: int | None = None) -> dict[int, int]:
        with self._group_lock:
            return self._groups().reset_offsets(group_id, topic, to=to, offset=offset)

    # ------------------------------------------------------------------ admin

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     configs: dict[str, str]) -> None:
        self.admin.create_topic(name, partitions, replication_factor, configs)
        self.invalidate()

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topic(name)
        self.invalidate()

    # ------------------------------------------------------------------ audit

    def audit(self) -> AuditSummary | None:
        """The latest ``tide audit`` report in ``audit_dir`` (its report.json), if any."""
        if self.audit_dir is None:
            return None
        path = self.audit_dir / "report.json"
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            modified_ms = int(path.stat().st_mtime * 1000)
        except (OSError, ValueError):
            return None
        rules = report.get("rules") or []
        failing = tuple(str(r.get("name")) for r in rules
                        if not r.get("passed") and not r.get("skipped"))
        html = self.audit_dir / "report.html"
        return AuditSummary(bool(report.get("passed")), failing, len(rules),
                            html if html.is_file() else None, modified_ms)


def config_rows(configs: dict[str, str]) -> tuple[ConfigRow, ...]:
    """Every topic config: set on the topic, or Kafka's default ("default?": a broker's
    ``--set`` may change the default it applies, and no broker was asked)."""
    defaults = LogConfig()
    rows = []
    for name, definition in sorted(TOPIC_CONFIGS.items()):
        if name in configs:
            rows.append(ConfigRow(name, configs[name], "topic"))
            continue
        if definition.log_field is None and definition.default is not None:
            shown = definition.default  # Kafka's, a config without effect here
        elif definition.log_field is None:  # a replication setting: the cluster's default
            shown = "(broker setting)"
        else:
            value = getattr(defaults, definition.log_field)
            shown = "(not set)" if value is None else str(value)
        rows.append(ConfigRow(name, shown, "default?"))
    for name in sorted(set(configs) - set(TOPIC_CONFIGS)):
        rows.append(ConfigRow(name, configs[name], "topic"))
    return tuple(rows)


def _address(b: BrokerDescription) -> str:
    for name in ("EXTERNAL", "PLAINTEXT", "INTERNAL"):
        if name in b.listeners:
            return b.listeners[name]
    return next(iter(b.listeners.values()), "")
