"""The asyncio producer: the same batching and answer handling as ``client.producer``, on grpc.aio.

For asyncio programs and benchmarks that want many requests in flight without
threads. It shares the ``RecordAccumulator`` (with asyncio futures), the
partitioner and ``settle_produce_answer`` (the decision table) with the
threaded ``Producer``; only the I/O differs: one sender task, one
``grpc.aio`` channel per broker, one task per ProduceRequest. Metadata comes
from the same ``MetadataClient``; its blocking refresh runs in a worker
thread so the event loop never waits on it.

    async with AsyncProducer(bootstrap, acks="all") as producer:
        meta = await (await producer.send("topic", b"value"))
"""

from __future__ import annotations

import asyncio
import time

import grpc

from client.accumulator import ProducerBatch, RecordAccumulator, RecordMetadata
from client.metadata import (
    CHANNEL_OPTIONS,
    Address,
    MetadataClient,
    TopicPartition,
    format_address,
    rpc_error_to_typed,
)
from client.partitioner import StickyPartitioner, choose_partition
from client.producer import delivery_timeout_error, parse_acks, settle_produce_answer
from proto import tidewater_pb2 as pb
from proto import tidewater_pb2_grpc as pb_grpc
from proto.errors import RequestTimedOutError, TidewaterError

__all__ = ["AsyncProducer", "RecordMetadata"]


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class AsyncProducer:
    def __init__(self, bootstrap: str, *, acks: int | str = -1, batch_size_bytes: int = 16384,
                 linger_ms: int = 5, request_timeout_ms: int = 30000, retries: int = 2**31 - 1,
                 retry_backoff_ms: int = 100, delivery_timeout_ms: int = 120000,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, compression: int = 0,
                 request_bytes_max: int = 1024 * 1024, metadata: MetadataClient | None = None):
        self.acks = parse_acks(acks)
        self.request_timeout_ms = request_timeout_ms
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self.compression = compression
        self.request_bytes_max = request_bytes_max
        self.metadata = metadata or MetadataClient(bootstrap, request_timeout_ms=min(request_timeout_ms, 10000))
        self._batch_size_bytes = batch_size_bytes
        self._linger_ms = linger_ms
        self._partitioner = StickyPartitioner(batch_size_bytes)
        self._accumulator: RecordAccumulator | None = None
        self._in_flight: dict[TopicPartition, list[ProducerBatch]] = {}
        self._requests: set[asyncio.Task] = set()
        self._channels: dict[Address, grpc.aio.Channel] = {}
        self._stubs: dict[Address, pb_grpc.BrokerStub] = {}
        self._wake: asyncio.Event | None = None
        self._space: asyncio.Condition | None = None
        self._sender: asyncio.Task | None = None
        self._unfinished = 0
        self._idle: asyncio.Event | None = None
        self._closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._accumulator = RecordAccumulator(batch_size_bytes=self._batch_size_bytes,
                                              linger_ms=self._linger_ms, future_factory=loop.create_future)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._space = asyncio.Condition()
        self._sender = asyncio.create_task(self._run(), name="tide-aio-producer-sender")

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ public API

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None,
                   partition: int | None = None, headers=(), timestamp_ms: int | None = None
                   ) -> asyncio.Future:
        """Queue one record; returns (once queued) the future of its RecordMetadata."""
        if self._closed or self._accumulator is None:
            raise RuntimeError("producer is not running (use `async with` or start())")
        parts = self.metadata.cached_partitions(topic)
        if parts is None:
            parts = await asyncio.to_thread(self.metadata.partitions_for, topic)
        partition = choose_partition(topic, parts, partition, key, value, self._partitioner)
        if self._accumulator.buffered_bytes >= self.buffer_memory_bytes:
            async with self._space:
                await self._space.wait_for(
                    lambda: self._accumulator.buffered_bytes < self.buffer_memory_bytes)
        created = self._accumulator.batches_created
        fut = self._accumulator.add(
            TopicPartition(topic, partition), key, value, tuple(headers) if headers else (),
            timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000, _now_ms())
        self._unfinished += 1
        self._idle.clear()
        if created != self._accumulator.batches_created or self._linger_ms == 0:
            self._wake.set()
        return fut

    async def send_and_wait(self, topic: str, value: bytes | None, **kwargs) -> RecordMetadata:
        return await (await self.send(topic, value, **kwargs))

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now and wait until every record is resolved."""
        self._accumulator.begin_flush()
        self._wake.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            raise RequestTimedOutError(f"flush timed out with {self._unfinished} records pending") from None
        finally:
            self._accumulator.end_flush()

    async def close(self, timeout_s: float | None = None) -> None:
        if self._closed or self._accumulator is None:
            return
        try:
            await self.flush(timeout_s)
        finally:
            self._closed = True
            self._wake.set()
            if self._sender is not None:
                await self._sender
            for task in list(self._requests):
                task.cancel()
            await asyncio.gather(*self._requests, return_exceptions=True)
            for batch in self._accumulator.abort_all():
                self._finish(batch, RuntimeError("producer closed before delivery"))
            for channel in self._channels.values():
                await channel.close()
            self.metadata.close()

    # ------------------------------------------------------------------ internals

    def _finish(self, batch: ProducerBatch, error: BaseException | None,
                base_offset: int = -1, log_append_time_ms: int = -1) -> None:
        self._accumulator.release(batch)
        if error is None:
            batch.complete(base_offset, log_append_time_ms)
        else:
            batch.fail(error)
        self._unfinished -= batch.record_count
        if self._unfinished == 0:
            self._idle.set()
        if self._space is not None and self._accumulator.buffered_bytes < self.buffer_memory_bytes:
            asyncio.get_running_loop().create_task(self._notify_space())

    async def _notify_space(self) -> None:
        async with self._space:
            self._space.notify_all()

    def _stub(self, address: Address) -> pb_grpc.BrokerStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(format_address(address), options=CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.BrokerStub(channel)
        return stub

    async def _run(self) -> None:
        while not self._closed:
            now = _now_ms()
            for batch in self._accumulator.expire(now, self.delivery_timeout_ms):
                self._finish(batch, delivery_timeout_error(batch, self.delivery_timeout_ms))
            ready, next_ms = self._accumulator.ready(now, muted=set(self._in_flight))
            if not ready:
                self._wake.clear()
                wait_s = 0.2 if next_ms is None else max(0.001, min(0.2, (next_ms - now) / 1000))
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                except TimeoutError:
                    pass
                continue
            try:
                await self._send_ready(ready)
            except Exception as e:  # noqa: BLE001 - a sender bug must fail records, not hang them
                for tp in ready:
                    if tp not in self._in_flight:
                        for batch in self._accumulator.drain_many(tp, self.request_bytes_max):
                            self._finish(batch, e)

    async def _send_ready(self, ready: list[TopicPartition]) -> None:
        snap = self.metadata.snapshot
        if snap is None or not self.metadata.cached_partitions(ready[0].topic):
            try:
                await asyncio.to_thread(self.metadata.refresh)
            except TidewaterError:
                pass  # no broker reachable now: batches wait, and expire by the delivery timeout
        by_leader: dict[Address, list[tuple[TopicPartition, list[ProducerBatch]]]] = {}
        for tp in ready:
            try:
                leader = self.metadata.leader_for(tp)
            except TidewaterError as e:
                if not e.retriable:
                    for batch in self._accumulator.drain_many(tp, self.request_bytes_max):
                        self._finish(batch, e)
                    continue
                leader = None
            if leader is None:
                self.metadata.invalidate()
                self._accumulator.postpone(tp, _now_ms() + self.retry_backoff_ms)
                continue
            batches = self._accumulator.drain_many(tp, self.request_bytes_max)
            if not batches:
                continue
            try:
                for batch in batches:
                    batch.close(self.compression)
            except Exception as e:  # noqa: BLE001 - e.g. a compression codec failing: fail, not hang
                for batch in batches:
                    self._finish(batch, e)
                continue
            self._in_flight[tp] = batches
            by_leader.setdefault(leader.address, []).append((tp, batches))
        for address, groups in by_leader.items():
            task = asyncio.create_task(self._request(address, groups))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _request(self, address: Address, groups) -> None:
        request = pb.ProduceRequest(
            acks=self.acks, timeout_ms=self.request_timeout_ms,
            partitions=[pb.ProducePartitionData(
                topic=tp.topic, partition=tp.partition,
                records=batches[0].encoded if len(batches) == 1 else b"".join(b.encoded for b in batches))
                for tp, batches in groups])
        response, error = None, None
        try:
            response = await self._stub(address).Produce(request, timeout=self.request_timeout_ms / 1000 + 5)
        except grpc.RpcError as e:
            error = rpc_error_to_typed(e, address)
        except asyncio.CancelledError:
            error = RuntimeError("producer closed before the answer")
        except Exception as e:  # noqa: BLE001 - never leave futures hanging
            error = e
        for tp, _ in groups:
            self._in_flight.pop(tp, None)
        if settle_produce_answer(self, groups, response, error, _now_ms()):
            self.metadata.invalidate()
        self._wake.set()
