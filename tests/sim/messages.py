"""The messages of the simulated cluster: the fields of the real RPCs the rules depend on."""

from __future__ import annotations

from dataclasses import dataclass

from tidewater.controller.election import PartitionRecord

from .sim_log import Batch

TopicPartition = tuple[str, int]


# ---------------------------------------------------------------- broker <-> controller

@dataclass(frozen=True)
class RegisterBroker:
    broker_id: int
    incarnation: int  # a new one per process start


@dataclass(frozen=True)
class RegisterBrokerResponse:
    incarnation: int
    broker_epoch: int


@dataclass(frozen=True)
class Heartbeat:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class LeaderAndIsr:
    broker_epoch: int  # the registration it is meant for; a restarted broker refuses older ones
    record: PartitionRecord


@dataclass(frozen=True)
class AlterPartition:
    request_id: int
    broker_id: int
    broker_epoch: int
    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True)
class AlterPartitionResponse:
    request_id: int
    tp: TopicPartition
    error: int
    record: PartitionRecord


# ---------------------------------------------------------------- broker <-> broker

@dataclass(frozen=True)
class Fetch:
    request_id: int
    replica_id: int
    tp: TopicPartition
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int


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
