"""The transaction coordinator: ``__transaction_state`` partitions in, the pure
``TransactionCoordinatorState`` (state.py) per partition, the broker's produce path and
the marker port (markers.py) out. The shell (leadership, loading, routing, the topic's
creation, the write path) is ``PartitionedCoordinator``
(broker/coordination/partitioned.py), shared with the group coordinator; this module
says what is the transaction coordinator's own.

A transactional id's coordinator is the leader of partition
``abs(java_string_hash(transactional_id)) % N`` of ``__transaction_state`` (N: the
topic's partition count, ``transaction.state.log.num.partitions`` until it exists). The
topic is created through the controller on the first FindCoordinator with key type
TRANSACTION (compacted; replication factor ``transaction.state.log.replication.factor``
capped at the live broker count; ``min.insync.replicas`` from
``transaction.state.log.min.isr`` capped at that factor), as Kafka does.

Loading: a partition's log is replayed into a fresh state (whose coordinator epoch is
the leader epoch it is loaded at; control batches are skipped); then ``end_load`` sends
the markers of every transaction a previous coordinator left in
PrepareCommit/PrepareAbort. A dropped partition's marker tasks stop at their next
round. The scan ticks the loaded states only every
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` (timeouts, and ids idle
for ``transactional.id.expiration.ms`` expired with a tombstone).

Writes: each ``Write`` is one record in one RecordBatch; its acks=all wait is
``WRITE_TIMEOUT_MS``.

Time: the wall clock (``wall_ms``), as Kafka's: the same value stamps the records'
start and update times and runs the timeouts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.coordination.partitioned import (
    CoordinatorError,
    PartitionedCoordinator,
    Shard,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.storage.topics import TRANSACTION_STATE_TOPIC
from tidewater.broker.txn import records
from tidewater.broker.txn.markers import TxnMarkerSender, send_until_written
from tidewater.broker.txn.state import (
    Answer,
    InitPidAnswer,
    MarkerJob,
    Ready,
    TopicPartition,
    TransactionCoordinatorState,
    TxnMetadata,
    TxnSettings,
    Write,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import BatchHeader
from tidewater.proto.errors import InvariantViolation, TidewaterError
from tidewater.proto.records import decode_batch_records, encode_batch
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.txn")

WRITE_TIMEOUT_MS = 5000  # an acks=all wait for a transaction state write


class TransactionCoordinator(
        PartitionedCoordinator[TransactionCoordinatorState, Ready, Write, Answer]):
    topic = TRANSACTION_STATE_TOPIC
    key_kind = "transactional id"
    empty_key_error = pb.INVALID_REQUEST
    empty_key_message = "empty transactional id"
    name = "txn"
    create_task_name = "create-txn-state-topic"
    entries_noun = "transactions"
    write_noun = "a transaction state write"
    log = log

    def __init__(self, *, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller: ControllerForwarder, config: BrokerConfig,
                 supervisor: TaskSupervisor, marker_sender: TxnMarkerSender,
                 next_producer_id: Callable[[], Awaitable[int]]) -> None:
        # The supervisor also runs the marker tasks.
        super().__init__(replica_manager=replica_manager, metadata_cache=metadata_cache,
                         controller=controller, config=config, supervisor=supervisor)
        self.marker_sender = marker_sender
        self.next_producer_id = next_producer_id  # the broker's id blocks (producer_ids.py)
        self.settings = TxnSettings(
            transaction_max_timeout_ms=config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms)
        self._next_tick_ms = 0
        self._marker_tasks: set[asyncio.Task[None]] = set()  # cancelled by stop()

    # ------------------------------------------------------------ lifecycle

    async def stop(self) -> None:
        await super().stop()
        markers = list(self._marker_tasks)
        for task in markers:
            task.cancel()  # a marker loop may sleep for its back-off: not waited out
        await asyncio.gather(*markers, return_exceptions=True)

    def maybe_tick(self) -> None:
        if mono_ms() >= self._next_tick_ms:
            self._next_tick_ms = (mono_ms() + self.config
                                  .transaction_abort_timed_out_transaction_cleanup_interval_ms)
            self.tick()

    # ------------------------------------------------------------ the shell's hooks

    def _new_state(self, leader_epoch: int) -> TransactionCoordinatorState:
        return TransactionCoordinatorState(leader_epoch, self.settings)

    def _configured_partition_count(self) -> int:
        return self.config.transaction_state_log_num_partitions

    def _replication_factor(self) -> int:
        return self.config.transaction_state_log_replication_factor

    def _topic_configs(self, replication_factor: int) -> dict[str, str]:
        c = self.config
        return {"cleanup.policy": "compact",
                "segment.bytes": str(c.transaction_state_log_segment_bytes),
                "min.insync.replicas": str(min(c.transaction_state_log_min_isr,
                                               replication_factor))}

    def _replay_batch(self, shard: Shard[TransactionCoordinatorState], data: bytes,
                      position: int, header: BatchHeader) -> tuple[int, int]:
        count = skipped = 0
        if header.is_control:
            return count, skipped
        for record in decode_batch_records(data, position, header):
            try:
                shard.state.replay(records.decode(record.key, record.value))
                count += 1
            except records.TxnRecordError as e:
                skipped += 1
                log.warning("%s-%d offset %d: skipped: %s", TRANSACTION_STATE_TOPIC,
                            shard.partition, record.offset, e)
        return count, skipped

    def _end_load(self, shard: Shard[TransactionCoordinatorState]) -> None:
        self._carry_out(shard, shard.state.end_load(wall_ms()))

    def _loaded_summary(self, state: TransactionCoordinatorState) -> str:
        return f"{len(state.txns)} ids"

    def _encode_write(self, write: Write) -> bytes:
        return encode_batch([(records.encode_key(write.record),
                              records.encode_value(write.record))])

    def _write_timeout_ms(self) -> int:
        return WRITE_TIMEOUT_MS

    # ------------------------------------------------------------ requests

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

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[TopicPartition]
                          ) -> dict[TopicPartition, pb.ErrorCode]:
        """AddPartitionsToTxn with verify_only (KIP-890 part 1): each partition's code
        (``TransactionCoordinatorState.verify_partitions``); NOT_COORDINATOR or
        COORDINATOR_LOAD_IN_PROGRESS for all when the id is not coordinated here now."""
        if not transactional_id:
            return {tp: pb.INVALID_REQUEST for tp in partitions}
        try:
            shard = self.shard_for(transactional_id)
        except CoordinatorError as e:
            return {tp: e.error_code for tp in partitions}
        return shard.state.verify_partitions(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, partitions=partitions)

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        """The id's metadata (None: unknown); CoordinatorError when not coordinated here."""
        return self.shard_for(transactional_id).state.describe(transactional_id)

    # ------------------------------------------------------------ carrying out a Ready

    def _carry_out(self, shard: Shard[TransactionCoordinatorState], ready: Ready) -> None:
        super()._carry_out(shard, ready)
        for job in ready.markers:
            task = self.supervisor.spawn(
                self._send_markers(shard, job),
                f"txn-markers-{job.transactional_id}-{job.producer_epoch}")
            self._marker_tasks.add(task)
            task.add_done_callback(self._marker_tasks.discard)

    async def _send_markers(self, shard: Shard[TransactionCoordinatorState],
                            job: MarkerJob) -> None:
        def current() -> bool:
            return self.shards.get(shard.partition) is shard
        if await send_until_written(job, self.marker_sender, self.metadata_cache, current):
            if current():
                self._carry_out(shard, shard.state.on_markers_written(job, wall_ms()))
