"""The simulated controller: broker registrations and sessions around ``controller.election``.

It never crashes (it stands for the durable, replicated metadata quorum) but
its links can be cut. Rules, as in Kafka KRaft:

* A broker registers once per process start (incarnation) and gets a new
  ``broker_epoch``. A registration with a new incarnation first fences the old
  one: the restarted process may have lost its unflushed tail, so it leaves
  every ISR before it can be elected.
* A broker that sends no heartbeat for ``session_timeout_ms`` is fenced; a
  heartbeat of its current registration unfences it.
* Every ``push_interval_ms`` the current record of each partition is pushed to
  each registered replica (LeaderAndIsr with that replica's broker epoch):
  "retry until delivered" without tracking acknowledgements; brokers ignore
  what they already have.
* AlterPartition is validated by ``election.alter_partition``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidewater.controller import election
from tidewater.controller.election import PartitionRecord
from tidewater.proto import tidewater_pb2 as pb

from .messages import (
    AlterPartition,
    AlterPartitionResponse,
    Heartbeat,
    LeaderAndIsr,
    RegisterBroker,
    RegisterBrokerResponse,
    TopicPartition,
)
from .network import CONTROLLER, Network


@dataclass
class Registration:
    incarnation: int
    broker_epoch: int
    last_heartbeat_ms: int
    fenced: bool


class SimController:
    def __init__(self, network: Network, broker_ids: list[int], partitions: list[TopicPartition],
                 *, session_timeout_ms: int, push_interval_ms: int,
                 preferred_leader_interval_ms: int, trace):
        self.network = network
        self.broker_ids = broker_ids
        self.session_timeout_ms = session_timeout_ms
        self.push_interval_ms = push_interval_ms
        self.preferred_leader_interval_ms = preferred_leader_interval_ms
        self.trace = trace
        self.registrations: dict[int, Registration] = {}
        self.records: dict[TopicPartition, PartitionRecord] = {}
        for topic, partition in partitions:
            # Replica order rotates so that preferred leaders spread over brokers.
            rotation = partition % len(broker_ids)
            replicas = tuple(broker_ids[rotation:] + broker_ids[:rotation])
            self.records[(topic, partition)] = PartitionRecord(
                topic, partition, replicas, replicas, replicas[0], 0, 0)
        self._next_broker_epoch = 1
        self._next_push_ms = 0
        self._next_preferred_ms = preferred_leader_interval_ms
        self.leader_changes = 0

    @property
    def live(self) -> set[int]:
        return {b for b, r in self.registrations.items() if not r.fenced}

    # ------------------------------------------------------------------ messages

    def handle(self, src: int, message, now_ms: int) -> None:
        if isinstance(message, RegisterBroker):
            self._on_register(message, now_ms)
        elif isinstance(message, Heartbeat):
            registration = self.registrations.get(message.broker_id)
            if registration is not None and registration.broker_epoch == message.broker_epoch:
                registration.last_heartbeat_ms = now_ms
                if registration.fenced:
                    self._unfence(message.broker_id, now_ms)
        elif isinstance(message, AlterPartition):
            self._on_alter_partition(src, message, now_ms)
        else:
            raise TypeError(f"controller cannot handle {message!r}")

    def _on_register(self, message: RegisterBroker, now_ms: int) -> None:
        broker_id = message.broker_id
        registration = self.registrations.get(broker_id)
        if registration is None or registration.incarnation != message.incarnation:
            if registration is not None and not registration.fenced:
                self._fence(broker_id, now_ms, reason="re-registered")
            registration = Registration(message.incarnation, self._next_broker_epoch, now_ms,
                                        fenced=True)
            self._next_broker_epoch += 1
            self.registrations[broker_id] = registration
            self._unfence(broker_id, now_ms)
        self.network.send(CONTROLLER, broker_id,
                          RegisterBrokerResponse(message.incarnation, registration.broker_epoch),
                          now_ms)
        self._push_to(broker_id, now_ms)

    def _on_alter_partition(self, src: int, message: AlterPartition, now_ms: int) -> None:
        p = self.records[message.tp]
        registration = self.registrations.get(message.broker_id)
        if registration is None or registration.broker_epoch != message.broker_epoch:
            error, record = pb.STALE_BROKER_EPOCH, p
        else:
            error, record = election.alter_partition(
                p, leader_id=message.broker_id, leader_epoch=message.leader_epoch,
                partition_epoch=message.partition_epoch, new_isr=message.new_isr,
                live=self.live)
            if error == pb.NONE and record != p:
                self.trace(now_ms, f"controller: {message.tp} ISR {p.isr} -> {record.isr} "
                                   f"(partition epoch {record.partition_epoch})")
                self.records[message.tp] = record
        self.network.send(CONTROLLER, src,
                          AlterPartitionResponse(message.request_id, message.tp, error, record),
                          now_ms)

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        for broker_id, registration in self.registrations.items():
            if (not registration.fenced
                    and now_ms - registration.last_heartbeat_ms > self.session_timeout_ms):
                self._fence(broker_id, now_ms, reason="session expired")
        if now_ms >= self._next_preferred_ms:
            self._next_preferred_ms = now_ms + self.preferred_leader_interval_ms
            for tp, p in self.records.items():
                self._apply(tp, election.maybe_preferred_leader(p, self.live), now_ms, "preferred")
        if now_ms >= self._next_push_ms:
            self._next_push_ms = now_ms + self.push_interval_ms
            for broker_id in self.registrations:
                self._push_to(broker_id, now_ms)

    # ------------------------------------------------------------------ internals

    def _fence(self, broker_id: int, now_ms: int, *, reason: str) -> None:
        self.trace(now_ms, f"controller: fence broker {broker_id} ({reason})")
        live = self.live - {broker_id}
        self.registrations[broker_id].fenced = True
        for tp, p in self.records.items():
            self._apply(tp, election.on_broker_fenced(p, broker_id, live, unclean_allowed=False),
                        now_ms, "fenced")

    def _unfence(self, broker_id: int, now_ms: int) -> None:
        self.trace(now_ms, f"controller: unfence broker {broker_id}")
        self.registrations[broker_id].fenced = False
        live = self.live
        for tp, p in self.records.items():
            self._apply(tp, election.on_broker_unfenced(p, broker_id, live,
                                                        unclean_allowed=False), now_ms, "unfenced")

    def _apply(self, tp: TopicPartition, change, now_ms: int, why: str) -> None:
        if change is None:
            return
        old, new = self.records[tp], change.record
        self.records[tp] = new
        if change.leader_changed:
            self.leader_changes += 1
        self.trace(now_ms, f"controller: {tp} {why}: leader {old.leader}->{new.leader} "
                           f"epoch {new.leader_epoch} ISR {new.isr} pe {new.partition_epoch}")
        for replica in new.replicas:
            self._push_one(replica, tp, now_ms)

    def _push_to(self, broker_id: int, now_ms: int) -> None:
        for tp, p in self.records.items():
            if broker_id in p.replicas:
                self._push_one(broker_id, tp, now_ms)

    def _push_one(self, broker_id: int, tp: TopicPartition, now_ms: int) -> None:
        registration = self.registrations.get(broker_id)
        if registration is None:
            return
        self.network.send(CONTROLLER, broker_id,
                          LeaderAndIsr(registration.broker_epoch, self.records[tp]), now_ms)
