"""The transaction coordinator's shell: ``__transaction_state`` partitions in, the pure
``TransactionCoordinatorState`` (state.py) per partition, the broker's produce path and
the marker port (markers.py) out. The same shape as the group coordinator's shell
(``broker/group/coordinator.py``).

A transactional id's coordinator is the leader of partition
``abs(java_string_hash(transactional_id)) % N`` of ``__transaction_state`` (N: the
topic's partition count, ``transaction.state.log.num.partitions`` until it exists). The
topic is created through the controller on the first FindCoordinator with key type
TRANSACTION (compacted; replication factor ``transaction.state.log.replication.factor``
capped at the live broker count; ``min.insync.replicas`` from
``transaction.state.log.min.isr`` capped at that factor), as Kafka does.

Leadership: a supervised task looks every ``SCAN_INTERVAL_MS`` at the partitions of
the topic this broker hosts. One it leads at a leader epoch it has not loaded is
*loaded*: its log is read from the start to the log end and replayed into a fresh state
(whose coordinator epoch is that leader epoch); then ``end_load`` sends the markers of
every transaction a previous coordinator left in PrepareCommit/PrepareAbort. Meanwhile
its ids' requests get COORDINATOR_LOAD_IN_PROGRESS. One it no longer leads is dropped:
waiting requests answer NOT_COORDINATOR, its marker tasks stop at their next round.
The same task ticks the loaded states every
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` (timeouts, and ids idle
for ``transactional.id.expiration.ms`` expired with a tombstone).

Writes: each ``Write`` is one record in one RecordBatch appended with acks=all through
``ReplicaManager.produce_append``/``produce_watch``, in the order the state made them
(one lock per partition), and only while the partition's leader epoch is the loaded
one; the outcome goes back to the state, whose Ready carries the answers that waited.

Time: the wall clock (``wall_ms``), as Kafka's: the same value stamps the records'
start and update times and runs the timeouts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.group.coordinator import CoordinatorError, CoordinatorNode, partition_for
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.storage.topics import TRANSACTION_STATE_TOPIC, TopicPartition
from tidewater.broker.txn import records
from tidewater.broker.txn.markers import TxnMarkerSender, send_until_written
from tidewater.broker.txn.state import (
    Answer,
    InitPidAnswer,
    MarkerJob,
    Ready,
    TransactionCoordinatorState,
    TxnMetadata,
    TxnSettings,
    Write,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches
from tidewater.proto.errors import InvariantViolation, TidewaterError
from tidewater.proto.records import decode_batch_records, encode_batch
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.txn")

SCAN_INTERVAL_MS = 100
LOAD_READ_BYTES = 1 << 20
LOAD_RETRY_MS = 5000  # after a failed load (a damaged log): not every scan
WRITE_TIMEOUT_MS = 5000  # an acks=all wait for a transaction state write


@dataclass
class _Shard:
    partition: int
    leader_epoch: int
    state: TransactionCoordinatorState
    loaded: bool = False
    write_lock: asyncio.Lock | None = None


class TransactionCoordinator:
    def __init__(self, *, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller: ControllerForwarder, config: BrokerConfig,
                 supervisor: TaskSupervisor, marker_sender: TxnMarkerSender,
                 next_producer_id: Callable[[], Awaitable[int]]) -> None:
        self.replica_manager = replica_manager
        self.metadata_cache = metadata_cache
        self.controller = controller  # ControllerForwarder: CreateTopics
        self.config = config
        self.supervisor = supervisor  # the scan loop, the topic's creation, writes, markers
        self.marker_sender = marker_sender
        self.next_producer_id = next_producer_id  # the broker's id blocks (producer_ids.py)
        self.settings = TxnSettings(
            transaction_max_timeout_ms=config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms)
        self.shards: dict[int, _Shard] = {}
        self._creating: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._load_retry_at: dict[int, int] = {}  # partition -> mono ms (a failed load)
        self._next_tick_ms = 0
        self._marker_tasks: set[asyncio.Task[None]] = set()  # cancelled by stop()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._task = self.supervisor.spawn(self._run(), "txn-coordinator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for shard in list(self.shards.values()):
            self._drop(shard)
        markers = list(self._marker_tasks)
        for task in markers:
            task.cancel()  # a marker loop may sleep for its back-off: not waited out
        await asyncio.gather(*markers, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.scan()
            await asyncio.sleep(SCAN_INTERVAL_MS / 1000)

    async def scan(self) -> None:
        """Load what this broker newly leads, drop what it lost, tick the rest."""
        rm = self.replica_manager
        led = {tp.partition: p.leader_epoch for tp, p in list(rm.partitions.items())
               if tp.topic == TRANSACTION_STATE_TOPIC and p.is_leader}
        for index, shard in list(self.shards.items()):
            if led.get(index) != shard.leader_epoch:
                self._drop(shard)
        for index, epoch in led.items():
            if index not in self.shards and mono_ms() >= self._load_retry_at.get(index, 0):
                try:
                    await self._load(index, epoch)
                except (InvariantViolation, asyncio.CancelledError):
                    raise
                except Exception:  # a damaged or moving log: not served; retried later
                    log.exception("loading %s-%d failed; retrying in %d ms",
                                  TRANSACTION_STATE_TOPIC, index, LOAD_RETRY_MS)
                    self._load_retry_at[index] = mono_ms() + LOAD_RETRY_MS
                    failed = self.shards.pop(index, None)
                    if failed is not None:
                        self._carry_out(failed, failed.state.abandon())
        if mono_ms() >= self._next_tick_ms:
            self._next_tick_ms = (mono_ms() + self.config
                                  .transaction_abort_timed_out_transaction_cleanup_interval_ms)
            self.tick()

    def tick(self) -> None:
        now = wall_ms()
        for shard in list(self.shards.values()):
            if shard.loaded and self.shards.get(shard.partition) is shard:
                self._carry_out(shard, shard.state.tick(now))

    def _drop(self, shard: _Shard) -> None:
        if self.shards.get(shard.partition) is shard:
            del self.shards[shard.partition]
        log.info("transactions of %s-%d: no longer coordinator (epoch %d)",
                 TRANSACTION_STATE_TOPIC, shard.partition, shard.leader_epoch)
        self._carry_out(shard, shard.state.abandon())

    async def _load(self, index: int, epoch: int) -> None:
        shard = _Shard(index, epoch, TransactionCoordinatorState(epoch, self.settings),
                       write_lock=asyncio.Lock())
        self.shards[index] = shard
        started = mono_ms()
        partition = self.replica_manager.partitions.get(
            TopicPartition(TRANSACTION_STATE_TOPIC, index))
        if partition is None:  # stopped since the scan listed it: the next scan drops it
            raise LookupError(f"{TRANSACTION_STATE_TOPIC}-{index} is no longer a replica here")
        count = skipped = 0
        offset = partition.log.log_start_offset
        while True:
            if self.shards.get(index) is not shard:
                return  # dropped while loading
            end = partition.log.log_end_offset
            if offset >= end:
                break
            chunk = partition.log.read(offset, LOAD_READ_BYTES, max_offset=end)
            if not chunk.records:
                break
            data = bytes(chunk.records)
            for position, header in iter_batches(data):
                if header.is_control:
                    offset = header.next_offset
                    continue
                for record in decode_batch_records(data, position, header):
                    try:
                        shard.state.replay(records.decode(record.key, record.value))
                        count += 1
                    except records.TxnRecordError as e:
                        skipped += 1
                        log.warning("%s-%d offset %d: skipped: %s", TRANSACTION_STATE_TOPIC,
                                    index, record.offset, e)
                offset = header.next_offset
            await asyncio.sleep(0)  # other requests go on between chunks
        shard.loaded = True
        log.info("transactions of %s-%d loaded at epoch %d: %d records (%d skipped), %d ids "
                 "in %d ms", TRANSACTION_STATE_TOPIC, index, epoch, count, skipped,
                 len(shard.state.txns), mono_ms() - started)
        self._carry_out(shard, shard.state.end_load(wall_ms()))

    # ------------------------------------------------------------ routing

    def partition_count(self) -> int:
        count = 0
        while self.metadata_cache.partition_state(TRANSACTION_STATE_TOPIC, count) is not None:
            count += 1
        return count or self.config.transaction_state_log_num_partitions

    def shard_for(self, transactional_id: str) -> _Shard:
        """The loaded state coordinating the id; CoordinatorError when not here."""
        index = partition_for(transactional_id, self.partition_count())
        shard = self.shards.get(index)
        partition = self.replica_manager.partitions.get(
            TopicPartition(TRANSACTION_STATE_TOPIC, index))
        if partition is None or not partition.is_leader:
            raise CoordinatorError(pb.NOT_COORDINATOR,
                                   f"not the coordinator of transactional id {transactional_id!r}")
        if shard is None or shard.leader_epoch != partition.leader_epoch or not shard.loaded:
            raise CoordinatorError(pb.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"{TRANSACTION_STATE_TOPIC}-{index} is loading")
        return shard

    async def find_coordinator(self, key: str, listener: str) -> CoordinatorNode:
        if not key:
            return CoordinatorNode(pb.INVALID_REQUEST, message="empty transactional id")
        if self.metadata_cache.partition_state(TRANSACTION_STATE_TOPIC, 0) is None:
            self._maybe_create_topic()
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{TRANSACTION_STATE_TOPIC} is being created")
        index = partition_for(key, self.partition_count())
        state = self.metadata_cache.partition_state(TRANSACTION_STATE_TOPIC, index)
        endpoint = (self.metadata_cache.endpoint(state.leader, listener)
                    if state is not None and state.leader >= 0 and not state.offline else None)
        if state is None or endpoint is None:
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{TRANSACTION_STATE_TOPIC}-{index} has no leader")
        return CoordinatorNode(pb.NONE, state.leader, endpoint[0], endpoint[1])

    def _maybe_create_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        self._creating = self.supervisor.spawn(self._create_topic(), "create-txn-state-topic")

    async def _create_topic(self) -> None:
        c = self.config
        live = len(self.metadata_cache.metadata_response([], "INTERNAL").brokers)
        replication = max(1, min(c.transaction_state_log_replication_factor, live))
        request = pb.CreateTopicsRequest(timeout_ms=10_000)
        request.topics.add(
            name=TRANSACTION_STATE_TOPIC, num_partitions=c.transaction_state_log_num_partitions,
            replication_factor=replication,
            configs={"cleanup.policy": "compact",
                     "segment.bytes": str(c.transaction_state_log_segment_bytes),
                     "min.insync.replicas": str(min(c.transaction_state_log_min_isr,
                                                    replication))})
        try:
            response = await self.controller.CreateTopics(request, None)
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # retried by the next FindCoordinator
            log.warning("creating %s failed: %r", TRANSACTION_STATE_TOPIC, e)
            return
        for r in response.topics:
            if r.error_code not in (pb.NONE, pb.TOPIC_ALREADY_EXISTS):
                log.warning("creating %s: %s %s", TRANSACTION_STATE_TOPIC,
                            pb.ErrorCode.Name(r.error_code), r.error_message)

    # ------------------------------------------------------------ requests

    def request(self, transactional_id: str,
                call: Callable[[TransactionCoordinatorState, Any, int], Ready]
                ) -> Awaitable[Answer]:
        """Run ``call(state, token, now_ms)`` on the id's state; the awaitable is the
        answer the Ready gives the token (now or after a write). CoordinatorError when
        the id is not coordinated here."""
        shard = self.shard_for(transactional_id)
        token: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._carry_out(shard, call(shard.state, token, wall_ms()))
        return token

    async def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int,
                               producer_id: int, producer_epoch: int) -> InitPidAnswer:
        """InitProducerId with a transactional id: a fresh producer id is taken first (the
        state uses it for a new id or an exhausted epoch; an unused one is skipped)."""
        try:
            self.shard_for(transactional_id)  # refuse early: no id spent on a wrong broker
            fresh = await self.next_producer_id()
            answer = await self.request(
                transactional_id, lambda state, token, now_ms: state.init_producer_id(
                    token, now_ms, transactional_id=transactional_id,
                    transaction_timeout_ms=transaction_timeout_ms, producer_id=producer_id,
                    producer_epoch=producer_epoch, fresh_producer_id=fresh))
        except (CoordinatorError, TidewaterError) as e:
            return InitPidAnswer(e.error_code)
        if not isinstance(answer, InitPidAnswer):
            raise InvariantViolation(f"InitProducerId answered with {answer!r}")
        return answer

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        """The id's metadata (None: unknown); CoordinatorError when not coordinated here."""
        return self.shard_for(transactional_id).state.describe(transactional_id)

    def loaded_states(self) -> list[TransactionCoordinatorState]:
        return [s.state for s in self.shards.values() if s.loaded]

    def loading(self) -> bool:
        return any(not s.loaded for s in self.shards.values())

    # ------------------------------------------------------------ carrying out a Ready

    def _carry_out(self, shard: _Shard, ready: Ready) -> None:
        for token, answer in ready.replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(answer)
        for write in ready.writes:
            self.supervisor.spawn(self._append(shard, write),
                                  f"txn-write-{shard.partition}-{write.write_id}")
        for job in ready.markers:
            task = self.supervisor.spawn(
                self._send_markers(shard, job),
                f"txn-markers-{job.transactional_id}-{job.producer_epoch}")
            self._marker_tasks.add(task)
            task.add_done_callback(self._marker_tasks.discard)

    async def _send_markers(self, shard: _Shard, job: MarkerJob) -> None:
        def current() -> bool:
            return self.shards.get(shard.partition) is shard
        if await send_until_written(job, self.marker_sender, self.metadata_cache, current):
            if current():
                self._carry_out(shard, shard.state.on_markers_written(job, wall_ms()))

    async def _append(self, shard: _Shard, write: Write) -> None:
        code: pb.ErrorCode | None = pb.UNKNOWN_SERVER_ERROR
        try:
            code = await self._append_acks_all(shard, write)
        except InvariantViolation:
            code = None  # not answered: the supervisor stops the broker
            raise
        except Exception:
            log.exception("%s-%d: a transaction state write failed", TRANSACTION_STATE_TOPIC,
                          shard.partition)
        finally:
            if code is not None:
                self._carry_out(shard, shard.state.on_write_done(write.write_id, code, wall_ms()))

    async def _append_acks_all(self, shard: _Shard, write: Write) -> pb.ErrorCode:
        rm = self.replica_manager
        batch = encode_batch([(records.encode_key(write.record),
                               records.encode_value(write.record))])
        request = pb.ProduceRequest(acks=-1, timeout_ms=WRITE_TIMEOUT_MS)
        request.partitions.add(topic=TRANSACTION_STATE_TOPIC, partition=shard.partition,
                               records=batch)
        if shard.write_lock is None:
            raise InvariantViolation(f"{TRANSACTION_STATE_TOPIC}-{shard.partition}: a shard "
                                     "without its write lock")
        async with shard.write_lock:  # appends in the order the state made them
            partition = rm.partitions.get(TopicPartition(TRANSACTION_STATE_TOPIC,
                                                         shard.partition))
            if (self.shards.get(shard.partition) is not shard or partition is None
                    or partition.leader_epoch != shard.leader_epoch):
                return pb.NOT_LEADER_OR_FOLLOWER
            response, waits = await rm.produce_append(request, internal_topics_allowed=True)
        if not waits:
            return response.partitions[0].error_code
        outcome: asyncio.Future[pb.ProduceResponse] = asyncio.get_running_loop().create_future()

        def settle(done: pb.ProduceResponse) -> None:
            if not outcome.done():
                outcome.set_result(done)
        withdraw = rm.produce_watch(request, response, waits, settle)
        try:
            return (await outcome).partitions[0].error_code
        finally:
            withdraw()
