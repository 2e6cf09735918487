"""Kafka's partition reassignment APIs (KIP-455), forwarded to the controller.

AlterPartitionReassignments (key 45) v0-1 and ListPartitionReassignments (key 46) v0
(all flexible). Each partition of an AlterPartitionReassignments becomes one item of
the controller's ``AlterPartitionReassignments`` (a null replica list: cancel); the
rules and per-partition errors are ``controller/reassignment.py``'s. v1's
``allow_replication_factor_change`` false makes a target of another size
INVALID_REPLICATION_FACTOR. ListPartitionReassignments lists the ongoing ones (null
topics: all). Alter needs ALTER on the cluster, list DESCRIBE on the cluster:
CLUSTER_AUTHORIZATION_FAILED otherwise (top level), as Kafka's.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE

ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS = 45, 46
SUPPORTED = {ALTER_PARTITION_REASSIGNMENTS: (0, 1), LIST_PARTITION_REASSIGNMENTS: (0, 0)}
API_NAMES = {ALTER_PARTITION_REASSIGNMENTS: "AlterPartitionReassignments",
             LIST_PARTITION_REASSIGNMENTS: "ListPartitionReassignments"}


class ReassignServices(Protocol):
    """What these APIs reach of ``apis.Services``."""

    @property
    def controller(self) -> ControllerForwarder: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


async def _now(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _by_topic(results: Any) -> list[dict[str, Any]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        grouped.setdefault(r.topic, []).append({
            "partition_index": r.partition, "error_code": r.error_code,
            "error_message": r.error_message or None})
    return [{"name": name, "partitions": parts} for name, parts in grouped.items()]


async def on_alter_partition_reassignments(s: ReassignServices, head: RequestHead,
                                           body: RequestBody) -> Awaitable[dict[str, Any]]:
    request = pb.AlterPartitionReassignmentsRequest(
        timeout_ms=milliseconds(body.timeout),
        keep_replication_factor=not getattr(body, "allow_replication_factor_change", True))
    for t in body.topics:
        for p in t.partitions:
            request.partitions.add(topic=t.name, partition=p.partition_index,
                                   replicas=list(p.replicas or ()), cancel=p.replicas is None)
    if not s.allowed(ALTER, CLUSTER, CLUSTER_NAME):
        return _now({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                     "error_message": "needs ALTER on the cluster", "responses": []})

    async def answer() -> dict[str, Any]:
        response = await s.controller.AlterPartitionReassignments(request, None)
        return {"throttle_time": 0, "error_code": response.error_code,
                "error_message": response.error_message or None,
                "responses": _by_topic(response.results)}
    return answer()


async def on_list_partition_reassignments(s: ReassignServices, head: RequestHead,
                                          body: RequestBody) -> Awaitable[dict[str, Any]]:
    request = pb.ListPartitionReassignmentsRequest(all_partitions=body.topics is None)
    for t in body.topics or ():
        for number in t.partition_indexes:
            request.partitions.add(topic=t.name, partition=number)
    if not s.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
        return _now({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                     "error_message": "needs DESCRIBE on the cluster", "topics": []})

    async def answer() -> dict[str, Any]:
        response = await s.controller.ListPartitionReassignments(request, None)
        grouped: dict[str, list[dict[str, Any]]] = {}
        for r in response.reassignments:
            grouped.setdefault(r.topic, []).append({
                "partition_index": r.partition, "replicas": list(r.replicas),
                "adding_replicas": list(r.adding_replicas),
                "removing_replicas": list(r.removing_replicas)})
        return {"throttle_time": 0, "error_code": response.error_code,
                "error_message": response.error_message or None,
                "topics": [{"name": n, "partitions": ps} for n, ps in grouped.items()]}
    return answer()


HANDLERS = {ALTER_PARTITION_REASSIGNMENTS: on_alter_partition_reassignments,
            LIST_PARTITION_REASSIGNMENTS: on_list_partition_reassignments}
