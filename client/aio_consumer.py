"""The asyncio consumer for assigned partitions: the threaded ``client.consumer``'s
positions, fetch requests, decoding and error table, read on the caller's loop.

The threaded ``Consumer`` reads its FetchStreams on the ``tide-client-io`` loop thread
and hands each answer to the polling thread (a latch and a GIL exchange per answer:
``docs/benchmarks.md``, issue 30, measured ~10.5 context switches a round in a paced
receiver against ~6 for one loop). Here the streams run on the loop of the coroutine
that started the consumer (``client.streams.StreamPool`` given a ``CallerLoop``), and
``poll`` decodes each answer on that loop: no thread hand-off.

What is shared, by composition with a ``Consumer`` that never opens its own streams:
assignment and positions (``assign``, ``seek``), resets by ``auto_offset_reset``
(ListOffsets, blocking: run in a worker thread, as the asyncio producer runs its
metadata look-ups), the FetchRequest's fields, CRC check and decoding, aborted
transactions (read_committed), and the per-partition answer table (retriable errors
refresh metadata and back off; OFFSET_OUT_OF_RANGE resets; the rest raises).

Groups (``group_id``): ``subscribe``, ``commit``, ``committed`` and ``group_metadata``
are the threaded ``Consumer``'s own (``client.group``: join, sync, heartbeats on their
thread, the assignors, auto-commit, rejoining when a subscribed topic grows). Their calls
block, so a poll that must rejoin or auto-commit runs that step in a worker thread and
awaits it; ``on_assign`` / ``on_revoke`` run there too, while the poll waits. The check
whether a rejoin is due is made on the loop, so a poll of a stable group has no hand-off.

Not here: prefetch. One fetch per leader is out at a time: ``poll`` waits for the
answers, each a long-poll of up to ``min(fetch_max_wait_ms, what is left of
timeout_ms)``, so a poll may end up to a round trip after its timeout. A poll cancelled
while its long-poll is out breaks that stream (the next poll opens a new one): an
ordered stream would otherwise hold the next fetch's answer behind it.

    async with AsyncConsumer(bootstrap) as consumer:
        consumer.assign([("topic", 0)])
        records = await consumer.poll(1000)

    async with AsyncConsumer(bootstrap, group_id="g") as consumer:
        consumer.subscribe(["topic"])
        records = await consumer.poll(1000)
        await consumer.commit()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType

from tidewater.client.consumer import Consumer, ConsumerRecord, FetchChunk, Partitions
from tidewater.client.group import RebalanceCallback
from tidewater.client.metadata import (
    Address,
    BrokerConnectionError,
    LeaderInfo,
    TopicPartition,
    format_address,
)
from tidewater.client.streams import CallerLoop, ClientStream, StreamPool
from tidewater.client.transactions import ConsumerGroupMetadata
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError

__all__ = ["AsyncConsumer"]

# A fetch sent: its stream (None: none to send on) and its answer.
SentFetch = tuple["ClientStream[pb.FetchRequest, pb.FetchResponse] | None",
                  "asyncio.Future[pb.FetchResponse]"]


class AsyncConsumer:
    _streams: StreamPool[pb.FetchRequest, pb.FetchResponse]  # made by start(), on the loop

    def __init__(self, bootstrap: str, **consumer_options: object) -> None:
        """``consumer_options``: the threaded ``Consumer``'s keyword arguments
        (``auto_offset_reset``, ``fetch_max_wait_ms``, TLS and SASL, ``isolation_level``,
        ``group_id``, ``enable_auto_commit`` ...)."""
        self._core = Consumer(bootstrap, **consumer_options)  # type: ignore[arg-type]
        self._started = False
        self._closed = False

    async def start(self) -> None:
        self._streams = StreamPool("FetchStream", ordered=True, io=CallerLoop(),
                                   security=self._core.security)
        self._started = True

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ------------------------------------------------------------------ groups

    def subscribe(self, topics: list[str], *, on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None) -> None:
        """Share ``topics``' partitions with the group's other members (needs ``group_id``);
        the next poll joins. The callbacks run in the worker thread of that poll's rejoin."""
        self._core.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke)

    async def commit(self, offsets: Mapping[TopicPartition, int]
                     | Mapping[tuple[str, int], int] | None = None) -> None:
        """``Consumer.commit`` (by default every assigned partition's position), awaited;
        CommitFailedError when the group has rebalanced meanwhile."""
        await asyncio.to_thread(self._core.commit, offsets)

    async def committed(self, tps: Partitions) -> dict[TopicPartition, int]:
        """The group's committed offset of each partition (-1: none)."""
        return await asyncio.to_thread(self._core.committed, tps)

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._core.group_metadata()

    # ------------------------------------------------------------------ positions

    def assign(self, partitions: Partitions) -> None:
        self._core.assign(partitions)

    def assignment(self) -> list[TopicPartition]:
        return self._core.assignment()

    def seek(self, partition: tuple[str, int], offset: int) -> None:
        self._core.seek(partition, offset)

    def seek_to_beginning(self, tps: Partitions | None = None) -> None:
        self._core.seek_to_beginning(tps)

    def seek_to_end(self, tps: Partitions | None = None) -> None:
        self._core.seek_to_end(tps)

    async def position(self, partition: tuple[str, int]) -> int:
        """The next offset ``poll`` returns (a pending reset is resolved now, in a thread)."""
        return await asyncio.to_thread(self._core.position, partition)

    # ------------------------------------------------------------------ fetching

    async def poll(self, timeout_ms: int = 1000) -> list[ConsumerRecord]:
        """Records fetched within ``timeout_ms`` (empty when none arrived)."""
        if self._closed or not self._started:
            raise RuntimeError("consumer is not running (use `async with` or start())")
        core = self._core
        deadline = time.monotonic() + timeout_ms / 1000
        if core.group is not None:
            core.group.last_poll_s = time.monotonic()  # the heartbeats' max.poll.interval
            if core.auto_commit_due():
                await asyncio.to_thread(core.maybe_auto_commit)
        while True:
            if core.rebalance_due():
                await asyncio.to_thread(core.rebalance, deadline)
            if core.needs_positions():
                await asyncio.to_thread(core.resolve_positions, deadline)
            records = await self._fetch_once(deadline)
            if records or time.monotonic() >= deadline:
                return records

    async def _fetch_once(self, deadline: float) -> list[ConsumerRecord]:
        """The threaded ``Consumer._fetch_once`` without prefetch: its plan, requests and
        answer table (``Consumer.fetch_plan``, ``read_fetch_answer``), awaited here."""
        core = self._core
        now = time.monotonic()
        fetchable = core.fetchable(now)
        leaders: dict[TopicPartition, LeaderInfo | None] = {
            tp: core.metadata.cached_leader_for(tp) for tp, _ in fetchable}
        unknown = [tp for tp, leader in leaders.items() if leader is None]
        if unknown:  # a metadata refresh blocks: in a worker thread
            leaders.update(await asyncio.to_thread(
                lambda: {tp: core.leader_or_none(tp) for tp in unknown}))
        wanted = core.fetch_plan(fetchable, leaders.get)
        if not wanted:
            await asyncio.sleep(core.idle_wait_s(deadline))
            return []
        wait_ms = core.fetch_wait_ms(deadline, now)
        calls = [(items, *self._send_fetch(address, core.fetch_request(items, wait_ms)))
                 for address, items in wanted.items()]
        chunks: list[FetchChunk] = []
        for i, (items, _stream, answer) in enumerate(calls):
            try:
                try:
                    response: pb.FetchResponse | TidewaterError = await answer
                except TidewaterError as e:  # a transport failure
                    response = e
                chunks += core.read_fetch_answer(items, response)[0]  # raises a fatal error
            except BaseException:
                self._withdraw([(stream, a) for _, stream, a in calls[i:]])
                raise
        return core.decode_chunks(chunks)

    def _send_fetch(self, address: Address, request: pb.FetchRequest) -> SentFetch:
        """On the broker's FetchStream: (the stream, or None when none could be had; the
        answer's future, resolved on this loop by the stream's reader task or failed
        with the stream's typed error)."""
        answer: asyncio.Future[pb.FetchResponse] = asyncio.get_running_loop().create_future()

        def on_answer(response: pb.FetchResponse | None, error: TidewaterError | None) -> None:
            if answer.done():
                return  # withdrawn
            if error is not None or response is None:
                answer.set_exception(error or BrokerConnectionError("fetch without an answer"))
            else:
                answer.set_result(response)

        stream = self._streams.send(address, request, on_answer,
                                    self._core.fetch_timeout_s(request.max_wait_ms))
        if stream is None:
            answer.set_exception(BrokerConnectionError(
                f"no FetchStream to {format_address(address)} to send on"))
        return stream, answer

    @staticmethod
    def _withdraw(sent: list[SentFetch]) -> None:
        """Long-polls not wanted any more: their streams break (the next poll opens new
        ones), so no later answer waits behind them."""
        for stream, answer in sent:
            # Cancelled: by us, or by the cancellation of the poll awaiting it.
            if not answer.done() or answer.cancelled():
                if stream is not None:
                    stream.abort(BrokerConnectionError("long-poll fetch withdrawn"))
                answer.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self._streams.aclose()
        await asyncio.to_thread(self._core.close)
