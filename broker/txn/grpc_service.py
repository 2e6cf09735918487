"""The transaction RPCs of the ``Broker`` gRPC service: Kafka's transaction APIs in
Tidewater's messages (proto/tidewater.proto, "transactions"), for Tidewater's own
transactional ``Producer``.

One implementation: each RPC calls the function the Kafka listener's handler calls
(``broker/kafka/txn_apis.py``: the same authorization, checks and coordinator calls),
so a transactional id may be used from a Kafka client and a Tidewater client alike (one
fences the other). Errors are the coordinator's, unmapped: gRPC clients all know
PRODUCER_FENCED (Kafka's KIP-588 mapping is for old Kafka request versions only).

``TxnRpcs`` is held by each listener's ``BrokerServicer``; ``allowed`` is the caller's
(operation, resource type, name) -> may, None with security off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidewater.broker.group.coordinator import GroupCoordinator
from tidewater.broker.kafka import txn_apis
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.txn.coordinator import TransactionCoordinator
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import DESCRIBE, TRANSACTIONAL_ID

Allowed = Callable[[int, int, str], bool]  # (operation, resource type, name) -> may


@dataclass(frozen=True)
class _CallServices:
    """``txn_apis.TxnServices`` for one call: the broker's coordinators and its caller's
    rights."""

    txn_coordinator: TransactionCoordinator | None
    group_coordinator: GroupCoordinator | None
    metadata_cache: MetadataCache
    rights: Allowed | None

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        return self.rights is None or self.rights(operation, resource_type, name)


class TxnRpcs:
    def __init__(self, txn_coordinator: TransactionCoordinator | None,
                 group_coordinator: GroupCoordinator | None, metadata_cache: MetadataCache,
                 listener_name: str) -> None:
        self.txn_coordinator = txn_coordinator  # None: a servicer built without one (tests)
        self.group_coordinator = group_coordinator
        self.metadata_cache = metadata_cache
        self.listener_name = listener_name

    def _services(self, allowed: Allowed | None) -> _CallServices:
        return _CallServices(self.txn_coordinator, self.group_coordinator,
                             self.metadata_cache, allowed)

    def list_transactions(self, broker_id: int, rights: Allowed | None
                          ) -> pb.ListTransactionsResponse:
        """Every transactional id coordinated here whose producer is durable, described;
        ids the caller may not DESCRIBE are left out (``rights`` None: security off)."""
        response = pb.ListTransactionsResponse(error_code=pb.NONE, broker_id=broker_id)
        coordinator = self.txn_coordinator
        if coordinator is None:
            return response
        if coordinator.loading():
            response.error_code = pb.COORDINATOR_LOAD_IN_PROGRESS
        for state in coordinator.loaded_states():
            for transactional_id, md in sorted(state.txns.items()):
                cur = md.current
                if cur.producer_epoch < 0:
                    continue  # its first write is not durable yet
                if rights is not None and not rights(DESCRIBE, TRANSACTIONAL_ID,
                                                     transactional_id):
                    continue
                response.transactions.add(
                    transactional_id=transactional_id, state=md.state.kafka_name,
                    producer_id=cur.producer_id, producer_epoch=cur.producer_epoch,
                    timeout_ms=cur.timeout_ms, start_timestamp_ms=cur.start_ms,
                    partitions=[pb.TopicPartitionName(topic=t, partition=p)
                                for t, p in sorted(cur.partitions)])
        return response

    async def find_coordinator(self, request: pb.FindCoordinatorRequest,
                               allowed: Allowed | None) -> pb.FindCoordinatorResponse:
        node = await txn_apis.find_txn_coordinator(self._services(allowed), request.group_id,
                                                   self.listener_name)
        return pb.FindCoordinatorResponse(error_code=node.error_code,
                                          error_message=node.message, node_id=node.node_id,
                                          host=node.host, port=node.port)

    async def init_producer_id(self, request: pb.InitProducerIdRequest,
                               allowed: Allowed | None) -> pb.InitProducerIdResponse:
        code, producer_id, epoch = await txn_apis.init_transactional_producer(
            self._services(allowed), request.transactional_id, request.transaction_timeout_ms,
            request.producer_id, request.producer_epoch)
        return pb.InitProducerIdResponse(error_code=code, producer_id=producer_id,
                                         producer_epoch=epoch)

    async def add_partitions(self, request: pb.AddPartitionsToTxnRequest,
                             allowed: Allowed | None) -> pb.AddPartitionsToTxnResponse:
        codes = await txn_apis.add_partitions_to_txn(
            self._services(allowed), request.transactional_id, request.producer_id,
            request.producer_epoch, [(p.topic, p.partition) for p in request.partitions])
        return pb.AddPartitionsToTxnResponse(partitions=[
            pb.TxnPartition(topic=t, partition=p, error_code=code)
            for (t, p), code in codes.items()])

    async def add_offsets(self, request: pb.AddOffsetsToTxnRequest,
                          allowed: Allowed | None) -> pb.AddOffsetsToTxnResponse:
        code = await txn_apis.add_offsets_to_txn(
            self._services(allowed), request.transactional_id, request.producer_id,
            request.producer_epoch, request.group_id)
        return pb.AddOffsetsToTxnResponse(error_code=code)

    async def txn_offset_commit(self, request: pb.TxnOffsetCommitRequest,
                                allowed: Allowed | None) -> pb.TxnOffsetCommitResponse:
        codes = await txn_apis.txn_offset_commit(
            self._services(allowed), request.transactional_id, request.group_id,
            request.producer_id, request.producer_epoch, request.generation_id,
            request.member_id, request.group_instance_id or None,
            {(o.topic, o.partition): (o.offset, o.leader_epoch, o.metadata)
             for o in request.offsets})
        return pb.TxnOffsetCommitResponse(offsets=[
            pb.GroupOffset(topic=t, partition=p, error_code=code)
            for (t, p), code in codes.items()])

    async def end_txn(self, request: pb.EndTxnRequest,
                      allowed: Allowed | None) -> pb.EndTxnResponse:
        code = await txn_apis.end_txn(self._services(allowed), request.transactional_id,
                                      request.producer_id, request.producer_epoch,
                                      request.committed)
        return pb.EndTxnResponse(error_code=code)
