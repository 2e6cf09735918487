"""Which controller requests a broker takes, and whose fetches may vouch for an ISR member.

Pure decisions (no I/O) that the broker's control path (``control.py``) and the
simulation's broker both run:

- ``controller_request_refusal``: before this broker's registration is answered
  (its epoch is -1: a new process, whose logs may have lost an unflushed tail
  since the controller last saw it) every controller request is refused with
  BROKER_NOT_AVAILABLE, which the broker answers as a transport-level "try again"
  so the controller's sender retries (Kafka's start-up order); then a request
  without the control token the controller handed this registration is
  CLUSTER_AUTHORIZATION_FAILED (checked before any epoch is believed: a forged
  request must not raise the controller epoch this broker takes, which would
  lock the real controller out); then a controller epoch older than the newest
  seen is STALE_CONTROLLER_EPOCH; then a broker epoch
  other than this broker's registered one is STALE_BROKER_EPOCH (-1 is not a
  wildcard: a request meant for no particular incarnation is meant for none).
- ``control_principal_refusal`` (mutual TLS, when the broker has TLS configured):
  the controller's requests (LeaderAndIsr, UpdateMetadata, StopReplica) only
  from a ``controller`` certificate, a follower fetch only from the ``broker``
  certificate naming the replica id it fetches as (``broker-<id>``), a
  transaction coordinator's WriteTxnMarkers and a leader's VerifyTxnPartitions
  (KIP-890) from any ``broker-<id>`` certificate; anything else is CLUSTER_AUTHORIZATION_FAILED before the request
  is looked at.
  Without TLS there are no principals and this rule takes everything (the
  control token above still applies).
- ``client_fetch_refusal``: a fetch on a client-facing path (gRPC ``Broker``, the
  Kafka listener) claiming a replica id is CLUSTER_AUTHORIZATION_FAILED: only cluster
  members fetch as followers, on ``BrokerControl``, and a forged follower fetch
  could move the high watermark past what followers really hold.
- ``is_isr_eligible`` (KIP-903, Kafka's ``isReplicaIsrEligible``): a follower's
  fetch may add it to the ISR only if the last snapshot lists it live, unfenced
  and not shutting down, with exactly the broker epoch the fetch carries.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.tls import ROLE_CONTROLLER, Principal, broker_id_of

UNREGISTERED = -1


def controller_request_refusal(*, registered_epoch: int, controller_epoch_seen: int,
                               request_controller_epoch: int, request_broker_epoch: int | None,
                               token_matches: bool) -> int | None:
    """The ErrorCode refusing a controller request, or None to take it.
    ``request_broker_epoch`` None: the request names no broker (UpdateMetadata).
    ``token_matches``: the request carries this registration's control token."""
    if registered_epoch == UNREGISTERED:
        return pb.BROKER_NOT_AVAILABLE
    if not token_matches:
        return pb.CLUSTER_AUTHORIZATION_FAILED
    if request_controller_epoch < controller_epoch_seen:
        return pb.STALE_CONTROLLER_EPOCH
    if request_broker_epoch is not None and request_broker_epoch != registered_epoch:
        return pb.STALE_BROKER_EPOCH
    return None


CONTROLLER_REQUESTS = frozenset({"LeaderAndIsr", "UpdateMetadata", "StopReplica"})
# A transaction coordinator's markers to a leader; a leader's KIP-890 verification to a
# coordinator.
BROKER_TXN_REQUESTS = frozenset({"WriteTxnMarkers", "VerifyTxnPartitions"})


def control_principal_refusal(rpc: str, principal: Principal | None, *, authenticating: bool,
                              replica_id: int | None = None) -> int | None:
    """The ErrorCode refusing a ``BrokerControl`` call from ``principal``, or None to take it.
    ``authenticating``: the INTERNAL listener requires client certificates (TLS configured).
    ``replica_id``: the follower a ReplicaFetch request fetches as."""
    if not authenticating:
        return None
    if principal is None:
        return pb.CLUSTER_AUTHORIZATION_FAILED
    if rpc in CONTROLLER_REQUESTS:
        return None if principal.role == ROLE_CONTROLLER else pb.CLUSTER_AUTHORIZATION_FAILED
    if rpc in BROKER_TXN_REQUESTS:  # coordinators and leaders run on any broker
        return None if broker_id_of(principal) is not None else pb.CLUSTER_AUTHORIZATION_FAILED
    if rpc == "ReplicaFetch":
        broker_id = broker_id_of(principal)
        if broker_id is not None and broker_id == replica_id:
            return None
        return pb.CLUSTER_AUTHORIZATION_FAILED
    raise ValueError(f"not a BrokerControl call: {rpc!r}")  # a programming error


def client_fetch_refusal(replica_id: int) -> int | None:
    """The ErrorCode refusing a fetch that came in on a client-facing path, or None."""
    return pb.CLUSTER_AUTHORIZATION_FAILED if replica_id >= 0 else None


def is_isr_eligible(alive_broker_epochs: Mapping[int, int] | None, replica_id: int,
                    broker_epoch: int) -> bool:
    """May a fetch from ``replica_id`` carrying ``broker_epoch`` add it to the ISR? Before
    any snapshot nothing is known here (the controller still checks, KIP-903)."""
    if alive_broker_epochs is None:
        return True
    return alive_broker_epochs.get(replica_id) == broker_epoch
