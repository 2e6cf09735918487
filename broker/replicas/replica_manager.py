"""The broker's replicas: wires the replication core to the broker's I/O.

Every decision about a replica is made by its ``ReplicaState``
(``broker/replication/replica.py``); the pieces built here only do I/O for it,
each with one job:

=======================  =====================================================
``ControlRequests``      LeaderAndIsr, StopReplica, UpdateMetadata (control.py)
``ProducePath``          the one produce path: append, acks=all waits (produce.py)
``FetchPath``            the one fetch path, ListOffsets, OffsetForLeaderEpoch
                         (fetch.py)
``FetcherManager``       follower fetch transport, one task per leader (fetcher.py)
``AlterPartitionSender`` ISR proposals to the controller (alter_partition.py)
``BackgroundWork``       replication ticks, checkpoints, retention (background.py)
``ReadyCarrier``         carries out a decision's Ready (ready_carrier.py)
``MarkerWriter``         transaction markers for the coordinator (txn_markers.py)
``TaskSupervisor``       every background task; a death stops the broker
=======================  =====================================================

``ReplicaManager`` owns the partitions and is the one object the gRPC servicer
talks to. Logs loaded at start-up wait (with their checkpointed HW) until a
LeaderAndIsr claims them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import grpc

from tidewater.broker.clock import mono_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.controller_link.alter_partition import (
    AlterPartitionRpc,
    AlterPartitionSender,
    CorruptReportRpc,
)
from tidewater.broker.following.fetcher import FetcherManager
from tidewater.broker.following.throttle import FOLLOWER_REPLICAS, follower_rate, is_throttled
from tidewater.broker.metrics import BrokerMetrics, ReplicaSnapshot
from tidewater.broker.replicas.background import BackgroundWork
from tidewater.broker.replicas.cluster_identity import ClusterIdentity
from tidewater.broker.replicas.control import ControlRequests
from tidewater.broker.replicas.hw_checkpoint import (
    high_watermarks_to_checkpoint,
    loaded_high_watermarks,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier, from_threads
from tidewater.broker.security.inter_broker import ChannelOpener, plain_channel
from tidewater.broker.serving.delete_records import DeleteRecordsResult, delete_records
from tidewater.broker.serving.fetch import (
    FetchedPartition,
    FetchPath,
    FollowerSession,
    last_stable_offset,
)
from tidewater.broker.serving.produce import ProducePath, Waits, produce_error_response
from tidewater.broker.serving.producer_ids import AllocateRpc, ProducerIdManager
from tidewater.broker.serving.purgatory import AcksWait, AcksWaits, FetchWaiters
from tidewater.broker.serving.replica_fetch_session import ReplicaFetchSession
from tidewater.broker.serving.txn_markers import MarkerWriter
from tidewater.broker.storage.corruption import CorruptionReporter
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition, validate_topic_partition
from tidewater.broker.txn.verification import VerificationCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.broker_dynamic_config import TXN_VERIFICATION, dynamic_flag
from tidewater.proto.errors import UnknownTopicOrPartitionError
from tidewater.proto.supervisor import TaskSupervisor

__all__ = ["ReplicaManager", "produce_error_response"]

# A LeaderAndIsr naming more partitions is applied a slice at a time, the event loop
# let run in between: hosting a new partition costs milliseconds (files created,
# fsynced), and a request for hundreds (a topic's creation) would otherwise hold the
# loop for seconds, long enough to miss heartbeats and be fenced. (Their logs are made
# in a worker thread first, ``_create_new_logs``; one that could not be is tried again
# in its slice, at this cost, and answered there.) A partition whose log is already
# here (a restart's new epochs, a new topic's once made) costs a quarter of that, one
# fsynced epoch write that runs beside the slice's others (ReadyCarrier.apply_all): a
# slice holds up to 16 new partitions or 64 hosted ones (a restart's 60: the first to
# the last partition served 21-76 ms apart in 4 slices, 1-6 ms in one;
# docs/benchmarks.md).
LEADER_AND_ISR_SLICE_PARTITIONS = 16
LEADER_AND_ISR_SLICE_COST = 64
_NEW_PARTITION_COST = LEADER_AND_ISR_SLICE_COST // LEADER_AND_ISR_SLICE_PARTITIONS

# Replication decisions that have a metric of their own besides replication_decisions.
NAMED_DECISIONS = ("leader_elections", "isr_shrinks", "isr_expands")


async def _in_thread_to_its_end(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread while the loop serves. Cancelled meanwhile (a
    stop), it waits for the thread before the cancellation goes on: the caller's files
    are not closed under it."""
    work = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        raise


class ReplicaManager:
    def __init__(self, *, config: BrokerConfig, log_manager: LogManager,
                 metadata_cache: MetadataCache,
                 metrics: BrokerMetrics, alter_partition: AlterPartitionRpc,
                 broker_epoch: Callable[[], int], supervisor: TaskSupervisor,
                 report_corrupt_replica: CorruptReportRpc | None = None,
                 control_token: Callable[[], bytes] = lambda: b"",
                 channel_credentials: grpc.ChannelCredentials | None = None,
                 fetch_call_metadata: tuple[tuple[str, str], ...] = (),
                 fetch_open_channel: ChannelOpener = plain_channel,
                 allocate_producer_ids: AllocateRpc | None = None) -> None:
        """``channel_credentials``: TLS for the follower fetchers' channels (None: plaintext).
        ``fetch_call_metadata``: what the fetchers' calls to leaders carry (this broker's
        SASL credentials, ``inter_broker``).
        ``allocate_producer_ids``: the controller's AllocateProducerIds (None: no producer
        ids, InitProducerId answers COORDINATOR_LOAD_IN_PROGRESS)."""
        self.config = config
        self.broker_id = config.broker_id
        # Control requests apply one at a time: a sliced LeaderAndIsr yields between
        # slices, and nothing else of the controller's may land in between.
        self._control_lock = asyncio.Lock()
        self.log_manager = log_manager
        self.metadata_cache = metadata_cache
        self.metrics = metrics
        self.supervisor = supervisor
        self.partitions: dict[TopicPartition, Partition] = {}
        # The same dict, looked up by a plain (topic, partition) pair (a TopicPartition is a
        # NamedTuple: same hash, equal): the produce and fetch paths skip building one.
        self._partitions_by_pair = cast(dict[tuple[str, int], Partition], self.partitions)
        self._loaded_high_watermarks: dict[TopicPartition, int] = {}
        self.closing = False  # shutting down: long-polls answer at once (answer_long_polls)
        self._closing_callbacks: set[Callable[[], None]] = set()

        self.fetch_waiters = FetchWaiters()
        self.acks_waits = AcksWaits(on_deadline=self._on_wait_deadline)
        self.carrier = ReadyCarrier(
            notify_readers=self._notify_readers, complete_wait=self.acks_waits.complete,
            count_decision=self._count_decision,
            count_replicated_bytes=metrics.replication_bytes_in.inc, run_all=from_threads)
        self._named_decisions = {name: getattr(metrics, name) for name in NAMED_DECISIONS}
        self.control = ControlRequests(
            config=config, log_manager=log_manager, metadata_cache=metadata_cache,
            partitions=self.partitions, carrier=self.carrier, broker_epoch=broker_epoch,
            loaded_high_watermarks=self._loaded_high_watermarks,
            forget_partition=self._forget_partition, control_token=control_token,
            cluster_identity=ClusterIdentity.of_data_dir(config.data_dir, config.broker_id))
        self.fetchers = FetcherManager(
            config=config, carrier=self.carrier, supervisor=self.supervisor,
            broker_epoch=broker_epoch, leader_endpoint=self.control.leader_endpoints.get,
            channel_credentials=channel_credentials, call_metadata=fetch_call_metadata,
            open_channel=fetch_open_channel)
        self.alter_partitions = AlterPartitionSender(
            rpc=alter_partition, carrier=self.carrier, supervisor=self.supervisor,
            **({"report_rpc": report_corrupt_replica} if report_corrupt_replica else {}))
        self.fetchers.throttled = self._follower_throttled
        self.carrier.follow = self.fetchers.follow
        self.carrier.stop_following = self.fetchers.stop_following
        self.carrier.send_alter_partition = self.alter_partitions.send
        self.carrier.send_corrupt_report = self.alter_partitions.report_corrupt
        # Damaged batches the reads and the scrub find: logged and counted once.
        self.corruption = CorruptionReporter(
            lambda how: metrics.corrupt_batches.labels(how).inc())
        self.producer_ids = ProducerIdManager(allocate_producer_ids, self.supervisor)
        # KIP-890 part 1 (broker/txn/verification.py): what the transaction coordinator
        # confirmed, per partition and producer, until the producer's next marker.
        # Switched by ``transaction.partition.verification.enable`` (dynamic, as Kafka's).
        self.txn_verification = VerificationCache(
            expiration_ms=config.producer_id_expiration_ms)
        self.producer = ProducePath(lookup=self._partition, carrier=self.carrier,
                                    acks_waits=self.acks_waits, metrics=metrics,
                                    verification=self.txn_verification)
        self.producer.verification_enabled = config.transaction_partition_verification_enable
        # The transaction coordinator's port for markers (serving/txn_markers.py).
        self.txn_markers = MarkerWriter(lookup=self._partition, carrier=self.carrier,
                                        acks_waits=self.acks_waits,
                                        verification=self.txn_verification)
        self.fetcher_path = FetchPath(
            lookup=self._partition, carrier=self.carrier, fetch_waiters=self.fetch_waiters,
            metrics=metrics, is_isr_eligible=self.control.is_isr_eligible,
            closing=lambda: self.closing, corruption=self.corruption,
            known_topic_ids=metadata_cache.topic_names_by_id)
        self.background = BackgroundWork(
            config=config, log_manager=log_manager, carrier=self.carrier,
            supervisor=self.supervisor, partitions=self.partitions,
            high_watermarks=self.high_watermarks, corruption=self.corruption, metrics=metrics)
        metrics.register_replicas(self.replica_snapshots)

    # ================================================================ lifecycle

    def load(self) -> None:
        """Logs are loaded (LogManager.load); remember their checkpointed HWs, clamped to
        [log start, LEO] (``hw_checkpoint``)."""
        # Updated in place: ControlRequests holds this dict and claims from it.
        self._loaded_high_watermarks.update(loaded_high_watermarks(
            self.log_manager.read_high_watermarks(), self.log_manager.logs()))

    def start(self) -> None:
        self.background.start()

    async def stop(self) -> None:
        """Stop tasks and fetchers, answer waiters; the caller then shuts the LogManager down."""
        await self.background.stop()
        await self.producer_ids.stop()
        await self.fetchers.shutdown()
        await self.supervisor.stop()
        for wait in self.acks_waits.open_waits():
            self.acks_waits.complete(wait.waiter_id, pb.NOT_LEADER_OR_FOLLOWER)
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
        return high_watermarks_to_checkpoint(
            self._loaded_high_watermarks,
            {tp: p.high_watermark for tp, p in self.partitions.items()})

    def checkpoint_high_watermarks(self) -> None:
        self.log_manager.checkpoint_high_watermarks(self.high_watermarks())

    # ================================================================ the servicer's calls

    async def leader_and_isr(self, request: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrResponse:
        """The logs of the request's new partitions made first, off the loop
        (``_create_new_logs``); then ``control.leader_and_isr``, a slice of partitions at a
        time (``_leader_and_isr_slices``): each slice is the request with part of its
        partitions (the same epochs, token and leaders), so a refusal comes with the first
        slice, before anything is applied."""
        async with self._control_lock:
            # Sliced before the logs are made: a partition is costed as new by its missing
            # log, and its replica, epoch write and notes still cost that after the thread
            # made its log (otherwise a new topic's partitions went in one slice).
            bounds = self._leader_and_isr_slices(request)
            await self._create_new_logs(request)
            if len(bounds) == 1:
                return self.control.leader_and_isr(request)
            response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
            for start, end in bounds:
                if start:
                    await asyncio.sleep(0)
                part = pb.LeaderAndIsrRequest()
                part.CopyFrom(request)
                del part.partitions[:]
                part.partitions.extend(request.partitions[start:end])
                answered = self.control.leader_and_isr(part)
                if answered.error_code != pb.NONE:
                    # Refused (the first slice; or a later one, when this broker
                    # re-registered in between: the controller sends the new
                    # registration the whole state again).
                    return answered
                response.partitions.extend(answered.partitions)
            return response

    async def _create_new_logs(self, request: pb.LeaderAndIsrRequest) -> None:
        """The logs ``request`` creates (``ControlRequests.new_logs``), made in a worker
        thread while the loop serves: a topic's creation holds no other request up.
        Cancelled meanwhile (a stop), it waits for the thread before it ends, so no log is
        still being made when the caller goes on to close them."""
        new_logs = self.control.new_logs(request)
        if not new_logs:
            return  # no thread for a request that only moves epochs
        await _in_thread_to_its_end(self.control.create_logs, new_logs)

    def _leader_and_isr_slices(self, request: pb.LeaderAndIsrRequest) -> list[tuple[int, int]]:
        """``(start, end)`` of each slice, in order: a partition without a log here costs
        ``_NEW_PARTITION_COST``, one with a log 1, a slice at most LEADER_AND_ISR_SLICE_COST."""
        bounds: list[tuple[int, int]] = []
        start = cost = 0
        for i, item in enumerate(request.partitions):
            tp = TopicPartition(item.state.topic, item.state.partition)
            here = 1 if self.log_manager.get(tp) is not None else _NEW_PARTITION_COST
            if cost + here > LEADER_AND_ISR_SLICE_COST and i > start:
                bounds.append((start, i))
                start, cost = i, 0
            cost += here
        bounds.append((start, len(request.partitions)))
        return bounds

    async def stop_replica(self, request: pb.StopReplicaRequest) -> pb.StopReplicaResponse:
        """``control.stop_replicas`` on the loop, then the deleted logs' moves made durable
        in a worker thread (fsyncs of the data dir and the checkpoints) while the loop
        serves; answered once they are. Cancelled meanwhile, it waits for the thread."""
        async with self._control_lock:
            stopped = self.control.stop_replicas(request)
            failure: Exception | None = None
            if stopped.moved:
                try:
                    await _in_thread_to_its_end(self.log_manager.settle_deletions,
                                                stopped.moved)
                except Exception as e:  # answered: no deletion is sure
                    failure = e
            return self.control.answer_stop_replica(stopped, failure)

    async def update_metadata(self, request: pb.UpdateMetadataRequest
                              ) -> pb.UpdateMetadataResponse:
        async with self._control_lock:
            response = self.control.update_metadata(request)
        if response.error_code == pb.NONE:
            # A deleted topic's per-topic series go (the snapshot names every topic).
            self.metrics.topic_series.forget_topics_except(set(self.metadata_cache.topics()))
            # KIP-890's switch, a dynamic broker config as in Kafka.
            self.producer.verification_enabled = dynamic_flag(
                self.metadata_cache.broker_configs(), self.broker_id, TXN_VERIFICATION,
                self.config.transaction_partition_verification_enable)
            self.fetchers.quota.set_rate(follower_rate(self.metadata_cache.broker_configs(),
                                                       self.config.broker_id))
        return response

    def _follower_throttled(self, tp: TopicPartition) -> bool:
        """Is this broker's replica of ``tp`` in its topic's
        follower.replication.throttled.replicas?"""
        listed = self.metadata_cache.topic_configs(tp.topic).get(FOLLOWER_REPLICAS, "")
        return bool(listed) and is_throttled(listed, tp.partition, self.config.broker_id)

    async def produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        return await self.producer.produce(request)

    async def produce_append(self, request: pb.ProduceRequest, *,
                             internal_topics_allowed: bool = False
                             ) -> tuple[pb.ProduceResponse, Waits]:
        return await self.producer.append(request,
                                          internal_topics_allowed=internal_topics_allowed)

    def produce_watch(self, request: pb.ProduceRequest, response: pb.ProduceResponse,
                      waits: Waits, done: Callable[[pb.ProduceResponse], None]
                      ) -> Callable[[], None]:
        return self.producer.watch(request, response, waits, done)

    async def init_producer_id(self, request: pb.InitProducerIdRequest
                               ) -> pb.InitProducerIdResponse:
        return await self.producer_ids.init_producer_id(request)

    async def fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        return await self.fetcher_path.fetch(request)

    async def fetch_partitions(self, request: pb.FetchRequest,
                               session: FollowerSession | None = None
                               ) -> list[FetchedPartition]:
        """``fetch``'s answer as plain tuples (the records not copied into a message);
        ``session``: a ReplicaFetch stream's fetch session (``FetchPath.fetch_partitions``)."""
        return await self.fetcher_path.fetch_partitions(request, session)

    def list_offsets(self, request: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        return self.fetcher_path.list_offsets(request)

    def offset_for_leader_epoch(self, request: pb.OffsetForLeaderEpochRequest
                                ) -> pb.OffsetForLeaderEpochResponse:
        return self.fetcher_path.offset_for_leader_epoch(request)

    async def delete_records(self, wanted: list[tuple[str, int, int]], timeout_ms: int
                             ) -> list[DeleteRecordsResult]:
        """DeleteRecords for ``(topic, partition, offset)``s this broker leads
        (``serving/delete_records.py``): answered once the log starts are durable here
        and every ISR member's reached the offset (or ``timeout_ms`` passed)."""
        return await delete_records(wanted, timeout_ms, lookup=self._partition,
                                    carrier=self.carrier,
                                    checkpoint=self.background.checkpoint_log_start_offsets,
                                    acks_waits=self.acks_waits)

    def replica_fetch_session(self) -> ReplicaFetchSession:
        """A ReplicaFetch stream's fetch session, listening to this broker's partitions
        (its refreshes follow the lag time)."""
        return ReplicaFetchSession(self.fetch_waiters, self.config.replica_lag_time_max_ms)

    @property
    def controller_epoch(self) -> int:
        return self.control.controller_epoch

    @property
    def cluster_identity(self) -> ClusterIdentity:
        return self.control.cluster_identity

    @property
    def leader_endpoints(self) -> dict[int, tuple[str, int]]:
        return self.control.leader_endpoints

    # ================================================================ views

    def describe_replicas(self, request: pb.DescribeReplicasRequest) -> pb.DescribeReplicasResponse:
        wanted = set(request.topics)
        response = pb.DescribeReplicasResponse(broker_id=self.broker_id,
                                               log_dir=str(self.log_manager.data_dir))
        for tp in sorted(self.partitions):
            if wanted and tp.topic not in wanted:
                continue
            p = self.partitions[tp]
            response.replicas.add(
                topic=tp.topic, partition=tp.partition, is_leader=p.is_leader,
                leader_epoch=p.leader_epoch, log_start_offset=p.log.log_start_offset,
                log_end_offset=p.log_end_offset, high_watermark=p.high_watermark,
                size_bytes=p.log.size_bytes, isr=list(p.replica.leader_isr),
                last_stable_offset=last_stable_offset(p, p.high_watermark))
        return response

    def log_dir_partitions(self) -> list[tuple[TopicPartition, int, int]]:
        """DescribeLogDirs: each hosted replica's ``(tp, size in bytes, offset lag)``;
        the lag is Kafka's ``max(HW - LEO, 0)`` (0 for a leader, whose HW never passes
        its LEO)."""
        return [(tp, p.log.size_bytes, max(p.high_watermark - p.log_end_offset, 0))
                for tp, p in sorted(self.partitions.items())]

    def replica_snapshots(self) -> list[ReplicaSnapshot]:
        out = []
        for tp, p in list(self.partitions.items()):
            replica = p.replica
            isr = replica.leader_isr
            out.append(ReplicaSnapshot(
                topic=tp.topic, partition=tp.partition, log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark, log_start_offset=p.log.log_start_offset,
                leader_epoch=p.leader_epoch, isr_size=len(isr), is_leader=p.is_leader,
                under_replicated=p.is_leader and len(isr) < len(replica.replicas)))
        return out

    # ================================================================ internals

    def hosted_partition(self, topic: str, partition_index: int) -> Partition:
        """The replica hosted here (UnknownTopicOrPartitionError: none), led or not."""
        return self._partition(topic, partition_index)

    def _partition(self, topic: str, partition_index: int) -> Partition:
        # A plain tuple finds the TopicPartition key (a NamedTuple: same hash, equal). A hosted
        # partition's name was validated before it was created (ControlRequests), so only a
        # miss is validated: a bad name still answers INVALID_TOPIC_EXCEPTION, not
        # UNKNOWN_TOPIC_OR_PARTITION. A lookup is one dict probe on every fetch and produce.
        partition = self._partitions_by_pair.get((topic, partition_index))
        if partition is None:
            tp = TopicPartition(topic, partition_index)
            validate_topic_partition(tp)
            raise UnknownTopicOrPartitionError(f"{tp} is not hosted on broker {self.broker_id}")
        return partition

    def _forget_partition(self, tp: TopicPartition) -> None:
        partition = self.partitions.pop(tp, None)
        if partition is not None:
            self.fetchers.stop_following(partition)

    def _notify_readers(self, tp: TopicPartition, leadership_changed: bool,
                        high_watermark_moved: bool, appended: bool) -> None:
        """Wake the long-polls a Ready concerns: all of ``tp``'s when its leadership changed,
        else the consumers' on a HW move and the followers' on an append."""
        if leadership_changed:
            self.fetch_waiters.notify(tp)
            return
        if high_watermark_moved:
            self.fetch_waiters.notify_high_watermark(tp)
        if appended:
            self.fetch_waiters.notify_append(tp)

    def _count_decision(self, name: str) -> None:
        counter = self._named_decisions.get(name)
        if counter is not None:
            counter.inc()
        self.metrics.replication_decisions.labels(name).inc()

    def _on_wait_deadline(self, wait: AcksWait) -> None:
        partition = wait.partition
        self.carrier.apply(partition, partition.replica.on_wait_deadline(wait.waiter_id,
                                                                          mono_ms()))
