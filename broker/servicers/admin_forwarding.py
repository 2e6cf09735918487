"""The broker's ``Controller`` service: forwards admin calls to the controller.

Clients need only a bootstrap broker: CreateTopics, DeleteTopics,
CreatePartitions, DescribeCluster, AlterConfigs, ElectLeaders, the partition
reassignment calls and the user and ACL
calls (AlterUserScramCredentials, DescribeUserScramCredentials, CreateAcls,
DescribeAcls, DeleteAcls) go to the controller unchanged and its answer comes back
unchanged. A call waits (``wait_for_ready``) for the controller connection up
to its timeout plus ``FORWARD_MARGIN_S``, so a controller restart is ridden
out; when it still cannot be reached every item answers NOT_CONTROLLER
(retriable) with the transport error as message. Each forwarded call names the
client it is made for (``proto.forwarded_principal``: set by the Kafka listener
and the guarded gRPC forwarder), so the controller authorizes it as that client.
The
broker-to-controller RPCs (RegisterBroker, BrokerHeartbeats, AlterPartition,
ReportCorruptReplica, AllocateProducerIds) are not the broker's to answer: NOT_CONTROLLER (each
heartbeat on the stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.forwarded_principal import forwarded_metadata

FORWARD_MARGIN_S = 5.0

# A handler's call context (any request and response types). None where the Kafka
# listener calls a forwarding handler directly (``broker/kafka``): it has no gRPC call.
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_Response = TypeVar("_Response", bound=Message)


class ControllerForwarder(pb_grpc.ControllerServicer):
    def __init__(self, controller_stub: pb_grpc.ControllerStub, *,
                 margin_s: float = FORWARD_MARGIN_S) -> None:
        self._stub = controller_stub
        self._margin_s = margin_s

    def _timeout_s(self, timeout_ms: int) -> float:
        return max(timeout_ms, 0) / 1000 + self._margin_s

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: Context | None
                          ) -> pb.CreateTopicsResponse:
        try:
            created: pb.CreateTopicsResponse = await self._stub.CreateTopics(
                request, timeout=self._timeout_s(request.timeout_ms), wait_for_ready=True,
                metadata=forwarded_metadata())
            return created
        except grpc.aio.AioRpcError as e:
            message = f"controller unreachable: {e.code().name}"
            return pb.CreateTopicsResponse(topics=[
                pb.TopicResult(name=t.name, error_code=pb.NOT_CONTROLLER, error_message=message)
                for t in request.topics])

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Context | None
                          ) -> pb.DeleteTopicsResponse:
        try:
            deleted: pb.DeleteTopicsResponse = await self._stub.DeleteTopics(
                request, timeout=self._timeout_s(request.timeout_ms), wait_for_ready=True,
                metadata=forwarded_metadata())
            return deleted
        except grpc.aio.AioRpcError as e:
            message = f"controller unreachable: {e.code().name}"
            return pb.DeleteTopicsResponse(topics=[
                pb.TopicResult(name=name, error_code=pb.NOT_CONTROLLER, error_message=message)
                for name in request.names])

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Context | None
                              ) -> pb.CreatePartitionsResponse:
        try:
            created: pb.CreatePartitionsResponse = await self._stub.CreatePartitions(
                request, timeout=self._timeout_s(request.timeout_ms), wait_for_ready=True,
                metadata=forwarded_metadata())
            return created
        except grpc.aio.AioRpcError as e:
            message = f"controller unreachable: {e.code().name}"
            return pb.CreatePartitionsResponse(topics=[
                pb.TopicResult(name=t.name, error_code=pb.NOT_CONTROLLER, error_message=message)
                for t in request.topics])

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
