"""The group coordinator: ``__consumer_offsets`` partitions in, the pure
``GroupCoordinatorState`` (state.py) per partition, the broker's produce path out. The
shell (leadership, loading, routing, the topic's creation, the write path) is
``PartitionedCoordinator`` (broker/coordination/partitioned.py); this module says what
is the group coordinator's own.

A group's coordinator is the leader of partition ``abs(java_string_hash(group)) % N`` of
``__consumer_offsets`` (N: the topic's partition count, ``offsets.topic.num.partitions``
until it exists). The topic is created through the controller on the first
FindCoordinator (compacted; replication factor ``offsets.topic.replication.factor``,
capped at the live broker count), as Kafka does. A loaded partition's log is replayed
record by record (records.py); the scan ticks the loaded states every time (session
timeouts, rebalance deadlines).

Time: the states get the wall clock (``wall_ms``), as Kafka's GroupCoordinator does:
the same ``now_ms`` stamps the records (commit and state timestamps are wall-clock
times in Kafka's formats) and runs the session and rebalance timers.

Writes: a ``Write`` carries group records; its acks=all wait is
``offsets.commit.timeout.ms``.

Transactional offsets (TxnOffsetCommit, issue 27): a ``Write`` with a ``producer`` is
appended as Kafka's coordinator does, a transactional batch of that producer id and
epoch without a sequence; once durable its offsets are *held* per producer id
(``GroupCoordinatorState.pending_txn_offsets``), invisible to OffsetFetch. The
transaction's marker makes them visible (COMMIT) or drops them (ABORT): at run time the
log side's WriteTxnMarkers, after appending the marker to an ``__consumer_offsets``
partition led here, calls ``complete_transaction(partition, producer_id, committed)``;
a loader meets the same marker in the log (a control batch whose record key is version
int16, type int16: 0 ABORT, 1 COMMIT) and applies it in log order, after the
transactional batches it closes. The log takes such a batch without a sequence
because it is the coordinator's own append (``coordinator_origin``).
"""

from __future__ import annotations

import logging

from tidewater.broker.clock import wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.coordination.partitioned import (
    CoordinatorError,
    CoordinatorNode,
    PartitionedCoordinator,
    Shard,
    java_string_hash,
    partition_for,
)
from tidewater.broker.group import records
from tidewater.broker.group.state import (
    Answer,
    GroupCoordinatorState,
    GroupSettings,
    Ready,
    Write,
)
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.storage.topics import CONSUMER_OFFSETS_TOPIC
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    TRANSACTIONAL_MASK,
    BatchHeader,
    set_producer_fields,
)
from tidewater.proto.records import decode_batch_records, encode_batch
from tidewater.proto.supervisor import TaskSupervisor

# Shared with the transaction coordinator; importers and tests know them from here.
__all__ = ["CoordinatorError", "CoordinatorNode", "GroupCoordinator", "OFFSETS_TOPIC",
           "control_marker_committed", "java_string_hash", "partition_for", "write_batch"]

log = logging.getLogger("tidewater.broker.group")

OFFSETS_TOPIC = CONSUMER_OFFSETS_TOPIC


def control_marker_committed(key: bytes | None) -> bool | None:
    """A control record's key (version int16, type int16: 0 ABORT, 1 COMMIT) as
    committed or not; None for another control type or a key that does not parse."""
    if key is None or len(key) < 4:
        return None
    kind = int.from_bytes(key[2:4], "big", signed=True)
    return {0: False, 1: True}.get(kind)


def write_batch(write: Write) -> bytes:
    """The RecordBatch of a Write: plain, or for TxnOffsetCommit Kafka's transactional
    batch of the producer id and epoch with no sequence (a coordinator's append)."""
    pairs = [(records.encode_key(r), records.encode_value(r)) for r in write.records]
    if write.producer is None:
        return encode_batch(pairs)
    producer_id, producer_epoch = write.producer
    built = bytearray(encode_batch(pairs, producer_id=producer_id,
                                   producer_epoch=producer_epoch))
    attributes = int.from_bytes(built[ATTRIBUTES_OFFSET:ATTRIBUTES_OFFSET + 2], "big")
    built[ATTRIBUTES_OFFSET:ATTRIBUTES_OFFSET + 2] = (
        attributes | TRANSACTIONAL_MASK).to_bytes(2, "big")
    set_producer_fields(built, producer_id, producer_epoch, -1)  # rewrites the CRC
    return bytes(built)


class GroupCoordinator(PartitionedCoordinator[GroupCoordinatorState, Ready, Write, Answer]):
    topic = OFFSETS_TOPIC
    key_kind = "group"
    empty_key_error = pb.INVALID_GROUP_ID
    empty_key_message = "empty group id"
    name = "group"
    create_task_name = "create-offsets-topic"
    entries_noun = "groups"
    write_noun = "a group write"
    log = log

    def __init__(self, *, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller: ControllerForwarder, config: BrokerConfig,
                 supervisor: TaskSupervisor,
                 settings: GroupSettings | None = None) -> None:
        super().__init__(replica_manager=replica_manager, metadata_cache=metadata_cache,
                         controller=controller, config=config, supervisor=supervisor)
        self.settings = settings or GroupSettings(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms)

    # ------------------------------------------------------------ the shell's hooks

    def _new_state(self, leader_epoch: int) -> GroupCoordinatorState:
        return GroupCoordinatorState(self.settings)

    def _configured_partition_count(self) -> int:
        return self.config.offsets_topic_num_partitions

    def _replication_factor(self) -> int:
        return self.config.offsets_topic_replication_factor

    def _topic_configs(self, replication_factor: int) -> dict[str, str]:
        return {"cleanup.policy": "compact", "segment.bytes": str(100 * (1 << 20))}

    def _replay_batch(self, shard: Shard[GroupCoordinatorState], data: bytes, position: int,
                      header: BatchHeader) -> tuple[int, int]:
        count = skipped = 0
        if header.is_control:
            for marker in decode_batch_records(data, position, header):
                committed = control_marker_committed(marker.key)
                if committed is not None:
                    shard.state.complete_txn(header.producer_id, committed)
            return count, skipped
        transactional = bool(header.attributes & TRANSACTIONAL_MASK)
        for record in decode_batch_records(data, position, header):
            try:
                decoded = records.decode(record.key, record.value)
                if transactional and isinstance(decoded, records.OffsetCommitRecord):
                    shard.state.replay_txn_offset(decoded, header.producer_id)
                else:
                    shard.state.replay(decoded, wall_ms())
                count += 1
            except records.GroupRecordError as e:
                skipped += 1
                log.warning("%s-%d offset %d: skipped: %s", OFFSETS_TOPIC, shard.partition,
                            record.offset, e)
        return count, skipped

    def _end_load(self, shard: Shard[GroupCoordinatorState]) -> None:
        shard.state.end_load(wall_ms())

    def _loaded_summary(self, state: GroupCoordinatorState) -> str:
        return f"{len(state.groups)} groups"

    def _encode_write(self, write: Write) -> bytes:
        return write_batch(write)

    def _write_timeout_ms(self) -> int:
        return self.config.offsets_commit_timeout_ms

    # ------------------------------------------------------------ requests

    def now(self, group_id: str) -> tuple[GroupCoordinatorState, int,
                                          Shard[GroupCoordinatorState]]:
        shard = self.shard_for(group_id)
        return shard.state, wall_ms(), shard

    def carry_out(self, shard: Shard[GroupCoordinatorState], ready: Ready) -> None:
        self._carry_out(shard, ready)

    def complete_transaction(self, partition: int, producer_id: int, committed: bool) -> None:
        """The COMMIT or ABORT marker of ``producer_id``'s transaction is durable in
        ``__consumer_offsets-<partition>`` (led here): its TxnOffsetCommit offsets become
        visible or are dropped. The log side's WriteTxnMarkers calls this on the
        partition's leader after the marker's append (Kafka's
        ``GroupCoordinator.scheduleHandleTxnCompletion``); a loader gets the same from the
        marker in the log."""
        shard = self.shards.get(partition)
        if shard is not None and shard.loaded:
            shard.state.complete_txn(producer_id, committed)
