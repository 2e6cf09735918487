"""Kafka's APIs about logs themselves: DeleteRecords (key 21), DescribeLogDirs (key 35).

DeleteRecords v0-2 (v2 flexible; librdkafka and kafka-python negotiate within
them): each partition goes to ``ReplicaManager.delete_records``
(``broker/serving/delete_records.py``): this broker must lead it (else
NOT_LEADER_OR_FOLLOWER for a partition the cluster has, UNKNOWN_TOPIC_OR_PARTITION
otherwise), offset -1 is the HW, an offset past the HW is OFFSET_OUT_OF_RANGE, a
compacted-only topic POLICY_VIOLATION; the answer's low watermark comes once the
leader's new start is durable and every ISR member's log start reached it
(REQUEST_TIMED_OUT after the request's timeout). With an authorizer the caller
needs DELETE on the topic (TOPIC_AUTHORIZATION_FAILED).

DescribeLogDirs v1-4 (kafka-python's ``describe_log_dirs``; v0 is gone from Kafka 4
and v5 was never released): one log dir per broker, its data dir, with every
hosted replica (or those named) and its size in bytes, offset lag ``max(HW - LEO,
0)`` as Kafka's (0 for a leader), ``is_future_key`` false (no replica moves between
dirs); v4 adds the file system's total and usable bytes. Needs DESCRIBE on the
cluster: CLUSTER_AUTHORIZATION_FAILED and no dirs otherwise, as Kafka's.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead, milliseconds
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.serving.delete_records import DeleteRecordsResult
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, CLUSTER_NAME, DELETE, DESCRIBE, TOPIC

DELETE_RECORDS, DESCRIBE_LOG_DIRS = 21, 35
DELETE_RECORDS_VERSIONS = (0, 2)
DESCRIBE_LOG_DIRS_VERSIONS = (1, 4)


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
        results = (await s.replica_manager.delete_records(wanted, milliseconds(body.timeout))
                   if wanted else [])
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


async def on_describe_log_dirs(s: LogServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    if not s.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
        async def refused() -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                    "results": []}
        return refused()
    wanted: dict[str, set[int]] | None = None
    if body.topics is not None:
        wanted = {}
        for t in body.topics:
            wanted.setdefault(t.topic, set()).update(int(p) for p in t.partitions)
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp, size, lag in s.replica_manager.log_dir_partitions():
        if wanted is not None and tp.partition not in wanted.get(tp.topic, ()):
            continue
        topics.setdefault(tp.topic, []).append({
            "partition_index": tp.partition, "partition_size": size, "offset_lag": lag,
            "is_future_key": False})
    data_dir = s.replica_manager.config.data_dir
    total_bytes, usable_bytes, code = -1, -1, pb.NONE
    try:
        stats = os.statvfs(data_dir)
        total_bytes = stats.f_blocks * stats.f_frsize
        usable_bytes = stats.f_bavail * stats.f_frsize
    except OSError:
        code = pb.KAFKA_STORAGE_ERROR  # Kafka's answer for an offline log dir
    result = {"error_code": code, "log_dir": str(os.path.abspath(data_dir)),
              "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
              "total_bytes": total_bytes, "usable_bytes": usable_bytes}

    async def answer() -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": pb.NONE, "results": [result]}
    return answer()
