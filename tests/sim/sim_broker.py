"""A simulated broker: the broker's own replication core behind a fake network and disk.

Every replication decision is made by ``tidewater.broker.replication.ReplicaState``,
the class the real broker runs: becoming leader or follower, fencing, the HW,
ISR proposals and their answers, truncation, which acks=all requests complete.
Which topic incarnation a log belongs to is decided by the broker's own pure
functions (``tidewater.broker.replication.topic_identity``: ``log_identity_action``,
``is_stray``, ``stop_replica_error``, ``fetch_topic_id_error``). This module only
does what the real broker's asyncio shell does around them, against the
simulation's network and disk:

* the controller link (``broker/controller_link/channel.py``): register until
  accepted, heartbeat every interval, register again when the controller no
  longer knows this broker epoch or keeps it fenced for two session timeouts;
* the controller's requests (``broker/replicas/control.py``): STALE_CONTROLLER_EPOCH for
  an older controller, STALE_BROKER_EPOCH for an older registration; then per
  partition the identity table (create, keep, adopt, replace), the topic's
  ``min.insync.replicas`` and the core's ``on_leader_and_isr``; StopReplica by
  incarnation; every UpdateMetadata sweeps stray replicas (a replica a
  LeaderAndIsr made in this process only with a snapshot at least as new);
* turning messages into the core's events and carrying out each ``Ready``
  (``_apply``): persist on the ``SimLog``, send AlterPartition, answer produce
  requests, start or stop fetching;
* the transport of a follower's requests (one in flight per partition, a
  request timeout, pacing after an empty answer; the fetch names the topic ID
  and the broker epoch) and of AlterPartition (an answer that never comes is
  reported as unsure after the request timeout);
* the byte-level fix-up of a fetched chunk (skip batches below the LEO, cut a
  straddling batch), as the real fetcher does.

The disk (``logs``: one ``SimLog`` per partition directory, with its
``partition.metadata`` topic ID and HW checkpoint line; ``stored_cluster_id``:
``meta.properties``) survives a crash; everything else is the process's.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tidewater.broker.controller_link.channel import REGISTER_AGAIN
from tidewater.broker.replicas.control import partition_state
from tidewater.broker.replication.control_rules import controller_request_refusal, is_isr_eligible
from tidewater.broker.replication.ready import (
    AppendFetched,
    AssignEpoch,
    Follow,
    Ready,
    StopFetching,
    Truncate,
    TruncateFully,
)
from tidewater.broker.replication.replica import (
    FollowerOptions,
    FollowerPhase,
    ReplicaState,
    Role,
)
from tidewater.broker.replication.topic_identity import (
    ClusterCheck,
    IdentityAction,
    cluster_id_decision,
    describe_topic_id,
    fetch_topic_id_error,
    incarnation_action,
    log_identity_action,
    stop_replica_error,
    stray_replicas,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    TidewaterError,
    error_for_code,
)
from tidewater.proto.topic_config import min_insync_replicas
from tidewater.proto.topic_id import check_topic_id

from .messages import (
    BrokerAnswer,
    BrokerCall,
    ControllerAnswer,
    ControllerCall,
    Fetch,
    FetchResponse,
    OffsetForLeaderEpoch,
    OffsetForLeaderEpochResponse,
    Produce,
    ProduceResponse,
    TopicPartition,
)
from .network import CONTROLLER, Network
from .sim_log import Batch, SimLog

LEADER = Role.LEADER
IdentityRule = Callable[..., IdentityAction]  # topic_identity.log_identity_action's shape


@dataclass(frozen=True)
class BrokerConfig:
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
    # True: broker/replicas/control.py as it is today, which takes controller requests before its
    # registration is answered (its own broker epoch -1 passes every STALE_BROKER_EPOCH
    # check). A restarted process then applies a LeaderAndIsr meant for its previous
    # incarnation, which may have lost records in the crash (seeds 157 and 172 find it).
    # False (the simulation's default): as Kafka does (KIP-380; its broker processes
    # requests only once registered), nothing is served to the controller before the
    # registration is answered: the request fails as UNAVAILABLE would, and is retried.
    controller_requests_before_registration: bool = False

    @property
    def follower_options(self) -> FollowerOptions:
        return FollowerOptions(truncate_first=self.use_offset_for_leader_epoch,
                               send_last_fetched_epoch=self.send_last_fetched_epoch,
                               fetch_backoff_ms=self.fetch_backoff_ms)


@dataclass
class Waiter:
    """An acks=all produce waiting for the HW (the core holds its wait by ``waiter_id``)."""

    client: int
    request_id: int
    required_offset: int
    base_offset: int


@dataclass
class PartitionReplica:
    """The shell's state of one partition replica: the core, its log, the incarnation it
    serves, and the transport in flight (``broker/replicas/partition.py``'s ``Partition``)."""

    tp: TopicPartition
    log: SimLog
    replica: ReplicaState
    topic_id: bytes
    metadata_offset: int = -1  # the newest LeaderAndIsr that named it (stray sweep guard)
    waiters: dict[int, Waiter] = field(default_factory=dict)
    # follower transport: the one request in flight
    inflight_request_id: int = -1
    inflight_sent_ms: int = 0
    inflight_leader_epoch: int = -1
    inflight_fetch_offset: int = -1
    next_fetch_ms: int = 0
    fetched: tuple[Batch, ...] = ()  # the batches an AppendFetched appends
    # AlterPartition transport: (alter_id, call id, sent at)
    alter_inflight: tuple[int, int, int] | None = None

    # views the checker reads
    @property
    def role(self) -> str:
        return self.replica.role

    @property
    def leader_epoch(self) -> int:
        return self.replica.leader_epoch

    @property
    def leader_state(self):
        return self.replica.leader

    @property
    def high_watermark(self) -> int:
        return self.replica.high_watermark


class SimBroker:
    def __init__(self, broker_id: int, network: Network, rng: random.Random,
                 config: BrokerConfig, hooks, *,
                 replica_class: type[ReplicaState] = ReplicaState,
                 identity_rule: IdentityRule = log_identity_action):
        self.broker_id = broker_id
        self.network = network
        self.rng = rng
        self.config = config
        # the simulation: trace, observe_leader_hw, produce_acknowledged, log_changed,
        # became_leader
        self.hooks = hooks
        self.replica_class = replica_class
        self.identity_rule = identity_rule
        # The disk: survives crashes.
        self.logs: dict[TopicPartition, SimLog] = {}
        self.stored_cluster_id: str | None = None
        self.alive = True
        self.incarnation = 0
        self.flush_interval_ms = rng.randint(50, 600)
        self.counters: Counter[str] = Counter()  # which decision paths ran (coverage)
        self._start_process(0)

    def _start_process(self, now_ms: int) -> None:
        """A new process over the disk: no partition until a LeaderAndIsr names it."""
        self.partitions: dict[TopicPartition, PartitionReplica] = {}
        self.loaded_high_watermarks = {tp: log.hw_checkpoint for tp, log in self.logs.items()}
        self.controller_epoch = -1
        self.broker_epoch = -1
        self.control_token = b""  # the registration's (RegisterBrokerResponse)
        self.registering = True
        self.is_fenced = True
        self._calls: dict[int, tuple] = {}  # controller calls in flight: id -> what for
        self._register_call = -1
        self._fenced_since_ms: int | None = None
        # the last UpdateMetadata (broker/replicas/metadata_cache.py, control.py)
        self.metadata_topic_names_by_id: dict[bytes, str] = {}
        self.alive_broker_epochs: dict[int, int] | None = None
        self._next_request_id = 1
        self._next_waiter_id = 1
        self._next_heartbeat_ms = now_ms
        self._next_register_ms = now_ms
        self._next_hw_checkpoint_ms = now_ms
        self._next_flush_ms = now_ms

    # ------------------------------------------------------------------ views

    def replica_log(self, tp: TopicPartition, topic_id: bytes) -> SimLog | None:
        """This broker's copy of incarnation ``topic_id`` of ``tp``: the log of its replica,
        else a log on disk made for that incarnation (not claimed since a restart)."""
        p = self.partitions.get(tp)
        if p is not None:
            return p.log if p.topic_id == topic_id else None
        log = self.logs.get(tp)
        return log if log is not None and log.topic_id == topic_id else None

    # ------------------------------------------------------------------ lifecycle

    def crash(self, now_ms: int, *, lose_unflushed: bool = True,
              keep_offset: int | None = None) -> None:
        """Stop the process; each log may lose part of its unflushed tail.

        ``keep_offset`` (scripted scenarios): keep exactly the batches below it.
        """
        self.alive = False
        for tp, log in self.logs.items():
            before = log.log_end_offset
            if keep_offset is not None:
                log.flushed_offset = min(keep_offset, before)
                log.truncate_to(keep_offset)
            if not lose_unflushed or keep_offset is not None:
                log.flush()
            lost_from = log.crash(self.rng)
            if lost_from < before:
                self.hooks.trace(now_ms, f"broker {self.broker_id}: crash lost {tp[0]}-{tp[1]} "
                                         f"[{lost_from}, {before})")

    def restart(self, now_ms: int) -> None:
        self.alive = True
        self.incarnation += 1
        self._start_process(now_ms)

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        config = self.config
        if self.registering:
            if now_ms >= self._next_register_ms:
                self._next_register_ms = now_ms + config.request_timeout_ms
                self._register_call = self._call(pb.RegisterBrokerRequest(
                    broker_id=self.broker_id, incarnation_id=f"{self.broker_id}.{self.incarnation}",
                    listeners=[pb.Listener(name="INTERNAL", host=f"broker-{self.broker_id}",
                                           port=9092)]), ("register",), now_ms)
        elif now_ms >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = now_ms + config.heartbeat_interval_ms
            self._call(pb.BrokerHeartbeatRequest(broker_id=self.broker_id,
                                                 broker_epoch=self.broker_epoch,
                                                 control_token=self.control_token),
                       ("heartbeat", self.broker_epoch), now_ms, stream=self.incarnation)
        if now_ms >= self._next_flush_ms:
            self._next_flush_ms = now_ms + self.flush_interval_ms
            for log in self.logs.values():
                log.flush()
        if now_ms >= self._next_hw_checkpoint_ms:
            self._next_hw_checkpoint_ms = now_ms + config.hw_checkpoint_interval_ms
            for p in self.partitions.values():
                p.log.hw_checkpoint = p.replica.high_watermark
        for p in list(self.partitions.values()):
            if p.replica.is_leader:
                self._leader_tick(p, now_ms)
            elif p.replica.follower is not None:
                self._follower_tick(p, now_ms)

    def _leader_tick(self, p: PartitionReplica, now_ms: int) -> None:
        if (p.alter_inflight is not None
                and now_ms - p.alter_inflight[2] >= self.config.alter_partition_timeout_ms):
            # No answer in time: as the real shell's RPC deadline does, "unsure".
            alter_id = p.alter_inflight[0]
            p.alter_inflight = None
            self._apply(p, p.replica.on_alter_partition_unsure(alter_id, now_ms), now_ms)
        self._apply(p, p.replica.tick(now_ms), now_ms)

    def _follower_tick(self, p: PartitionReplica, now_ms: int) -> None:
        if p.inflight_request_id >= 0:
            if now_ms - p.inflight_sent_ms < self.config.request_timeout_ms:
                return
            p.inflight_request_id = -1  # timed out: the answer, if any, will be ignored
        if now_ms < p.next_fetch_ms:
            return
        wants = p.replica.follower_wants(now_ms)
        if wants is None:
            return
        cycle = p.replica.follower
        request_id = self._request_id()
        p.inflight_request_id, p.inflight_sent_ms = request_id, now_ms
        p.inflight_leader_epoch = cycle.leader_epoch
        if wants == FollowerPhase.TRUNCATING:
            message = OffsetForLeaderEpoch(request_id, self.broker_id, p.tp, cycle.leader_epoch,
                                           p.log.leader_epoch_cache.latest_epoch)
        else:
            fetch_offset, last_fetched_epoch, _ = p.replica.fetch_position()
            p.inflight_fetch_offset = fetch_offset
            message = Fetch(request_id, self.broker_id, p.tp, cycle.leader_epoch, fetch_offset,
                            last_fetched_epoch, p.topic_id, self.broker_epoch)
        self._send(cycle.leader_id, message, now_ms)

    # ------------------------------------------------------------------ messages

    def handle(self, src: int, message, now_ms: int) -> None:
        if isinstance(message, BrokerCall):
            # None: not registered yet, UNAVAILABLE (the sender retries)
            response = self._on_controller_request(message.request, now_ms)
            self._send(src, BrokerAnswer(message.call_id, message.controller_run, response),
                       now_ms)
        elif isinstance(message, ControllerAnswer):
            self._on_controller_answer(message, now_ms)
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

    # -- the controller link (broker/controller_link/channel.py, broker/controller_link/alter_partition.py)

    def _call(self, request, what: tuple, now_ms: int, *, stream: int = -1) -> int:
        call_id = self._request_id()
        self._calls[call_id] = what
        self._send(CONTROLLER, ControllerCall(call_id, request, stream), now_ms)
        return call_id

    def _on_controller_answer(self, message: ControllerAnswer, now_ms: int) -> None:
        what = self._calls.pop(message.call_id, None)
        if what is None:
            return
        response = message.response
        if what[0] == "register":
            if message.call_id != self._register_call or not self.registering:
                return  # an answer to an attempt given up on (gRPC would have cancelled it)
            if response.error_code != pb.NONE:
                return  # tried again after the request timeout
            self.registering = False
            self.broker_epoch = response.broker_epoch
            self.control_token = response.control_token
            self._fenced_since_ms = None
            self._next_heartbeat_ms = now_ms
            self.hooks.trace(now_ms, f"broker {self.broker_id}: registered, broker epoch "
                                     f"{self.broker_epoch}")
        elif what[0] == "heartbeat":
            if what[1] != self.broker_epoch or self.registering:
                return
            self.is_fenced = response.is_fenced
            if self._needs_registration(response, now_ms):
                self.hooks.trace(now_ms, f"broker {self.broker_id}: heartbeat answered "
                                         f"{pb.ErrorCode.Name(response.error_code)} fenced="
                                         f"{response.is_fenced}: registering again")
                # ``ControllerChannel.register``: unregistered until the answer.
                self.registering = True
                self.broker_epoch = -1
                self.control_token = b""
                self._next_register_ms = now_ms
        elif what[0] == "alter":
            tp, call_partition = what[1], what[2]
            p = self.partitions.get(tp)
            if (p is not call_partition or p.alter_inflight is None
                    or p.alter_inflight[1] != message.call_id):
                return  # an answer to an attempt already given up on
            alter_id = p.alter_inflight[0]
            p.alter_inflight = None
            if response.error_code != pb.NONE or not response.items:
                ready = p.replica.on_alter_partition_unsure(alter_id, now_ms)
            else:
                answer = response.items[0]
                state = partition_state(answer.state) if answer.HasField("state") else None
                ready = p.replica.on_alter_partition_answer(alter_id, answer.error_code, state,
                                                            now_ms)
            self._apply(p, ready, now_ms)

    def _needs_registration(self, response: pb.BrokerHeartbeatResponse, now_ms: int) -> bool:
        """``ControllerChannel._needs_registration``."""
        if response.error_code in REGISTER_AGAIN:
            return True
        if response.error_code != pb.NONE:
            return False
        if not response.is_fenced:
            self._fenced_since_ms = None
            return False
        if self._fenced_since_ms is None:
            self._fenced_since_ms = now_ms
        return now_ms - self._fenced_since_ms > 2 * self.config.session_timeout_ms

    # -- the controller's requests (broker/replicas/control.py)

    def _on_controller_request(self, request, now_ms: int):
        if isinstance(request, pb.LeaderAndIsrRequest):
            return self._on_leader_and_isr(request, now_ms)
        if isinstance(request, pb.UpdateMetadataRequest):
            return self._on_update_metadata(request, now_ms)
        if isinstance(request, pb.StopReplicaRequest):
            return self._on_stop_replica(request, now_ms)
        raise TypeError(f"broker cannot handle {request!r}")

    def _trusts(self, cluster_id: str) -> bool:
        """``ClusterIdentity.trusts``: meta.properties takes the first cluster ID heard."""
        decision = cluster_id_decision(self.stored_cluster_id, cluster_id)
        if decision is ClusterCheck.ADOPT:
            self.stored_cluster_id = cluster_id
            return True
        return decision is ClusterCheck.MATCH

    def _refusal(self, kind: str, controller_epoch: int, broker_epoch: int | None,
                 token: bytes) -> int:
        """``ControlRequests._refusal``: ``control_rules.controller_request_refusal``
        (BROKER_NOT_AVAILABLE: answered as UNAVAILABLE, no response)."""
        rule = (taken_before_registration if self.config.controller_requests_before_registration
                else controller_request_refusal)
        refusal = rule(
            registered_epoch=self.broker_epoch, controller_epoch_seen=self.controller_epoch,
            request_controller_epoch=controller_epoch, request_broker_epoch=broker_epoch,
            token_matches=token == self.control_token)
        if refusal is None:
            return pb.NONE
        self.counters[f"refused {kind} {pb.ErrorCode.Name(refusal)}"] += 1
        return refusal

    def _on_leader_and_isr(self, request: pb.LeaderAndIsrRequest, now_ms: int
                           ) -> pb.LeaderAndIsrResponse:
        refusal = self._refusal("LeaderAndIsr", request.controller_epoch, request.broker_epoch,
                               request.control_token)
        if refusal == pb.BROKER_NOT_AVAILABLE:
            return None
        if refusal != pb.NONE:
            return pb.LeaderAndIsrResponse(error_code=refusal)
        self.controller_epoch = request.controller_epoch
        response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
        trusted = self._trusts(request.cluster_id)
        names_by_id = self._topic_names_by_id()
        for item in request.partitions:
            try:
                code, message = self._apply_partition_state(item, trusted,
                                                            request.metadata_offset, names_by_id,
                                                            now_ms)
            except TidewaterError as e:
                code, message = e.error_code, str(e)
            response.partitions.add(topic=item.state.topic, partition=item.state.partition,
                                    error_code=code, error_message=message)
        return response

    def _apply_partition_state(self, item: pb.LeaderAndIsrPartition, trusted: bool,
                               metadata_offset: int, names_by_id: dict[bytes, str],
                               now_ms: int) -> tuple[int, str]:
        state = partition_state(item.state)
        tp = TopicPartition(state.topic, state.partition)
        if self.broker_id not in state.replicas:
            return pb.UNKNOWN_TOPIC_OR_PARTITION, f"broker {self.broker_id} is not a replica of {tp}"
        topic_id = check_topic_id(item.state.topic_id)
        min_isr = min_insync_replicas(item.topic_configs, self.config.min_insync_replicas)
        p = self._partition_for_incarnation(tp, topic_id, min_isr, trusted, names_by_id, now_ms)
        p.metadata_offset = max(p.metadata_offset, metadata_offset)
        self._apply(p, p.replica.set_min_insync_replicas(min_isr, now_ms), now_ms)
        ready = p.replica.on_leader_and_isr(state, now_ms)
        self._apply(p, ready, now_ms)
        return ready.error, ready.error_message

    def _partition_for_incarnation(self, tp: TopicPartition, topic_id: bytes, min_isr: int,
                                   trusted: bool, names_by_id: dict[bytes, str],
                                   now_ms: int) -> PartitionReplica:
        """``ControlRequests._partition_for_incarnation``: ``topic_identity``'s table."""
        p = self.partitions.get(tp)
        log = self.logs.get(tp)
        local_id = log.topic_id if log is not None else None
        action = incarnation_action(tp, topic_id, local_id, has_log=p is not None or log is not None,
                                    trusted=trusted, names_by_id=names_by_id,
                                    rule=self.identity_rule)
        self.counters[f"log identity {action.value}"] += 1
        if action is IdentityAction.ADOPT:
            log.topic_id = topic_id
            if p is not None:
                p.topic_id = topic_id
        elif action is IdentityAction.REPLACE:
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {tp} is incarnation "
                                     f"{describe_topic_id(local_id)[:6]}, the controller names "
                                     f"{describe_topic_id(topic_id)[:6]}: moving it aside")
            self._remove_replica(tp, now_ms)
            p = None
        names_by_id[topic_id] = tp.topic
        return p or self._create_partition(tp, topic_id, min_isr, now_ms)

    def _create_partition(self, tp: TopicPartition, topic_id: bytes, min_isr: int,
                          now_ms: int) -> PartitionReplica:
        log = self.logs.get(tp)
        if log is None:
            log = self.logs[tp] = SimLog(topic_id)  # with its partition.metadata
        replica = self.replica_class(
            tp.topic, tp.partition, local_broker_id=self.broker_id, log=log,
            high_watermark=self.loaded_high_watermarks.pop(tp, 0), min_insync_replicas=min_isr,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            follower_options=self.config.follower_options)
        p = self.partitions[tp] = PartitionReplica(tp, log, replica, topic_id)
        self.hooks.log_changed(self, tp, log)  # bound to an incarnation: checked whole
        return p

    def _topic_names_by_id(self) -> dict[bytes, str]:
        names = {log.topic_id: tp.topic for tp, log in self.logs.items() if log.topic_id}
        names.update(self.metadata_topic_names_by_id)
        names.update((p.topic_id, tp.topic) for tp, p in self.partitions.items() if p.topic_id)
        return names

    def _on_stop_replica(self, request: pb.StopReplicaRequest, now_ms: int
                         ) -> pb.StopReplicaResponse:
        refusal = self._refusal("StopReplica", request.controller_epoch, request.broker_epoch,
                               request.control_token)
        if refusal == pb.BROKER_NOT_AVAILABLE:
            return None
        if refusal != pb.NONE:
            return pb.StopReplicaResponse(error_code=refusal)
        self.controller_epoch = request.controller_epoch
        trusted = self._trusts(request.cluster_id)
        response = pb.StopReplicaResponse(error_code=pb.NONE)
        for state in request.partitions:
            tp = TopicPartition(state.topic, state.partition)
            code, message = pb.NONE, ""
            try:
                if state.topic_id:
                    check_topic_id(state.topic_id)
                if tp in self.partitions or tp in self.logs:
                    log = self.logs.get(tp)
                    refused = stop_replica_error(log.topic_id if log is not None else None,
                                                 state.topic_id,
                                                 trusted=trusted or not request.delete_partitions)
                    if refused is not None:
                        raise error_for_code(*refused)
                code, message = self._remove_replica(tp, now_ms, leader_epoch=state.leader_epoch,
                                                     delete=request.delete_partitions)
            except TidewaterError as e:
                code, message = e.error_code, str(e)
            self.counters[f"stop replica {pb.ErrorCode.Name(code)}"] += 1
            response.partitions.add(topic=tp.topic, partition=tp.partition, error_code=code,
                                    error_message=message)
        return response

    def _remove_replica(self, tp: TopicPartition, now_ms: int, *, leader_epoch: int = -1,
                        delete: bool = True) -> tuple[int, str]:
        """``ControlRequests._remove_replica``: the core plays no part any more; with
        ``delete`` the replica is forgotten and its log moved aside (gone from the disk)."""
        p = self.partitions.get(tp)
        if p is not None:
            ready = p.replica.on_stop_replica(leader_epoch, now_ms)
            self._apply(p, ready, now_ms)
            if ready.error != pb.NONE:
                return ready.error, ready.error_message
            if delete and self.partitions.get(tp) is p:
                del self.partitions[tp]
        if delete:
            self.loaded_high_watermarks.pop(tp, None)
            log = self.logs.pop(tp, None)
            if log is not None:
                self.hooks.trace(now_ms, f"broker {self.broker_id}: {tp[0]}-{tp[1]} of "
                                         f"incarnation {describe_topic_id(log.topic_id)[:6]} "
                                         f"moved aside for deletion (LEO {log.log_end_offset})")
        return pb.NONE, ""

    def _on_update_metadata(self, request: pb.UpdateMetadataRequest, now_ms: int
                            ) -> pb.UpdateMetadataResponse:
        refusal = self._refusal("UpdateMetadata", request.controller_epoch, None,
                               request.control_token)
        if refusal == pb.BROKER_NOT_AVAILABLE:
            return None
        if refusal != pb.NONE:
            return pb.UpdateMetadataResponse(error_code=refusal)
        self.metadata_topic_names_by_id = {p.topic_id: p.topic for p in request.partitions
                                           if p.topic_id}
        self.controller_epoch = request.controller_epoch
        self.alive_broker_epochs = {b.broker_id: b.broker_epoch for b in request.brokers
                                    if not b.fenced and not b.in_controlled_shutdown}
        if self._trusts(request.cluster_id):
            self._remove_stray_replicas(request, now_ms)
        return pb.UpdateMetadataResponse(error_code=pb.NONE)

    def _remove_stray_replicas(self, request: pb.UpdateMetadataRequest, now_ms: int) -> None:
        stray = stray_replicas(
            {tp: log.topic_id for tp, log in self.logs.items()},
            {tp: p.metadata_offset for tp, p in self.partitions.items()}, self.broker_id,
            request.metadata_offset,
            ((p.topic, p.partition, p.topic_id, p.replicas) for p in request.partitions))
        for tp in stray:
            self.counters["stray replicas removed"] += 1
            self._remove_replica(tp, now_ms)

    def _is_isr_eligible(self, replica_id: int, broker_epoch: int) -> bool:
        """``ControlRequests.is_isr_eligible`` (KIP-903)."""
        return is_isr_eligible(self.alive_broker_epochs, replica_id, broker_epoch)

    # -- leader side of replication

    def _on_fetch(self, message: Fetch, now_ms: int) -> FetchResponse:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            if message.topic_id and message.topic_id != p.topic_id:
                known = self.metadata_topic_names_by_id
                raise error_for_code(*fetch_topic_id_error(message.topic_id, p.topic_id,
                                                           known.__contains__))
            diverging, ready = p.replica.on_follower_fetch(
                message.replica_id, message.current_leader_epoch, message.fetch_offset,
                message.last_fetched_epoch, now_ms,
                isr_eligible=self._is_isr_eligible(message.replica_id,
                                                   message.replica_broker_epoch),
                broker_epoch=message.replica_broker_epoch)
        except TidewaterError as e:
            self.counters["serve fetch " + e.error_name] += 1
            return FetchResponse(message.request_id, message.tp, e.error_code)
        if diverging is not None:
            return FetchResponse(message.request_id, message.tp, pb.NONE,
                                 high_watermark=p.replica.high_watermark,
                                 diverging_epoch=diverging)
        batches = p.log.read(message.fetch_offset, self.config.fetch_max_batches)
        self._apply(p, ready, now_ms)
        return FetchResponse(message.request_id, message.tp, pb.NONE, batches,
                             high_watermark=p.replica.high_watermark)

    def _on_offset_for_leader_epoch(self, message: OffsetForLeaderEpoch
                                    ) -> OffsetForLeaderEpochResponse:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            epoch, end_offset = p.replica.answer_offset_for_leader_epoch(
                message.current_leader_epoch, message.leader_epoch)
        except TidewaterError as e:
            return OffsetForLeaderEpochResponse(message.request_id, message.tp, e.error_code)
        return OffsetForLeaderEpochResponse(message.request_id, message.tp, pb.NONE, epoch,
                                            end_offset)

    def _on_produce(self, client: int, message: Produce, now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        try:
            if p is None:
                raise error_for_code(pb.UNKNOWN_TOPIC_OR_PARTITION, f"{message.tp} not hosted")
            leader_epoch = p.replica.check_append(acks=-1)
        except TidewaterError as e:
            self.counters["produce " + e.error_name] += 1
            self._send(client, ProduceResponse(message.request_id, message.tp, e.error_code),
                       now_ms)
            return
        batch = p.log.append_as_leader(message.record_count, leader_epoch, message.payload_id,
                                       p.topic_id)
        self.hooks.log_changed(self, p.tp, p.log)
        waiter_id = self._next_waiter_id
        self._next_waiter_id += 1
        p.waiters[waiter_id] = Waiter(client, message.request_id, batch.next_offset,
                                      batch.base_offset)
        ready = p.replica.on_local_append(p.log.log_end_offset, now_ms, waiter_id=waiter_id,
                                          required_offset=batch.next_offset,
                                          timeout_ms=message.timeout_ms)
        self._apply(p, ready, now_ms)

    # -- follower side of replication

    def _take_answer(self, p: PartitionReplica | None, request_id: int) -> bool:
        """Is this the answer to the request in flight? (Else it timed out, is older, or its
        replica is gone.)"""
        if p is None or request_id != p.inflight_request_id:
            return False
        p.inflight_request_id = -1
        return True

    def _on_offset_for_leader_epoch_response(self, message: OffsetForLeaderEpochResponse,
                                             now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        if not self._take_answer(p, message.request_id):
            return
        if message.error != pb.NONE:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms
        ready = p.replica.on_offset_for_leader_epoch_answer(
            p.inflight_leader_epoch, message.error, (message.epoch, message.end_offset), now_ms)
        self._apply(p, ready, now_ms)

    def _on_fetch_response(self, message: FetchResponse, now_ms: int) -> None:
        p = self.partitions.get(message.tp)
        if not self._take_answer(p, message.request_id):
            return
        if message.error != pb.NONE or not message.batches:
            p.next_fetch_ms = now_ms + self.config.fetch_backoff_ms  # no long-poll here
        p.fetched = message.batches
        ready = p.replica.on_fetch_answer(
            p.inflight_leader_epoch, p.inflight_fetch_offset, message.error,
            high_watermark=message.high_watermark, leader_log_start_offset=0,
            diverging_epoch=message.diverging_epoch, now_ms=now_ms)
        self._apply(p, ready, now_ms)
        p.fetched = ()

    def _append_fetched(self, p: PartitionReplica) -> None:
        """The part of the fetched batches from the LEO on (the real fetcher's fix-up)."""
        log = p.log
        batches = p.fetched
        for i, batch in enumerate(batches):
            if batch.next_offset <= log.log_end_offset:
                continue
            if batch.base_offset < log.log_end_offset:
                log.truncate_to(batch.base_offset)  # our batch boundaries differ there
                if log.log_end_offset != batch.base_offset:
                    return
            log.append_as_follower(batches[i:])
            return

    # ------------------------------------------------------------------ carrying out a Ready

    def _apply(self, p: PartitionReplica, ready: Ready, now_ms: int) -> None:
        log = p.log
        for op in ready.persist:
            if isinstance(op, AssignEpoch):
                log.leader_epoch_cache.assign(op.epoch, op.start_offset)
            elif isinstance(op, Truncate):
                if op.offset < log.log_end_offset:
                    self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp[0]}-{p.tp[1]} "
                                             f"truncate {log.log_end_offset} -> {op.offset}")
                log.truncate_to(op.offset)
            elif isinstance(op, AppendFetched):
                self._append_fetched(p)
            elif isinstance(op, TruncateFully):
                raise AssertionError("the simulation has no retention: nothing to start past")
            self.hooks.log_changed(self, p.tp, log)
        if isinstance(ready.fetch, Follow | StopFetching):
            p.inflight_request_id = -1  # answers to the old assignment are not taken
            p.next_fetch_ms = now_ms
        if ready.alter_partition is not None:
            request = ready.alter_partition
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {p.tp[0]}-{p.tp[1]} propose ISR "
                                     f"{request.new_isr}")
            call_id = self._call(pb.AlterPartitionRequest(
                broker_id=self.broker_id, broker_epoch=self.broker_epoch,
                control_token=self.control_token,
                items=[pb.AlterPartitionItem(topic=p.tp.topic, partition=p.tp.partition,
                                             leader_epoch=request.leader_epoch,
                                             partition_epoch=request.partition_epoch,
                                             new_isr=list(request.new_isr),
                                             new_isr_broker_epochs=list(request.broker_epochs))]),
                ("alter", p.tp, p), now_ms)
            p.alter_inflight = (request.alter_id, call_id, now_ms)
        if ready.report_corrupt is not None:
            raise AssertionError("the simulation corrupts no batch")
        if ready.leadership_changed and p.replica.is_leader:
            self.hooks.became_leader(self, p, now_ms)
        if p.replica.is_leader and (ready.high_watermark_moved or ready.leadership_changed):
            self.hooks.observe_leader_hw(self, p, now_ms)
        for waiter_id, code in ready.completed:
            self._answer_produce(p, p.waiters.pop(waiter_id), code, now_ms)
        self.counters.update(ready.counters)
        for line in ready.notes + ready.alarms:
            self.hooks.trace(now_ms, f"broker {self.broker_id}: {line}")
        if ready.error != pb.NONE:
            self.counters["refused " + pb.ErrorCode.Name(ready.error)] += 1

    def _answer_produce(self, p: PartitionReplica, waiter: Waiter, error: int, now_ms: int) -> None:
        self.counters["produce " + pb.ErrorCode.Name(error)] += 1
        if error in (pb.NONE, pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
            self.hooks.produce_acknowledged(self, p, waiter, now_ms)
        self._send(waiter.client, ProduceResponse(waiter.request_id, p.tp, error,
                                                  waiter.base_offset), now_ms)

    # ------------------------------------------------------------------ helpers

    def _request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send(self, dst: int, message, now_ms: int) -> None:
        self.network.send(self.broker_id, dst, message, now_ms)


def taken_before_registration(*, registered_epoch: int, controller_epoch_seen: int,
                              request_controller_epoch: int, request_broker_epoch: int | None,
                              token_matches: bool) -> int | None:
    """A broken variant: the rule broker/replicas/control.py had before the simulation found it
    wrong (seeds 157, 172): requests taken before the registration is answered, and a
    broker epoch checked only when both are known (-1 a wildcard)."""
    if request_controller_epoch < controller_epoch_seen:
        return pb.STALE_CONTROLLER_EPOCH
    if request_broker_epoch is not None and 0 <= request_broker_epoch < registered_epoch:
        return pb.STALE_BROKER_EPOCH
    return None
