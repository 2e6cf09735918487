"""The one produce path: validate, append as leader, wait for the HW when acks=all.

Every produce (unary ``Produce``, ``ProduceStream``) goes through
``ProducePath.append`` and then, for acks=all, waits its partitions' outcomes:

- ``append``: per partition, synchronously: the core's ``check_append``
  (not the leader: NOT_LEADER_OR_FOLLOWER; acks=all under the minimum ISR:
  NOT_ENOUGH_REPLICAS, nothing written), the log append stamped with the
  leader epoch, then ``on_local_append`` with an acks=all wait opened right
  there, so the wait is bound to the leadership the records were appended
  under: a leadership that ends before the records commit fails it, even if
  this broker leads again by the time a later partition of the same request
  was appended (issue 14, bug 4);
- ``wait`` (a coroutine) or ``watch`` (a callback, for ProduceStream): the
  outcome of every acks=all partition written into the response.

Transactional batches (KIP-890 part 1, ``broker/txn/verification.py``): before the
appends, each partition whose batch would open a transaction (its producer has none
open there at that epoch) and is not verified yet is checked with the transaction
coordinator in one call (``verify``: the request's transactional id, the partitions);
refused ones are answered and not appended. Right before each append (no ``await`` in
between) a batch that would open a transaction must be verified, else it is refused
with INVALID_TXN_STATE (a request without a transactional id included). The broker's
own appends (``internal_topics_allowed``) are not checked.

A topic with ``compression.type`` other than ``producer`` or a KIP-937 timestamp bound
has its batches checked and rewritten into the topic's codec before the append
(``proto/leader_batches.py``); other topics' batches are appended as sent.

A request's partitions are appended in its order, and a stream's requests in
arrival order (ProduceStream awaits ``append`` for request N before reading
request N+1; each partition's append and decision run without an ``await`` between
them, so no lock is needed).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tidewater.broker.clock import mono_ms, wall_ms
from tidewater.broker.error_mapping import error_code_for, wire_code
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.replica import acks_all_wait_ms
from tidewater.broker.serving.purgatory import AcksWait, AcksWaits
from tidewater.broker.storage.log import AppendInfo
from tidewater.broker.storage.topics import COORDINATOR_TOPICS
from tidewater.broker.txn.verification import (
    TopicPartition,
    VerificationCache,
    VerificationEntry,
    produce_error,
    transactional_producer,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches
from tidewater.proto.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequiredAcksError,
    InvalidTopicError,
    KafkaStorageError,
    TidewaterError,
)
from tidewater.proto.leader_batches import leader_batches
from tidewater.proto.records import decode_batch_records

ACKS_TIMEOUT_DEFAULT_MS = 30_000

# The transaction coordinator's verify_only AddPartitionsToTxn (KIP-890): (transactional
# id, producer id, epoch, partitions) -> each partition's code.
VerifyTxn = Callable[[str, int, int, list[TopicPartition]],
                     Awaitable[dict[TopicPartition, pb.ErrorCode]]]


def produce_error_response(request: pb.ProduceRequest, e: Exception, *,
                           context: str) -> pb.ProduceResponse:
    """Every partition of ``request`` answered with the error ``e`` maps to (none appended)."""
    code, message = error_code_for(e, context=context)
    return pb.ProduceResponse(correlation_id=request.correlation_id, partitions=[
        pb.ProducePartitionResponse(topic=data.topic, partition=data.partition, error_code=code,
                                    error_message=message, base_offset=-1)
        for data in request.partitions])


def _set_acks_all_outcome(result: pb.ProducePartitionResponse, code: int) -> None:
    """Write an acks=all wait's outcome (the core's code) into its partition's answer."""
    if code != pb.NONE:
        result.error_code = wire_code(code)
        result.error_message = pb.ErrorCode.Name(code)
        if code != pb.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            # Not acknowledged: the records may still commit or vanish.
            result.base_offset = -1


def acks_timeout_ms(request: pb.ProduceRequest) -> int:
    """The request's acks=all wait: its timeout_ms (30 s if unset), bounded by the core
    (``acks_all_wait_ms``: at most 120 s)."""
    return acks_all_wait_ms(request.timeout_ms if request.timeout_ms > 0
                            else ACKS_TIMEOUT_DEFAULT_MS)


Waits = list[tuple[pb.ProducePartitionResponse, AcksWait]]
W = TypeVar("W", bound="OpenWait")


class OpenWait(Protocol):
    @property
    def waiter_id(self) -> int: ...


def append_as_leader(partition: Partition, records: Any, acks: int, timeout_ms: int, *,
                     open_wait: Callable[[Partition, int], W], carrier: ReadyCarrier,
                     now_ms: int, wall_now_ms: int, markers_allowed: bool = False,
                     coordinator_origin: bool = False) -> tuple[Any, W | None]:
    """Append ``records`` as ``partition``'s leader and let its core decide on the new log
    end: the core's check first (nothing written when refused), the append stamped with
    the leader epoch, an acks=all wait opened right there (so it is bound to the
    leadership the records were appended under), then the Ready carried out. The broker
    and the simulation both append through here; returns (the log's append info, the
    wait or None). ``markers_allowed``: the transaction coordinator's markers
    (``txn_markers.py``); a client's control batch is refused. ``coordinator_origin``:
    the group coordinator's own batches (a transactional one needs no sequence)."""
    replica = partition.replica
    leader_epoch = replica.check_append(acks)  # nothing written when refused
    try:
        info = partition.log.append_as_leader(records, leader_epoch, wall_now_ms,
                                              markers_allowed=markers_allowed,
                                              coordinator_origin=coordinator_origin)
    except KafkaStorageError:
        # The log dir failed under the append: the core decides what this replica plays
        # now (nothing), and the waits of its leadership are answered.
        carrier.apply(partition, replica.on_leader_append_failure(now_ms))
        raise
    wait = None
    if acks == -1:
        wait = open_wait(partition, timeout_ms)
        ready = replica.on_local_append(
            partition.log.log_end_offset, now_ms, waiter_id=wait.waiter_id,
            required_offset=info.last_offset + 1, timeout_ms=timeout_ms)
    else:
        ready = replica.on_local_append(partition.log.log_end_offset, now_ms)
    carrier.apply(partition, ready)
    return info, wait


class ProducePath:
    def __init__(self, *, lookup: Callable[[str, int], Partition], carrier: ReadyCarrier,
                 acks_waits: AcksWaits, metrics: BrokerMetrics,
                 verification: VerificationCache | None = None):
        """``verification``: transactional batches are verified (KIP-890) with the cache's
        entries and ``verify`` (set by the broker once its transaction coordinator
        exists; None: nothing can be verified, a batch opening a transaction is
        refused) while ``verification_enabled``
        (``transaction.partition.verification.enable``, dynamic); None: never."""
        self.verification = verification
        self.verification_enabled = verification is not None
        self.verify: VerifyTxn | None = None
        self._lookup = lookup
        self._carrier = carrier
        self._waits = acks_waits
        self._metrics = metrics
        self._messages_in = metrics.messages_in
        self._bytes_in = metrics.bytes_in
        self._topic_series = metrics.topic_series
        self._topic_produced = metrics.topic_series.produced  # topic -> (bytes, messages)

    async def produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        response, waits = await self.append(request)
        if waits:
            await self.wait(waits)
        return response

    async def append(self, request: pb.ProduceRequest, *, internal_topics_allowed: bool = False
                     ) -> tuple[pb.ProduceResponse, Waits]:
        """Validate and append every partition's records now (see the module docstring).
        Only the broker's own writers (the group coordinator) may append to an internal
        topic (``internal_topics_allowed``); clients get INVALID_TOPIC_EXCEPTION.

        Returns the response (final unless acks=all) and the acks=all waits."""
        acks = request.acks
        response = pb.ProduceResponse(correlation_id=request.correlation_id)
        if acks not in (0, 1, -1):
            return produce_error_response(request, InvalidRequiredAcksError(
                f"acks must be 0, 1 or -1 (all), got {acks}"), context="Produce"), []
        waits: Waits = []
        timeout_ms = acks_timeout_ms(request) if acks == -1 else 0
        verifying = (self.verification_enabled and self.verification is not None
                     and not internal_topics_allowed)
        refusals = await self._verify(request) if verifying else {}
        for data in request.partitions:
            topic, partition_index = data.topic, data.partition  # each access is a call
            result = response.partitions.add(topic=topic, partition=partition_index,
                                             error_code=pb.NONE, base_offset=-1)
            try:
                if topic in COORDINATOR_TOPICS and not internal_topics_allowed:
                    raise InvalidTopicError(f"{topic} is internal: clients cannot produce to it")
                partition = self._lookup(topic, partition_index)
                config = partition.log.config
                result.batch_bytes_max = min(config.max_message_bytes, config.segment_bytes)
                if verifying:
                    refused = refusals.get((topic, partition_index))
                    if refused is not None:
                        raise refused
                    self._check_verified(partition, topic, partition_index, data.records)
                info, wait = await self._append_as_leader(
                    partition, topic, data.records, acks, timeout_ms,
                    coordinator_origin=internal_topics_allowed)
                result.base_offset = info.first_offset
                result.log_append_time_ms = info.log_append_time_ms
                result.log_start_offset = partition.log.log_start_offset
                if wait is not None:
                    waits.append((result, wait))
            except Exception as e:  # the one boundary: a typed error per partition
                code, message = error_code_for(e, context="Produce")
                result.error_code, result.error_message = code, message
                result.base_offset = -1
                if isinstance(e, InvalidRecordError):
                    result.record_errors.extend(pb.RecordError(batch_index=i, message=m)
                                                for i, m in e.record_errors)
                if code != pb.NONE:
                    self._metrics.request_errors.labels("Produce", pb.ErrorCode.Name(code)).inc()
        if acks == 0:
            # The client asked for no answer: nothing to tell it, errors included.
            return pb.ProduceResponse(), []
        return response, waits

    def _unverified(self, partition: Partition, tp: TopicPartition, records: bytes,
                    now_ms: int) -> tuple[int, int] | None:
        """(producer id, epoch) when ``records`` would open a transaction in ``tp`` that
        is not verified, else None."""
        assert self.verification is not None
        producer = transactional_producer(records) if records else None
        if producer is None or partition.log.producer_state.has_ongoing_transaction(*producer):
            return None
        if self.verification.allows(tp, *producer, partition.leader_epoch, now_ms):
            return None
        return producer

    async def _verify(self, request: pb.ProduceRequest
                      ) -> dict[TopicPartition, Exception]:
        """Ask the coordinator about every partition of ``request`` whose batch would
        open an unverified transaction (one call); the refusals, by partition."""
        assert self.verification is not None
        transactional_id = request.transactional_id
        if not transactional_id or self.verify is None:
            return {}  # nothing to ask with: ``_check_verified`` refuses them
        now_ms = wall_ms()
        asked: dict[tuple[int, int], list[tuple[TopicPartition, VerificationEntry]]] = {}
        for data in request.partitions:
            tp = (data.topic, data.partition)
            try:
                partition = self._lookup(*tp)
                producer = self._unverified(partition, tp, data.records, now_ms)
            except TidewaterError:  # answered by the append below, with its typed error
                continue
            if producer is not None:
                entry = self.verification.begin(tp, *producer, partition.leader_epoch, now_ms)
                asked.setdefault(producer, []).append((tp, entry))
        refusals: dict[TopicPartition, Exception] = {}
        for (producer_id, producer_epoch), entries in asked.items():
            codes = await self.verify(transactional_id, producer_id, producer_epoch,
                                      [tp for tp, _ in entries])
            for tp, entry in entries:
                code = codes.get(tp, pb.UNKNOWN_SERVER_ERROR)
                if not self.verification.on_answer(tp, producer_id, entry, code):
                    refusals[tp] = produce_error(code if code != pb.NONE
                                                 else pb.INVALID_TXN_STATE)
        return refusals

    def _check_verified(self, partition: Partition, topic: str, partition_index: int,
                        records: bytes) -> None:
        """Right before the append: a batch that would open a transaction must be verified
        (a marker may have ended the transaction since the coordinator answered)."""
        if self._unverified(partition, (topic, partition_index), records,
                            wall_ms()) is not None:
            raise produce_error(pb.INVALID_TXN_STATE)

    async def _append_as_leader(self, partition: Partition, topic: str, records: bytes,
                                acks: int, timeout_ms: int, *, coordinator_origin: bool = False
                                ) -> tuple[AppendInfo, AcksWait | None]:
        if not records:
            raise CorruptRecordError("produce request carries no record batch")
        config = partition.log.config
        if config.compact:
            require_keys(records, *partition.tp)
        wall_now_ms = wall_ms()
        # compression.type or KIP-937 bounds (off by default); bytes in: as received.
        written = (leader_batches(records, config, wall_now_ms) if config.leader_rewrite
                   else records)
        info, wait = append_as_leader(partition, written, acks, timeout_ms,
                                      open_wait=self._waits.open, carrier=self._carrier,
                                      now_ms=mono_ms(), wall_now_ms=wall_now_ms,
                                      coordinator_origin=coordinator_origin)
        if not info.duplicate:  # a retry already in the log: its original offsets
            size = len(records)
            self._messages_in.inc(info.record_count)
            self._bytes_in.inc(size)
            # The topic's series, made once per topic (a dict probe here).
            topic_bytes, topic_messages = (self._topic_produced.get(topic)
                                           or self._topic_series.ensure_in(topic))
            topic_bytes.inc(size)
            topic_messages.inc(info.record_count)
        return info, wait

    async def wait(self, waits: Waits) -> None:
        """Wait for each acks=all outcome and write it into its partition's answer."""
        # One partition (the usual request) is awaited directly: gather would wrap it in
        # a task, one more hop through the event loop before the answer goes out.
        if len(waits) == 1:
            codes = [await self._waits.wait_for(waits[0][1])]
        else:
            codes = await asyncio.gather(*(self._waits.wait_for(w) for _, w in waits))
        for (result, _), code in zip(waits, codes, strict=True):
            _set_acks_all_outcome(result, code)

    def watch(self, request: pb.ProduceRequest, response: pb.ProduceResponse, waits: Waits,
              done: Callable[[pb.ProduceResponse], None]) -> Callable[[], None]:
        """``wait`` without a coroutine (ProduceStream): ``done(response)`` runs once, from
        the event loop (or at once), when every wait has its outcome in ``response``; a
        failure there answers ``produce_error_response`` instead. Returns the function
        that withdraws the waits (``done`` never runs then)."""
        remaining = len(waits)
        failed: list[Exception] = []

        def on_outcome(result: pb.ProducePartitionResponse, code: int) -> None:
            nonlocal remaining
            try:
                _set_acks_all_outcome(result, code)
            except Exception as e:  # answered below, as for wait
                failed.append(e)
            remaining -= 1
            if remaining == 0:
                done(produce_error_response(request, failed[0], context="ProduceStream")
                     if failed else response)

        for result, wait in waits:
            self._waits.attach(wait, functools.partial(on_outcome, result))

        def withdraw_all() -> None:
            for _, wait in waits:
                self._waits.withdraw(wait)
        return withdraw_all


def require_keys(records: bytes, topic: str, partition: int) -> None:
    """A compacted topic keeps the last record per key: a batch holding a record without
    a key is refused, as Kafka's LogValidator does (INVALID_RECORD, each keyless record
    named by its index in its batch: KIP-467's record errors). Decodes every record
    (CRC-checked), which Kafka also does for compacted topics; other topics' batches
    stay opaque."""
    why = f"Compacted topic cannot accept message without key in topic partition " \
          f"{topic}-{partition}."
    keyless = tuple((index, why) for position, header in iter_batches(records)
                    for index, record in enumerate(decode_batch_records(records, position,
                                                                        header))
                    if record.key is None)
    if keyless:
        raise InvalidRecordError(
            f"One or more records have been rejected due to {len(keyless)} record errors "
            f"in total: {why} (batch index {', '.join(str(i) for i, _ in keyless[:3])}"
            f"{', ...' if len(keyless) > 3 else ''})", keyless)
