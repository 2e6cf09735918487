"""Invariant checks run after every simulation step (replication.md, "Invariants a checker can test").

* **Committed never lost**: a batch is committed once it lies below a HW a
  leader exposed (a consumer could have read it) or was acknowledged with
  acks=all. The acting leader (the controller's leader, alive, registered,
  leading in the controller's epoch) must hold every committed batch. The
  only excuse is that no ISR member survived: every member of the current
  ISR lost that batch in a crash (unflushed tail) and has not got it back.
  Such an excused loss is counted, and the committed history restarts from
  what the new leader has.
* Two leaders never expose conflicting committed histories.
* **HW monotone**: the HW a leader exposes never goes backwards within one
  leadership (broker process, partition, leader epoch).
* **StrongIsr**: every registered, live member of the controller's ISR holds
  exactly the acting leader's batches below the leader's HW.
* **LeaderInIsr**: the controller's leader and the acting leader's own ISR
  contain the leader.
* **Log format**: offsets contiguous from 0, epochs never decrease, the epoch
  cache agrees with the batches (``SimLog.check``), after every change.
* Acknowledged produce requests are committed at the offset they were told.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .sim_log import Batch, LogInvariantError


class InvariantViolation(AssertionError):
    pass


@dataclass
class Stats:
    acked: int = 0
    committed_batches: int = 0
    excused_losses: list[str] = field(default_factory=list)
    high_watermark_observations: int = 0


def _prefix_below(batches: list[Batch], offset: int) -> int:
    """How many batches lie entirely below ``offset``."""
    return bisect.bisect_right(batches, offset, key=lambda b: b.next_offset)


class InvariantChecker:
    def __init__(self, sim):
        self.sim = sim
        self.stats = Stats()
        self.committed: dict = {tp: [] for tp in sim.partitions}
        self.generation: dict = {tp: 0 for tp in sim.partitions}
        # tp -> broker -> the batches it lost in crashes (unflushed tails)
        self.crash_lost: dict = {tp: {} for tp in sim.partitions}
        # (broker, incarnation, tp, leader_epoch) -> (generation, highest HW seen)
        self.exposed_hw: dict = {}
        self.dirty_logs: dict = {}  # id(log) -> log, checked at the end of the step
        # Prefixes already compared, so each step only compares what is new:
        # tp -> (leader key, generation, batches of the leader known to match committed)
        self._leader_verified: dict = {}
        # (tp, leader key, member, member incarnation, member truncations) -> batches matched
        self._isr_verified: dict = {}

    # ------------------------------------------------------------------ hooks

    def observe_leader_hw(self, broker, p, now_ms: int) -> None:
        tp, hw = p.tp, p.leader_state.high_watermark
        key = (broker.broker_id, broker.incarnation, tp, p.leader_epoch)
        generation, seen = self.exposed_hw.get(key, (self.generation[tp], -1))
        if hw < seen:
            self.fail(now_ms, f"HW went backwards on broker {broker.broker_id} {tp} epoch "
                              f"{p.leader_epoch}: {seen} -> {hw}")
        self.exposed_hw[key] = (generation, hw)
        self.stats.high_watermark_observations += 1
        if generation != self.generation[tp]:
            return  # a leadership from before an excused loss: its history is gone
        batches = p.log.batches
        prefix = batches[:_prefix_below(batches, hw)]
        committed = self.committed[tp]
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
        key = (broker.broker_id, broker.incarnation, p.tp, p.leader_epoch)
        if self.exposed_hw[key][0] != self.generation[p.tp]:
            return  # a leadership from before an excused loss
        committed = self.committed[p.tp]
        index = _prefix_below(committed, waiter.base_offset)
        batch = p.log.batch_at(waiter.base_offset)
        if (index >= len(committed) or committed[index] != batch
                or batch.next_offset != waiter.required_offset):
            self.fail(now_ms, f"broker {broker.broker_id} acknowledged {p.tp} batch {batch} "
                              f"at {waiter.base_offset} that is not committed")

    def log_changed(self, broker, p) -> None:
        self.dirty_logs[id(p.log)] = (broker.broker_id, p.tp, p.log)

    def crashed(self, broker, batches_before: dict, now_ms: int) -> None:
        """Remember what each crash destroyed: a commit may still count on it (a fetch
        offset reported before the crash can move the HW after it)."""
        for tp, p in broker.partitions.items():
            lost = batches_before[tp][len(p.log.batches):]
            if lost:
                self.crash_lost[tp].setdefault(broker.broker_id, set()).update(lost)
            self.log_changed(broker, p)

    # ------------------------------------------------------------------ per step

    def check_step(self, now_ms: int) -> None:
        for broker_id, tp, log in self.dirty_logs.values():
            try:
                log.check()
            except LogInvariantError as e:
                self.fail(now_ms, f"broker {broker_id} {tp}: {e}")
        self.dirty_logs.clear()
        for tp in self.sim.partitions:
            record = self.sim.controller.records[tp]
            if record.leader != -1 and record.leader not in record.isr:
                self.fail(now_ms, f"{tp}: controller leader {record.leader} not in ISR {record.isr}")
            leader = self.sim.acting_leader(tp)
            if leader is None:
                continue
            p = leader.partitions[tp]
            if leader.broker_id not in p.leader_state.isr:
                self.fail(now_ms, f"{tp}: leader {leader.broker_id} not in its ISR "
                                  f"{p.leader_state.isr}")
            self._check_holds_committed(leader, p, record, now_ms)
            self._check_strong_isr(leader, p, record, now_ms)
        self.stats.committed_batches = sum(len(c) for c in self.committed.values())

    def _check_holds_committed(self, leader, p, record, now_ms: int) -> None:
        tp = p.tp
        committed = self.committed[tp]
        batches = p.log.batches
        key = (leader.broker_id, leader.incarnation, p.leader_epoch)
        cached_key, generation, verified = self._leader_verified.get(tp, (None, -1, 0))
        if cached_key != key or generation != self.generation[tp]:
            verified = 0  # a leader never truncates, so a match stays a match
        if batches[verified:len(committed)] == committed[verified:]:
            self._leader_verified[tp] = (key, self.generation[tp], len(committed))
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
        tp = p.tp
        committed = self.committed[tp]
        lost = committed[first_missing]
        isr = self.sim.controller.records[tp].isr
        survivors = []
        for member in isr:
            member_log = self.sim.brokers[member].partitions[tp].log
            lost_in_crash = lost in self.crash_lost[tp].get(member, ())
            if member_log.batch_at(lost.base_offset) == lost or not lost_in_crash:
                survivors.append(member)
        if survivors:
            self.fail(now_ms, f"{what}: committed {tp} batch {lost}, the leader has "
                              f"{p.log.batch_at(lost.base_offset)}; ISR {isr} members "
                              f"{survivors} did not lose it in a crash")
        message = (f"{now_ms} ms: {tp} from offset {lost.base_offset}: every ISR member "
                   f"{isr} lost it in a crash")
        self.stats.excused_losses.append(message)
        self.sim.trace(now_ms, "checker: excused loss " + message)
        del committed[first_missing:]
        self.generation[tp] += 1
        self.crash_lost[tp].clear()
        # History restarts from this leader: its HW counts again, in the new generation.
        key = (broker.broker_id, broker.incarnation, tp, p.leader_epoch)
        self.exposed_hw[key] = (self.generation[tp], self.exposed_hw.get(key, (0, -1))[1])

    def _check_strong_isr(self, leader, p, record, now_ms: int) -> None:
        hw = p.leader_state.high_watermark
        batches = p.log.batches
        count = _prefix_below(batches, hw)
        for member in record.isr:
            if member == leader.broker_id or not self.sim.is_registered_and_alive(member):
                continue
            member_broker = self.sim.brokers[member]
            member_log = member_broker.partitions[p.tp].log
            key = (p.tp, leader.broker_id, leader.incarnation, p.leader_epoch, member,
                   member_broker.incarnation, member_log.truncations)
            verified = self._isr_verified.get(key, 0)
            if member_log.batches[verified:count] != batches[verified:count]:
                self.fail(now_ms, f"StrongIsr: {p.tp} ISR member {member} differs from leader "
                                  f"{leader.broker_id} below HW {hw}: "
                                  f"{_first_difference(batches[:count], member_log.batches)}")
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
