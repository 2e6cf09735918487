"""The shell of a coordinator over an internal topic (``__consumer_offsets`` for groups,
``__transaction_state`` for transactions): the topic's partitions in, one pure state per
partition, the broker's produce path out. ``PartitionedCoordinator`` is that shell once;
``GroupCoordinator`` (broker/group/coordinator.py) and ``TransactionCoordinator``
(broker/txn/coordinator.py) say what is their own: the topic, its settings, the state,
how a batch of the log is replayed and how a write is encoded.

A key's coordinator (a group id, a transactional id) is the leader of partition
``abs(java_string_hash(key)) % N`` of the topic (N: the topic's partition count, the
coordinator's configured count until the topic exists). The topic is created through
the controller on the first FindCoordinator that finds it missing, with the settings
the coordinator gives (compacted; replication factor capped at the live broker count),
as Kafka does.

Leadership: a supervised task looks every ``SCAN_INTERVAL_MS`` at the topic's partitions
this broker hosts. One it leads at a leader epoch it has not loaded is *loaded*: its log
is read from the start to the log end, each batch replayed into a fresh state, and only
then does it answer; meanwhile its keys' requests get COORDINATOR_LOAD_IN_PROGRESS. A
load that fails (a damaged log) is retried after ``LOAD_RETRY_MS``, not every scan. One
it no longer leads (or leads at a newer epoch) is dropped: the state is abandoned, its
waiting requests answer NOT_COORDINATOR and so do later ones, so the clients look the
coordinator up again. A request for a partition not led here while this broker's own
metadata names it the leader, or does not know the topic yet (another broker's newer
metadata sent the client ahead of the LeaderAndIsr), answers COORDINATOR_LOAD_IN_PROGRESS,
which clients retry. The same task ticks the loaded states (``maybe_tick``).

Writes: each ``Write`` of a Ready is one RecordBatch appended with acks=all through
``ReplicaManager.produce_append``/``produce_watch`` (the one produce path and its
purgatory), in the order the state made them (one lock per partition), and only while
the partition's leader epoch is still the loaded one; its outcome goes back to the
state (``on_write_done``), whose Ready carries the answers that waited for it.

Time: the states get the wall clock (``wall_ms``), as Kafka's coordinators do: the same
``now_ms`` stamps the records and runs the timers.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import BatchHeader, iter_batches
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.forwarded_principal import FORWARDED
from tidewater.proto.supervisor import TaskSupervisor

SCAN_INTERVAL_MS = 100
LOAD_READ_BYTES = 1 << 20
LOAD_RETRY_MS = 5000  # after a failed load (a damaged log): not every scan
# A FindCoordinator during the topic's creation or its partition's load waits this long
# at most for it, looking every FIRST_USE_POLL_S (``find_coordinator``).
FIRST_USE_WAIT_S = 10.0
FIRST_USE_POLL_S = 0.02


def first_use_deadline() -> float:
    """When a FindCoordinator asked now stops waiting, on the running loop's clock."""
    return asyncio.get_running_loop().time() + FIRST_USE_WAIT_S


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed."""
    h = 0
    raw = text.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partition_count: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitionCount`` (abs(MIN_VALUE) is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partition_count


class CoordinatorError(Exception):
    """The request cannot be served here (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE): the client finds the coordinator again or retries."""

    def __init__(self, error_code: pb.ErrorCode, message: str = ""):
        super().__init__(message or pb.ErrorCode.Name(error_code))
        self.error_code = error_code


@dataclass(frozen=True)
class CoordinatorNode:
    error_code: pb.ErrorCode
    node_id: int = -1
    host: str = ""
    port: int = -1
    message: str = ""


class CoordinatorWrite(Protocol):
    @property
    def write_id(self) -> int: ...


WriteT = TypeVar("WriteT", bound=CoordinatorWrite)
WriteT_co = TypeVar("WriteT_co", bound=CoordinatorWrite, covariant=True)


class CoordinatorReady(Protocol[WriteT_co]):
    """What the shell carries out of every state's Ready (a coordinator may carry more)."""

    @property
    def replies(self) -> Sequence[tuple[Any, Any]]: ...

    @property
    def writes(self) -> Sequence[WriteT_co]: ...


ReadyT = TypeVar("ReadyT", bound=CoordinatorReady[Any])
ReadyT_co = TypeVar("ReadyT_co", bound=CoordinatorReady[Any], covariant=True)


class CoordinatorState(Protocol[ReadyT_co]):
    def tick(self, now_ms: int) -> ReadyT_co: ...

    def abandon(self) -> ReadyT_co: ...

    def on_write_done(self, write_id: int, error_code: pb.ErrorCode,
                      now_ms: int) -> ReadyT_co: ...


StateT = TypeVar("StateT", bound=CoordinatorState[Any])
AnswerT = TypeVar("AnswerT")


@dataclass
class Shard(Generic[StateT]):
    partition: int
    leader_epoch: int
    state: StateT
    loaded: bool = False
    write_lock: asyncio.Lock | None = None
    # The state was abandoned (leadership lost, or its load failed): every write it had
    # in flight is already answered, so an append finishing later reports nothing.
    abandoned: bool = False


class PartitionedCoordinator(ABC, Generic[StateT, ReadyT, WriteT, AnswerT]):
    """The shell (see the module docstring); a subclass sets the class attributes and
    implements the hooks below the lifecycle."""

    topic: ClassVar[str]
    key_kind: ClassVar[str]  # "group", "transactional id": in NOT_COORDINATOR's message
    empty_key_error: ClassVar[pb.ErrorCode]  # FindCoordinator with an empty key
    empty_key_message: ClassVar[str]
    name: ClassVar[str]  # "group", "txn": names the supervised tasks
    create_task_name: ClassVar[str]
    entries_noun: ClassVar[str]  # "groups", "transactions": in the log lines
    write_noun: ClassVar[str]  # "a group write": in the log line of a failed write
    log: ClassVar[logging.Logger]

    def __init__(self, *, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller: ControllerForwarder, config: BrokerConfig,
                 supervisor: TaskSupervisor) -> None:
        self.replica_manager = replica_manager
        self.metadata_cache = metadata_cache
        self.controller = controller  # ControllerForwarder: CreateTopics
        self.config = config
        self.supervisor = supervisor  # the scan loop, the topic's creation, every write
        self.shards: dict[int, Shard[StateT]] = {}
        self._creating: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._load_retry_at: dict[int, int] = {}  # partition -> mono ms (a failed load)

    # ------------------------------------------------------------ hooks

    @abstractmethod
    def _new_state(self, leader_epoch: int) -> StateT:
        """A fresh state for a partition about to be loaded at ``leader_epoch``."""

    @abstractmethod
    def _configured_partition_count(self) -> int:
        """The partition count the topic is created with, and assumed until it exists."""

    @abstractmethod
    def _replication_factor(self) -> int:
        """The topic's replication factor, before the cap at the live broker count."""

    @abstractmethod
    def _topic_configs(self, replication_factor: int) -> dict[str, str]:
        """The topic's configs, given its (capped) replication factor."""

    @abstractmethod
    def _replay_batch(self, shard: Shard[StateT], data: bytes, position: int,
                      header: BatchHeader) -> tuple[int, int]:
        """Replay one batch of the log into ``shard.state``: (records replayed, skipped)."""

    @abstractmethod
    def _end_load(self, shard: Shard[StateT]) -> None:
        """The whole log is replayed; the shard is marked loaded right after."""

    @abstractmethod
    def _loaded_summary(self, state: StateT) -> str:
        """What a loaded state holds, for the log line ("3 groups")."""

    @abstractmethod
    def _encode_write(self, write: WriteT) -> bytes:
        """The RecordBatch a Write appends."""

    @abstractmethod
    def _write_timeout_ms(self) -> int:
        """The acks=all wait of a write."""

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._task = self.supervisor.spawn(self._run(), f"{self.name}-coordinator")

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
               if tp.topic == self.topic and p.is_leader}
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
                    self.log.exception("loading %s-%d failed; retrying in %d ms", self.topic,
                                       index, LOAD_RETRY_MS)
                    self._load_retry_at[index] = mono_ms() + LOAD_RETRY_MS
                    failed = self.shards.pop(index, None)
                    if failed is not None:
                        self._abandon(failed)
        self.maybe_tick()

    def maybe_tick(self) -> None:
        """Called after every scan; ticks every time unless a coordinator says otherwise."""
        self.tick()

    def tick(self) -> None:
        now = wall_ms()
        for shard in list(self.shards.values()):
            if shard.loaded and self.shards.get(shard.partition) is shard:
                self._carry_out(shard, shard.state.tick(now))

    def _drop(self, shard: Shard[StateT]) -> None:
        if self.shards.get(shard.partition) is shard:
            del self.shards[shard.partition]
        self.log.info("%s of %s-%d: no longer coordinator (epoch %d)", self.entries_noun,
                      self.topic, shard.partition, shard.leader_epoch)
        self._abandon(shard)

    def _abandon(self, shard: Shard[StateT]) -> None:
        """Answer what the state waits for (NOT_COORDINATOR) and forget its writes: an
        append still in flight must not report to it again (``_append``)."""
        shard.abandoned = True
        self._carry_out(shard, shard.state.abandon())

    async def _load(self, index: int, epoch: int) -> None:
        shard = Shard(index, epoch, self._new_state(epoch), write_lock=asyncio.Lock())
        self.shards[index] = shard
        started = mono_ms()
        partition = self.replica_manager.partitions.get(TopicPartition(self.topic, index))
        if partition is None:  # stopped since the scan listed it: the next scan drops the shard
            raise LookupError(f"{self.topic}-{index} is no longer a replica here")
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
                replayed, bad = self._replay_batch(shard, data, position, header)
                count += replayed
                skipped += bad
                offset = header.next_offset
            await asyncio.sleep(0)  # other requests go on between chunks
        self._end_load(shard)
        shard.loaded = True
        self.log.info("%s of %s-%d loaded at epoch %d: %d records (%d skipped), %s in %d ms",
                      self.entries_noun, self.topic, index, epoch, count, skipped,
                      self._loaded_summary(shard.state), mono_ms() - started)

    # ------------------------------------------------------------ routing

    def partition_count(self) -> int:
        count = 0
        while self.metadata_cache.partition_state(self.topic, count) is not None:
            count += 1
        return count or self._configured_partition_count()

    def shard_for(self, key: str) -> Shard[StateT]:
        """The loaded state coordinating ``key``; CoordinatorError when not here."""
        index = partition_for(key, self.partition_count())
        shard = self.shards.get(index)
        partition = self.replica_manager.partitions.get(TopicPartition(self.topic, index))
        if partition is None or not partition.is_leader:
            if self._leadership_on_its_way(index):
                raise CoordinatorError(pb.COORDINATOR_LOAD_IN_PROGRESS,
                                       f"{self.topic}-{index} is not led here yet")
            raise CoordinatorError(pb.NOT_COORDINATOR,
                                   f"not the coordinator of {self.key_kind} {key!r}")
        if shard is None or shard.leader_epoch != partition.leader_epoch or not shard.loaded:
            raise CoordinatorError(pb.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"{self.topic}-{index} is loading")
        return shard

    def _leadership_on_its_way(self, index: int) -> bool:
        """The partition is not led here, yet the metadata says it is, or does not know
        the topic yet: another broker sent the client here from newer metadata while
        this broker's LeaderAndIsr (or the topic itself) is still on its way. Answered
        COORDINATOR_LOAD_IN_PROGRESS, which clients retry here; NOT_COORDINATOR would
        fail librdkafka's ``committed()`` outright on a new cluster (it only looks the
        coordinator up again, and is told this broker)."""
        state = self.metadata_cache.partition_state(self.topic, index)
        return state is None or (state.leader == self.config.broker_id and not state.offline)

    async def find_coordinator(self, key: str, listener: str,
                               deadline: float | None = None) -> CoordinatorNode:
        """The key's coordinator. While the topic is being created, or this broker leads
        the key's partition and is still loading it, the answer waits for that, up to
        ``FIRST_USE_WAIT_S``: answered COORDINATOR_NOT_AVAILABLE at once, librdkafka's
        admin client retries twice 100 ms apart and then waits for a broker state change
        that never comes (its AlterConsumerGroupOffsets on a new cluster hung for its
        whole timeout once the topic's logs were made off the loop). A partition without
        a leader (its replicas down) is answered at once. At the bound the answer is what
        is known then. ``deadline`` (the loop's clock) is the request's own, when one
        request asks for several keys: they share one wait rather than one each."""
        if not key:
            return CoordinatorNode(self.empty_key_error, message=self.empty_key_message)
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = first_use_deadline()
        while True:
            creating = self.metadata_cache.partition_state(self.topic, 0) is None
            node = self._locate(key, listener, creating)
            if not (creating or self._loading_here(key, node)) or loop.time() >= deadline:
                return node
            await asyncio.sleep(FIRST_USE_POLL_S)

    def _loading_here(self, key: str, node: CoordinatorNode) -> bool:
        """``node`` is this broker and the key's partition is not loaded here yet."""
        if node.node_id != self.config.broker_id:
            return False
        try:
            self.shard_for(key)
        except CoordinatorError:
            return True
        return False

    def _locate(self, key: str, listener: str, creating: bool) -> CoordinatorNode:
        """The key's coordinator from the metadata; the topic's creation started if it
        is missing (``creating``: then COORDINATOR_NOT_AVAILABLE)."""
        if creating:
            self._maybe_create_topic()
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{self.topic} is being created")
        index = partition_for(key, self.partition_count())
        state = self.metadata_cache.partition_state(self.topic, index)
        endpoint = (self.metadata_cache.endpoint(state.leader, listener)
                    if state is not None and state.leader >= 0 and not state.offline else None)
        if state is None or endpoint is None:
            return CoordinatorNode(pb.COORDINATOR_NOT_AVAILABLE,
                                   message=f"{self.topic}-{index} has no leader")
        return CoordinatorNode(pb.NONE, state.leader, endpoint[0], endpoint[1])

    def _maybe_create_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return
        self._creating = self.supervisor.spawn(self._create_topic(), self.create_task_name)

    async def _create_topic(self) -> None:
        # The broker's own call (this task copied the context of the FindCoordinator
        # that spawned it): the controller must not check that client's rights.
        FORWARDED.set(None)
        live = len(self.metadata_cache.metadata_response([], "INTERNAL").brokers)
        replication = max(1, min(self._replication_factor(), live))
        request = pb.CreateTopicsRequest(timeout_ms=10_000)
        request.topics.add(
            name=self.topic, num_partitions=self._configured_partition_count(),
            replication_factor=replication, configs=self._topic_configs(replication))
        try:
            response = await self.controller.CreateTopics(request, None)
        except InvariantViolation:
            raise  # a bug: the supervisor stops the broker
        except Exception as e:  # retried by the next FindCoordinator
            self.log.warning("creating %s failed: %r", self.topic, e)
            return
        for r in response.topics:
            if r.error_code not in (pb.NONE, pb.TOPIC_ALREADY_EXISTS):
                self.log.warning("creating %s: %s %s", self.topic,
                                 pb.ErrorCode.Name(r.error_code), r.error_message)

    # ------------------------------------------------------------ requests

    def request(self, key: str, call: Callable[[StateT, Any, int], ReadyT]
                ) -> Awaitable[AnswerT]:
        """Run ``call(state, token, now_ms)`` on the key's state; the awaitable is the
        answer the Ready gives the token (now or after a write). CoordinatorError when
        the key is not coordinated here."""
        shard = self.shard_for(key)
        token: asyncio.Future[AnswerT] = asyncio.get_running_loop().create_future()
        self._carry_out(shard, call(shard.state, token, wall_ms()))
        return token

    # ------------------------------------------------------------ views across partitions

    def loaded_states(self) -> list[StateT]:
        return [s.state for s in self.shards.values() if s.loaded]

    def loading(self) -> bool:
        """Some partition led here is still loading (ListGroups says so)."""
        return any(not s.loaded for s in self.shards.values())

    # ------------------------------------------------------------ carrying out a Ready

    def _carry_out(self, shard: Shard[StateT], ready: ReadyT) -> None:
        for token, answer in ready.replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(answer)
        for write in ready.writes:
            self.supervisor.spawn(self._append(shard, write),
                                  f"{self.name}-write-{shard.partition}-{write.write_id}")

    async def _append(self, shard: Shard[StateT], write: WriteT) -> None:
        code: pb.ErrorCode | None = pb.UNKNOWN_SERVER_ERROR
        try:
            code = await self._append_acks_all(shard, write)
        except InvariantViolation:
            # Not answered (not even UNKNOWN_SERVER_ERROR): the supervisor stops the broker.
            code = None
            raise
        except Exception:
            self.log.exception("%s-%d: %s failed", self.topic, shard.partition,
                               self.write_noun)
        finally:
            # An abandoned state answered this write already (NOT_COORDINATOR); reporting
            # it again is the state's InvariantViolation.
            if code is not None and not shard.abandoned:
                self._carry_out(shard, shard.state.on_write_done(write.write_id, code, wall_ms()))

    async def _append_acks_all(self, shard: Shard[StateT], write: WriteT) -> pb.ErrorCode:
        rm = self.replica_manager
        batch = self._encode_write(write)
        request = pb.ProduceRequest(acks=-1, timeout_ms=self._write_timeout_ms())
        request.partitions.add(topic=self.topic, partition=shard.partition, records=batch)
        if shard.write_lock is None:
            raise InvariantViolation(f"{self.topic}-{shard.partition}: a shard without its "
                                     "write lock")
        async with shard.write_lock:  # appends in the order the state made them
            partition = rm.partitions.get(TopicPartition(self.topic, shard.partition))
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
