"""The classic consumer-group protocol as a pure state machine (Kafka's GroupCoordinator
and GroupMetadata): requests and ticks in, a ``Ready`` out. No sockets, no log, no clock.

Theory of operation
-------------------
``GroupCoordinatorState`` holds every group of one ``__consumer_offsets`` partition.
Each call takes ``now_ms`` and an opaque ``token`` (the shell's handle on the request
being answered) and returns a ``Ready``:

* ``replies``: ``(token, Answer)`` pairs the shell sends now;
* ``writes``: ``Write``s the shell must append to the partition (acks=all) and then
  report with ``on_write_done(write_id, error_code, now_ms)``, whose Ready carries the
  answers that waited for it. Nothing a write carries changes the in-memory state
  before it is durable (offset commits, a leader's assignments, a deleted group).

A group moves through Kafka's states::

    EMPTY --join--> PREPARING_REBALANCE --all joined / deadline--> COMPLETING_REBALANCE
      ^                 ^    |                                           |
      |   last member   |    +-- no member left --> EMPTY                | leader's
      +-----leaves------+--- join / leave / session expiry <-- STABLE <--+ SyncGroup
                                                                            written
    EMPTY --DeleteGroups (written)--> DEAD

Rules (Kafka's): a first JoinGroup without a member id (v4+) gets MEMBER_ID_REQUIRED and
a fresh id, held as *pending* for one session timeout (KIP-394). A rebalance completes
when every member has rejoined and no pending member is left, or at the rebalance
deadline (the largest rebalance timeout), when members that did not rejoin are removed.
A rebalance of an empty group waits ``initial_rebalance_delay_ms`` (extended by each new
member, bounded by the rebalance timeout) so a starting group settles in one generation.
The leader's SyncGroup is written as the group's metadata before anyone gets an
assignment. Heartbeats keep a member; one silent for its session timeout is removed
(members awaiting a join or sync answer are kept alive by that wait). OffsetCommit
checks the generation (a generation < 0 commit is for an empty group only: a
standalone consumer or an admin reset).

Static membership (KIP-345): a member with a ``group.instance.id`` joins without
MEMBER_ID_REQUIRED. When the same instance joins again without its member id (a
restart), it gets a new member id that replaces the old one, whose later requests are
answered FENCED_INSTANCE_ID; in a stable group with unchanged protocols that is no
rebalance (the group's metadata with the new id is written, then the join is answered
with the current generation and assignment stays). The session timeout still removes a
static member; LeaveGroup may name it by instance id.

Offset expiry (Kafka since 2.1, KIP-211): every ``offsets_retention_check_interval_ms``
the committed offsets of EMPTY groups older than ``offsets_retention_ms`` are
deleted (tombstones written first): a consumer group's all at once, counted from when
it became empty; a standalone committer's (no protocol type) each by its commit time.
A group left with neither members nor offsets is deleted with them.

OffsetDelete (Kafka's handleDeleteOffsets, KIP-496): an EMPTY group's committed offsets
of the named partitions are deleted (tombstones written first); a consumer group with
members keeps those of topics it subscribes to (GROUP_SUBSCRIBED_TO_TOPIC; topics read
from the members' ConsumerProtocol subscriptions of the chosen protocol; unreadable or
no protocol chosen yet: every topic counts as subscribed) and loses the others; another
kind of group with members is NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND. An
EMPTY group left without offsets is deleted with them, as offset expiry does.
"""

from __future__ import annotations

import enum
import itertools
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tidewater.broker.group import records
from tidewater.proto import tidewater_pb2 as pb

NO_GENERATION = -1


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class GroupSettings:
    """The broker's group.* settings (Kafka's names and defaults)."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 1 << 31  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata) in the member's preference order
    assignment: bytes = b""
    last_heartbeat_ms: int = 0
    join_token: Any = None  # a JoinGroup waiting for the rebalance to complete
    sync_token: Any = None  # a SyncGroup waiting for the leader's assignment
    is_new: bool = True

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def is_alive(self, now_ms: int) -> bool:
        if self.join_token is not None or self.sync_token is not None:
            return True
        return now_ms < self.last_heartbeat_ms + self.session_timeout_ms


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> expiry ms
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    state_timestamp_ms: int = -1
    join_deadline_ms: int = 0  # PREPARING_REBALANCE: complete by then
    delay_deadline_ms: int | None = None  # an initial rebalance's delay, extended per join
    delay_limit_ms: int = 0

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        """A request naming an instance id another member id now holds."""
        return (group_instance_id is not None and group_instance_id in self.static_members
                and self.static_members[group_instance_id] != member_id)

    def all_joined(self) -> bool:
        return (not self.pending_members
                and all(m.join_token is not None for m in self.members.values()))

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def select_protocol(self) -> str:
        """Kafka's vote: among the protocols every member supports, each member votes for
        its most preferred one; the most votes win (the first candidate on a tie)."""
        members = list(self.members.values())
        candidates = [name for name, _ in members[0].protocols
                      if all(any(n == name for n, _ in m.protocols) for m in members)]
        votes = {name: 0 for name in candidates}
        for m in members:
            votes[next(n for n, _ in m.protocols if n in votes)] += 1
        return max(candidates, key=lambda name: votes[name])

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not protocols:
            return False
        if not self.members:
            return True
        names = {n for n, _ in protocols}
        return self.protocol_type == protocol_type and all(
            names & {n for n, _ in m.protocols} for m in self.members.values())


# ---------------------------------------------------------------- answers

@dataclass(frozen=True)
class JoinAnswer:
    error_code: pb.ErrorCode
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # leader: (id, instance, metadata)


@dataclass(frozen=True)
class SyncAnswer:
    error_code: pb.ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class CodeAnswer:
    """Heartbeat, DeleteGroups (per group), LeaveGroup (per member)."""

    error_code: pb.ErrorCode


@dataclass(frozen=True)
class CommitAnswer:
    errors: dict[tuple[str, int], pb.ErrorCode]  # (topic, partition) -> error code


@dataclass(frozen=True)
class OffsetDeleteAnswer:
    error_code: pb.ErrorCode  # the group's; NONE then one per partition in ``errors``
    errors: dict[tuple[str, int], pb.ErrorCode]


Answer = JoinAnswer | SyncAnswer | CodeAnswer | CommitAnswer | OffsetDeleteAnswer


@dataclass(frozen=True)
class Write:
    """Records to append to the group's partition before the answers they carry."""

    write_id: int
    records: tuple[records.GroupRecord, ...]
    # (producer id, epoch) of a TxnOffsetCommit: the shell writes a transactional batch,
    # whose offsets count only once the transaction's COMMIT marker follows it.
    producer: tuple[int, int] | None = None


@dataclass
class Ready:
    replies: list[tuple[Any, Answer]] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)

    def extend(self, other: Ready) -> Ready:
        self.replies += other.replies
        self.writes += other.writes
        return self


@dataclass
class _PendingWrite:
    group_id: str
    # error code -> the Ready that follows (applied to the state by the callback).
    on_done: Callable[[pb.ErrorCode, int], Ready]


def _group_metadata_record(group: Group, now_ms: int) -> records.GroupRecord:
    return records.GroupMetadataRecord(
        group.group_id, records.GroupMetadataValue(
            protocol_type=group.protocol_type or "", generation=group.generation,
            protocol=group.protocol_name, leader=group.leader_id,
            current_state_timestamp_ms=now_ms,
            members=tuple(records.MemberMetadata(
                member_id=m.member_id, group_instance_id=m.group_instance_id,
                client_id=m.client_id, client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.metadata(group.protocol_name or ""),
                assignment=m.assignment) for m in group.members.values())))


# Errors a failed append answers with, as Kafka maps them for the group's clients:
# each tells the client to find the coordinator again (or to retry).
def coordinator_error_for_write(code: pb.ErrorCode) -> pb.ErrorCode:
    if code in (pb.UNKNOWN_TOPIC_OR_PARTITION, pb.NOT_ENOUGH_REPLICAS,
                pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND, pb.REQUEST_TIMED_OUT):
        return pb.COORDINATOR_NOT_AVAILABLE
    if code in (pb.NOT_LEADER_OR_FOLLOWER, pb.KAFKA_STORAGE_ERROR, pb.FENCED_LEADER_EPOCH):
        return pb.NOT_COORDINATOR
    if code in (pb.MESSAGE_TOO_LARGE, pb.RECORD_LIST_TOO_LARGE, pb.INVALID_FETCH_SIZE):
        return pb.UNKNOWN_SERVER_ERROR
    return code


CONSUMER_PROTOCOL_TYPE = "consumer"
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")


def subscribed_topics(group: Group) -> set[str] | None:
    """The topics the members' ConsumerProtocol subscriptions name (Kafka's
    ``GroupMetadata.computeSubscribedTopics``); None when not known: not a consumer
    group, no protocol chosen yet, or a subscription that does not parse."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE or group.protocol_name is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        parsed = _subscription_topics(member.metadata(group.protocol_name))
        if parsed is None:
            return None
        topics.update(parsed)
    return topics


def _subscription_topics(data: bytes) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (any version: version int16, then
    the topics as an int32 count of int16-length strings), None if it does not parse."""
    try:
        (count,) = _INT32.unpack_from(data, 2)
        position, topics = 6, []
        if count < 0:
            return None
        for _ in range(count):
            (length,) = _INT16.unpack_from(data, position)
            position += 2
            if length < 0 or position + length > len(data):
                return None
            topics.append(data[position:position + length].decode())
            position += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


class GroupCoordinatorState:
    """Every group of one ``__consumer_offsets`` partition; see the module docstring."""

    def __init__(self, settings: GroupSettings | None = None,
                 new_member_id: Callable[[str], str] | None = None):
        self.settings = settings or GroupSettings()
        self.groups: dict[str, Group] = {}
        self._write_ids = itertools.count(1)
        self._pending_writes: dict[int, _PendingWrite] = {}
        self._next_expiry_check_ms: int | None = None
        self._expiring: set[str] = set()  # groups with an expiry write in flight
        # TxnOffsetCommit's offsets, durable but held until the transaction's marker:
        # producer id -> (group, (topic, partition)) -> offset (Kafka's
        # pendingTransactionalOffsetCommits).
        self.pending_txn_offsets: dict[int, dict[tuple[str, tuple[str, int]],
                                                 CommittedOffset]] = {}
        self._new_member_id = new_member_id or (lambda client_id: f"{client_id}-{uuid.uuid4()}")

    # ------------------------------------------------------------ loading

    def replay(self, record: records.GroupRecord, now_ms: int) -> None:
        """Apply one record read back from the partition (the same meaning as when written)."""
        if isinstance(record, records.OffsetCommitRecord):
            group = self.groups.setdefault(record.group_id, Group(record.group_id))
            tp = (record.topic, record.partition)
            if record.value is None:
                group.offsets.pop(tp, None)
            else:
                v = record.value
                group.offsets[tp] = CommittedOffset(v.offset, v.leader_epoch, v.metadata,
                                                    v.commit_timestamp_ms)
        elif isinstance(record, records.GroupMetadataRecord):
            if record.value is None:
                self.groups.pop(record.group_id, None)
                return
            meta = record.value
            group = self.groups.setdefault(record.group_id, Group(record.group_id))
            group.generation = meta.generation
            group.protocol_type = meta.protocol_type or None
            group.protocol_name = meta.protocol
            group.leader_id = meta.leader
            group.members = {m.member_id: Member(
                member_id=m.member_id, group_instance_id=m.group_instance_id,
                client_id=m.client_id, client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms, protocol_type=meta.protocol_type,
                protocols=[(meta.protocol or "", m.subscription)], assignment=m.assignment,
                last_heartbeat_ms=now_ms, is_new=False) for m in meta.members}
            group.static_members = {m.group_instance_id: m.member_id for m in meta.members
                                    if m.group_instance_id is not None}
            group.transition(GroupState.STABLE if group.members else GroupState.EMPTY, now_ms)
            if meta.current_state_timestamp_ms >= 0:
                group.state_timestamp_ms = meta.current_state_timestamp_ms  # for offset expiry

    def end_load(self, now_ms: int) -> None:
        """Loaded members' session timers start now (they heartbeat the new coordinator)."""
        for group in self.groups.values():
            for m in group.members.values():
                m.last_heartbeat_ms = now_ms

    # ------------------------------------------------------------ JoinGroup

    def join_group(self, token: Any, now_ms: int, *, group_id: str, member_id: str,
                   group_instance_id: str | None, client_id: str, client_host: str,
                   protocol_type: str, protocols: list[tuple[str, bytes]],
                   session_timeout_ms: int, rebalance_timeout_ms: int,
                   require_known_member_id: bool) -> Ready:
        s = self.settings
        if not group_id:
            return self._join_error(token, pb.INVALID_GROUP_ID, member_id)
        if rebalance_timeout_ms <= 0:  # JoinGroup v0 has none; a forged one is no deadline
            rebalance_timeout_ms = session_timeout_ms
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            return self._join_error(token, pb.INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return self._join_error(token, pb.UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        if group.state == GroupState.DEAD:
            # Deleted meanwhile: the client finds the coordinator again.
            return self._join_error(token, pb.COORDINATOR_NOT_AVAILABLE, member_id)
        if not group.supports(protocol_type, protocols):
            return self._join_error(token, pb.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if not member_id and group_instance_id is not None \
                and group_instance_id in group.static_members:
            return self._replace_static_member(
                group, token, now_ms, group_instance_id, self._new_member_id(client_id),
                protocols, session_timeout_ms, rebalance_timeout_ms)
        if member_id and group.fenced(member_id, group_instance_id):
            return self._join_error(token, pb.FENCED_INSTANCE_ID, member_id)
        if not member_id:
            if len(group.members) + len(group.pending_members) >= s.max_size:
                return self._join_error(token, pb.GROUP_MAX_SIZE_REACHED, member_id)
            new_id = self._new_member_id(client_id)
            if require_known_member_id and group_instance_id is None:
                group.pending_members[new_id] = now_ms + session_timeout_ms
                return self._join_error(token, pb.MEMBER_ID_REQUIRED, new_id)
            return self._add_member(group, token, now_ms, new_id, group_instance_id, client_id,
                                    client_host, protocol_type, protocols, session_timeout_ms,
                                    rebalance_timeout_ms)
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            return self._add_member(group, token, now_ms, member_id, group_instance_id,
                                    client_id, client_host, protocol_type, protocols,
                                    session_timeout_ms, rebalance_timeout_ms)
        member = group.members.get(member_id)
        if member is None:
            return self._join_error(token, pb.UNKNOWN_MEMBER_ID, member_id)
        ready = Ready()
        if member.join_token is not None:  # a retried join replaces the one waiting
            ready.replies.append((member.join_token, JoinAnswer(pb.UNKNOWN_MEMBER_ID,
                                                                member_id=member_id)))
            member.join_token = None
        unchanged = member.protocols == protocols
        member.last_heartbeat_ms = now_ms
        if group.state == GroupState.PREPARING_REBALANCE:
            self._update_member(member, token, protocols, session_timeout_ms,
                                rebalance_timeout_ms)
            return ready.extend(self._maybe_complete_join(group, now_ms))
        if group.state == GroupState.COMPLETING_REBALANCE and unchanged:
            ready.replies.append((token, self._join_answer(group, member_id)))
            return ready
        if group.state == GroupState.STABLE and unchanged and member_id != group.leader_id:
            ready.replies.append((token, self._join_answer(group, member_id)))
            return ready
        self._update_member(member, token, protocols, session_timeout_ms, rebalance_timeout_ms)
        return ready.extend(self._prepare_rebalance(group, now_ms))

    def _replace_static_member(self, group: Group, token: Any, now_ms: int, instance: str,
                               new_id: str, protocols: list[tuple[str, bytes]],
                               session_timeout_ms: int, rebalance_timeout_ms: int) -> Ready:
        """A known instance joins again without its member id: ``new_id`` replaces the
        old one, which is fenced from now on."""
        old_id = group.static_members[instance]
        member = group.members.pop(old_id)
        ready = Ready()
        if member.join_token is not None:
            ready.replies.append((member.join_token, JoinAnswer(pb.FENCED_INSTANCE_ID,
                                                                member_id=old_id)))
            member.join_token = None
        if member.sync_token is not None:
            ready.replies.append((member.sync_token, SyncAnswer(pb.FENCED_INSTANCE_ID)))
            member.sync_token = None
        unchanged = member.protocols == protocols
        member.member_id = new_id
        member.last_heartbeat_ms = now_ms
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        group.members[new_id] = member
        group.static_members[instance] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if group.state == GroupState.STABLE and unchanged:
            # No rebalance: the group's metadata names the new id before the join is
            # answered with the current generation (the member keeps its assignment).
            def written(code: pb.ErrorCode, done_ms: int) -> Ready:
                if code == pb.NONE:
                    return Ready(replies=[(token, self._join_answer(group, new_id))])
                return Ready(replies=[(token, JoinAnswer(coordinator_error_for_write(code),
                                                         member_id=new_id))])
            ready.writes.append(self._write(group, (_group_metadata_record(group, now_ms),),
                                            written))
            return ready
        self._update_member(member, token, protocols, session_timeout_ms, rebalance_timeout_ms)
        return ready.extend(self._prepare_rebalance(group, now_ms))

    def _join_error(self, token: Any, code: pb.ErrorCode, member_id: str) -> Ready:
        return Ready(replies=[(token, JoinAnswer(code, member_id=member_id))])

    @staticmethod
    def _update_member(member: Member, token: Any, protocols: list[tuple[str, bytes]],
                       session_timeout_ms: int, rebalance_timeout_ms: int) -> None:
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.join_token = token

    def _add_member(self, group: Group, token: Any, now_ms: int, member_id: str,
                    group_instance_id: str | None, client_id: str, client_host: str,
                    protocol_type: str, protocols: list[tuple[str, bytes]],
                    session_timeout_ms: int, rebalance_timeout_ms: int) -> Ready:
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = Member(
            member_id=member_id, group_instance_id=group_instance_id, client_id=client_id,
            client_host=client_host, rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms, protocol_type=protocol_type,
            protocols=protocols, last_heartbeat_ms=now_ms, join_token=token)
        if group_instance_id is not None:
            group.static_members[group_instance_id] = member_id
        if group.leader_id is None:
            group.leader_id = member_id
        if group.state == GroupState.PREPARING_REBALANCE and group.delay_deadline_ms is not None:
            # Each member joining during the initial delay extends it, up to the limit.
            group.delay_deadline_ms = min(now_ms + self.settings.initial_rebalance_delay_ms,
                                          group.delay_limit_ms)
        return self._prepare_rebalance(group, now_ms)

    # ------------------------------------------------------------ rebalance

    def _prepare_rebalance(self, group: Group, now_ms: int) -> Ready:
        ready = Ready()
        if group.state == GroupState.PREPARING_REBALANCE:
            return ready.extend(self._maybe_complete_join(group, now_ms))
        if group.state == GroupState.COMPLETING_REBALANCE:
            ready.extend(self._reset_and_answer_syncs(group, pb.REBALANCE_IN_PROGRESS))
        was_empty = group.state == GroupState.EMPTY
        group.transition(GroupState.PREPARING_REBALANCE, now_ms)
        timeout_ms = group.rebalance_timeout_ms()
        group.join_deadline_ms = now_ms + timeout_ms
        if was_empty and self.settings.initial_rebalance_delay_ms > 0:
            group.delay_limit_ms = now_ms + timeout_ms
            group.delay_deadline_ms = now_ms + min(self.settings.initial_rebalance_delay_ms,
                                                   timeout_ms)
        else:
            group.delay_deadline_ms = None
        return ready.extend(self._maybe_complete_join(group, now_ms))

    def _reset_and_answer_syncs(self, group: Group, code: pb.ErrorCode) -> Ready:
        ready = Ready()
        for m in group.members.values():
            m.assignment = b""
            if m.sync_token is not None:
                ready.replies.append((m.sync_token, SyncAnswer(code)))
                m.sync_token = None
        return ready

    def _maybe_complete_join(self, group: Group, now_ms: int) -> Ready:
        if group.state != GroupState.PREPARING_REBALANCE:
            return Ready()
        if group.delay_deadline_ms is not None:
            if now_ms < group.delay_deadline_ms:
                return Ready()
        elif not group.all_joined() and now_ms < group.join_deadline_ms:
            return Ready()
        return self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> Ready:
        ready = Ready()
        group.delay_deadline_ms = None
        for member_id in [i for i, m in group.members.items() if m.join_token is None]:
            del group.members[member_id]  # did not rejoin in time
        group.pending_members.clear()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.protocol_type = None if not group.offsets else group.protocol_type
            group.transition(GroupState.EMPTY, now_ms)
            ready.writes.append(self._write(group, (_group_metadata_record(group, now_ms),),
                                            lambda code, t: Ready()))
            return ready
        group.protocol_name = group.select_protocol()
        group.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        for member in group.members.values():
            ready.replies.append((member.join_token, self._join_answer(group, member.member_id)))
            member.join_token = None
            member.is_new = False
            member.last_heartbeat_ms = now_ms
        return ready

    def _join_answer(self, group: Group, member_id: str) -> JoinAnswer:
        protocol = group.protocol_name or ""
        members = tuple((m.member_id, m.group_instance_id, m.metadata(protocol))
                        for m in group.members.values()) if member_id == group.leader_id else ()
        return JoinAnswer(pb.NONE, generation_id=group.generation,
                          protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                          leader_id=group.leader_id or "", member_id=member_id, members=members)

    # ------------------------------------------------------------ SyncGroup

    def sync_group(self, token: Any, now_ms: int, *, group_id: str, generation_id: int,
                   member_id: str, protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes], group_instance_id: str | None = None
                   ) -> Ready:
        group = self.groups.get(group_id)
        if group is not None and group.fenced(member_id, group_instance_id):
            return Ready(replies=[(token, SyncAnswer(pb.FENCED_INSTANCE_ID))])
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or group.state in (GroupState.EMPTY,
                                                              GroupState.DEAD):
            return Ready(replies=[(token, SyncAnswer(pb.UNKNOWN_MEMBER_ID))])
        if generation_id != group.generation:
            return Ready(replies=[(token, SyncAnswer(pb.ILLEGAL_GENERATION))])
        if ((protocol_type is not None and protocol_type != group.protocol_type)
                or (protocol_name is not None and protocol_name != group.protocol_name)):
            return Ready(replies=[(token, SyncAnswer(pb.INCONSISTENT_GROUP_PROTOCOL))])
        member.last_heartbeat_ms = now_ms
        if group.state == GroupState.PREPARING_REBALANCE:
            return Ready(replies=[(token, SyncAnswer(pb.REBALANCE_IN_PROGRESS))])
        if group.state == GroupState.STABLE:
            return Ready(replies=[(token, self._sync_answer(group, member))])
        ready = Ready()
        if member.sync_token is not None:
            ready.replies.append((member.sync_token, SyncAnswer(pb.UNKNOWN_MEMBER_ID)))
        member.sync_token = token
        if member_id != group.leader_id:
            return ready
        generation = group.generation
        chosen = {m: assignments.get(m, b"") for m in group.members}
        saved = {m.member_id: m.assignment for m in group.members.values()}
        for m in group.members.values():  # the record carries them; memory waits for it
            m.assignment = chosen[m.member_id]
        record = _group_metadata_record(group, now_ms)
        for m in group.members.values():
            m.assignment = saved[m.member_id]

        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            if group.state != GroupState.COMPLETING_REBALANCE or group.generation != generation:
                return Ready()  # the group moved on; its syncs were answered then
            if code != pb.NONE:
                after = self._reset_and_answer_syncs(group, coordinator_error_for_write(code))
                return after.extend(self._prepare_rebalance(group, done_ms))
            for m in group.members.values():
                m.assignment = chosen[m.member_id]
            group.transition(GroupState.STABLE, done_ms)
            after = Ready()
            for m in group.members.values():
                if m.sync_token is not None:
                    after.replies.append((m.sync_token, self._sync_answer(group, m)))
                    m.sync_token = None
            return after
        ready.writes.append(self._write(group, (record,), written))
        return ready

    @staticmethod
    def _sync_answer(group: Group, member: Member) -> SyncAnswer:
        return SyncAnswer(pb.NONE, group.protocol_type, group.protocol_name, member.assignment)

    # ------------------------------------------------------------ Heartbeat, LeaveGroup

    def heartbeat(self, now_ms: int, *, group_id: str, generation_id: int,
                  member_id: str, group_instance_id: str | None = None) -> pb.ErrorCode:
        group = self.groups.get(group_id)
        if group is not None and group.fenced(member_id, group_instance_id):
            return pb.FENCED_INSTANCE_ID
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or group.state in (GroupState.EMPTY,
                                                              GroupState.DEAD):
            return pb.UNKNOWN_MEMBER_ID
        if generation_id != group.generation:
            return pb.ILLEGAL_GENERATION
        member.last_heartbeat_ms = now_ms
        if group.state == GroupState.PREPARING_REBALANCE:
            return pb.REBALANCE_IN_PROGRESS
        return pb.NONE

    def leave_group(self, now_ms: int, *, group_id: str, member_ids: list[str],
                    group_instance_ids: list[str | None] | None = None
                    ) -> tuple[list[pb.ErrorCode], Ready]:
        """Per-member error codes, in order, and what the leaving changes. A member may be
        named by its instance id (member id "") or by both (they must match)."""
        group = self.groups.get(group_id)
        codes, ready = [], Ready()
        instances = group_instance_ids or [None] * len(member_ids)
        for member_id, instance in zip(member_ids, instances, strict=True):
            if group is not None and instance is not None:
                if group.fenced(member_id, instance) and member_id:
                    codes.append(pb.FENCED_INSTANCE_ID)
                    continue
                member_id = group.static_members.get(instance, member_id)
            if group is None or group.state == GroupState.DEAD:
                codes.append(pb.UNKNOWN_MEMBER_ID)
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                codes.append(pb.NONE)
                ready.extend(self._maybe_complete_join(group, now_ms))
            elif member_id in group.members:
                codes.append(pb.NONE)
                ready.extend(self._remove_member(group, member_id, now_ms))
            else:
                codes.append(pb.UNKNOWN_MEMBER_ID)
        return codes, ready

    def _remove_member(self, group: Group, member_id: str, now_ms: int) -> Ready:
        member = group.members.pop(member_id)
        if member.group_instance_id is not None \
                and group.static_members.get(member.group_instance_id) == member_id:
            del group.static_members[member.group_instance_id]
        ready = Ready()
        if member.join_token is not None:
            ready.replies.append((member.join_token, JoinAnswer(pb.UNKNOWN_MEMBER_ID,
                                                                member_id=member_id)))
        if member.sync_token is not None:
            ready.replies.append((member.sync_token, SyncAnswer(pb.UNKNOWN_MEMBER_ID)))
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return ready.extend(self._prepare_rebalance(group, now_ms))
        return ready.extend(self._maybe_complete_join(group, now_ms))

    # ------------------------------------------------------------ time

    def tick(self, now_ms: int) -> Ready:
        """Session expiry, pending members' expiry, rebalance deadlines."""
        ready = Ready()
        for group in list(self.groups.values()):
            ready.extend(self._expire_sessions(group, now_ms))
        if self._next_expiry_check_ms is None:
            self._next_expiry_check_ms = now_ms + self.settings.offsets_retention_check_interval_ms
        elif now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + self.settings.offsets_retention_check_interval_ms
            ready.extend(self.expire_offsets(now_ms))
        return ready

    def _expire_sessions(self, group: Group, now_ms: int) -> Ready:
        """Remove the members (and pending members) whose session ended by ``now_ms``, and
        complete a rebalance that no longer waits for anyone. Ticks call it for every
        group; the admin requests that need an empty group (DeleteGroups, OffsetDelete)
        call it for theirs first, so a session that ended before the request counts as
        ended, as with Kafka's per-member expiry timers (a tick may be 100 ms or, on a
        loaded broker, more behind: librdkafka's 0081 deletes its groups of static
        members just one session timeout after closing them)."""
        ready = Ready()
        for member_id, expiry_ms in list(group.pending_members.items()):
            if now_ms >= expiry_ms:
                del group.pending_members[member_id]
        for member_id, member in list(group.members.items()):
            if member_id in group.members and not member.is_alive(now_ms):
                ready.extend(self._remove_member(group, member_id, now_ms))
        return ready.extend(self._maybe_complete_join(group, now_ms))

    def expire_offsets(self, now_ms: int) -> Ready:
        """Tombstones for the expired offsets of EMPTY groups (see the module docstring)."""
        ready = Ready()
        retention_ms = self.settings.offsets_retention_ms
        for group in list(self.groups.values()):
            if group.state != GroupState.EMPTY or group.group_id in self._expiring:
                continue
            if group.protocol_type is not None:
                expired = (dict(group.offsets)
                           if now_ms - group.state_timestamp_ms >= retention_ms else {})
            else:
                expired = {tp: c for tp, c in group.offsets.items()
                           if now_ms - c.commit_timestamp_ms >= retention_ms}
            if not expired:
                continue
            tombstones: list[records.GroupRecord] = [
                records.OffsetCommitRecord(group.group_id, t, p, None) for t, p in expired]
            emptied = len(expired) == len(group.offsets) and not group.members
            if emptied:
                tombstones.append(records.GroupMetadataRecord(group.group_id, None))
            self._expiring.add(group.group_id)
            ready.writes.append(self._write(group, tuple(tombstones),
                                            self._expired_written(group, expired, emptied)))
        return ready

    def _expired_written(self, group: Group, expired: dict[tuple[str, int], CommittedOffset],
                         emptied: bool) -> Callable[[pb.ErrorCode, int], Ready]:
        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            self._expiring.discard(group.group_id)
            if code == pb.NONE:  # else the next check tries again
                self._forget_offsets(group, expired, emptied, done_ms)
            return Ready()
        return written

    def _forget_offsets(self, group: Group, deleted: dict[tuple[str, int], CommittedOffset],
                        emptied: bool, now_ms: int) -> None:
        """Their tombstones are written: drop the offsets (unless committed again
        meanwhile), and the group too when the group's tombstone went with them."""
        for tp, committed in deleted.items():
            if group.offsets.get(tp) == committed:
                del group.offsets[tp]
        if (emptied and not group.offsets and not group.members
                and group.state == GroupState.EMPTY
                and self.groups.get(group.group_id) is group):
            group.transition(GroupState.DEAD, now_ms)
            del self.groups[group.group_id]

    # ------------------------------------------------------------ offsets

    def commit_offsets(self, token: Any, now_ms: int, *, group_id: str, generation_id: int,
                       member_id: str,
                       offsets: dict[tuple[str, int], tuple[int, int, str]],
                       group_instance_id: str | None = None) -> Ready:
        """``offsets``: (topic, partition) -> (offset, leader_epoch, metadata)."""
        group = self.groups.get(group_id)
        code = pb.NONE
        if not group_id:
            code = pb.INVALID_GROUP_ID
        elif group is not None and group.fenced(member_id, group_instance_id):
            code = pb.FENCED_INSTANCE_ID
        elif group is None:
            if generation_id >= 0:
                code = pb.ILLEGAL_GENERATION
        elif group.state == GroupState.DEAD:
            code = pb.COORDINATOR_NOT_AVAILABLE
        elif generation_id < 0 and group.state == GroupState.EMPTY:
            pass  # a standalone consumer's or an admin's commit
        elif group.state == GroupState.COMPLETING_REBALANCE:
            code = pb.REBALANCE_IN_PROGRESS
        elif member_id not in group.members:
            code = pb.UNKNOWN_MEMBER_ID
        elif generation_id != group.generation:
            code = pb.ILLEGAL_GENERATION
        if code != pb.NONE:
            return Ready(replies=[(token, CommitAnswer({tp: code for tp in offsets}))])
        if group is None:
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        else:
            member = group.members.get(member_id)
            if member is not None:
                member.last_heartbeat_ms = now_ms
        errors, accepted, recs = self._offsets_to_write(group_id, offsets, now_ms)
        if not accepted:
            return Ready(replies=[(token, CommitAnswer(errors))])

        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            answer = dict(errors)
            if code == pb.NONE:
                target = self.groups.get(group_id)
                if target is not None and target.state != GroupState.DEAD:
                    target.offsets.update(accepted)
            for tp in accepted:
                answer[tp] = coordinator_error_for_write(code)
            return Ready(replies=[(token, CommitAnswer(answer))])
        return Ready(writes=[self._write(group, recs, written)])

    def _offsets_to_write(self, group_id: str,
                          offsets: dict[tuple[str, int], tuple[int, int, str]], now_ms: int
                          ) -> tuple[dict[tuple[str, int], pb.ErrorCode],
                                     dict[tuple[str, int], CommittedOffset],
                                     tuple[records.OffsetCommitRecord, ...]]:
        """OffsetCommit's and TxnOffsetCommit's shared step: (refused partitions with their
        codes, the accepted offsets, their records)."""
        errors: dict[tuple[str, int], pb.ErrorCode] = {}
        accepted: dict[tuple[str, int], CommittedOffset] = {}
        for tp, (offset, leader_epoch, metadata) in offsets.items():
            if len((metadata or "").encode()) > self.settings.offset_metadata_max_bytes:
                errors[tp] = pb.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = CommittedOffset(offset, leader_epoch, metadata or "", now_ms)
        recs = tuple(records.OffsetCommitRecord(group_id, tp[0], tp[1], records.OffsetCommitValue(
            c.offset, c.leader_epoch, c.metadata, c.commit_timestamp_ms))
            for tp, c in accepted.items())
        return errors, accepted, recs

    def txn_commit_offsets(self, token: Any, now_ms: int, *, group_id: str, producer_id: int,
                           producer_epoch: int, generation_id: int, member_id: str,
                           group_instance_id: str | None,
                           offsets: dict[tuple[str, int], tuple[int, int, str]]) -> Ready:
        """TxnOffsetCommit: the offsets are written in a transactional batch of the
        producer and held in ``pending_txn_offsets`` until ``complete_txn`` (the marker of
        the transaction in this partition) commits or drops them. The group is checked
        only when the request names a generation (KIP-447, v3+); otherwise, as Kafka,
        any group id is taken (the transaction coordinator checked the producer)."""
        group = self.groups.get(group_id)
        code = pb.NONE
        if not group_id:
            code = pb.INVALID_GROUP_ID
        elif group is not None and group.fenced(member_id, group_instance_id):
            code = pb.FENCED_INSTANCE_ID
        elif group is not None and group.state == GroupState.DEAD:
            code = pb.COORDINATOR_NOT_AVAILABLE
        elif generation_id >= 0:
            if group is None or generation_id != group.generation:
                code = pb.ILLEGAL_GENERATION
            elif member_id not in group.members:
                code = pb.UNKNOWN_MEMBER_ID
        if code != pb.NONE:
            return Ready(replies=[(token, CommitAnswer({tp: code for tp in offsets}))])
        if group is None:
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        errors, accepted, recs = self._offsets_to_write(group_id, offsets, now_ms)
        if not accepted:
            return Ready(replies=[(token, CommitAnswer(errors))])

        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            answer = dict(errors)
            if code == pb.NONE:
                held = self.pending_txn_offsets.setdefault(producer_id, {})
                for tp, c in accepted.items():
                    held[(group_id, tp)] = c
            for tp in accepted:
                answer[tp] = coordinator_error_for_write(code)
            return Ready(replies=[(token, CommitAnswer(answer))])
        write = self._write(group, recs, written)
        return Ready(writes=[replace(write, producer=(producer_id, producer_epoch))])

    def replay_txn_offset(self, record: records.OffsetCommitRecord, producer_id: int) -> None:
        """An offset read back from a transactional batch: held until its marker."""
        if record.value is not None:
            v = record.value
            self.pending_txn_offsets.setdefault(producer_id, {})[
                (record.group_id, (record.topic, record.partition))] = CommittedOffset(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms)

    def complete_txn(self, producer_id: int, committed: bool) -> None:
        """The marker of ``producer_id``'s transaction is in this partition (written
        now, or read back while loading): its held offsets become committed offsets
        (COMMIT) or are dropped (ABORT). No write: the marker is the durable record."""
        held = self.pending_txn_offsets.pop(producer_id, {})
        if not committed:
            return
        for (group_id, tp), offset in held.items():
            group = self.groups.setdefault(group_id, Group(group_id))
            if group.state != GroupState.DEAD:
                group.offsets[tp] = offset

    def unstable_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions of ``group_id`` an open transaction holds an offset of
        (OffsetFetch with require_stable answers them UNSTABLE_OFFSET_COMMIT, KIP-447)."""
        return {tp for held in self.pending_txn_offsets.values()
                for (group, tp) in held if group == group_id}

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], CommittedOffset | None]:
        """Committed offsets of ``partitions`` (None: every partition with one)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    # ------------------------------------------------------------ admin

    def delete_group(self, token: Any, now_ms: int, group_id: str) -> Ready:
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return Ready(replies=[(token, CodeAnswer(pb.GROUP_ID_NOT_FOUND))])
        expired = self._expire_sessions(group, now_ms)
        if group.state != GroupState.EMPTY:
            return expired.extend(Ready(replies=[(token, CodeAnswer(pb.NON_EMPTY_GROUP))]))
        tombstones: list[records.GroupRecord] = [
            records.OffsetCommitRecord(group_id, t, p, None) for t, p in group.offsets]
        tombstones.append(records.GroupMetadataRecord(group_id, None))

        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            if code == pb.NONE:
                group.transition(GroupState.DEAD, done_ms)
                if self.groups.get(group_id) is group:
                    del self.groups[group_id]
            return Ready(replies=[(token, CodeAnswer(coordinator_error_for_write(code)))])
        return expired.extend(Ready(writes=[self._write(group, tuple(tombstones), written)]))

    def delete_offsets(self, token: Any, now_ms: int, group_id: str,
                       partitions: list[tuple[str, int]]) -> Ready:
        """OffsetDelete (module docstring): an ``OffsetDeleteAnswer`` once the tombstones
        are written (at once when there is nothing to delete)."""
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return Ready(replies=[(token, OffsetDeleteAnswer(pb.GROUP_ID_NOT_FOUND, {}))])
        return self._expire_sessions(group, now_ms).extend(
            self._delete_offsets(group, token, partitions))

    def _delete_offsets(self, group: Group, token: Any, partitions: list[tuple[str, int]]
                        ) -> Ready:
        group_id = group.group_id
        errors: dict[tuple[str, int], pb.ErrorCode] = {}
        if group.state == GroupState.EMPTY:
            candidates = list(partitions)
        elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            subscribed = subscribed_topics(group)
            candidates = []
            for tp in partitions:
                if subscribed is None or tp[0] in subscribed:
                    errors[tp] = pb.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    candidates.append(tp)
        else:
            return Ready(replies=[(token, OffsetDeleteAnswer(pb.NON_EMPTY_GROUP, {}))])
        for tp in candidates:
            errors[tp] = pb.NONE  # a partition with no committed offset: nothing to do
        doomed = {tp: group.offsets[tp] for tp in candidates if tp in group.offsets}
        if not doomed:
            return Ready(replies=[(token, OffsetDeleteAnswer(pb.NONE, errors))])
        tombstones: list[records.GroupRecord] = [
            records.OffsetCommitRecord(group_id, t, p, None) for t, p in doomed]
        emptied = (group.state == GroupState.EMPTY and not group.members
                   and len(doomed) == len(group.offsets))
        if emptied:
            tombstones.append(records.GroupMetadataRecord(group_id, None))

        def written(code: pb.ErrorCode, done_ms: int) -> Ready:
            if code == pb.NONE:
                self._forget_offsets(group, doomed, emptied, done_ms)
            answer = dict(errors)
            for tp in doomed:
                answer[tp] = coordinator_error_for_write(code)
            return Ready(replies=[(token, OffsetDeleteAnswer(pb.NONE, answer))])
        return Ready(writes=[self._write(group, tuple(tombstones), written)])

    # ------------------------------------------------------------ writes

    def _write(self, group: Group, recs: tuple[records.GroupRecord, ...],
               on_done: Callable[[pb.ErrorCode, int], Ready]) -> Write:
        write_id = next(self._write_ids)
        self._pending_writes[write_id] = _PendingWrite(group.group_id, on_done)
        return Write(write_id, recs)

    def on_write_done(self, write_id: int, error_code: pb.ErrorCode, now_ms: int) -> Ready:
        pending = self._pending_writes.pop(write_id, None)
        if pending is None:
            return Ready()
        return pending.on_done(error_code, now_ms)

    def abandon(self) -> Ready:
        """Leadership is gone: every waiting request answers NOT_COORDINATOR."""
        ready = Ready()
        for write_id in list(self._pending_writes):
            ready.extend(self.on_write_done(write_id, pb.NOT_LEADER_OR_FOLLOWER, 0))
        for group in self.groups.values():
            for m in group.members.values():
                if m.join_token is not None:
                    ready.replies.append((m.join_token, JoinAnswer(pb.NOT_COORDINATOR,
                                                                   member_id=m.member_id)))
                    m.join_token = None
                if m.sync_token is not None:
                    ready.replies.append((m.sync_token, SyncAnswer(pb.NOT_COORDINATOR)))
                    m.sync_token = None
        self.groups.clear()
        self.pending_txn_offsets.clear()
        return ready
