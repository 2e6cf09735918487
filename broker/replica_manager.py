"""The broker's replicas: applies controller decisions, serves produce/fetch and the offset RPCs.

Theory of operation:
- Partitions exist locally only after a LeaderAndIsr names this broker as a
  replica. Logs loaded at start-up wait (with their checkpointed HW) until then.
- ``leader_and_isr``: stale controller epoch -> STALE_CONTROLLER_EPOCH. Per
  partition, under its lock: a newer leader epoch (or the same with a newer
  partition epoch) is applied, the same state again is a no-op, an older one
  is FENCED_LEADER_EPOCH. Leader: epoch cache assign + fsync, then the leader
  state exists and the partition is served. Follower: the leader state goes,
  pending acks=all waiters fail with NOT_LEADER_OR_FOLLOWER, the fetcher for
  the new leader truncates (OffsetForLeaderEpoch) and then fetches.
- ``produce``: per partition validation, append under the partition lock,
  acks=all waits in the ``ProducePurgatory`` until the HW passes the last
  offset. Every HW move wakes the purgatory and the consumers' long-polls
  (``_on_high_watermark_moved``), every append the followers' long-polls, a
  leadership change both: nothing polls.
- ``fetch``: consumers read from the leader below the HW; followers are
  fenced by epoch, checked for divergence, and their fetch offset moves the
  leader's view of their LEO (HW, ISR expansion).
- Topic IDs (``topic_identity``): a LeaderAndIsr's topic ID decides whether the
  local log is kept, adopted, or moved aside for a fresh one; UpdateMetadata
  sweeps replicas of incarnations the cluster no longer has; a fetch naming
  another incarnation is refused. Only a controller of this data dir's cluster
  (``cluster_identity``) may make the broker delete a log.
- Background: ISR changes (``isr_changes``: shrink checks, AlterPartition;
  the new ISR is used only after the controller commits it), HW
  checkpoints, segment.ms rolls and flush.ms flushes, retention. All but the
  ISR work run in worker threads (``_in_thread``) on snapshots taken on the
  loop (HWs, the logs), so no fsync or file rename stalls a request; ``stop``
  waits for them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
from collections.abc import Awaitable, Callable

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.cluster_identity import ClusterIdentity
from tidewater.broker.config import BrokerConfig
from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.fetcher import FetcherManager
from tidewater.broker.isr_changes import IsrChanges
from tidewater.broker.metadata_cache import MetadataCache
from tidewater.broker.metrics import BrokerMetrics, ReplicaSnapshot
from tidewater.broker.partition import Partition, state_is_newer
from tidewater.broker.purgatory import FetchWaiters, ProducePurgatory
from tidewater.broker.replication import check_diverging
from tidewater.broker.storage.corruption import (
    CONSUMER_READ,
    FOLLOWER_READ,
    CorruptionReporter,
    read_reporting,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition, validate_topic_partition
from tidewater.broker.topic_identity import (
    IdentityAction,
    describe_topic_id,
    fetch_topic_id_error,
    is_stray,
    log_identity_action,
    stop_replica_error,
    told_id_conflict,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import BATCH_LENGTH_MIN, HEADER_SIZE, LOG_OVERHEAD
from tidewater.proto.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InconsistentClusterIdError,
    InconsistentTopicIdError,
    InvalidConfigError,
    InvalidRequiredAcksError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from tidewater.proto.topic_config import validate_topic_configs
from tidewater.proto.topic_id import check_topic_id

log = logging.getLogger("tidewater.broker.replica_manager")

ACKS_TIMEOUT_DEFAULT_MS = 30_000
FETCH_MAX_BYTES_DEFAULT = 50 * 1024 * 1024
PARTITION_MAX_BYTES_DEFAULT = 1024 * 1024
RECOVERY_CHECKPOINT_INTERVAL_S = 30.0
FETCH_WAIT_MAX_MS = 60_000  # a bound on any long-poll, whatever the client asks
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


_INT32 = struct.Struct(">i")
_BATCH_LENGTH_AT = 8  # after baseOffset
_RECORD_COUNT_AT = HEADER_SIZE - 4  # the header's last field


def record_count(records: bytes) -> int:
    """Records in the whole batches ``records`` (for metrics), 0 when the framing is broken.

    ``iter_batches(validate=False)``'s framing checks, reading only the two fields needed:
    building every header tuple through a generator cost ~4 µs per fetch answer."""
    count = 0
    position = 0
    end = len(records)
    unpack_from = _INT32.unpack_from
    while position < end:
        if end - position < HEADER_SIZE:
            return 0
        batch_length = unpack_from(records, position + _BATCH_LENGTH_AT)[0]
        if batch_length < BATCH_LENGTH_MIN or position + LOG_OVERHEAD + batch_length > end:
            return 0
        count += unpack_from(records, position + _RECORD_COUNT_AT)[0]
        position += LOG_OVERHEAD + batch_length
    return count


def produce_error_response(request: pb.ProduceRequest, e: Exception, *,
                           context: str) -> pb.ProduceResponse:
    """Every partition of ``request`` answered with the error ``e`` maps to (none appended)."""
    code, message = error_code_for(e, context=context)
    return pb.ProduceResponse(correlation_id=request.correlation_id, partitions=[
        pb.ProducePartitionResponse(topic=data.topic, partition=data.partition, error_code=code,
                                    error_message=message, base_offset=-1)
        for data in request.partitions])


def _set_acks_all_outcome(result: pb.ProducePartitionResponse, code: int) -> None:
    """Write an acks=all wait's outcome (``ProducePurgatory``'s code) into its partition's answer."""
    if code != pb.NONE:
        result.error_code = code
        result.error_message = pb.ErrorCode.Name(code)
        if code != pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            # Not acknowledged: the records may still commit or vanish.
            result.base_offset = -1


class ReplicaManager:
    def __init__(self, *, config: BrokerConfig, log_manager, metadata_cache: MetadataCache,
                 metrics: BrokerMetrics,
                 alter_partition: Callable[[list[pb.AlterPartitionItem]],
                                           Awaitable[pb.AlterPartitionResponse]],
                 broker_epoch: Callable[[], int]):
        self.config = config
        self.broker_id = config.broker_id
        self.log_manager = log_manager
        self.metadata_cache = metadata_cache
        self.metrics = metrics
        self._broker_epoch = broker_epoch
        self.cluster_identity = ClusterIdentity(config.data_dir, config.broker_id)
        self.partitions: dict[TopicPartition, Partition] = {}
        self.controller_epoch = -1
        self.produce_purgatory = ProducePurgatory()
        self.fetch_waiters = FetchWaiters()
        # Leader endpoints (INTERNAL) learned from LeaderAndIsr and UpdateMetadata.
        self.leader_endpoints: dict[int, tuple[str, int]] = {}
        # Live brokers' registered epochs from the last UpdateMetadata (None: none yet).
        self._alive_broker_epochs: dict[int, int] | None = None
        self.fetchers = FetcherManager(self)
        self.isr_changes = IsrChanges(alter_partition=alter_partition, metrics=metrics,
                                      replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                                      on_change=self._on_high_watermark_moved)
        self._loaded_high_watermarks: dict[TopicPartition, int] = {}
        self._loops: list[asyncio.Task] = []
        self.closing = False  # shutting down: long-polls answer at once (answer_long_polls)
        self._closing_callbacks: set[Callable[[], None]] = set()  # on_closing
        # Checkpoint writes, rolls/flushes and retention passes running in threads.
        self._thread_work: set[asyncio.Future] = set()
        # Labelled counter children looked up once, not per fetch answer (labels() is a
        # call and a dict probe), by is_follower: (bytes_out, messages_out).
        self._fetch_out_counters = {
            is_follower: (metrics.bytes_out.labels(kind), metrics.messages_out.labels(kind))
            for is_follower, kind in ((True, "replica"), (False, "consumer"))}
        metrics.register_replicas(self.replica_snapshots)
        # Damaged batches the reads below (and the scrub) find: logged and counted once.
        self.corruption = CorruptionReporter(lambda how: metrics.corrupt_batches.labels(how).inc())

    # ================================================================ lifecycle

    def load(self) -> None:
        """Logs are loaded (LogManager.load); remember their checkpointed HWs, clamped to the LEO."""
        checkpointed = self.log_manager.read_high_watermarks()
        for tp, log_ in self.log_manager.logs().items():
            hw = checkpointed.get(tp, 0)
            self._loaded_high_watermarks[tp] = max(log_.log_start_offset,
                                                   min(hw, log_.log_end_offset))

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self.isr_changes.run_maintenance(self.partitions.values),
                                name="isr-maintenance"),
            asyncio.create_task(self._checkpoint_loop(), name="hw-checkpoint"),
            asyncio.create_task(self._retention_loop(), name="retention"),
        ]

    async def stop(self) -> None:
        """Stop tasks and fetchers, answer waiters; the caller then shuts the LogManager down."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._thread_work:
            await asyncio.gather(*self._thread_work, return_exceptions=True)
        await self.isr_changes.stop()
        await self.fetchers.shutdown()
        self.produce_purgatory.fail_everything(pb.NOT_LEADER_OR_FOLLOWER)
        self.fetch_waiters.notify_all()

    def answer_long_polls(self) -> None:
        """Shutdown, before the servers stop: every pending long-poll answers now with what it
        has and later ones do not wait, so the servers' grace period is not spent on them
        (a stream then ends after its pending answers)."""
        self.closing = True
        self.fetch_waiters.notify_all()
        for callback in list(self._closing_callbacks):
            callback()

    def on_closing(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when ``answer_long_polls`` runs (streams waiting for their
        client's next request stop reading); returns the function that unregisters it."""
        self._closing_callbacks.add(callback)
        return lambda: self._closing_callbacks.discard(callback)

    def high_watermarks(self) -> dict[TopicPartition, int]:
        hws = dict(self._loaded_high_watermarks)
        hws.update({tp: p.high_watermark for tp, p in self.partitions.items()})
        return hws

    def checkpoint_high_watermarks(self) -> None:
        self.log_manager.checkpoint_high_watermarks(self.high_watermarks())

    # ================================================================ controller requests

    async def leader_and_isr(self, request: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrResponse:
        if request.controller_epoch < self.controller_epoch:
            return pb.LeaderAndIsrResponse(error_code=pb.STALE_CONTROLLER_EPOCH)
        own_epoch = self._broker_epoch()
        if 0 <= request.broker_epoch < own_epoch:
            # Meant for an earlier incarnation of this broker.
            return pb.LeaderAndIsrResponse(error_code=pb.STALE_BROKER_EPOCH)
        self.controller_epoch = request.controller_epoch
        for e in request.leaders:
            self.leader_endpoints[e.broker_id] = (e.host, e.port)
        response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
        trusted = self.cluster_identity.trusts(request.cluster_id)
        names_by_id = self._topic_names_by_id()
        for item in request.partitions:
            try:
                code, message = await self._apply_partition_state(
                    item, trusted, request.metadata_offset, names_by_id)
            except Exception as e:  # noqa: BLE001 - converted at the one boundary
                code, message = error_code_for(e, context="LeaderAndIsr")
            response.partitions.add(topic=item.state.topic, partition=item.state.partition,
                                    error_code=code, error_message=message)
        return response

    async def _apply_partition_state(self, item: pb.LeaderAndIsrPartition, trusted: bool,
                                     metadata_offset: int,
                                     names_by_id: dict[bytes, str]) -> tuple[int, str]:
        state = item.state
        tp = TopicPartition(state.topic, state.partition)
        validate_topic_partition(tp)
        if self.broker_id not in state.replicas:
            return pb.UNKNOWN_TOPIC_OR_PARTITION, f"broker {self.broker_id} is not a replica of {tp}"
        topic_id = check_topic_id(state.topic_id)
        topic_configs = dict(item.topic_configs)
        try:
            validate_topic_configs(topic_configs)  # the controller's own parser
        except InvalidConfigError as e:
            # The controller checked them with the same code: a controller of another
            # version, or a metadata log edited by hand. The partition is not hosted.
            log.error("cannot host %s: its topic configs are refused: %s", tp, e)
            return pb.INVALID_CONFIG, str(e)
        partition = await self._partition_for_incarnation(tp, topic_id, topic_configs, trusted,
                                                          names_by_id)
        partition.metadata_offset = max(partition.metadata_offset, metadata_offset)
        self._apply_topic_configs(partition, topic_configs)
        async with partition.lock:
            if not state_is_newer(state, partition.leader_epoch, partition.partition_epoch):
                if (state.leader_epoch, state.partition_epoch) == (partition.leader_epoch,
                                                                   partition.partition_epoch):
                    # A resend (e.g. after re-registration): already applied.
                    if not partition.is_leader and state.leader >= 0:
                        self.fetchers.ensure_partition(partition, state.leader)
                    return pb.NONE, ""
                return pb.FENCED_LEADER_EPOCH, (
                    f"state epoch ({state.leader_epoch}, {state.partition_epoch}) is not newer "
                    f"than ({partition.leader_epoch}, {partition.partition_epoch})")
            if state.leader == self.broker_id:
                if partition.is_leader and state.leader_epoch == partition.leader_epoch:
                    old_isr = partition.leader_isr
                    partition.update_isr(state, mono_ms())
                    if len(partition.leader_isr) != len(old_isr):
                        (self.metrics.isr_shrinks if len(partition.leader_isr) < len(old_isr)
                         else self.metrics.isr_expands).inc()
                    log.info("ISR of %s set by the controller: %s (partition epoch %d)", tp,
                             list(state.isr), state.partition_epoch)
                else:
                    self.fetchers.remove_partition(tp)
                    partition.become_leader(state, mono_ms())
                    self.metrics.leader_elections.inc()
                    log.info("leader of %s in epoch %d at LEO %d, ISR %s", tp, state.leader_epoch,
                             partition.log_end_offset, list(state.isr))
                self._on_high_watermark_moved(partition)
                self.fetch_waiters.notify(tp)  # followers' too: a new epoch fences them
            elif state.leader_epoch != partition.leader_epoch or partition.is_leader:
                if partition.become_follower(state):
                    self.produce_purgatory.fail_all(tp, pb.NOT_LEADER_OR_FOLLOWER)
                self.fetch_waiters.notify(tp)  # long-polls answer NOT_LEADER_OR_FOLLOWER now
                self.fetchers.remove_partition(tp)
                if state.leader >= 0:
                    self.fetchers.add_partition(partition, state.leader)
                log.info("follower of %s in epoch %d (leader %d) at LEO %d", tp,
                         state.leader_epoch, state.leader, partition.log_end_offset)
            else:
                partition.become_follower(state)  # ISR-only change seen by a follower
        return pb.NONE, ""

    async def _partition_for_incarnation(self, tp: TopicPartition, topic_id: bytes,
                                         topic_configs: dict[str, str], trusted: bool,
                                         names_by_id: dict[bytes, str]) -> Partition:
        """The replica of ``tp`` for incarnation ``topic_id`` (``topic_identity``'s table):
        the local one, after adopting the ID or replacing another incarnation's log."""
        owner = told_id_conflict(tp.topic, topic_id, names_by_id)
        if owner is not None:
            raise InconsistentTopicIdError(
                f"topic id {describe_topic_id(topic_id)} is topic {owner!r}'s, not {tp.topic!r}'s")
        partition = self.partitions.get(tp)
        has_log = partition is not None or self.log_manager.get(tp) is not None
        local_id = self.log_manager.topic_id(tp)
        action = log_identity_action(local_id, topic_id, has_log=has_log, trusted=trusted)
        if action is IdentityAction.REFUSE:
            raise InconsistentClusterIdError(
                f"{tp}: the local log is incarnation {describe_topic_id(local_id)}, not "
                f"{describe_topic_id(topic_id)}, and the controller's cluster id is not this "
                f"data dir's: kept")
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
            await self._remove_replica(tp)
            partition = None
        names_by_id[topic_id] = tp.topic
        return partition or self._create_partition(tp, topic_configs, topic_id)

    def _create_partition(self, tp: TopicPartition, topic_configs: dict[str, str],
                          topic_id: bytes) -> Partition:
        log_ = self.log_manager.get(tp)
        if log_ is None:
            config = LogConfig.from_configs(self.config.log_config_overrides(topic_configs))
            log_ = self.log_manager.get_or_create(tp, config, wall_ms(), topic_id=topic_id)
        partition = Partition(
            tp, log_, local_broker_id=self.broker_id,
            high_watermark=self._loaded_high_watermarks.pop(tp, 0),
            min_insync_replicas=self.config.min_insync_replicas_for(topic_configs),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms, topic_id=topic_id)
        self.partitions[tp] = partition
        return partition

    def _topic_names_by_id(self) -> dict[bytes, str]:
        """Every topic ID this broker knows, with its topic: logs, replicas, the last snapshot."""
        names = {topic_id: tp.topic for tp, topic_id in self.log_manager.topic_ids().items()
                 if topic_id is not None}
        names.update(self.metadata_cache.topic_names_by_id())
        names.update((p.topic_id, tp.topic) for tp, p in self.partitions.items() if p.topic_id)
        return names

    def _apply_topic_configs(self, partition: Partition, topic_configs: dict[str, str]) -> None:
        """Topic configs ride on every LeaderAndIsr: logs loaded at start-up get theirs here."""
        if not topic_configs:
            return
        config = LogConfig.from_configs(self.config.log_config_overrides(topic_configs))
        if config != partition.log.config:
            self.log_manager.update_topic_config(partition.tp.topic, config)
        min_insync_replicas = self.config.min_insync_replicas_for(topic_configs)
        partition.min_insync_replicas = min_insync_replicas
        if partition.leader_state is not None:
            partition.leader_state.min_insync_replicas = min_insync_replicas

    async def stop_replica(self, request: pb.StopReplicaRequest) -> pb.StopReplicaResponse:
        if request.controller_epoch < self.controller_epoch:
            return pb.StopReplicaResponse(error_code=pb.STALE_CONTROLLER_EPOCH)
        self.controller_epoch = request.controller_epoch
        trusted = self.cluster_identity.trusts(request.cluster_id)
        response = pb.StopReplicaResponse(error_code=pb.NONE)
        for state in request.partitions:
            tp = TopicPartition(state.topic, state.partition)
            code, message = pb.NONE, ""
            try:
                if state.topic_id:
                    check_topic_id(state.topic_id)
                partition = self.partitions.get(tp)
                if partition is not None and 0 <= state.leader_epoch < partition.leader_epoch:
                    raise FencedLeaderEpochError(
                        f"StopReplica epoch {state.leader_epoch} is older than "
                        f"{partition.leader_epoch} for {tp}")
                if partition is not None or self.log_manager.get(tp) is not None:
                    refused = stop_replica_error(self.log_manager.topic_id(tp), state.topic_id,
                                                 trusted=trusted or not request.delete_partitions)
                    if refused is not None:
                        raise error_for_code(*refused)
                await self._remove_replica(tp, leader_epoch=state.leader_epoch,
                                           delete=request.delete_partitions)
            except Exception as e:  # noqa: BLE001
                code, message = error_code_for(e, context="StopReplica")
            response.partitions.add(topic=tp.topic, partition=tp.partition, error_code=code,
                                    error_message=message)
        return response

    async def _remove_replica(self, tp: TopicPartition, *, leader_epoch: int = -1,
                              delete: bool = True) -> None:
        """Stop serving ``tp`` (no leader, waiters answered); with ``delete`` forget it and
        move its log aside for deletion (``LogManager.delete``)."""
        partition = self.partitions.get(tp)
        if partition is not None:
            async with partition.lock:
                self.fetchers.remove_partition(tp)
                partition.become_follower(pb.PartitionState(
                    topic=tp.topic, partition=tp.partition, leader=-1,
                    leader_epoch=max(leader_epoch, partition.leader_epoch),
                    partition_epoch=partition.partition_epoch))
                self.produce_purgatory.fail_all(tp, pb.NOT_LEADER_OR_FOLLOWER)
                self.fetch_waiters.notify(tp)
                if delete and self.partitions.get(tp) is partition:
                    del self.partitions[tp]
        if delete:
            self._loaded_high_watermarks.pop(tp, None)
            if self.log_manager.get(tp) is not None:
                self.log_manager.delete(tp)

    async def update_metadata(self, request: pb.UpdateMetadataRequest
                              ) -> pb.UpdateMetadataResponse:
        try:
            self.metadata_cache.update(request)
        except Exception as e:  # noqa: BLE001
            return pb.UpdateMetadataResponse(error_code=error_code_for(e)[0])
        for b in request.brokers:
            for lst in b.listeners:
                if lst.name == "INTERNAL" and not b.fenced:
                    self.leader_endpoints[b.broker_id] = (lst.host, lst.port)
        self._alive_broker_epochs = {b.broker_id: b.broker_epoch for b in request.brokers
                                     if not b.fenced and not b.in_controlled_shutdown}
        if self.cluster_identity.trusts(request.cluster_id):
            await self._remove_stray_replicas(request)
        return pb.UpdateMetadataResponse(error_code=pb.NONE)

    async def _remove_stray_replicas(self, request: pb.UpdateMetadataRequest) -> None:
        """Move aside every local replica the full snapshot leaves out (``topic_identity.is_stray``):
        logs not claimed since start-up whatever the snapshot holds (an empty one places
        nothing here), and replicas a LeaderAndIsr made if the snapshot is as new as it."""
        topic_ids = {p.topic: p.topic_id for p in request.partitions}
        placed_here = {(p.topic, p.partition) for p in request.partitions
                       if self.broker_id in p.replicas}
        for tp, local_id in self.log_manager.topic_ids().items():
            partition = self.partitions.get(tp)
            if partition is not None and request.metadata_offset < partition.metadata_offset:
                continue  # the snapshot may predate the LeaderAndIsr that made it
            if not is_stray(tp, local_id, topic_ids=topic_ids, placed_here=placed_here):
                continue
            log.warning("%s (topic id %s) is stray: the cluster (controller epoch %d, metadata "
                        "offset %d) has no such replica here; moving it aside for deletion", tp,
                        describe_topic_id(local_id), request.controller_epoch,
                        request.metadata_offset)
            try:
                await self._remove_replica(tp)
            except Exception as e:  # noqa: BLE001 - a failed delete leaves the log in place
                log.error("removing stray replica %s failed: %s", tp, e)

    # ================================================================ lookups

    def _partition(self, topic: str, partition_index: int) -> Partition:
        # A plain tuple finds the TopicPartition key (a NamedTuple: same hash, equal). A hosted
        # partition's name was validated before it was created (_apply_partition_state), so
        # only a miss is validated: a bad name still answers INVALID_TOPIC_EXCEPTION, not
        # UNKNOWN_TOPIC_OR_PARTITION. A lookup is one dict probe on every fetch and produce.
        partition = self.partitions.get((topic, partition_index))
        if partition is None:
            tp = TopicPartition(topic, partition_index)
            validate_topic_partition(tp)
            raise UnknownTopicOrPartitionError(f"{tp} is not hosted on broker {self.broker_id}")
        return partition

    # ================================================================ produce

    async def produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        response, waits = await self.produce_append(request)
        if waits:
            await self.produce_wait(request, waits)
        return response

    async def produce_append(self, request: pb.ProduceRequest
                             ) -> tuple[pb.ProduceResponse, list[tuple]]:
        """The first half of ``produce``: validate and append every partition's records now.

        Returns the response (final unless acks=all) and the acks=all waits for
        ``produce_wait``. ProduceStream awaits this for request N before it starts
        request N+1, so a stream's requests are appended in the order they arrived
        (the append suspends only when the partition lock is held, e.g. by a
        LeaderAndIsr, and the lock hands over in FIFO order)."""
        acks = request.acks
        response = pb.ProduceResponse(correlation_id=request.correlation_id)
        if acks not in (0, 1, -1):
            return produce_error_response(request, InvalidRequiredAcksError(
                f"acks must be 0, 1 or -1 (all), got {acks}"), context="Produce"), []
        waits = []
        for data in request.partitions:
            topic, partition_index = data.topic, data.partition  # each access is a call
            result = response.partitions.add(topic=topic, partition=partition_index,
                                             error_code=pb.NONE, base_offset=-1)
            try:
                partition = self._partition(topic, partition_index)
                info = await self._append_as_leader(partition, data.records, acks)
                result.base_offset = info.first_offset
                result.log_append_time_ms = info.log_append_time_ms
                result.log_start_offset = partition.log.log_start_offset
                if acks == -1:
                    waits.append((result, partition, info.last_offset + 1))
            except Exception as e:  # noqa: BLE001
                code, message = error_code_for(e, context="Produce")
                result.error_code, result.error_message = code, message
                result.base_offset = -1
                if code != pb.NONE:
                    self.metrics.request_errors.labels("Produce", pb.ErrorCode.Name(code)).inc()
        if acks == 0:
            # The client asked for no answer: nothing to tell it, errors included.
            return pb.ProduceResponse(), []
        return response, waits

    async def produce_wait(self, request: pb.ProduceRequest, waits: list[tuple]) -> None:
        """The second half of ``produce``: wait until the HW passes each acks=all append
        (``waits`` from ``produce_append``) and write the outcome into its response."""
        timeout_ms = request.timeout_ms if request.timeout_ms > 0 else ACKS_TIMEOUT_DEFAULT_MS
        waiting = [self.produce_purgatory.wait(partition.tp, required, timeout_ms,
                                               partition.acks_all_result)
                   for _, partition, required in waits]
        # One partition (the usual request) is awaited directly: gather would wrap it in
        # a task, one more hop through the event loop before the answer goes out.
        codes = [await waiting[0]] if len(waiting) == 1 else await asyncio.gather(*waiting)
        for (result, _, _), code in zip(waits, codes, strict=True):
            _set_acks_all_outcome(result, code)

    def produce_watch(self, request: pb.ProduceRequest, response: pb.ProduceResponse,
                      waits: list[tuple], done: Callable[[pb.ProduceResponse], None]
                      ) -> Callable[[], None]:
        """``produce_wait`` without a coroutine (ProduceStream): ``done(response)`` runs once,
        from the event loop (or at once), when every wait has its outcome in ``response``;
        a failure there answers ``produce_error_response`` instead, as ``produce_wait``'s
        caller does. Returns the function that withdraws the waits (``done`` never runs)."""
        timeout_ms = request.timeout_ms if request.timeout_ms > 0 else ACKS_TIMEOUT_DEFAULT_MS
        remaining = len(waits)
        failed: list[Exception] = []

        def on_outcome(result: pb.ProducePartitionResponse, code: int) -> None:
            nonlocal remaining
            try:
                _set_acks_all_outcome(result, code)
            except Exception as e:  # noqa: BLE001 - answered below, as for produce_wait
                failed.append(e)
            remaining -= 1
            if remaining == 0:
                done(produce_error_response(request, failed[0], context="ProduceStream")
                     if failed else response)

        withdraws = [self.produce_purgatory.watch(
            partition.tp, required, timeout_ms, partition.acks_all_result,
            functools.partial(on_outcome, result)) for result, partition, required in waits]
        if len(withdraws) == 1:
            return withdraws[0]

        def withdraw_all() -> None:
            for withdraw in withdraws:
                withdraw()
        return withdraw_all

    async def _append_as_leader(self, partition: Partition, records: bytes, acks: int):
        if not records:
            raise CorruptRecordError("produce request carries no record batch")
        async with partition.lock:
            leader = partition.require_leader()
            if acks == -1:
                leader.check_acks_all_allowed()  # nothing written when the ISR is too small
            info = partition.log.append_as_leader(records, leader.leader_epoch, wall_ms())
            self.metrics.messages_in.inc(info.record_count)
            self.metrics.bytes_in.inc(len(records))
            if leader.on_local_append(partition.log.log_end_offset, mono_ms()):
                self._on_high_watermark_moved(partition)
            self.fetch_waiters.notify_append(partition.tp)  # followers' long-polls
            return info

    def _on_high_watermark_moved(self, partition: Partition) -> None:
        """Also called after ISR changes: acks=all answers depend on both. Only consumers'
        long-polls are woken: a HW move alone does not answer a follower's (see ``fetch``).
        Consumers first, as Kafka's ``DelayedOperations.checkAndCompleteAll`` (fetch, then
        produce): the newly committed records reach readers one write sooner."""
        self.fetch_waiters.notify_high_watermark(partition.tp)
        self.produce_purgatory.try_complete(partition.tp, partition.acks_all_result)

    # ================================================================ fetch

    async def fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        loop = asyncio.get_running_loop()
        max_wait_ms = min(max(request.max_wait_ms, 0), FETCH_WAIT_MAX_MS)
        deadline = loop.time() + max_wait_ms / 1000
        replica_id = request.replica_id
        is_follower = replica_id >= 0
        min_bytes = max(request.min_bytes, 1)
        # The request's fields are read once into plain tuples: a long-poll reads them again
        # on every pass, and each protobuf field access is a call (a message one allocates).
        wanted = [(fp.topic, fp.partition, fp.current_leader_epoch, fp.fetch_offset,
                   fp.last_fetched_epoch, fp.partition_max_bytes, fp.topic_id)
                  for fp in request.partitions]
        max_bytes = request.max_bytes
        broker_epoch = request.replica_broker_epoch if is_follower else -1
        keys = None
        first_pass = True
        # A HW move alone does not answer a follower's long-poll (as in Kafka's DelayedFetch):
        # the follower learns the HW with its next records or at max_wait_ms. Answering
        # it cost one extra fetch round per acks=all write (the ISR member that fetched
        # first was answered empty as soon as the last one moved the HW) and left that
        # follower without a pending fetch when the next record arrived. So a follower's
        # long-poll is not even woken by a HW move, only by appends and leadership changes;
        # a consumer's only by HW moves and leadership changes (``FetchWaiters``).
        while True:
            results, total_bytes, must_answer = self._read_fetch(
                wanted, max_bytes, replica_id if is_follower else -1, broker_epoch, first_pass)
            first_pass = False
            remaining_s = deadline - loop.time()
            if must_answer or total_bytes >= min_bytes or remaining_s <= 0 or self.closing:
                break
            if keys is None:
                keys = [(topic, partition) for topic, partition, *_ in wanted]
            await self.fetch_waiters.wait(keys, remaining_s, follower=is_follower)
        # The response is built once, from the last pass.
        response = pb.FetchResponse(error_code=pb.NONE)
        add = response.partitions.add
        messages = 0
        for (topic, partition, code, message, high_watermark, log_start_offset, log_end_offset,
             leader_epoch, records, diverging) in results:
            out = add(topic=topic, partition=partition, error_code=code, error_message=message,
                      high_watermark=high_watermark, log_start_offset=log_start_offset,
                      log_end_offset=log_end_offset, leader_epoch=leader_epoch, records=records)
            if diverging is not None:
                out.diverging_epoch.CopyFrom(pb.EpochEndOffset(epoch=diverging[0],
                                                               end_offset=diverging[1]))
            if code != pb.NONE:
                self.metrics.request_errors.labels("Fetch", pb.ErrorCode.Name(code)).inc()
            elif records:
                messages += record_count(records)
        if total_bytes:
            bytes_out, messages_out = self._fetch_out_counters[is_follower]
            bytes_out.inc(total_bytes)
            messages_out.inc(messages)
        return response

    def _read_fetch(self, wanted: list[tuple], max_bytes: int, replica_id: int,
                    broker_epoch: int, first_pass: bool) -> tuple[list[tuple], int, bool]:
        """(per partition: (topic, partition, error_code, error_message, high_watermark,
        log_start_offset, log_end_offset, leader_epoch, records, diverging (epoch, end_offset)
        or None), the records' bytes, must it be answered now). A follower's when
        ``replica_id`` >= 0."""
        if max_bytes <= 0:
            max_bytes = FETCH_MAX_BYTES_DEFAULT
        total_bytes = 0
        must_answer = False
        results = []
        for (topic, partition_index, current_leader_epoch, fetch_offset, last_fetched_epoch,
             partition_max_bytes, topic_id) in wanted:
            leader_epoch = high_watermark = log_start_offset = log_end_offset = -1
            try:
                partition = self._partition(topic, partition_index)
                if topic_id and topic_id != partition.topic_id:
                    self._refuse_topic_id(topic_id, partition)
                leader_epoch = partition.leader_epoch
                high_watermark = partition.high_watermark
                log_start_offset = partition.log.log_start_offset
                log_end_offset = partition.log_end_offset
                if partition_max_bytes <= 0:
                    partition_max_bytes = PARTITION_MAX_BYTES_DEFAULT
                budget = min(partition_max_bytes, max(max_bytes - total_bytes, 0))
                if replica_id >= 0:
                    records, diverging = self._read_for_follower(
                        partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
                        replica_id, broker_epoch, budget, total_bytes == 0, first_pass)
                    if diverging is not None:
                        must_answer = True
                else:
                    records = self._read_for_consumer(partition, current_leader_epoch,
                                                      fetch_offset, budget, total_bytes == 0)
                    diverging = None
                high_watermark = partition.high_watermark
                total_bytes += len(records)
                results.append((topic, partition_index, pb.NONE, "", high_watermark,
                                log_start_offset, log_end_offset, leader_epoch, records,
                                diverging))
            except Exception as e:  # noqa: BLE001
                code, message = error_code_for(e, context="Fetch")
                results.append((topic, partition_index, code, message, high_watermark,
                                log_start_offset, log_end_offset, leader_epoch, b"", None))
                must_answer = True
        return results, total_bytes, must_answer

    def _refuse_topic_id(self, topic_id: bytes, partition: Partition) -> None:
        """Raise the fetch error for ``topic_id`` naming another incarnation than ``partition``'s."""
        known = self.metadata_cache.topic_names_by_id()
        code, message = fetch_topic_id_error(topic_id, partition.topic_id, known.__contains__)
        raise error_for_code(code, f"{partition.tp}: {message}")

    def _read_for_consumer(self, partition: Partition, current_leader_epoch: int,
                           fetch_offset: int, max_bytes: int, min_one_batch: bool) -> bytes:
        partition.require_leader()
        partition.check_leader_epoch(current_leader_epoch)
        log_ = partition.log
        if not log_.log_start_offset <= fetch_offset <= log_.log_end_offset:
            raise OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} outside [{log_.log_start_offset}, "
                f"{log_.log_end_offset}] for {partition.tp}")
        high_watermark = partition.high_watermark
        if fetch_offset >= high_watermark:
            return b""  # nothing committed there yet: never read above the HW
        return bytes(read_reporting(log_, self.corruption, CONSUMER_READ, fetch_offset, max_bytes,
                                    max_offset=high_watermark, min_one_batch=min_one_batch).records)

    def _isr_eligible(self, replica_id: int, broker_epoch: int) -> bool:
        """KIP-903 (Kafka's ``isReplicaIsrEligible``): may a fetch from ``replica_id`` carrying
        ``broker_epoch`` add it to the ISR? Only if the broker is live, unfenced and not
        shutting down in the controller's last snapshot, and the fetch carries that broker's
        registered epoch (or none, -1). A fetch from an earlier incarnation of a restarted
        broker must not vouch for the new one. Before any snapshot arrived nothing is known
        here; the controller still refuses a joiner it does not consider live."""
        if self._alive_broker_epochs is None:
            return True
        alive_epoch = self._alive_broker_epochs.get(replica_id)
        return alive_epoch is not None and broker_epoch in (-1, alive_epoch)

    def _read_for_follower(self, partition: Partition, current_leader_epoch: int,
                           fetch_offset: int, last_fetched_epoch: int, replica_id: int,
                           broker_epoch: int, max_bytes: int, min_one_batch: bool,
                           first_pass: bool) -> tuple[bytes, tuple[int, int] | None]:
        """(records, None), or (b"", the diverging epoch's (epoch, end_offset))."""
        leader = partition.require_leader()
        partition.check_leader_epoch(current_leader_epoch)
        log_ = partition.log
        log_end_offset = log_.log_end_offset
        diverging = check_diverging(last_fetched_epoch, fetch_offset, log_.leader_epoch_cache,
                                    log_end_offset)
        if diverging is not None:
            return b"", diverging
        if not log_.log_start_offset <= fetch_offset <= log_end_offset:
            raise OffsetOutOfRangeError(
                f"follower {replica_id} fetch offset {fetch_offset} outside "
                f"[{log_.log_start_offset}, {log_end_offset}] for {partition.tp}")
        if first_pass:
            decision = leader.on_follower_fetch(replica_id, fetch_offset, mono_ms(),
                                                self._isr_eligible(replica_id, broker_epoch))
            if decision.high_watermark_changed:
                self._on_high_watermark_moved(partition)
            if decision.propose_isr is not None:
                self.isr_changes.send(partition)
        if fetch_offset >= log_end_offset:
            return b"", None
        return bytes(read_reporting(log_, self.corruption, FOLLOWER_READ, fetch_offset, max_bytes,
                                    min_one_batch=min_one_batch).records), None

    # ================================================================ offsets

    def list_offsets(self, request: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        response = pb.ListOffsetsResponse()
        for lp in request.partitions:
            out = response.partitions.add(topic=lp.topic, partition=lp.partition,
                                          error_code=pb.NONE, timestamp=-1, offset=-1,
                                          leader_epoch=-1)
            try:
                partition = self._partition(lp.topic, lp.partition)
                if request.replica_id < 0:
                    partition.require_leader()
                partition.check_leader_epoch(lp.current_leader_epoch)
                log_ = partition.log
                cache = log_.leader_epoch_cache
                if lp.timestamp == EARLIEST_TIMESTAMP:
                    out.offset = log_.log_start_offset
                elif lp.timestamp == LATEST_TIMESTAMP:
                    out.offset = (partition.high_watermark if request.replica_id < 0
                                  else log_.log_end_offset)
                else:
                    # A record found at or above the HW does not exist for a consumer yet.
                    found = log_.fetch_offset_by_timestamp(lp.timestamp)
                    if found is not None and (request.replica_id >= 0
                                              or found[0] < partition.high_watermark):
                        out.offset, out.timestamp, out.leader_epoch = found
                    continue
                # The epoch of the last record before the offset (Kafka's answer for -1/-2).
                out.leader_epoch = cache.epoch_for_offset(max(out.offset - 1, log_.log_start_offset))
            except Exception as e:  # noqa: BLE001
                out.error_code = error_code_for(e, context="ListOffsets")[0]
        return response

    def offset_for_leader_epoch(self, request: pb.OffsetForLeaderEpochRequest
                                ) -> pb.OffsetForLeaderEpochResponse:
        response = pb.OffsetForLeaderEpochResponse()
        for p in request.partitions:
            out = response.partitions.add(topic=p.topic, partition=p.partition,
                                          error_code=pb.NONE, leader_epoch=-1, end_offset=-1)
            try:
                partition = self._partition(p.topic, p.partition)
                partition.require_leader()
                partition.check_leader_epoch(p.current_leader_epoch)
                log_ = partition.log
                # KIP-279: the epoch travels with the offset, even as (-1, -1).
                out.leader_epoch, out.end_offset = log_.leader_epoch_cache.end_offset_for(
                    p.leader_epoch, log_.log_end_offset)
            except Exception as e:  # noqa: BLE001
                out.error_code = error_code_for(e, context="OffsetForLeaderEpoch")[0]
        return response

    def describe_replicas(self, request: pb.DescribeReplicasRequest) -> pb.DescribeReplicasResponse:
        wanted = set(request.topics)
        response = pb.DescribeReplicasResponse(broker_id=self.broker_id)
        for tp in sorted(self.partitions):
            if wanted and tp.topic not in wanted:
                continue
            p = self.partitions[tp]
            response.replicas.add(
                topic=tp.topic, partition=tp.partition, is_leader=p.is_leader,
                leader_epoch=p.leader_epoch, log_start_offset=p.log.log_start_offset,
                log_end_offset=p.log_end_offset, high_watermark=p.high_watermark,
                size_bytes=p.log.size_bytes, isr=list(p.leader_isr))
        return response

    def replica_snapshots(self) -> list[ReplicaSnapshot]:
        out = []
        for tp, p in list(self.partitions.items()):
            isr = p.leader_isr
            out.append(ReplicaSnapshot(
                topic=tp.topic, partition=tp.partition, log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark, log_start_offset=p.log.log_start_offset,
                leader_epoch=p.leader_epoch, isr_size=len(isr), is_leader=p.is_leader,
                under_replicated=p.is_leader and len(isr) < len(p.replicas)))
        return out

    # ================================================================ background

    async def _checkpoint_loop(self) -> None:
        """HW checkpoint, segment.ms rolls and flush.ms flushes; recovery points less often."""
        interval_s = self.config.log_flush_offset_checkpoint_interval_ms / 1000
        last_recovery_checkpoint = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            try:
                # The checkpoint files are written (and fsynced) in a thread: an fsync takes
                # milliseconds to tens of ms on a busy disk and stalled every request when it
                # ran on the loop. The HWs are snapshotted here, on the loop.
                await self._in_thread(self.log_manager.checkpoint_high_watermarks,
                                      self.high_watermarks())
                # A segment.ms roll queues its flush; a flush.ms flush fsyncs (outside
                # each log's lock). The logs dict is snapshotted here, on the loop.
                await self._in_thread(self.log_manager.maybe_roll_and_flush, wall_ms(),
                                      self.log_manager.logs())
                if time.monotonic() - last_recovery_checkpoint >= RECOVERY_CHECKPOINT_INTERVAL_S:
                    last_recovery_checkpoint = time.monotonic()
                    # Flushes every log (fsyncs outside each log's lock) before writing the points.
                    await self._in_thread(self.log_manager.checkpoint_recovery_points)
            except Exception as e:  # noqa: BLE001 - keep serving; next round retries
                log.error("checkpoint failed: %s", e)

    async def _in_thread(self, fn, *args) -> None:
        """Run ``fn`` in a worker thread; ``stop`` waits for every such run, so a cancelled
        loop never leaves a checkpoint write or a retention pass running into the
        shutdown's own checkpoints. Arguments are snapshots taken on the loop."""
        work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._thread_work.add(work)
        work.add_done_callback(self._thread_work.discard)
        await asyncio.shield(work)

    async def _retention_loop(self) -> None:
        interval_s = self.config.log_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                # Renames and a checkpoint write: in a thread, with the partitions' HWs
                # and logs snapshotted together here, on the loop.
                partitions = list(self.partitions.items())
                await self._in_thread(self.log_manager.delete_old_segments, wall_ms(),
                                      {tp: p.high_watermark for tp, p in partitions},
                                      {tp: p.log for tp, p in partitions})
            except Exception as e:  # noqa: BLE001
                log.error("retention failed: %s", e)
