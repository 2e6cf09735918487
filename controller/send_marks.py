"""What the controller owes each broker, and when to try again: the senders' core.

No gRPC, no asyncio, no clock: ``controller/sender.py`` (the asyncio shell) and
the deterministic simulation (``tests/sim/sim_controller.py``) drive the same
classes, each with its own transport and time.

* ``SendMarks`` is one broker registration's queue. It holds *marks*, not
  requests: which partitions need a LeaderAndIsr (and whether the broker must
  create them), whether an UpdateMetadata is due, which deleted partitions need
  a StopReplica. Marks coalesce, so the queue is bounded by the number of
  partitions. ``take_next`` builds the next request from the image when it is
  sent, in this order: StopReplica, LeaderAndIsr, UpdateMetadata (a broker
  stops a deleted partition before it hears of a new one with the same name,
  and knows its partitions before the metadata that names their leaders).
  ``put_back`` returns a failed request's marks, merged with any set since.
* ``RetryBackoff``: exponential backoff between failed deliveries, reset by a
  success, with time passed in.
* ``route_effects``: which sender gets which marks from one commit's
  ``Effects`` (fenced brokers lose their sender, resynced ones get everything
  they host, then stops, changed partitions and metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tidewater.controller import requests
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.sessions import BrokerSessions
from tidewater.controller.state_machine import Effects
from tidewater.proto import tidewater_pb2 as pb

TopicPartition = tuple[str, int]
STOP_REPLICA, LEADER_AND_ISR, UPDATE_METADATA = "StopReplica", "LeaderAndIsr", "UpdateMetadata"


@dataclass(frozen=True)
class Outgoing:
    """One request taken from the marks, with the marks it took (to put back on failure)."""

    kind: str  # STOP_REPLICA, LEADER_AND_ISR or UPDATE_METADATA
    request: pb.StopReplicaRequest | pb.LeaderAndIsrRequest | pb.UpdateMetadataRequest
    stops: Mapping[TopicPartition, PartitionRecord]
    partitions: Mapping[TopicPartition, bool]  # -> is_new


class SendMarks:
    """The marks of one broker registration (``broker_id``) and the requests they become."""

    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self._partitions: dict[TopicPartition, bool] = {}  # -> is_new
        self._metadata = False
        self._stops: dict[TopicPartition, PartitionRecord] = {}

    def mark_partitions(self, tps: Iterable[TopicPartition], *,
                        new: Set[TopicPartition] = frozenset()) -> None:
        for tp in tps:
            self._partitions[tp] = self._partitions.get(tp, False) or tp in new

    def mark_metadata(self) -> None:
        self._metadata = True

    def mark_stop(self, partitions: Iterable[PartitionRecord], metadata: ClusterMetadata) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._stops[tp] = p
            current = metadata.partition(*tp)
            if current is None or self.broker_id not in current.replicas:
                self._partitions.pop(tp, None)  # a LeaderAndIsr for it would be stale

    def clear(self) -> None:
        self._partitions.clear()
        self._metadata = False
        self._stops.clear()

    @property
    def idle(self) -> bool:
        return not (self._partitions or self._metadata or self._stops)

    def take_next(self, metadata: ClusterMetadata, controller_id: int,
                  sessions: BrokerSessions | None) -> Outgoing | None:
        """The next request in round order, built from ``metadata`` now; its marks are taken.
        None when nothing is due (LeaderAndIsr marks whose partitions this broker no
        longer hosts are dropped: the StopReplica, or the other brokers, cover them)."""
        if self._stops:
            stops, self._stops = self._stops, {}
            stop = requests.stop_replica(metadata, controller_id, self.broker_id,
                                         stops.values(), delete=True)
            return Outgoing(STOP_REPLICA, stop, stops, {})
        if self._partitions:
            marks, self._partitions = self._partitions, {}
            hosted = []
            for (topic, number), is_new in sorted(marks.items()):
                p = metadata.partition(topic, number)
                if p is not None and self.broker_id in p.replicas:
                    hosted.append((p, is_new))
            if hosted:
                leader_and_isr = requests.leader_and_isr(metadata, controller_id,
                                                         self.broker_id, hosted)
                return Outgoing(LEADER_AND_ISR, leader_and_isr, {}, marks)
        if self._metadata:
            self._metadata = False
            update = requests.update_metadata(metadata, controller_id, self.broker_id, sessions)
            return Outgoing(UPDATE_METADATA, update, {}, {})
        return None

    def put_back(self, outgoing: Outgoing) -> None:
        """A delivery failed (unreachable, timed out): its marks are due again. Marks set
        since win for stops (the newer record); is_new is kept if either says so."""
        if outgoing.kind == STOP_REPLICA:
            self._stops = {**outgoing.stops, **self._stops}
        elif outgoing.kind == LEADER_AND_ISR:
            for tp, is_new in outgoing.partitions.items():
                self._partitions[tp] = self._partitions.get(tp, False) or is_new
        else:
            self._metadata = True


class RetryBackoff:
    """Exponential backoff between failed deliveries: ``initial_ms`` doubling up to ``max_ms``."""

    def __init__(self, initial_ms: int, max_ms: int):
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.delay_ms = initial_ms  # the wait after the next failure
        self.next_send_ms = 0

    def failed(self, now_ms: int) -> int:
        """A delivery failed at ``now_ms``: the wait before the next one (ms)."""
        wait_ms = self.delay_ms
        self.next_send_ms = now_ms + wait_ms
        self.delay_ms = min(self.delay_ms * 2, self.max_ms)
        return wait_ms

    def succeeded(self) -> None:
        self.delay_ms = self.initial_ms

    def may_send(self, now_ms: int) -> bool:
        return now_ms >= self.next_send_ms


class MarkTarget(Protocol):
    def mark_partitions(self, tps: Iterable[TopicPartition], *,
                        new: Set[TopicPartition] = ...) -> None: ...

    def mark_metadata(self) -> None: ...

    def mark_stop(self, partitions: Iterable[PartitionRecord]) -> None: ...


S = TypeVar("S", bound=MarkTarget)


def route_effects(effects: Effects, metadata: ClusterMetadata, senders: Mapping[int, S], *,
                  drop_sender: Callable[[int], None],
                  ensure_sender: Callable[[int], S | None]) -> None:
    """Set the marks one commit's ``effects`` call for, once its records are durable.

    ``senders`` is the live map, changed by the two callbacks: ``drop_sender`` for a
    fenced broker, ``ensure_sender`` for a resynced one (a new registration gets a
    new sender). Brokers and partitions go in sorted order, so a simulation that
    drives this is deterministic."""
    for broker_id in sorted(effects.fenced_brokers):
        drop_sender(broker_id)
    for broker_id in sorted(effects.resync_brokers):
        sender = ensure_sender(broker_id)
        if sender is not None:
            hosted = [(p.topic, p.partition) for p in metadata.partitions_of_broker(broker_id)]
            sender.mark_partitions(hosted, new=effects.new_partitions)
            sender.mark_metadata()
    for broker_id, partitions in effects.stop_replicas:
        target = senders.get(broker_id)
        if target is not None:
            target.mark_stop(partitions)
    for tp in sorted(effects.changed_partitions):
        p = metadata.partition(*tp)
        if p is None:
            continue
        for replica in p.replicas:
            target = senders.get(replica)
            if target is not None:
                target.mark_partitions([tp], new=effects.new_partitions)
    if effects.metadata_changed:
        for target in senders.values():
            target.mark_metadata()
