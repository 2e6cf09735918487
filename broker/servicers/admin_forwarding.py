"""The broker's ``Controller`` service: forwards admin calls to the controller.

Clients need only a bootstrap broker: CreateTopics, DeleteTopics,
CreatePartitions, DescribeCluster, AlterConfigs, ElectLeaders, the partition
reassignment calls and the user and ACL
calls (AlterUserScramCredentials, DescribeUserScramCredentials, CreateAcls,
DescribeAcls, DeleteAcls) go to the controller unchanged and its answer comes back
unchanged. A call waits (``wait_for_ready``) for the controller connection up
to its timeout plus ``FORWARD_MARGIN_S``, so a controller restart is ridden
out; when it still cannot be reached every item answers NOT_CONTROLLER
(retriable) with the transport error as message.
CreateTopics, DeleteTopics and CreatePartitions are answered by their own
``timeout_ms`` (``FORWARD_MARGIN_S`` when it is 0), as Kafka's forwarding
broker answers by its deadline: one deadline for the whole forward, however many
controllers are tried. While the quorum has no active controller (every one
answers UNAVAILABLE: an election) the call is sent again every
``NO_CONTROLLER_BACKOFF_S`` within that deadline, so it succeeds once a leader
is active; at the deadline each item answers NOT_CONTROLLER (no controller took
it) or, from the controller, REQUEST_TIMED_OUT (taken, not finished in time: it
may still complete). Each forwarded call names the
client it is made for (``proto.forwarded_principal``: set by the Kafka listener
and the guarded gRPC forwarder), so the controller authorizes it as that client.
The
broker-to-controller RPCs (RegisterBroker, BrokerHeartbeats, AlterPartition,
ReportCorruptReplica, AllocateProducerIds) are not the broker's to answer: NOT_CONTROLLER (each
heartbeat on the stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.forwarded_principal import forwarded_metadata

FORWARD_MARGIN_S = 5.0
# Between two forwards of a topic change while no controller is active (an election
# takes about one election timeout).
NO_CONTROLLER_BACKOFF_S = 0.1

# A handler's call context (any request and response types). None where the Kafka
# listener calls a forwarding handler directly (``broker/kafka``): it has no gRPC call.
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_Response = TypeVar("_Response", bound=Message)


class ControllerForwarder(pb_grpc.ControllerServicer):
    def __init__(self, controller_stub: pb_grpc.ControllerStub, *,
                 margin_s: float = FORWARD_MARGIN_S) -> None:
        self._stub = controller_stub
        self._margin_s = margin_s

    def _deadline_s(self, timeout_ms: int) -> float:
        """How long a topic change may take here: its own timeout (Kafka answers by it),
        the margin when the client set none."""
        return timeout_ms / 1000 if timeout_ms > 0 else self._margin_s

    async def _forward_by_deadline(self, rpc: str, request: Message, timeout_ms: int,
                                   unreachable: Callable[[str], _Response]) -> _Response:
        """``rpc`` to the active controller, answered within ``_deadline_s(timeout_ms)``:
        sent again while no controller is active (each says UNAVAILABLE: not taken), and
        ``unreachable(message)`` when the deadline passes with no controller's answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline_s(timeout_ms)
        while True:
            try:
                response: _Response = await getattr(self._stub, rpc)(
                    request, timeout=max(deadline - loop.time(), 0.001), wait_for_ready=True,
                    metadata=forwarded_metadata())
                return response
            except grpc.aio.AioRpcError as e:
                left_s = deadline - loop.time()
                if e.code() != grpc.StatusCode.UNAVAILABLE or left_s <= NO_CONTROLLER_BACKOFF_S:
                    return unreachable(f"controller unreachable: {e.code().name}")
            await asyncio.sleep(NO_CONTROLLER_BACKOFF_S)

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: Context | None
                          ) -> pb.CreateTopicsResponse:
        return await self._forward_by_deadline(
            "CreateTopics", request, request.timeout_ms, lambda m: pb.CreateTopicsResponse(
                topics=[pb.TopicResult(name=t.name, error_code=pb.NOT_CONTROLLER,
                                       error_message=m) for t in request.topics]))

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Context | None
                          ) -> pb.DeleteTopicsResponse:
        return await self._forward_by_deadline(
            "DeleteTopics", request, request.timeout_ms, lambda m: pb.DeleteTopicsResponse(
                topics=[pb.TopicResult(name=name, error_code=pb.NOT_CONTROLLER,
                                       error_message=m) for name in request.names]))

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Context | None
                              ) -> pb.CreatePartitionsResponse:
        return await self._forward_by_deadline(
            "CreatePartitions", request, request.timeout_ms, lambda m: (
                pb.CreatePartitionsResponse(topics=[
                    pb.TopicResult(name=t.name, error_code=pb.NOT_CONTROLLER, error_message=m)
                    for t in request.topics])))

    async def DescribeCluster(self, request: pb.DescribeClusterRequest, context: Context | None
                             ) -> pb.DescribeClusterResponse:
        try:
            described: pb.DescribeClusterResponse = await self._stub.DescribeCluster(
                request, timeout=self._margin_s, wait_for_ready=True,
                metadata=forwarded_metadata())
            return described
        except grpc.aio.AioRpcError:
            return pb.DescribeClusterResponse(error_code=pb.NOT_CONTROLLER)

    async def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Context | None
                            ) -> pb.RegisterBrokerResponse:
        return pb.RegisterBrokerResponse(error_code=pb.NOT_CONTROLLER,
                                         error_message="this is a broker, not the controller")

    async def BrokerHeartbeats(self, request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
                               context: Context) -> None:
        async for _request in request_iterator:
            await context.write(pb.BrokerHeartbeatResponse(error_code=pb.NOT_CONTROLLER))

    async def AlterPartition(self, request: pb.AlterPartitionRequest, context: Context | None
                            ) -> pb.AlterPartitionResponse:
        return pb.AlterPartitionResponse(error_code=pb.NOT_CONTROLLER)

    async def ReportCorruptReplica(self, request: pb.ReportCorruptReplicaRequest, context: Context | None
                                  ) -> pb.ReportCorruptReplicaResponse:
        return pb.ReportCorruptReplicaResponse(error_code=pb.NOT_CONTROLLER)

    # ------------------------------------------------------------ users and ACLs

    async def _forward(self, rpc: str, request: Message,
                       unreachable: Callable[[str], _Response]) -> _Response:
        try:
            response: _Response = await getattr(self._stub, rpc)(
                request, timeout=self._margin_s * 2, wait_for_ready=True,
                metadata=forwarded_metadata())
            return response
        except grpc.aio.AioRpcError as e:
            return unreachable(f"controller unreachable: {e.code().name}")

    async def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest, context: Context | None
                                       ) -> pb.AlterUserScramCredentialsResponse:
        return await self._forward("AlterUserScramCredentials", request, lambda m: (
            pb.AlterUserScramCredentialsResponse(results=[
                pb.UserResult(user=c.user, error_code=pb.NOT_CONTROLLER, error_message=m)
                for c in [*request.upsertions, *request.deletions]])))

    async def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest, context: Context | None
                                          ) -> pb.DescribeUserScramCredentialsResponse:
        return await self._forward("DescribeUserScramCredentials", request, lambda m: (
            pb.DescribeUserScramCredentialsResponse(users=[
                pb.UserMechanisms(user=u, error_code=pb.NOT_CONTROLLER)
                for u in request.users])))

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: Context | None
                        ) -> pb.CreateAclsResponse:
        return await self._forward("CreateAcls", request, lambda m: pb.CreateAclsResponse(
            results=[pb.AclResult(error_code=pb.NOT_CONTROLLER, error_message=m)
                     for _ in request.creations]))

    async def DescribeAcls(self, request: pb.DescribeAclsRequest, context: Context | None
                          ) -> pb.DescribeAclsResponse:
        return await self._forward("DescribeAcls", request, lambda m: pb.DescribeAclsResponse(
            error_code=pb.NOT_CONTROLLER, error_message=m))

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Context | None
                        ) -> pb.DeleteAclsResponse:
        return await self._forward("DeleteAcls", request, lambda m: pb.DeleteAclsResponse(
            results=[pb.DeleteAclsFilterResult(error_code=pb.NOT_CONTROLLER, error_message=m)
                     for _ in request.filters]))

    async def AlterClientQuotas(self, request: pb.AlterClientQuotasRequest, context: Context | None
                                ) -> pb.AlterClientQuotasResponse:
        return await self._forward("AlterClientQuotas", request, lambda m: (
            pb.AlterClientQuotasResponse(results=[
                pb.ClientQuotaAlterResult(error_code=pb.NOT_CONTROLLER, error_message=m,
                                          entity=a.entity) for a in request.alterations])))

    async def DescribeClientQuotas(self, request: pb.DescribeClientQuotasRequest,
                                   context: Context | None) -> pb.DescribeClientQuotasResponse:
        return await self._forward("DescribeClientQuotas", request, lambda m: (
            pb.DescribeClientQuotasResponse(error_code=pb.NOT_CONTROLLER, error_message=m)))

    async def AlterConfigs(self, request: pb.AlterConfigsRequest, context: Context | None
                          ) -> pb.AlterConfigsResponse:
        return await self._forward("AlterConfigs", request, lambda m: pb.AlterConfigsResponse(
            results=[pb.ConfigResourceResult(
                resource_type=r.resource_type, resource_name=r.resource_name,
                error_code=pb.NOT_CONTROLLER, error_message=m) for r in request.resources]))

    async def ElectLeaders(self, request: pb.ElectLeadersRequest, context: Context | None
                          ) -> pb.ElectLeadersResponse:
        return await self._forward("ElectLeaders", request, lambda m: pb.ElectLeadersResponse(
            error_code=pb.NOT_CONTROLLER))

    async def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                          context: Context | None,
                                          ) -> pb.AlterPartitionReassignmentsResponse:
        return await self._forward(
            "AlterPartitionReassignments", request,
            lambda m: pb.AlterPartitionReassignmentsResponse(
                error_code=pb.NOT_CONTROLLER, error_message=m))

    async def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                         context: Context | None,
                                         ) -> pb.ListPartitionReassignmentsResponse:
        return await self._forward(
            "ListPartitionReassignments", request,
            lambda m: pb.ListPartitionReassignmentsResponse(
                error_code=pb.NOT_CONTROLLER, error_message=m))

    async def DescribeQuorum(self, request: pb.DescribeQuorumRequest, context: Context | None,
                             ) -> pb.DescribeQuorumResponse:
        return await self._forward("DescribeQuorum", request,
                                   lambda m: pb.DescribeQuorumResponse(error_code=pb.NOT_CONTROLLER))

    async def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest, context: Context | None
                                 ) -> pb.AllocateProducerIdsResponse:
        return pb.AllocateProducerIdsResponse(error_code=pb.NOT_CONTROLLER)
