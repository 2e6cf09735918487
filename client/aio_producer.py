"""The asyncio producer: the threaded ``client.producer``'s batching, answers and streams, on the caller's loop.

For asyncio programs and benchmarks that want many requests in flight without
threads. It shares the ``RecordAccumulator`` (with asyncio futures), the
partitioner and ``settle_produce_answer`` (the decision table: what an answer,
an error or a transport failure does to a request's batches) with the threaded
``Producer``; only the I/O differs, and all of it runs on the event loop of the
coroutine that started the producer: no thread of its own.

Requests go on one ``ProduceStream`` per broker (``client.streams``: a
``StreamPool`` given a ``CallerLoop``, so its grpc.aio channels, writer and
reader tasks and deadline watchdog run on this loop, not on ``tide-client-io``).
A message on an open stream costs about half the CPU of a unary call on both
sides. Answers are matched by ``correlation_id`` and applied by the stream's
reader task (``_on_response``); the records that queued behind the answered
request go one loop pass later (with those the caller's timers sent in the
pass that read the answer: see ``_on_response``). The rules are the threaded producer's:

| event                                  | what happens                                  |
|----------------------------------------|-----------------------------------------------|
| answer                                 | ``settle_produce_answer`` (offsets, retries)  |
| acks=0                                 | no answer (the broker sends none): the        |
|                                        | records resolve once queued, offset -1        |
| stream breaks (broker gone, status)    | its pending requests get the retriable        |
|                                        | ``BrokerConnectionError``: accumulator retry  |
| a request past its deadline (a hung    | the stream breaks, its requests get           |
| broker; ``request_timeout_ms`` + 5 s)  | ``RequestTimedOutError`` (retriable)          |
| UNIMPLEMENTED (the server has no       | its pending requests get the non-retriable    |
| ProduceStream: not a broker of this    | ``UnsupportedVersionError`` (acks=0 ones      |
| release)                               | resolved once queued: lost, at most once)     |

A partition has up to ``max_in_flight_per_partition`` requests out; they are
written in order on its leader's one stream, which the broker appends in
arrival order. Idempotent (the default with acks=all, as in the threaded
producer and ``client/idempotence.py``): a retry is never written twice and
order holds with up to 5 requests out; without idempotence and with more than
one request out, a retry may reorder records. With ``linger_ms=0`` a record whose partition has nothing
out is sent from ``send`` itself; otherwise the sender task sends ready
partitions. Metadata comes from the same ``MetadataClient``; a lookup or
refresh that may block runs in a worker thread so the loop never waits on it.

    async with AsyncProducer(bootstrap, acks="all") as producer:
        meta = await (await producer.send("topic", b"value"))

Transactions (``transactional_id``): the threaded producer's ``TransactionManager``
(``client/transactions.py``), its blocking coordinator calls in a worker thread as the
metadata look-ups are: ``await init_transactions()``, ``begin_transaction()``,
``await send_offsets_to_transaction(...)``, ``await commit_transaction()`` or
``await abort_transaction()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from functools import partial
from types import TracebackType

from tidewater.client.accumulator import ProducerBatch, RecordAccumulator, RecordMetadata
from tidewater.client.idempotence import IdempotentState
from tidewater.client.metadata import (
    Address,
    LeaderInfo,
    MetadataClient,
    TopicPartition,
    client_metadata,
)
from tidewater.client.partitioner import StickyPartitioner, choose_partition
from tidewater.client.producer import (
    batch_grow_bytes,
    closed_bytes,
    delivery_timeout_error,
    drain_for_request,
    give_up_sequences,
    idempotence_enabled,
    no_stream_error,
    on_producer_id_error,
    parse_acks,
    partition_held_back,
    release_in_flight,
    request_producer_id,
    settle_produce_answer,
)
from tidewater.client.streams import CallerLoop, StreamPool
from tidewater.client.transactions import ConsumerGroupMetadata, TransactionManager
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.batch_builder import Headers
from tidewater.proto.compression import compress
from tidewater.proto.errors import RequestTimedOutError, TidewaterError

__all__ = ["AsyncProducer", "RecordMetadata"]

# A request's deadline is the broker's own wait (request_timeout_ms) plus this much for
# the transport, as in the threaded producer.
DEADLINE_SLACK_S = 5.0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _record_count(batches: list[ProducerBatch]) -> int:
    return batches[0].record_count if len(batches) == 1 else sum(b.record_count for b in batches)


Groups = list[tuple[TopicPartition, list[ProducerBatch]]]
# Each partition's leader as a worker thread looked it up: None (none now) or its typed error.
Leaders = dict[TopicPartition, LeaderInfo | TidewaterError | None]


class AsyncProducer:
    # Made by start(), on the running loop (``_started``): what needs the loop or lives on it.
    _accumulator: RecordAccumulator[asyncio.Future[RecordMetadata]]
    _streams: StreamPool[pb.ProduceRequest, pb.ProduceResponse]
    _wake: asyncio.Event
    _space: asyncio.Condition
    _idle: asyncio.Event

    def __init__(self, bootstrap: str, *, acks: int | str = -1, batch_size_bytes: int = 16384,
                 linger_ms: int = 5, request_timeout_ms: int = 30000, retries: int = 2**31 - 1,
                 retry_backoff_ms: int = 100, delivery_timeout_ms: int = 120000,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, compression: int = 0,
                 request_bytes_max: int = 1024 * 1024, max_in_flight_per_partition: int = 1,
                 metadata: MetadataClient | None = None,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 enable_idempotence: bool | None = None,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000, max_block_ms: int = 60000) -> None:
        self.acks = parse_acks(acks)
        if transactional_id is not None:
            if enable_idempotence is False:
                raise ValueError("a transactional producer is idempotent "
                                 "(enable_idempotence=False with transactional_id)")
            enable_idempotence = True  # and with it acks=all (a ValueError otherwise)
        # None: on with acks=all (Kafka 3's default); True with acks 0/1: ValueError.
        self.enable_idempotence = idempotence_enabled(enable_idempotence, self.acks, retries,
                                                      max_in_flight_per_partition)
        self._idempotence = (IdempotentState(transactional=transactional_id is not None)
                             if self.enable_idempotence else None)
        self.request_timeout_ms = request_timeout_ms
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        compress(compression, b"")  # an unknown or unavailable codec fails here, not per batch
        self.compression = compression
        self.request_bytes_max = request_bytes_max
        self.max_in_flight_per_partition = max_in_flight_per_partition
        # TLS settings (client/security.py, Kafka's names) for the streams and the
        # metadata client made here (a given ``metadata`` needs ``security=`` of its own).
        self._security, self.metadata = client_metadata(
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
        self._batch_size_bytes = batch_size_bytes
        self._linger_ms = linger_ms
        self._partitioner = StickyPartitioner(batch_size_bytes)
        self._started = False
        self._in_flight: dict[TopicPartition, int] = {}  # requests out per partition
        self._batch_bytes_max: dict[TopicPartition, int] = {}  # batch_grow_bytes
        self._records_in_flight = 0  # buffered_records less these are the records queued
        self._space_waiters = 0  # send() calls waiting for buffer space
        self._sender: asyncio.Task[None] | None = None
        self._unfinished = 0
        self._closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._accumulator = RecordAccumulator(
            batch_size_bytes=self._batch_size_bytes, linger_ms=self._linger_ms,
            future_factory=loop.create_future,
            batch_attributes=TRANSACTIONAL_MASK if self._txn is not None else 0)
        if self._idempotence is not None:
            self._accumulator.grow_bytes_for = partial(batch_grow_bytes, self)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._space = asyncio.Condition()
        self._streams = StreamPool("ProduceStream", ordered=False, io=CallerLoop(loop),
                                   security=self._security)
        self._sender = asyncio.create_task(self._run(), name="tide-aio-producer-sender")
        self._started = True

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ------------------------------------------------------------------ public API

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None,
                   partition: int | None = None,
                   headers: Iterable[tuple[str | bytes, bytes | None]] | None = (),
                   timestamp_ms: int | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns (once queued) the future of its RecordMetadata."""
        if self._closed or not self._started:
            raise RuntimeError("producer is not running (use `async with` or start())")
        parts = self.metadata.cached_partitions(topic)
        if parts is None:
            parts = await asyncio.to_thread(self.metadata.partitions_for, topic)
        partition = choose_partition(topic, parts, partition, key, value, self._partitioner)
        accumulator = self._accumulator
        if accumulator.buffered_bytes >= self.buffer_memory_bytes:
            self._space_waiters += 1
            try:
                async with self._space:
                    await self._space.wait_for(
                        lambda: accumulator.buffered_bytes < self.buffer_memory_bytes)
            finally:
                self._space_waiters -= 1
        tp = TopicPartition(topic, partition)
        if self._txn is not None and not self._txn.has_partition(tp):
            # AddPartitionsToTxn blocks: in a worker thread; raises outside a transaction
            await asyncio.to_thread(self._txn.maybe_add_partition, tp)
        created = accumulator.batches_created
        now_ms = _now_ms()
        record_headers: Headers = tuple(headers) if headers else ()
        fut = accumulator.add(tp, key, value, record_headers,
                              timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000,
                              now_ms)
        self._unfinished += 1
        self._idle.clear()
        in_flight = self._in_flight.get(tp, 0)
        if (self._linger_ms == 0 and in_flight == 0 and accumulator.partition_ready(tp, now_ms)
                and (self._idempotence is None or self._idempotence.has_producer_id)):
            # Nothing of this partition out and no linger: send now rather than wake the
            # sender task (one task switch less per lone record).
            if self._send_or_fail([tp]):
                self._wake.set()  # its metadata is not cached: the sender looks it up
        elif ((created != accumulator.batches_created or self._linger_ms == 0)
              and in_flight < self.max_in_flight_per_partition):
            # Readiness may have changed (a new batch, or no linger); not while the
            # partition's requests are all out: their answer sends what queued meanwhile.
            self._wake.set()
        return fut

    async def send_and_wait(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                            partition: int | None = None,
                            headers: Iterable[tuple[str | bytes, bytes | None]] | None = (),
                            timestamp_ms: int | None = None) -> RecordMetadata:
        return await (await self.send(topic, value, key=key, partition=partition,
                                      headers=headers, timestamp_ms=timestamp_ms))

    # ------------------------------------------------------------------ transactions

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise RuntimeError("not a transactional producer (no transactional_id)")
        if self._closed or not self._started:
            raise RuntimeError("producer is not running (use `async with` or start())")
        return self._txn

    async def init_transactions(self) -> None:
        """As ``Producer.init_transactions`` (fences older producers with the id)."""
        await asyncio.to_thread(self._transactions().init)

    def begin_transaction(self) -> None:
        self._transactions().begin()

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int]
                                          | dict[tuple[str, int], int],
                                          group_metadata: ConsumerGroupMetadata | str) -> None:
        """As ``Producer.send_offsets_to_transaction``."""
        group = (ConsumerGroupMetadata(group_metadata) if isinstance(group_metadata, str)
                 else group_metadata)
        await asyncio.to_thread(self._transactions().send_offsets, offsets, group)

    async def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Flush, then EndTxn(commit); ``TransactionAbortRequiredError`` after a failed send."""
        txn = self._transactions()
        txn.check_commit()
        await self.flush(timeout_s)
        await asyncio.to_thread(txn.end, True)

    async def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Wait for the records in flight (sent after the marker they would start a
        transaction of their own), then EndTxn(abort)."""
        txn = self._transactions()
        txn.check_abort()
        await self.flush(timeout_s)
        await asyncio.to_thread(txn.end, False)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now and wait until every record is resolved."""
        self._accumulator.begin_flush()
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            raise RequestTimedOutError(f"flush timed out with {self._unfinished} records pending") from None
        finally:
            self._accumulator.end_flush()

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the sender task, close the streams (the brokers answer what they
        have; acks=0 requests still queued are sent first), fail what is left."""
        if self._closed or not self._started:
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await self.flush(timeout_s)
        finally:
            self._closed = True  # answers from here on are not retried
            self._wake.set()
            if self._sender is not None:
                await self._sender
            # acks=0 requests still queued resolve once queued: wait for them to be written
            # for what is left of the close's timeout, else up to a request timeout.
            await self._streams.aclose(self.request_timeout_ms / 1000 if deadline is None
                                       else max(0.0, deadline - time.monotonic()))
            for batch in self._accumulator.abort_all():
                self._finish(batch, RuntimeError("producer closed before delivery"))
            self.metadata.close()

    # ------------------------------------------------------------------ the sender task

    async def _run(self) -> None:
        while not self._closed:
            now = _now_ms()
            for batch in self._accumulator.expire(now, self.delivery_timeout_ms):
                self._finish(batch, delivery_timeout_error(batch, self.delivery_timeout_ms))
                give_up_sequences(self, batch.tp, batch)
            muted = {tp for tp in self._in_flight if partition_held_back(self, tp)}
            ready, next_ms = self._accumulator.ready(now, muted=muted)
            if not ready:
                self._wake.clear()
                wait_s = 0.2 if next_ms is None else max(0.001, min(0.2, (next_ms - now) / 1000))
                try:
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            idempotence = self._idempotence
            if idempotence is not None and not idempotence.has_producer_id:
                if self._txn is not None:
                    # init_transactions' id (no record is queued before it): never spin
                    await asyncio.sleep(self.retry_backoff_ms / 1000)
                    continue
                try:  # InitProducerId blocks: in a worker thread
                    producer_id, epoch = await asyncio.to_thread(
                        request_producer_id, self.metadata, self.request_timeout_ms / 1000)
                except TidewaterError as e:
                    on_producer_id_error(self, ready, e)
                    continue
                if not idempotence.has_producer_id:
                    idempotence.set_producer_id(producer_id, epoch)
            unknown = self._send_or_fail(ready)
            if unknown:
                # Their metadata is not cached: look the leaders up in a worker thread (it
                # may refresh, which blocks), then send.
                leaders = await asyncio.to_thread(self._look_up_leaders, unknown)
                if not self._closed:
                    self._send_or_fail(unknown, leaders)

    def _look_up_leaders(self, tps: list[TopicPartition]) -> Leaders:
        """Worker thread: each partition's leader, None (none now) or its typed error."""
        out: Leaders = {}
        for tp in tps:
            try:
                out[tp] = self.metadata.leader_for(tp)
            except TidewaterError as e:
                out[tp] = e
        return out

    # ------------------------------------------------------------------ sending (never blocks)

    def _send_or_fail(self, ready: list[TopicPartition],
                      leaders: Leaders | None = None) -> list[TopicPartition]:
        """``_send_ready``, failing the partitions' queued batches if it breaks."""
        try:
            return self._send_ready(ready, leaders)
        except Exception as e:  # a sender bug must fail records, not hang them
            for tp in ready:
                if tp not in self._in_flight:  # else its request is out; the answer resolves it
                    for batch in self._accumulator.drain_many(tp, self.request_bytes_max):
                        self._finish(batch, e)
            return []

    def _send_ready(self, ready: list[TopicPartition],
                    leaders: Leaders | None = None) -> list[TopicPartition]:
        """Send every queued batch of the ready partitions, one request per leader; returns
        the partitions left for a leader lookup (metadata not cached, nor in ``leaders``)."""
        metadata, accumulator = self.metadata, self._accumulator
        by_leader: dict[Address, Groups] = {}
        unknown: list[TopicPartition] = []
        refresh = False
        for tp in ready:
            leader: LeaderInfo | TidewaterError | None
            if leaders is not None and tp in leaders:
                leader = leaders[tp]
            elif metadata.cached_partitions(tp.topic) is None:
                unknown.append(tp)
                continue
            else:
                try:
                    leader = metadata.leader_for(tp)  # cached: does not block
                except TidewaterError as e:
                    leader = e
            if isinstance(leader, TidewaterError):
                if not leader.retriable:
                    for batch in accumulator.drain_many(tp, self.request_bytes_max):
                        self._finish(batch, leader)
                    continue
                leader = None
            if leader is None:
                # No leader known: new metadata after a backoff (the delivery timeout applies).
                refresh = True
                accumulator.postpone(tp, _now_ms() + self.retry_backoff_ms)
                continue
            if partition_held_back(self, tp) or (
                    self._idempotence is not None and not self._idempotence.has_producer_id):
                continue  # the sender task asks for the producer id first
            batches = drain_for_request(self, tp)
            if not batches:
                continue
            try:
                for batch in batches:
                    batch.close(self.compression)
            except Exception as e:  # e.g. a compression codec failing: fail, not hang
                for batch in batches:
                    self._finish(batch, e)
                continue
            self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
            self._records_in_flight += _record_count(batches)
            by_leader.setdefault(leader.address, []).append((tp, batches))
        if refresh:
            metadata.invalidate()
        for address, groups in by_leader.items():
            request = pb.ProduceRequest(acks=self.acks, timeout_ms=self.request_timeout_ms,
                                        transactional_id=self._txn.transactional_id
                                        if self._txn is not None else "")
            add_partition = request.partitions.add
            for tp, batches in groups:
                add_partition(topic=tp.topic, partition=tp.partition,
                              records=batches[0].encoded if len(batches) == 1
                              else b"".join(closed_bytes(b) for b in batches))
            self._send_request(address, request, groups)
        return unknown

    def _send_request(self, address: Address, request: pb.ProduceRequest, groups: Groups) -> None:
        """On the broker's ProduceStream (opened now if there is none)."""
        timeout_s = self.request_timeout_ms / 1000 + DEADLINE_SLACK_S
        if self.acks == 0:
            # No answer comes: the records resolve once the request is queued, after the
            # sending loop of _send_ready (so no re-entrant send from here).
            if self._streams.send(address, request, _no_answer, timeout_s,
                                  answered=False) is not None:
                asyncio.get_running_loop().call_soon(self._on_response, groups, None, None)
                return
        elif self._streams.send(address, request, partial(self._on_response, groups),
                                timeout_s) is not None:
            return
        # A transport failure, settled after the sending loop of _send_ready like acks=0.
        asyncio.get_running_loop().call_soon(self._on_response, groups, None,
                                             no_stream_error(address))

    # ------------------------------------------------------------------ answers

    def _on_response(self, groups: Groups, response: pb.ProduceResponse | None,
                     transport_error: BaseException | None) -> None:
        """An answer, a transport error, or (acks=0) the request queued: settle its
        batches, then send what queued behind it one loop pass later (no sender wake-up).

        Why a pass later: the answer is read in the same loop pass in which the caller's
        timers that fell due meanwhile fire (an event loop's timers run late: uvloop's
        count whole ms), and the reader runs first. Sent at once, the request leaves
        without the records those timers send, and they wait a whole round behind it;
        one pass later they go in it, and the answered records' futures resolve before
        the next request is built."""
        for tp, batches in groups:
            release_in_flight(self._in_flight, tp)
            self._records_in_flight -= _record_count(batches)
        refresh = settle_produce_answer(self, groups, response, transport_error, _now_ms())
        if refresh:
            self.metadata.invalidate()
        elif not self._closed and self._accumulator.buffered_records > self._records_in_flight:
            # (Nothing queued: no pass to wait for; a record sent now goes from send itself.)
            asyncio.get_running_loop().call_soon(self._send_behind, [tp for tp, _ in groups])
            return
        self._wake_for_waiting()

    def _send_behind(self, tps: list[TopicPartition]) -> None:
        """The answered partitions' queued records (those ``send`` did not take meanwhile)."""
        if not self._closed:
            now_ms, accumulator = _now_ms(), self._accumulator
            ready = [tp for tp in tps
                     if not partition_held_back(self, tp) and accumulator.partition_ready(tp, now_ms)]
            if ready:
                self._send_or_fail(ready)  # uncached metadata: left to the sender, woken below
        self._wake_for_waiting()

    def _wake_for_waiting(self) -> None:
        if self._accumulator.buffered_records > self._records_in_flight:
            self._wake.set()  # records wait (behind a request, to retry, or for metadata)

    def _finish(self, batch: ProducerBatch, error: BaseException | None,
                base_offset: int = -1, log_append_time_ms: int = -1) -> None:
        self._accumulator.release(batch)
        if error is None:
            batch.complete(base_offset, log_append_time_ms)
        else:
            batch.fail(error)
            if self._txn is not None:
                self._txn.on_batch_failed(error)  # the transaction must be aborted
        self._unfinished -= batch.record_count
        if self._unfinished == 0:
            self._idle.set()
        if self._space_waiters and self._accumulator.buffered_bytes < self.buffer_memory_bytes:
            asyncio.get_running_loop().create_task(self._notify_space())

    async def _notify_space(self) -> None:
        async with self._space:
            self._space.notify_all()


def _no_answer(response: pb.ProduceResponse | None, error: TidewaterError | None) -> None:
    """The stream's callback of an acks=0 request: the broker never answers it."""
