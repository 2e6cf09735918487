"""The one fetch path (consumers and followers) and the offset lookups.

``fetch``: each pass reads every wanted partition; a long-poll parks in
``FetchWaiters`` until something that can change its answer happens, then
reads again, until it has ``min_bytes``, must answer (an error, a diverging
epoch), or its wait ends. Decisions are the replication core's:

- a consumer's read: ``ReplicaState.check_consumer_fetch`` (fencing,
  leadership, range) and the HW it may read below;
- a follower's read: ``ReplicaState.on_follower_fetch`` (fencing, divergence,
  range; on the first pass the follower's progress moves the HW and may
  propose an ISR expansion, carried out by ``ReadyCarrier``). A fetch from a
  broker incarnation that is not the live registered one is served but cannot
  add it to the ISR (KIP-903, ``is_isr_eligible``).

A HW move alone does not answer a follower's long-poll (Kafka's DelayedFetch):
the follower learns the HW with its next records or at max_wait_ms. Answering
it cost one extra fetch round per acks=all write (the ISR member that fetched
first was answered empty as soon as the last one moved the HW) and left that
follower without a pending fetch when the next record arrived. So a
follower's long-poll is woken only by appends and leadership changes, a
consumer's only by HW moves and leadership changes.

Every batch read is checked (framing, CRC-32C: ``_read_checked``): a corrupt one
ends the read with the batches before it, and the replica's core reacts (issue
14, bug 6). A fetch naming a topic ID reads only that incarnation
(``topic_identity.fetch_topic_id_error``: INCONSISTENT_TOPIC_ID / UNKNOWN_TOPIC_ID).

Transactions (KIP-98). A consumer's answer carries the partition's last stable
offset (LSO): ``min(first offset of the oldest open transaction, HW)``. With
``isolation_level`` READ_COMMITTED the read ends below the LSO instead of the
HW, and the answer lists the aborted transactions (producer id, first offset)
whose ABORT marker lies at or after the fetch offset and which began below the
LSO (the log's ``.txnindex``, ``storage/txn_index.py``): the consumer drops
those producers' records from each first offset until the marker. ListOffsets
LATEST is the LSO for READ_COMMITTED.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol

from tidewater.broker.clock import mono_ms
from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.topic_identity import fetch_topic_id_error
from tidewater.broker.serving.purgatory import FetchWaiters
from tidewater.broker.storage.corruption import (
    CONSUMER_READ,
    FOLLOWER_READ,
    CorruptBatchError,
    CorruptionReporter,
)
from tidewater.broker.storage.reporting_read import read_reporting
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import BATCH_LENGTH_MIN, HEADER_SIZE, LOG_OVERHEAD, BytesLike
from tidewater.proto.errors import InvariantViolation, KafkaStorageError, error_for_code

FETCH_MAX_BYTES_DEFAULT = 50 * 1024 * 1024
PARTITION_MAX_BYTES_DEFAULT = 1024 * 1024
FETCH_WAIT_MAX_MS = 60_000  # a bound on any long-poll, whatever the client asks
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1  # Kafka's isolation levels

_INT32 = struct.Struct(">i")
_BATCH_LENGTH_AT = 8  # after baseOffset
_RECORD_COUNT_AT = HEADER_SIZE - 4  # the header's last field


# A wanted partition as a fetch pass reads it: topic, partition, current leader epoch,
# fetch offset, last fetched epoch, partition max bytes, topic id, the asker's log start.
Wanted = tuple[str, int, int, int, int, int, bytes, int]


def wanted_of(partitions: Iterable[pb.FetchPartition]) -> list[Wanted]:
    """The request's partitions as plain tuples, read once: a long-poll reads them again on
    every pass, and each protobuf field access is a call (a message one allocates)."""
    return [(fp.topic, fp.partition, fp.current_leader_epoch, fp.fetch_offset,
             fp.last_fetched_epoch, fp.partition_max_bytes, fp.topic_id, fp.log_start_offset)
            for fp in partitions]


class FetchedPartition(NamedTuple):
    """One partition's fetch answer."""

    topic: str
    partition: int
    error_code: int
    error_message: str
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    leader_epoch: int
    # bytes as read; a memoryview of the received answer where a follower reads the
    # answer by hand (fetch_wire)
    records: BytesLike
    diverging: tuple[int, int] | None  # (epoch, end_offset) a follower must truncate to


# A follower fetch's pass: its answers and the partition each came from (None: not found).
FetchPass = tuple[list[FetchedPartition], list[Partition | None]]


class FollowerSession(Protocol):
    """What the fetch path reads and keeps of a follower's fetch session
    (``replica_fetch_session.ReplicaFetchSession``)."""

    wanted: list[Wanted] | None  # the partitions asked, in the session's order
    named: set[int] | None  # the indexes the request named; None: all of them
    earlier: FetchPass | None  # the last pass of the session's previous fetch
    unsettled: set[int]  # the indexes whose follower is not known to be settled

    def to_read(self, first_pass: bool, now_ms: int, broker_epoch: int,
                isr_eligible: bool, max_wait_ms: int = 0) -> list[int] | None:
        """The indexes a pass reads, in order (None: all)."""

    def read_all(self) -> None:
        """A pass read every partition."""

    async def park(self, timeout_s: float) -> None:
        """Until an append or a leadership change of a partition of the session."""


class ConsumerFetched(FetchedPartition):
    """A consumer's answer: a ``FetchedPartition`` (the same tuple: every reader of one
    reads this) with the partition's transaction view."""

    last_stable_offset: int
    aborted_transactions: list[tuple[int, int]]  # (producer id, first offset), READ_COMMITTED


def consumer_fetched(fetched: FetchedPartition, last_stable_offset: int,
                     aborted_transactions: list[tuple[int, int]]) -> ConsumerFetched:
    out = ConsumerFetched._make(fetched)
    out.last_stable_offset = last_stable_offset
    out.aborted_transactions = aborted_transactions
    return out


def last_stable_offset_of(fetched: FetchedPartition) -> int:
    """The answer's LSO (the HW for an answer without one: an error, a follower's)."""
    if isinstance(fetched, ConsumerFetched):
        return fetched.last_stable_offset
    return fetched.high_watermark


def aborted_transactions_of(fetched: FetchedPartition) -> list[tuple[int, int]] | None:
    """READ_COMMITTED answers' aborted transactions; None for others (Kafka's null)."""
    if isinstance(fetched, ConsumerFetched):
        return fetched.aborted_transactions
    return None


def last_stable_offset(partition: Partition, high_watermark: int) -> int:
    """min(first offset of the oldest open transaction, HW). A transaction that began
    below the log start (retention or DeleteRecords moved it) counts from the log start,
    as Kafka's: an LSO below the log start would be an offset no consumer may fetch."""
    log_ = partition.log
    first_unstable: int | None = log_.first_unstable_offset
    if first_unstable is None:
        return high_watermark
    return min(max(first_unstable, int(log_.log_start_offset)), high_watermark)


def fetch_response(results: Iterable[FetchedPartition]) -> pb.FetchResponse:
    response = pb.FetchResponse(error_code=pb.NONE)
    add = response.partitions.add
    for fetched in results:
        (topic, partition, code, message, high_watermark, log_start_offset, log_end_offset,
         leader_epoch, records, diverging) = fetched
        out = add(topic=topic, partition=partition, error_code=code, error_message=message,
                  high_watermark=high_watermark, log_start_offset=log_start_offset,
                  log_end_offset=log_end_offset, leader_epoch=leader_epoch, records=records)
        if isinstance(fetched, ConsumerFetched):
            # Consumers' answers only: a follower's is also written by hand
            # (replica_fetch_wire), which knows nothing of transactions.
            out.last_stable_offset = fetched.last_stable_offset
            out.aborted_transactions.extend(
                pb.AbortedTransaction(producer_id=pid, first_offset=first)
                for pid, first in fetched.aborted_transactions)
        if diverging is not None:
            out.diverging_epoch.CopyFrom(pb.EpochEndOffset(epoch=diverging[0],
                                                           end_offset=diverging[1]))
    return response


def record_count(records: BytesLike) -> int:
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


def check_fetch_topic_id(partition: Partition, topic_id: bytes,
                         known_topic_ids: Mapping[bytes, str]) -> None:
    """Raise the fetch error for ``topic_id`` naming another incarnation than ``partition``'s
    (``topic_identity.fetch_topic_id_error``); an empty ID names none."""
    if topic_id and topic_id != partition.topic_id:
        refusal = fetch_topic_id_error(topic_id, partition.topic_id,
                                       known_topic_ids.__contains__)
        if refusal is None:
            raise InvariantViolation(f"{partition.tp}: topic id {topic_id!r} refused for nothing")
        code, message = refusal
        raise error_for_code(code, f"{partition.tp}: {message}")


def serve_follower_fetch(partition: Partition, carrier: ReadyCarrier, replica_id: int,
                         current_leader_epoch: int, fetch_offset: int, last_fetched_epoch: int,
                         now_ms: int, *, isr_eligible: bool, broker_epoch: int,
                         record: bool = True, log_start_offset: int = -1
                         ) -> tuple[tuple[int, int] | None, bool]:
    """The leader's side of one follower fetch, before anything is read: the core takes the
    follower's position (divergence, HW, ISR expansion) and its Ready is carried out at
    once, so the read that follows sees its effects. Returns (the diverging epoch and end
    offset, or None; whether to read records from ``fetch_offset``). The broker and the
    simulation both serve follower fetches through here."""
    diverging, ready = partition.replica.on_follower_fetch(
        replica_id, current_leader_epoch, fetch_offset, last_fetched_epoch, now_ms,
        isr_eligible=isr_eligible, record=record, broker_epoch=broker_epoch,
        log_start_offset=log_start_offset)
    carrier.apply(partition, ready)
    return diverging, diverging is None and fetch_offset < partition.log.log_end_offset


def serve_offset_for_leader_epoch(partition: Partition, current_leader_epoch: int,
                                  leader_epoch: int, topic_id: bytes,
                                  known_topic_ids: Mapping[bytes, str]) -> tuple[int, int]:
    """A follower's OffsetForLeaderEpoch, answered by ``partition``'s core for the
    incarnation ``topic_id`` only: (epoch, end offset), or the typed error. The broker and
    the simulation both answer through here."""
    check_fetch_topic_id(partition, topic_id, known_topic_ids)
    return partition.replica.answer_offset_for_leader_epoch(current_leader_epoch, leader_epoch)


class FetchPath:
    def __init__(self, *, lookup: Callable[[str, int], Partition], carrier: ReadyCarrier,
                 fetch_waiters: FetchWaiters, metrics: BrokerMetrics,
                 is_isr_eligible: Callable[[int, int], bool], closing: Callable[[], bool],
                 corruption: CorruptionReporter,
                 known_topic_ids: Callable[[], Mapping[bytes, str]] = dict):
        self._lookup = lookup
        self.corruption = corruption
        self._known_topic_ids = known_topic_ids
        self._carrier = carrier
        self.fetch_waiters = fetch_waiters
        self._metrics = metrics
        self._is_isr_eligible = is_isr_eligible
        self._closing = closing
        # Labelled counter children looked up once, not per fetch answer (labels() is a
        # call and a dict probe), by is_follower: (bytes_out, messages_out).
        self._fetch_out_counters = {
            is_follower: (metrics.bytes_out.labels(kind), metrics.messages_out.labels(kind))
            for is_follower, kind in ((True, "replica"), (False, "consumer"))}
        self._topic_series = metrics.topic_series  # per topic, each made once

    async def fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        return fetch_response(await self.fetch_partitions(request))

    async def fetch_partitions(self, request: pb.FetchRequest,
                               session: FollowerSession | None = None
                               ) -> list[FetchedPartition]:
        """The answer per partition, as plain tuples: the Kafka listener encodes the
        records from these without the copy a protobuf message makes. ``session``: a
        follower's fetch session; its partitions are read in place of the request's, one
        answer each, in order, and the first pass takes the previous fetch's answer of
        each partition the request did not name that has not moved (``_read``)."""
        loop = asyncio.get_running_loop()
        max_wait_ms = min(max(request.max_wait_ms, 0), FETCH_WAIT_MAX_MS)
        deadline = loop.time() + max_wait_ms / 1000
        replica_id = request.replica_id
        is_follower = replica_id >= 0
        min_bytes = max(request.min_bytes, 1)
        wanted = session.wanted if session is not None else None
        if wanted is None:
            wanted = wanted_of(request.partitions)
        max_bytes = request.max_bytes
        broker_epoch = request.replica_broker_epoch
        read_committed = not is_follower and request.isolation_level == READ_COMMITTED
        isr_eligible = (self._is_isr_eligible(replica_id, broker_epoch)
                        if is_follower else False)
        keys = None
        first_pass = True
        earlier: FetchPass | None = None
        named: set[int] | None = None
        if session is not None and is_follower:
            earlier, named = session.earlier, session.named
            session.earlier = None  # until this fetch is answered
        else:
            session = None
        while True:
            indexes = None
            if session is not None:
                if earlier is None:
                    session.read_all()
                else:
                    indexes = session.to_read(first_pass, mono_ms(), broker_epoch,
                                              isr_eligible, max_wait_ms)
            results, total_bytes, must_answer, served = self._read(
                wanted, max_bytes, replica_id if is_follower else -1, isr_eligible, broker_epoch,
                first_pass, read_committed, earlier, named, indexes,
                session.unsettled if session is not None else None)
            first_pass = False
            if is_follower:
                earlier = (results, served)
            remaining_s = deadline - loop.time()
            if must_answer or total_bytes >= min_bytes or remaining_s <= 0 or self._closing():
                break
            if session is not None:
                await session.park(remaining_s)
                continue
            if keys is None:
                keys = [(topic, partition) for topic, partition, *_ in wanted]
            await self.fetch_waiters.wait(keys, remaining_s, follower=is_follower)
        # Counted once, from the last pass.
        messages = 0
        topic_fetched = self._topic_series.fetched[is_follower]
        last_topic, topic_bytes = "", None  # a fetch's partitions come topic by topic
        for result in results:
            if result.error_code != pb.NONE:
                self._metrics.request_errors.labels(
                    "Fetch", pb.ErrorCode.Name(result.error_code)).inc()
            elif result.records:
                records = result.records
                messages += record_count(records)
                if topic_bytes is None or result.topic != last_topic:
                    last_topic = result.topic
                    topic_bytes = (topic_fetched.get(last_topic)
                                   or self._topic_series.ensure_out(last_topic, is_follower))
                topic_bytes.inc(len(records))
        if total_bytes:
            bytes_out, messages_out = self._fetch_out_counters[is_follower]
            bytes_out.inc(total_bytes)
            messages_out.inc(messages)
        if session is not None:
            session.earlier = earlier
        return results

    def _read(self, wanted: list[Wanted], max_bytes: int, replica_id: int, isr_eligible: bool,
              broker_epoch: int, first_pass: bool, read_committed: bool = False,
              earlier: FetchPass | None = None, named: set[int] | None = None,
              indexes: list[int] | None = None, unsettled: set[int] | None = None
              ) -> tuple[list[FetchedPartition], int, bool, list[Partition | None]]:
        """(the answer per partition, the records' bytes, must it be answered now, the
        partition each answer came from). A follower's when ``replica_id`` >= 0.

        ``indexes``: read only those of ``wanted`` (in order); the others keep
        ``earlier``'s answer as it is (a fetch session's pass, ``replica_fetch_session``).
        ``unsettled``: the session's set, kept: an index leaves it where the short way
        held on a first pass, and joins it where the partition was served anew.

        ``earlier``: a follower's previous pass: of this long-poll, or on the first pass
        the last one of its session's previous fetch (``named``: the partitions whose ask
        moved since, which are served anew). A partition still the same object, where the
        follower was caught up and the leader epoch, log start and log end have not moved
        since, keeps that pass's empty answer with the HW of now: served again it would
        give the same, at the cost of the checks. On a first pass the core still records
        the fetch, the short way (``on_follower_fetch_at_end``), or the partition is served
        in full. A follower's fetch names every partition it follows from this leader
        (``__consumer_offsets``'s among them), most of them idle, and each long-poll makes
        two passes or more."""
        if max_bytes <= 0:
            max_bytes = FETCH_MAX_BYTES_DEFAULT
        total_bytes = 0
        must_answer = False
        results: list[FetchedPartition]
        served: list[Partition | None]
        to_read: Iterable[int]
        if indexes is None:
            to_read = range(len(wanted))
            results = [None] * len(wanted)  # type: ignore[list-item]  # each set below
            served = [None] * len(wanted)
        else:
            if earlier is None:
                raise InvariantViolation("a pass of some partitions with no earlier pass")
            to_read = indexes
            results, served = list(earlier[0]), list(earlier[1])
        now_ms = mono_ms() if first_pass and earlier is not None else 0
        for index in to_read:
            (topic, partition_index, current_leader_epoch, fetch_offset, last_fetched_epoch,
             partition_max_bytes, topic_id, follower_log_start_offset) = wanted[index]
            leader_epoch = high_watermark = log_start_offset = log_end_offset = -1
            partition = None
            try:
                partition = self._lookup(topic, partition_index)
                if (earlier is not None and partition is earlier[1][index]
                        and not (first_pass and (named is None or index in named))):
                    before = earlier[0][index]
                    log_ = partition.log
                    replica = partition.replica
                    if (before.error_code == pb.NONE and before.diverging is None
                            and fetch_offset >= before.log_end_offset
                            and before.log_end_offset == log_.log_end_offset
                            and before.log_start_offset == log_.log_start_offset
                            and before.leader_epoch == replica.leader_epoch
                            and (not first_pass or replica.on_follower_fetch_at_end(
                                replica_id, current_leader_epoch, fetch_offset,
                                last_fetched_epoch, now_ms, broker_epoch=broker_epoch,
                                log_start_offset=follower_log_start_offset))):
                        high_watermark = replica.high_watermark
                        results[index] = (before if before.high_watermark == high_watermark
                                          else before._replace(high_watermark=high_watermark))
                        served[index] = partition
                        if first_pass and unsettled is not None:
                            unsettled.discard(index)
                        continue
                if topic_id and topic_id != partition.topic_id:
                    check_fetch_topic_id(partition, topic_id, self._known_topic_ids())
                log_ = partition.log
                replica = partition.replica
                leader_epoch = replica.leader_epoch
                log_start_offset = log_.log_start_offset
                log_end_offset = log_.log_end_offset
                if partition_max_bytes <= 0:
                    partition_max_bytes = PARTITION_MAX_BYTES_DEFAULT
                budget = min(partition_max_bytes, max(max_bytes - total_bytes, 0))
                diverging = None
                if replica_id >= 0:
                    diverging, read = serve_follower_fetch(
                        partition, self._carrier, replica_id, current_leader_epoch,
                        fetch_offset, last_fetched_epoch, mono_ms(), isr_eligible=isr_eligible,
                        record=first_pass, broker_epoch=broker_epoch,
                        log_start_offset=follower_log_start_offset)
                    if diverging is not None:
                        must_answer = True
                    records = (self._read_checked(partition, FOLLOWER_READ, fetch_offset,
                                                  budget, None, total_bytes == 0)
                               if read else b"")
                else:
                    high_watermark = replica.check_consumer_fetch(current_leader_epoch,
                                                                  fetch_offset)
                    stable_end = last_stable_offset(partition, high_watermark)
                    visible_end = stable_end if read_committed else high_watermark
                    if fetch_offset >= visible_end:
                        records = b""  # nothing committed there yet: never read above the HW
                    else:
                        records = self._read_checked(partition, CONSUMER_READ, fetch_offset,
                                                     budget, visible_end, total_bytes == 0)
                high_watermark = replica.high_watermark
                total_bytes += len(records)
                fetched = FetchedPartition(
                    topic, partition_index, pb.NONE, "", high_watermark, log_start_offset,
                    log_end_offset, leader_epoch, records, diverging)
                if replica_id < 0:
                    aborted = ([(a.producer_id, a.first_offset) for a in
                                log_.aborted_transactions(fetch_offset, visible_end)]
                               if read_committed and records else [])
                    fetched = consumer_fetched(fetched, stable_end, aborted)
                results[index] = fetched
            except Exception as e:  # the one boundary: a typed error per partition
                code, message = error_code_for(e, context="Fetch")
                results[index] = FetchedPartition(
                    topic, partition_index, code, message, high_watermark, log_start_offset,
                    log_end_offset, leader_epoch, b"", None)
                must_answer = True
            served[index] = partition
            if unsettled is not None:
                unsettled.add(index)
        return results, total_bytes, must_answer, served

    def _read_checked(self, partition: Partition, how: str, fetch_offset: int, max_bytes: int,
                      max_offset: int | None, min_one_batch: bool) -> bytes:
        """The read, every batch's CRC checked: the whole batches before a corrupt one,
        which is reported (logged and counted once) and handed to the replica's core
        (bug 6: it leaves the ISR and truncates below it). A read that starts at the bad
        batch answers KAFKA_STORAGE_ERROR (retriable: a healthy replica takes over) while
        one is expected to, else CORRUPT_MESSAGE (no healthy copy of that record here)."""
        try:
            result = read_reporting(partition.log, self.corruption, how, fetch_offset, max_bytes,
                                    max_offset=max_offset, min_one_batch=min_one_batch)
        except CorruptBatchError as e:
            replica = partition.replica
            self._carrier.apply(partition, replica.on_corrupt_batch(e.batch.base_offset, mono_ms()))
            if replica.corruption_handover_expected:
                raise KafkaStorageError(
                    f"{partition.tp}: the batch at offset {e.batch.base_offset} of this replica "
                    f"is corrupt; another replica takes over") from e
            raise
        if result.corrupt is not None:
            self._carrier.apply(partition, partition.replica.on_corrupt_batch(
                result.corrupt.base_offset, mono_ms()))
        return bytes(result.records)

    # ================================================================ offsets

    def list_offsets(self, request: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
        response = pb.ListOffsetsResponse()
        for lp in request.partitions:
            out = response.partitions.add(topic=lp.topic, partition=lp.partition,
                                          error_code=pb.NONE, timestamp=-1, offset=-1,
                                          leader_epoch=-1)
            try:
                partition = self._lookup(lp.topic, lp.partition)
                # Fencing, and where what the asker may see ends: the core's.
                visible_end = partition.replica.check_list_offsets(
                    lp.current_leader_epoch, consumer=request.replica_id < 0)
                log_ = partition.log
                cache = log_.leader_epoch_cache
                if request.isolation_level == READ_COMMITTED and request.replica_id < 0:
                    visible_end = last_stable_offset(partition, visible_end)
                if lp.timestamp == EARLIEST_TIMESTAMP:
                    out.offset = log_.log_start_offset
                elif lp.timestamp == LATEST_TIMESTAMP:
                    out.offset = visible_end
                else:
                    found = log_.fetch_offset_by_timestamp(lp.timestamp)
                    if found is not None and found[0] < visible_end:
                        out.offset, out.timestamp, out.leader_epoch = found
                    continue
                # The epoch of the last record before the offset (Kafka's answer for -1/-2).
                out.leader_epoch = cache.epoch_for_offset(max(out.offset - 1, log_.log_start_offset))
            except Exception as e:
                out.error_code = error_code_for(e, context="ListOffsets")[0]
        return response

    def offset_for_leader_epoch(self, request: pb.OffsetForLeaderEpochRequest
                                ) -> pb.OffsetForLeaderEpochResponse:
        response = pb.OffsetForLeaderEpochResponse()
        for p in request.partitions:
            out = response.partitions.add(topic=p.topic, partition=p.partition,
                                          error_code=pb.NONE, leader_epoch=-1, end_offset=-1)
            try:
                partition = self._lookup(p.topic, p.partition)
                out.leader_epoch, out.end_offset = serve_offset_for_leader_epoch(
                    partition, p.current_leader_epoch, p.leader_epoch, p.topic_id,
                    self._known_topic_ids())
            except Exception as e:
                out.error_code = error_code_for(e, context="OffsetForLeaderEpoch")[0]
        return response
