"""DescribeTopicPartitions (key 75, v0; KIP-966): topics and their partitions, paginated.

Answered from this broker's metadata cache, as Kafka's
``DescribeTopicPartitionsRequestHandler``: the named topics (none named: every
topic the principal may DESCRIBE), sorted by name, from the request's cursor
(its topic and partition) on, at most ``response_partition_limit`` partitions
(capped at ``PARTITIONS_PER_ANSWER_MAX``, Kafka's
``max.request.partition.size.limit`` default); ``next_cursor`` names the first
partition left out. A cursor topic that is not among the named ones makes every
named topic INVALID_REQUEST. A named topic that does not exist is
UNKNOWN_TOPIC_OR_PARTITION, one the principal may not DESCRIBE
TOPIC_AUTHORIZATION_FAILED. There are no eligible leader replicas (ELR) here:
both ELR lists are empty.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.storage.topics import CONSUMER_OFFSETS_TOPIC
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import DESCRIBE, TOPIC, authorized_operations

DESCRIBE_TOPIC_PARTITIONS = 75
SUPPORTED = {DESCRIBE_TOPIC_PARTITIONS: (0, 0)}
API_NAMES = {DESCRIBE_TOPIC_PARTITIONS: "DescribeTopicPartitions"}
PARTITIONS_PER_ANSWER_MAX = 2000
_NO_TOPIC_ID = uuid.UUID(int=0)


class TopicServices(Protocol):
    @property
    def metadata_cache(self) -> MetadataCache: ...

    @property
    def listener_name(self) -> str: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _topic_entry(t: pb.TopicMetadata, first_partition: int, room: int
                 ) -> tuple[dict[str, Any], int | None]:
    """The topic's answer from ``first_partition`` on, at most ``room`` partitions; and the
    first partition left out (None: none)."""
    partitions = sorted((p for p in t.partitions if p.partition >= first_partition),
                        key=lambda p: p.partition)
    left_out = partitions[room].partition if len(partitions) > room else None
    entry = {
        "error_code": t.error_code, "name": t.name,
        "topic_id": uuid.UUID(bytes=t.topic_id) if len(t.topic_id) == 16 else _NO_TOPIC_ID,
        "is_internal": t.name == CONSUMER_OFFSETS_TOPIC,
        "partitions": [{"error_code": p.error_code, "partition_index": p.partition,
                        "leader_id": p.leader, "leader_epoch": p.leader_epoch,
                        "replica_nodes": list(p.replicas), "isr_nodes": list(p.isr),
                        "eligible_leader_replicas": [], "last_known_elr": [],
                        "offline_replicas": list(p.offline_replicas)}
                       for p in partitions[:room]]}
    return entry, left_out


def describe_topic_partitions(s: TopicServices, body: RequestBody) -> dict[str, Any]:
    named = [t.name for t in body.topics]
    cursor = body.cursor
    if cursor is not None and named and cursor.topic_name not in named:
        # Kafka's error answer: every named topic carries the request's error.
        return {"throttle_time": 0, "next_cursor": None, "topics": [
            {"error_code": pb.INVALID_REQUEST, "name": n, "topic_id": _NO_TOPIC_ID,
             "partitions": []} for n in named]}
    known = set(s.metadata_cache.topics())
    if named:
        names = sorted(set(named))
    else:
        names = [n for n in sorted(known) if s.allowed(DESCRIBE, TOPIC, n)]
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    limit = min(max(body.response_partition_limit, 1), PARTITIONS_PER_ANSWER_MAX)
    described = {t.name: t for t in s.metadata_cache.metadata_response(
        [n for n in names if n in known], s.listener_name).topics} if names else {}
    topics: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        if not s.allowed(DESCRIBE, TOPIC, name):
            topics.append({"error_code": pb.TOPIC_AUTHORIZATION_FAILED, "name": name,
                           "topic_id": _NO_TOPIC_ID, "partitions": []})
            continue
        t = described.get(name)
        if t is None:
            topics.append({"error_code": pb.UNKNOWN_TOPIC_OR_PARTITION, "name": name,
                           "topic_id": _NO_TOPIC_ID, "partitions": []})
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        entry, left_out = _topic_entry(t, first, limit)
        # Kafka's handler always answers the topic's KIP-430 bit field (no request flag).
        entry["topic_authorized_operations"] = authorized_operations(s.allowed, TOPIC, name)
        topics.append(entry)
        limit -= len(entry["partitions"])
        if left_out is not None:
            next_cursor = {"topic_name": name, "partition_index": left_out}
            break
        if limit == 0:
            later = names[names.index(name) + 1:]
            if later:
                next_cursor = {"topic_name": later[0], "partition_index": 0}
            break
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


async def on_describe_topic_partitions(s: TopicServices, head: RequestHead, body: RequestBody
                                       ) -> Awaitable[dict[str, Any]]:
    answer = describe_topic_partitions(s, body)

    async def done() -> dict[str, Any]:
        return answer
    return done()


HANDLERS = {DESCRIBE_TOPIC_PARTITIONS: on_describe_topic_partitions}
