"""Invariant checks run after every simulation step (replication.md, "Invariants a checker can test").

A partition's history is kept per topic incarnation (its topic ID): a topic
deleted and created again starts a new, empty history.

* **Committed never lost**: a batch is committed once it lies below a HW a
  leader exposed (a consumer could have read it) or was acknowledged with
  acks=all. The acting leader (the controller's leader, alive, registered,
  leading in the controller's epoch and incarnation) must hold every committed
  batch. The only excuse is that no ISR member survived: every member of the
  current ISR lost that batch in a crash (unflushed tail) and has not got it
  back. Such an excused loss is counted, and the committed history restarts
  from what the new leader has.
* Two leaders never expose conflicting committed histories.
* **One leader per epoch**: no two brokers ever lead one (incarnation,
  partition, leader epoch), across broker and controller crashes and failed
  metadata writes (issue 14, bug 2: a controller that sent state it never
  wrote could hand the same epoch out twice).
* **HW monotone**: the HW a leader exposes never goes backwards within one
  leadership (broker process, partition, leader epoch).
* **StrongIsr**: every registered, live member of the controller's ISR holds
  exactly the acting leader's batches below the leader's HW.
* **LeaderInIsr**: the controller's leader and the acting leader's own ISR
  contain the leader.
* **Log format**: offsets contiguous from 0, epochs never decrease, the epoch
  cache agrees with the batches (``SimLog.check``), after every change.
* **Incarnations never mix** (issue 14, bug 1): a replica of incarnation N
  holds only batches produced to N (a log not claimed by a replica: only
  batches of the incarnation its ``partition.metadata`` names).
* Acknowledged produce requests are committed at the offset they were told.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from tidewater.proto.errors import InvariantViolation as ProductInvariantViolation

from .sim_log import Batch, LogInvariantError, _id_text


class InvariantViolation(ProductInvariantViolation):
    """A check failed. The product's own type: no boundary of the broker's code that a check
    runs under answers it as an error code and goes on."""


@dataclass
class Stats:
    acked: int = 0
    committed_batches: int = 0
    excused_losses: list[str] = field(default_factory=list)
    high_watermark_observations: int = 0
    leaderships: int = 0  # distinct (incarnation, partition, leader epoch) led


def _prefix_below(batches: list[Batch], offset: int) -> int:
    """How many batches lie entirely below ``offset``."""
    return bisect.bisect_right(batches, offset, key=lambda b: b.next_offset)


class InvariantChecker:
    def __init__(self, sim):
        self.sim = sim
        self.stats = Stats()
        # Keyed by incarnation: (topic_id, partition).
        self.committed: dict = {}
        self.generation: dict = {}
        self.crash_lost: dict = {}  # incarnation -> broker -> the batches it lost in crashes
        self.last_isr: dict = {}  # incarnation -> the controller's ISR when last seen
        # (broker, process incarnation, topic_id, partition, leader_epoch)
        #   -> (generation, highest HW seen)
        self.exposed_hw: dict = {}
        # (topic_id, partition, leader_epoch) -> the broker that led it
        self.leaders: dict = {}
        self.dirty_logs: dict = {}  # id(log) -> (broker, tp, log), checked at the end of the step
        # Prefixes already compared, so each step only compares what is new:
        # incarnation -> (leader key, generation, batches of the leader known to match committed)
        self._leader_verified: dict = {}
        # (incarnation, leader key, member, member incarnation, member truncations) -> matched
        self._isr_verified: dict = {}

    def _history(self, inc) -> list[Batch]:
        if inc not in self.committed:
            self.committed[inc] = []
            self.generation[inc] = 0
            self.crash_lost[inc] = {}
        return self.committed[inc]

    # ------------------------------------------------------------------ hooks

    def became_leader(self, broker, p, now_ms: int) -> None:
        key = (p.topic_id, p.tp.partition, p.leader_epoch)
        led_by = self.leaders.setdefault(key, broker.broker_id)
        if led_by == broker.broker_id:
            self.stats.leaderships = len(self.leaders)
            return
        self.fail(now_ms, f"two brokers lead {p.tp[0]}-{p.tp[1]} (incarnation "
                          f"{_id_text(p.topic_id)}) in leader epoch {p.leader_epoch}: broker "
                          f"{led_by}, then broker {broker.broker_id}")

    def observe_leader_hw(self, broker, p, now_ms: int) -> None:
        inc = (p.topic_id, p.tp.partition)
        committed = self._history(inc)
        hw = p.replica.leader.high_watermark
        key = (broker.broker_id, broker.incarnation, inc, p.leader_epoch)
        generation, seen = self.exposed_hw.get(key, (self.generation[inc], -1))
        if hw < seen:
            self.fail(now_ms, f"HW went backwards on broker {broker.broker_id} {p.tp} epoch "
                              f"{p.leader_epoch}: {seen} -> {hw}")
        self.exposed_hw[key] = (generation, hw)
        self.stats.high_watermark_observations += 1
        if generation != self.generation[inc]:
            return  # a leadership from before an excused loss: its history is gone
        batches = p.log.batches
        prefix = batches[:_prefix_below(batches, hw)]
        overlap = min(len(committed), len(prefix))
        if committed[:overlap] != prefix[:overlap]:
            first = next(i for i in range(overlap) if committed[i] != prefix[i])
            self._excuse_or_fail(broker, p, first, now_ms,
                                 f"HW {hw} of broker {broker.broker_id} epoch {p.leader_epoch} "
                                 f"exposes a committed history that conflicts with an earlier one")
        if len(prefix) > len(committed):
            committed.extend(prefix[len(committed):])

    def produce_acknowledged(self, broker, p, waiter, now_ms: int) -> None:
        self.stats.acked += 1
        inc = (p.topic_id, p.tp.partition)
        key = (broker.broker_id, broker.incarnation, inc, p.leader_epoch)
        if self.exposed_hw[key][0] != self.generation[inc]:
            return  # a leadership from before an excused loss
        committed = self.committed[inc]
        index = _prefix_below(committed, waiter.base_offset)
        batch = p.log.batch_at(waiter.base_offset)
        if (index >= len(committed) or committed[index] != batch
                or batch.next_offset != waiter.required_offset):
            self.fail(now_ms, f"broker {broker.broker_id} acknowledged {p.tp} batch {batch} "
                              f"at {waiter.base_offset} that is not committed")

    def log_changed(self, broker, tp, log) -> None:
        self.dirty_logs[id(log)] = (broker, tp, log)

    def crashed(self, broker, batches_before: dict, now_ms: int) -> None:
        """Remember what each crash destroyed: a commit may still count on it (a fetch
        offset reported before the crash can move the HW after it)."""
        for tp, log in broker.logs.items():
            topic_id, before = batches_before[tp]
            lost = before[len(log.batches):]
            if lost:
                self._history((topic_id, tp.partition))
                self.crash_lost[(topic_id, tp.partition)].setdefault(
                    broker.broker_id, set()).update(lost)
            self.log_changed(broker, tp, log)

    # ------------------------------------------------------------------ per step

    def check_step(self, now_ms: int) -> None:
        for broker, tp, log in self.dirty_logs.values():
            # A replica's log holds its incarnation's batches only; a log no replica claims
            # (after a restart) those of the incarnation its partition.metadata names.
            p = broker.partitions.get(tp)
            expected = p.topic_id if p is not None and p.log is log else log.topic_id
            try:
                log.check(expected)
            except LogInvariantError as e:
                self.fail(now_ms, f"broker {broker.broker_id} {tp[0]}-{tp[1]}: {e}")
        self.dirty_logs.clear()
        controller = self.sim.controller
        for tp in self.sim.partitions:
            record = controller.partition(tp)
            if record is None:
                continue  # not created yet, or deleted
            inc = (record.topic_id, tp.partition)
            self._history(inc)
            self.last_isr[inc] = record.isr
            if record.leader != -1 and record.leader not in record.isr:
                self.fail(now_ms, f"{tp}: controller leader {record.leader} not in ISR {record.isr}")
            leader = self.sim.acting_leader(tp)
            if leader is None:
                continue
            p = leader.partitions[tp]
            if leader.broker_id not in p.replica.leader.isr:
                self.fail(now_ms, f"{tp}: leader {leader.broker_id} not in its ISR "
                                  f"{p.replica.leader.isr}")
            self._check_holds_committed(leader, p, now_ms)
            self._check_strong_isr(leader, p, record, now_ms)
        self.stats.committed_batches = sum(len(c) for c in self.committed.values())

    def _check_holds_committed(self, leader, p, now_ms: int) -> None:
        inc = (p.topic_id, p.tp.partition)
        committed = self.committed[inc]
        batches = p.log.batches
        key = (leader.broker_id, leader.incarnation, p.leader_epoch)
        cached_key, generation, verified = self._leader_verified.get(inc, (None, -1, 0))
        if cached_key != key or generation != self.generation[inc]:
            verified = 0  # a leader never truncates, so a match stays a match
        if batches[verified:len(committed)] == committed[verified:]:
            self._leader_verified[inc] = (key, self.generation[inc], len(committed))
            return
        first_missing = next(i for i, c in enumerate(committed)
                             if i >= len(batches) or batches[i] != c)
        self._excuse_or_fail(leader, p, first_missing, now_ms,
                             f"acting leader {leader.broker_id} (epoch {p.leader_epoch}) lost "
                             f"committed data")
        self.observe_leader_hw(leader, p, now_ms)

    def _excuse_or_fail(self, broker, p, first_missing: int, now_ms: int, what: str) -> None:
        """``broker`` (a leader) lacks ``committed[first_missing]``: a violation unless every
        member of the controller's ISR lost that batch in a crash (no ISR member survived)."""
        inc = (p.topic_id, p.tp.partition)
        committed = self.committed[inc]
        lost = committed[first_missing]
        isr = self.last_isr.get(inc, ())
        survivors = []
        for member in isr:
            member_log = self.sim.brokers[member].replica_log(p.tp, p.topic_id)
            lost_in_crash = lost in self.crash_lost[inc].get(member, ())
            if ((member_log is not None and member_log.batch_at(lost.base_offset) == lost)
                    or not lost_in_crash):
                survivors.append(member)
        if survivors or not isr:
            self.fail(now_ms, f"{what}: committed {p.tp} batch {lost}, the leader has "
                              f"{p.log.batch_at(lost.base_offset)}; ISR {isr} members "
                              f"{survivors} did not lose it in a crash")
        message = (f"{now_ms} ms: {p.tp} from offset {lost.base_offset}: every ISR member "
                   f"{isr} lost it in a crash")
        self.stats.excused_losses.append(message)
        self.sim.trace(now_ms, "checker: excused loss " + message)
        del committed[first_missing:]
        self.generation[inc] += 1
        self.crash_lost[inc].clear()
        # History restarts from this leader: its HW counts again, in the new generation.
        key = (broker.broker_id, broker.incarnation, inc, p.leader_epoch)
        self.exposed_hw[key] = (self.generation[inc], self.exposed_hw.get(key, (0, -1))[1])

    def _check_strong_isr(self, leader, p, record, now_ms: int) -> None:
        hw = p.replica.leader.high_watermark
        batches = p.log.batches
        count = _prefix_below(batches, hw)
        for member in record.isr:
            if member == leader.broker_id or not self.sim.is_registered_and_alive(member):
                continue
            member_broker = self.sim.brokers[member]
            member_log = member_broker.replica_log(p.tp, p.topic_id)
            member_batches = member_log.batches if member_log is not None else []
            key = (p.topic_id, p.tp.partition, leader.broker_id, leader.incarnation,
                   p.leader_epoch, member, member_broker.incarnation,
                   member_log.serial if member_log is not None else -1,
                   member_log.truncations if member_log is not None else -1)
            verified = self._isr_verified.get(key, 0)
            if member_batches[verified:count] != batches[verified:count]:
                self.fail(now_ms, f"StrongIsr: {p.tp} ISR member {member} differs from leader "
                                  f"{leader.broker_id} below HW {hw}: "
                                  f"{_first_difference(batches[:count], member_batches)}")
            self._isr_verified[key] = max(verified, count)

    # ------------------------------------------------------------------ internals

    def fail(self, now_ms: int, message: str) -> None:
        raise InvariantViolation(f"seed {self.sim.seed} at {now_ms} ms: {message}")


def _first_difference(a: list[Batch], b: list[Batch]) -> str:
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            return f"index {i}: {x} vs {y}"
    return "equal"
