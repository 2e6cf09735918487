"""Who may call the controller when its security is on (``--sasl-mechanisms`` and/or
``--authorizer acl``): the brokers' authentication and Kafka's authorizer rules.

``ControllerGuard`` sits in front of ``service.ControllerService`` as the brokers'
``GuardedControllerForwarder`` sits in front of their forwarder, with the same
authentication (``broker.security.grpc_auth.grpc_session``: a session token this
controller's ``Sasl`` service issued after a SCRAM exchange, or SASL/PLAIN call metadata
where PLAIN is enabled, checked against the users' SCRAM credentials in this
controller's image, else a
client certificate's CN, else ``User:ANONYMOUS``, refused outright with SASL on) and
the same checks per admin call, as Kafka's controller makes them:

==============================  ==================================================
call                            needs
==============================  ==================================================
CreateTopics                    CREATE on the cluster, or on each topic
DeleteTopics                    DELETE on each topic
CreatePartitions                ALTER on each topic
DescribeCluster                 DESCRIBE on the cluster
AlterUserScramCredentials,      ALTER on the cluster
CreateAcls, DeleteAcls
DescribeUserScramCredentials,   DESCRIBE on the cluster
DescribeAcls
AlterClientQuotas               ALTER_CONFIGS on the cluster
DescribeClientQuotas            DESCRIBE_CONFIGS on the cluster
RegisterBroker, heartbeats,     CLUSTER_ACTION on the cluster: a broker principal
AlterPartition,                 (a super user, as Kafka's brokers are), else
ReportCorruptReplica,           CLUSTER_AUTHORIZATION_FAILED and nothing changes
AllocateProducerIds
==============================  ==================================================

Cluster members: a caller with CLUSTER_ACTION on the cluster (a super user, or an
ACL), or one presenting a broker's or the controller's certificate of the cluster's
CA (mutual TLS: ``proto.tls``; such a certificate can only be issued by whoever holds
the CA key). A member may do everything for itself (a broker creating
``__consumer_offsets``).

Forwarded calls: a broker forwards its clients' admin calls and names the client in
the call (``proto.forwarded_principal``); the controller then checks that client,
not the broker, so forwarding is no way around the ACLs. Only a member may name
another principal; anyone else doing so is refused (PERMISSION_DENIED,
CLUSTER_AUTHORIZATION_FAILED), as Kafka refuses an Envelope without CLUSTER_ACTION.

With security off (neither SASL nor an authorizer) the guard is not installed and
every call is taken as before (mutual TLS still restricts what only brokers send:
``authorization``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.grpc_auth import peer_host
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings
from tidewater.broker.servicers.admin_forwarding import Context
from tidewater.broker.servicers.guarded_admin_forwarding import (
    ControllerCalls,
    GuardedControllerForwarder,
)
from tidewater.controller.metadata import ClusterMetadata
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, Acl
from tidewater.proto.forwarded_principal import forwarded_of
from tidewater.proto.scram import MECHANISMS, ScramCredential
from tidewater.proto.tls import ROLE_BROKER, ROLE_CONTROLLER, principal_of

log = logging.getLogger(__name__)

# A principal no SASL user or client certificate can have (those are all "User:..."):
# a caller presenting a member certificate of the cluster's CA.
MEMBER_PREFIX = "ClusterMember:"


class ImageUsersAndAcls:
    """``settings.UsersAndAcls`` read from the controller's own image."""

    def __init__(self, metadata: Callable[[], ClusterMetadata]):
        self._metadata = metadata
        self._acls: tuple[Acl, ...] = ()
        self._acls_offset: int | None = None

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._metadata().security.credentials.get((user, mechanism))

    def user_credentials(self, user: str) -> list[ScramCredential]:
        credentials = self._metadata().security.credentials
        return [c for m in MECHANISMS if (c := credentials.get((user, m))) is not None]

    def scram_iterations(self, mechanism: str) -> list[int]:
        credentials = self._metadata().security.credentials
        return [c.iterations for (_, m), c in credentials.items() if m == mechanism]

    def acls(self) -> tuple[Acl, ...]:
        # The same tuple while nothing was appended: BrokerSecurity rebuilds its
        # Authorizer only when this object changes.
        metadata = self._metadata()
        if self._acls_offset != metadata.last_offset:
            acls = tuple(sorted(metadata.security.acls, key=repr))
            if acls != self._acls:
                self._acls = acls
            self._acls_offset = metadata.last_offset
        return self._acls


def controller_security(settings: SecuritySettings,
                        metadata: Callable[[], ClusterMetadata]) -> BrokerSecurity:
    return BrokerSecurity(settings, ImageUsersAndAcls(metadata))


class ControllerGuard(GuardedControllerForwarder):
    def __init__(self, inner: ControllerCalls, security: BrokerSecurity) -> None:
        super().__init__(inner, security)

    async def _authenticated(self, context: Context) -> Session:
        certificate = principal_of({k: list(v) for k, v in context.auth_context().items()})
        if certificate is not None and certificate.role in (ROLE_BROKER, ROLE_CONTROLLER):
            return Session(MEMBER_PREFIX + certificate.name, peer_host(context.peer() or ""))
        return await super()._authenticated(context)

    def _is_member(self, session: Session) -> bool:
        return (session.principal.startswith(MEMBER_PREFIX)
                or self._security.allows(session, CLUSTER_ACTION, CLUSTER, CLUSTER_NAME))

    def _may(self, session: Session, operation: int, resource_type: int, name: str) -> bool:
        return (session.principal.startswith(MEMBER_PREFIX)
                or super()._may(session, operation, resource_type, name))

    async def _session(self, context: Context) -> Session:
        caller = await self._authenticated(context)
        try:
            forwarded = forwarded_of(context.invocation_metadata() or ())
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"INVALID_REQUEST: {e}")
            raise  # abort raises; this keeps type checkers sure
        if forwarded is None:
            return caller
        if not self._is_member(caller):
            log.warning("refused a call from %s forwarded for %s: not a cluster member",
                        caller.principal, forwarded[0])
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "CLUSTER_AUTHORIZATION_FAILED: only a cluster member (CLUSTER_ACTION "
                                "on the cluster) may make a call for another principal")
        return Session(*forwarded)

    async def _broker_refusal(self, context: Context, rpc: str) -> str | None:
        """Why ``rpc`` (a broker's own request) is refused to this caller, or None."""
        caller = await self._authenticated(context)
        if self._is_member(caller):
            return None
        log.warning("%s refused: %s lacks CLUSTER_ACTION on the cluster", rpc, caller.principal)
        return (f"CLUSTER_AUTHORIZATION_FAILED: {rpc} needs CLUSTER_ACTION on the cluster "
                f"(a broker's principal); {caller.principal} lacks it")

    # ------------------------------------------------------------ what brokers send

    async def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Context
                             ) -> pb.RegisterBrokerResponse:
        if refusal := await self._broker_refusal(context, "RegisterBroker"):
            return pb.RegisterBrokerResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                                             error_message=refusal, broker_epoch=-1)
        return await self._inner.RegisterBroker(request, context)

    async def BrokerHeartbeats(self, request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
                               context: Context) -> None:
        if await self._broker_refusal(context, "BrokerHeartbeats"):
            async for _request in request_iterator:  # each answered, none taken
                await context.write(pb.BrokerHeartbeatResponse(
                    error_code=pb.CLUSTER_AUTHORIZATION_FAILED, is_fenced=True))
            return
        await self._inner.BrokerHeartbeats(request_iterator, context)

    async def AlterPartition(self, request: pb.AlterPartitionRequest, context: Context
                             ) -> pb.AlterPartitionResponse:
        if await self._broker_refusal(context, "AlterPartition"):
            return pb.AlterPartitionResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.AlterPartition(request, context)

    async def ReportCorruptReplica(self, request: pb.ReportCorruptReplicaRequest,
                                   context: Context) -> pb.ReportCorruptReplicaResponse:
        if await self._broker_refusal(context, "ReportCorruptReplica"):
            return pb.ReportCorruptReplicaResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.ReportCorruptReplica(request, context)

    async def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest,
                                  context: Context) -> pb.AllocateProducerIdsResponse:
        if await self._broker_refusal(context, "AllocateProducerIds"):
            return pb.AllocateProducerIdsResponse(error_code=pb.CLUSTER_AUTHORIZATION_FAILED)
        return await self._inner.AllocateProducerIds(request, context)
