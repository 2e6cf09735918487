"""Kafka's InitProducerId (key 22): idempotent producers from the broker's id blocks (the
same path as gRPC's); transactional ones from the transaction coordinator.

Versions 0-5: Kafka 3.x's InitProducerIdRequest.json has 0-4 (v1 = v0, v2+
flexible, v3+ carry the producer's current id and epoch, v4 lets transactions
answer PRODUCER_FENCED); Kafka 4.0's v5 only adds TRANSACTION_ABORTABLE for
transactions, so an idempotent producer's request and answer are the same; v6
(two-phase commit) is not served. librdkafka takes the highest it knows (v4 in
2.16), kafka-python 3.x and aiokafka ask with v0 and v1 as they negotiate. The answer comes from
``ReplicaManager.init_producer_id`` (``broker/serving/producer_ids.py``): a new id with epoch 0,
COORDINATOR_LOAD_IN_PROGRESS (retriable)
while the broker has no id block from the controller yet. With an authorizer the
caller needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679), else
CLUSTER_AUTHORIZATION_FAILED. A request with a transactional id goes to the
transaction coordinator (``txn_apis.on_init_transactional_producer``: WRITE on the
TRANSACTIONAL_ID instead).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.security.settings import may_init_producer_id
from tidewater.proto import tidewater_pb2 as pb

if TYPE_CHECKING:
    from tidewater.broker.group.coordinator import GroupCoordinator
    from tidewater.broker.txn.coordinator import TransactionCoordinator

INIT_PRODUCER_ID = 22
INIT_PRODUCER_ID_VERSIONS = (0, 5)


class ProducerIdServices(Protocol):
    """What InitProducerId reaches of ``apis.Services``."""

    @property
    def replica_manager(self) -> ReplicaManager: ...

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None: ...

    @property
    def group_coordinator(self) -> GroupCoordinator | None: ...

    @property
    def metadata_cache(self) -> MetadataCache: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...

    def allowed_on_any(self, operation: int, resource_type: int) -> bool: ...


async def on_init_producer_id(s: ProducerIdServices, head: RequestHead, body: RequestBody
                              ) -> Awaitable[dict[str, Any]]:
    if body.transactional_id:
        # Imported here: the transaction APIs wait for their first use (coordinators.py).
        from tidewater.broker.kafka.txn_apis import on_init_transactional_producer
        return on_init_transactional_producer(s, head, body)
    if not may_init_producer_id(s.allowed, s.allowed_on_any):
        async def refused() -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                    "producer_id": -1, "producer_epoch": -1}
        return refused()
    request = pb.InitProducerIdRequest(
        transactional_id=body.transactional_id or "",
        producer_id=int(getattr(body, "producer_id", -1)),
        producer_epoch=int(getattr(body, "producer_epoch", -1)))

    async def answer() -> dict[str, Any]:
        response = await s.replica_manager.init_producer_id(request)
        return {"throttle_time": 0, "error_code": response.error_code,
                "producer_id": response.producer_id, "producer_epoch": response.producer_epoch}
    return answer()
