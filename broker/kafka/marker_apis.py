"""Kafka's WriteTxnMarkers (key 27): a transaction coordinator asks this broker, as
the partitions' leader, to end a transaction with COMMIT or ABORT markers.

Versions 0-2 (v1 flexible; v2 adds ``transaction_version``, KIP-890, which
changes nothing here). ``kio`` dropped v0 with Kafka 4: its schema is in
``schemas/`` (v1's fields, not flexible). Each marker's partitions go to ``ReplicaManager.txn_markers``
(``broker/serving/txn_markers.py``, acks=all: answered once committed); its
per-partition error codes are the answer. With an authorizer the caller needs
CLUSTER_ACTION on the cluster (Kafka's rule: only brokers write markers);
refused: CLUSTER_AUTHORIZATION_FAILED for every partition, nothing written.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.serving.txn_markers import TxnMarkerEntry, TxnMarkerResult
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSIONS = (0, 2)


class MarkerServices(Protocol):
    @property
    def replica_manager(self) -> ReplicaManager: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _entries(body: RequestBody) -> list[TxnMarkerEntry]:
    return [TxnMarkerEntry(int(m.producer_id), int(m.producer_epoch), int(m.coordinator_epoch),
                           bool(m.transaction_result),
                           tuple((t.name, int(p)) for t in m.topics
                                 for p in t.partition_indexes))
            for m in body.markers]


def write_txn_markers_values(entries: list[TxnMarkerEntry],
                             results: list[TxnMarkerResult]) -> dict[str, Any]:
    """Kafka's nesting: per marker (producer id), per topic, per partition; ``results``
    are in the order of ``entries``' partitions."""
    answers = iter(results)
    markers = []
    for entry in entries:
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition in entry.partitions:
            result = next(answers)
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "error_code": result.error_code})
        markers.append({"producer_id": entry.producer_id, "topics": [
            {"name": name, "partitions": parts} for name, parts in topics.items()]})
    return {"markers": markers}


async def on_write_txn_markers(s: MarkerServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    entries = _entries(body)
    if not s.allowed(CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
        refused = [TxnMarkerResult(e.producer_id, t, p, pb.CLUSTER_AUTHORIZATION_FAILED)
                   for e in entries for t, p in e.partitions]

        async def refuse() -> dict[str, Any]:
            return write_txn_markers_values(entries, refused)
        return refuse()

    async def answer() -> dict[str, Any]:
        results = await s.replica_manager.txn_markers.write_txn_markers(entries)
        return write_txn_markers_values(entries, results)
    return answer()
