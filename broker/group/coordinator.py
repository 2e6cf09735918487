"""The group coordinator's shell: ``__consumer_offsets`` partitions in, the pure
``GroupCoordinatorState`` (state.py) per partition, the broker's produce path out.

A group's coordinator is the leader of partition ``abs(java_string_hash(group)) % N`` of
``__consumer_offsets`` (N: the topic's partition count, ``offsets.topic.num.partitions``
until it exists). The topic is created through the controller on the first
FindCoordinator (compacted; replication factor ``offsets.topic.replication.factor``,
capped at the live broker count), as Kafka does.

Leadership: a supervised task looks every ``SCAN_INTERVAL_MS`` at the offsets
partitions this broker hosts. One it leads at a leader epoch it has not loaded is
*loaded*: its log is read from the start to the log end and replayed (records.py)
into a fresh state, and only then does it answer; meanwhile its groups'
requests get COORDINATOR_LOAD_IN_PROGRESS. One it no longer leads (or leads at a
newer epoch) is dropped: waiting requests answer NOT_COORDINATOR and so do later
ones, so the clients look the coordinator up again. The same task ticks the loaded
states (session timeouts, rebalance deadlines).

Time: the states get the wall clock (``wall_ms``), as Kafka's GroupCoordinator does:
the same ``now_ms`` stamps the records (commit and state timestamps are wall-clock
times in Kafka's formats) and runs the session and rebalance timers.

Writes: each ``Write`` of a Ready is one RecordBatch appended with acks=all through
``ReplicaManager.produce_append``/``produce_watch`` (the one produce path and its
purgatory), in the order the state made them (one lock per partition), and only if
the partition's leader epoch is still the loaded one; its outcome goes back to the
state, whose Ready carries the answers that waited for it.

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

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
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
from tidewater.broker.storage.topics import CONSUMER_OFFSETS_TOPIC, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    TRANSACTIONAL_MASK,
    iter_batches,
    set_producer_fields,
)
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.forwarded_principal import FORWARDED
from tidewater.proto.records import decode_batch_records, encode_batch
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.group")

OFFSETS_TOPIC = CONSUMER_OFFSETS_TOPIC
SCAN_INTERVAL_MS = 100
LOAD_READ_BYTES = 1 << 20
LOAD_RETRY_MS = 5000  # after a failed load (a damaged log): not every scan


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed."""
    h = 0
    raw = text.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


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


def partition_for(group_id: str, partition_count: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % partitionCount`` (abs(MIN_VALUE) is 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partition_count


class CoordinatorError(Exception):
    """The request cannot be served here (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE): the client finds the coordinator again or retries."""

    def __init__(self, error_code: pb.ErrorCode, message: str = ""):
        super().__init__(message or pb.ErrorCode.Name(error_code))
        self.error_code = error_code


@dataclass
class _Shard:
    partition: int
    leader_epoch: int
    state: GroupCoordinatorState
    loaded: bool = False
    write_lock: asyncio.Lock | None = None


@dataclass(frozen=True)
class CoordinatorNode:
    error_code: pb.ErrorCode
    node_id: int = -1
    host: str = ""
    port: int = -1
    message: str = ""


class GroupCoordinator:
    def __init__(self, *, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller: ControllerForwarder, config: BrokerConfig,
                 supervisor: TaskSupervisor,
                 settings: GroupSettings | None = None) -> None:
        self.replica_manager = replica_manager
        self.metadata_cache = metadata_cache
        self.controller = controller  # ControllerForwarder: CreateTopics
        self.config = config
        self.supervisor = supervisor  # the scan loop, the topic's creation, every write
        self.settings = settings or GroupSettings(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms)
        self.shards: dict[int, _Shard] = {}
        self._creating: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._load_retry_at: dict[int, int] = {}  # partition -> mono ms (a failed load)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._task = self.supervisor.spawn(self._run(), "group-coordinator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for shard in list(self.shards.values()):
            self._drop(shard)

    async def _run(self) -> None:
        while True:
            await self.scan()
            await asyncio.sleep(SCAN_INTERVAL_MS / 1000)

    async def scan(self) -> None:
        """Load what this broker newly leads, drop what it lost, tick the rest."""
        rm = self.replica_manager
        led = {tp.partition: p.leader_epoch for tp, p in list(rm.partitions.items())
               if tp.topic == OFFSETS_TOPIC and p.is_leader}
        for index, shard in list(self.shards.items()):
            if led.get(index) != shard.leader_epoch:
                self._drop(shard)
        for index, epoch in led.items():
            if index not in self.shards and mono_ms() >= self._load_retry_at.get(index, 0):
                try:
                    await self._load(index, epoch)
                except (InvariantViolation, asyncio.CancelledError):
                    raise
                except Exception:  # a damaged or moving log: not served; the next scan retries
                    log.exception("loading %s-%d failed; retrying in %d ms", OFFSETS_TOPIC,
                                  index, LOAD_RETRY_MS)
                    self._load_retry_at[index] = mono_ms() + LOAD_RETRY_MS
                    failed = self.shards.pop(index, None)
                    if failed is not None:
                        self._carry_out(failed, failed.state.abandon())
        now = wall_ms()
        for shard in list(self.shards.values()):
            if shard.loaded and self.shards.get(shard.partition) is shard:
                self._carry_out(shard, shard.state.tick(now))

    def _drop(self, shard: _Shard) -> None:
        if self.shards.get(shard.partition) is shard:
            del self.shards[shard.partition]
        log.info("groups of %s-%d: no longer coordinator (epoch %d)", OFFSETS_TOPIC,
                 shard.partition, shard.leader_epoch)
        self._carry_out(shard, shard.state.abandon())

    async def _load(self, index: int, epoch: int) -> None:
        shard = _Shard(index, epoch, GroupCoordinatorState(self.settings),
                       write_lock=asyncio.Lock())
        self.shards[index] = shard
        started = mono_ms()
        partition = self.replica_manager.partitions.get(TopicPartition(OFFSETS_TOPIC, index))
        if partition is None:  # stopped since the scan listed it: the next scan drops the shard
            raise LookupError(f"{OFFSETS_TOPIC}-{index} is no longer a replica here")
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
                    for marker in decode_batch_records(data, position, header):
                        committed = control_marker_committed(marker.key)
                        if committed is not None:
                            shard.state.complete_txn(header.producer_id, committed)
                    offset = header.next_offset
                    continue
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
                        log.warning("%s-%d offset %d: skipped: %s", OFFSETS_TOPIC, index,
                                    record.offset, e)
                offset = header.next_offset
            await asyncio.sleep(0)  # other requests go on between chunks
        shard.state.end_load(wall_ms())
        shard.loaded = True
        log.info("groups of %s-%d loaded at epoch %d: %d records (%d skipped), %d groups "
                 "in %d ms", OFFSETS_TOPIC, index, epoch, count, skipped,
                 len(shard.state.groups), mono_ms() - started)

    # ------------------------------------------------------------ routing

    def partition_count(self) -> int:
        parts = [p for t, p in self._offsets_partitions()]
        return len(parts) or self.config.offsets_topic_num_partitions

    def _offsets_partitions(self) -> list[tuple[str, int]]:
        state = self.metadata_cache
        count = 0
        while state.partition_state(OFFSETS_TOPIC, count) is not None:
            count += 1
        return [(OFFSETS_TOPIC, i) for i in range(count)]

    def shard_for(self, group_id: str) -> _Shard:
        """The loaded state coordinating ``group_id``; CoordinatorError when not here."""
        index = partition_for(group_id, self.partition_count())
        shard = self.shards.get(index)
        partition = self.replica_manager.partitions.get(TopicPartition(OFFSETS_TOPIC, index))
        if partition is None or not partition.is_leader:
            raise CoordinatorError(pb.NOT_COORDINATOR,
                                   f"not the coordinator of group {group_id!r}")
        if shard is None or shard.leader_epoch != partition.leader_epoch or not shard.loaded:
            raise CoordinatorError(pb.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"{OFFSETS_TOPIC}-{index} is loading")
        return shard

    async def find_coordinator(self, key: str, listener: str) -> CoordinatorNode:
        if not key:
            return CoordinatorNode(pb.INVALID_GROUP_ID, message="empty group id")
        if self.metadata_cache.partition_state(OFFSETS_TOPIC, 0) is None:
            self._maybe_create_topic()
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{OFFSETS_TOPIC} is being created")
        index = partition_for(key, self.partition_count())
        state = self.metadata_cache.partition_state(OFFSETS_TOPIC, index)
        endpoint = (self.metadata_cache.endpoint(state.leader, listener)
                    if state is not None and state.leader >= 0 and not state.offline else None)
        if state is None or endpoint is None:
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{OFFSETS_TOPIC}-{index} has no leader")
        return CoordinatorNode(pb.NONE, state.leader, endpoint[0], endpoint[1])

    def _maybe_create_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        self._creating = self.supervisor.spawn(self._create_topic(), "create-offsets-topic")

    async def _create_topic(self) -> None:
        # The broker's own call (this task copied the context of the FindCoordinator
        # that spawned it): the controller must not check that client's rights.
        FORWARDED.set(None)
        live = len(self.metadata_cache.metadata_response([], "INTERNAL").brokers)
        request = pb.CreateTopicsRequest(timeout_ms=10_000)
        request.topics.add(
            name=OFFSETS_TOPIC, num_partitions=self.config.offsets_topic_num_partitions,
            replication_factor=max(1, min(self.config.offsets_topic_replication_factor, live)),
            configs={"cleanup.policy": "compact", "segment.bytes": str(100 * (1 << 20))})
        try:
            response = await self.controller.CreateTopics(request, None)
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # retried by the next FindCoordinator
            log.warning("creating %s failed: %r", OFFSETS_TOPIC, e)
            return
        for r in response.topics:
            if r.error_code not in (pb.NONE, pb.TOPIC_ALREADY_EXISTS):
                log.warning("creating %s: %s %s", OFFSETS_TOPIC,
                            pb.ErrorCode.Name(r.error_code), r.error_message)

    # ------------------------------------------------------------ carrying out a Ready

    def request(self, group_id: str, call: Callable[[GroupCoordinatorState, Any, int], Ready]
                ) -> Awaitable[Answer]:
        """Run ``call(state, token, now_ms)`` on the group's state; the awaitable is the
        answer the Ready gives the token (now or after a write). CoordinatorError when
        the group is not coordinated here."""
        shard = self.shard_for(group_id)
        token: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._carry_out(shard, call(shard.state, token, wall_ms()))
        return token

    def now(self, group_id: str) -> tuple[GroupCoordinatorState, int, _Shard]:
        shard = self.shard_for(group_id)
        return shard.state, wall_ms(), shard

    def carry_out(self, shard: _Shard, ready: Ready) -> None:
        self._carry_out(shard, ready)

    def _carry_out(self, shard: _Shard, ready: Ready) -> None:
        for token, answer in ready.replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(answer)
        for write in ready.writes:
            self.supervisor.spawn(self._append(shard, write),
                                  f"group-write-{shard.partition}-{write.write_id}")

    async def _append(self, shard: _Shard, write: Write) -> None:
        code: pb.ErrorCode | None = pb.UNKNOWN_SERVER_ERROR
        try:
            code = await self._append_acks_all(shard, write)
        except InvariantViolation:
            # Not answered (not even UNKNOWN_SERVER_ERROR): the supervisor stops the broker.
            code = None
            raise
        except Exception:
            log.exception("%s-%d: a group write failed", OFFSETS_TOPIC, shard.partition)
        finally:
            if code is not None:
                self._carry_out(shard, shard.state.on_write_done(write.write_id, code, wall_ms()))

    async def _append_acks_all(self, shard: _Shard, write: Write) -> pb.ErrorCode:
        rm = self.replica_manager
        batch = write_batch(write)
        request = pb.ProduceRequest(acks=-1, timeout_ms=self.config.offsets_commit_timeout_ms)
        request.partitions.add(topic=OFFSETS_TOPIC, partition=shard.partition, records=batch)
        if shard.write_lock is None:
            raise InvariantViolation(f"{OFFSETS_TOPIC}-{shard.partition}: a shard without its write lock")
        async with shard.write_lock:  # appends in the order the state made them
            partition = rm.partitions.get(TopicPartition(OFFSETS_TOPIC, shard.partition))
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

    # ------------------------------------------------------------ views across partitions

    def loaded_states(self) -> list[GroupCoordinatorState]:
        return [s.state for s in self.shards.values() if s.loaded]

    def loading(self) -> bool:
        """Some offsets partition led here is still loading (ListGroups says so)."""
        return any(not s.loaded for s in self.shards.values())
