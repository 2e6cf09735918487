"""Fetch requests through the session cache: between kio's Fetch and ``fetch_sessions``.

Every Fetch goes through ``FetchSessionCache.new_context``: v4-6 carry no session
fields and are read as a sessionless full fetch (session 0, epoch FINAL), as Kafka
does. v7+ carry ``session_id``/``session_epoch`` and ``forgotten_topics_data``.

v13+ name topics by id, not name. A session's partitions are then keyed by the id's
UUID string, and the id is resolved to a name from the metadata cache at each read
(a topic recreated under the same name has another id: the old id's partitions
answer UNKNOWN_TOPIC_ID, as Kafka's). The answer's ``topic`` is the session key (the
name, or the id's string for v13+), which ``apis.fetch_values`` writes as the
response's topic name or topic id.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidewater.broker.kafka.codec import RequestBody
from tidewater.broker.kafka.fetch_sessions import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchContext,
    FetchSessionCache,
    FullFetch,
    PartitionFetch,
    PartitionKey,
    PartitionOutcome,
)
from tidewater.broker.serving.fetch import (
    ConsumerFetched,
    FetchedPartition,
    consumer_fetched,
    last_stable_offset_of,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

TOPIC_IDS_FROM = 13  # Fetch v13+ (KIP-516): topics by id


def replica_id_of(body: RequestBody) -> int:
    """The fetcher's replica id: a field up to v14, in ``replica_state`` from v15."""
    state = getattr(body, "replica_state", None)
    return int(state.replica_id) if state is not None else int(getattr(body, "replica_id", -1))


@functools.lru_cache(maxsize=4096)
def topic_id_of_key(topic_key: str) -> uuid.UUID:
    """The topic id a v13+ session key (the id's text) names, parsed once per key: every
    fetch of a v13+ consumer turns its keys back into ids twice (its read, its answer)."""
    return uuid.UUID(topic_key)


def _topic_key(topic: RequestBody, version: int) -> str:
    return str(topic.topic_id) if version >= TOPIC_IDS_FROM else str(topic.topic)


def session_request(body: RequestBody, version: int
                    ) -> tuple[dict[PartitionKey, PartitionFetch], list[PartitionKey]]:
    """A request's partitions (in request order) and forgotten partitions, by session key."""
    wanted: dict[PartitionKey, PartitionFetch] = {}
    for topic in body.topics:
        key = _topic_key(topic, version)
        for p in topic.partitions:
            wanted[(key, int(p.partition))] = PartitionFetch(
                fetch_offset=int(p.fetch_offset),
                partition_max_bytes=int(p.partition_max_bytes),
                current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)),
                last_fetched_epoch=int(getattr(p, "last_fetched_epoch", -1)))
    forgotten = [(_topic_key(t, version), int(p))
                 for t in (getattr(body, "forgotten_topics_data", None) or ())
                 for p in t.partitions]
    return wanted, forgotten


def new_context(cache: FetchSessionCache, body: RequestBody, version: int) -> FetchContext:
    """The request's context; raises the session errors (``proto.errors``)."""
    wanted, forgotten = session_request(body, version)
    return cache.new_context(int(getattr(body, "session_id", INVALID_SESSION_ID)),
                             int(getattr(body, "session_epoch", FINAL_EPOCH)),
                             wanted, forgotten, uses_topic_ids=version >= TOPIC_IDS_FROM)


@dataclass(frozen=True, slots=True)
class SessionRead:
    """What to read for a context: the broker's request, and the partitions answered
    without a read (unknown topic id, not authorized), by session key."""

    request: pb.FetchRequest
    names: dict[PartitionKey, tuple[str, int]]  # session key -> (topic name, partition)
    refused: dict[PartitionKey, FetchedPartition]


def session_read(context: FetchContext, request: pb.FetchRequest, version: int,
                 names_by_id: Mapping[bytes, str], may_read: Callable[[str], bool]
                 ) -> SessionRead:
    """``request`` (the Fetch's own fields, no partitions yet) with the context's
    partitions this principal may read, by name."""
    if request.partitions:
        raise InvariantViolation("session_read adds the partitions itself")
    names: dict[PartitionKey, tuple[str, int]] = {}
    refused: dict[PartitionKey, FetchedPartition] = {}
    for key, want in context.partitions:
        topic_key, partition = key
        topic_id = b""
        name: str | None = topic_key
        if version >= TOPIC_IDS_FROM:
            topic_id = topic_id_of_key(topic_key).bytes
            name = names_by_id.get(topic_id)
        if name is None:
            refused[key] = _refusal(key, pb.UNKNOWN_TOPIC_ID, f"unknown topic id {topic_key}")
        elif not may_read(name):
            refused[key] = _refusal(key, pb.TOPIC_AUTHORIZATION_FAILED,
                                    f"needs READ on topic {name!r}")
        else:
            names[key] = (name, partition)
            request.partitions.add(
                topic=name, partition=partition, topic_id=topic_id,
                current_leader_epoch=want.current_leader_epoch,
                fetch_offset=want.fetch_offset, last_fetched_epoch=want.last_fetched_epoch,
                log_start_offset=-1, partition_max_bytes=want.partition_max_bytes)
    return SessionRead(request, names, refused)


def _refusal(key: PartitionKey, code: int, message: str) -> FetchedPartition:
    return FetchedPartition(key[0], key[1], code, message, -1, -1, -1, -1, b"", None)


def session_answer(cache: FetchSessionCache, context: FetchContext, read: SessionRead,
                   fetched: list[FetchedPartition], now_ms: int
                   ) -> tuple[int, int, list[FetchedPartition]]:
    """(top-level error code, session id, the partitions to answer, their ``topic`` the
    session key) after the read of ``read.request``."""
    by_name = {(p.topic, p.partition): p for p in fetched}
    answers: list[FetchedPartition] = []
    for key, _ in context.partitions:
        refusal = read.refused.get(key)
        if refusal is not None:
            answers.append(refusal)
            continue
        got = by_name.get(read.names[key])
        if got is None:
            raise InvariantViolation(f"{read.names[key]} asked of the fetch, not answered")
        renamed = got._replace(topic=key[0])
        if isinstance(got, ConsumerFetched):
            # _replace keeps the class, not the transaction view set beside the tuple.
            renamed = consumer_fetched(renamed, got.last_stable_offset,
                                       got.aborted_transactions)
        answers.append(renamed)
    outcomes = [PartitionOutcome((p.topic, p.partition), p.error_code, p.high_watermark,
                                 p.log_start_offset, len(p.records), p.diverging is not None,
                                 last_stable_offset=last_stable_offset_of(p)
                                 if isinstance(p, ConsumerFetched) else -1)
                for p in answers]
    if isinstance(context, FullFetch):
        return pb.NONE, cache.complete_full(context, outcomes, now_ms), answers
    answer = cache.complete_incremental(context, outcomes, now_ms)
    return answer.error_code, answer.session_id, [answers[i] for i in answer.listed]
