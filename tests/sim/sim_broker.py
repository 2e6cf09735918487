"""A simulated broker: the broker's own replication core behind a fake network and disk.

Every replication decision is made by ``tidewater.broker.replication.ReplicaState``,
the class the real broker runs: becoming leader or follower, fencing, the HW,
ISR proposals and their answers, truncation, which acks=all requests complete.
This module only does what the real broker's asyncio shell does around it,
against the simulation's network and ``SimLog``:

* registration and heartbeats with the (simulated) controller;
* turning messages into the core's events and carrying out each ``Ready``
  (``_apply``): persist on the ``SimLog``, send AlterPartition, answer produce
  requests, start or stop fetching;
* the transport of a follower's requests (one in flight per partition, a
  request timeout, pacing after an empty answer) and of AlterPartition (an
  answer that never comes is reported as unsure after the request timeout);
* the byte-level fix-up of a fetched chunk (skip batches below the LEO, cut a
  straddling batch), as the real fetcher does.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from tidewater.broker.replication.ready import (
    AppendFetched,
    AssignEpoch,
    Follow,
    Ready,
    StopFetching,
    Truncate,
    TruncateFully,
)
from tidewater.broker.replication.replica import (
    FollowerOptions,
    FollowerPhase,
    PartitionState,
    ReplicaState,
    Role,
)
from tidewater.controller.election import PartitionRecord
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError

from .messages import (
    AlterPartition,
    AlterPartitionResponse,
    Fetch,
    FetchResponse,
    Heartbeat,
    LeaderAndIsr,
    OffsetForLeaderEpoch,
    OffsetForLeaderEpochResponse,
    Produce,
    ProduceResponse,
    RegisterBroker,
    RegisterBrokerResponse,
    TopicPartition,
)
from .network import CONTROLLER, Network
from .sim_log import Batch, SimLog

LEADER = Role.LEADER


@dataclass(frozen=True)
class BrokerConfig:
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 500
    heartbeat_interval_ms: int = 100
    request_timeout_ms: int = 250
    fetch_backoff_ms: int = 40
    fetch_max_batches: int = 8
    alter_partition_timeout_ms: int = 300
    hw_checkpoint_interval_ms: int = 300
    use_offset_for_leader_epoch: bool = True
    send_last_fetched_epoch: bool = True  # False: pre-KIP-320 fetches, no diverging_epoch

    @property
    def follower_options(self) -> FollowerOptions:
        return FollowerOptions(truncate_first=self.use_offset_for_leader_epoch,
                               send_last_fetched_epoch=self.send_last_fetched_epoch,
                               fetch_backoff_ms=self.fetch_backoff_ms)


@dataclass
class Waiter:
    """An acks=all produce waiting for the HW (the core holds its wait by ``waiter_id``)."""

    client: int
    request_id: int
    required_offset: int
    base_offset: int


@dataclass
class PartitionReplica:
    """The shell's state of one partition: the core, its log, and the transport in flight."""

    tp: TopicPartition
    log: SimLog
    replica: ReplicaState
    hw_checkpoint: int = 0
    waiters: dict[int, Waiter] = field(default_factory=dict)
    # follower transport: the one request in flight
    inflight_request_id: int = -1
    inflight_sent_ms: int = 0
    inflight_leader_epoch: int = -1
    inflight_fetch_offset: int = -1
    next_fetch_ms: int = 0
    fetched: tuple[Batch, ...] = ()  # the batches an AppendFetched appends
    # AlterPartition transport: (alter_id, request id, sent at)
    alter_inflight: tuple[int, int, int] | None = None

    # views the checker reads
    @property
    def role(self) -> str:
        return self.replica.role

    @property
    def leader_epoch(self) -> int:
        return self.replica.leader_epoch

    @property
    def leader_state(self):
        return self.replica.leader

    @property
    def high_watermark(self) -> int:
        return self.replica.high_watermark


class SimBroker:
    def __init__(self, broker_id: int, partitions: list[TopicPartition], network: Network,
                 rng: random.Random, config: BrokerConfig, hooks, *,
                 replica_class: type[ReplicaState] = ReplicaState):
        self.broker_id = broker_id
        self.network = network
        self.rng = rng
        self.config = config
        self.hooks = hooks  # the simulation: trace, observe_leader_hw, produce_acknowledged, log_changed
        self.replica_class = replica_class
        self.partitions: dict[TopicPartition, PartitionReplica] = {
            tp: self._new_partition(tp, SimLog(), 0) for tp in partitions}
        self.alive = True
        self.incarnation = 0
        self.broker_epoch = -1
        self._next_request_id = 1
        self._next_waiter_id = 1
        self._next_heartbeat_ms = 0
        self._next_register_ms = 0
        self._next_hw_checkpoint_ms = 0
        self._next_flush_ms = 0
        self.flush_interval_ms = rng.randint(50, 600)
        self.counters: Counter[str] = Counter()  # which decision paths ran (coverage)

    def _new_partition(self, tp: TopicPartition, log: SimLog, hw_checkpoint: int
                       ) -> PartitionReplica:
        replica = self.replica_class(
            tp[0], tp[1], local_broker_id=self.broker_id, log=log,
            high_watermark=hw_checkpoint, min_insync_replicas=self.config.min_insync_replicas,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            follower_options=self.config.follower_options)
        return PartitionReplica(tp, log, replica, hw_checkpoint=hw_checkpoint)

    # ------------------------------------------------------------------ lifecycle

    def crash(self, now_ms: int, *, lose_unflushed: bool = True,
              keep_offset: int | None = None) -> dict[TopicPartition, int]:
        """Stop the process; each log may lose part of its unflushed tail. Returns the new LEOs.

        ``keep_offset`` (scripted scenarios): keep exactly the batches below it.
        """
        self.alive = False
        lost_from = {}
        for tp, p in self.partitions.items():
            before = p.log.log_end_offset
            if keep_offset is not None:
                p.log.flushed_offset = min(keep_offset, before)
                p.log.truncate_to(keep_offset)
            if not lose_unflushed or keep_offset is not None:
                p.log.flush()
            lost_from[tp] = p.log.crash(self.rng)
            if lost_from[tp] < before:
                self.hooks.trace(now_ms, f"broker {self.broker_id}: crash lost {tp} "
                                         f"[{lost_from[tp]}, {before})")
        return lost_from

    def restart(self, now_ms: int) -> None:
        """A new process over the surviving files: no role until the controller says so."""
        self.alive = True
        self.incarnation += 1
        self.broker_epoch = -1
        self._next_register_ms = now_ms
        for tp, p in self.partitions.items():
            self.partitions[tp] = self._new_partition(tp, p.log, p.hw_checkpoint)

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        if self.broker_epoch < 0:
            if now_ms >= self._next_register_ms:
                self._next_register_ms = now_ms + self.config.request_timeout_ms
                self._send(CONTROLLER, RegisterBroker(self.broker_id, self.incarnation), now_ms)
            return
        if now_ms >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = now_ms + self.config.heartbeat_interval_ms
            self._send(CONTROLLER, Heartbeat(self.broker_id, self.broker_epoch), now_ms)
        if now_ms >= self._next_flush_ms:
            self._next_flush_ms = now_ms + self.flush_interval_ms
            for p in self.partitions.values():
                p.log.flush()
        if now_ms >= self._next_hw_checkpoint_ms:
            self._next_hw_checkpoint_ms = now_ms + self.config.hw_checkpoint_interval_ms
            for p in self.partitions.values():
                p.hw_checkpoint = p.replica.high_watermark
        for p in self.partitions.values():
            if p.replica.is_leader:
                self._leader_tick(p, now_ms)
            elif p.replica.follower is not None:
                self._follower_tick(p, now_ms)

    def _leader_tick(self, p: PartitionReplica, now_ms: int) -> None:
        if (p.alter_inflight is not None
                and now_ms - p.alter_inflight[2] >= self.config.alter_partition_timeout_ms):
            # No answer in time: as the real shell's RPC deadline does, "unsure".
            alter_id = p.alter_inflight[0]
            p.alter_inflight = None
            self._apply(p, p.replica.on_alter_partition_unsure(alter_id, now_ms), now_ms)
        self._apply(p, p.replica.tick(now_ms), now_ms)

    def _follower_tick(self, p: PartitionReplica, now_ms: int) -> None:
        if p.inflight_request_id >= 0:
            if now_ms - p.inflight_sent_ms < self.config.request_timeout_ms:
                return
            p.inflight_request_id = -1  # timed out: the answer, if any, will be ignored
        if now_ms < p.next_fetch_ms:
            return
        wants = p.replica.follower_wants(now_ms)
        if wants is None:
            return
        cycle = p.replica.follower
        request_id = self._request_id()
        p.inflight_request_id, p.inflight_sent_ms = request_id, now_ms
        p.inflight_leader_epoch = cycle.leader_epoch
        if wants == FollowerPhase.TRUNCATING:
            message = OffsetForLeaderEpoch(request_id, self.broker_id, p.tp, cycle.leader_epoch,
                                           p.log.leader_epoch_cache.latest_epoch)
        else:
            fetch_offset, last_fetched_epoch, _ = p.replica.fetch_position()
            p.inflight_fetch_offset = fetch_offset
            message = Fetch(request_id, self.broker_id, p.tp, cycle.leader_epoch, fetch_offset,
                            last_fetched_epoch)
        self._send(cycle.leader_id, message, now_ms)

    # ------------------------------------------------------------------ messages

    def handle(self, src: int, message, now_ms: int) -> None:
        if isinstance(message, RegisterBrokerResponse):
            if message.incarnation == self.incarnation and self.broker_epoch < 0:
                self.broker_epoch = message.broker_epoch
                self.hooks.trace(now_ms, f"broker {self.broker_id}: registered, broker epoch "
                                         f"{self.broker_epoch}")
            return
        if self.broker_epoch < 0:
            return  # not registered yet: serve nothing
        if isinstance(message, LeaderAndIsr):
            self._on_leader_and_isr(message, now_ms)
        elif isinstance(message, AlterPartitionResponse):
            self._on_alter_partition_response(message, now_ms)
        elif isinstance(message, Fetch):
            self._send(src, self._on_fetch(message, now_ms), now_ms)
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(message, now_ms)
        elif isinstance(message, OffsetForLeaderEpoch):
            self._send(src, self._on_offset_for_leader_epoch(message), now_ms)
        elif isinstance(message, OffsetForLeaderEpochResponse):
            self._on_offset_for_leader_epoch_response(message, now_ms)
        elif isinstance(message, Produce):
            self._on_produce(src, message, now_ms)
        else:
            raise TypeError(f"broker cannot handle {message!r}")

    # -- controller

    def _on_leader_and_isr(self, message: LeaderAndIsr, now_ms: int) -> None:
        if message.broker_epoch != self.broker_epoch:
            return  # meant for an earlier process of this broker
        record: PartitionRecord = message.record
        p = self.partitions[(record.topic, record.partition)]
        ready = p.replica.on_leader_and_isr(state_of(record), now_ms)
        self._apply(p, ready, now_ms)

    def _on_alter_partition_response(self, message: AlterPartitionResponse, now_ms: int) -> None:
        p = self.partitions[message.tp]
        if p.alter_inflight is None or p.alter_inflight[1] != message.request_id:
            return  # an answer to an attempt already given up on
        alter_id = p.alter_inflight[0]
        p.alter_inflight = None
        ready = p.replica.on_alter_partition_answer(alter_id, message.error,
                                                    state_of(message.record), now_ms)
        self._apply(p, ready, now_ms)

    # -- leader side of replication

    def _on_fetch(self, message: Fetch, now_ms: int) -> FetchResponse:
        p = self.partitions[message.tp]
        try:
            diverging, ready = p.replica.on_follower_fetch(
                message.replica_id, message.current_leader_epoch, message.fetch_offset,
                message.last_fetched_epoch, now_ms)
        except TidewaterError as e:
            self.counters["serve fetch " + e.error_name] += 1
            return FetchResponse(message.request_id, message.tp, e.error_code)
        if diverging is not None:
            return FetchResponse(message.request_id, message.tp, pb.NONE,
                                 high_watermark=p.replica.high_watermark,
                                 diverging_epoch=diverging)
        batches = p.log.read(message.fetch_offset, self.config.fetch_max_batches)
        self._apply(p, ready, now_ms)
        return FetchResponse(message.request_id, message.tp, pb.NONE, batches,
                             high_watermark=p.replica.high_watermark)

    def _on_offset_for_leader_epoch(self, message: OffsetForLeaderEpoch
                                    ) -> OffsetForLeaderEpochResponse:
        p = self.partitions[message.tp]
        try:
            epoch, end_offset = p.replica.answer_offset_for_leader_epoch(
                message.current_leader_epoch, message.leader_epoch)
        except TidewaterError as e:
            return OffsetForLeaderEpochResponse(message.request_id, message.tp, e.error_code)
        return OffsetForLeaderEpochResponse(message.request_id, message.tp, pb.NONE, epoch,
                                            end_offset)

    def _on_produce(self, client: int, message: Produce, now_ms: int) -> None:
        p = self.partitions[message.tp]
        try:
            leader_epoch = p.replica.check_append(acks=-1)
        except TidewaterError as e:
            self.counters["produce " + e.error_name] += 1
            self._send(client, ProduceResponse(message.request_id, message.tp, e.error_code),
                       now_ms)
            return
        batch = p.log.append_as_leader(message.record_count, leader_epoch, message.payload_id)
        self.hooks.log_changed(self, p)
        waiter_id = self._next_waiter_id
        self._next_waiter_id += 1
        p.waiters[waiter_id] = Waiter(client, message.request_id, batch.next_offset,
                                      batch.base_offset)
        ready = p.replica.on_local_append(p.log.log_end_offset, now_ms, waiter_id=waiter_id,
                                          required_offset=batch.next_offset,
                                          timeout_ms=message.timeout_ms)
        self._apply(p, ready, now_ms)

    # -- follower side of replication

    def _take_answer(self, p: PartitionReplica, request_id: int) -> bool:
        """Is this the answer to the request in flight? (Else it timed out or is older.)"""
        if request_id != p.inflight_request_id:
            return False
        p.inflight_request_id = -1
        return True

    def _on_offset_for_leader_epoch_response(self, message: OffsetForLeaderEpochResponse,
                                             now_ms: int) -> None:
        p = self.partitions[message.tp]
        if not self._take_answer(p, message.request_id):
            return
        if message.error != pb.NONE:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
        ready = p.replica.on_offset_for_leader_epoch_answer(
            p.inflight_leader_epoch, message.error, (message.epoch, message.end_offset), now_ms)
        self._apply(p, ready, now_ms)

    def _on_fetch_response(self, message: FetchResponse, now_ms: int) -> None:
        p = self.partitions[message.tp]
        if not self._take_answer(p, message.request_id):
            return
        if message.error != pb.NONE or not message.batches:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms  # no long-poll here
        p.fetched = message.batches
        ready = p.replica.on_fetch_answer(
            p.inflight_leader_epoch, p.inflight_fetch_offset, message.error,
            high_watermark=message.high_watermark, leader_log_start_offset=0,
            diverging_epoch=message.diverging_epoch, now_ms=now_ms)
        self._apply(p, ready, now_ms)
        p.fetched = ()

    def _append_fetched(self, p: PartitionReplica) -> None:
        """The part of the fetched batches from the LEO on (the real fetcher's fix-up)."""
        log = p.log
        batches = p.fetched
        for i, batch in enumerate(batches):
            if batch.next_offset <= log.log_end_offset:
                continue
            if batch.base_offset < log.log_end_offset:
                log.truncate_to(batch.base_offset)  # our batch boundaries differ there
                if log.log_end_offset != batch.base_offset:
                    return
            log.append_as_follower(batches[i:])
            return

    # ------------------------------------------------------------------ carrying out a Ready

    def _apply(self, p: PartitionReplica, ready: Ready, now_ms: int) -> None:
        log = p.log
        for op in ready.persist:
            if isinstance(op, AssignEpoch):
                log.leader_epoch_cache.assign(op.epoch, op.start_offset)
            elif isinstance(op, Truncate):
                if op.offset < log.log_end_offset:
                    self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} truncate "
                                             f"{log.log_end_offset} -> {op.offset}")
                log.truncate_to(op.offset)
            elif isinstance(op, AppendFetched):
                self._append_fetched(p)
            elif isinstance(op, TruncateFully):
                raise AssertionError("the simulation has no retention: nothing to start past")
            self.hooks.log_changed(self, p)
        if isinstance(ready.fetch, Follow | StopFetching):
            p.inflight_request_id = -1  # answers to the old assignment are not taken
            p.next_fetch_ms = now_ms
        if ready.alter_partition is not None:
            request = ready.alter_partition
            request_id = self._request_id()
            p.alter_inflight = (request.alter_id, request_id, now_ms)
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} propose ISR "
                                     f"{request.new_isr}")
            self._send(CONTROLLER, AlterPartition(request_id, self.broker_id, self.broker_epoch,
                                                  p.tp, request.leader_epoch,
                                                  request.partition_epoch, request.new_isr),
                       now_ms)
        if p.replica.is_leader and (ready.high_watermark_moved or ready.leadership_changed):
            self.hooks.observe_leader_hw(self, p, now_ms)
        for waiter_id, code in ready.completed:
            self._answer_produce(p, p.waiters.pop(waiter_id), code, now_ms)
        self.counters.update(ready.counters)
        for line in ready.notes + ready.alarms:
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {line}")
        if ready.error != pb.NONE:
            self.counters["refused " + pb.ErrorCode.Name(ready.error)] += 1

    def _answer_produce(self, p: PartitionReplica, waiter: Waiter, error: int, now_ms: int) -> None:
        self.counters["produce " + pb.ErrorCode.Name(error)] += 1
        if error in (pb.NONE, pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
            self.hooks.produce_acknowledged(self, p, waiter, now_ms)
        self._send(waiter.client, ProduceResponse(waiter.request_id, p.tp, error,
                                                  waiter.base_offset), now_ms)

    # ------------------------------------------------------------------ helpers

    def _request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send(self, dst: int, message, now_ms: int) -> None:
        self.network.send(self.broker_id, dst, message, now_ms)


def state_of(record: PartitionRecord) -> PartitionState:
    """The controller's record as the LeaderAndIsr state the core takes."""
    return PartitionState(record.topic, record.partition, record.leader, record.leader_epoch,
                          record.partition_epoch, tuple(record.replicas), tuple(record.isr))
