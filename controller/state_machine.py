"""What the controller does for each request and timer: plain code, time passed in.

Every command takes a ``Tx`` and ``now_ms``. It validates its input first
(raising a typed error or answering with an ErrorCode before anything is
appended), then appends records through ``tx.append``, which applies them to
the image at once so later steps of the same command see them. The owner
(``owner.MetadataOwner``) makes the records durable before it answers or lets
``tx.effects`` reach the brokers; a command that fails after appending is a
programmer error and stops the controller.

``live`` below means registered, unfenced and not in controlled shutdown:
the brokers that may lead or join an ISR.

Control tokens: each registration gets a fresh random ``control_token``
(kept in its ``broker_registered`` record, answered in RegisterBrokerResponse).
A heartbeat, AlterPartition or ReportCorruptReplica is taken only with the
current registration's token (compared in constant time): one of the right
broker epoch without it (epochs are not secret: DescribeCluster lists them)
is CLUSTER_AUTHORIZATION_FAILED and changes nothing, not even the session.
The controller sends the token on its requests to the broker, which takes
them only with it.

Duplicate registrations (Kafka's DUPLICATE_BROKER_REGISTRATION): a
RegisterBroker for a broker ID whose registered incarnation still holds its
session (``BrokerSessions.alive``: heartbeated within the session timeout, not
fenced, no finished controlled shutdown) is refused with that code when its
incarnation ID differs, and changes nothing: a second process started with a
live broker's ID (an operator's mistake, or anyone reaching the port) neither
fences the real broker nor learns its epoch or token. The same incarnation
registering again (a retry, or after STALE_BROKER_EPOCH) is taken. Once the
old session ended (expired, its heartbeat stream closed, or a controlled
shutdown finished) a new incarnation registers and the old one is fenced
first, as a restarted broker needs. Who may send RegisterBroker at all is the
service's check (``authorization``).
"""

from __future__ import annotations

import hmac
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tidewater.broker.storage.topics import INTERNAL_TOPICS
from tidewater.controller import (
    config_changes,
    quota_records,
    reassignment,
    requests,
    security_records,
)
from tidewater.controller.assignment import assign_replicas
from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import (
    NO_LEADER,
    Change,
    PartitionRecord,
    alter_partition,
    elect,
    maybe_preferred_leader,
    new_partition,
    on_broker_fenced,
    on_broker_unfenced,
    on_controlled_shutdown,
    on_replica_corrupt,
)
from tidewater.controller.metadata import (
    ClusterMetadata,
    Listener,
    broker_fenced_record,
    broker_registered_record,
    broker_unfenced_record,
    cluster_record,
    controller_epoch_record,
    partition_changed_record,
    partitions_created_record,
    pending_stops_cleared_record,
    producer_ids_record,
    topic_created_record,
    topic_deleted_record,
)
from tidewater.controller.metadata_log import MetadataRecord
from tidewater.controller.sessions import BrokerSessions
from tidewater.controller.validation import (
    collision_key,
    validate_topic_configs,
    validate_topic_name,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.broker_dynamic_config import CLUSTER_DEFAULT, dynamic_topic_defaults
from tidewater.proto.errors import TidewaterError
from tidewater.proto.topic_id import new_topic_id, topic_id_to_text

PARTITIONS_PER_TOPIC_MAX = 10_000
PARTITIONS_MAX = 200_000  # whole cluster: the full UpdateMetadata must stay a sane size
LISTENERS_MAX = 8
RACK_CHARS_MAX = 64  # as broker.rack (broker/config.py)
ITEMS_PER_REQUEST_MAX = 10_000  # AlterPartition items, CreateTopics topics, DeleteTopics names
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
PRODUCER_ID_MAX = 2**63 - 1


@dataclass
class Effects:
    """What the brokers must hear about once a command's records are durable."""

    changed_partitions: set[tuple[str, int]] = field(default_factory=set)
    new_partitions: set[tuple[str, int]] = field(default_factory=set)
    resync_brokers: set[int] = field(default_factory=set)  # full LeaderAndIsr, new sender
    fenced_brokers: set[int] = field(default_factory=set)  # stop sending
    stop_replicas: list[tuple[int, list[PartitionRecord]]] = field(default_factory=list)
    metadata_changed: bool = False
    leader_elections: int = 0
    unclean_leader_elections: int = 0
    isr_changes: int = 0


class Tx:
    """Records of one command, applied to the image as they are appended."""

    def __init__(self, metadata: ClusterMetadata, next_offset: int):
        self.metadata = metadata
        self.next_offset = next_offset
        self.records: list[MetadataRecord] = []
        self.effects = Effects()

    def append(self, record: MetadataRecord) -> int:
        offset = self.next_offset + len(self.records)
        # Counted before it is applied: an apply that raises may have changed the
        # image half-way, and the owner must then treat the image as ahead of the disk.
        self.records.append(record)
        self.metadata.apply(offset, record)
        self.effects.metadata_changed = True
        return offset


class ControllerStateMachine:
    def __init__(self, config: ControllerConfig, metadata: ClusterMetadata | None = None, *,
                 uuid4: Callable[[], uuid.UUID] = uuid.uuid4):
        self.config = config
        self.metadata = metadata or ClusterMetadata()
        self.sessions = BrokerSessions(config.broker_session_timeout_ms)
        # Where cluster and topic IDs come from: the only randomness in the decisions (the
        # simulation passes a seeded source, so that one seed is one run).
        self._uuid4 = uuid4

    # ------------------------------------------------------------ helpers

    def live_broker_ids(self) -> set[int]:
        return {b for b in self.metadata.unfenced_broker_ids()
                if not self.sessions.in_controlled_shutdown(b)}

    def _unclean_allowed(self, topic: str) -> bool:
        # The topic's own config, else the dynamic cluster-wide default, else the static one.
        dynamic = self.metadata.broker_configs.get(CLUSTER_DEFAULT, {})
        return self.config.unclean_allowed({**_dynamic_unclean(dynamic),
                                            **self.metadata.topics[topic].configs})

    def _default_topic_configs(self) -> dict[str, str]:
        """What a new topic gets unless its request says otherwise: the controller's
        settings, a cluster-wide dynamic ``min.insync.replicas`` over its own. (Written into
        the topic: existing topics keep the value they were created with.)"""
        defaults = self.config.default_topic_configs()
        dynamic = self.metadata.broker_configs.get(CLUSTER_DEFAULT, {})
        if "min.insync.replicas" in dynamic:
            defaults["min.insync.replicas"] = dynamic["min.insync.replicas"]
        return defaults

    def _commit_change(self, tx: Tx, old: PartitionRecord, change: Change) -> None:
        tx.append(partition_changed_record(change.record, unclean=change.unclean))
        tx.effects.changed_partitions.add((old.topic, old.partition))
        if change.leader_changed:
            tx.effects.leader_elections += 1
        if change.unclean:
            tx.effects.unclean_leader_elections += 1
        if change.record.isr != old.isr:
            tx.effects.isr_changes += 1

    def _for_partitions_of(self, tx: Tx, broker_id: int,
                           decide: Callable[[PartitionRecord], Change | None]) -> None:
        for p in self.metadata.partitions_of_broker(broker_id):
            change = decide(p)
            if change is not None:
                self._commit_change(tx, p, change)

    def _fence(self, tx: Tx, broker_id: int) -> None:
        live = self.live_broker_ids() - {broker_id}
        self._for_partitions_of(tx, broker_id, lambda p: on_broker_fenced(
            p, broker_id, live, unclean_allowed=self._unclean_allowed(p.topic)))
        if not self.metadata.brokers[broker_id].fenced:
            tx.append(broker_fenced_record(broker_id))
        self.sessions.end(broker_id)
        tx.effects.fenced_brokers.add(broker_id)
        tx.effects.resync_brokers.discard(broker_id)

    def _unfence_elections(self, tx: Tx, broker_id: int) -> None:
        live = self.live_broker_ids()
        self._for_partitions_of(tx, broker_id, lambda p: on_broker_unfenced(
            p, broker_id, live, unclean_allowed=self._unclean_allowed(p.topic)))
        tx.effects.resync_brokers.add(broker_id)
        tx.effects.fenced_brokers.discard(broker_id)
        pending = self.metadata.pending_stops.get(broker_id)
        if pending:
            # Deleted while it was fenced. Handed to its sender once: should it
            # be lost again before delivery, the broker's own stray-log check
            # at its next start is the fallback.
            # The topic ID makes the broker delete only that incarnation's log.
            # A replica a reassignment removed and a later one gave back is hosted again:
            # not stopped.
            stubs = [PartitionRecord(topic, number, (broker_id,), (broker_id,), NO_LEADER, -1, -1,
                                     topic_id)
                     for topic, number, topic_id in sorted(pending)
                     if not self._hosts(broker_id, topic, number, topic_id)]
            tx.append(pending_stops_cleared_record(broker_id))
            if stubs:  # all given back: nothing to send
                tx.effects.stop_replicas.append((broker_id, stubs))

    def _hosts(self, broker_id: int, topic: str, number: int, topic_id: bytes) -> bool:
        p = self.metadata.partition(topic, number)
        return p is not None and p.topic_id == topic_id and broker_id in p.replicas

    # ------------------------------------------------------------ start-up

    def start(self, tx: Tx, now_ms: int, *, controller_epoch: int | None = None) -> None:
        """After replay: a cluster id for a new log, a new controller epoch, fresh sessions.
        ``controller_epoch``: the quorum's Raft epoch (it only grows); None: one more."""
        if not self.metadata.cluster_id:
            tx.append(cluster_record(self._uuid4().hex))
        if controller_epoch is None:
            controller_epoch = self.metadata.controller_epoch + 1
        tx.append(controller_epoch_record(controller_epoch))
        for broker_id in self.metadata.unfenced_broker_ids():
            # One session timeout from now, as KRaft's BrokerHeartbeatManager.register
            # does on activation: a broker finds the new controller within about a
            # heartbeat interval plus its channel's reconnect backoff (capped at 1 s,
            # broker.channels), well inside a session. An extra session here (as this
            # once gave) left a broker that died right after a failover, before its
            # heartbeat stream reached the new controller, unfenced for two timeouts.
            self.sessions.reset(broker_id, now_ms)
            tx.effects.resync_brokers.add(broker_id)
        # Brokers that were shutting down under the old controller count as live
        # again: partitions they left offline may have a leader now.
        self.elect_offline(tx, now_ms)

    def elect_offline(self, tx: Tx, now_ms: int) -> int:
        """Elect a leader for every offline partition that can have one; returns how many."""
        live = self.live_broker_ids()
        elected = 0
        for p in list(self.metadata.all_partitions()):
            if p.offline:
                change = elect(p, live, unclean_allowed=self._unclean_allowed(p.topic))
                if change is not None:
                    self._commit_change(tx, p, change)
                    elected += 1
        return elected

    # ------------------------------------------------------------ brokers

    def register_broker(self, tx: Tx, now_ms: int,
                        req: pb.RegisterBrokerRequest) -> pb.RegisterBrokerResponse:
        def refuse(message: str) -> pb.RegisterBrokerResponse:
            return pb.RegisterBrokerResponse(error_code=pb.INVALID_REQUEST, error_message=message,
                                             broker_epoch=-1)

        if req.broker_id < 0:
            return refuse(f"broker id {req.broker_id} is negative")
        if not req.incarnation_id:
            return refuse("incarnation_id is empty")
        if not 1 <= len(req.listeners) <= LISTENERS_MAX:
            return refuse(f"expected 1..{LISTENERS_MAX} listeners, got {len(req.listeners)}")
        listeners = []
        for x in req.listeners:
            if not x.name or not x.host or not 0 < x.port < 65536:
                return refuse(f"bad listener {x.name}={x.host}:{x.port}")
            listeners.append(Listener(x.name, x.host, x.port))
        if len({x.name for x in listeners}) != len(listeners):
            return refuse("listener names repeat")
        if len(req.rack) > RACK_CHARS_MAX or not all(
                c.isprintable() and not c.isspace() for c in req.rack):
            return refuse(f"bad rack {req.rack!r}: at most {RACK_CHARS_MAX} printable "
                          "characters without spaces")

        existing = self.metadata.brokers.get(req.broker_id)
        if (existing is not None and existing.incarnation_id != req.incarnation_id
                and self.sessions.alive(req.broker_id, now_ms)):
            return pb.RegisterBrokerResponse(
                error_code=pb.DUPLICATE_BROKER_REGISTRATION, broker_epoch=-1,
                error_message=f"broker {req.broker_id} is registered by another live process "
                              f"(incarnation {existing.incarnation_id}); its session must end "
                              f"(broker.session.timeout.ms {self.sessions.session_timeout_ms}) "
                              "before a new incarnation may register")
        if existing and not existing.fenced and existing.incarnation_id != req.incarnation_id:
            # A new process: the old one may have lost unflushed data, so it
            # leaves leadership and ISRs as if it had been fenced.
            self._fence(tx, req.broker_id)
        token = self._uuid4().bytes
        broker_epoch = tx.append(broker_registered_record(req.broker_id, req.incarnation_id,
                                                          listeners, token, rack=req.rack))
        self.sessions.reset(req.broker_id, now_ms)
        self._unfence_elections(tx, req.broker_id)
        return pb.RegisterBrokerResponse(
            error_code=pb.NONE, broker_epoch=broker_epoch,
            controller_epoch=self.metadata.controller_epoch, cluster_id=self.metadata.cluster_id,
            control_token=token)

    def _registration_refusal(self, broker_id: int, broker_epoch: int, control_token: bytes,
                              *, unfenced: bool = False) -> pb.ErrorCode | None:
        """The ErrorCode refusing a request a registered broker sends, or None to take it:
        STALE_BROKER_EPOCH for an epoch that is not the broker's current one (or a fenced
        broker when ``unfenced``), CLUSTER_AUTHORIZATION_FAILED without its token."""
        broker = self.metadata.brokers.get(broker_id)
        if broker is None or broker.broker_epoch != broker_epoch or (unfenced and broker.fenced):
            return pb.STALE_BROKER_EPOCH
        if not hmac.compare_digest(broker.control_token, control_token):
            return pb.CLUSTER_AUTHORIZATION_FAILED
        return None

    def note_heartbeat(self, req: pb.BrokerHeartbeatRequest, stream_id: int | None,
                       now_ms: int) -> None:
        """A heartbeat arrived (its command may wait in the owner's queue): the session
        of a broker whose committed registration it matches (epoch and control token)
        counts from now. Sessions are not metadata (``sessions``): nothing is written."""
        if self._registration_refusal(req.broker_id, req.broker_epoch,
                                      req.control_token) is None:
            self.sessions.touch(req.broker_id, now_ms, stream_id)

    def broker_heartbeat(self, tx: Tx, now_ms: int, req: pb.BrokerHeartbeatRequest,
                         stream_id: int | None = None) -> pb.BrokerHeartbeatResponse:
        """One heartbeat on ``BrokerHeartbeats`` stream ``stream_id`` (None: bound to no
        stream, which only tests use: brokers heartbeat on a stream)."""
        epoch = self.metadata.controller_epoch
        refusal = self._registration_refusal(req.broker_id, req.broker_epoch, req.control_token)
        if refusal is not None:
            return pb.BrokerHeartbeatResponse(error_code=refusal, is_fenced=True,
                                              controller_epoch=epoch)
        broker = self.metadata.brokers[req.broker_id]
        self.sessions.touch(req.broker_id, now_ms, stream_id)
        if req.want_shutdown:
            should_shutdown = True
            if not broker.fenced:
                self.sessions.begin_controlled_shutdown(req.broker_id)
                live = self.live_broker_ids()
                self._for_partitions_of(tx, req.broker_id, lambda p: on_controlled_shutdown(
                    p, req.broker_id, live, unclean_allowed=self._unclean_allowed(p.topic)))
                should_shutdown = not any(p.leader == req.broker_id
                                          for p in self.metadata.all_partitions())
            if should_shutdown:
                self.sessions.finish_controlled_shutdown(req.broker_id)
        else:
            should_shutdown = False
            if broker.fenced:
                tx.append(broker_unfenced_record(req.broker_id))
                self._unfence_elections(tx, req.broker_id)
        return pb.BrokerHeartbeatResponse(error_code=pb.NONE, is_fenced=broker.fenced,
                                          should_shutdown=should_shutdown, controller_epoch=epoch)

    def heartbeat_stream_closed(self, tx: Tx, now_ms: int, broker_id: int, broker_epoch: int,
                                stream_id: int) -> bool:
        """A ``BrokerHeartbeats`` stream ended (half-close, cancellation or lost connection).

        Fences the broker at once, exactly as a session expiry would, when the
        stream was its live one: ``broker_epoch`` is still its current epoch
        (an older incarnation's stream ending says nothing about the newer
        one), it is unfenced, the stream carried its latest heartbeat, and it
        did not finish a controlled shutdown. Returns whether it fenced.
        """
        broker = self.metadata.brokers.get(broker_id)
        if (broker is None or broker.fenced or broker.broker_epoch != broker_epoch
                or not self.sessions.stream_end_fences(broker_id, stream_id)):
            return False
        self._fence(tx, broker_id)
        return True

    def check_sessions(self, tx: Tx, now_ms: int) -> list[int]:
        """Fence every unfenced broker whose session expired; returns their ids."""
        expired = self.sessions.expired(self.metadata.unfenced_broker_ids(), now_ms)
        for broker_id in expired:
            self._fence(tx, broker_id)
        return expired

    # ------------------------------------------------------------ partitions

    def alter_partition(self, tx: Tx, now_ms: int,
                        req: pb.AlterPartitionRequest) -> pb.AlterPartitionResponse:
        refusal = self._registration_refusal(req.broker_id, req.broker_epoch, req.control_token,
                                             unfenced=True)
        if refusal is not None:
            return pb.AlterPartitionResponse(error_code=refusal)
        if len(req.items) > ITEMS_PER_REQUEST_MAX:
            return pb.AlterPartitionResponse(error_code=pb.INVALID_REQUEST)
        response = pb.AlterPartitionResponse(error_code=pb.NONE)
        live = self.live_broker_ids()
        registered = {b.broker_id: b.broker_epoch for b in self.metadata.brokers.values()}
        for item in req.items:
            current = self.metadata.partition(item.topic, item.partition)
            if current is None:
                response.items.add(error_code=pb.UNKNOWN_TOPIC_OR_PARTITION,
                                   state=pb.PartitionState(topic=item.topic,
                                                           partition=item.partition, leader=-1))
                continue
            epochs = tuple(item.new_isr_broker_epochs)
            if epochs and len(epochs) != len(item.new_isr):
                code, record = pb.INVALID_REQUEST, current  # one epoch per member (KIP-903)
            else:
                # None known (a shrink needs none): no joiner can be admitted.
                code, record = alter_partition(
                    current, leader_id=req.broker_id, leader_epoch=item.leader_epoch,
                    partition_epoch=item.partition_epoch, new_isr=tuple(item.new_isr),
                    live=live, registered_epochs=registered,
                    broker_epochs=dict(zip(item.new_isr, epochs, strict=True)) if epochs else {})
            if code == pb.NONE and record is not current:
                self._commit_change(tx, current, Change(record, leader_changed=False))
            response.items.add(error_code=code, state=requests.partition_state(record))
            preferred = record.replicas[0]
            if (code == pb.NONE and self.config.auto_leader_rebalance_enable
                    and preferred in record.isr and preferred not in current.isr):
                # The preferred replica just caught up: give it leadership back now
                # instead of at the next periodic check.
                change = maybe_preferred_leader(record, live)
                if change is not None:
                    self._commit_change(tx, record, change)
            if code == pb.NONE and record is not current:
                # An adding replica may just have joined: the reassignment completes.
                self._maybe_complete_reassignment(tx, tp_key=(item.topic, item.partition))
        return response

    def report_corrupt_replica(self, tx: Tx, now_ms: int, req: pb.ReportCorruptReplicaRequest
                               ) -> pb.ReportCorruptReplicaResponse:
        """A broker's own replicas hold batches failing their CRC (``election.on_replica_corrupt``)."""
        refusal = self._registration_refusal(req.broker_id, req.broker_epoch, req.control_token,
                                             unfenced=True)
        if refusal is not None:
            return pb.ReportCorruptReplicaResponse(error_code=refusal)
        if len(req.replicas) > ITEMS_PER_REQUEST_MAX:
            return pb.ReportCorruptReplicaResponse(error_code=pb.INVALID_REQUEST)
        response = pb.ReportCorruptReplicaResponse(error_code=pb.NONE)
        live = self.live_broker_ids()
        for item in req.replicas:
            result = response.results.add(topic=item.topic, partition=item.partition)
            current = self.metadata.partition(item.topic, item.partition)
            if current is None:
                result.error_code = pb.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"{item.topic}-{item.partition} does not exist"
                result.state.CopyFrom(pb.PartitionState(topic=item.topic,
                                                        partition=item.partition, leader=-1))
                continue
            code, change = on_replica_corrupt(
                current, req.broker_id, leader_epoch=item.leader_epoch,
                partition_epoch=item.partition_epoch, live=live)
            if change is not None:
                self._commit_change(tx, current, change)
            record = change.record if change is not None else current
            result.error_code = code
            result.error_message = _CORRUPT_REPLICA_REFUSALS.get(code, "")
            result.state.CopyFrom(requests.partition_state(record))
        return response

    def allocate_producer_ids(self, tx: Tx, now_ms: int, req: pb.AllocateProducerIdsRequest
                              ) -> pb.AllocateProducerIdsResponse:
        """A block of producer ids for a live broker (Kafka's KIP-730). The record that
        moves ``next_producer_id`` past the block is appended before the answer is built;
        the owner answers only once it is durable, so no id is handed out twice, also
        across restarts (a block a broker never used is simply skipped)."""
        refusal = self._registration_refusal(req.broker_id, req.broker_epoch, req.control_token,
                                             unfenced=True)
        if refusal is not None:
            return pb.AllocateProducerIdsResponse(error_code=refusal)
        start = self.metadata.next_producer_id
        if start > PRODUCER_ID_MAX - PRODUCER_ID_BLOCK_SIZE:
            return pb.AllocateProducerIdsResponse(error_code=pb.UNKNOWN_SERVER_ERROR)
        tx.append(producer_ids_record(req.broker_id, req.broker_epoch,
                                      start + PRODUCER_ID_BLOCK_SIZE))
        return pb.AllocateProducerIdsResponse(error_code=pb.NONE, producer_id_start=start,
                                              producer_id_len=PRODUCER_ID_BLOCK_SIZE)

    def preferred_leader_check(self, tx: Tx, now_ms: int) -> int:
        """Move every partition whose preferred replica can lead back to it; returns how many.

        Also elects leaders for offline partitions that could have one (a
        safety net: every event that makes that possible already elects).
        """
        moved = self.elect_offline(tx, now_ms)
        live = self.live_broker_ids()
        for p in list(self.metadata.all_partitions()):
            change = maybe_preferred_leader(p, live)
            if change is not None:
                self._commit_change(tx, p, change)
                moved += 1
            if p.reassigning:
                # A safety net: an ISR change completes a reassignment at once (above).
                self._maybe_complete_reassignment(tx, tp_key=(p.topic, p.partition))
        return moved

    # ------------------------------------------------------------ reassignments

    def _commit_reassignment(self, tx: Tx, old: PartitionRecord,
                             change: Change) -> None:
        """Commit a reassignment step; the replicas it drops get StopReplica(delete)
        (a fenced one when it is back: ``pending_stops``)."""
        self._commit_change(tx, old, change)
        removed = reassignment.removed_replicas(old, change.record)
        unfenced = self.metadata.unfenced_broker_ids()
        for broker_id in removed:
            if broker_id in unfenced:
                tx.effects.stop_replicas.append((broker_id, [change.record]))
            else:
                tx.append({"type": "pending_stops", "broker_id": broker_id, "partitions": [
                    [old.topic, old.partition,
                     topic_id_to_text(old.topic_id) if old.topic_id else ""]]})

    def _maybe_complete_reassignment(self, tx: Tx, tp_key: tuple[str, int]) -> None:
        p = self.metadata.partition(*tp_key)
        if p is None:
            return
        change = reassignment.maybe_complete(p, self.live_broker_ids())
        if change is not None:
            self._commit_reassignment(tx, p, change)

    def alter_partition_reassignments(self, tx: Tx, now_ms: int,
                                      req: pb.AlterPartitionReassignmentsRequest,
                                      ) -> pb.AlterPartitionReassignmentsResponse:
        """Kafka's AlterPartitionReassignments (``reassignment``): per partition, start
        moving it to the given replicas (checked as a manual assignment: registered
        brokers, none twice, not empty: INVALID_REPLICA_ASSIGNMENT), or cancel
        (NO_REASSIGNMENT_IN_PROGRESS when none is ongoing)."""
        response = pb.AlterPartitionReassignmentsResponse(error_code=pb.NONE)
        if len(req.partitions) > ITEMS_PER_REQUEST_MAX:
            response.error_code = pb.INVALID_REQUEST
            response.error_message = f"more than {ITEMS_PER_REQUEST_MAX} partitions"
            return response
        live = self.live_broker_ids()
        seen: set[tuple[str, int]] = set()
        for item in req.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition,
                                          error_code=pb.NONE)
            try:
                key = (item.topic, item.partition)
                if key in seen:
                    raise _TopicError(pb.INVALID_REQUEST,
                                      f"{item.topic}-{item.partition} is named twice")
                seen.add(key)
                current = self.metadata.partition(item.topic, item.partition)
                if current is None:
                    raise _TopicError(pb.UNKNOWN_TOPIC_OR_PARTITION,
                                      f"{item.topic}-{item.partition} does not exist")
                if item.cancel:
                    change: Change | None = reassignment.cancel(current, live)
                else:
                    self._check_assignment([list(item.replicas)])
                    original = [r for r in current.replicas if r not in current.adding]
                    if req.keep_replication_factor and len(item.replicas) != len(original):
                        raise _TopicError(
                            pb.INVALID_REPLICATION_FACTOR,
                            f"{item.topic}-{item.partition} has {len(original)} replicas; "
                            f"the target has {len(item.replicas)} and the request does not "
                            "allow changing the replication factor")
                    change = reassignment.start(current, item.replicas, live)
            except TidewaterError as e:
                result.error_code, result.error_message = e.error_code, str(e)
                continue
            if change is not None:
                self._commit_reassignment(tx, current, change)
        return response

    def list_partition_reassignments(self, tx: Tx, now_ms: int,
                                     req: pb.ListPartitionReassignmentsRequest,
                                     ) -> pb.ListPartitionReassignmentsResponse:
        """The ongoing reassignments among the named partitions (every partition when
        ``all_partitions``); a named topic or partition that does not exist makes the
        answer UNKNOWN_TOPIC_OR_PARTITION, as Kafka's controller."""
        response = pb.ListPartitionReassignmentsResponse(error_code=pb.NONE)
        if req.all_partitions:
            wanted = list(self.metadata.all_partitions())
        else:
            wanted = []
            for item in dict.fromkeys((x.topic, x.partition) for x in req.partitions):
                p = self.metadata.partition(*item)
                if p is None:
                    response.error_code = pb.UNKNOWN_TOPIC_OR_PARTITION
                    response.error_message = f"{item[0]}-{item[1]} does not exist"
                    return response
                wanted.append(p)
        for p in sorted(wanted, key=lambda p: (p.topic, p.partition)):
            if p.reassigning:
                response.reassignments.add(topic=p.topic, partition=p.partition,
                                           replicas=p.replicas, adding_replicas=p.adding,
                                           removing_replicas=p.removing)
        return response

    # ------------------------------------------------------------ topics

    def _check_topic(self, t: pb.CreatableTopic, live: set[int],
                     taken: set[str]) -> tuple[int, int, dict[str, str]]:
        """(partitions, replication factor, configs) or a typed error."""
        validate_topic_name(t.name)
        if t.name in self.metadata.topics:
            raise _TopicError(pb.TOPIC_ALREADY_EXISTS, f"topic {t.name!r} already exists")
        if collision_key(t.name) in taken:
            raise _TopicError(pb.INVALID_TOPIC_EXCEPTION,
                              f"topic {t.name!r} collides with an existing topic ('.' vs '_')")
        if t.assignments:
            if t.num_partitions != -1 or t.replication_factor != -1:
                raise _TopicError(pb.INVALID_REQUEST,
                                  "both numPartitions or replicationFactor and "
                                  "replicasAssignments were set; give one or the other")
            numbers = sorted(a.partition for a in t.assignments)
            if numbers != list(range(len(numbers))):
                raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                  "the manual partition assignment must name partitions "
                                  f"0..{len(numbers) - 1} once each, got {numbers}")
            if len(numbers) > PARTITIONS_PER_TOPIC_MAX:
                raise _TopicError(pb.INVALID_PARTITIONS,
                                  f"partitions must be 1..{PARTITIONS_PER_TOPIC_MAX}")
            factor = self._check_assignment([list(a.broker_ids) for a in t.assignments])
            configs = {**self._default_topic_configs(), **dict(t.configs)}
            validate_topic_configs(configs)
            return len(numbers), factor, configs
        partitions = self.config.num_partitions if t.num_partitions == -1 else t.num_partitions
        if not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise _TopicError(pb.INVALID_PARTITIONS,
                              f"partitions must be 1..{PARTITIONS_PER_TOPIC_MAX}, got {partitions}")
        factor = (self.config.default_replication_factor if t.replication_factor == -1
                  else t.replication_factor)
        if not 1 <= factor <= len(live):
            raise _TopicError(pb.INVALID_REPLICATION_FACTOR,
                              f"replication factor {factor} must be 1..{len(live)} "
                              f"(the live brokers)")
        # The cluster defaults too: every config a topic carries must suit every broker.
        configs = {**self._default_topic_configs(), **dict(t.configs)}
        validate_topic_configs(configs)
        return partitions, factor, configs

    def _check_assignment(self, assignment: list[list[int]], factor: int | None = None) -> int:
        """Kafka's checks of a manual assignment: each partition names registered brokers,
        none twice, and every partition (and, growing a topic, the existing ones: ``factor``)
        has as many replicas; returns that count."""
        for replicas in assignment:
            if not replicas:
                raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                  "the manual partition assignment includes an empty "
                                  "replica list")
            if len(set(replicas)) != len(replicas):
                raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                  f"the manual partition assignment {replicas} names a "
                                  "broker twice")
            for broker_id in replicas:
                if broker_id not in self.metadata.brokers:
                    raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                      "the manual partition assignment includes broker "
                                      f"{broker_id}, but no such broker is registered")
            if not set(replicas) & self.live_broker_ids():
                raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                  f"all brokers of the manual partition assignment {replicas} "
                                  "are fenced or in controlled shutdown")
        counts = {len(replicas) for replicas in assignment}
        expected = factor if factor is not None else len(assignment[0])
        if counts != {expected}:
            raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                              "all partitions in the manual partition assignment must have "
                              f"the same number of replicas ({expected}), got "
                              f"{sorted(counts)}")
        return expected

    def create_topics(self, tx: Tx, now_ms: int,
                      req: pb.CreateTopicsRequest) -> pb.CreateTopicsResponse:
        response = pb.CreateTopicsResponse()
        live = self.live_broker_ids()
        names = Counter(t.name for t in req.topics)
        taken = {collision_key(name) for name in self.metadata.topics}
        partition_count = sum(len(info.partitions) for info in self.metadata.topics.values())
        for t in req.topics:
            result = response.topics.add(name=t.name, error_code=pb.NONE)
            try:
                _check_topic_list(len(req.topics), names[t.name], t.name)
                partitions, factor, configs = self._check_topic(t, live, taken)
                if partition_count + partitions > PARTITIONS_MAX:
                    raise _TopicError(pb.INVALID_PARTITIONS,
                                      f"the cluster would exceed {PARTITIONS_MAX} partitions")
            except TidewaterError as e:
                result.error_code, result.error_message = e.error_code, str(e)
                continue
            result.num_partitions, result.replication_factor = partitions, factor
            taken.add(collision_key(t.name))
            partition_count += partitions
            if req.validate_only:
                continue
            assignment = ([list(a.broker_ids) for a in sorted(t.assignments,
                                                                key=lambda a: a.partition)]
                          if t.assignments else
                          assign_replicas(sorted(live), partitions, factor,
                                          topic_sequence=self.metadata.topics_created_total))
            topic_id = self._new_topic_id()
            records = [new_partition(t.name, i, replicas, live, topic_id)
                       for i, replicas in enumerate(assignment)]
            tx.append(topic_created_record(t.name, configs, records, topic_id=topic_id))
            result.topic_id = topic_id
            for p in records:
                tx.effects.changed_partitions.add((p.topic, p.partition))
                tx.effects.new_partitions.add((p.topic, p.partition))
        return response

    def create_partitions(self, tx: Tx, now_ms: int,
                          req: pb.CreatePartitionsRequest) -> pb.CreatePartitionsResponse:
        """Grow each named topic to ``count`` partitions (Kafka's CreatePartitions): new
        partitions only, spread like a new topic's over the live brokers with the topic's
        replication factor; the existing ones are not touched."""
        response = pb.CreatePartitionsResponse()
        live = self.live_broker_ids()
        names = Counter(t.name for t in req.topics)
        partition_count = sum(len(info.partitions) for info in self.metadata.topics.values())
        for t in req.topics:
            result = response.topics.add(name=t.name, error_code=pb.NONE)
            info = self.metadata.topics.get(t.name)
            try:
                _check_topic_list(len(req.topics), names[t.name], t.name)
                if info is None:
                    raise _TopicError(pb.UNKNOWN_TOPIC_OR_PARTITION,
                                      f"topic {t.name!r} does not exist")
                current = len(info.partitions)
                if t.count <= current:
                    raise _TopicError(pb.INVALID_PARTITIONS,
                                      f"topic {t.name!r} has {current} partitions; the new "
                                      f"count must be larger, got {t.count}")
                if partition_count + t.count - current > PARTITIONS_MAX:
                    raise _TopicError(pb.INVALID_PARTITIONS,
                                      f"the cluster would exceed {PARTITIONS_MAX} partitions")
                first = info.partitions[0]
                # Mid-reassignment its replicas are the union: the adding ones do not count.
                factor = len(first.replicas) - len(first.adding)
                manual = [list(a.broker_ids) for a in t.assignments]
                if manual and len(manual) != t.count - current:
                    raise _TopicError(pb.INVALID_REPLICA_ASSIGNMENT,
                                      f"attempted to add {t.count - current} additional "
                                      f"partitions, but {len(manual)} assignments were given")
                if manual:
                    self._check_assignment(manual, factor)
                elif factor > len(live):
                    raise _TopicError(pb.INVALID_REPLICATION_FACTOR,
                                      f"replication factor {factor} but {len(live)} live brokers")
            except TidewaterError as e:
                result.error_code, result.error_message = e.error_code, str(e)
                continue
            result.num_partitions, result.replication_factor = t.count, factor
            result.topic_id = info.topic_id
            partition_count += t.count - current
            if req.validate_only:
                continue
            assignment: list[list[int]] = (
                [[]] * current + manual if manual else
                [list(r) for r in assign_replicas(
                    sorted(live), t.count, factor,
                    topic_sequence=self.metadata.topics_created_total)])
            records = [new_partition(t.name, i, assignment[i], live, info.topic_id)
                       for i in range(current, t.count)]
            tx.append(partitions_created_record(t.name, records))
            for p in records:
                tx.effects.changed_partitions.add((p.topic, p.partition))
                tx.effects.new_partitions.add((p.topic, p.partition))
        return response

    def delete_topics(self, tx: Tx, now_ms: int,
                      req: pb.DeleteTopicsRequest) -> pb.DeleteTopicsResponse:
        response = pb.DeleteTopicsResponse()
        if len(req.names) > ITEMS_PER_REQUEST_MAX:
            for name in dict.fromkeys(req.names):
                response.topics.add(name=name, error_code=pb.INVALID_REQUEST,
                                    error_message=f"more than {ITEMS_PER_REQUEST_MAX} names")
            return response
        for name in dict.fromkeys(req.names):  # once each, in order
            info = self.metadata.topics.get(name)
            named_id = req.topic_ids.get(name)
            if named_id is not None and (info is None or info.topic_id != named_id):
                response.topics.add(topic_id=named_id, error_code=pb.UNKNOWN_TOPIC_ID,
                                    error_message="This server does not host this topic ID.")
                continue
            if name in INTERNAL_TOPICS:
                # Kafka's kafka-topics.sh refuses these with this message, and its brokers
                # refuse other writes to them with INVALID_TOPIC_EXCEPTION; refused here for
                # every client (the group coordinator's committed offsets live there).
                response.topics.add(name=name, error_code=pb.INVALID_TOPIC_EXCEPTION,
                                    error_message=f"Topic {name} is a kafka internal topic and "
                                                  "is not allowed to be marked for deletion")
                continue
            if info is None:
                response.topics.add(name=name, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION,
                                    error_message=f"topic {name!r} does not exist")
                continue
            partitions = list(info.partitions.values())
            by_broker: dict[int, list[PartitionRecord]] = {}
            for p in partitions:
                for replica in p.replicas:
                    by_broker.setdefault(replica, []).append(p)
            unfenced = self.metadata.unfenced_broker_ids()
            pending = {b: [p.partition for p in owned] for b, owned in by_broker.items()
                       if b not in unfenced}
            tx.append(topic_deleted_record(name, pending))
            for broker_id, owned in sorted(by_broker.items()):
                if broker_id in unfenced:
                    tx.effects.stop_replicas.append((broker_id, owned))
            response.topics.add(name=name, error_code=pb.NONE, num_partitions=len(partitions),
                                replication_factor=len(partitions[0].replicas) if partitions else 0,
                                topic_id=info.topic_id)
        return response

    def _new_topic_id(self) -> bytes:
        """A random ID no current topic has (a repeat is 2**-122 likely; checked anyway)."""
        taken = self.metadata.topic_ids()
        while True:
            topic_id = new_topic_id(self._uuid4)
            if topic_id not in taken:
                return topic_id

    def describe_cluster(self, tx: Tx, now_ms: int,
                         req: pb.DescribeClusterRequest) -> pb.DescribeClusterResponse:
        return requests.describe_cluster(self.metadata, self.sessions, self.config.node_id)

    # ------------------------------------------------------------ configs, elections

    def alter_configs(self, tx: Tx, now_ms: int,
                      req: pb.AlterConfigsRequest) -> pb.AlterConfigsResponse:
        """Kafka's AlterConfigs and IncrementalAlterConfigs (``config_changes``). A topic's
        replicas get its new configs with a LeaderAndIsr of each partition (the state is
        unchanged: a resend), every broker its dynamic broker configs with UpdateMetadata."""
        defaults = {**dynamic_topic_defaults(self.metadata.broker_configs, -1),
                    **self._default_topic_configs()}

        def append(record: MetadataRecord) -> None:
            tx.append(record)
            if record["resource_type"] == config_changes.TOPIC_RESOURCE:
                info = self.metadata.topics[record["name"]]
                tx.effects.changed_partitions.update((info.name, n) for n in info.partitions)
        return config_changes.alter_configs(self.metadata, req, append, defaults)

    def elect_leaders(self, tx: Tx, now_ms: int,
                      req: pb.ElectLeadersRequest) -> pb.ElectLeadersResponse:
        """Kafka's ElectLeaders. PREFERRED: give leadership to the first replica when it is
        live and in the ISR (PREFERRED_LEADER_NOT_AVAILABLE otherwise); UNCLEAN: a partition
        without a live leader gets one, from outside the ISR if need be (whatever the
        topic's unclean.leader.election.enable; ELIGIBLE_LEADERS_NOT_AVAILABLE when no
        replica is live). A partition that needs nothing is ELECTION_NOT_NEEDED, left out of
        the answer when every partition was asked for (Kafka's null topic_partitions)."""
        response = pb.ElectLeadersResponse(error_code=pb.NONE)
        if req.election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN):
            response.error_code = pb.INVALID_REQUEST
            return response
        if len(req.partitions) > ITEMS_PER_REQUEST_MAX:
            response.error_code = pb.INVALID_REQUEST
            return response
        if req.all_partitions:
            wanted = [(p.topic, p.partition) for p in self.metadata.all_partitions()]
        else:
            wanted = list(dict.fromkeys((p.topic, p.partition) for p in req.partitions))
        live = self.live_broker_ids()
        for topic, number in wanted:
            current = self.metadata.partition(topic, number)
            if current is None:
                code, message = pb.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{number} does not exist"
            else:
                code, message, change = _election(current, req.election_type, live)
                if change is not None:
                    self._commit_change(tx, current, change)
            if req.all_partitions and code == pb.ELECTION_NOT_NEEDED:
                continue
            response.results.add(topic=topic, partition=number, error_code=code,
                                 error_message=message)
        return response

    # ------------------------------------------------------------ users and ACLs

    def alter_user_scram_credentials(self, tx: Tx, now_ms: int,
                                     req: pb.AlterUserScramCredentialsRequest,
                                     ) -> pb.AlterUserScramCredentialsResponse:
        return security_records.alter_user_scram_credentials(tx, self.metadata.security, req)

    def describe_user_scram_credentials(self, tx: Tx, now_ms: int,
                                        req: pb.DescribeUserScramCredentialsRequest,
                                        ) -> pb.DescribeUserScramCredentialsResponse:
        return security_records.describe_user_scram_credentials(self.metadata.security, req)

    def create_acls(self, tx: Tx, now_ms: int, req: pb.CreateAclsRequest) -> pb.CreateAclsResponse:
        return security_records.create_acls(tx, self.metadata.security, req)

    def describe_acls(self, tx: Tx, now_ms: int,
                      req: pb.DescribeAclsRequest) -> pb.DescribeAclsResponse:
        return security_records.describe_acls(self.metadata.security, req)

    def delete_acls(self, tx: Tx, now_ms: int, req: pb.DeleteAclsRequest) -> pb.DeleteAclsResponse:
        return security_records.delete_acls(tx, self.metadata.security, req)

    # ------------------------------------------------------------ client quotas

    def alter_client_quotas(self, tx: Tx, now_ms: int, req: pb.AlterClientQuotasRequest,
                            ) -> pb.AlterClientQuotasResponse:
        return quota_records.alter_client_quotas(tx, self.metadata.quotas, req)

    def describe_client_quotas(self, tx: Tx, now_ms: int, req: pb.DescribeClientQuotasRequest,
                               ) -> pb.DescribeClientQuotasResponse:
        return quota_records.describe_client_quotas(self.metadata.quotas, req)


_CORRUPT_REPLICA_REFUSALS = {
    pb.NOT_LEADER_OR_FOLLOWER: "not a replica of this partition",
    pb.FENCED_LEADER_EPOCH: "the leader epoch is not the current one",
    pb.INVALID_UPDATE_VERSION: "the partition epoch is not the current one",
    pb.INELIGIBLE_REPLICA: "not in the ISR: truncate and fetch from the leader",
    pb.ELIGIBLE_LEADERS_NOT_AVAILABLE: "no other live ISR member could take over: "
                                       "the replica stays in the ISR",
}


ELECTION_PREFERRED, ELECTION_UNCLEAN = 0, 1  # Kafka's ElectionType


def _election(p: PartitionRecord, election_type: int,
              live: set[int]) -> tuple[pb.ErrorCode, str, Change | None]:
    """One partition's ElectLeaders outcome: (code, message, the change to commit)."""
    name = f"{p.topic}-{p.partition}"
    if election_type == ELECTION_PREFERRED:
        preferred = p.replicas[0]
        if p.leader == preferred:
            return pb.ELECTION_NOT_NEEDED, f"{name}: the preferred replica leads already", None
        change = maybe_preferred_leader(p, live)
        if change is None:
            return (pb.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"{name}: preferred replica {preferred} is not live and in the ISR", None)
        return pb.NONE, "", change
    if p.leader != NO_LEADER and p.leader in live:
        return pb.ELECTION_NOT_NEEDED, f"{name}: broker {p.leader} leads it", None
    change = elect(p, live, unclean_allowed=True)
    if change is None or change.record.leader == NO_LEADER:
        return pb.ELIGIBLE_LEADERS_NOT_AVAILABLE, f"{name}: no replica is live", None
    return pb.NONE, "", change


def _dynamic_unclean(cluster_default: dict[str, str]) -> dict[str, str]:
    value = cluster_default.get("unclean.leader.election.enable")
    return {} if value is None else {"unclean.leader.election.enable": value}


def _check_topic_list(count: int, times_named: int, name: str) -> None:
    """A request's list of topics: bounded, and each named once."""
    if count > ITEMS_PER_REQUEST_MAX:
        raise _TopicError(pb.INVALID_REQUEST,
                          f"more than {ITEMS_PER_REQUEST_MAX} topics in one request")
    if times_named > 1:
        raise _TopicError(pb.INVALID_REQUEST, f"topic {name!r} is named twice")


class _TopicError(TidewaterError):
    """A CreateTopics failure with an explicit code."""

    def __init__(self, code: pb.ErrorCode, message: str):
        super().__init__(message)
        self.error_code = code
