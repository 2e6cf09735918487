"""The group RPCs of the ``Broker`` gRPC service: the same operations (``service``) as
Kafka's group APIs, in Tidewater's messages (proto/tidewater.proto, "consumer groups").

``GroupRpcs`` is held by each listener's ``BrokerServicer``; FindCoordinator answers with
the coordinator's address on that listener.
"""

from __future__ import annotations

from tidewater.broker.group import service
from tidewater.broker.group.state import GroupState
from tidewater.proto import tidewater_pb2 as pb


def _member(m, protocol: str, with_data: bool) -> pb.GroupMember:
    return pb.GroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                          client_id=m.client_id, client_host=m.client_host,
                          metadata=m.metadata(protocol) if with_data else b"",
                          assignment=m.assignment if with_data else b"")


class GroupRpcs:
    def __init__(self, coordinator, metadata_cache, listener_name: str):
        self.coordinator = coordinator
        self.metadata_cache = metadata_cache
        self.listener_name = listener_name

    async def find_coordinator(self, request: pb.FindCoordinatorRequest
                               ) -> pb.FindCoordinatorResponse:
        node = await self.coordinator.find_coordinator(request.group_id, self.listener_name)
        return pb.FindCoordinatorResponse(error_code=node.error_code,
                                          error_message=node.message, node_id=node.node_id,
                                          host=node.host, port=node.port)

    async def join_group(self, request: pb.JoinGroupRequest) -> pb.JoinGroupResponse:
        answer = await service.join(
            self.coordinator, group_id=request.group_id, member_id=request.member_id,
            group_instance_id=request.group_instance_id or None, client_id=request.client_id,
            client_host="", protocol_type=request.protocol_type,
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

    async def sync_group(self, request: pb.SyncGroupRequest) -> pb.SyncGroupResponse:
        answer = await service.sync(
            self.coordinator, group_id=request.group_id, generation_id=request.generation_id,
            member_id=request.member_id, protocol_type=None, protocol_name=None,
            assignments={a.member_id: a.assignment for a in request.assignments})
        return pb.SyncGroupResponse(error_code=answer.error_code,
                                    protocol_name=answer.protocol_name or "",
                                    assignment=answer.assignment)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(error_code=service.heartbeat(
            self.coordinator, group_id=request.group_id, generation_id=request.generation_id,
            member_id=request.member_id))

    async def leave_group(self, request: pb.LeaveGroupRequest) -> pb.LeaveGroupResponse:
        code, codes = service.leave(self.coordinator, group_id=request.group_id,
                                    member_ids=list(request.member_ids))
        return pb.LeaveGroupResponse(error_code=code, member_error_codes=codes)

    async def offset_commit(self, request: pb.OffsetCommitRequest) -> pb.OffsetCommitResponse:
        errors = await service.commit(
            self.coordinator, self.metadata_cache, group_id=request.group_id,
            generation_id=request.generation_id, member_id=request.member_id,
            offsets={(o.topic, o.partition): (o.offset, o.leader_epoch, o.metadata)
                     for o in request.offsets})
        return pb.OffsetCommitResponse(offsets=[
            pb.GroupOffset(topic=t, partition=p, error_code=code)
            for (t, p), code in errors.items()])

    async def offset_fetch(self, request: pb.OffsetFetchRequest) -> pb.OffsetFetchResponse:
        wanted = [(o.topic, o.partition) for o in request.partitions] or None
        code, found = service.fetch_offsets(self.coordinator, request.group_id, wanted)
        return pb.OffsetFetchResponse(error_code=code, offsets=[
            pb.GroupOffset(topic=t, partition=p, offset=c.offset if c else -1,
                           leader_epoch=c.leader_epoch if c else -1,
                           metadata=c.metadata if c else "")
            for (t, p), c in sorted(found.items())])

    async def list_groups(self, request: pb.ListGroupsRequest) -> pb.ListGroupsResponse:
        code, groups = service.listed_groups(self.coordinator)
        return pb.ListGroupsResponse(error_code=code, groups=[
            pb.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type or "",
                            state=g.state.value) for g in groups])

    async def describe_groups(self, request: pb.DescribeGroupsRequest
                              ) -> pb.DescribeGroupsResponse:
        response = pb.DescribeGroupsResponse()
        for group_id in request.group_ids:
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

    async def delete_groups(self, request: pb.DeleteGroupsRequest) -> pb.DeleteGroupsResponse:
        pending = [(g, service.delete(self.coordinator, g)) for g in request.group_ids]
        return pb.DeleteGroupsResponse(results=[
            pb.GroupResult(group_id=g, error_code=await outcome) for g, outcome in pending])
