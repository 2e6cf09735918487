"""The controller's requests to this broker: LeaderAndIsr, StopReplica, UpdateMetadata.

Request-level checks first: a controller epoch older than the newest seen is
STALE_CONTROLLER_EPOCH; a broker epoch (0 and up) older than this broker's
registration is STALE_BROKER_EPOCH (meant for an earlier incarnation). Then
each partition state goes to its replica's core
(``ReplicaState.on_leader_and_isr`` / ``on_stop_replica``) under the
partition's lock, and the ``Ready`` is carried out; the core's ``error`` is
that partition's answer. A partition exists locally only once a LeaderAndIsr
names this broker as a replica; logs loaded at start-up wait (with their
checkpointed HW) until then, and the ones the cluster no longer places here
are deleted (``_delete_stray_logs``).

Topic configs ride on every LeaderAndIsr: a log's config and the core's
``min.insync.replicas`` follow them (a change re-checks the HW and the
waiting acks=all requests at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.metadata_cache import MetadataCache
from tidewater.broker.partition import Partition
from tidewater.broker.ready_carrier import ReadyCarrier
from tidewater.broker.replication.replica import PartitionState, ReplicaState
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition, validate_topic_partition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.topic_config import validate_topic_configs

log = logging.getLogger("tidewater.broker.control")


def partition_state(state: pb.PartitionState) -> PartitionState:
    return PartitionState(state.topic, state.partition, state.leader, state.leader_epoch,
                          state.partition_epoch, tuple(state.replicas), tuple(state.isr))


class ControlRequests:
    def __init__(self, *, config: BrokerConfig, log_manager, metadata_cache: MetadataCache,
                 partitions: dict[TopicPartition, Partition], carrier: ReadyCarrier,
                 broker_epoch: Callable[[], int], loaded_high_watermarks: dict[TopicPartition, int],
                 forget_partition: Callable[[TopicPartition], None]):
        self.config = config
        self.broker_id = config.broker_id
        self.log_manager = log_manager
        self.metadata_cache = metadata_cache
        self.partitions = partitions
        self._carrier = carrier
        self._broker_epoch = broker_epoch
        self._loaded_high_watermarks = loaded_high_watermarks
        self._forget_partition = forget_partition
        self.controller_epoch = -1
        # Leader endpoints (INTERNAL) learned from LeaderAndIsr and UpdateMetadata.
        self.leader_endpoints: dict[int, tuple[str, int]] = {}
        # Live brokers' registered epochs from the last UpdateMetadata (None: none yet).
        self.alive_broker_epochs: dict[int, int] | None = None

    # ================================================================ LeaderAndIsr

    async def leader_and_isr(self, request: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrResponse:
        if request.controller_epoch < self.controller_epoch:
            return pb.LeaderAndIsrResponse(error_code=pb.STALE_CONTROLLER_EPOCH)
        if 0 <= request.broker_epoch < self._broker_epoch():
            # Meant for an earlier incarnation of this broker.
            return pb.LeaderAndIsrResponse(error_code=pb.STALE_BROKER_EPOCH)
        self.controller_epoch = request.controller_epoch
        for e in request.leaders:
            self.leader_endpoints[e.broker_id] = (e.host, e.port)
        response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
        for item in request.partitions:
            try:
                code, message = await self._apply_partition_state(item)
            except Exception as e:  # noqa: BLE001 - the one boundary: a typed error per partition
                code, message = error_code_for(e, context="LeaderAndIsr")
            response.partitions.add(topic=item.state.topic, partition=item.state.partition,
                                    error_code=code, error_message=message)
        return response

    async def _apply_partition_state(self, item: pb.LeaderAndIsrPartition) -> tuple[int, str]:
        state = partition_state(item.state)
        tp = TopicPartition(state.topic, state.partition)
        validate_topic_partition(tp)
        if self.broker_id not in state.replicas:
            return pb.UNKNOWN_TOPIC_OR_PARTITION, f"broker {self.broker_id} is not a replica of {tp}"
        topic_configs = dict(item.topic_configs)
        try:
            validate_topic_configs(topic_configs)  # the controller's own parser
        except InvalidConfigError as e:
            # The controller checked them with the same code: a controller of another
            # version, or a metadata log edited by hand. The partition is not hosted.
            log.error("cannot host %s: its topic configs are refused: %s", tp, e)
            return pb.INVALID_CONFIG, str(e)
        partition = self.partitions.get(tp) or self._create_partition(tp, topic_configs)
        async with partition.lock:
            self._apply_topic_configs(partition, topic_configs)
            ready = partition.replica.on_leader_and_isr(state, mono_ms())
            self._carrier.apply(partition, ready)
        return ready.error, ready.error_message

    def _create_partition(self, tp: TopicPartition, topic_configs: dict[str, str]) -> Partition:
        log_ = self.log_manager.get(tp)
        if log_ is None:
            config = LogConfig.from_configs(self.config.log_config_overrides(topic_configs))
            log_ = self.log_manager.get_or_create(tp, config, wall_ms())
        replica = ReplicaState(
            tp.topic, tp.partition, local_broker_id=self.broker_id, log=log_,
            high_watermark=self._loaded_high_watermarks.pop(tp, 0),
            min_insync_replicas=self.config.min_insync_replicas_for(topic_configs),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            follower_options=self.config.follower_options)
        partition = self.partitions[tp] = Partition(tp, log_, replica)
        return partition

    def _apply_topic_configs(self, partition: Partition, topic_configs: dict[str, str]) -> None:
        """Topic configs ride on every LeaderAndIsr: logs loaded at start-up get theirs here."""
        if not topic_configs:
            return
        config = LogConfig.from_configs(self.config.log_config_overrides(topic_configs))
        if config != partition.log.config:
            self.log_manager.update_topic_config(partition.tp.topic, config)
        ready = partition.replica.set_min_insync_replicas(
            self.config.min_insync_replicas_for(topic_configs), mono_ms())
        self._carrier.apply(partition, ready)

    # ================================================================ StopReplica

    async def stop_replica(self, request: pb.StopReplicaRequest) -> pb.StopReplicaResponse:
        if request.controller_epoch < self.controller_epoch:
            return pb.StopReplicaResponse(error_code=pb.STALE_CONTROLLER_EPOCH)
        self.controller_epoch = request.controller_epoch
        response = pb.StopReplicaResponse(error_code=pb.NONE)
        for state in request.partitions:
            tp = TopicPartition(state.topic, state.partition)
            code, message = pb.NONE, ""
            try:
                partition = self.partitions.get(tp)
                if partition is not None:
                    async with partition.lock:
                        ready = partition.replica.on_stop_replica(state.leader_epoch, mono_ms())
                        self._carrier.apply(partition, ready)
                        code, message = ready.error, ready.error_message
                        if code == pb.NONE and request.delete_partitions:
                            self._forget_partition(tp)
                if code == pb.NONE and request.delete_partitions:
                    self._loaded_high_watermarks.pop(tp, None)
                    if self.log_manager.get(tp) is not None:
                        self.log_manager.delete(tp)
            except Exception as e:  # noqa: BLE001
                code, message = error_code_for(e, context="StopReplica")
            response.partitions.add(topic=tp.topic, partition=tp.partition, error_code=code,
                                    error_message=message)
        return response

    # ================================================================ UpdateMetadata

    def update_metadata(self, request: pb.UpdateMetadataRequest) -> pb.UpdateMetadataResponse:
        if request.controller_epoch < self.controller_epoch:
            return pb.UpdateMetadataResponse(error_code=pb.STALE_CONTROLLER_EPOCH)
        try:
            self.metadata_cache.update(request)
        except Exception as e:  # noqa: BLE001
            return pb.UpdateMetadataResponse(error_code=error_code_for(e)[0])
        self.controller_epoch = request.controller_epoch
        for b in request.brokers:
            for lst in b.listeners:
                if lst.name == "INTERNAL" and not b.fenced:
                    self.leader_endpoints[b.broker_id] = (lst.host, lst.port)
        self.alive_broker_epochs = {b.broker_id: b.broker_epoch for b in request.brokers
                                    if not b.fenced and not b.in_controlled_shutdown}
        self._delete_stray_logs(request)
        return pb.UpdateMetadataResponse(error_code=pb.NONE)

    def is_isr_eligible(self, replica_id: int, broker_epoch: int) -> bool:
        """KIP-903 (Kafka's ``isReplicaIsrEligible``): may a fetch from ``replica_id`` carrying
        ``broker_epoch`` add it to the ISR? Only if the broker is live, unfenced and not
        shutting down in the controller's last snapshot, and the fetch carries that broker's
        registered epoch (or none, -1). A fetch from an earlier incarnation of a restarted
        broker must not vouch for the new one. Before any snapshot arrived nothing is known
        here; the controller still refuses a joiner it does not consider live."""
        if self.alive_broker_epochs is None:
            return True
        alive_epoch = self.alive_broker_epochs.get(replica_id)
        return alive_epoch is not None and broker_epoch in (-1, alive_epoch)

    def _delete_stray_logs(self, request: pb.UpdateMetadataRequest) -> None:
        """Delete loaded logs the cluster no longer places here (deleted while we were away).

        Only logs never claimed by a LeaderAndIsr since start-up are candidates,
        and only when the full snapshot says the partition does not exist or
        does not list this broker as a replica.
        """
        if not self._loaded_high_watermarks or not request.partitions:
            return  # an empty snapshot is more likely a wiped controller than an empty cluster
        placed = {(p.topic, p.partition): self.broker_id in p.replicas
                  for p in request.partitions}
        for tp in list(self._loaded_high_watermarks):
            if tp in self.partitions or placed.get((tp.topic, tp.partition), False):
                continue
            log.warning("deleting stray log %s: not a replica here in controller epoch %d",
                        tp, request.controller_epoch)
            self._loaded_high_watermarks.pop(tp, None)
            try:
                self.log_manager.delete(tp)
            except Exception as e:  # noqa: BLE001 - a failed delete leaves the log in place
                log.error("deleting stray log %s failed: %s", tp, e)
