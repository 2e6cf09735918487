"""The messages of the simulated cluster.

Broker to broker and client to broker: the fields of the real RPCs the rules depend on.
To and from the controller: the product's own protobuf requests and answers, in envelopes
that stand for gRPC's call and stream bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidewater.broker.storage.topics import TopicPartition

from .sim_log import Batch

__all__ = ["TopicPartition"]


# ---------------------------------------------------------------- controller RPCs
# The controller's RPCs carry the product's protobuf messages; these envelopes are
# only the transport (what gRPC's call and stream bookkeeping does).

@dataclass(frozen=True)
class ControllerCall:
    """A call of the ``Controller`` service: RegisterBroker, a heartbeat, AlterPartition
    (from brokers), CreateTopics, DeleteTopics (from the admin client)."""

    call_id: int
    request: Any
    stream: int = -1  # heartbeats: the broker process (incarnation) whose stream carries it


@dataclass(frozen=True)
class ControllerAnswer:
    call_id: int
    response: Any
    # A standby of a quorum: NOT_CONTROLLER (gRPC UNAVAILABLE), naming the leader (-1: none
    # known) as the trailing metadata does.
    not_controller: bool = False
    leader_hint: int = -1


@dataclass(frozen=True)
class HeartbeatStreamClosed:
    """The kernel of a dead broker process closed its heartbeat stream's connection."""

    broker_id: int
    stream: int


@dataclass(frozen=True)
class BrokerCall:
    """A push of the ``Broker`` service: LeaderAndIsr, UpdateMetadata, StopReplica."""

    call_id: int
    controller_run: int  # the controller process that sent it: only it takes the answer
    request: Any


@dataclass(frozen=True)
class BrokerAnswer:
    call_id: int
    controller_run: int
    response: Any


# ---------------------------------------------------------------- broker <-> broker

@dataclass(frozen=True)
class Fetch:
    request_id: int
    replica_id: int
    tp: TopicPartition
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    topic_id: bytes  # the incarnation the follower replicates: never another one's records
    replica_broker_epoch: int  # KIP-903: only the live registration may join the ISR


@dataclass(frozen=True)
class FetchResponse:
    request_id: int
    tp: TopicPartition
    error: int
    batches: tuple[Batch, ...] = ()
    high_watermark: int = -1
    diverging_epoch: tuple[int, int] | None = None


@dataclass(frozen=True)
class OffsetForLeaderEpoch:
    request_id: int
    replica_id: int
    tp: TopicPartition
    current_leader_epoch: int
    leader_epoch: int
    topic_id: bytes  # the incarnation asked about


@dataclass(frozen=True)
class OffsetForLeaderEpochResponse:
    request_id: int
    tp: TopicPartition
    error: int
    epoch: int = -1
    end_offset: int = -1


# ---------------------------------------------------------------- client <-> broker

@dataclass(frozen=True)
class Produce:
    request_id: int
    tp: TopicPartition
    record_count: int
    payload_id: int
    timeout_ms: int


@dataclass(frozen=True)
class ProduceResponse:
    request_id: int
    tp: TopicPartition
    error: int
    base_offset: int = -1
