"""The simulation loop: clock, network, controller, brokers, clients, faults, checks.

``Simulation(seed).run()`` is a pure function of the seed (and the decision
code it is given): every random choice comes from ``random.Random``s seeded
from it (cluster and topic IDs too) and time is a counter. Each step of
``step_ms``:

1. deliver the messages due (to the controller, live brokers, clients);
2. tick the controller (session expiry, preferred leaders, its senders) and the
   live brokers (registration, heartbeats, fetches, ISR checks);
3. producers send acks=all batches to the leader the controller names; the
   admin client creates topic ``t`` (CreateTopics, retried until accepted) and,
   in some seeds, deletes it and creates it again with the same shape;
4. faults: crash a broker (it may lose part of its unflushed tail; its
   heartbeat stream closes), restart one, cut links (a broker from everything,
   from the controller, or from one peer) for a while; crash the controller or
   make its next metadata write fail (a full disk), restart it later;
5. ``InvariantChecker.check_step``.

After ``chaos_ms`` the faults stop, links heal, the controller and down
brokers restart and the producers stop; after ``settle_ms`` the topic must
exist, every replica must hold the leader's log, be in the ISR, and the HW
must reach the LEO (the cluster converges); no broker may keep a log of a
deleted incarnation. A failure raises ``SimulationFailure`` naming the seed,
with the last trace lines.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from tidewater.broker.replicas.control import RefusalRule
from tidewater.broker.replication.control_rules import controller_request_refusal
from tidewater.broker.replication.replica import ReplicaState
from tidewater.broker.replication.topic_identity import log_identity_action
from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.owner import MetadataOwner
from tidewater.controller.quorum.owner import QuorumOwner
from tidewater.controller.raft import VoterKey
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation as ProductInvariantViolation

from .checker import InvariantChecker, InvariantViolation
from .messages import (
    ControllerAnswer,
    ControllerCall,
    HeartbeatStreamClosed,
    Produce,
    ProduceResponse,
    TopicPartition,
)
from .network import CONTROLLER, Network
from .sim_broker import BrokerConfig, ControllerChoice, IdentityRule, SimBroker
from .sim_controller import DOWN, RUNNING, SimController
from .sim_metadata_log import SimMetadataLog
from .sim_quorum import (
    SETTLE_ROUNDS,
    QuorumChecker,
    QuorumDisk,
    SimQuorumController,
    controller_address,
)

# Probabilities that one write of a kind fails (sim_log.DiskFaults.KINDS).
DISK_FAILS_SOMETIMES = {"append": 0.002, "truncate": 0.01, "epoch": 0.005, "flush": 0.01,
                        "checkpoint": 0.01}
DISK_FAILS_OFTEN = {"append": 0.02, "truncate": 0.1, "epoch": 0.05, "flush": 0.1,
                    "checkpoint": 0.1}

CLIENT_BASE = 100
ADMIN = 99  # the admin client's node
TOPIC = "t"


@dataclass(frozen=True)
class SimConfig:
    broker_count: int = 3
    partition_count: int = 2
    step_ms: int = 5
    chaos_ms: int = 10_000
    settle_ms: int = 5_000
    loss_probability: float = 0.02
    delay_ms_min: int = 1
    delay_ms_max: int = 25
    crash_per_broker_per_s: float = 0.15
    restart_delay_ms: tuple[int, int] = (50, 1500)
    cut_per_s: float = 0.4
    cut_duration_ms: tuple[int, int] = (100, 2500)
    # The controller's messages to one broker lost while the broker's reach it (its
    # heartbeats keep it unfenced, in the ISR, while it misses LeaderAndIsr requests).
    controller_to_broker_cut_per_s: float = 0.0
    # The same loss aimed: the chance that, when the controller moves a partition's
    # leader, its messages to that partition's follower furthest ahead are lost for an
    # ``aimed_cut_ms`` draw (it misses the move and what follows while it lasts).
    follower_misses_leader_move: float = 0.0
    # And the chance that, when the controller commits a new ISR under the same leader
    # (its AlterPartition, or a fenced member dropped), its messages to that leader are
    # lost: the leader does not learn the ISR the controller now counts.
    leader_misses_isr_change: float = 0.0
    aimed_cut_ms: tuple[int, int] = (1000, 4000)  # how long either aimed loss lasts
    produce_per_partition_per_s: float = 40.0
    produce_inflight_max: int = 5
    produce_timeout_ms: int = 1000
    session_timeout_ms: int = 600
    preferred_leader_interval_ms: int = 1500
    sender_request_timeout_ms: int = 250
    sender_retry_backoff_ms: int = 50
    sender_retry_backoff_max_ms: int = 500
    # The controller: crashes, and metadata writes that fail (a full disk: it exits at once).
    controller_crash_per_s: float = 0.0
    metadata_write_failure_per_s: float = 0.0
    controller_restart_delay_ms: tuple[int, int] = (50, 1500)
    # The old stop after an owner failure (streams, gRPC grace, senders): only an owner
    # without the fatal hook (a broken variant) takes it.
    controller_graceful_stop_ms: int = 2500
    # Topic t deleted and created again with the same shape, after a pause.
    recreate_per_s: float = 0.0
    recreate_pause_ms: tuple[int, int] = (0, 1500)
    admin_retry_ms: int = 200
    # A quorum of controllers (sim_quorum.py) when above 1: then controller_crash_per_s is
    # per controller, metadata_write_failure_per_s makes one controller's next Raft write
    # fail, and controller_cut_per_s cuts one controller off from everything or from the
    # other controllers only.
    controllers: int = 1
    controller_cut_per_s: float = 0.0
    broker: BrokerConfig = field(default_factory=BrokerConfig)

    @classmethod
    def for_seed(cls, seed: int) -> SimConfig:
        """Vary the shape of the run with the seed, so seeds cover different set-ups."""
        rng = random.Random(f"config-{seed}")
        # How a new follower finds its truncation point: OffsetForLeaderEpoch first,
        # diverging_epoch on fetch only, or OffsetForLeaderEpoch with pre-KIP-320 fetches.
        use_offset_for_leader_epoch, send_last_fetched_epoch = rng.choice(
            [(True, True), (False, True), (True, False)])
        broker = BrokerConfig(
            min_insync_replicas=rng.choice([1, 2, 2, 2]),
            use_offset_for_leader_epoch=use_offset_for_leader_epoch,
            send_last_fetched_epoch=send_last_fetched_epoch,
            replica_lag_time_max_ms=rng.choice([500, 800, 1200]))
        config = cls(partition_count=rng.randint(1, 3),
                   loss_probability=rng.choice([0.0, 0.01, 0.03, 0.06]),
                   delay_ms_max=rng.choice([5, 25, 60]),
                   crash_per_broker_per_s=rng.choice([0.1, 0.2, 0.4, 0.8]),
                   cut_per_s=rng.choice([0.2, 0.5, 1.0]),
                   preferred_leader_interval_ms=rng.choice([300, 1500]),
                   controller_crash_per_s=rng.choice([0.0, 0.0, 0.1, 0.3]),
                   metadata_write_failure_per_s=rng.choice([0.0, 0.0, 0.1, 0.3]),
                   recreate_per_s=rng.choice([0.0, 0.0, 0.15, 0.4]),
                   broker=broker)
        # A disk that fails now and then: appends, truncations, epoch-cache writes, flushes
        # and checkpoints (drawn last, so the draws above stay the seed's).
        disk = rng.choice([{}, {}, DISK_FAILS_SOMETIMES, DISK_FAILS_OFTEN])
        return replace(config, broker=replace(broker, disk_failure_probabilities=disk))

    @classmethod
    def quorum_for_seed(cls, seed: int, controllers: int = 3) -> SimConfig:
        """The seed's run with a quorum of controllers and the quorum's own faults (drawn
        apart, so the rest of the seed's shape is ``for_seed``'s)."""
        rng = random.Random(f"quorum-config-{seed}")
        return replace(cls.for_seed(seed), controllers=controllers,
                       controller_crash_per_s=rng.choice([0.03, 0.1, 0.2]),
                       controller_cut_per_s=rng.choice([0.0, 0.1, 0.3]),
                       metadata_write_failure_per_s=rng.choice([0.0, 0.03, 0.1]))


class SimulationFailure(AssertionError):
    pass


@dataclass
class SimResult:
    seed: int
    config: SimConfig
    end_ms: int
    steps: int
    acked: int
    committed_batches: int
    leader_changes: int
    leaderships: int  # distinct (incarnation, partition, leader epoch) led
    crashes: int
    controller_crashes: int
    metadata_write_failures: int
    topic_incarnations: int
    excused_losses: list[str]
    messages_sent: int
    messages_dropped: int
    counters: dict[str, int]  # decision paths the brokers (and controller transport) took


class Admin:
    """The admin client: creates topic ``t``, and in some seeds deletes and re-creates it."""

    def __init__(self, controller_ids: list[int]):
        self.controller_choice = ControllerChoice(controller_ids)  # as a broker's
        self.last_call_id = -1
        self.state = "create"  # create | exists | delete | pause
        self.calls: dict[int, str] = {}  # call id -> the state it was sent in
        self.next_call_id = 0
        self.next_try_ms = 0
        self.pause_until_ms = 0
        self.created = 0  # CreateTopics answered NONE (an answer may be lost)


class Producer:
    """An acks=all client of one partition that asks the controller who leads."""

    def __init__(self, client_id: int, tp):
        self.client_id = client_id
        self.tp = tp
        self.inflight: dict[int, int] = {}  # request id -> send time
        self.next_request_id = 1
        self.errors: dict[int, int] = {}  # ErrorCode -> answers received


class Simulation:
    def __init__(self, seed: int, config: SimConfig | None = None, *,
                 replica_class: type[ReplicaState] = ReplicaState,
                 owner_class: type[MetadataOwner] = MetadataOwner,
                 identity_rule: IdentityRule = log_identity_action,
                 refusal_rule: RefusalRule = controller_request_refusal,
                 quorum_owner_class: type[QuorumOwner] = QuorumOwner,
                 trace_lines: int = 300, verbose: bool = False):
        self.seed = seed
        self.config = config or SimConfig.for_seed(seed)
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.steps = 0
        self.verbose = verbose
        self._trace: deque[str] = deque(maxlen=trace_lines)
        cfg = self.config
        self.partitions = [TopicPartition(TOPIC, i) for i in range(cfg.partition_count)]
        self.network = Network(self.rng, loss_probability=cfg.loss_probability,
                               delay_ms_min=cfg.delay_ms_min, delay_ms_max=cfg.delay_ms_max)
        broker_ids = list(range(1, cfg.broker_count + 1))
        self.metadata_log = SimMetadataLog(random.Random(f"metadata-disk-{seed}"))
        ids = random.Random(f"ids-{seed}")
        controller_config = ControllerConfig(
            broker_session_timeout_ms=cfg.session_timeout_ms,
            min_insync_replicas=cfg.broker.min_insync_replicas,
            default_replication_factor=cfg.broker_count,
            leader_imbalance_check_interval_seconds=cfg.preferred_leader_interval_ms / 1000,
            sender_request_timeout_ms=cfg.sender_request_timeout_ms,
            sender_retry_backoff_ms=cfg.sender_retry_backoff_ms,
            sender_retry_backoff_max_ms=cfg.sender_retry_backoff_max_ms)

        def uuid4() -> uuid.UUID:
            return uuid.UUID(int=ids.getrandbits(128), version=4)

        # One controller (SimController over the JSON metadata log), or a quorum.
        self.quorum: dict[int, SimQuorumController] | None = None
        self.quorum_checker = QuorumChecker()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._quorum_restart_at_ms: dict[int, int] = {}
        self._committed_at_chaos_end = -1
        if cfg.controllers > 1:
            self.loop = asyncio.new_event_loop()
            # An exception in a callback (a future's done callback) is only logged by
            # asyncio: the step raises it instead.
            self._loop_errors: list[BaseException] = []
            self.loop.set_exception_handler(
                lambda loop, context: self._loop_errors.append(
                    context.get("exception") or RuntimeError(context["message"])))
            disk_ids = random.Random(f"quorum-disks-{seed}")
            disks = {i: QuorumDisk(f"{disk_ids.getrandbits(128):032x}")
                     for i in range(1, cfg.controllers + 1)}
            voters = frozenset(VoterKey(i, d.directory_id) for i, d in disks.items())
            self.quorum = {i: SimQuorumController(
                self.network, controller_config, node_id=i, disk=disk, voters=voters,
                checker=self.quorum_checker, loop=self.loop,
                rng=random.Random(f"controller-{seed}-{i}"), clock_ms=lambda: self.now_ms,
                uuid4=uuid4, trace=self.trace, owner_class=quorum_owner_class)
                for i, disk in disks.items()}
            self.controller_addresses = {i: controller_address(i) for i in self.quorum}
        else:
            self._controller = SimController(
                self.network, self.metadata_log, controller_config,
                clock_ms=lambda: self.now_ms, uuid4=uuid4, trace=self.trace,
                owner_class=owner_class, graceful_stop_ms=cfg.controller_graceful_stop_ms)
            if cfg.follower_misses_leader_move or cfg.leader_misses_isr_change:
                # Else no hook and no draw: the other set-ups' runs stay as they were.
                self._controller.on_partition_change = self._aimed_controller_loss
            self.controller_addresses = {-1: CONTROLLER}
        self.checker = InvariantChecker(self)
        self.brokers: dict[int, SimBroker] = {
            b: SimBroker(b, self.network, self.rng, cfg.broker, self,
                         replica_class=replica_class, identity_rule=identity_rule,
                         refusal_rule=refusal_rule, controllers=self.controller_addresses)
            for b in broker_ids}
        self.producers = [Producer(CLIENT_BASE + i, tp) for i, tp in enumerate(self.partitions)]
        self.admin = Admin(list(self.controller_addresses))
        self._restart_at_ms: dict[int, float] = {}
        self._controller_restart_at_ms = math.inf
        self._scheduled: list[tuple[int, int, object]] = []  # (at_ms, sequence, action)
        self._schedule_sequence = 0
        self._scripted = False
        self._variants = {name: value.__name__ for name, value, default in (
            ("replica_class", replica_class, ReplicaState),
            ("owner_class", owner_class, MetadataOwner),
            ("identity_rule", identity_rule, log_identity_action),
            ("refusal_rule", refusal_rule, controller_request_refusal),
            ("quorum_owner_class", quorum_owner_class, QuorumOwner)) if value is not default}
        self._next_payload_id = 1
        self.crashes = 0
        if self.quorum is None:
            self._controller.start(0)
        else:
            self.loop.run_until_complete(self._start_quorum())

    async def _start_quorum(self) -> None:
        for controller in self.quorum.values():
            controller.start(0)

    @property
    def controller(self) -> SimController:
        """The controller whose image the checks read: the one controller, or the quorum
        controller that applied the most (every applied image is committed state)."""
        if self.quorum is None:
            return self._controller
        return max(self.quorum.values(), key=lambda c: c.applied_offset)

    @property
    def controllers(self) -> list[SimController]:
        return [self._controller] if self.quorum is None else list(self.quorum.values())

    # ------------------------------------------------------------------ hooks for brokers

    def trace(self, now_ms: int, line: str) -> None:
        text = f"{now_ms:>6} {line}"
        self._trace.append(text)
        if self.verbose:
            print(text)

    def observe_leader_hw(self, broker, p, now_ms: int) -> None:
        self.checker.observe_leader_hw(broker, p, now_ms)

    def produce_acknowledged(self, broker, p, waiter, now_ms: int) -> None:
        self.checker.produce_acknowledged(broker, p, waiter, now_ms)

    def log_changed(self, broker, tp, log) -> None:
        self.checker.log_changed(broker, tp, log)

    def became_leader(self, broker, p, now_ms: int) -> None:
        self.checker.became_leader(broker, p, now_ms)

    # ------------------------------------------------------------------ views for the checker

    def is_registered_and_alive(self, broker_id: int) -> bool:
        broker = self.brokers[broker_id]
        registration = self.controller.broker(broker_id)
        return (broker.alive and registration is not None
                and registration.broker_epoch == broker.broker_epoch)

    def acting_leader(self, tp) -> SimBroker | None:
        """The controller's leader, if it is alive, registered and leads the current
        incarnation in the current epoch."""
        record = self.controller.partition(tp)
        if record is None or record.leader < 0 or not self.is_registered_and_alive(record.leader):
            return None
        broker = self.brokers[record.leader]
        p = broker.partitions.get(tp)
        if (p is None or p.topic_id != record.topic_id or not p.is_leader
                or p.leader_epoch != record.leader_epoch):
            return None
        return broker

    def replica_log(self, broker_id: int, tp):
        """Broker ``broker_id``'s log of the current incarnation of ``tp`` (None: it has none)."""
        record = self.controller.partition(tp)
        return None if record is None else self.brokers[broker_id].replica_log(tp, record.topic_id)

    def leader_of(self, tp) -> int:
        """The leader the controller names now (-1: none, or no such partition now)."""
        record = self.controller.partition(tp)
        return -1 if record is None else record.leader

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        cfg = self.config
        end_ms = cfg.chaos_ms + cfg.settle_ms
        try:
            while self.now_ms < end_ms:
                chaos = self.now_ms < cfg.chaos_ms
                if not chaos and self._committed_at_chaos_end < 0:
                    self._committed_at_chaos_end = len(self.quorum_checker.committed)
                self.step(chaos=chaos)
            self.check_converged()
        except ProductInvariantViolation as e:
            # The quorum's checks (raft_cluster.RaftChecker, the owner, MetadataApplication)
            # raise the product's type, without the seed and time the checker's names.
            text = (str(e) if isinstance(e, InvariantViolation)
                    else f"seed {self.seed} at {self.now_ms} ms: {e}")
            raise SimulationFailure(self._failure_text(text)) from None
        finally:
            self._close_loop()
        counters = sum((b.counters for b in self.brokers.values()), Counter())
        for controller in self.controllers:
            counters.update(controller.counters)
        if self.quorum is not None:
            counters["quorum: metadata entries committed"] = len(self.quorum_checker.committed)
            counters["quorum: epochs with an active controller"] = len(
                self.quorum_checker.active_of_epoch)
            counters["quorum: controller cuts"] = self._controller_cuts
        metadata_write_failures = (self.metadata_log.failed_appends if self.quorum is None else
                                   sum(c.disk.failed_writes for c in self.quorum.values()))
        return SimResult(self.seed, cfg, self.now_ms, self.steps, self.checker.stats.acked,
                         self.checker.stats.committed_batches,
                         sum(c.leader_changes for c in self.controllers),
                         self.checker.stats.leaderships, self.crashes,
                         sum(c.crashes for c in self.controllers), metadata_write_failures,
                         len({topic_id for topic_id, _ in self.checker.committed}),
                         self.checker.stats.excused_losses,
                         self.network.sent, self.network.dropped, dict(counters))

    def _close_loop(self) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        for controller in self.quorum.values():
            controller.end_of_run()  # cancels its owner's tasks
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

    def step(self, *, chaos: bool) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self._quorum_step(chaos=chaos))
            return
        cfg = self.config
        self.now_ms += cfg.step_ms
        self.steps += 1
        now = self.now_ms
        while self._scheduled and self._scheduled[0][0] <= now:
            _, _, action = heapq.heappop(self._scheduled)
            action()
        for envelope in self.network.deliverable(now):
            if envelope.dst == CONTROLLER:
                self._controller.handle(envelope.src, envelope.message, now)
            else:
                self._deliver(envelope, now)
        if self._controller.state == DOWN and now >= self._controller_restart_at_ms:
            self._controller_restart_at_ms = math.inf
            self._controller.start(now)
            self._after_controller_call(now)
        self._controller.tick(now)
        self._after_controller_call(now)
        self._brokers_and_clients(now, chaos=chaos)
        self.checker.check_step(now)

    def _deliver(self, envelope, now: int) -> None:
        if envelope.dst == ADMIN:
            self._admin_answer(envelope.message, now)
        elif envelope.dst >= CLIENT_BASE:
            self._producer_response(envelope.dst, envelope.message)
        else:
            broker = self.brokers[envelope.dst]
            if broker.alive:
                broker.handle(envelope.src, envelope.message, now)

    def _brokers_and_clients(self, now: int, *, chaos: bool) -> None:
        for broker in self.brokers.values():
            if broker.alive:
                broker.tick(now)
        if chaos:
            self._produce(now)
            self._faults(now)
        else:
            self._heal(now)
        self._admin(now, chaos=chaos)

    async def _quorum_step(self, *, chaos: bool) -> None:
        """A step with a quorum of controllers, inside the event loop their owners run on:
        the same order as ``step``; at its end the loop runs until its commands are idle."""
        assert self.quorum is not None
        self.now_ms += self.config.step_ms
        self.steps += 1
        now = self.now_ms
        while self._scheduled and self._scheduled[0][0] <= now:
            _, _, action = heapq.heappop(self._scheduled)
            action()
        for envelope in self.network.deliverable(now):
            if envelope.dst < 0:
                self.quorum[-envelope.dst].handle(envelope.src, envelope.message, now)
            else:
                self._deliver(envelope, now)
        for node_id, controller in self.quorum.items():
            if controller.state == DOWN and now >= self._quorum_restart_at_ms.get(node_id,
                                                                                 math.inf):
                del self._quorum_restart_at_ms[node_id]
                controller.start(now)
            controller.tick(now)
        self._brokers_and_clients(now, chaos=chaos)
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)
        if self._loop_errors:
            error = self._loop_errors[0]
            if isinstance(error, ProductInvariantViolation):
                raise error
            raise ProductInvariantViolation(f"the controllers' event loop: {error!r}") from error
        for node_id, controller in self.quorum.items():
            while controller.activated_epochs:
                epoch = controller.activated_epochs.pop(0)
                if epoch != controller.active_epoch and controller.state == RUNNING:
                    raise ProductInvariantViolation(
                        f"controller {node_id} became active with controller epoch {epoch} "
                        f"in its image, not its Raft epoch {controller.active_epoch}: its "
                        f"start records had not committed")
                self.quorum_checker.on_active(node_id, epoch)
            owner = controller.quorum_owner
            if owner is not None and owner.failure is not None:
                raise ProductInvariantViolation(f"controller {node_id}'s owner failed: "
                                                f"{owner.failure!r}")
            if controller.active_epoch:  # one active controller per epoch, at every step
                self.quorum_checker.on_active(node_id, controller.active_epoch)
            if controller.state == DOWN and node_id not in self._quorum_restart_at_ms:
                self._quorum_restart_at_ms[node_id] = now + self.rng.randint(
                    *self.config.controller_restart_delay_ms)
        self.checker.check_step(now)

    def check_converged(self) -> None:
        if self.quorum is not None:
            self._check_quorum_converged()
        if self.admin.state != "exists":
            self.checker.fail(self.now_ms, f"topic {TOPIC} was not created again after settling "
                                           f"(admin: {self.admin.state})")
        for tp in self.partitions:
            record = self.controller.partition(tp)
            leader = self.acting_leader(tp)
            if leader is None:
                self.checker.fail(self.now_ms, f"{tp} has no acting leader after settling: "
                                                f"{record}")
            p = leader.partitions[tp]
            if sorted(p.replica.leader.isr) != sorted(record.replicas):
                self.checker.fail(self.now_ms, f"{tp} ISR {p.replica.leader.isr} did not recover "
                                                f"to all replicas {record.replicas}")
            if p.replica.leader.high_watermark != p.log.log_end_offset:
                self.checker.fail(self.now_ms, f"{tp} HW {p.replica.leader.high_watermark} "
                                                f"stuck below LEO {p.log.log_end_offset}")
            for broker in self.brokers.values():
                log = broker.logs.get(tp)
                if log is not None and log.topic_id != record.topic_id:
                    self.checker.fail(self.now_ms, f"{tp}: broker {broker.broker_id} still holds "
                                                    f"a log of a deleted incarnation")
                if broker.broker_id in record.replicas and (
                        log is None or log.batches != p.log.batches):
                    self.checker.fail(self.now_ms, f"{tp}: broker {broker.broker_id} log "
                                                    f"differs from leader {leader.broker_id}")

    # ------------------------------------------------------------------ producers

    def _produce(self, now_ms: int) -> None:
        cfg = self.config
        chance = cfg.produce_per_partition_per_s * cfg.step_ms / 1000
        for producer in self.producers:
            for request_id, sent_ms in list(producer.inflight.items()):
                if now_ms - sent_ms > cfg.produce_timeout_ms + 500:
                    del producer.inflight[request_id]  # lost: give up on it
            if len(producer.inflight) >= cfg.produce_inflight_max or self.rng.random() >= chance:
                continue
            leader = self.leader_of(producer.tp)
            if leader < 0:
                continue
            request_id = producer.next_request_id
            producer.next_request_id += 1
            producer.inflight[request_id] = now_ms
            payload_id = self._next_payload_id
            self._next_payload_id += 1
            self.network.send(producer.client_id, leader,
                              Produce(request_id, producer.tp, self.rng.randint(1, 3), payload_id,
                                      cfg.produce_timeout_ms), now_ms)

    def _producer_response(self, client_id: int, message: ProduceResponse) -> None:
        producer = self.producers[client_id - CLIENT_BASE]
        if producer.inflight.pop(message.request_id, None) is None:
            return
        producer.errors[message.error] = producer.errors.get(message.error, 0) + 1

    # ------------------------------------------------------------------ faults

    def _faults(self, now_ms: int) -> None:
        cfg = self.config
        step_s = cfg.step_ms / 1000
        for broker_id, broker in self.brokers.items():
            if broker.alive and self.rng.random() < cfg.crash_per_broker_per_s * step_s:
                self._crash(broker, now_ms)
            elif not broker.alive and now_ms >= self._restart_at_ms.get(broker_id, math.inf):
                self._restart(broker, now_ms)
        if self.rng.random() < cfg.cut_per_s * step_s:
            duration = self.rng.randint(*cfg.cut_duration_ms)
            broker_id = self.rng.choice(list(self.brokers))
            kind = self.rng.choice(["isolate", "controller", "peer"])
            if kind == "isolate":
                others = [*self.controller_addresses.values(), *self.brokers,
                          *(p.client_id for p in self.producers)]
                self.network.isolate(broker_id, others, now_ms + duration)
            elif kind == "controller":
                self.network.cut(broker_id, self.brokers[broker_id].controller_address,
                                 now_ms + duration)
            else:
                peer = self.rng.choice([b for b in self.brokers if b != broker_id])
                self.network.cut(broker_id, peer, now_ms + duration)
            self.trace(now_ms, f"network: cut {kind} broker {broker_id} for {duration} ms")
        if (cfg.controller_to_broker_cut_per_s
                and self.rng.random() < cfg.controller_to_broker_cut_per_s * step_s):
            duration = self.rng.randint(*cfg.cut_duration_ms)
            broker_id = self.rng.choice(list(self.brokers))
            self.network.cut_one_way(self.brokers[broker_id].controller_address, broker_id,
                                     now_ms + duration)
            self.trace(now_ms, f"network: the controller's messages to broker {broker_id} are "
                               f"lost for {duration} ms")
        if self.quorum is not None:
            self._quorum_faults(now_ms)
        elif self._controller.state == RUNNING:
            if self.rng.random() < cfg.controller_crash_per_s * step_s:
                self._crash_controller(now_ms)
            elif (self.rng.random() < cfg.metadata_write_failure_per_s * step_s
                  and not self.metadata_log.fail_next_append):
                self.trace(now_ms, "controller: its disk is full: the next metadata write fails")
                self.metadata_log.fail_next_append = True
        if (self.admin.state == "exists"
                and self.rng.random() < cfg.recreate_per_s * step_s):
            self.trace(now_ms, f"admin: delete topic {TOPIC}, then create it again")
            self.admin.state = "delete"
            self.admin.next_try_ms = now_ms

    def _aimed_controller_loss(self, old: PartitionRecord, new: PartitionRecord,
                               now_ms: int) -> None:
        """``follower_misses_leader_move`` and ``leader_misses_isr_change``: called as the
        controller commits a partition's change, before it sends the requests that
        announce it."""
        cfg = self.config
        if old.leader != new.leader:
            if self.rng.random() >= cfg.follower_misses_leader_move:
                return
            followers = [b for b in new.replicas if b != new.leader and b in self.brokers]
            if not followers:
                return
            # The follower furthest ahead: the one whose tail the new leader may not have.
            tp = TopicPartition(new.topic, new.partition)

            def log_end(b: int) -> int:
                replica = self.brokers[b].partitions.get(tp)
                return -1 if replica is None else replica.log.log_end_offset
            broker_id = max(followers, key=lambda b: (log_end(b), -b))
            why = "leader moves"
        elif old.isr != new.isr and new.leader in self.brokers:
            if self.rng.random() >= cfg.leader_misses_isr_change:
                return
            broker_id, why = new.leader, "ISR changes"
        else:
            return
        duration = self.rng.randint(*cfg.aimed_cut_ms)
        self.network.cut_one_way(self.brokers[broker_id].controller_address, broker_id,
                                 now_ms + duration)
        self.trace(now_ms, f"network: the controller's messages to broker {broker_id} are "
                           f"lost for {duration} ms ({new.topic}-{new.partition}'s {why})")

    _controller_cuts = 0

    def _check_quorum_converged(self) -> None:
        """After settling: every controller runs, exactly one is active, and each applied
        every metadata record committed by the end of the faults (none was lost)."""
        assert self.quorum is not None
        down = [i for i, c in self.quorum.items() if c.state != RUNNING]
        if down:
            self.checker.fail(self.now_ms, f"controllers {down} are not running after settling")
        active = [i for i, c in self.quorum.items() if c.active_epoch]
        if len(active) != 1:
            self.checker.fail(self.now_ms, f"{len(active)} active controllers after settling: "
                                           f"{active}")
        behind = {i: c.applied_offset for i, c in self.quorum.items()
                  if c.applied_offset < self._committed_at_chaos_end}
        if behind:
            self.checker.fail(self.now_ms, f"controllers {behind} did not apply the "
                                           f"{self._committed_at_chaos_end} metadata entries "
                                           f"committed during the faults")

    def _quorum_faults(self, now_ms: int) -> None:
        """Each controller crashes, or its next Raft write fails; one is cut off from
        everything (as SIGSTOP) or from the other controllers only."""
        assert self.quorum is not None
        cfg = self.config
        step_s = cfg.step_ms / 1000
        for node_id, controller in self.quorum.items():
            if controller.state == RUNNING and (
                    self.rng.random() < cfg.controller_crash_per_s * step_s):
                controller.crash(now_ms)
            if (self.rng.random() < cfg.metadata_write_failure_per_s * step_s
                    and not controller.disk.fail_next_write):
                self.trace(now_ms, f"controller {node_id}: its disk is full: the next raft "
                                   f"write fails")
                controller.disk.fail_next_write = True
        if cfg.controller_cut_per_s and self.rng.random() < cfg.controller_cut_per_s * step_s:
            node_id = self.rng.choice(list(self.quorum))
            duration = self.rng.randint(*cfg.cut_duration_ms)
            kind = self.rng.choice(["isolate", "quorum"])
            others = [controller_address(i) for i in self.quorum]
            if kind == "isolate":
                others += [ADMIN, *self.brokers]
            self.network.isolate(controller_address(node_id), others, now_ms + duration)
            self._controller_cuts += 1
            self.trace(now_ms, f"network: cut controller {node_id} off ({kind}) for "
                               f"{duration} ms")

    def _crash_controller(self, now_ms: int) -> None:
        self._controller.crash(now_ms)
        self._after_controller_call(now_ms)

    def _after_controller_call(self, now_ms: int) -> None:
        """A controller that went down (crash, failed write, graceful stop) restarts later."""
        if self._controller.state == DOWN and self._controller_restart_at_ms == math.inf:
            self._controller_restart_at_ms = now_ms + self.rng.randint(
                *self.config.controller_restart_delay_ms)

    def _crash(self, broker: SimBroker, now_ms: int, *, lose_unflushed: bool = True,
               keep_offset: int | None = None, restart_after_ms: int | None = None) -> None:
        self.crashes += 1
        batches_before = {tp: (log.topic_id, list(log.batches)) for tp, log in broker.logs.items()}
        broker.crash(now_ms, lose_unflushed=lose_unflushed, keep_offset=keep_offset)
        # Its kernel closes the heartbeat stream's connection (lost if the link is cut).
        self.network.send(broker.broker_id, broker.controller_address,
                          HeartbeatStreamClosed(broker.broker_id, broker.heartbeat_stream), now_ms)
        self.checker.crashed(broker, batches_before, now_ms)
        if restart_after_ms is None:
            restart_after_ms = self.rng.randint(*self.config.restart_delay_ms)
        self._restart_at_ms[broker.broker_id] = now_ms + restart_after_ms
        self.trace(now_ms, f"broker {broker.broker_id}: crashed")

    def _restart(self, broker: SimBroker, now_ms: int) -> None:
        broker.restart(now_ms)
        self.trace(now_ms, f"broker {broker.broker_id}: restarted (incarnation "
                           f"{broker.incarnation})")

    def _heal(self, now_ms: int) -> None:
        self.network.heal_all()
        self.network.loss_probability = 0.0
        self.metadata_log.fail_next_append = False
        for broker in self.brokers.values():
            broker.heal_disk()
        if self.quorum is not None:
            for node_id, controller in self.quorum.items():
                controller.disk.fail_next_write = False
                if controller.state == DOWN:
                    self._quorum_restart_at_ms[node_id] = now_ms  # restarted at the next step
        elif self._controller.state == DOWN and self._controller_restart_at_ms > now_ms:
            self._controller_restart_at_ms = now_ms  # restarted at the next step
        for broker in self.brokers.values():
            if not broker.alive:
                self._restart(broker, now_ms)

    # ------------------------------------------------------------------ the admin client

    def _admin(self, now_ms: int, *, chaos: bool) -> None:
        admin = self.admin
        if admin.state == "pause" and now_ms >= admin.pause_until_ms:
            admin.state = "create"
            admin.next_try_ms = now_ms
        if admin.state not in ("create", "delete") or now_ms < admin.next_try_ms:
            return
        admin.next_try_ms = now_ms + self.config.admin_retry_ms
        if self.quorum is not None and admin.last_call_id in admin.calls:
            admin.controller_choice.on_unavailable()  # the last try went unanswered
        if admin.state == "create":
            request = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
                name=TOPIC, num_partitions=self.config.partition_count,
                replication_factor=self.config.broker_count)])
        else:
            request = pb.DeleteTopicsRequest(names=[TOPIC])
        admin.next_call_id += 1
        admin.calls[admin.next_call_id] = admin.state
        admin.last_call_id = admin.next_call_id
        address = self.controller_addresses[admin.controller_choice.current_id]
        self.network.send(ADMIN, address, ControllerCall(admin.next_call_id, request), now_ms)

    def _admin_answer(self, message: ControllerAnswer, now_ms: int) -> None:
        admin = self.admin
        sent_in = admin.calls.pop(message.call_id, None)
        if message.not_controller:
            admin.controller_choice.on_unavailable(message.leader_hint)
            return
        if sent_in != admin.state:
            return  # an answer to a call of an earlier step of the cycle
        code = message.response.topics[0].error_code
        if admin.state == "create" and code in (pb.NONE, pb.TOPIC_ALREADY_EXISTS):
            admin.state = "exists"
            if code == pb.NONE:
                admin.created += 1
                self.trace(now_ms, f"admin: topic {TOPIC} created, incarnation "
                                   f"{admin.created}")
        elif admin.state == "delete" and code in (pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION):
            admin.state = "pause"
            admin.pause_until_ms = now_ms + self.rng.randint(*self.config.recreate_pause_ms)
            self.trace(now_ms, f"admin: topic {TOPIC} deleted")

    # ------------------------------------------------------------------ scripted scenarios

    def at(self, at_ms: int, action) -> None:
        """Run ``action()`` at the start of the first step at or after ``at_ms``."""
        self._schedule_sequence += 1
        self._scripted = True
        heapq.heappush(self._scheduled, (at_ms, self._schedule_sequence, action))

    def produce(self, tp, record_count: int = 1) -> None:
        """Send one acks=all batch of ``tp`` to the leader the controller names now."""
        producer = next(p for p in self.producers if p.tp == tp)
        leader = self.leader_of(tp)
        if leader < 0:
            self.trace(self.now_ms, f"client: {tp} has no leader, produce skipped")
            return
        request_id = producer.next_request_id
        producer.next_request_id += 1
        producer.inflight[request_id] = self.now_ms
        payload_id = self._next_payload_id
        self._next_payload_id += 1
        self.network.send(producer.client_id, leader,
                          Produce(request_id, tp, record_count, payload_id,
                                  self.config.produce_timeout_ms), self.now_ms)

    def crash(self, broker_id: int, *, lose_unflushed: bool = True,
              keep_offset: int | None = None) -> None:
        """Crash now; it stays down until ``restart`` (or the settle phase).

        ``keep_offset``: the logs keep exactly the batches below it (an unclean
        shutdown that cut the segment there), whatever was flushed.
        """
        self._crash(self.brokers[broker_id], self.now_ms, lose_unflushed=lose_unflushed,
                    keep_offset=keep_offset, restart_after_ms=10**9)

    def restart(self, broker_id: int) -> None:
        self._restart(self.brokers[broker_id], self.now_ms)

    def cut(self, a: int, b: int, duration_ms: int) -> None:
        self.network.cut(a, b, self.now_ms + duration_ms)
        self.trace(self.now_ms, f"network: cut {a} <-> {b} for {duration_ms} ms")

    def isolate(self, broker_id: int, duration_ms: int) -> None:
        """Cut a broker off from every node (as SIGSTOP does: it sends and answers nothing)."""
        others = [*self.controller_addresses.values(), ADMIN, *self.brokers,
                  *(p.client_id for p in self.producers)]
        self.network.isolate(broker_id, others, self.now_ms + duration_ms)
        self.trace(self.now_ms, f"network: isolate {broker_id} for {duration_ms} ms")

    def heal(self) -> None:
        self.network.heal_all()
        self.trace(self.now_ms, "network: healed")

    def crash_controller(self) -> None:
        """Crash the controller now; it restarts after the configured delay."""
        self._crash_controller(self.now_ms)

    def fail_next_metadata_write(self, reached_disk_bytes: int | None = None) -> None:
        """The controller's disk is full: its next metadata write fails, and
        ``reached_disk_bytes`` of it are on the disk anyway (None: a random part)."""
        self.metadata_log.fail_next_append = True
        self.metadata_log.failed_append_bytes = reached_disk_bytes

    def recreate_topic(self) -> None:
        """The admin client deletes topic t and creates it again (same shape)."""
        self.admin.state = "delete"
        self.admin.next_try_ms = self.now_ms

    def _failure_text(self, message: str) -> str:
        lines = "\n".join(self._trace)
        variant = self._variants
        if self.config == SimConfig.for_seed(self.seed) and not self._scripted and not variant:
            how = f"cd tests && ../.venv/bin/python -m sim.run --seed {self.seed} --verbose"
        elif (self.config == SimConfig.quorum_for_seed(self.seed, self.config.controllers)
              and not self._scripted and not variant):
            how = (f"cd tests && ../.venv/bin/python -m sim.run --controllers "
                   f"{self.config.controllers} --seed {self.seed} --verbose")
        else:
            how = (f"Simulation({self.seed}, <the config below>"
                   + "".join(f", {k}={v}" for k, v in variant.items())
                   + (") with the same script" if self._scripted else ")"))
        return (f"{message}\nreproduce: {how}\nconfig: {self.config}\n"
                f"last trace lines:\n{lines}")
