"""The ``Controller`` service with authentication and ACL checks in front of a broker's
``forwarding.ControllerForwarder`` (on brokers whose security is on), and, through
``controller.access.ControllerGuard``, of the controller's own service.

Who the caller is: ``grpc_security.grpc_session``. What each call needs (Kafka's
rules, as the Kafka listener applies them): CreateTopics CREATE on the cluster or
the topic, DeleteTopics DELETE on the topic, CreatePartitions ALTER on the topic
(refused topics: TOPIC_AUTHORIZATION_FAILED, the rest forwarded);
DescribeCluster DESCRIBE on the cluster; AlterUserScramCredentials, CreateAcls and
DeleteAcls ALTER on the cluster, DescribeUserScramCredentials and DescribeAcls
DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED, nothing forwarded);
AlterConfigs ALTER_CONFIGS on each topic (brokers: the cluster), AlterPartitionReassignments
ALTER and ListPartitionReassignments DESCRIBE on the cluster, ElectLeaders ALTER on
the cluster, DescribeQuorum DESCRIBE on the cluster. The
broker-to-controller calls are the forwarder's to refuse (NOT_CONTROLLER).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableSequence
from typing import Protocol, TypeVar

import grpc

from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.settings import BrokerSecurity
from tidewater.broker.servicers.admin_forwarding import Context
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.acls import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    TOPIC,
)
from tidewater.proto.forwarded_principal import FORWARDED
from tidewater.proto.scram import SaslAuthenticationError

TOPIC_RESOURCE = 2  # Kafka's ConfigResource type of a topic
_CLUSTER_DENIED = "CLUSTER_AUTHORIZATION_FAILED: needs {op} on the cluster"
# The answers with a per-topic result list, and one item of a request's topic list.
_TopicsResponse = TypeVar("_TopicsResponse", pb.CreateTopicsResponse, pb.DeleteTopicsResponse,
                          pb.CreatePartitionsResponse)
_Item = TypeVar("_Item")


class ControllerCalls(Protocol):
    """What a guard sits in front of: a broker's ``ControllerForwarder``, or the
    controller's own ``ControllerService`` (``controller.access``)."""

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: Context
                           ) -> pb.CreateTopicsResponse: ...

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Context
                           ) -> pb.DeleteTopicsResponse: ...

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Context
                               ) -> pb.CreatePartitionsResponse: ...

    async def DescribeCluster(self, request: pb.DescribeClusterRequest, context: Context
                              ) -> pb.DescribeClusterResponse: ...

    async def AlterConfigs(self, request: pb.AlterConfigsRequest, context: Context
                           ) -> pb.AlterConfigsResponse: ...

    async def ElectLeaders(self, request: pb.ElectLeadersRequest, context: Context
                           ) -> pb.ElectLeadersResponse: ...

    async def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                          context: Context,
                                          ) -> pb.AlterPartitionReassignmentsResponse: ...

    async def DescribeQuorum(self, request: pb.DescribeQuorumRequest, context: Context,
                             ) -> pb.DescribeQuorumResponse: ...

    async def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                         context: Context,
                                         ) -> pb.ListPartitionReassignmentsResponse: ...

    async def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest,
                                        context: Context
                                        ) -> pb.AlterUserScramCredentialsResponse: ...

    async def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest,
                                           context: Context
                                           ) -> pb.DescribeUserScramCredentialsResponse: ...

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: Context
                         ) -> pb.CreateAclsResponse: ...

    async def DescribeAcls(self, request: pb.DescribeAclsRequest, context: Context
                           ) -> pb.DescribeAclsResponse: ...

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Context
                         ) -> pb.DeleteAclsResponse: ...

    async def AlterClientQuotas(self, request: pb.AlterClientQuotasRequest, context: Context
                                ) -> pb.AlterClientQuotasResponse: ...

    async def DescribeClientQuotas(self, request: pb.DescribeClientQuotasRequest,
                                   context: Context) -> pb.DescribeClientQuotasResponse: ...

    async def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Context
                             ) -> pb.RegisterBrokerResponse: ...

    async def BrokerHeartbeats(self, request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
                               context: Context) -> None: ...

    async def AlterPartition(self, request: pb.AlterPartitionRequest, context: Context
                             ) -> pb.AlterPartitionResponse: ...

    async def ReportCorruptReplica(self, request: pb.ReportCorruptReplicaRequest,
                                   context: Context) -> pb.ReportCorruptReplicaResponse: ...

    async def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest,
                                  context: Context) -> pb.AllocateProducerIdsResponse: ...


class GuardedControllerForwarder(pb_grpc.ControllerServicer):
    def __init__(self, inner: ControllerCalls, security: BrokerSecurity) -> None:
        self._inner = inner
        self._security = security  # broker.security.BrokerSecurity

    async def _authenticated(self, context: Context) -> Session:
        """Who the caller is (``BrokerSecurity.grpc_session``); aborts UNAUTHENTICATED."""
        try:
            return await self._security.authenticate_grpc(context)
        except SaslAuthenticationError as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"SASL_AUTHENTICATION_FAILED: {e}")
            raise  # abort raises; this keeps type checkers sure

    async def _session(self, context: Context) -> Session:
        """Whom the call is checked as; the controller names that client when this broker
        forwards the call (``proto.forwarded_principal``), so it checks the same one."""
        session = await self._authenticated(context)
        FORWARDED.set((session.principal, session.host))
        return session

    def _may(self, session: Session, operation: int, resource_type: int, name: str) -> bool:
        return self._security.allows(session, operation, resource_type, name)

    async def _cluster(self, context: Context, operation: int) -> bool:
        return self._may(await self._session(context), operation, CLUSTER, CLUSTER_NAME)

    # ------------------------------------------------------------ topics

    async def _topics(self, forward: Callable[[], Awaitable[_TopicsResponse]], context: Context,
                      repeated: MutableSequence[_Item], name_of: Callable[[_Item], str],
                      operation: int, refusal: str, empty: _TopicsResponse) -> _TopicsResponse:
        """Forward (``forward()``) the topics the caller may ``operation``; the rest are
        refused TOPIC_AUTHORIZATION_FAILED. ``repeated``: the request's topic list."""
        session = await self._session(context)
        denied = list(dict.fromkeys(name_of(t) for t in repeated
                                    if not self._may(session, operation, TOPIC, name_of(t))))
        kept = [t for t in repeated if name_of(t) not in denied]
        del repeated[:]
        repeated.extend(kept)
        response = await forward() if kept else empty
        response.topics.extend(pb.TopicResult(
            name=n, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
            error_message=refusal.format(name=n)) for n in denied)
        return response

    async def CreateTopics(self, request: pb.CreateTopicsRequest, context: Context
                          ) -> pb.CreateTopicsResponse:
        session = await self._session(context)
        if self._may(session, CREATE, CLUSTER, CLUSTER_NAME):
            return await self._inner.CreateTopics(request, context)
        return await self._topics(lambda: self._inner.CreateTopics(request, context), context,
                                  request.topics,
                                  lambda t: t.name, CREATE,
                                  "needs CREATE on the cluster or the topic",
                                  pb.CreateTopicsResponse())

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Context
                          ) -> pb.DeleteTopicsResponse:
        return await self._topics(lambda: self._inner.DeleteTopics(request, context), context,
                                  request.names,
                                  lambda n: n, DELETE, "needs DELETE on topic {name!r}",
                                  pb.DeleteTopicsResponse())

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Context
                              ) -> pb.CreatePartitionsResponse:
        return await self._topics(lambda: self._inner.CreatePartitions(request, context),
                                  context, request.topics,
                                  lambda t: t.name, ALTER, "needs ALTER on topic {name!r}",
                                  pb.CreatePartitionsResponse())

    async def DescribeCluster(self, request: pb.DescribeClusterRequest, context: Context
                             ) -> pb.DescribeClusterResponse:
        if not await self._cluster(context, DESCRIBE):
            return pb.DescribeClusterResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.DescribeCluster(request, context)

    async def AlterConfigs(self, request: pb.AlterConfigsRequest, context: Context
                          ) -> pb.AlterConfigsResponse:
        """ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or, for a broker
        resource, on the cluster (CLUSTER_AUTHORIZATION_FAILED); the rest is forwarded."""
        session = await self._session(context)
        kept = pb.AlterConfigsRequest(validate_only=request.validate_only,
                                      incremental=request.incremental)
        refused: list[pb.ConfigResourceResult] = []
        for r in request.resources:
            topic = r.resource_type == TOPIC_RESOURCE
            if self._may(session, ALTER_CONFIGS, TOPIC if topic else CLUSTER,
                         r.resource_name if topic else CLUSTER_NAME):
                kept.resources.append(r)
            else:
                refused.append(pb.ConfigResourceResult(
                    resource_type=r.resource_type, resource_name=r.resource_name,
                    error_code=pb.TOPIC_AUTHORIZATION_FAILED if topic
                    else pb.CLUSTER_AUTHORIZATION_FAILED,
                    error_message="needs ALTER_CONFIGS on the " +
                                  ("topic" if topic else "cluster")))
        response = (await self._inner.AlterConfigs(kept, context) if kept.resources
                    else pb.AlterConfigsResponse())
        response.results.extend(refused)
        return response

    async def ElectLeaders(self, request: pb.ElectLeadersRequest, context: Context
                          ) -> pb.ElectLeadersResponse:
        if not await self._cluster(context, ALTER):
            return pb.ElectLeadersResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.ElectLeaders(request, context)

    async def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                          context: Context,
                                          ) -> pb.AlterPartitionReassignmentsResponse:
        if not await self._cluster(context, ALTER):
            return pb.AlterPartitionReassignmentsResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                error_message=_CLUSTER_DENIED.format(op="ALTER"))
        return await self._inner.AlterPartitionReassignments(request, context)

    async def DescribeQuorum(self, request: pb.DescribeQuorumRequest, context: Context,
                             ) -> pb.DescribeQuorumResponse:
        if not await self._cluster(context, DESCRIBE):
            return pb.DescribeQuorumResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.DescribeQuorum(request, context)

    async def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                         context: Context,
                                         ) -> pb.ListPartitionReassignmentsResponse:
        if not await self._cluster(context, DESCRIBE):
            return pb.ListPartitionReassignmentsResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                error_message=_CLUSTER_DENIED.format(op="DESCRIBE"))
        return await self._inner.ListPartitionReassignments(request, context)

    # ------------------------------------------------------------ users and ACLs

    async def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest, context: Context
                                       ) -> pb.AlterUserScramCredentialsResponse:
        if not await self._cluster(context, ALTER):
            return pb.AlterUserScramCredentialsResponse(results=[
                pb.UserResult(user=c.user, error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                              error_message=_CLUSTER_DENIED.format(op="ALTER"))
                for c in [*request.upsertions, *request.deletions]])
        return await self._inner.AlterUserScramCredentials(request, context)

    async def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest, context: Context
                                          ) -> pb.DescribeUserScramCredentialsResponse:
        if not await self._cluster(context, DESCRIBE):
            return pb.DescribeUserScramCredentialsResponse(users=[
                pb.UserMechanisms(user=u, error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
                for u in request.users or ["*"]])
        return await self._inner.DescribeUserScramCredentials(request, context)

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: Context
                        ) -> pb.CreateAclsResponse:
        if not await self._cluster(context, ALTER):
            return pb.CreateAclsResponse(results=[
                pb.AclResult(error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                             error_message=_CLUSTER_DENIED.format(op="ALTER"))
                for _ in request.creations])
        return await self._inner.CreateAcls(request, context)

    async def DescribeAcls(self, request: pb.DescribeAclsRequest, context: Context
                          ) -> pb.DescribeAclsResponse:
        if not await self._cluster(context, DESCRIBE):
            return pb.DescribeAclsResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                                           error_message=_CLUSTER_DENIED.format(op="DESCRIBE"))
        return await self._inner.DescribeAcls(request, context)

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Context
                        ) -> pb.DeleteAclsResponse:
        if not await self._cluster(context, ALTER):
            return pb.DeleteAclsResponse(results=[
                pb.DeleteAclsFilterResult(error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                                          error_message=_CLUSTER_DENIED.format(op="ALTER"))
                for _ in request.filters])
        return await self._inner.DeleteAcls(request, context)

    # ------------------------------------------------------------ client quotas (Kafka's rules)

    async def AlterClientQuotas(self, request: pb.AlterClientQuotasRequest, context: Context
                               ) -> pb.AlterClientQuotasResponse:
        if not await self._cluster(context, ALTER_CONFIGS):
            return pb.AlterClientQuotasResponse(results=[
                pb.ClientQuotaAlterResult(error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                                          error_message=_CLUSTER_DENIED.format(op="ALTER_CONFIGS"),
                                          entity=a.entity) for a in request.alterations])
        return await self._inner.AlterClientQuotas(request, context)

    async def DescribeClientQuotas(self, request: pb.DescribeClientQuotasRequest,
                                   context: Context) -> pb.DescribeClientQuotasResponse:
        if not await self._cluster(context, DESCRIBE_CONFIGS):
            return pb.DescribeClientQuotasResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                error_message=_CLUSTER_DENIED.format(op="DESCRIBE_CONFIGS"))
        return await self._inner.DescribeClientQuotas(request, context)

    # ------------------------------------------------------------ not the broker's

    async def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Context
                            ) -> pb.RegisterBrokerResponse:
        return await self._inner.RegisterBroker(request, context)

    async def BrokerHeartbeats(self, request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
                               context: Context) -> None:
        return await self._inner.BrokerHeartbeats(request_iterator, context)

    async def AlterPartition(self, request: pb.AlterPartitionRequest, context: Context
                            ) -> pb.AlterPartitionResponse:
        return await self._inner.AlterPartition(request, context)

    async def ReportCorruptReplica(self, request: pb.ReportCorruptReplicaRequest, context: Context
                                  ) -> pb.ReportCorruptReplicaResponse:
        return await self._inner.ReportCorruptReplica(request, context)

    async def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest, context: Context
                                  ) -> pb.AllocateProducerIdsResponse:
        return await self._inner.AllocateProducerIds(request, context)
