"""The controller's requests to this broker: LeaderAndIsr, StopReplica, UpdateMetadata.

Request-level checks first: before this broker's registration is answered every
controller request is refused with gRPC UNAVAILABLE (the sender retries: a new
process must not act on states meant for its previous one); a request without
the control token of this broker's registration is CLUSTER_AUTHORIZATION_FAILED
(it may come from anyone who can reach the port; nothing of it is believed); a
controller epoch older than the newest seen is STALE_CONTROLLER_EPOCH; a broker
epoch other than this broker's registered one (-1 included) is
STALE_BROKER_EPOCH. Then
each partition state goes to its replica's core
(``ReplicaState.on_leader_and_isr`` / ``on_stop_replica``) and the ``Ready``
is carried out at once, synchronously (no other coroutine runs in between); the core's ``error`` is
that partition's answer. A partition exists locally only once a LeaderAndIsr
names this broker as a replica; logs loaded at start-up wait (with their
checkpointed HW) until then. The new partitions' logs may be made before the
request is applied (``new_logs``, then ``create_logs``): the broker does so from a
worker thread, so a topic's creation does not stop its event loop; the simulation
does so at once. The apply finds them and decides the same as without them.

Topic IDs (``topic_identity``, pure): a LeaderAndIsr's topic ID decides whether
the local log is kept, adopted, or moved aside for a fresh one; every full
UpdateMetadata sweeps replicas of incarnations the cluster no longer has here.
Only a controller of this data dir's cluster (``cluster_identity``) may make
the broker delete a log.

One implementation, two hosts: the broker runs this class against its
``LogManager``, ``meta.properties`` and clocks; the simulation (``tests/sim``)
runs the same class against its in-memory disk and clock. Nothing here awaits.

Topic configs ride on every LeaderAndIsr: a log's config and the core's
``min.insync.replicas`` follow them (a change re-checks the HW and the
waiting acks=all requests at once).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from tidewater.broker.clock import mono_ms as _mono_ms
from tidewater.broker.clock import wall_ms as _wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.error_mapping import error_code_for, wire_code
from tidewater.broker.replicas.cluster_identity import ClusterIdentity
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.control_rules import controller_request_refusal, is_isr_eligible
from tidewater.broker.replication.ready import Ready
from tidewater.broker.replication.replica import LeaderAndIsrState, ReplicaState
from tidewater.broker.replication.topic_identity import (
    IdentityAction,
    describe_topic_id,
    incarnation_action,
    stop_replica_error,
    stray_replicas,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition, validate_topic_partition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.broker_dynamic_config import dynamic_topic_defaults
from tidewater.proto.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    InvariantViolation,
    error_for_code,
)
from tidewater.proto.topic_config import validate_topic_configs
from tidewater.proto.topic_id import check_topic_id

log = logging.getLogger("tidewater.broker.replicas.control")


def partition_state(state: pb.PartitionState) -> LeaderAndIsrState:
    """The controller's protobuf partition state as the core takes it."""
    return LeaderAndIsrState(state.topic, state.partition, state.leader, state.leader_epoch,
                          state.partition_epoch, tuple(state.replicas), tuple(state.isr))


class LogManagerPort(Protocol):
    """The ``LogManager`` operations the control path uses (the simulation's disk has them
    too)."""

    def get(self, tp: TopicPartition) -> Any: ...

    def get_or_create(self, tp: TopicPartition, config: LogConfig, now_ms: int, *,
                      topic_id: bytes | None = None) -> Any: ...

    def topic_id(self, tp: TopicPartition) -> bytes | None: ...

    def topic_ids(self) -> dict[TopicPartition, bytes | None]: ...

    def assign_topic_id(self, tp: TopicPartition, topic_id: bytes) -> None: ...

    def update_topic_config(self, topic: str, config: LogConfig) -> None: ...

    def delete(self, tp: TopicPartition) -> Any: ...

    def moves_aside(self) -> AbstractContextManager[list[Any]]: ...

    def settle_deletions(self, moved: list[Any]) -> None: ...


class StoppedReplicas(NamedTuple):
    """A StopReplica's first step (``ControlRequests.stop_replicas``): its answers so far
    and the logs it moved aside. They are made durable (``LogManager.settle_deletions``)
    before it is answered (``answer_stop_replica``)."""

    response: pb.StopReplicaResponse
    moved: list[Any]


class NewLog(NamedTuple):
    """A log a LeaderAndIsr creates here (``ControlRequests.new_logs``)."""

    tp: TopicPartition
    config: LogConfig
    topic_id: bytes


# ``control_rules.controller_request_refusal``'s and ``topic_identity.incarnation_action``'s
# shapes: the rules ControlRequests is given.
RefusalRule = Callable[..., int | None]
IncarnationRule = Callable[..., IdentityAction]


class ControlRequests:
    def __init__(self, *, config: BrokerConfig, log_manager: LogManagerPort,
                 metadata_cache: MetadataCache,
                 partitions: dict[TopicPartition, Partition], carrier: ReadyCarrier,
                 broker_epoch: Callable[[], int], loaded_high_watermarks: dict[TopicPartition, int],
                 forget_partition: Callable[[TopicPartition], None],
                 control_token: Callable[[], bytes], cluster_identity: ClusterIdentity,
                 mono_ms: Callable[[], int] = _mono_ms, wall_ms: Callable[[], int] = _wall_ms,
                 replica_class: type[ReplicaState] = ReplicaState,
                 refusal_rule: RefusalRule = controller_request_refusal,
                 incarnation_rule: IncarnationRule = incarnation_action):
        self.config = config
        self.broker_id = config.broker_id
        self.log_manager = log_manager
        self.metadata_cache = metadata_cache
        self.partitions = partitions
        self._carrier = carrier
        self._broker_epoch = broker_epoch
        self._control_token = control_token  # the registration's (ControllerChannel)
        self._loaded_high_watermarks = loaded_high_watermarks
        self._forget_partition = forget_partition
        self.controller_epoch = -1
        self.cluster_identity = cluster_identity
        self._mono_ms = mono_ms
        self._wall_ms = wall_ms
        # The rules, given (defaults: the product's): the simulation puts a broken
        # variant's in here, so this class carries no seam for it.
        self._replica_class = replica_class
        self._refusal_rule = refusal_rule
        self._incarnation_rule = incarnation_rule
        # A request's partitions mostly share their topic's configs: each distinct map is
        # checked and made into a LogConfig once a request (``_configs_refusal``,
        # ``_log_config``), not once a partition. Emptied at each request: the broker's
        # dynamic defaults may change between requests.
        self._checked_configs: dict[frozenset[tuple[str, str]], str | None] = {}
        self._log_configs: dict[frozenset[tuple[str, str]], LogConfig] = {}
        # Leader endpoints (INTERNAL) learned from LeaderAndIsr and UpdateMetadata.
        self.leader_endpoints: dict[int, tuple[str, int]] = {}
        # Live brokers' registered epochs from the last UpdateMetadata (None: none yet).
        self.alive_broker_epochs: dict[int, int] | None = None
        # Told (controller id, epoch) when a request of a newer controller epoch is taken:
        # a quorum's new active controller resyncs every broker at once, so the broker's
        # controller link moves its heartbeats there (ControllerChannel.follow_active)
        # instead of waiting for the old one's stream to fail.
        self.on_new_controller: Callable[[int, int], None] | None = None

    def _take_controller_epoch(self, controller_id: int, controller_epoch: int) -> None:
        newer = controller_epoch > self.controller_epoch
        self.controller_epoch = controller_epoch
        if newer and self.on_new_controller is not None:
            self.on_new_controller(controller_id, controller_epoch)

    # ================================================================ LeaderAndIsr

    def _refusal(self, kind: str, controller_epoch: int, broker_epoch: int | None,
                 token: bytes) -> int:
        """``control_rules.controller_request_refusal`` (NONE: take it); not registered
        yet raises BrokerNotAvailableError, which the servicer answers as gRPC
        UNAVAILABLE so the controller's sender retries."""
        refusal = self._refusal_of(controller_epoch, broker_epoch, token)
        if refusal == pb.BROKER_NOT_AVAILABLE:
            raise BrokerNotAvailableError(f"{kind} before this broker registered: retry later")
        if refusal == pb.CLUSTER_AUTHORIZATION_FAILED:
            log.warning("refused %s claiming controller epoch %d: not this registration's "
                        "control token", kind, controller_epoch)
        return pb.NONE if refusal is None else refusal

    def _refusal_of(self, controller_epoch: int, broker_epoch: int | None,
                    token: bytes) -> int | None:
        """The refusal rule's verdict alone (None: take it), raising and logging nothing."""
        return self._refusal_rule(
            registered_epoch=self._broker_epoch(), controller_epoch_seen=self.controller_epoch,
            request_controller_epoch=controller_epoch, request_broker_epoch=broker_epoch,
            token_matches=hmac.compare_digest(token, self._control_token()))

    def new_logs(self, request: pb.LeaderAndIsrRequest) -> list[NewLog]:
        """The logs ``leader_and_isr(request)`` would create here: its new partitions (no
        replica and no log here yet) that the same checks and rules take, in a request
        that is not refused. Nothing is changed. A host creates them with ``create_logs``
        before it applies the request, where it can do so off its event loop: the broker
        does, from a worker thread, so that a topic's creation (milliseconds of files and
        fsyncs a partition: ~0.9 s for 50 on a slow machine) does not stop every other
        request on the broker meanwhile. The apply then finds the logs; what it refuses
        is answered there."""
        if self._refusal_of(request.controller_epoch, request.broker_epoch,
                            request.control_token) is not None:
            return []
        self._forget_parsed_configs()
        trusted = self.cluster_identity.trusts(request.cluster_id)
        names_by_id: dict[bytes, str] | None = None  # made once a new partition is named
        wanted: list[NewLog] = []
        seen: set[TopicPartition] = set()
        for item in request.partitions:
            try:
                taken = self._taken_state(item)
                if not isinstance(taken[0], LeaderAndIsrState):
                    continue
                _state, tp, topic_id, topic_configs = taken
                if tp in seen or tp in self.partitions or self.log_manager.get(tp) is not None:
                    continue  # the apply decides what an existing replica or log becomes
                seen.add(tp)
                if names_by_id is None:
                    names_by_id = self._topic_names_by_id()
                action = self._incarnation_rule(tp, topic_id, None, trusted=trusted,
                                                names_by_id=names_by_id, has_log=False)
                names_by_id[topic_id] = tp.topic
                if action is IdentityAction.CREATE:
                    wanted.append(NewLog(tp, self._log_config(topic_configs), topic_id))
            except Exception:  # refused here: the apply answers it
                continue
        return wanted

    def create_logs(self, new_logs: Iterable[NewLog]) -> None:
        """Create the logs ``new_logs`` names (``LogManager.get_or_create``), in order. It
        reads nothing of this object's state, so the broker runs it in a worker thread,
        between ``new_logs`` and ``leader_and_isr`` under its lock of control requests.
        A failed creation is left to the apply, which meets it again and answers it."""
        now_ms = self._wall_ms()
        for tp, config, topic_id in new_logs:
            try:
                self.log_manager.get_or_create(tp, config, now_ms, topic_id=topic_id)
            except Exception as e:  # the apply tries again and answers the error
                log.warning("could not create the log of %s ahead of its LeaderAndIsr: %s",
                            tp, e)

    def leader_and_isr(self, request: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrResponse:
        refusal = self._refusal("LeaderAndIsr", request.controller_epoch, request.broker_epoch,
                               request.control_token)
        if refusal != pb.NONE:
            return pb.LeaderAndIsrResponse(error_code=wire_code(refusal))
        self._take_controller_epoch(request.controller_id, request.controller_epoch)
        for e in request.leaders:
            self.leader_endpoints[e.broker_id] = (e.host, e.port)
        self._forget_parsed_configs()
        response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
        trusted = self.cluster_identity.trusts(request.cluster_id)
        names_by_id = self._topic_names_by_id()
        # The carrier writes each partition's new epoch (fsynced, from threads) as soon as
        # it is decided, while the next ones decide (a restart's 60), and carries out the
        # Readies once all are written, each before this answers. A partition named twice
        # carries out what came before it first.
        answers: list[tuple[int, str] | None] = []
        position = 0
        while position < len(request.partitions):
            decided: list[tuple[int, Ready]] = []  # (answer index, Ready) handed to the carrier
            run = self._decide(request, position, trusted, names_by_id, answers, decided)
            failures = self._carrier.apply_all(run)
            position = len(answers)
            for (index, ready), failure in zip(decided, failures, strict=True):
                answers[index] = (error_code_for(failure, context="LeaderAndIsr")
                                  if failure is not None else (ready.error, ready.error_message))
        for item, answer in zip(request.partitions, answers, strict=True):
            code, message = answer if answer is not None else (pb.NONE, "")
            response.partitions.add(topic=item.state.topic, partition=item.state.partition,
                                    error_code=code, error_message=message)
        return response

    def _decide(self, request: pb.LeaderAndIsrRequest, position: int, trusted: bool,
                names_by_id: dict[bytes, str], answers: list[tuple[int, str] | None],
                decided: list[tuple[int, Ready]]) -> Iterator[tuple[Partition, Ready]]:
        """The partitions from ``position`` on, decided one at a time as the carrier reads
        them: each one's answer (None: its Ready's, once carried out) appended to
        ``answers``. Ends before a partition decided already (before a new incarnation
        may replace it)."""
        named: set[tuple[str, int]] = set()
        for item in request.partitions[position:]:
            key = (item.state.topic, item.state.partition)
            if key in named:
                return
            try:
                got = self._apply_partition_state(item, trusted, request.metadata_offset,
                                                  names_by_id)
            except Exception as e:  # the one boundary: a typed error per partition
                got = error_code_for(e, context="LeaderAndIsr")
            if isinstance(got[1], Ready):
                named.add(key)
                decided.append((len(answers), got[1]))
                answers.append(None)
                yield got[0], got[1]
            else:
                answers.append(got)

    def _apply_partition_state(self, item: pb.LeaderAndIsrPartition, trusted: bool,
                                     metadata_offset: int,
                                     names_by_id: dict[bytes, str]
                                     ) -> tuple[int, str] | tuple[Partition, Ready]:
        """The partition's answer when refused here, else it and its Ready to carry out."""
        taken = self._taken_state(item)
        if not isinstance(taken[0], LeaderAndIsrState):
            if taken[0] == pb.INVALID_CONFIG:
                # The controller checked them with the same code: a controller of another
                # version, or a metadata log edited by hand. The partition is not hosted.
                log.error("cannot host %s-%d: its topic configs are refused: %s",
                          item.state.topic, item.state.partition, taken[1])
            return taken
        state, tp, topic_id, topic_configs = taken
        partition = self._partition_for_incarnation(tp, topic_id, topic_configs, trusted,
                                                          names_by_id)
        partition.metadata_offset = max(partition.metadata_offset, metadata_offset)
        self._apply_topic_configs(partition, topic_configs)
        return partition, partition.replica.on_leader_and_isr(state, self._mono_ms())

    def _taken_state(self, item: pb.LeaderAndIsrPartition
                     ) -> tuple[int, str] | tuple[LeaderAndIsrState, TopicPartition, bytes,
                                                  dict[str, str]]:
        """A partition state's checks before its replica is looked at: the answer when
        refused, else (the state, its partition, topic ID and topic configs). Raises the
        typed error of a bad name or topic ID."""
        state = partition_state(item.state)
        tp = TopicPartition(state.topic, state.partition)
        validate_topic_partition(tp)
        if self.broker_id not in state.replicas:
            return pb.UNKNOWN_TOPIC_OR_PARTITION, f"broker {self.broker_id} is not a replica of {tp}"
        topic_id = check_topic_id(item.state.topic_id)
        topic_configs = dict(item.topic_configs)
        if (refused := self._configs_refusal(topic_configs)) is not None:
            return pb.INVALID_CONFIG, refused
        return state, tp, topic_id, topic_configs

    def _configs_refusal(self, topic_configs: dict[str, str]) -> str | None:
        """Why the controller's own parser refuses ``topic_configs``, or None."""
        key = frozenset(topic_configs.items())
        if key not in self._checked_configs:
            try:
                validate_topic_configs(topic_configs)
            except InvalidConfigError as e:
                self._checked_configs[key] = str(e)
            else:
                self._checked_configs[key] = None
        return self._checked_configs[key]

    def _partition_for_incarnation(self, tp: TopicPartition, topic_id: bytes,
                                         topic_configs: dict[str, str], trusted: bool,
                                         names_by_id: dict[bytes, str]) -> Partition:
        """The replica of ``tp`` for incarnation ``topic_id`` (``topic_identity``'s table):
        the local one, after adopting the ID or replacing another incarnation's log."""
        partition = self.partitions.get(tp)
        local_id = self.log_manager.topic_id(tp)
        action = self._incarnation_rule(
            tp, topic_id, local_id, trusted=trusted, names_by_id=names_by_id,
            has_log=partition is not None or self.log_manager.get(tp) is not None)
        if action is IdentityAction.ADOPT:
            log.info("%s: the log made before topic ids adopts topic id %s", tp,
                     describe_topic_id(topic_id))
            self.log_manager.assign_topic_id(tp, topic_id)
            if partition is not None:
                partition.topic_id = topic_id
        elif action is IdentityAction.REPLACE:
            log.warning("%s: the local log is incarnation %s, the controller names %s: moving it "
                        "aside for deletion", tp, describe_topic_id(local_id),
                        describe_topic_id(topic_id))
            self._remove_replica(tp)
            partition = None
        names_by_id[topic_id] = tp.topic
        return partition or self._create_partition(tp, topic_configs, topic_id)

    def _create_partition(self, tp: TopicPartition, topic_configs: dict[str, str],
                          topic_id: bytes) -> Partition:
        log_ = self.log_manager.get(tp)
        if log_ is None:
            log_ = self.log_manager.get_or_create(tp, self._log_config(topic_configs),
                                                  self._wall_ms(), topic_id=topic_id)
        replica = self._replica_class(
            tp.topic, tp.partition, local_broker_id=self.broker_id, log=log_,
            high_watermark=self._loaded_high_watermarks.pop(tp, 0),
            min_insync_replicas=self.config.min_insync_replicas_for(topic_configs),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            follower_options=self.config.follower_options)
        partition = self.partitions[tp] = Partition(tp, log_, replica, topic_id)
        return partition

    def _log_config(self, topic_configs: dict[str, str]) -> LogConfig:
        """The LogConfig of a topic with ``topic_configs`` (one object for the topic's
        logs, as ``LogManager.update_topic_config`` gives them)."""
        key = frozenset(topic_configs.items())
        config = self._log_configs.get(key)
        if config is None:
            config = self._log_configs[key] = LogConfig.from_configs(
                self.config.log_config_overrides(topic_configs))
        return config

    def _forget_parsed_configs(self) -> None:
        self._checked_configs.clear()
        self._log_configs.clear()

    def _topic_names_by_id(self) -> dict[bytes, str]:
        """Every topic ID this broker knows, with its topic: logs, replicas, the last snapshot."""
        names = {topic_id: tp.topic for tp, topic_id in self.log_manager.topic_ids().items()
                 if topic_id is not None}
        names.update(self.metadata_cache.topic_names_by_id())
        names.update((p.topic_id, tp.topic) for tp, p in self.partitions.items() if p.topic_id)
        return names

    def _apply_topic_configs(self, partition: Partition, topic_configs: dict[str, str]) -> None:
        """One implementation, two hosts: the broker runs this class against its
``LogManager``, ``meta.properties`` and clocks; the simulation (``tests/sim``)
runs the same class against its in-memory disk and clock. Nothing here awaits.

Topic configs ride on every LeaderAndIsr: logs loaded at start-up get theirs here.
An empty map leaves the log as it is, unless it had configs before (an AlterConfigs
removed them all: the defaults apply again) or dynamic broker defaults are in force."""
        if (not topic_configs and not partition.has_topic_configs
                and not self.config.dynamic_topic_defaults):
            return
        partition.has_topic_configs = bool(topic_configs)
        config = self._log_config(topic_configs)
        if config != partition.log.config:
            self.log_manager.update_topic_config(partition.tp.topic, config)
        ready = partition.replica.set_min_insync_replicas(
            self.config.min_insync_replicas_for(topic_configs), self._mono_ms())
        self._carrier.apply(partition, ready)

    # ================================================================ StopReplica

    def stop_replica(self, request: pb.StopReplicaRequest) -> pb.StopReplicaResponse:
        """Both steps of a StopReplica in turn: ``stop_replicas``, the deletions made
        durable, ``answer_stop_replica`` (the broker makes them durable off its loop)."""
        stopped = self.stop_replicas(request)
        failure: Exception | None = None
        if stopped.moved:
            try:
                self.log_manager.settle_deletions(stopped.moved)
            except Exception as e:  # answered below
                failure = e
        return self.answer_stop_replica(stopped, failure)

    def stop_replicas(self, request: pb.StopReplicaRequest) -> StoppedReplicas:
        """A StopReplica's partitions stopped, and the deleted ones' logs moved aside
        (a topic's together: one fsync and checkpoint write at the end, for them all)."""
        refusal = self._refusal("StopReplica", request.controller_epoch, request.broker_epoch,
                               request.control_token)
        if refusal != pb.NONE:
            return StoppedReplicas(pb.StopReplicaResponse(error_code=wire_code(refusal)), [])
        self.controller_epoch = request.controller_epoch
        trusted = self.cluster_identity.trusts(request.cluster_id)
        response = pb.StopReplicaResponse(error_code=pb.NONE)
        with self.log_manager.moves_aside() as moved:
            for state in request.partitions:
                tp = TopicPartition(state.topic, state.partition)
                code, message = self._stop_one_replica(tp, state, request.delete_partitions,
                                                       trusted)
                response.partitions.add(topic=tp.topic, partition=tp.partition,
                                        error_code=wire_code(code), error_message=message)
        return StoppedReplicas(response, moved)

    @staticmethod
    def answer_stop_replica(stopped: StoppedReplicas,
                            failure: Exception | None) -> pb.StopReplicaResponse:
        """The StopReplica's answer once its moves were made durable, or ``failure``
        said they could not be: then no deletion is sure, and every partition it
        stopped is answered with that error."""
        response = stopped.response
        if failure is not None:
            code, message = error_code_for(failure, context="StopReplica")
            for answered in response.partitions:
                if answered.error_code == pb.NONE:
                    answered.error_code, answered.error_message = wire_code(code), message
        return response

    def _stop_one_replica(self, tp: TopicPartition, state: pb.PartitionState,
                          delete: bool, trusted: bool) -> tuple[int, str]:
        """One partition of a StopReplica: its answer."""
        try:
            if state.topic_id:
                check_topic_id(state.topic_id)
            if tp in self.partitions or self.log_manager.get(tp) is not None:
                refused = stop_replica_error(self.log_manager.topic_id(tp), state.topic_id,
                                             trusted=trusted or not delete)
                if refused is not None:
                    raise error_for_code(*refused)
            return self._remove_replica(tp, leader_epoch=state.leader_epoch, delete=delete)
        except Exception as e:
            return error_code_for(e, context="StopReplica")

    def _remove_replica(self, tp: TopicPartition, *, leader_epoch: int = -1,
                              delete: bool = True) -> tuple[int, str]:
        """Stop playing any part in ``tp`` (the core's ``on_stop_replica``: waits answered,
        fetching stopped); with ``delete`` forget it and move its log aside for deletion
        (``LogManager.delete``). Returns the core's answer (FENCED_LEADER_EPOCH for a stop
        older than the replica's epoch: then nothing changes)."""
        partition = self.partitions.get(tp)
        if partition is not None:
            ready = partition.replica.on_stop_replica(leader_epoch, self._mono_ms())
            self._carrier.apply(partition, ready)
            if ready.error != pb.NONE:
                return ready.error, ready.error_message
            if delete and self.partitions.get(tp) is partition:
                self._forget_partition(tp)
        if delete:
            self._loaded_high_watermarks.pop(tp, None)
            if self.log_manager.get(tp) is not None:
                self.log_manager.delete(tp)
        return pb.NONE, ""

    # ================================================================ UpdateMetadata

    def update_metadata(self, request: pb.UpdateMetadataRequest
                              ) -> pb.UpdateMetadataResponse:
        refusal = self._refusal("UpdateMetadata", request.controller_epoch, None,
                               request.control_token)
        if refusal != pb.NONE:
            return pb.UpdateMetadataResponse(error_code=wire_code(refusal))
        try:
            self.metadata_cache.update(request)
        except Exception as e:
            return pb.UpdateMetadataResponse(error_code=error_code_for(e)[0])
        self._take_controller_epoch(request.controller_id, request.controller_epoch)
        for b in request.brokers:
            for lst in b.listeners:
                if lst.name == "INTERNAL" and not b.fenced:
                    self.leader_endpoints[b.broker_id] = (lst.host, lst.port)
        self.alive_broker_epochs = {b.broker_id: b.broker_epoch for b in request.brokers
                                    if not b.fenced and not b.in_controlled_shutdown}
        if self.cluster_identity.trusts(request.cluster_id):
            self._remove_stray_replicas(request)
        self._maybe_apply_dynamic_defaults()
        return pb.UpdateMetadataResponse(error_code=pb.NONE)

    def _maybe_apply_dynamic_defaults(self) -> None:
        """Dynamic broker configs changed: every hosted partition of a known topic gets its
        log config and min.insync.replicas again, over the new defaults."""
        dynamic = dynamic_topic_defaults(self.metadata_cache.broker_configs(), self.broker_id)
        if dynamic == self.config.dynamic_topic_defaults:
            return
        log.info("dynamic broker configs in force: %s", dynamic or "none")
        self.config.dynamic_topic_defaults = dynamic
        self._forget_parsed_configs()  # made with the old defaults
        known = set(self.metadata_cache.topics())
        for partition in list(self.partitions.values()):
            if partition.tp.topic in known:
                self._apply_topic_configs(
                    partition, self.metadata_cache.topic_configs(partition.tp.topic))

    def is_isr_eligible(self, replica_id: int, broker_epoch: int) -> bool:
        """KIP-903: ``control_rules.is_isr_eligible`` against the last snapshot."""
        return is_isr_eligible(self.alive_broker_epochs, replica_id, broker_epoch)

    def _remove_stray_replicas(self, request: pb.UpdateMetadataRequest) -> None:
        """Move aside every local replica the full snapshot leaves out (``topic_identity.is_stray``):
        logs not claimed since start-up whatever the snapshot holds (an empty one places
        nothing here), and replicas a LeaderAndIsr made if the snapshot is as new as it."""
        local_ids = self.log_manager.topic_ids()
        stray = stray_replicas(
            local_ids, {tp: p.metadata_offset for tp, p in self.partitions.items()},
            self.broker_id, request.metadata_offset,
            ((p.topic, p.partition, p.topic_id, p.replicas) for p in request.partitions))
        for tp in stray:
            local_id = local_ids[tp]
            log.warning("%s (topic id %s) is stray: the cluster (controller epoch %d, metadata "
                        "offset %d) has no such replica here; moving it aside for deletion", tp,
                        describe_topic_id(local_id), request.controller_epoch,
                        request.metadata_offset)
            try:
                self._remove_replica(tp)
            except InvariantViolation:
                raise  # a bug, not a failed delete: the boundary stops the broker
            except Exception as e:  # a failed delete leaves the log in place
                log.error("removing stray replica %s failed: %s", tp, e)
