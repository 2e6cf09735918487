"""The simulation loop: clock, network, controller, brokers, producers, faults, checks.

``Simulation(seed).run()`` is a pure function of the seed (and the decision
code it is given): every random choice comes from one ``random.Random(seed)``
and time is a counter. Each step of ``step_ms``:

1. deliver the messages due (to the controller, live brokers, clients);
2. tick the controller and the live brokers (heartbeats, fetches, ISR checks);
3. producers send acks=all batches to the leader the controller names;
4. faults: crash a broker (it may lose part of its unflushed tail), restart
   one, cut links (a broker from everything, from the controller, or from one
   peer) for a while;
5. ``InvariantChecker.check_step``.

After ``chaos_ms`` the faults stop, links heal, down brokers restart and the
producers stop; after ``settle_ms`` every replica must hold the leader's log,
be in the ISR, and the HW must reach the LEO (the cluster converges).
A failure raises ``SimulationFailure`` naming the seed, with the last trace
lines.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field

from tidewater.broker.replication.replica import ReplicaState

from .checker import InvariantChecker, InvariantViolation
from .messages import Produce, ProduceResponse
from .network import CONTROLLER, Network
from .sim_broker import LEADER, BrokerConfig, SimBroker
from .sim_controller import SimController

CLIENT_BASE = 100


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
    produce_per_partition_per_s: float = 40.0
    produce_inflight_max: int = 5
    produce_timeout_ms: int = 1000
    session_timeout_ms: int = 600
    push_interval_ms: int = 250
    preferred_leader_interval_ms: int = 1500
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
        return cls(partition_count=rng.randint(1, 3),
                   loss_probability=rng.choice([0.0, 0.01, 0.03, 0.06]),
                   delay_ms_max=rng.choice([5, 25, 60]),
                   crash_per_broker_per_s=rng.choice([0.1, 0.2, 0.4, 0.8]),
                   cut_per_s=rng.choice([0.2, 0.5, 1.0]),
                   preferred_leader_interval_ms=rng.choice([300, 1500]),
                   broker=broker)


class SimulationFailure(AssertionError):
    pass


@dataclass
class SimResult:
    seed: int
    config: SimConfig
    end_ms: int
    acked: int
    committed_batches: int
    leader_changes: int
    crashes: int
    excused_losses: list[str]
    messages_sent: int
    messages_dropped: int
    counters: dict[str, int]  # decision paths the brokers took, summed


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
                 trace_lines: int = 300, verbose: bool = False):
        self.seed = seed
        self.config = config or SimConfig.for_seed(seed)
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.verbose = verbose
        self._trace: deque[str] = deque(maxlen=trace_lines)
        cfg = self.config
        self.partitions = [("t", i) for i in range(cfg.partition_count)]
        self.network = Network(self.rng, loss_probability=cfg.loss_probability,
                               delay_ms_min=cfg.delay_ms_min, delay_ms_max=cfg.delay_ms_max)
        broker_ids = list(range(1, cfg.broker_count + 1))
        self.controller = SimController(
            self.network, broker_ids, self.partitions, session_timeout_ms=cfg.session_timeout_ms,
            push_interval_ms=cfg.push_interval_ms,
            preferred_leader_interval_ms=cfg.preferred_leader_interval_ms, trace=self.trace)
        self.checker = InvariantChecker(self)
        self.brokers: dict[int, SimBroker] = {
            b: SimBroker(b, self.partitions, self.network, self.rng, cfg.broker, self,
                         replica_class=replica_class)
            for b in broker_ids}
        self.producers = [Producer(CLIENT_BASE + i, tp) for i, tp in enumerate(self.partitions)]
        self._restart_at_ms: dict[int, float] = {}
        self._scheduled: list[tuple[int, int, object]] = []  # (at_ms, sequence, action)
        self._schedule_sequence = 0
        self._scripted = False
        self._replica_class = replica_class
        self._next_payload_id = 1
        self.crashes = 0

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

    def log_changed(self, broker, p) -> None:
        self.checker.log_changed(broker, p)

    # ------------------------------------------------------------------ views for the checker

    def is_registered_and_alive(self, broker_id: int) -> bool:
        broker = self.brokers[broker_id]
        registration = self.controller.registrations.get(broker_id)
        return (broker.alive and registration is not None
                and registration.broker_epoch == broker.broker_epoch)

    def acting_leader(self, tp) -> SimBroker | None:
        """The controller's leader, if it is alive, registered and leads in the current epoch."""
        record = self.controller.records[tp]
        if record.leader < 0 or not self.is_registered_and_alive(record.leader):
            return None
        broker = self.brokers[record.leader]
        p = broker.partitions[tp]
        if p.role != LEADER or p.leader_epoch != record.leader_epoch:
            return None
        return broker

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        cfg = self.config
        end_ms = cfg.chaos_ms + cfg.settle_ms
        try:
            while self.now_ms < end_ms:
                self.step(chaos=self.now_ms < cfg.chaos_ms)
            self.check_converged()
        except InvariantViolation as e:
            raise SimulationFailure(self._failure_text(str(e))) from None
        return SimResult(self.seed, cfg, self.now_ms, self.checker.stats.acked,
                         self.checker.stats.committed_batches, self.controller.leader_changes,
                         self.crashes, self.checker.stats.excused_losses,
                         self.network.sent, self.network.dropped,
                         dict(sum((b.counters for b in self.brokers.values()), Counter())))

    def step(self, *, chaos: bool) -> None:
        cfg = self.config
        self.now_ms += cfg.step_ms
        now = self.now_ms
        while self._scheduled and self._scheduled[0][0] <= now:
            _, _, action = heapq.heappop(self._scheduled)
            action()
        for envelope in self.network.deliverable(now):
            if envelope.dst == CONTROLLER:
                self.controller.handle(envelope.src, envelope.message, now)
            elif envelope.dst >= CLIENT_BASE:
                self._producer_response(envelope.dst, envelope.message)
            else:
                broker = self.brokers[envelope.dst]
                if broker.alive:
                    broker.handle(envelope.src, envelope.message, now)
        self.controller.tick(now)
        for broker in self.brokers.values():
            if broker.alive:
                broker.tick(now)
        if chaos:
            self._produce(now)
            self._faults(now)
        else:
            self._heal(now)
        self.checker.check_step(now)

    def check_converged(self) -> None:
        for tp in self.partitions:
            record = self.controller.records[tp]
            leader = self.acting_leader(tp)
            if leader is None:
                self.checker.fail(self.now_ms, f"{tp} has no acting leader after settling: "
                                                f"{record}")
            p = leader.partitions[tp]
            if sorted(p.leader_state.isr) != sorted(record.replicas):
                self.checker.fail(self.now_ms, f"{tp} ISR {p.leader_state.isr} did not recover "
                                                f"to all replicas {record.replicas}")
            if p.leader_state.high_watermark != p.log.log_end_offset:
                self.checker.fail(self.now_ms, f"{tp} HW {p.leader_state.high_watermark} "
                                                f"stuck below LEO {p.log.log_end_offset}")
            for broker in self.brokers.values():
                if broker.partitions[tp].log.batches != p.log.batches:
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
            leader = self.controller.records[producer.tp].leader
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
                others = [CONTROLLER, *self.brokers, *(p.client_id for p in self.producers)]
                self.network.isolate(broker_id, others, now_ms + duration)
            elif kind == "controller":
                self.network.cut(broker_id, CONTROLLER, now_ms + duration)
            else:
                peer = self.rng.choice([b for b in self.brokers if b != broker_id])
                self.network.cut(broker_id, peer, now_ms + duration)
            self.trace(now_ms, f"network: cut {kind} broker {broker_id} for {duration} ms")

    def _crash(self, broker: SimBroker, now_ms: int, *, lose_unflushed: bool = True,
               keep_offset: int | None = None, restart_after_ms: int | None = None) -> None:
        self.crashes += 1
        batches_before = {tp: list(p.log.batches) for tp, p in broker.partitions.items()}
        broker.crash(now_ms, lose_unflushed=lose_unflushed, keep_offset=keep_offset)
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
        for broker in self.brokers.values():
            if not broker.alive:
                self._restart(broker, now_ms)

    # ------------------------------------------------------------------ scripted scenarios

    def at(self, at_ms: int, action) -> None:
        """Run ``action()`` at the start of the first step at or after ``at_ms``."""
        self._schedule_sequence += 1
        self._scripted = True
        heapq.heappush(self._scheduled, (at_ms, self._schedule_sequence, action))

    def produce(self, tp, record_count: int = 1) -> None:
        """Send one acks=all batch of ``tp`` to the leader the controller names now."""
        producer = next(p for p in self.producers if p.tp == tp)
        leader = self.controller.records[tp].leader
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

    def heal(self) -> None:
        self.network.heal_all()
        self.trace(self.now_ms, "network: healed")

    def _failure_text(self, message: str) -> str:
        lines = "\n".join(self._trace)
        variant = ({} if self._replica_class is ReplicaState
                   else {"replica_class": self._replica_class.__name__})
        if self.config == SimConfig.for_seed(self.seed) and not self._scripted and not variant:
            how = f"cd tests && ../.venv/bin/python -m sim.run --seed {self.seed} --verbose"
        else:
            how = (f"Simulation({self.seed}, <the config below>"
                   + "".join(f", {k}={v}" for k, v in variant.items())
                   + (") with the same script" if self._scripted else ")"))
        return (f"{message}\nreproduce: {how}\nconfig: {self.config}\n"
                f"last trace lines:\n{lines}")
