"""Kafka's APIs about logs themselves: DeleteRecords (key 21).

DeleteRecords v0-2 (v2 flexible; librdkafka and kafka-python negotiate within
them): each partition goes to ``ReplicaManager.delete_records``
(``broker/serving/delete_records.py``): this broker must lead it (else
NOT_LEADER_OR_FOLLOWER for a partition the cluster has, UNKNOWN_TOPIC_OR_PARTITION
otherwise), offset -1 is the HW, an offset past the HW is OFFSET_OUT_OF_RANGE, a
compacted-only topic POLICY_VIOLATION; the answer's low watermark is the new log
start, sent once it is durable. With an authorizer the caller needs DELETE on the
topic (TOPIC_AUTHORIZATION_FAILED). The request's timeout is not used: the answer
does not wait for the followers (they follow from their next fetch).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.serving.delete_records import DeleteRecordsResult
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import DELETE, TOPIC

DELETE_RECORDS = 21
DELETE_RECORDS_VERSIONS = (0, 2)


class LogServices(Protocol):
    """What the log APIs reach of ``apis.Services``."""

    @property
    def replica_manager(self) -> ReplicaManager: ...

    @property
    def metadata_cache(self) -> MetadataCache: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


async def on_delete_records(s: LogServices, head: RequestHead, body: RequestBody
                            ) -> Awaitable[dict[str, Any]]:
    wanted: list[tuple[str, int, int]] = []
    denied: list[DeleteRecordsResult] = []
    for topic in body.topics:
        if not s.allowed(DELETE, TOPIC, topic.name):
            denied += [DeleteRecordsResult(topic.name, p.partition_index, -1,
                                           pb.TOPIC_AUTHORIZATION_FAILED, "")
                       for p in topic.partitions]
            continue
        wanted += [(topic.name, p.partition_index, int(p.offset)) for p in topic.partitions]

    async def answer() -> dict[str, Any]:
        results = await s.replica_manager.delete_records(wanted) if wanted else []
        grouped: dict[str, list[dict[str, Any]]] = {}
        for r in [*results, *denied]:
            code = r.error_code
            if (code == pb.UNKNOWN_TOPIC_OR_PARTITION
                    and s.metadata_cache.partition_state(r.topic, r.partition) is not None):
                code = pb.NOT_LEADER_OR_FOLLOWER  # the cluster has it, another broker leads
            grouped.setdefault(r.topic, []).append({
                "partition_index": r.partition, "low_watermark": r.low_watermark,
                "error_code": code})
        return {"throttle_time": 0, "topics": [{"name": name, "partitions": parts}
                                               for name, parts in grouped.items()]}
    return answer()
