"""Which principal may send the controller's broker-facing requests (mutual TLS).

Pure decisions for ``service.py``. With TLS configured the controller's
listener requires a client certificate of the cluster's CA, so every call has
a principal (``proto.tls.Principal``: the certificate's CN and OU). The calls
only a broker makes about itself (RegisterBroker, BrokerHeartbeats,
AlterPartition, ReportCorruptReplica, AllocateProducerIds) are taken only from the ``broker``
certificate whose CN names that broker id (``broker-<id>``): a client
certificate cannot register a broker, nor broker 2's certificate speak for
broker 1. Refused with CLUSTER_AUTHORIZATION_FAILED before the state machine
sees the request, so nothing changes. Admin calls (CreateTopics,
DescribeCluster, ...) need only a certificate of the CA: brokers forward their
clients' admin requests with their own.

The admin calls that change the cluster or read its secrets (CreateTopics,
CreatePartitions, DeleteTopics, user credentials, ACLs: ``MEMBER_ONLY_ADMIN_RPCS``)
are taken only from a cluster member's certificate (a broker or the
controller): clients reach them through a broker, which authorizes the
client's principal against the ACLs first and forwards with its own
certificate. A client certificate sent straight to the controller's port would
otherwise skip the ACLs (and could grant itself any). DescribeCluster stays
open to any certificate of the CA.

Without TLS there are no certificates; with SASL or an authorizer configured,
``access.ControllerGuard`` authenticates every call and checks Kafka's ACL operations
(CLUSTER_ACTION for the brokers' own calls). With neither, every request is taken, as
before (the registration's control token still guards heartbeats, AlterPartition and
ReportCorruptReplica: ``state_machine``); keep the controller's port on a network only
the cluster reaches.
"""

from __future__ import annotations

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.tls import ROLE_BROKER, ROLE_CONTROLLER, Principal, broker_id_of

MEMBER_ONLY_ADMIN_RPCS = frozenset({
    "CreateTopics", "CreatePartitions", "DeleteTopics", "AlterUserScramCredentials",
    "DescribeUserScramCredentials", "CreateAcls", "DescribeAcls", "DeleteAcls",
    "AlterConfigs", "ElectLeaders", "AlterClientQuotas", "DescribeClientQuotas",
    "AlterPartitionReassignments", "ListPartitionReassignments"})


def admin_request_refusal(principal: Principal | None, rpc: str, *,
                          authenticating: bool) -> pb.ErrorCode | None:
    """CLUSTER_AUTHORIZATION_FAILED for a member-only admin call (``MEMBER_ONLY_ADMIN_RPCS``)
    whose certificate is not a broker's or the controller's; None to take it."""
    if not authenticating or rpc not in MEMBER_ONLY_ADMIN_RPCS:
        return None
    if principal is not None and principal.role in (ROLE_BROKER, ROLE_CONTROLLER):
        return None
    return pb.CLUSTER_AUTHORIZATION_FAILED


def broker_request_refusal(principal: Principal | None, broker_id: int, *,
                           authenticating: bool) -> pb.ErrorCode | None:
    """The ErrorCode refusing a broker's request about ``broker_id`` from ``principal``,
    or None to take it. ``authenticating``: the listener requires client certificates."""
    if not authenticating:
        return None
    if principal is None or broker_id_of(principal) != broker_id:
        return pb.CLUSTER_AUTHORIZATION_FAILED
    return None


def refusal_message(principal: Principal | None, broker_id: int) -> str:
    """What the refused broker is told (and what its log shows)."""
    who = "no client certificate" if principal is None else (
        f"certificate CN={principal.name}, OU={principal.role}")
    return f"{who} may not act as broker {broker_id} (needs CN=broker-{broker_id}, OU=broker)"
