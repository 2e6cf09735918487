"""The group RPCs of the ``Broker`` gRPC service: the same operations (``service``) as
Kafka's group APIs, in Tidewater's messages (proto/tidewater.proto, "consumer groups").

``GroupRpcs`` is held by each listener's ``BrokerServicer``; FindCoordinator answers with
the coordinator's address on that listener. With security on, each call gets
``allowed(operation, group)`` for its caller and checks the group's ACLs as Kafka's APIs
do: READ to join, sync, heartbeat, leave and commit; DESCRIBE to find the coordinator,
fetch offsets, describe and list; DELETE to delete (GROUP_AUTHORIZATION_FAILED), and
for OffsetDelete READ on each topic too (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tidewater.broker.group import service
from tidewater.broker.group.coordinator import GroupCoordinator
from tidewater.broker.group.service import TopicPartition
from tidewater.broker.group.state import CommittedOffset, GroupState, Member
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import DELETE, DESCRIBE, GROUP, READ, TOPIC

GroupAllowed = Callable[[int, str], bool]  # (operation, group id) -> may


TopicAllowed = Callable[[int, str], bool]  # (operation, topic) -> may


def _refused(allowed: GroupAllowed | None, operation: int, group_id: str) -> bool:
    return allowed is not None and not allowed(operation, group_id)


def _refused_topics(allowed: TopicAllowed | None, operation: int,
                    topics: Iterable[str]) -> set[str]:
    """The topics the caller may not ``operation`` (one question per topic)."""
    if allowed is None:
        return set()
    return {t for t in set(topics) if not allowed(operation, t)}


def _member(m: Member, protocol: str, with_data: bool) -> pb.GroupMember:
    return pb.GroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                          client_id=m.client_id, client_host=m.client_host,
                          metadata=m.metadata(protocol) if with_data else b"",
                          assignment=m.assignment if with_data else b"")


class GroupRpcs:
    def __init__(self, coordinator: GroupCoordinator | None, metadata_cache: MetadataCache,
                 listener_name: str) -> None:
        self._coordinator = coordinator  # None: a servicer built without groups (tests)
        self.metadata_cache = metadata_cache
        self.listener_name = listener_name

    @property
    def coordinator(self) -> GroupCoordinator:
        """The group coordinator; without one, a group RPC fails (an unexpected error at
        the servicer's boundary)."""
        if self._coordinator is None:
            raise LookupError("no group coordinator on this listener")
        return self._coordinator

    async def find_coordinator(self, request: pb.FindCoordinatorRequest,
                               allowed: GroupAllowed | None = None
                               ) -> pb.FindCoordinatorResponse:
        if _refused(allowed, DESCRIBE, request.group_id):
            return pb.FindCoordinatorResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        node = await self.coordinator.find_coordinator(request.group_id, self.listener_name)
        return pb.FindCoordinatorResponse(error_code=node.error_code,
                                          error_message=node.message, node_id=node.node_id,
                                          host=node.host, port=node.port)

    async def join_group(self, request: pb.JoinGroupRequest,
                         allowed: GroupAllowed | None = None, *,
                         client_host: str = "") -> pb.JoinGroupResponse:
        if _refused(allowed, READ, request.group_id):
            return pb.JoinGroupResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED, member_id=request.member_id)
        answer = await service.join(
            self.coordinator, group_id=request.group_id, member_id=request.member_id,
            group_instance_id=request.group_instance_id or None, client_id=request.client_id,
            client_host=client_host, protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms or request.session_timeout_ms,
            require_known_member_id=True)
        return pb.JoinGroupResponse(
            error_code=answer.error_code, generation_id=answer.generation_id,
            protocol_type=answer.protocol_type or "", protocol_name=answer.protocol_name or "",
            leader_id=answer.leader_id, member_id=answer.member_id,
            members=[pb.GroupMember(member_id=m, group_instance_id=instance or "",
                                    metadata=metadata)
                     for m, instance, metadata in answer.members])

    async def sync_group(self, request: pb.SyncGroupRequest,
                         allowed: GroupAllowed | None = None) -> pb.SyncGroupResponse:
        if _refused(allowed, READ, request.group_id):
            return pb.SyncGroupResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        answer = await service.sync(
            self.coordinator, group_id=request.group_id, generation_id=request.generation_id,
            member_id=request.member_id, protocol_type=None, protocol_name=None,
            assignments={a.member_id: a.assignment for a in request.assignments})
        return pb.SyncGroupResponse(error_code=answer.error_code,
                                    protocol_name=answer.protocol_name or "",
                                    assignment=answer.assignment)

    async def heartbeat(self, request: pb.HeartbeatRequest,
                        allowed: GroupAllowed | None = None) -> pb.HeartbeatResponse:
        if _refused(allowed, READ, request.group_id):
            return pb.HeartbeatResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        return pb.HeartbeatResponse(error_code=service.heartbeat(
            self.coordinator, group_id=request.group_id, generation_id=request.generation_id,
            member_id=request.member_id))

    async def leave_group(self, request: pb.LeaveGroupRequest,
                          allowed: GroupAllowed | None = None) -> pb.LeaveGroupResponse:
        if _refused(allowed, READ, request.group_id):
            return pb.LeaveGroupResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        code, codes = service.leave(self.coordinator, group_id=request.group_id,
                                    member_ids=list(request.member_ids))
        return pb.LeaveGroupResponse(error_code=code, member_error_codes=codes)

    async def offset_commit(self, request: pb.OffsetCommitRequest,
                            allowed: GroupAllowed | None = None,
                            topic_allowed: TopicAllowed | None = None
                            ) -> pb.OffsetCommitResponse:
        """Kafka's rule: READ on the group, and READ on each topic (a refused topic's
        partitions are TOPIC_AUTHORIZATION_FAILED, the others committed)."""
        if _refused(allowed, READ, request.group_id):
            return pb.OffsetCommitResponse(offsets=[pb.GroupOffset(topic=o.topic, partition=o.partition, error_code=pb.GROUP_AUTHORIZATION_FAILED) for o in request.offsets])
        refused = _refused_topics(topic_allowed, READ, (o.topic for o in request.offsets))
        offsets = {(o.topic, o.partition): (o.offset, o.leader_epoch, o.metadata)
                   for o in request.offsets if o.topic not in refused}
        errors = await service.commit(
            self.coordinator, self.metadata_cache, group_id=request.group_id,
            generation_id=request.generation_id, member_id=request.member_id,
            offsets=offsets) if offsets else {}
        denied = [pb.GroupOffset(topic=o.topic, partition=o.partition,
                                 error_code=pb.TOPIC_AUTHORIZATION_FAILED)
                  for o in request.offsets if o.topic in refused]
        return pb.OffsetCommitResponse(offsets=[
            pb.GroupOffset(topic=t, partition=p, error_code=code)
            for (t, p), code in errors.items()] + denied)

    async def offset_fetch(self, request: pb.OffsetFetchRequest,
                           allowed: GroupAllowed | None = None,
                           topic_allowed: TopicAllowed | None = None
                           ) -> pb.OffsetFetchResponse:
        if _refused(allowed, DESCRIBE, request.group_id):
            return pb.OffsetFetchResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        # Kafka's rule: DESCRIBE on each topic too; a named partition of a refused topic
        # is TOPIC_AUTHORIZATION_FAILED, and a listing of all leaves such topics out.
        asked = [(o.topic, o.partition) for o in request.partitions]
        refused = _refused_topics(topic_allowed, DESCRIBE, (t for t, _ in asked))
        wanted = [(t, p) for t, p in asked if t not in refused]
        found: dict[TopicPartition, CommittedOffset | None] = {}
        code: pb.ErrorCode = pb.NONE
        if not asked or wanted:
            code, found, _ = service.fetch_offsets(self.coordinator, request.group_id,
                                                   wanted or None)
        if not asked and topic_allowed is not None:
            hidden = _refused_topics(topic_allowed, DESCRIBE, (t for t, _ in found))
            found = {tp: c for tp, c in found.items() if tp[0] not in hidden}
        return pb.OffsetFetchResponse(error_code=code, offsets=[
            pb.GroupOffset(topic=t, partition=p, offset=c.offset if c else -1,
                           leader_epoch=c.leader_epoch if c else -1,
                           metadata=c.metadata if c else "")
            for (t, p), c in sorted(found.items())] + [
            pb.GroupOffset(topic=t, partition=p, offset=-1, leader_epoch=-1,
                           error_code=pb.TOPIC_AUTHORIZATION_FAILED)
            for t, p in asked if t in refused])

    async def list_groups(self, request: pb.ListGroupsRequest,
                          allowed: GroupAllowed | None = None) -> pb.ListGroupsResponse:
        code, groups = service.listed_groups(self.coordinator)
        return pb.ListGroupsResponse(error_code=code, groups=[
            pb.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type or "",
                            state=g.state.value) for g in groups
            if not _refused(allowed, DESCRIBE, g.group_id)])

    async def describe_groups(self, request: pb.DescribeGroupsRequest,
                              allowed: GroupAllowed | None = None) -> pb.DescribeGroupsResponse:
        response = pb.DescribeGroupsResponse()
        for group_id in request.group_ids:
            if _refused(allowed, DESCRIBE, group_id):
                response.groups.add(error_code=pb.GROUP_AUTHORIZATION_FAILED, group_id=group_id)
                continue
            code, group = service.describe(self.coordinator, group_id)
            if group is None:
                response.groups.add(error_code=code, group_id=group_id,
                                    state=GroupState.DEAD.value)
                continue
            stable = group.state == GroupState.STABLE
            protocol = group.protocol_name or ""
            response.groups.add(
                error_code=code, group_id=group_id, state=group.state.value,
                protocol_type=group.protocol_type or "", protocol_name=protocol,
                members=[_member(m, protocol, stable) for m in group.members.values()])
        return response

    async def delete_offsets(self, request: pb.OffsetDeleteRequest,
                             rights: Callable[[int, int, str], bool] | None = None
                             ) -> pb.OffsetDeleteResponse:
        """Kafka's handleOffsetDeleteRequest: DELETE on the group (else
        GROUP_AUTHORIZATION_FAILED for the request); per topic READ
        (TOPIC_AUTHORIZATION_FAILED) and a known topic (UNKNOWN_TOPIC_OR_PARTITION)."""
        if rights is not None and not rights(DELETE, GROUP, request.group_id):
            return pb.OffsetDeleteResponse(error_code=pb.GROUP_AUTHORIZATION_FAILED)
        known = set(self.metadata_cache.topics())
        refused: dict[tuple[str, int], pb.ErrorCode] = {}
        wanted: list[tuple[str, int]] = []
        for o in request.partitions:
            tp = (o.topic, o.partition)
            if rights is not None and not rights(READ, TOPIC, o.topic):
                refused[tp] = pb.TOPIC_AUTHORIZATION_FAILED
            elif o.topic not in known:
                refused[tp] = pb.UNKNOWN_TOPIC_OR_PARTITION
            else:
                wanted.append(tp)
        result = await service.delete_offsets(self.coordinator, request.group_id, wanted)
        if result.error_code != pb.NONE:
            return pb.OffsetDeleteResponse(error_code=result.error_code)
        return pb.OffsetDeleteResponse(partitions=[
            pb.GroupOffset(topic=t, partition=p, error_code=code)
            for (t, p), code in sorted({**result.errors, **refused}.items())])

    async def delete_groups(self, request: pb.DeleteGroupsRequest,
                            allowed: GroupAllowed | None = None) -> pb.DeleteGroupsResponse:
        pending = [(g, None if _refused(allowed, DELETE, g) else service.delete(self.coordinator, g))
                   for g in request.group_ids]
        return pb.DeleteGroupsResponse(results=[
            pb.GroupResult(group_id=g, error_code=pb.GROUP_AUTHORIZATION_FAILED
                           if outcome is None else await outcome) for g, outcome in pending])
