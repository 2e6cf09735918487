"""Kafka's DescribeProducers (key 61, KIP-664): the active producers of partitions led
here, from each partition's producer state (``broker/storage/producer_state.py``), as
``kafka-transactions.sh describe-producers`` and the admin clients' ``describe_producers``
ask for them (to find a hanging transaction).

Version 0 (flexible). Per partition, as Kafka's ``ReplicaManager.activeProducerState``:
not hosted here UNKNOWN_TOPIC_OR_PARTITION, hosted but not led NOT_LEADER_OR_FOLLOWER,
else each producer with its epoch, last sequence (-1: none remembered), last batch's
timestamp, the coordinator epoch of its last marker and the first offset of its open
transaction (-1: none). With an authorizer READ on the topic (Kafka's rule), refused:
TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import READ, TOPIC
from tidewater.proto.errors import NotLeaderOrFollowerError

DESCRIBE_PRODUCERS = 61
DESCRIBE_PRODUCERS_VERSIONS = (0, 0)


class ProducerStateServices(Protocol):
    @property
    def replica_manager(self) -> ReplicaManager: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def partition_producers(replica_manager: ReplicaManager, topic: str, partition_index: int
                        ) -> dict[str, Any]:
    """One PartitionResponse: the active producers, or the error that says why not."""
    try:
        partition = replica_manager.hosted_partition(topic, partition_index)
        if not partition.is_leader:
            raise NotLeaderOrFollowerError(
                f"{topic}-{partition_index} is not led by broker {replica_manager.broker_id}")
        entries = list(partition.log.producer_state.entries.values())
    except Exception as e:  # the one boundary: a typed error per partition
        code, message = error_code_for(e, context="DescribeProducers")
        return {"partition_index": partition_index, "error_code": code,
                "error_message": message, "active_producers": []}
    return {"partition_index": partition_index, "error_code": pb.NONE, "error_message": None,
            "active_producers": [
                {"producer_id": e.producer_id, "producer_epoch": e.producer_epoch,
                 "last_sequence": e.last_sequence, "last_timestamp": e.last_timestamp_ms,
                 "coordinator_epoch": e.coordinator_epoch,
                 "current_txn_start_offset": e.current_txn_first_offset}
                for e in sorted(entries, key=lambda e: e.producer_id)]}


async def on_describe_producers(s: ProducerStateServices, head: RequestHead,
                                body: RequestBody) -> Awaitable[dict[str, Any]]:
    topics = []
    for t in body.topics:
        name = str(t.name)
        if s.allowed(READ, TOPIC, name):
            partitions = [partition_producers(s.replica_manager, name, int(p))
                          for p in t.partition_indexes]
        else:
            partitions = [{"partition_index": int(p),
                           "error_code": pb.TOPIC_AUTHORIZATION_FAILED,
                           "error_message": None, "active_producers": []}
                          for p in t.partition_indexes]
        topics.append({"name": name, "partitions": partitions})

    async def answer() -> dict[str, Any]:
        return {"throttle_time": 0, "topics": topics}
    return answer()
