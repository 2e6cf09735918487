"""The producer: batches records per partition and sends them to partition leaders.

Theory of operation: ``send`` picks a partition (``client.partitioner``), encodes
the record into its partition's open batch in the ``RecordAccumulator`` and
returns a ``RecordFuture`` (the batch and the record's index: one completion
per batch, not a Future per record). One sender thread loops: expire old
batches, find ready partitions, look their leaders up (``MetadataClient``),
take every queued batch of a ready partition (up to ``request_bytes_max``),
close each (header and CRC), group them by leader into one ``ProduceRequest``
per broker and send it asynchronously. With ``linger_ms=0``, ``send`` on a
partition with nothing in flight sends the request itself, from the caller's
thread (one thread hand-off less for a lone record); and the answer to a request
sends what queued behind it, from the answering thread (the I/O loop; without
compression, with one request in flight per partition and the leader in cached
metadata; otherwise the sender thread does). The broker appends a partition's batches contiguously, so
record ``i`` of the request gets ``base_offset + i``. The answer is handled
per partition:

| answer                          | action                                             |
|---------------------------------|----------------------------------------------------|
| NONE                            | futures get offset = base_offset + index           |
|                                 | (-1 with acks=0, which needs no answer)            |
| retriable (proto.errors)        | refresh metadata if ``invalid_metadata``; retry    |
|                                 | after ``retry_backoff_ms`` while retries and the   |
|                                 | delivery timeout allow                             |
| idempotent: a sequence error    | ``client/idempotence.py`` decides: retry in order, |
| (OUT_OF_ORDER_SEQUENCE_NUMBER,  | or a new epoch on the partition (renumbered)       |
| UNKNOWN_PRODUCER_ID)            |                                                    |
| anything else                   | futures fail with the typed exception              |

Requests go on one ``ProduceStream`` per broker (``client.streams``). A
transport failure, a broken stream or a request unanswered on its stream past
the request timeout counts as a retriable ``BrokerConnectionError``
(``RequestTimedOutError``) for every batch in the request. A server without
``ProduceStream`` (UNIMPLEMENTED: not a broker of this release) fails the
request's records with the non-retriable ``UnsupportedVersionError``; nothing
was appended. A partition with ``max_in_flight_per_partition`` requests
in flight is muted. Memory is bounded: ``send`` blocks up to ``max_block_ms``
while ``buffer_memory_bytes`` are queued.

Idempotence (``enable_idempotence``; on by default with acks=all, as in Kafka 3):
the producer gets an id from ``InitProducerId`` before its first send and
numbers each partition's batches (``client/idempotence.py``). A retry keeps its
numbers, so a broker that already appended it (its answer was lost) answers the
original offsets instead of writing it twice; with up to 5 requests in flight
(Kafka's ``max.in.flight.requests.per.connection``) the broker refuses a batch
that does not follow the last one it wrote, the refused batches go back in
creation order and a retry goes alone once the partition's requests are
answered, so order holds across retries. At most 5 batches of a partition are
out at once (the broker remembers the last five per producer); so that five batches
carry as much as a non-idempotent request does, a partition whose next request is
full already lets its last queued batch grow past ``batch_size_bytes``, as
librdkafka's batches do: up to its share of what its requests in flight may carry
(``request_bytes_max`` x ``max_in_flight_per_partition`` / 5), ``BATCH_GROW_BYTES_MAX``
and the largest batch its leader said it takes (``batch_bytes_max`` in each produce
answer; before the first answer nothing grows). Without
idempotence, one request in flight (the default) keeps order; more may let a
retry reorder records, and a retry whose first answer was lost is written twice
(``retries=0`` gives at-most-once sends).

Transactions (``transactional_id``; implies idempotence and acks=all): Kafka's
transactional producer, ``client/transactions.py``. ``init_transactions`` once, then
``begin_transaction``, ``send``s (a partition joins the transaction with
AddPartitionsToTxn, from ``send``, before its first record is queued; batches carry the
transactional bit), ``send_offsets_to_transaction``, and ``commit_transaction`` (flush,
then EndTxn) or ``abort_transaction``. A fence (``ProducerFencedError``) is fatal: the
producer can only be closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import partial
from types import TracebackType
from typing import Protocol

from tidewater.client.accumulator import (
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    RecordMetadata,
)
from tidewater.client.idempotence import (
    BATCHES_IN_FLIGHT_MAX,
    MAX_IN_FLIGHT_IDEMPOTENT,
    IdempotentState,
    drain_count_max,
)
from tidewater.client.metadata import (
    Address,
    BrokerConnectionError,
    MetadataClient,
    PartitionInfo,
    TopicPartition,
    client_metadata,
    format_address,
    rpc_call,
)
from tidewater.client.partitioner import StickyPartitioner, choose_partition
from tidewater.client.streams import StreamPool
from tidewater.client.transactions import ConsumerGroupMetadata, TransactionManager
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.batch_builder import Headers
from tidewater.proto.compression import compress
from tidewater.proto.errors import (
    InvalidRequiredAcksError,
    RequestTimedOutError,
    TidewaterError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = ["Producer", "RecordFuture", "RecordMetadata", "parse_acks"]


# How long close() lets brokers answer what is pending on their streams (acks=1/all).
STREAM_CLOSE_WAIT_S = 5.0


def idempotence_enabled(enable_idempotence: bool | None, acks: int, retries: int,
                        max_in_flight_per_partition: int) -> bool:
    """Kafka 3's rules for ``enable.idempotence``: it needs acks=all, retries and at most 5
    requests in flight. Unset (None), it is on unless another setting rules it out (as
    Kafka does when those are set explicitly); True with such a setting is a ValueError."""
    if max_in_flight_per_partition < 1:
        raise ValueError("max_in_flight_per_partition must be at least 1")
    if enable_idempotence is None:
        return (acks == -1 and retries >= 1
                and max_in_flight_per_partition <= MAX_IN_FLIGHT_IDEMPOTENT)
    if not enable_idempotence:
        return False
    if acks != -1:
        raise ValueError("enable_idempotence needs acks='all' (pass enable_idempotence=False "
                         "for acks=0 or 1)")
    if retries < 1:
        raise ValueError("enable_idempotence needs retries >= 1")
    if max_in_flight_per_partition > MAX_IN_FLIGHT_IDEMPOTENT:
        raise ValueError(f"enable_idempotence allows at most {MAX_IN_FLIGHT_IDEMPOTENT} "
                         "requests in flight per partition")
    return True


def request_producer_id(metadata: MetadataClient, timeout_s: float) -> tuple[int, int]:
    """(producer id, epoch) from InitProducerId on any broker; a typed error otherwise
    (UnsupportedVersionError: a broker without idempotent producers)."""
    request = pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
    response = metadata.any_broker_call(lambda address: rpc_call(
        metadata.pool.broker(address).InitProducerId, request, timeout_s=timeout_s,
        address=address))
    if response.error_code != pb.NONE:
        raise error_for_code(response.error_code,
                             response.error_message or pb.ErrorCode.Name(response.error_code))
    return response.producer_id, response.producer_epoch


# The most an idempotent producer's batch grows to while its partition is backlogged
# (librdkafka's batch.size default is about this).
BATCH_GROW_BYTES_MAX = 1024 * 1024


class ProducerState(Protocol):
    """What the sending functions below use of a producer (``Producer``, ``AsyncProducer``)."""

    acks: int
    retries: int
    retry_backoff_ms: int
    delivery_timeout_ms: int
    request_bytes_max: int
    max_in_flight_per_partition: int
    _closed: bool
    _idempotence: IdempotentState | None
    _in_flight: dict[TopicPartition, int]
    _batch_bytes_max: dict[TopicPartition, int]  # the leader's largest batch, per answer

    @property
    def _accumulator(self) -> RecordAccumulator[object]: ...

    def _finish(self, batch: ProducerBatch, error: BaseException | None,
                base_offset: int = -1, log_append_time_ms: int = -1) -> None: ...


def on_producer_id_error(producer: ProducerState, ready: list[TopicPartition], error: TidewaterError) -> None:
    """No producer id: the partitions wait a backoff, or their batches fail when the error
    is not retriable (caller holds the producer's lock, if it has one)."""
    for tp in ready:
        if error.retriable:
            producer._accumulator.postpone(tp, _now_ms() + producer.retry_backoff_ms)
        else:
            for batch in producer._accumulator.drain_many(tp, producer.request_bytes_max):
                producer._finish(batch, error)


def partition_held_back(producer: ProducerState, tp: TopicPartition) -> bool:
    """``tp`` may not send now: ``max_in_flight_per_partition`` requests out, or (idempotent)
    a batch to retry while requests are out (it goes once they are answered, so retried
    sequences reach the broker in order), or its window of BATCHES_IN_FLIGHT_MAX batches
    full (client/idempotence.py)."""
    in_flight = producer._in_flight.get(tp, 0)
    if in_flight >= producer.max_in_flight_per_partition:
        return True
    idempotence = producer._idempotence
    return in_flight > 0 and idempotence is not None and (
        producer._accumulator.first_is_retry(tp)
        or idempotence.window_batches(tp) >= BATCHES_IN_FLIGHT_MAX)


def batch_grow_bytes(producer: ProducerState, tp: TopicPartition) -> int:
    """How far ``tp``'s last queued batch may grow (0: ``batch_size_bytes``, no growth;
    caller holds the lock): an idempotent producer's partition whose queued batches
    already fill its window of BATCHES_IN_FLIGHT_MAX (a new batch could not go in its next
    request), once its leader told the largest batch it takes."""
    idempotence = producer._idempotence
    if idempotence is None:
        return 0
    leader_max = producer._batch_bytes_max.get(tp, 0)
    if leader_max <= 0 or (producer._accumulator.queued_batches(tp)
                           + idempotence.window_batches(tp) < BATCHES_IN_FLIGHT_MAX):
        return 0
    # The partition's requests in flight carry at most its window of batches: spread
    # over those, the bytes its requests may carry (five batches of a fifth of a request
    # each fill one request; with five requests in flight each batch fills one).
    spread = (producer.request_bytes_max * producer.max_in_flight_per_partition
              // BATCHES_IN_FLIGHT_MAX)
    return min(leader_max, producer.request_bytes_max, BATCH_GROW_BYTES_MAX, spread)


def drain_for_request(producer: ProducerState, tp: TopicPartition) -> list[ProducerBatch]:
    """Take ``tp``'s batches for its next request; an idempotent producer numbers them."""
    accumulator, idempotence = producer._accumulator, producer._idempotence
    batches = accumulator.drain_many(tp, producer.request_bytes_max, drain_count_max(
        idempotence, accumulator.first_is_retry(tp),
        0 if idempotence is None else idempotence.window_batches(tp)))
    if batches and idempotence is not None:
        if not idempotence.has_producer_id:  # dropped after an epoch overflow: asked again
            accumulator.reenqueue_many(batches, _now_ms(), 0)
            return []
        for batch in batches:
            idempotence.assign(batch)
    return batches


def parse_acks(value: str | int) -> int:
    """'all'/-1 -> -1, '0' -> 0, '1' -> 1; anything else raises InvalidRequiredAcksError."""
    text = str(value).strip().lower()
    mapping = {"all": -1, "-1": -1, "0": 0, "1": 1}
    if text not in mapping:
        raise InvalidRequiredAcksError(f"acks must be 0, 1 or all, not {value!r}")
    return mapping[text]


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _record_count(batches: list[ProducerBatch]) -> int:
    return batches[0].record_count if len(batches) == 1 else sum(b.record_count for b in batches)


def delivery_timeout_error(batch: ProducerBatch, delivery_timeout_ms: int) -> RequestTimedOutError:
    last = batch.last_error
    cause = (f"; last error: {getattr(last, 'error_name', type(last).__name__)} {last}"
             if last is not None else "")
    return RequestTimedOutError(
        f"{batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition} "
        f"not delivered within {delivery_timeout_ms} ms{cause}")


def closed_bytes(batch: ProducerBatch) -> bytes:
    """The bytes of a batch its sender closed (``ProducerBatch.close``)."""
    if batch.encoded is None:
        raise RuntimeError(f"a batch of {batch.tp.topic}-{batch.tp.partition} sent unclosed")
    return batch.encoded


def no_stream_error(address: Address) -> BrokerConnectionError:
    """What a request gets when its producer finds no open ProduceStream to send it on (the
    pool is closed, or the stream broke twice as it was found): a transport failure."""
    return BrokerConnectionError(f"no ProduceStream to {format_address(address)} to send on")


def settle_produce_answer(producer: ProducerState, groups: list[tuple[TopicPartition, list[ProducerBatch]]],
                          response: pb.ProduceResponse | None,
                          transport_error: BaseException | None, now_ms: int) -> bool:
    """Apply one Produce answer (or transport failure) to the batches it carried: the
    decision table of the module docstring, shared by the threaded and asyncio producers.

    ``producer`` supplies ``acks``, ``retries``, ``retry_backoff_ms``, ``delivery_timeout_ms``,
    ``_closed``, ``_accumulator``, ``_idempotence`` (an ``IdempotentState`` or None) and
    ``_finish(batch, error, base_offset, log_append_time_ms)``.
    Returns True when metadata should be refreshed.
    """
    idempotence: IdempotentState | None = producer._idempotence
    answers: dict[tuple[str, int], pb.ProducePartitionResponse] = {}
    if response is not None:
        answers = {(p.topic, p.partition): p for p in response.partitions}
    refresh = False
    for tp, batches in groups:
        if transport_error is not None:
            error = transport_error
        else:
            answer = answers.get((tp.topic, tp.partition))
            if answer is not None and answer.batch_bytes_max > 0:
                producer._batch_bytes_max[tp] = answer.batch_bytes_max
            if answer is None and producer.acks == 0:
                # acks=0: the broker owes no answer; the records count as sent.
                for batch in batches:
                    producer._finish(batch, None, -1)
                continue
            if answer is None:
                error = BrokerConnectionError(
                    f"no answer for {tp.topic}-{tp.partition} in produce response")
            elif answer.error_code == pb.NONE:
                # The broker appends the batches contiguously from base_offset.
                offset = answer.base_offset
                for batch in batches:
                    if idempotence is not None:
                        idempotence.on_acked(batch)
                    producer._finish(batch, None, offset, answer.log_append_time_ms)
                    if offset >= 0:
                        offset += batch.record_count
                continue
            else:
                error = error_for_code(answer.error_code, answer.error_message or
                                       pb.ErrorCode.Name(answer.error_code))
        if getattr(error, "invalid_metadata", False):
            refresh = True
        head = batches[0]
        if idempotence is None:
            retry = getattr(error, "retriable", False)
        else:
            decision = idempotence.decide(head, error)
            if decision == "bump":
                idempotence.bump(tp)  # the unacked batches are renumbered in a new epoch
            retry = decision != "fail"
        if retry and head.attempts <= producer.retries and not producer._closed:
            for batch in batches:
                batch.last_error = error
            if now_ms - head.created_ms >= producer.delivery_timeout_ms:
                for batch in batches:
                    producer._finish(batch, delivery_timeout_error(batch, producer.delivery_timeout_ms))
                give_up_sequences(producer, tp, head)
            else:
                producer._accumulator.reenqueue_many(batches, now_ms, producer.retry_backoff_ms)
        else:
            for batch in batches:
                producer._finish(batch, error)
            give_up_sequences(producer, tp, head)
    return refresh


def release_in_flight(in_flight: dict[TopicPartition, int], tp: TopicPartition) -> None:
    """One request of ``tp`` is answered: its count drops."""
    left = in_flight.get(tp, 0) - 1
    if left > 0:
        in_flight[tp] = left
    else:
        in_flight.pop(tp, None)


def give_up_sequences(producer: ProducerState, tp: TopicPartition, batch: ProducerBatch) -> None:
    """An idempotent batch failed for good: the sequences it held are unresolved, so the
    partition starts a new epoch (later batches are renumbered, client/idempotence.py)."""
    idempotence: IdempotentState | None = producer._idempotence
    if idempotence is not None and batch.base_sequence >= 0:
        idempotence.bump(tp)


class Producer:
    def __init__(self, bootstrap: str, *, acks: int | str = -1, batch_size_bytes: int = 16384,
                 linger_ms: int = 5, request_timeout_ms: int = 30000, retries: int = 2**31 - 1,
                 retry_backoff_ms: int = 100, delivery_timeout_ms: int = 120000,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, max_block_ms: int = 60000,
                 unknown_topic_wait_ms: int = 3000, bootstrap_wait_ms: int = 1000,
                 compression: int = 0,
                 request_bytes_max: int = 1024 * 1024,
                 max_in_flight_per_partition: int = 1,
                 metadata: MetadataClient | None = None,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 enable_idempotence: bool | None = None,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000) -> None:
        self.acks = parse_acks(acks)
        if transactional_id is not None:
            if enable_idempotence is False:
                raise ValueError("a transactional producer is idempotent "
                                 "(enable_idempotence=False with transactional_id)")
            enable_idempotence = True  # and with it acks=all (a ValueError otherwise)
        enable_idempotence = idempotence_enabled(enable_idempotence, self.acks, retries,
                                                 max_in_flight_per_partition)
        self.enable_idempotence = enable_idempotence
        # Producer id, epochs and sequences (client/idempotence.py); None: not idempotent.
        self._idempotence = (IdempotentState(transactional=transactional_id is not None)
                             if enable_idempotence else None)
        self.request_timeout_ms = request_timeout_ms
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self.max_block_ms = max_block_ms
        self.unknown_topic_wait_ms = unknown_topic_wait_ms
        self.bootstrap_wait_ms = bootstrap_wait_ms  # no broker ever answered: give up this soon
        compress(compression, b"")  # an unknown or unavailable codec fails here, not per batch
        self.compression = compression  # proto.records.COMPRESSION_* code
        self.request_bytes_max = request_bytes_max  # per partition per request (at least one batch)
        self.max_in_flight_per_partition = max_in_flight_per_partition
        # TLS settings (client/security.py, Kafka's names) for the streams and the
        # metadata client made here (a given ``metadata`` needs ``security=`` of its own).
        security, self.metadata = client_metadata(
            bootstrap, metadata, request_timeout_ms, security_protocol, ssl_cafile, ssl_certfile,
            ssl_keyfile, sasl_mechanism=sasl_mechanism, sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password)
        # Transactions (client/transactions.py); None: not a transactional producer.
        self._txn = (None if transactional_id is None or self._idempotence is None
                     else TransactionManager(
                         self.metadata, self._idempotence, transactional_id=transactional_id,
                         transaction_timeout_ms=transaction_timeout_ms,
                         request_timeout_ms=request_timeout_ms,
                         retry_backoff_ms=retry_backoff_ms, max_block_ms=max_block_ms))
        # A transactional producer's batches carry the transactional bit.
        self._accumulator = RecordAccumulator(
            batch_size_bytes=batch_size_bytes, linger_ms=linger_ms,
            batch_attributes=TRANSACTIONAL_MASK if self._txn is not None else 0)
        if self._idempotence is not None:
            self._accumulator.grow_bytes_for = partial(batch_grow_bytes, self)
        self._partitioner = StickyPartitioner(batch_size_bytes)
        self._tps: dict[str, dict[int, TopicPartition]] = {}  # one TopicPartition per partition
        # send() takes the bare mutex (a C-level enter/exit, once per record); everything
        # else uses the conditions built on it: _lock wakes flush() and a send() waiting for
        # buffer space (records resolved), _sender_wake the sender thread (something to send
        # may be ready). Two conditions so that an answer wakes the sender only when records
        # are queued: a thread wake per answer costs ~40 µs of CPU for nothing otherwise.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._sender_wake = threading.Condition(self._mutex)
        self._in_flight: dict[TopicPartition, int] = {}  # requests out per partition
        self._batch_bytes_max: dict[TopicPartition, int] = {}  # batch_grow_bytes
        # Records in requests on the way; the accumulator's buffered_records less these are
        # the records queued (an answer wakes the sender only when some are).
        self._records_in_flight = 0
        # Retired batches whose futures still need resolving: (batch, error, base_offset, ts).
        self._finished: list[tuple[ProducerBatch, BaseException | None, int, int]] = []
        self._unfinished = 0  # records sent but not yet resolved
        # Kafka's record-error-total, and the first failed batch's error: what a caller that
        # attaches no callback per record (``tide produce`` without an ack log) reports.
        self.records_failed = 0
        self.first_record_error: BaseException | None = None
        self._closed = False
        self._last_metadata_refresh_ms = 0
        # Produce requests go on one ProduceStream per broker (client.streams).
        self._streams: StreamPool[pb.ProduceRequest, pb.ProduceResponse] = StreamPool(
            "ProduceStream", ordered=False, security=security)
        self._sender = threading.Thread(target=self._run, name="tide-producer-sender", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ public API

    def send(self, topic: str, value: bytes | None, key: bytes | None = None,
             partition: int | None = None,
             headers: Iterable[tuple[str | bytes, bytes | None]] | None = (),
             timestamp_ms: int | None = None) -> RecordFuture:
        """Queue one record; the future resolves to RecordMetadata or a typed exception.

        The record is encoded into its partition's open batch here, so a record that
        cannot be (a key or value that is not bytes, a timestamp outside int64) raises
        TypeError or ValueError now and is not queued."""
        if self._closed:
            raise RuntimeError("producer is closed")
        parts = self.metadata.cached_partitions(topic) or self._partitions_with_wait(topic)
        if partition is None or partition not in parts:
            partition = choose_partition(topic, parts, partition, key, value, self._partitioner)
        tps = self._tps.get(topic)
        if tps is None:
            tps = self._tps[topic] = {}
        tp = tps.get(partition)
        if tp is None:
            tp = tps[partition] = TopicPartition(topic, partition)
        record_headers: Headers = tuple(headers) if headers else ()
        if self._txn is not None:
            self._txn.maybe_add_partition(tp)  # raises outside a transaction or after a failure
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        accumulator = self._accumulator
        send_now = False
        with self._mutex:
            if accumulator.buffered_bytes >= self.buffer_memory_bytes:
                self._wait_for_buffer_space()
            created = accumulator.batches_created
            now_ms = time.monotonic_ns() // 1_000_000
            fut = accumulator.add(tp, key, value, record_headers, timestamp_ms, now_ms)
            self._unfinished += 1
            if (accumulator.linger_ms == 0 and tp not in self._in_flight and not self._closed
                    and (self._idempotence is None or self._idempotence.has_producer_id)):
                # Nothing of this partition on the way and no linger: send from this thread
                # now rather than wake the sender (one thread hand-off less per lone record).
                send_now = accumulator.partition_ready(tp, now_ms)
            # Wake the sender only when readiness may have changed: a new batch (so the previous
            # one is full, or a linger clock started) or no linger at all; and not while the
            # partition's requests are all out: their answer sends what queued meanwhile.
            if (not send_now and (created != accumulator.batches_created or accumulator.linger_ms == 0)
                    and self._in_flight.get(tp, 0) < self.max_in_flight_per_partition):
                self._sender_wake.notify()
        if send_now:
            self._send_or_fail([tp])
        return fut

    # ------------------------------------------------------------------ transactions

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise RuntimeError("not a transactional producer (no transactional_id)")
        if self._closed:
            raise RuntimeError("producer is closed")
        return self._txn

    def init_transactions(self) -> None:
        """Get the transactional id's producer id and epoch (fencing older producers with
        the id; their open transaction is aborted). Once, before the first transaction."""
        self._transactions().init()

    def begin_transaction(self) -> None:
        self._transactions().begin()

    def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int]
                                    | dict[tuple[str, int], int],
                                    group_metadata: ConsumerGroupMetadata | str) -> None:
        """Commit a consumer group's offsets (the next offset to consume, per partition)
        with the open transaction: visible to the group only if it commits.
        ``group_metadata``: the group id, or ``ConsumerGroupMetadata`` to have the
        coordinator check the member's generation (KIP-447)."""
        group = (ConsumerGroupMetadata(group_metadata) if isinstance(group_metadata, str)
                 else group_metadata)
        self._transactions().send_offsets(offsets, group)

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Flush (every record of the transaction answered), then EndTxn(commit).
        ``TransactionAbortRequiredError`` when a send failed: abort instead."""
        txn = self._transactions()
        txn.check_commit()
        self.flush(timeout_s)  # a failed record moves the transaction to abortable
        txn.end(committed=True)

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Wait for the records in flight (their outcome no longer matters: the abort
        marker hides them), then EndTxn(abort)."""
        txn = self._transactions()
        txn.check_abort()
        # Records still on the way must be answered first: sent after the marker, they
        # would start a transaction of their own. Their failures raise nothing here.
        self.flush(timeout_s)
        txn.end(committed=False)

    def _wait_for_buffer_space(self) -> None:
        """Block (lock held) until queued bytes drop below buffer_memory_bytes or max_block_ms."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        while self._accumulator.buffered_bytes >= self.buffer_memory_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"buffer of {self.buffer_memory_bytes} bytes full for {self.max_block_ms} ms")
            self._lock.wait(remaining)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now and wait until every record is resolved."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._accumulator.begin_flush()
            self._sender_wake.notify()
            try:
                while self._unfinished > 0:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise RequestTimedOutError(f"flush timed out with {self._unfinished} records pending")
                    self._lock.wait(remaining if remaining is not None else 1.0)
            finally:
                self._accumulator.end_flush()

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the sender thread, fail what is left, close channels."""
        if self._closed:
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
                self._sender_wake.notify()
            self._sender.join(timeout=5)
            self._resolve_finished()
            with self._lock:
                leftovers = self._accumulator.abort_all()
                closed_error = RuntimeError("producer closed before delivery")
                self._count_failed([(batch, closed_error) for batch in leftovers])
            for batch in leftovers:
                batch.fail(closed_error)
            # Half-closes: the brokers answer what they have. acks=0 requests resolve once
            # queued, so their streams get what is left of the close's timeout (else up to a
            # request timeout) to write them; otherwise a hung broker holds close for 5 s.
            wait_s = self.request_timeout_ms / 1000 if self.acks == 0 else STREAM_CLOSE_WAIT_S
            self._streams.close(wait_s if deadline is None
                                else max(0.0, min(wait_s, deadline - time.monotonic())))
            self._resolve_finished()
            self.metadata.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _partitions_with_wait(self, topic: str) -> dict[int, PartitionInfo]:
        """Partitions of ``topic``, retrying retriable errors (a topic being created has no
        leaders yet) up to ``max_block_ms``; an unknown topic is given only ``unknown_topic_wait_ms``."""
        start = time.monotonic()
        while True:
            try:
                return self.metadata.partitions_for(topic)
            except TidewaterError as e:
                waited_ms = (time.monotonic() - start) * 1000
                # An unknown topic, or a bootstrap list that never answered, is most likely a
                # mistake: give up quickly instead of blocking for max_block_ms.
                never_connected = (isinstance(e, BrokerConnectionError)
                                   and self.metadata.snapshot is None)
                if never_connected:
                    limit_ms = self.bootstrap_wait_ms
                elif isinstance(e, UnknownTopicOrPartitionError):
                    limit_ms = self.unknown_topic_wait_ms
                else:
                    limit_ms = self.max_block_ms
                if not e.retriable or waited_ms + self.retry_backoff_ms > limit_ms:
                    raise
                self.metadata.invalidate()
                time.sleep(self.retry_backoff_ms / 1000)

    def _run(self) -> None:
        while True:
            self._resolve_finished()
            with self._lock:
                if self._closed:
                    return
                now = _now_ms()
                self._expire(now)
                ready, next_ms = self._accumulator.ready(now, muted=self._muted())
                if not ready:
                    if self._finished:
                        continue
                    wait_ms = 200 if next_ms is None else max(1, min(200, next_ms - now))
                    self._sender_wake.wait(wait_ms / 1000)
                    continue
            self._send_or_fail(ready)

    def _muted(self) -> set[TopicPartition]:
        """Partitions that may not send now (lock held): ``partition_held_back``."""
        return {tp for tp in self._in_flight if partition_held_back(self, tp)}

    def _ensure_producer_id(self, ready: list[TopicPartition]) -> bool:
        """An idempotent producer needs its id before its first send (InitProducerId on any
        broker). False: none yet (``on_producer_id_error``)."""
        state = self._idempotence
        if state is None or state.has_producer_id:
            return True
        if self._txn is not None:
            # The id is init_transactions' (no record is queued before it): never spin.
            with self._lock:
                for tp in ready:
                    self._accumulator.postpone(tp, _now_ms() + self.retry_backoff_ms)
            return False
        try:
            producer_id, epoch = request_producer_id(self.metadata, self.request_timeout_ms / 1000)
        except TidewaterError as e:
            with self._lock:
                on_producer_id_error(self, ready, e)
            return False
        with self._lock:
            if not state.has_producer_id:
                state.set_producer_id(producer_id, epoch)
        return True

    def _send_or_fail(self, ready: list[TopicPartition], *, from_answer: bool = False) -> None:
        """``_send_ready``, failing the partitions' queued batches if it breaks (the sender
        thread's loop, ``send`` itself with linger 0, or an answer's thread)."""
        try:
            self._send_ready(ready, from_answer=from_answer)
        except Exception as e:  # a sender bug must fail records, not hang them
            with self._lock:
                for tp in ready:
                    if tp in self._in_flight:
                        continue  # its request is out; the answer resolves it
                    for batch in self._accumulator.drain_many(tp, self.request_bytes_max):
                        self._finish(batch, e)
            self._resolve_finished()

    def _expire(self, now: int) -> None:
        for batch in self._accumulator.expire(now, self.delivery_timeout_ms):
            self._finish(batch, delivery_timeout_error(batch, self.delivery_timeout_ms))
            give_up_sequences(self, batch.tp, batch)

    def _finish(self, batch: ProducerBatch, error: BaseException | None,
                base_offset: int = -1, log_append_time_ms: int = -1) -> None:
        """Retire a batch for good (caller holds the lock). Its futures resolve in
        ``_resolve_finished``, outside the lock, so user callbacks may call ``send``."""
        self._accumulator.release(batch)
        self._finished.append((batch, error, base_offset, log_append_time_ms))
        if error is not None and self._txn is not None:
            self._txn.on_batch_failed(error)  # the transaction must be aborted (or is fenced)

    def _resolve_finished(self) -> None:
        with self._lock:
            if not self._finished:
                return
            done, self._finished = self._finished, []
        for batch, error, base_offset, log_append_time_ms in done:
            if error is None:
                batch.complete(base_offset, log_append_time_ms)
            else:
                batch.fail(error)
        with self._lock:
            # Only now: flush() returns after every future it waited for has resolved.
            self._unfinished -= sum(batch.record_count for batch, *_ in done)
            self._count_failed([(batch, error) for batch, error, *_ in done if error is not None])
            self._lock.notify_all()

    def _count_failed(self, failed: list[tuple[ProducerBatch, BaseException]]) -> None:
        """records_failed and first_record_error (caller holds the lock)."""
        for batch, error in failed:
            self.records_failed += batch.record_count
            if self.first_record_error is None:
                self.first_record_error = error

    def _send_ready(self, ready: list[TopicPartition], *, from_answer: bool = False) -> None:
        """One request per leader with the ready partitions' queued batches. From an
        answer's thread (``from_answer``, the I/O loop) leaders come from the cached
        metadata only: a partition without one there is left to the sender thread."""
        # leader address -> [(tp, the partition's batches in order)]
        by_leader: dict[Address, list[tuple[TopicPartition, list[ProducerBatch]]]] = {}
        need_refresh = False
        if self._idempotence is not None and not self._idempotence.has_producer_id:
            if from_answer or not self._ensure_producer_id(ready):
                return  # the sender thread asks for the id / the partitions wait a backoff
        for tp in ready:
            if from_answer:
                leader = self.metadata.cached_leader_for(tp)  # never refreshes: never blocks
                if leader is None:
                    continue  # left queued: the answer then wakes the sender thread for it
            else:
                try:
                    leader = self.metadata.leader_for(tp)
                except TidewaterError as e:
                    if e.retriable:
                        leader = None
                    else:
                        with self._lock:
                            for batch in self._accumulator.drain_many(tp, self.request_bytes_max):
                                self._finish(batch, e)
                        continue
            with self._lock:
                if leader is None:
                    # No leader known: wait a backoff for new metadata (the delivery timeout still applies).
                    need_refresh = True
                    self._accumulator.postpone(tp, _now_ms() + self.retry_backoff_ms)
                    continue
                if partition_held_back(self, tp):
                    continue  # send() and the sender both saw it ready; the answer wakes the sender
                # Every queued batch of the partition goes in one request (in order); with one
                # request in flight per partition (the default) retries cannot reorder, and
                # an idempotent producer's sequences keep the order with more.
                batches = drain_for_request(self, tp)
                if not batches:
                    continue
                self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
                self._records_in_flight += _record_count(batches)
            try:
                for batch in batches:
                    batch.close(self.compression)
            except Exception as e:  # e.g. a compression codec failing: fail, not hang
                with self._lock:
                    self._release_in_flight(tp)
                    self._records_in_flight -= _record_count(batches)
                    for batch in batches:
                        self._finish(batch, e)
                    self._sender_wake.notify()  # the sender resolves the futures
                continue
            by_leader.setdefault(leader.address, []).append((tp, batches))
        if need_refresh:
            self._maybe_refresh_metadata()
        for address, groups in by_leader.items():
            request = pb.ProduceRequest(acks=self.acks, timeout_ms=self.request_timeout_ms,
                                        transactional_id=self._txn.transactional_id
                                        if self._txn is not None else "")
            add_partition = request.partitions.add  # ~3 µs less than building each message apart
            for tp, batches in groups:
                add_partition(topic=tp.topic, partition=tp.partition,
                              records=batches[0].encoded if len(batches) == 1
                              else b"".join(closed_bytes(b) for b in batches))
            self._send_request(address, request, groups)

    def _send_request(self, address: Address, request: pb.ProduceRequest,
                      groups: list[tuple[TopicPartition, list[ProducerBatch]]]) -> None:
        """On the broker's ProduceStream (opened now if there is none)."""
        timeout_s = self.request_timeout_ms / 1000 + 5
        if self._streams.send(address, request, partial(self._on_response, groups), timeout_s,
                              answered=self.acks != 0) is None:
            self._on_response(groups, None, no_stream_error(address))

    def _on_response(self, groups: list[tuple[TopicPartition, list[ProducerBatch]]],
                     response: pb.ProduceResponse | None,
                     transport_error: TidewaterError | Exception | None) -> None:
        with self._lock:
            for tp, batches in groups:
                self._release_in_flight(tp)
                self._records_in_flight -= _record_count(batches)
            refresh = settle_produce_answer(self, groups, response, transport_error, _now_ms())
            # acks=0 is settled inside the stream's send (no answer comes), i.e. inside
            # _send_ready: sending from here would recurse a frame per request queued.
            ready = [] if refresh or self.acks == 0 else self._ready_after_answer(groups)
            if not ready:
                self._wake_sender_if_queued()
        if ready:
            # Records that waited behind this request go from here, on the answering
            # thread (the I/O loop), before the futures resolve: waking the sender thread
            # to send them costs two thread hand-offs (~0.2 ms at 1,000 records/s).
            self._send_or_fail(ready, from_answer=True)
            with self._lock:
                self._wake_sender_if_queued()
        self._resolve_finished()
        if refresh:
            self.metadata.invalidate()

    def _ready_after_answer(self, groups: list[tuple[TopicPartition, list[ProducerBatch]]]
                            ) -> list[TopicPartition]:
        """Partitions of an answered request that can send their queued records now
        without blocking the answering thread (lock held): not muted and due
        (``_send_ready`` leaves one without a leader in fresh cached metadata to the
        sender thread). Only without compression (it would hold up the I/O loop for ms) and
        with one request in flight per partition (with more, the sender thread may drain
        the same partition at once and the two requests could be written out of order).
        The sender thread sends anything else."""
        if self._closed or self.compression or self.max_in_flight_per_partition != 1:
            return []
        now_ms = _now_ms()
        accumulator = self._accumulator
        return [tp for tp, _ in groups
                if tp not in self._in_flight and accumulator.partition_ready(tp, now_ms)]

    def _wake_sender_if_queued(self) -> None:
        """Records wait (behind a request, or to retry): the sender sends them (lock held)."""
        if self._accumulator.buffered_records > self._records_in_flight:
            self._sender_wake.notify()

    def _release_in_flight(self, tp: TopicPartition) -> None:
        """One request of ``tp`` is no longer out (lock held)."""
        release_in_flight(self._in_flight, tp)

    def _maybe_refresh_metadata(self) -> None:
        now = _now_ms()
        if now - self._last_metadata_refresh_ms < self.retry_backoff_ms:
            return
        self._last_metadata_refresh_ms = now
        try:
            self.metadata.refresh()
        except TidewaterError:
            pass  # no broker reachable now; batches wait and expire by the delivery timeout
