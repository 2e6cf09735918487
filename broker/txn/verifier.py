"""The partition leader's call to the transaction coordinator for KIP-890 verification
(Kafka's ``AddPartitionsToTxnManager``; the rules are ``verification.py``'s).

``TxnPartitionVerifier.verify(transactional_id, producer_id, producer_epoch,
partitions)`` finds the id's coordinator (the leader of its ``__transaction_state``
partition in the metadata cache) and asks it whether each partition is in the
producer's ongoing transaction: in process when this broker is the coordinator
(``TransactionCoordinator.verify_partitions``), else over the coordinator's INTERNAL
gRPC (``BrokerControl.VerifyTxnPartitions``) on the channel the marker sender keeps to
that broker, with what it presents (the broker's certificate; with SASL the
inter-broker credentials, and the coordinator requires CLUSTER_ACTION, as for
WriteTxnMarkers). It never raises for the coordinator's sake: no leader known is
COORDINATOR_NOT_AVAILABLE, a transport failure NETWORK_EXCEPTION (both answered to the
producer as the retriable NOT_ENOUGH_REPLICAS).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import grpc

from tidewater.broker.coordination.partitioned import partition_for
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.storage.topics import TRANSACTION_STATE_TOPIC
from tidewater.broker.txn.coordinator import TransactionCoordinator
from tidewater.broker.txn.verification import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import TidewaterError

log = logging.getLogger("tidewater.broker.txn")

VERIFY_REQUEST_TIMEOUT_MS = 5000  # the produce waits for this answer


class TxnPartitionVerifier:
    def __init__(self, *, broker_id: int, coordinator: TransactionCoordinator,
                 metadata_cache: MetadataCache,
                 remote_stub: Callable[[int], Awaitable[pb_grpc.BrokerControlStub]],
                 call_metadata: tuple[tuple[str, str], ...] = (),
                 request_timeout_ms: int = VERIFY_REQUEST_TIMEOUT_MS):
        """``remote_stub``: another broker's BrokerControl (``LeaderMarkerSender.
        remote_stub``); ``call_metadata``: the inter-broker SASL credentials."""
        self._broker_id = broker_id
        self._coordinator = coordinator
        self._metadata_cache = metadata_cache
        self._remote_stub = remote_stub
        self._call_metadata = call_metadata
        self._request_timeout_ms = request_timeout_ms

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[TopicPartition]) -> dict[TopicPartition, pb.ErrorCode]:
        index = partition_for(transactional_id, self._coordinator.partition_count())
        state = self._metadata_cache.partition_state(TRANSACTION_STATE_TOPIC, index)
        if state is None or state.leader < 0 or state.offline:
            return {tp: pb.COORDINATOR_NOT_AVAILABLE for tp in partitions}
        if state.leader == self._broker_id:
            return self._coordinator.verify_partitions(transactional_id, producer_id,
                                                       producer_epoch, partitions)
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch,
            partitions=[pb.TxnPartition(topic=t, partition=p) for t, p in partitions])
        try:
            stub = await self._remote_stub(state.leader)
            response = await stub.VerifyTxnPartitions(
                request, timeout=self._request_timeout_ms / 1000,
                metadata=self._call_metadata or None)
        except (grpc.RpcError, TidewaterError) as e:
            log.info("verifying %r with coordinator %d: %s", transactional_id, state.leader,
                     e)
            return {tp: pb.NETWORK_EXCEPTION for tp in partitions}
        codes = {(p.topic, p.partition): p.error_code for p in response.partitions}
        return {tp: codes.get(tp, pb.UNKNOWN_SERVER_ERROR) for tp in partitions}
