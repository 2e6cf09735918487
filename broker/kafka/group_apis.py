"""Kafka's group APIs on the broker's group coordinator (``broker/group``).

===================== ===== ======================================================
API (key)             vers  notes
===================== ===== ======================================================
FindCoordinator (10)  0-4   groups (key type 0; creates __consumer_offsets);
                            transactions (key type 1: ``txn_apis``)
JoinGroup (11)        0-9   KIP-394 member ids from v4; static members (KIP-345) from v5
SyncGroup (14)        0-5
Heartbeat (12)        0-4
LeaveGroup (13)       0-5   batches of members from v3
OffsetCommit (8)      2-9   generation checked; commits to unknown topics refused
OffsetFetch (9)       1-8   several groups per request from v8
DescribeGroups (15)   0-5
ListGroups (16)       0-5   state and type filters
DeleteGroups (42)     0-2   empty groups only
OffsetDelete (47)     0     offsets of topics the group does not subscribe to
===================== ===== ======================================================

Each handler translates the kio request into a call on the coordinator's pure state
(``GroupCoordinator.request``) and its answer back; a group not coordinated here
answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS. ``authorize_group`` is the
one place a group API asks whether the caller may act on a group (GROUP READ for
join/sync/heartbeat/leave/commit/fetch, DESCRIBE for describe/list, DELETE for
DeleteGroups and OffsetDelete, which also needs READ on each topic, as Kafka's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from tidewater.broker.coordination.partitioned import first_use_deadline
from tidewater.broker.group import service
from tidewater.broker.group.coordinator import GroupCoordinator
from tidewater.broker.group.state import GroupState, JoinAnswer, SyncAnswer
from tidewater.broker.kafka import txn_apis
from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.kafka.coordinator_api_keys import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    GROUP_VERSIONS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.txn.coordinator import TransactionCoordinator
from tidewater.proto import acls
from tidewater.proto import tidewater_pb2 as pb

GROUP_KEY_TYPE = 0
JOIN_MEMBER_ID_REQUIRED_FROM = 4


class GroupServices(Protocol):
    """What the group APIs reach of ``apis.Services``."""

    @property
    def group_coordinator(self) -> GroupCoordinator | None: ...

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...

    @property
    def metadata_cache(self) -> MetadataCache: ...

    @property
    def listener_name(self) -> str: ...

    @property
    def client_host(self) -> str: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _coordinator(s: GroupServices) -> GroupCoordinator:
    """The broker's group coordinator (a listener built without one serves no group API:
    the request fails and the connection closes, as for any request that cannot be
    handled)."""
    if s.group_coordinator is None:
        raise LookupError("no group coordinator on this listener")
    return s.group_coordinator


def authorize_group(s: GroupServices, head: RequestHead, operation: str,
                    group_id: str) -> pb.ErrorCode | None:
    """The error code refusing ``operation`` ("READ", "DESCRIBE", "DELETE") on group
    ``group_id`` to this connection, or None to allow it: every group API asks here.

    It asks ``Services.allowed(operation, GROUP, name)`` (the authorizer's one hook, with
    ``proto.acls``' numbers); without security everything is allowed."""
    if s.allowed(getattr(acls, operation), acls.GROUP, group_id):
        return None
    return pb.GROUP_AUTHORIZATION_FAILED


def refused_topics(s: GroupServices, operation: str, topics: Iterable[str]) -> set[str]:
    """The topics this connection may not ``operation`` (one question per topic)."""
    return {t for t in set(topics) if not s.allowed(getattr(acls, operation), acls.TOPIC, t)}


def _done(value: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    async def answer() -> dict[str, Any]:
        return value
    return answer()


# ---------------------------------------------------------------- FindCoordinator

async def on_find_coordinator(s: GroupServices, head: RequestHead, body: RequestBody
                             ) -> Awaitable[dict[str, Any]]:
    key_type = getattr(body, "key_type", GROUP_KEY_TYPE)
    keys: list[str] = list(body.coordinator_keys) if head.api_version >= 4 else [body.key]
    # (key, error code, node id, host, port, error message)
    found: list[tuple[str, pb.ErrorCode, int, str, int, str | None]] = []
    # One wait for the whole request: v4's keys waiting in turn while the coordinator
    # topic cannot be created would hold the connection's later requests N times over.
    deadline = first_use_deadline()
    for key in keys:
        if key_type == txn_apis.TRANSACTION_KEY_TYPE:
            node = await txn_apis.find_txn_coordinator(s, key, s.listener_name, deadline)
            found.append((key, node.error_code, node.node_id, node.host, node.port,
                          node.message or None))
            continue
        if key_type != GROUP_KEY_TYPE:
            found.append((key, pb.INVALID_REQUEST, -1, "", -1,
                          "only group (0) and transaction (1) coordinators are served"))
            continue
        if (code := authorize_group(s, head, "DESCRIBE", key)) is not None:
            found.append((key, code, -1, "", -1, None))
            continue
        node = await _coordinator(s).find_coordinator(key, s.listener_name, deadline)
        found.append((key, node.error_code, node.node_id, node.host, node.port,
                      node.message or None))
    if head.api_version >= 4:
        return _done({"throttle_time": 0, "coordinators": [
            {"key": k, "error_code": code, "node_id": node, "host": host, "port": port,
             "error_message": message} for k, code, node, host, port, message in found]})
    _, code, node_id, host, port, message = found[0]
    return _done({"throttle_time": 0, "error_code": code, "error_message": message,
                  "node_id": node_id, "host": host, "port": port})


# ---------------------------------------------------------------- JoinGroup, SyncGroup

JOIN_PROTOCOL_NULLABLE_FROM = 7


def _join_values(answer: JoinAnswer, version: int) -> dict[str, Any]:
    protocol_name = answer.protocol_name
    if protocol_name is None and version < JOIN_PROTOCOL_NULLABLE_FROM:
        protocol_name = ""  # not nullable before v7
    return {"throttle_time": 0, "error_code": answer.error_code,
            "generation_id": answer.generation_id, "protocol_type": answer.protocol_type,
            "protocol_name": protocol_name, "leader": answer.leader_id,
            "skip_assignment": False, "member_id": answer.member_id,
            "members": [{"member_id": m, "group_instance_id": instance, "metadata": metadata}
                        for m, instance, metadata in answer.members]}


async def on_join_group(s: GroupServices, head: RequestHead, body: RequestBody
                       ) -> Awaitable[dict[str, Any]]:
    group_id = body.group_id
    if (code := authorize_group(s, head, "READ", group_id)) is not None:
        return _done(_join_values(JoinAnswer(code, member_id=body.member_id),
                                  head.api_version))
    session_ms = milliseconds(body.session_timeout)
    rebalance = getattr(body, "rebalance_timeout", None)
    pending = service.join(
        _coordinator(s), group_id=group_id, member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=head.client_id or "", client_host=s.client_host,
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=milliseconds(rebalance) if rebalance is not None else session_ms,
        require_known_member_id=head.api_version >= JOIN_MEMBER_ID_REQUIRED_FROM)

    async def answer() -> dict[str, Any]:
        return _join_values(await pending, head.api_version)
    return answer()


async def on_sync_group(s: GroupServices, head: RequestHead, body: RequestBody
                       ) -> Awaitable[dict[str, Any]]:
    group_id = body.group_id

    def values(answer: SyncAnswer) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": answer.error_code,
                "protocol_type": answer.protocol_type, "protocol_name": answer.protocol_name,
                "assignment": answer.assignment}
    if (code := authorize_group(s, head, "READ", group_id)) is not None:
        return _done(values(SyncAnswer(code)))
    pending = service.sync(
        _coordinator(s), group_id=group_id, generation_id=body.generation_id,
        member_id=body.member_id, protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
        assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
        group_instance_id=getattr(body, "group_instance_id", None))

    async def answer() -> dict[str, Any]:
        return values(await pending)
    return answer()


# ---------------------------------------------------------------- Heartbeat, LeaveGroup

async def on_heartbeat(s: GroupServices, head: RequestHead, body: RequestBody
                      ) -> Awaitable[dict[str, Any]]:
    group_id = body.group_id
    code = authorize_group(s, head, "READ", group_id)
    if code is None:
        code = service.heartbeat(_coordinator(s), group_id=group_id,
                                 generation_id=body.generation_id, member_id=body.member_id,
                                 group_instance_id=getattr(body, "group_instance_id", None))
    return _done({"throttle_time": 0, "error_code": code})


async def on_leave_group(s: GroupServices, head: RequestHead, body: RequestBody
                        ) -> Awaitable[dict[str, Any]]:
    group_id = body.group_id
    batch = head.api_version >= 3
    identities = ([(m.member_id, m.group_instance_id) for m in body.members] if batch
                  else [(body.member_id, None)])
    top = authorize_group(s, head, "READ", group_id)
    if top is None:
        top, codes = service.leave(_coordinator(s), group_id=group_id,
                                   member_ids=[m for m, _ in identities],
                                   group_instance_ids=[i for _, i in identities])
    else:
        codes = [top] * len(identities)
    if not batch:
        return _done({"throttle_time": 0, "error_code": codes[0]})
    return _done({"throttle_time": 0, "error_code": top, "members": [
        {"member_id": m, "group_instance_id": instance, "error_code": code}
        for (m, instance), code in zip(identities, codes, strict=True)]})


# ---------------------------------------------------------------- OffsetCommit, OffsetFetch

async def on_offset_commit(s: GroupServices, head: RequestHead, body: RequestBody
                          ) -> Awaitable[dict[str, Any]]:
    group_id = body.group_id
    order = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]

    def values(errors: dict[tuple[str, int], pb.ErrorCode]) -> dict[str, Any]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in order:
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": errors[(topic, partition)]})
        return {"throttle_time": 0, "topics": [{"name": name, "partitions": parts}
                                               for name, parts in topics.items()]}
    if (code := authorize_group(s, head, "READ", group_id)) is not None:
        return _done(values({tp: code for tp in order}))
    # Kafka's rule (KafkaApis.handleOffsetCommitRequest): READ on each topic too; a
    # refused topic's partitions are TOPIC_AUTHORIZATION_FAILED, the others committed.
    refused = refused_topics(s, "READ", (t.name for t in body.topics))
    denied = {tp: pb.TOPIC_AUTHORIZATION_FAILED for tp in order if tp[0] in refused}
    offsets = {(t.name, p.partition_index): (p.committed_offset,
                                             getattr(p, "committed_leader_epoch", -1),
                                             p.committed_metadata or "")
               for t in body.topics if t.name not in refused for p in t.partitions}
    if not offsets:
        return _done(values(denied))
    pending = service.commit(
        _coordinator(s), s.metadata_cache, group_id=group_id,
        generation_id=body.generation_id_or_member_epoch, member_id=body.member_id,
        offsets=offsets, group_instance_id=getattr(body, "group_instance_id", None))

    async def answer() -> dict[str, Any]:
        return values({**await pending, **denied})
    return answer()


def _fetched_group(s: GroupServices, head: RequestHead, group_id: str,
                   topics: list[tuple[str, list[int]]] | None,
                   require_stable: bool = False) -> dict[str, Any]:
    asked = None if topics is None else [(t, p) for t, ps in topics for p in ps]
    code = authorize_group(s, head, "DESCRIBE", group_id)
    unstable: set[tuple[str, int]] = set()
    # Kafka's rule (KafkaApis.handleOffsetFetchRequest): DESCRIBE on each topic too; a
    # named partition of a refused topic is TOPIC_AUTHORIZATION_FAILED, and a fetch of
    # all the group's offsets leaves such topics out.
    refused = (refused_topics(s, "DESCRIBE", (t for t, _ in asked or ())) if code is None
               else set())
    wanted = None if asked is None else [(t, p) for t, p in asked if t not in refused]
    found: dict[tuple[str, int], Any]
    if code is None and (wanted is None or wanted):
        code, found, unstable = service.fetch_offsets(_coordinator(s), group_id, wanted,
                                                      require_stable=require_stable)
        if asked is None:
            hidden = refused_topics(s, "DESCRIBE", (t for t, _ in found))
            found = {tp: c for tp, c in found.items() if tp[0] not in hidden}
    else:
        found = {tp: None for tp in wanted or ()}
        code = pb.NONE if code is None else code
    grouped: dict[str, list[dict[str, Any]]] = {}
    for topic, partition in asked or ():
        if topic in refused:
            grouped.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": -1,
                "committed_leader_epoch": -1, "metadata": "",
                "error_code": pb.TOPIC_AUTHORIZATION_FAILED})
    for (topic, partition), committed in found.items():
        if (topic, partition) in unstable:
            # KIP-447: an open transaction holds an offset here; the client retries.
            grouped.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": -1,
                "committed_leader_epoch": -1, "metadata": "",
                "error_code": pb.UNSTABLE_OFFSET_COMMIT})
            continue
        grouped.setdefault(topic, []).append({
            "partition_index": partition,
            "committed_offset": committed.offset if committed else -1,
            "committed_leader_epoch": committed.leader_epoch if committed else -1,
            "metadata": committed.metadata if committed else "",
            # Before v2 the only error field is per partition.
            "error_code": code if head.api_version < 2 else pb.NONE})
    return {"group_id": group_id, "error_code": code,
            "topics": [{"name": t, "partitions": ps} for t, ps in grouped.items()]}


async def on_offset_fetch(s: GroupServices, head: RequestHead, body: RequestBody
                         ) -> Awaitable[dict[str, Any]]:
    def wanted(topics: RequestBody) -> list[tuple[str, list[int]]] | None:
        if topics is None:
            return None
        return [(t.name, list(t.partition_indexes)) for t in topics]
    # require_stable (v7+, KIP-447): a partition an open transaction holds an offset of
    # is UNSTABLE_OFFSET_COMMIT, not its last stable offset (librdkafka asks so).
    stable = bool(getattr(body, "require_stable", False))
    if head.api_version >= 8:
        return _done({"throttle_time": 0, "groups": [
            _fetched_group(s, head, g.group_id, wanted(g.topics), stable)
            for g in body.groups]})
    one = _fetched_group(s, head, body.group_id, wanted(body.topics), stable)
    return _done({"throttle_time": 0, "error_code": one["error_code"],
                  "topics": one["topics"]})


# ---------------------------------------------------------------- admin

async def on_list_groups(s: GroupServices, head: RequestHead, body: RequestBody
                        ) -> Awaitable[dict[str, Any]]:
    states = set(getattr(body, "states_filter", ()) or ())
    types = {t.lower() for t in getattr(body, "types_filter", ()) or ()}
    code, groups = service.listed_groups(_coordinator(s))
    listed = [{"group_id": g.group_id, "protocol_type": g.protocol_type or "",
               "group_state": g.state.value, "group_type": "classic"}
              for g in groups
              if (not states or g.state.value in states)
              and (not types or "classic" in types)
              and authorize_group(s, head, "DESCRIBE", g.group_id) is None]
    return _done({"throttle_time": 0, "error_code": code, "groups": listed})


def _describe_group_values(s: GroupServices, head: RequestHead, group_id: str,
                           include_authorized_operations: bool = False) -> dict[str, Any]:
    values: dict[str, Any] = {"error_code": pb.NONE, "group_id": group_id,
                              "group_state": GroupState.DEAD.value, "protocol_type": "",
                              "protocol_data": "", "members": [],
                              "authorized_operations": acls.AUTHORIZED_OPERATIONS_OMITTED}
    code = authorize_group(s, head, "DESCRIBE", group_id)
    if code is None:
        code, group = service.describe(_coordinator(s), group_id)
    else:
        group = None
    values["error_code"] = code
    if code == pb.NONE and include_authorized_operations:  # KIP-430, v3+; a Dead group too
        values["authorized_operations"] = acls.authorized_operations(s.allowed, acls.GROUP,
                                                                     group_id)
    if group is None:
        return values
    stable = group.state == GroupState.STABLE
    values.update(group_state=group.state.value, protocol_type=group.protocol_type or "",
                  protocol_data=group.protocol_name or "" if stable else "")
    values["members"] = [{
        "member_id": m.member_id, "group_instance_id": m.group_instance_id,
        "client_id": m.client_id, "client_host": m.client_host,
        "member_metadata": m.metadata(group.protocol_name or "") if stable else b"",
        "member_assignment": m.assignment if stable else b""}
        for m in group.members.values()]
    return values


async def on_describe_groups(s: GroupServices, head: RequestHead, body: RequestBody
                            ) -> Awaitable[dict[str, Any]]:
    return _done({"throttle_time": 0, "groups": [
        _describe_group_values(s, head, g,
                               getattr(body, "include_authorized_operations", False))
        for g in body.groups]})


async def on_delete_groups(s: GroupServices, head: RequestHead, body: RequestBody
                          ) -> Awaitable[dict[str, Any]]:
    pending: list[tuple[str, int | Awaitable[int]]] = []
    for group_id in body.groups_names:
        code = authorize_group(s, head, "DELETE", group_id)
        pending.append((group_id, code if code is not None
                        else service.delete(_coordinator(s), group_id)))

    async def answer() -> dict[str, Any]:
        results = []
        for group_id, outcome in pending:
            code = outcome if isinstance(outcome, int) else await outcome
            results.append({"group_id": group_id, "error_code": code})
        return {"throttle_time": 0, "results": results}
    return answer()


async def on_offset_delete(s: GroupServices, head: RequestHead, body: RequestBody
                           ) -> Awaitable[dict[str, Any]]:
    """Kafka's handleOffsetDeleteRequest: DELETE on the group (else the request fails
    with GROUP_AUTHORIZATION_FAILED); per topic READ (TOPIC_AUTHORIZATION_FAILED) and a
    known topic (UNKNOWN_TOPIC_OR_PARTITION); the rest goes to the coordinator."""
    group_id = body.group_id
    refused: dict[tuple[str, int], pb.ErrorCode] = {}
    wanted: list[tuple[str, int]] = []
    known = set(s.metadata_cache.topics())
    for topic in body.topics:
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if not s.allowed(acls.READ, acls.TOPIC, topic.name):
                refused[tp] = pb.TOPIC_AUTHORIZATION_FAILED
            elif topic.name not in known:
                refused[tp] = pb.UNKNOWN_TOPIC_OR_PARTITION
            else:
                wanted.append(tp)
    group_code = authorize_group(s, head, "DELETE", group_id)

    async def answer() -> dict[str, Any]:
        if group_code is not None:
            return {"error_code": group_code, "throttle_time": 0, "topics": []}
        result = await service.delete_offsets(_coordinator(s), group_id, wanted)
        if result.error_code != pb.NONE:
            return {"error_code": result.error_code, "throttle_time": 0, "topics": []}
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), code in [*result.errors.items(), *refused.items()]:
            topics.setdefault(topic, []).append({"partition_index": partition,
                                                 "error_code": code})
        return {"error_code": pb.NONE, "throttle_time": 0,
                "topics": [{"name": name, "partitions": parts}
                           for name, parts in topics.items()]}
    return answer()


GROUP_HANDLERS = {
    FIND_COORDINATOR: on_find_coordinator,
    JOIN_GROUP: on_join_group,
    SYNC_GROUP: on_sync_group,
    HEARTBEAT: on_heartbeat,
    LEAVE_GROUP: on_leave_group,
    OFFSET_COMMIT: on_offset_commit,
    OFFSET_FETCH: on_offset_fetch,
    DESCRIBE_GROUPS: on_describe_groups,
    LIST_GROUPS: on_list_groups,
    DELETE_GROUPS: on_delete_groups,
    OFFSET_DELETE: on_offset_delete,
}
assert set(GROUP_HANDLERS) == set(GROUP_VERSIONS)
