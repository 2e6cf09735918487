"""Kafka's DescribeQuorum (key 55, v0-2; flexible), forwarded to the active controller.

As Kafka's brokers do, the request is forwarded to the controllers (the controller
link follows NOT_CONTROLLER hints to the quorum's leader) and needs DESCRIBE on the
cluster (CLUSTER_AUTHORIZATION_FAILED, top level, nothing forwarded). Only
``__cluster_metadata`` partition 0 exists: any other request is answered as
Kafka's ``KafkaRaftClient`` does, UNKNOWN_TOPIC_OR_PARTITION on that partition.
The answer is the quorum leader's view: leader, epoch, high watermark, each voter and
observer with its log end offset, from v1 its last fetch and last caught-up times
(the leader's wall clock: ages it reports, taken from this broker's clock), from v2
directory ids and the controllers' quorum endpoints (listener ``CONTROLLER``). A
single controller (no ``controller.quorum.voters``) answers as Kafka's one-voter
quorum: itself, leader in its controller epoch, high watermark its metadata log end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, CLUSTER_NAME, DESCRIBE

DESCRIBE_QUORUM = 55
SUPPORTED = {DESCRIBE_QUORUM: (0, 2)}
API_NAMES = {DESCRIBE_QUORUM: "DescribeQuorum"}
METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
CONTROLLER_LISTENER = "CONTROLLER"


class QuorumServices(Protocol):
    """What this API reaches of ``apis.Services``."""

    @property
    def controller(self) -> ControllerForwarder: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


async def _now(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _asks_for_metadata_partition(body: RequestBody) -> bool:
    topics = body.topics
    return (len(topics) == 1 and topics[0].topic_name == METADATA_TOPIC
            and len(topics[0].partitions) == 1
            and topics[0].partitions[0].partition_index == METADATA_PARTITION)


def _partition_error(code: int, message: str | None = None) -> dict[str, Any]:
    return {"error_code": pb.NONE, "error_message": None, "nodes": [], "topics": [{
        "topic_name": METADATA_TOPIC, "partitions": [{
            "partition_index": METADATA_PARTITION, "error_code": code, "error_message": message,
            "leader_id": -1, "leader_epoch": -1, "high_watermark": -1, "current_voters": [],
            "observers": []}]}]}


def _timestamp(age_ms: int, now_ms: int) -> int:
    return -1 if age_ms < 0 else now_ms - age_ms


def answer_of(described: pb.DescribeQuorumResponse, now_ms: int) -> dict[str, Any]:
    """The Kafka response values of the controller's DescribeQuorum answer."""
    if described.error_code != pb.NONE:
        return {"error_code": described.error_code,
                "error_message": pb.ErrorCode.Name(described.error_code),
                "nodes": [], "topics": []}

    def state(r: pb.QuorumReplicaState) -> dict[str, Any]:
        return {"replica_id": r.replica.id,
                "replica_directory_id": (uuid.UUID(hex=r.replica.directory_id)
                                         if r.replica.directory_id else None),
                "log_end_offset": r.log_end_offset,
                "last_fetch_timestamp": _timestamp(r.last_fetch_age_ms, now_ms),
                "last_caught_up_timestamp": _timestamp(r.last_caught_up_age_ms, now_ms)}

    voter_ids = {v.id for v in described.voters}
    by_id = {r.replica.id: r for r in described.replicas}
    # Every voter, with what the leader knows of it (-1: nothing yet), then the observers.
    voters = [state(by_id[v.id]) if v.id in by_id else {
        "replica_id": v.id, "replica_directory_id": uuid.UUID(hex=v.directory_id),
        "log_end_offset": -1, "last_fetch_timestamp": -1, "last_caught_up_timestamp": -1}
        for v in described.voters]
    observers = [state(r) for r in described.replicas if r.replica.id not in voter_ids]
    nodes = [{"node_id": e.id, "listeners": [
        {"name": CONTROLLER_LISTENER, "host": e.host, "port": e.port}]}
        for e in described.endpoints]
    return {"error_code": pb.NONE, "error_message": None, "nodes": nodes, "topics": [{
        "topic_name": METADATA_TOPIC, "partitions": [{
            "partition_index": METADATA_PARTITION, "error_code": pb.NONE,
            "error_message": None, "leader_id": described.leader_id,
            "leader_epoch": described.epoch, "high_watermark": described.high_watermark,
            "current_voters": voters, "observers": observers}]}]}


async def on_describe_quorum(s: QuorumServices, head: RequestHead,
                             body: RequestBody) -> Awaitable[dict[str, Any]]:
    if not s.allowed(DESCRIBE, CLUSTER, CLUSTER_NAME):
        return _now({"error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                     "error_message": "needs DESCRIBE on the cluster", "nodes": [],
                     "topics": []})
    if not _asks_for_metadata_partition(body):
        return _now(_partition_error(pb.UNKNOWN_TOPIC_OR_PARTITION,
                                     f"only {METADATA_TOPIC}-{METADATA_PARTITION} is described"))

    async def answer() -> dict[str, Any]:
        described = await s.controller.DescribeQuorum(pb.DescribeQuorumRequest(), None)
        return answer_of(described, int(time.time() * 1000))
    return answer()


HANDLERS = {DESCRIBE_QUORUM: on_describe_quorum}
