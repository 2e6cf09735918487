"""A simulated broker: the broker's own shell and core, behind a fake network, disk and clock.

Everything a broker decides runs here as the product's own code:

* the controller's requests: ``broker/replicas/control.py``'s ``ControlRequests``
  (refusals before registration, control tokens, epochs, topic identity,
  topic configs and ``min.insync.replicas``, stray replicas), over the real
  ``MetadataCache`` and ``ClusterIdentity``;
* carrying out every ``Ready``: ``broker/replicas/ready_carrier.py`` and
  ``partition.py`` (persist order, the fetched chunk's fix-up, what a storage
  failure becomes);
* the registration: ``broker/controller_link/registration.py``;
* appending as leader (``serving/produce.append_as_leader``), the leader's side of
  a follower fetch (``serving/fetch.serve_follower_fetch``), ticks
  (``replicas/ticks.tick_replicas``), the controller's AlterPartition answers
  (``controller_link/alter_partition.answer_to_core``);
* and every replication decision in ``broker/replication``.

What stays here is what the simulation fakes: the disk (``SimLogManager`` over
``SimLog``s and a ``meta.properties`` that survive a crash, with ``DiskFaults``),
the clock (``now_ms`` passed in), and the transport the asyncio shell does with
gRPC: registering and heartbeating on a timer, one follower request in flight per
partition with a timeout and a backoff (the real fetcher batches partitions per
leader on a stream), the AlterPartition and ReportCorruptReplica calls with a
timeout (``on_..._unsure``). The broker's observations for the invariant checks
(``hooks``) are taken after each Ready is carried out.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidewater.broker.config import BrokerConfig as ProductBrokerConfig
from tidewater.broker.controller_link.alter_partition import (
    alter_partition_item,
    answer_to_core,
    corrupt_replica_item,
)
from tidewater.broker.controller_link.controller_choice import ControllerChoice
from tidewater.broker.controller_link.registration import Registration
from tidewater.broker.replicas.cluster_identity import ClusterIdentity
from tidewater.broker.replicas.control import ControlRequests, RefusalRule
from tidewater.broker.replicas.hw_checkpoint import (
    high_watermarks_to_checkpoint,
    loaded_high_watermarks,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replicas.ticks import tick_replicas
from tidewater.broker.replication.control_rules import controller_request_refusal
from tidewater.broker.replication.ready import AlterPartitionRequest, CorruptReport, Ready
from tidewater.broker.replication.replica import FollowerPhase, ReplicaState
from tidewater.broker.replication.topic_identity import (
    IdentityAction,
    describe_topic_id,
    log_identity_action,
)
from tidewater.broker.serving.fetch import (
    check_fetch_topic_id,
    serve_follower_fetch,
    serve_offset_for_leader_epoch,
)
from tidewater.broker.serving.produce import append_as_leader
from tidewater.broker.storage.meta_properties import MetaProperties
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import BrokerNotAvailableError, TidewaterError, error_for_code

from .generations import replica_class_for
from .messages import (
    BrokerAnswer,
    BrokerCall,
    ControllerAnswer,
    ControllerCall,
    Fetch,
    FetchResponse,
    HeartbeatStreamClosed,
    OffsetForLeaderEpoch,
    OffsetForLeaderEpochResponse,
    Produce,
    ProduceResponse,
    TopicPartition,
)
from .network import CONTROLLER, Network
from .sim_log import DiskFaults, SimLog, SimRecords

# controller_link/channel.py's RETRY_BACKOFF_S: a registration a standby refused is sent
# again (to the leader it named) after this.
RETRY_BACKOFF_MS = 200
IdentityRule = Callable[..., IdentityAction]  # topic_identity.log_identity_action's shape


@dataclass(frozen=True)
class BrokerConfig:
    """The simulated broker's settings: the product's (``product_config``) and the
    transport's timers."""

    min_insync_replicas: int = 2  # the broker default; topics carry their own
    replica_lag_time_max_ms: int = 500
    heartbeat_interval_ms: int = 100
    session_timeout_ms: int = 600
    request_timeout_ms: int = 250
    fetch_backoff_ms: int = 40
    fetch_max_batches: int = 8
    alter_partition_timeout_ms: int = 300
    hw_checkpoint_interval_ms: int = 300
    use_offset_for_leader_epoch: bool = True
    send_last_fetched_epoch: bool = True  # False: pre-KIP-320 fetches, no diverging_epoch
    # The disk: the probability that one write of each kind (DiskFaults.KINDS) fails.
    disk_failure_probabilities: dict[str, float] = field(default_factory=dict)

    def product_config(self, broker_id: int) -> ProductBrokerConfig:
        return ProductBrokerConfig(
            broker_id=broker_id, listen=(f"broker-{broker_id}", 9092),
            controller=("controller", 9090), data_dir=Path(f"sim-broker-{broker_id}"),
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            min_insync_replicas=self.min_insync_replicas,
            broker_session_timeout_ms=self.session_timeout_ms,
            broker_heartbeat_interval_ms=self.heartbeat_interval_ms,
            replica_fetch_backoff_ms=self.fetch_backoff_ms)


@dataclass
class Waiter:
    """An acks=all produce waiting for the HW (the core holds its wait by ``waiter_id``)."""

    waiter_id: int
    client: int
    request_id: int
    partition: Partition
    base_offset: int
    required_offset: int  # the offset after the batch: the HW that commits it


@dataclass
class Transport:
    """The follower's and the AlterPartition's requests in flight for one replica (what the
    real fetcher and sender tasks keep)."""

    partition: Partition
    inflight_request_id: int = -1
    inflight_sent_ms: int = 0
    inflight_leader_epoch: int = -1
    inflight_fetch_offset: int = -1
    next_fetch_ms: int = 0
    # controller calls in flight: call id -> (sent at, kind, the core's id)
    calls: dict[int, tuple[int, str, int]] = field(default_factory=dict)


# ---------------------------------------------------------------- the fake disk

class SimDisk:
    """What survives a crash: the partition directories and ``meta.properties``."""

    def __init__(self, faults: DiskFaults):
        self.logs: dict[TopicPartition, SimLog] = {}
        self.meta: MetaProperties | None = None
        self.faults = faults


class SimMetaProperties:
    """``meta.properties`` on the simulated disk (``cluster_identity.MetaPropertiesStore``)."""

    def __init__(self, disk: SimDisk):
        self.disk = disk

    def read(self) -> MetaProperties | None:
        return self.disk.meta

    def write(self, meta: MetaProperties) -> None:
        self.disk.faults.check("checkpoint")
        self.disk.meta = meta

    def __str__(self) -> str:
        return "the simulated meta.properties"


class SimLogManager:
    """The ``LogManager`` operations ``ControlRequests`` uses, over the simulated disk."""

    def __init__(self, broker: SimBroker):
        self.broker = broker
        self.disk = broker.disk

    def get(self, tp: TopicPartition) -> SimLog | None:
        return self.disk.logs.get(tp)

    def logs(self) -> dict[TopicPartition, SimLog]:
        return dict(self.disk.logs)

    def get_or_create(self, tp: TopicPartition, config: Any, now_ms: int, *,
                      topic_id: bytes | None = None) -> SimLog:
        log = self.disk.logs.get(tp)
        if log is None:
            log = self.disk.logs[tp] = SimLog(topic_id, self.disk.faults)  # with partition.metadata
            log.config = config
            self.broker.counters["log identity create"] += 1
        return log

    def topic_id(self, tp: TopicPartition) -> bytes | None:
        log = self.disk.logs.get(tp)
        return log.topic_id if log is not None else None

    def topic_ids(self) -> dict[TopicPartition, bytes | None]:
        return {tp: log.topic_id for tp, log in self.disk.logs.items()}

    def assign_topic_id(self, tp: TopicPartition, topic_id: bytes) -> None:
        self.disk.logs[tp].topic_id = topic_id
        self.broker.counters["log identity adopt"] += 1

    def update_topic_config(self, topic: str, config: Any) -> None:
        for tp, log in self.disk.logs.items():
            if tp.topic == topic:
                log.config = config

    def delete(self, tp: TopicPartition) -> None:
        log = self.disk.logs.pop(tp)
        self.broker.counters["logs moved aside"] += 1
        self.broker.trace(f"{tp[0]}-{tp[1]} of incarnation {describe_topic_id(log.topic_id)[:6]} "
                          f"moved aside for deletion (LEO {log.log_end_offset})")

    def moves_aside(self) -> contextlib.AbstractContextManager[list[Any]]:
        return contextlib.nullcontext([])  # this disk's moves are durable at once

    def settle_deletions(self, moved: list[Any]) -> None:
        pass


# ---------------------------------------------------------------- broken variants, injected

def control_rules(replica_class: type[ReplicaState] = ReplicaState,
                  identity_rule: Any = log_identity_action,
                  refusal_rule: RefusalRule = controller_request_refusal) -> dict[str, Any]:
    """``ControlRequests``' rules with a broken variant's replica core, topic-identity table
    or refusal rule put in from outside (constructor arguments): the product's class is
    untouched and has no seam for them."""
    rules: dict[str, Any] = {"replica_class": replica_class, "refusal_rule": refusal_rule}
    if identity_rule is not log_identity_action:
        def incarnation_rule(tp: TopicPartition, told_id: bytes, local_id: bytes | None, *,
                             has_log: bool, trusted: bool,
                             names_by_id: dict[bytes, str]) -> IdentityAction:
            return identity_rule(local_id, told_id, has_log=has_log, trusted=trusted)
        rules["incarnation_rule"] = incarnation_rule
    return rules


class _ObservedCarrier(ReadyCarrier):
    """The product's ``ReadyCarrier``; after each Ready the simulation looks (checks only)."""

    def __init__(self, broker: SimBroker, **ports: Any):
        super().__init__(**ports)
        self.broker = broker

    def carried_out(self, partition: Partition, ready: Ready) -> None:
        self.broker.observe(partition, ready)
        self.broker.answer_completed_waits()


# ---------------------------------------------------------------- the broker

class SimBroker:
    def __init__(self, broker_id: int, network: Network, rng: random.Random,
                 config: BrokerConfig, hooks: Any, *,
                 replica_class: type[ReplicaState] = ReplicaState,
                 identity_rule: Any = log_identity_action,
                 refusal_rule: RefusalRule = controller_request_refusal,
                 controllers: dict[int, int] | None = None):
        self.broker_id = broker_id
        # The controllers' node ids and their network addresses (one controller: its id
        # is not known, as ``--controller HOST:PORT`` without ``ID@``).
        self.controllers = controllers or {-1: CONTROLLER}
        self.network = network
        self.rng = rng
        self.config = config
        self.product_config = config.product_config(broker_id)
        # the simulation: trace, observe_leader_hw, produce_acknowledged, log_changed,
        # became_leader
        self.hooks = hooks
        # The follower generation the seed runs (generations.py), over the core or a variant.
        replica_class = replica_class_for(
            truncate_first=config.use_offset_for_leader_epoch,
            send_last_fetched_epoch=config.send_last_fetched_epoch, base=replica_class)
        self.control_rules = control_rules(replica_class, identity_rule, refusal_rule)
        # The disk: survives crashes.
        self.disk = SimDisk(DiskFaults(random.Random(f"disk-{broker_id}-{rng.random()}"),
                                       dict(config.disk_failure_probabilities)))
        self.alive = True
        self.incarnation = 0
        self.flush_interval_ms = rng.randint(50, 600)
        self.counters: Counter[str] = Counter()  # which decision paths ran (coverage)
        self.now_ms = 0
        self._start_process(0)

    @property
    def logs(self) -> dict[TopicPartition, SimLog]:
        return self.disk.logs

    def _start_process(self, now_ms: int) -> None:
        """A new process over the disk: no partition until a LeaderAndIsr names it."""
        self.now_ms = now_ms
        self.registration = Registration(session_timeout_ms=self.config.session_timeout_ms)
        # Which controller gets the calls: the product's rules (ControllerChannel's).
        self.controller_choice = ControllerChoice(list(self.controllers))
        self.heartbeat_stream = self.incarnation  # moves to another controller: a new one
        self._heartbeat_answered_ms = now_ms
        self.registering = True
        self.partitions: dict[TopicPartition, Partition] = {}
        self.transport: dict[TopicPartition, Transport] = {}
        self.loaded_high_watermarks = loaded_high_watermarks(
            {tp: log.hw_checkpoint for tp, log in self.logs.items()}, self.logs)
        self.waiters: dict[int, Waiter] = {}
        self._completed: list[tuple[int, int]] = []
        self._calls: dict[int, tuple] = {}  # controller calls in flight: id -> what for
        self._register_call = -1
        self.metadata_cache = MetadataCache()
        self.carrier = _ObservedCarrier(
            self, notify_readers=_no_long_polls, complete_wait=self._complete_wait,
            count_decision=self._count, count_replicated_bytes=_ignore,
            mono_ms=self._now, wall_ms=self._now, note=self.trace, alarm=self.trace)
        self.carrier.follow = self._follow
        self.carrier.stop_following = self._stop_following
        self.carrier.send_alter_partition = self._send_alter_partition
        self.carrier.send_corrupt_report = self._send_corrupt_report
        self.control = ControlRequests(
            config=self.product_config, log_manager=SimLogManager(self),
            metadata_cache=self.metadata_cache, partitions=self.partitions,
            carrier=self.carrier, broker_epoch=lambda: self.registration.broker_epoch,
            loaded_high_watermarks=self.loaded_high_watermarks,
            forget_partition=self._forget_partition,
            control_token=lambda: self.registration.control_token,
            cluster_identity=ClusterIdentity(SimMetaProperties(self.disk), self.broker_id),
            mono_ms=self._now, wall_ms=self._now, **self.control_rules)
        self.control.on_new_controller = self._follow_active
        # Ids of this process's calls: an answer to a previous process's call never
        # reaches this one (gRPC: that connection died with it), however late it comes.
        self._next_request_id = 1 + self.incarnation * 1_000_000
        self._next_waiter_id = 1
        self._next_heartbeat_ms = now_ms
        self._next_register_ms = now_ms
        self._next_hw_checkpoint_ms = now_ms
        self._next_flush_ms = now_ms

    # ------------------------------------------------------------------ views

    @property
    def broker_epoch(self) -> int:
        return self.registration.broker_epoch

    def replica_log(self, tp: TopicPartition, topic_id: bytes) -> SimLog | None:
        """This broker's copy of incarnation ``topic_id`` of ``tp``: the log of its replica,
        else a log on disk made for that incarnation (not claimed since a restart)."""
        p = self.partitions.get(tp)
        if p is not None:
            return p.log if p.topic_id == topic_id else None
        log = self.logs.get(tp)
        return log if log is not None and log.topic_id == topic_id else None

    def trace(self, line: str) -> None:
        self.hooks.trace(self.now_ms, f"broker {self.broker_id}: {line}")

    def _now(self) -> int:
        return self.now_ms

    def _count(self, name: str) -> None:
        self.counters[name] += 1

    # ------------------------------------------------------------------ lifecycle

    def crash(self, now_ms: int, *, lose_unflushed: bool = True,
              keep_offset: int | None = None) -> None:
        """Stop the process; each log may lose part of its unflushed tail.

        ``keep_offset`` (scripted scenarios): keep exactly the batches below it.
        """
        self.now_ms = now_ms
        self.alive = False
        faults, self.disk.faults.probabilities = self.disk.faults.probabilities, {}
        for tp, log in self.logs.items():
            before = log.log_end_offset
            if keep_offset is not None:
                log.flushed_offset = min(keep_offset, before)
                log.truncate_to(keep_offset)
            if not lose_unflushed or keep_offset is not None:
                log.flush()
            lost_from = log.crash(self.rng)
            if lost_from < before:
                self.trace(f"crash lost {tp[0]}-{tp[1]} [{lost_from}, {before})")
        self.disk.faults.probabilities = faults

    def restart(self, now_ms: int) -> None:
        self.alive = True
        self.incarnation += 1
        self._start_process(now_ms)

    def heal_disk(self) -> None:
        """The faults stop (the simulation's settle phase)."""
        self.disk.faults.probabilities = {}

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        self.now_ms = now_ms
        config = self.config
        if self.registering:
            if now_ms >= self._next_register_ms:
                if self._register_call in self._calls:
                    # The last attempt went unanswered (DEADLINE_EXCEEDED): ask the next one.
                    self._controller_unavailable(-1)
                self._next_register_ms = now_ms + config.request_timeout_ms
                self.registration.begin()
                self._register_call = self._call(pb.RegisterBrokerRequest(
                    broker_id=self.broker_id, incarnation_id=f"{self.broker_id}.{self.incarnation}",
                    listeners=[pb.Listener(name="INTERNAL", host=f"broker-{self.broker_id}",
                                           port=9092)]), ("register",))
        elif now_ms >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = now_ms + config.heartbeat_interval_ms
            if (len(self.controllers) > 1 and now_ms - self._heartbeat_answered_ms
                    > 2 * config.session_timeout_ms):
                # ControllerChannel's heartbeat_timeout_s: a controller that answers nothing
                # for that long may be cut off.
                self._heartbeat_answered_ms = now_ms
                self._controller_unavailable(-1)
            self._call(self.registration.heartbeat_request(self.broker_id),
                       ("heartbeat", self.registration.broker_epoch),
                       stream=self.heartbeat_stream)
        if now_ms >= self._next_flush_ms:
            self._next_flush_ms = now_ms + self.flush_interval_ms
            for log in self.logs.values():
                try:
                    log.flush()
                except TidewaterError:
                    self.counters["disk: flush failed"] += 1
        if now_ms >= self._next_hw_checkpoint_ms:
            self._next_hw_checkpoint_ms = now_ms + config.hw_checkpoint_interval_ms
            try:
                self.disk.faults.check("checkpoint")
            except TidewaterError:
                self.counters["disk: HW checkpoint failed"] += 1
            else:
                hws = high_watermarks_to_checkpoint(
                    self.loaded_high_watermarks,
                    {tp: p.high_watermark for tp, p in self.partitions.items()})
                for tp, hw in hws.items():
                    log = self.logs.get(tp)
                    if log is not None:
                        log.hw_checkpoint = hw
        for transport in list(self.transport.values()):
            self._controller_call_timeouts(transport, now_ms)
        tick_replicas(self.partitions.values(), self.carrier, now_ms)
        for p in list(self.partitions.values()):
            if p.replica.follower is not None and p.replica.leader is None:
                self._follower_tick(p, now_ms)

    def _controller_call_timeouts(self, transport: Transport, now_ms: int) -> None:
        """A controller call with no answer in time: as the real RPC deadline, "unsure"."""
        p = transport.partition
        for call_id, (sent_ms, kind, core_id) in list(transport.calls.items()):
            if now_ms - sent_ms < self.config.alter_partition_timeout_ms:
                continue
            del transport.calls[call_id]
            self._answer_core(p, kind, core_id, ())

    def _follower_tick(self, p: Partition, now_ms: int) -> None:
        transport = self._transport(p)
        if transport.inflight_request_id >= 0:
            if now_ms - transport.inflight_sent_ms < self.config.request_timeout_ms:
                return
            transport.inflight_request_id = -1  # timed out: the answer, if any, is ignored
        if now_ms < transport.next_fetch_ms:
            return
        wants = p.replica.follower_wants(now_ms)
        if wants is None:
            return
        cycle = p.replica.follower
        request_id = self._request_id()
        transport.inflight_request_id, transport.inflight_sent_ms = request_id, now_ms
        transport.inflight_leader_epoch = cycle.leader_epoch
        asked = p.replica.offset_for_leader_epoch_request()
        if wants == FollowerPhase.TRUNCATING and asked is not None:
            current_leader_epoch, latest_epoch = asked
            message: Any = OffsetForLeaderEpoch(request_id, self.broker_id, p.tp,
                                                current_leader_epoch, latest_epoch, p.topic_id)
        else:
            fetch_offset, last_fetched_epoch, _ = p.replica.fetch_position()
            transport.inflight_fetch_offset = fetch_offset
            message = Fetch(request_id, self.broker_id, p.tp, cycle.leader_epoch, fetch_offset,
                            last_fetched_epoch, p.topic_id, self.registration.broker_epoch)
        self._send(cycle.leader_id, message)

    # ------------------------------------------------------------------ messages

    def handle(self, src: int, message: Any, now_ms: int) -> None:
        self.now_ms = now_ms
        if isinstance(message, BrokerCall):
            # None: not registered yet, UNAVAILABLE (the sender retries)
            response = self._on_controller_request(message.request)
            self._send(src, BrokerAnswer(message.call_id, message.controller_run, response))
        elif isinstance(message, ControllerAnswer):
            self._on_controller_answer(message, now_ms)
        elif isinstance(message, Fetch):
            self._send(src, self._on_fetch(message, now_ms))
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(message, now_ms)
        elif isinstance(message, OffsetForLeaderEpoch):
            self._send(src, self._on_offset_for_leader_epoch(message))
        elif isinstance(message, OffsetForLeaderEpochResponse):
            self._on_offset_for_leader_epoch_response(message, now_ms)
        elif isinstance(message, Produce):
            self._on_produce(src, message, now_ms)
        else:
            raise TypeError(f"broker cannot handle {message!r}")

    # -- the controller link (broker/controller_link/)

    @property
    def controller_address(self) -> int:
        """The network address of the controller this broker's calls go to now."""
        return self.controllers[self.controller_choice.current_id]

    def _call(self, request: Any, what: tuple, *, stream: int = -1) -> int:
        call_id = self._request_id()
        self._calls[call_id] = what
        self._send(self.controller_address, ControllerCall(call_id, request, stream))
        return call_id

    def _controller_unavailable(self, leader_hint: int) -> None:
        old = self.controller_address
        if self.controller_choice.on_unavailable(leader_hint):
            self._moved_from(old)

    def _follow_active(self, controller_id: int, controller_epoch: int) -> None:
        """``ControlRequests.on_new_controller``: ``ControllerChannel.follow_active``."""
        old = self.controller_address
        if self.controller_choice.follow_active(controller_id):
            self.trace(f"controller {controller_id} is active (controller epoch "
                       f"{controller_epoch}): heartbeats move there")
            self._moved_from(old)

    def _moved_from(self, old_address: int) -> None:
        """The heartbeat stream to the old controller is dropped (the gRPC cancel reaches
        it as the stream's end); the next heartbeat opens one to the new controller."""
        self.counters["controller moved"] += 1
        self._send(old_address, HeartbeatStreamClosed(self.broker_id, self.heartbeat_stream))
        self.heartbeat_stream += 1000
        self._heartbeat_answered_ms = self.now_ms

    def _on_controller_answer(self, message: ControllerAnswer, now_ms: int) -> None:
        what = self._calls.pop(message.call_id, None)
        if what is None:
            return
        if message.not_controller:
            self.counters["NOT_CONTROLLER answered"] += 1
            self._controller_unavailable(message.leader_hint)
            if what[0] == "register" and message.call_id == self._register_call:
                self._next_register_ms = min(self._next_register_ms, now_ms + RETRY_BACKOFF_MS)
            elif what[0] in ("alter", "corrupt"):
                kind, partition = what
                transport = self.transport.get(partition.tp)
                if (transport is not None and transport.partition is partition
                        and message.call_id in transport.calls):
                    core_id = transport.calls.pop(message.call_id)[2]
                    self._answer_core(partition, kind, core_id, ())
            return
        response = message.response
        if what[0] == "register":
            if message.call_id != self._register_call or not self.registering:
                return  # an answer to an attempt given up on (gRPC would have cancelled it)
            if not self.registration.on_register_answer(response):
                return  # tried again after the request timeout
            self.registering = False
            self._next_heartbeat_ms = now_ms
            self.trace(f"registered, broker epoch {self.registration.broker_epoch}")
        elif what[0] == "heartbeat":
            if what[1] != self.registration.broker_epoch or self.registering:
                return
            self._heartbeat_answered_ms = now_ms
            if self.registration.on_heartbeat_answer(response, now_ms):
                self.trace(f"heartbeat answered {pb.ErrorCode.Name(response.error_code)} "
                           f"fenced={response.is_fenced}: registering again")
                self.registering = True
                self.registration.begin()
                self._next_register_ms = now_ms
        elif what[0] in ("alter", "corrupt"):
            kind, partition = what
            transport = self.transport.get(partition.tp)
            if (transport is None or transport.partition is not partition
                    or message.call_id not in transport.calls):
                return  # an answer to an attempt already given up on
            core_id = transport.calls.pop(message.call_id)[2]
            results = (() if response.error_code != pb.NONE
                       else response.items if kind == "alter" else response.results)
            self._answer_core(partition, kind, core_id, results)

    def _answer_core(self, p: Partition, kind: str, core_id: int, results: Any) -> None:
        replica = p.replica
        if kind == "alter":
            on_answer, on_unsure = (replica.on_alter_partition_answer,
                                    replica.on_alter_partition_unsure)
        else:
            on_answer, on_unsure = (replica.on_corrupt_report_answer,
                                    replica.on_corrupt_report_unsure)
        ready = answer_to_core(results, lambda *args: on_answer(core_id, *args),
                               lambda now: on_unsure(core_id, now), self.now_ms)
        self._carry_out(p, ready)

    def _send_alter_partition(self, p: Partition, request: AlterPartitionRequest) -> None:
        self.trace(f"{p.tp[0]}-{p.tp[1]} propose ISR {request.new_isr}")
        call_id = self._call(pb.AlterPartitionRequest(
            broker_id=self.broker_id, broker_epoch=self.registration.broker_epoch,
            control_token=self.registration.control_token,
            items=[alter_partition_item(p, request)]), ("alter", p))
        self._transport(p).calls[call_id] = (self.now_ms, "alter", request.alter_id)

    def _send_corrupt_report(self, p: Partition, report: CorruptReport) -> None:
        call_id = self._call(pb.ReportCorruptReplicaRequest(
            broker_id=self.broker_id, broker_epoch=self.registration.broker_epoch,
            control_token=self.registration.control_token,
            replicas=[corrupt_replica_item(p, report)]), ("corrupt", p))
        self._transport(p).calls[call_id] = (self.now_ms, "corrupt", report.report_id)

    # -- the controller's requests: the product's ControlRequests

    def _on_controller_request(self, request: Any) -> Any:
        kind = type(request).__name__.removesuffix("Request")
        try:
            if isinstance(request, pb.LeaderAndIsrRequest):
                # The broker makes the new partitions' logs first, in a worker thread.
                self.control.create_logs(self.control.new_logs(request))
                response = self.control.leader_and_isr(request)
            elif isinstance(request, pb.UpdateMetadataRequest):
                logs_before = len(self.logs)
                response = self.control.update_metadata(request)
                self.counters["stray replicas removed"] += logs_before - len(self.logs)
            elif isinstance(request, pb.StopReplicaRequest):
                response = self.control.stop_replica(request)
            else:
                raise TypeError(f"broker cannot handle {request!r}")
        except BrokerNotAvailableError:
            self.counters[f"refused {kind} BROKER_NOT_AVAILABLE"] += 1
            return None  # gRPC UNAVAILABLE: the controller's sender retries
        if response.error_code != pb.NONE:
            self.counters[f"refused {kind} {pb.ErrorCode.Name(response.error_code)}"] += 1
        for item in getattr(response, "partitions", ()):
            self.counters[f"{kind} {pb.ErrorCode.Name(item.error_code)}"] += 1
        return response

    def _forget_partition(self, tp: TopicPartition) -> None:
        """``ReplicaManager._forget_partition``: the fetcher stops following it."""
        partition = self.partitions.pop(tp, None)
        if partition is not None:
            self._stop_following(partition)

    # -- carrying out: the ports the product's ReadyCarrier calls

    def _transport(self, p: Partition) -> Transport:
        transport = self.transport.get(p.tp)
        if transport is None or transport.partition is not p:
            transport = self.transport[p.tp] = Transport(p)
        return transport

    def _follow(self, p: Partition, leader_id: int, leader_epoch: int) -> None:
        transport = self._transport(p)
        transport.inflight_request_id = -1  # answers to the old assignment are not taken
        transport.next_fetch_ms = self.now_ms

    def _stop_following(self, p: Partition) -> None:
        self._follow(p, -1, -1)

    def _complete_wait(self, waiter_id: int, code: int) -> None:
        """The carrier's acks=all answers, sent once the Ready's HW was observed (the checks
        must learn of a commit before of its acknowledgement)."""
        self._completed.append((waiter_id, code))

    def answer_completed_waits(self) -> None:
        completed, self._completed = self._completed, []
        for waiter_id, code in completed:
            self._answer_wait(waiter_id, code)

    def _answer_wait(self, waiter_id: int, code: int) -> None:
        waiter = self.waiters.pop(waiter_id)
        self.counters["produce " + pb.ErrorCode.Name(code)] += 1
        if code in (pb.NONE, pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
            self.hooks.produce_acknowledged(self, waiter.partition, waiter, self.now_ms)
        self._send(waiter.client, ProduceResponse(waiter.request_id, waiter.partition.tp, code,
                                                  waiter.base_offset))

    def _carry_out(self, p: Partition, ready: Ready, fetched: Any = ()) -> None:
        """Carry ``ready`` out; a storage failure was told to the core by the carrier, and
        is this partition's alone (as the real fetcher and sender log and go on)."""
        try:
            self.carrier.apply(p, ready, fetched=fetched)
        except TidewaterError as e:
            self.counters["disk: " + e.error_name] += 1
            self.trace(f"{p.tp[0]}-{p.tp[1]}: carrying out failed: {e}")

    def observe(self, p: Partition, ready: Ready) -> None:
        """After each Ready: what the invariant checks look at."""
        if ready.persist or ready.appended:
            self.hooks.log_changed(self, p.tp, p.log)
        if ready.leadership_changed and p.is_leader:
            self.hooks.became_leader(self, p, self.now_ms)
        if p.is_leader and (ready.high_watermark_moved or ready.leadership_changed):
            self.hooks.observe_leader_hw(self, p, self.now_ms)
        if ready.error != pb.NONE:
            self.counters["refused " + pb.ErrorCode.Name(ready.error)] += 1

    # -- leader side of replication

    def _on_fetch(self, message: Fetch, now_ms: int) -> FetchResponse:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            check_fetch_topic_id(p, message.topic_id, self.metadata_cache.topic_names_by_id())
            diverging, read = serve_follower_fetch(
                p, self.carrier, message.replica_id, message.current_leader_epoch,
                message.fetch_offset, message.last_fetched_epoch, now_ms,
                isr_eligible=self.control.is_isr_eligible(message.replica_id,
                                                          message.replica_broker_epoch),
                broker_epoch=message.replica_broker_epoch)
        except TidewaterError as e:
            self.counters["serve fetch " + e.error_name] += 1
            return FetchResponse(message.request_id, message.tp, e.error_code)
        batches = p.log.read(message.fetch_offset, self.config.fetch_max_batches) if read else ()
        return FetchResponse(message.request_id, message.tp, pb.NONE, batches,
                             high_watermark=p.replica.high_watermark, diverging_epoch=diverging)

    def _on_offset_for_leader_epoch(self, message: OffsetForLeaderEpoch
                                    ) -> OffsetForLeaderEpochResponse:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            epoch, end_offset = serve_offset_for_leader_epoch(
                p, message.current_leader_epoch, message.leader_epoch, message.topic_id,
                self.metadata_cache.topic_names_by_id())
        except TidewaterError as e:
            return OffsetForLeaderEpochResponse(message.request_id, message.tp, e.error_code)
        return OffsetForLeaderEpochResponse(message.request_id, message.tp, pb.NONE, epoch,
                                            end_offset)

    def _on_produce(self, client: int, message: Produce, now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            records = SimRecords(message.record_count, message.payload_id, p.topic_id)
            # The append's base is the LEO before it (the wait may be answered from inside
            # the append's Ready, so it knows its batch from the start).
            base_offset = p.log.log_end_offset

            def open_wait(partition: Partition, timeout_ms: int) -> Waiter:
                waiter = Waiter(self._next_waiter_id, client, message.request_id, partition,
                                base_offset, base_offset + message.record_count)
                self._next_waiter_id += 1
                self.waiters[waiter.waiter_id] = waiter
                return waiter

            append_as_leader(p, records, -1, message.timeout_ms, open_wait=open_wait,
                             carrier=self.carrier, now_ms=now_ms, wall_now_ms=now_ms)
        except TidewaterError as e:
            self.counters["produce " + e.error_name] += 1
            self._send(client, ProduceResponse(message.request_id, message.tp, e.error_code))

    # -- follower side of replication

    def _take_answer(self, p: Partition | None, request_id: int) -> Transport | None:
        """The transport whose request in flight this answers, else None (it timed out, is
        older, or its replica is gone)."""
        if p is None:
            return None
        transport = self.transport.get(p.tp)
        if transport is None or transport.partition is not p:
            return None
        if request_id != transport.inflight_request_id:
            return None
        transport.inflight_request_id = -1
        return transport

    def _on_offset_for_leader_epoch_response(self, message: OffsetForLeaderEpochResponse,
                                             now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        transport = self._take_answer(p, message.request_id)
        if p is None or transport is None:
            return
        if message.error != pb.NONE:
            transport.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
        ready = p.replica.on_offset_for_leader_epoch_answer(
            transport.inflight_leader_epoch, message.error, (message.epoch, message.end_offset),
            now_ms)
        self._carry_out(p, ready)

    def _on_fetch_response(self, message: FetchResponse, now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        transport = self._take_answer(p, message.request_id)
        if p is None or transport is None:
            return
        if message.error != pb.NONE or not message.batches:
            transport.next_fetch_ms = now_ms + self.config.fetch_backoff_ms  # no long-poll
        ready = p.replica.on_fetch_answer(
            transport.inflight_leader_epoch, transport.inflight_fetch_offset, message.error,
            high_watermark=message.high_watermark, leader_log_start_offset=0,
            diverging_epoch=message.diverging_epoch, now_ms=now_ms)
        self._carry_out(p, ready, fetched=message.batches)

    # ------------------------------------------------------------------ helpers

    def _request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send(self, dst: int, message: Any) -> None:
        self.network.send(self.broker_id, dst, message, self.now_ms)


def _no_long_polls(tp: TopicPartition, leadership_changed: bool, high_watermark_moved: bool,
                   appended: bool) -> None:
    """The simulation's fetches do not long-poll: nobody to wake."""


def _ignore(value: int) -> None:
    pass
