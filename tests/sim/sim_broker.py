"""A simulated broker: the shell around the real replication decision code.

Per partition a broker is a leader (``LeaderPartitionState`` decides HW, ISR
changes and acks=all answers), a follower (``follower_truncation`` /
``truncation_for_diverging_epoch`` decide where to cut, ``follower_high_watermark``
the HW it exposes) or nothing yet. Everything here is plumbing a real broker
also needs: fencing by leader epoch, stale-response checks, retries.

Per-partition follower cycle::

    LeaderAndIsr (new epoch) -> TRUNCATING --OffsetForLeaderEpoch answer, done--> FETCHING
                                   ^----------- answer not done (ask again) ----'
    FETCHING: Fetch(last_fetched_epoch) -> records | diverging_epoch (truncate) | error

With ``use_offset_for_leader_epoch=False`` a new follower skips TRUNCATING and
relies on ``diverging_epoch`` alone (KIP-320 truncation on fetch).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tidewater.broker.replication.follower import (
    check_diverging,
    follower_high_watermark,
    follower_truncation,
    truncation_for_diverging_epoch,
)
from tidewater.broker.replication.leader_state import LeaderPartitionState
from tidewater.controller.election import PartitionRecord
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import NotEnoughReplicasError, OffsetOutOfRangeError

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
from .sim_log import SimLog

NONE_ROLE, LEADER, FOLLOWER = "none", "leader", "follower"
TRUNCATING, FETCHING = "truncating", "fetching"


@dataclass(frozen=True)
class BrokerConfig:
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 500
    heartbeat_interval_ms: int = 100
    request_timeout_ms: int = 250
    fetch_backoff_ms: int = 40
    fetch_max_batches: int = 8
    alter_partition_retry_ms: int = 300
    hw_checkpoint_interval_ms: int = 300
    use_offset_for_leader_epoch: bool = True
    send_last_fetched_epoch: bool = True  # False: pre-KIP-320 fetches, no diverging_epoch


@dataclass
class Waiter:
    """An acks=all produce waiting for the HW."""

    client: int
    request_id: int
    required_offset: int
    base_offset: int
    deadline_ms: int


@dataclass
class PartitionReplica:
    tp: TopicPartition
    log: SimLog
    high_watermark: int = 0
    hw_checkpoint: int = 0
    leader_epoch: int = -1
    partition_epoch: int = -1
    leader_id: int = -1
    role: str = NONE_ROLE
    leader_state: LeaderPartitionState | None = None
    waiters: list[Waiter] = field(default_factory=list)
    # follower
    phase: str = TRUNCATING
    inflight_request_id: int = -1
    inflight_sent_ms: int = 0
    inflight_fetch_offset: int = -1
    next_fetch_ms: int = 0
    # leader: the AlterPartition in flight (resent until answered)
    alter_request: AlterPartition | None = None
    alter_sent_ms: int = 0


class SimBroker:
    def __init__(self, broker_id: int, partitions: list[TopicPartition], network: Network,
                 rng: random.Random, config: BrokerConfig, hooks, *,
                 leader_state_factory: Callable[..., LeaderPartitionState] = LeaderPartitionState,
                 truncation_rule: Callable = follower_truncation,
                 diverging_rule: Callable = truncation_for_diverging_epoch):
        self.broker_id = broker_id
        self.network = network
        self.rng = rng
        self.config = config
        self.hooks = hooks  # the simulation: trace, observe_leader_hw, produce_acknowledged, log_changed
        self.leader_state_factory = leader_state_factory
        self.truncation_rule = truncation_rule
        self.diverging_rule = diverging_rule
        self.partitions: dict[TopicPartition, PartitionReplica] = {
            tp: PartitionReplica(tp, SimLog()) for tp in partitions}
        self.alive = True
        self.incarnation = 0
        self.broker_epoch = -1
        self._next_request_id = 1
        self._next_heartbeat_ms = 0
        self._next_register_ms = 0
        self._next_hw_checkpoint_ms = 0
        self._next_flush_ms = 0
        self.flush_interval_ms = rng.randint(50, 600)
        self.counters: Counter[str] = Counter()  # which decision paths ran (coverage)

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
            fresh = PartitionReplica(tp, p.log)
            fresh.hw_checkpoint = p.hw_checkpoint
            fresh.high_watermark = min(p.hw_checkpoint, p.log.log_end_offset)
            self.partitions[tp] = fresh

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
                p.hw_checkpoint = p.high_watermark
        for p in self.partitions.values():
            if p.role == LEADER:
                self._leader_tick(p, now_ms)
            elif p.role == FOLLOWER:
                self._follower_tick(p, now_ms)

    def _leader_tick(self, p: PartitionReplica, now_ms: int) -> None:
        state = p.leader_state
        if state.maybe_advance_high_watermark(now_ms):
            self._high_watermark_moved(p, now_ms)
        if p.alter_request is None:
            proposal = state.maybe_shrink_isr(now_ms)
            if proposal is not None:
                self._send_alter_partition(p, proposal, now_ms)
        elif now_ms - p.alter_sent_ms >= self.config.alter_partition_retry_ms:
            # Unsure whether it was applied: resend the same proposal.
            p.alter_sent_ms = now_ms
            self._send(CONTROLLER, p.alter_request, now_ms)
        self._answer_waiters(p, now_ms)

    def _follower_tick(self, p: PartitionReplica, now_ms: int) -> None:
        if p.inflight_request_id >= 0:
            if now_ms - p.inflight_sent_ms < self.config.request_timeout_ms:
                return
            p.inflight_request_id = -1  # timed out: the answer, if any, will be ignored
        if now_ms < p.next_fetch_ms:
            return
        request_id = self._request_id()
        p.inflight_request_id, p.inflight_sent_ms = request_id, now_ms
        if p.phase == TRUNCATING:
            message = OffsetForLeaderEpoch(request_id, self.broker_id, p.tp, p.leader_epoch,
                                           p.log.latest_epoch)
        else:
            p.inflight_fetch_offset = p.log.log_end_offset
            last_fetched_epoch = p.log.latest_epoch if self.config.send_last_fetched_epoch else -1
            message = Fetch(request_id, self.broker_id, p.tp, p.leader_epoch,
                            p.log.log_end_offset, last_fetched_epoch)
        self._send(p.leader_id, message, now_ms)

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
        if record.leader_epoch < p.leader_epoch:
            return
        if record.leader_epoch == p.leader_epoch:
            if record.partition_epoch <= p.partition_epoch:
                return
            p.partition_epoch = record.partition_epoch
            if p.role == LEADER:
                # Same leadership, the controller changed the ISR (e.g. fenced a follower).
                p.alter_request = None
                if p.leader_state.on_leader_and_isr_update(record.isr, record.partition_epoch,
                                                           now_ms):
                    self._high_watermark_moved(p, now_ms)
            return
        self._end_leadership(p, now_ms)
        p.leader_epoch, p.partition_epoch, p.leader_id = (
            record.leader_epoch, record.partition_epoch, record.leader)
        if record.leader == self.broker_id:
            self._become_leader(p, record, now_ms)
        elif record.leader >= 0:
            p.role = FOLLOWER
            p.phase = TRUNCATING if self.config.use_offset_for_leader_epoch else FETCHING
            p.inflight_request_id = -1
            p.next_fetch_ms = now_ms
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} follower of "
                                     f"{record.leader} epoch {record.leader_epoch}")
        else:
            p.role = NONE_ROLE  # offline partition

    def _become_leader(self, p: PartitionReplica, record: PartitionRecord, now_ms: int) -> None:
        log = p.log
        start = log.log_end_offset
        log.cache.assign(record.leader_epoch, start)
        p.role = LEADER
        p.alter_request = None
        p.leader_state = self.leader_state_factory(
            local_broker_id=self.broker_id, replicas=record.replicas, isr=record.isr,
            leader_epoch=record.leader_epoch, partition_epoch=record.partition_epoch,
            high_watermark=p.high_watermark, log_end_offset=start, epoch_start_offset=start,
            min_insync_replicas=self.config.min_insync_replicas,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms, now_ms=now_ms)
        p.high_watermark = p.leader_state.high_watermark
        self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} leader epoch "
                                 f"{record.leader_epoch} LEO {start} HW {p.high_watermark} "
                                 f"ISR {record.isr}")
        self.hooks.observe_leader_hw(self, p, now_ms)

    def _end_leadership(self, p: PartitionReplica, now_ms: int) -> None:
        for waiter in p.waiters:
            self._answer_produce(p, waiter, pb.NOT_LEADER_OR_FOLLOWER, now_ms)
        p.waiters.clear()
        p.leader_state = None
        p.alter_request = None

    def _send_alter_partition(self, p: PartitionReplica, isr: tuple[int, ...], now_ms: int) -> None:
        state = p.leader_state
        p.alter_request = AlterPartition(self._request_id(), self.broker_id, self.broker_epoch,
                                         p.tp, state.leader_epoch, state.partition_epoch, isr)
        p.alter_sent_ms = now_ms
        self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} propose ISR {isr}")
        self.counters["propose ISR " + ("expand" if len(isr) > len(state.isr) else "shrink")] += 1
        self._send(CONTROLLER, p.alter_request, now_ms)

    def _on_alter_partition_response(self, message: AlterPartitionResponse, now_ms: int) -> None:
        p = self.partitions[message.tp]
        if (p.role != LEADER or p.alter_request is None
                or p.alter_request.request_id != message.request_id):
            return  # an answer to an earlier proposal or leadership
        state = p.leader_state
        record = message.record
        moved = False
        if message.error == pb.NONE:
            p.alter_request = None
            moved = state.on_alter_partition_committed(record.isr, record.partition_epoch, now_ms)
            p.partition_epoch = max(p.partition_epoch, record.partition_epoch)
        elif message.error == pb.INVALID_UPDATE_VERSION:
            # Our partition epoch is stale: the answer carries the committed state.
            if record.leader_epoch == state.leader_epoch:
                p.alter_request = None
                moved = state.on_leader_and_isr_update(record.isr, record.partition_epoch, now_ms)
                p.partition_epoch = max(p.partition_epoch, record.partition_epoch)
        elif message.error in (pb.INELIGIBLE_REPLICA, pb.INVALID_REQUEST):
            p.alter_request = None
            state.on_alter_partition_failed()
        # FENCED_LEADER_EPOCH / NOT_LEADER / STALE_BROKER_EPOCH: keep it pending, a
        # LeaderAndIsr ends this leadership.
        if moved:
            self._high_watermark_moved(p, now_ms)

    # -- leader side of replication

    def _fence_check(self, p: PartitionReplica, current_leader_epoch: int) -> int:
        if p.role != LEADER:
            if current_leader_epoch > p.leader_epoch:
                return pb.UNKNOWN_LEADER_EPOCH
            return pb.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch < p.leader_epoch:
            return pb.FENCED_LEADER_EPOCH
        if current_leader_epoch > p.leader_epoch:
            return pb.UNKNOWN_LEADER_EPOCH
        return pb.NONE

    def _on_fetch(self, message: Fetch, now_ms: int) -> FetchResponse:
        p = self.partitions[message.tp]
        error = self._fence_check(p, message.current_leader_epoch)
        if error != pb.NONE:
            return FetchResponse(message.request_id, message.tp, error)
        log = p.log
        try:
            diverging = check_diverging(message.last_fetched_epoch, message.fetch_offset,
                                        log.cache, log.log_end_offset)
        except OffsetOutOfRangeError:
            return FetchResponse(message.request_id, message.tp, pb.OFFSET_OUT_OF_RANGE)
        if diverging is not None:
            return FetchResponse(message.request_id, message.tp, pb.NONE,
                                 high_watermark=p.high_watermark, diverging_epoch=diverging)
        if message.fetch_offset > log.log_end_offset:
            return FetchResponse(message.request_id, message.tp, pb.OFFSET_OUT_OF_RANGE)
        decision = p.leader_state.on_follower_fetch(message.replica_id, message.fetch_offset,
                                                    now_ms)
        if decision.high_watermark_changed:
            self._high_watermark_moved(p, now_ms)
        if decision.propose_isr is not None and p.alter_request is None:
            self._send_alter_partition(p, decision.propose_isr, now_ms)
        batches = log.read(message.fetch_offset, self.config.fetch_max_batches)
        return FetchResponse(message.request_id, message.tp, pb.NONE, batches,
                             high_watermark=p.high_watermark)

    def _on_offset_for_leader_epoch(self, message: OffsetForLeaderEpoch) -> OffsetForLeaderEpochResponse:
        p = self.partitions[message.tp]
        error = self._fence_check(p, message.current_leader_epoch)
        if error != pb.NONE:
            return OffsetForLeaderEpochResponse(message.request_id, message.tp, error)
        epoch, end_offset = p.log.cache.end_offset_for(message.leader_epoch, p.log.log_end_offset)
        return OffsetForLeaderEpochResponse(message.request_id, message.tp, pb.NONE, epoch,
                                            end_offset)

    def _on_produce(self, client: int, message: Produce, now_ms: int) -> None:
        p = self.partitions[message.tp]
        if p.role != LEADER:
            self._send(client, ProduceResponse(message.request_id, message.tp,
                                               pb.NOT_LEADER_OR_FOLLOWER), now_ms)
            return
        try:
            p.leader_state.check_acks_all_allowed()
        except NotEnoughReplicasError as e:
            self.counters["produce " + e.error_name] += 1
            self._send(client, ProduceResponse(message.request_id, message.tp, e.error_code),
                       now_ms)
            return
        batch = p.log.append_as_leader(message.record_count, p.leader_epoch, message.payload_id)
        p.waiters.append(Waiter(client, message.request_id, batch.next_offset, batch.base_offset,
                                now_ms + message.timeout_ms))
        if p.leader_state.on_local_append(p.log.log_end_offset, now_ms):
            self._high_watermark_moved(p, now_ms)
        self.hooks.log_changed(self, p)

    def _high_watermark_moved(self, p: PartitionReplica, now_ms: int) -> None:
        p.high_watermark = p.leader_state.high_watermark
        self.hooks.observe_leader_hw(self, p, now_ms)
        self._answer_waiters(p, now_ms)

    def _answer_waiters(self, p: PartitionReplica, now_ms: int) -> None:
        still_waiting = []
        for waiter in p.waiters:
            result = p.leader_state.acks_all_result(waiter.required_offset)
            if result is not None:
                self._answer_produce(p, waiter, result, now_ms)
            elif now_ms >= waiter.deadline_ms:
                self._answer_produce(p, waiter, pb.REQUEST_TIMED_OUT, now_ms)
            else:
                still_waiting.append(waiter)
        p.waiters = still_waiting

    def _answer_produce(self, p: PartitionReplica, waiter: Waiter, error: int, now_ms: int) -> None:
        self.counters["produce " + pb.ErrorCode.Name(error)] += 1
        if error in (pb.NONE, pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
            self.hooks.produce_acknowledged(self, p, waiter, now_ms)
        self._send(waiter.client, ProduceResponse(waiter.request_id, p.tp, error,
                                                  waiter.base_offset), now_ms)

    # -- follower side of replication

    def _is_current_answer(self, p: PartitionReplica, request_id: int) -> bool:
        # Rule 3: drop answers to requests of an earlier leader epoch (or already timed out).
        return p.role == FOLLOWER and request_id == p.inflight_request_id

    def _on_offset_for_leader_epoch_response(self, message: OffsetForLeaderEpochResponse,
                                             now_ms: int) -> None:
        p = self.partitions[message.tp]
        if not self._is_current_answer(p, message.request_id) or p.phase != TRUNCATING:
            return
        p.inflight_request_id = -1
        if message.error != pb.NONE:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
            return
        step = self.truncation_rule((message.epoch, message.end_offset), p.log.cache,
                                    p.log.log_end_offset, p.high_watermark)
        self.counters["offset_for_leader_epoch " + ("done" if step.done else "ask again")] += 1
        if message.end_offset == -1:
            self.counters["offset_for_leader_epoch undefined: truncate to HW"] += 1
        self._truncate(p, step.truncate_to, now_ms,
                       f"OffsetForLeaderEpoch answer {(message.epoch, message.end_offset)}")
        if step.done:
            p.phase = FETCHING

    def _on_fetch_response(self, message: FetchResponse, now_ms: int) -> None:
        p = self.partitions[message.tp]
        if not self._is_current_answer(p, message.request_id) or p.phase != FETCHING:
            return
        p.inflight_request_id = -1
        if p.inflight_fetch_offset != p.log.log_end_offset:
            return  # the log changed under the request
        if message.error == pb.OFFSET_OUT_OF_RANGE:
            p.phase = TRUNCATING
            return
        if message.error != pb.NONE:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
            return
        if message.diverging_epoch is not None:
            step = self.diverging_rule(message.diverging_epoch, p.log.cache,
                                       p.log.log_end_offset, p.high_watermark)
            self.counters["diverging_epoch " + ("done" if step.done else "not done")] += 1
            self._truncate(p, step.truncate_to, now_ms, f"diverging {message.diverging_epoch}")
            return  # not done: the next fetch carries the new last epoch
        if message.batches:
            p.log.append_as_follower(message.batches)
            self.hooks.log_changed(self, p)
        else:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
        p.high_watermark = follower_high_watermark(message.high_watermark, p.log.log_end_offset)

    def _truncate(self, p: PartitionReplica, offset: int, now_ms: int, why: str) -> None:
        if offset < p.log.log_end_offset:
            self.counters["follower truncated records"] += 1
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp} truncate "
                                     f"{p.log.log_end_offset} -> {offset} ({why})")
        p.log.truncate_to(offset)
        p.high_watermark = min(p.high_watermark, p.log.log_end_offset)
        self.hooks.log_changed(self, p)

    # ------------------------------------------------------------------ helpers

    def _request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send(self, dst: int, message, now_ms: int) -> None:
        self.network.send(self.broker_id, dst, message, now_ms)
