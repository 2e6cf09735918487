"""Follower fetchers: one task per leader broker, all its partitions in one Fetch request.

Theory of operation (per partition, a ``FetchAssignment`` made by LeaderAndIsr):
1. truncating: ask the leader ``OffsetForLeaderEpoch(latest local epoch)`` and
   truncate by ``follower_truncation`` until it says done (replication.md);
2. fetching: long-poll from the LEO with ``last_fetched_epoch``;
   append as follower, HW = min(leader HW, LEO). A ``diverging_epoch`` answer
   truncates the same way without a separate round trip.

Transport: one ReplicaFetch stream per leader broker, one request then its one
answer; a changed assignment set cancels the stream (and so the leader's
pending long-poll) and the next round opens another. A broken stream is
dropped and reopened after ``replica.fetch.backoff.ms``. A leader answering
UNIMPLEMENTED (not a broker of this release: there is no other way to fetch
from it) is logged at ERROR as ``UnsupportedVersionError`` and its partitions
are parked until the next LeaderAndIsr, as for FENCED_LEADER_EPOCH.

Cost per round (a follower sends one request per record at one record per
produce request, so this is paid at the record rate): the fetcher task itself
awaits the stream's read, with no task, future or ``asyncio.wait`` per round;
what cuts the read short (a changed assignment set, an answer overdue) cancels
the stream call instead, and the deadline is one timer re-armed lazily. The
request message is built once per assignment set and only its offsets and
epochs are set per round (~1.5 µs; building it each round cost ~13 µs).

Safety: an answer is applied only if the partition still has the same
assignment object (same leader epoch) after taking its lock, so a fetcher
never appends or truncates for a partition whose leader epoch changed while
the request was in flight. Errors: FENCED_LEADER_EPOCH (we are stale) parks
the partition until the next LeaderAndIsr; UNKNOWN_LEADER_EPOCH,
NOT_LEADER_OR_FOLLOWER and lost connections back off and retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from tidewater.broker.channels import channel_options
from tidewater.broker.clock import wall_ms
from tidewater.broker.error_mapping import error_code_for
from tidewater.broker.replication import follower_truncation
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.batch import iter_batches
from tidewater.proto.errors import UnsupportedVersionError

if TYPE_CHECKING:
    from tidewater.broker.partition import Partition
    from tidewater.broker.replica_manager import ReplicaManager

log = logging.getLogger("tidewater.broker.fetcher")

RPC_MARGIN_S = 5.0


class StreamBrokenError(Exception):
    """The ReplicaFetch stream ended or went silent: reconnect after the backoff."""


@dataclass(eq=False)
class FetchAssignment:
    """Follow ``partition`` from one leader in one leader epoch."""

    partition: Partition
    leader_id: int
    leader_epoch: int
    truncating: bool = True
    parked: bool = False  # fenced: wait for the next LeaderAndIsr
    retry_at: float = 0.0  # monotonic seconds; backoff after an error

    @property
    def current(self) -> bool:
        return self.partition.leader_epoch == self.leader_epoch and not self.partition.is_leader


class LeaderFetcher:
    """Fetches every partition led by ``leader_id`` in one long-poll request."""

    def __init__(self, manager: FetcherManager, leader_id: int):
        self.manager = manager
        self.leader_id = leader_id
        self.assignments: dict = {}
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._endpoint: tuple[str, int] | None = None
        self._stub: pb_grpc.BrokerStub | None = None
        self._stream: grpc.aio.StreamStreamCall | None = None  # ReplicaFetch
        # While the task awaits an answer on the stream (``_read_answer``): what cuts
        # the wait short cancels the stream call, so the read needs no task of its own.
        self._reading = False
        self._read_deadline = 0.0  # loop time; an answer not read by then breaks the stream
        self._read_timer: asyncio.TimerHandle | None = None
        # The request, built once per assignment set (``_fetch_request``).
        self._request: pb.FetchRequest | None = None
        self._request_for: list[FetchAssignment] = []
        self._request_partitions: list = []  # (FetchPartition message, (topic, partition))
        self._loop = asyncio.get_running_loop()
        self.task = asyncio.create_task(self._run(), name=f"fetcher-{leader_id}")

    def add(self, assignment: FetchAssignment) -> None:
        self.assignments[assignment.partition.tp] = assignment
        self.mark_changed()

    def remove(self, tp) -> None:
        if self.assignments.pop(tp, None) is not None:
            self.mark_changed()

    def mark_changed(self) -> None:
        """The assignment set (or an assignment's state) changed: start a new round now.

        A long-poll in progress is cut short by cancelling the stream (the leader
        drops the pending fetch); the next round opens another stream.
        """
        self._changed.set()
        if self._reading:
            self._drop_stream()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self._drop_stream()
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self._channel is not None:
            await self._channel.close()

    # ------------------------------------------------------------------ loop

    def _connect(self) -> pb_grpc.BrokerStub | None:
        endpoint = self.manager.replica_manager.leader_endpoints.get(self.leader_id)
        if endpoint is None:
            return None
        if endpoint != self._endpoint:
            self._drop_stream()
            if self._channel is not None:
                asyncio.ensure_future(self._channel.close())
            limit = self.manager.config.socket_request_max_bytes
            self._channel = grpc.aio.insecure_channel(f"{endpoint[0]}:{endpoint[1]}",
                                                      options=channel_options(limit))
            self._stub = pb_grpc.BrokerStub(self._channel)
            self._endpoint = endpoint
        return self._stub

    async def _run(self) -> None:
        backoff_s = self.manager.config.replica_fetch_backoff_ms / 1000
        while True:
            self._changed.clear()
            now = time.monotonic()
            active = [a for a in self.assignments.values()
                      if not a.parked and a.current and a.retry_at <= now]
            stub = self._connect()
            if not active or stub is None:
                waits = [a.retry_at - now for a in self.assignments.values()
                         if not a.parked and a.retry_at > now]
                timeout = min(waits) if waits else (backoff_s if stub is None else None)
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            try:
                truncating = [a for a in active if a.truncating]
                if truncating:
                    await self._truncate(stub, truncating)
                    continue
                await self._stream_fetch_until_changed(stub, active)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._park_unsupported(active, e, "OffsetForLeaderEpoch" if truncating
                                           else "ReplicaFetch")
                    continue
                log.debug("fetch from broker %d failed: %s", self.leader_id, e.code().name)
                await asyncio.sleep(backoff_s)
            except (StreamBrokenError, asyncio.InvalidStateError) as e:
                # InvalidStateError: a write on a stream the leader already closed.
                log.debug("ReplicaFetch stream to broker %d broke: %s", self.leader_id, e)
                await asyncio.sleep(backoff_s)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug must not kill replication silently
                log.exception("fetcher for leader %d failed; retrying", self.leader_id)
                await asyncio.sleep(backoff_s)

    def _park_unsupported(self, active: list[FetchAssignment], e: grpc.aio.AioRpcError,
                          rpc: str) -> None:
        """The leader does not implement ``rpc``: retrying cannot help, so its partitions
        wait for the controller's next LeaderAndIsr (a new leader, or this one restarted)."""
        host, port = self._endpoint or ("?", 0)
        error = UnsupportedVersionError(
            f"broker {self.leader_id} at {host}:{port} does not implement {rpc} "
            f"(not a Tidewater broker of this release?): {e.details()}")
        log.error("%s %s; not following %s until the next LeaderAndIsr", error.error_name,
                  error, ", ".join(str(a.partition.tp) for a in active))
        for a in active:
            a.parked = True

    async def _stream_fetch_until_changed(self, stub, active: list[FetchAssignment]) -> None:
        """One request on the stream, then its answer applied.

        Invariant: between rounds nothing is outstanding on the stream, so the next
        answer read is the next request's. When the assignment set changes during the
        long-poll, the stream is cancelled (the leader drops the pending fetch) and the
        next round opens another for the new set; so does any failure mid-round.
        """
        call = self._stream
        if call is None:
            call = self._stream = stub.ReplicaFetch()
        try:
            request, sent = self._fetch_request(active)
            await call.write(request)
            if self._changed.is_set():  # changed while writing: this long-poll is stale
                self._drop_stream()
                return
            response = await self._read_answer(call)
            if response is None:
                return  # cut short by a changed assignment set (the stream is dropped)
            await self._apply_response(self._checked(response), sent)
        except BaseException:
            self._drop_stream()
            raise

    async def _read_answer(self, call: grpc.aio.StreamStreamCall):
        """The stream's next answer, or None if ``mark_changed`` cut the wait short.

        ``mark_changed`` and the deadline timer end the wait by cancelling the call,
        which makes the read raise CancelledError; a CancelledError while this task is
        being cancelled (``close``) is passed on as such.
        """
        timeout_s = self.manager.config.replica_fetch_wait_max_ms / 1000 + RPC_MARGIN_S
        self._read_deadline = self._loop.time() + timeout_s
        if self._read_timer is None:
            self._read_timer = self._loop.call_at(self._read_deadline, self._check_read_deadline)
        self._reading = True
        try:
            return await call.read()
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
            if self._changed.is_set():
                return None
            raise StreamBrokenError(
                f"no answer from broker {self.leader_id} in {timeout_s}s") from None
        finally:
            self._reading = False

    def _check_read_deadline(self) -> None:
        """The deadline timer: one timer, re-armed for the current read's deadline.

        Arming a timer per round costs more than the rare re-arm; a timer that fires
        while no read is pending is simply not re-armed (the next read arms one).
        """
        self._read_timer = None
        if not self._reading:
            return
        if self._loop.time() < self._read_deadline:
            self._read_timer = self._loop.call_at(self._read_deadline, self._check_read_deadline)
            return
        self._drop_stream()  # the pending read raises CancelledError: StreamBrokenError

    @staticmethod
    def _checked(response) -> pb.FetchResponse:
        if response is grpc.aio.EOF:
            raise StreamBrokenError("the leader ended the ReplicaFetch stream")
        return response

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    # ------------------------------------------------------------------ truncation

    async def _truncate(self, stub, assignments: list[FetchAssignment]) -> None:
        request = pb.OffsetForLeaderEpochRequest(replica_id=self.manager.broker_id)
        for a in assignments:
            request.partitions.add(topic=a.partition.tp.topic, partition=a.partition.tp.partition,
                                   current_leader_epoch=a.leader_epoch,
                                   leader_epoch=a.partition.log.leader_epoch_cache.latest_epoch)
        response = await stub.OffsetForLeaderEpoch(request, timeout=RPC_MARGIN_S)
        by_tp = {(p.topic, p.partition): p for p in response.partitions}
        for a in assignments:
            answer = by_tp.get(tuple(a.partition.tp))
            if answer is None:
                continue
            async with a.partition.lock:
                if self.assignments.get(a.partition.tp) is not a or not a.current:
                    continue  # the leader epoch changed while the request was in flight
                if answer.error_code != pb.NONE:
                    self._on_error(a, answer.error_code, "OffsetForLeaderEpoch")
                    continue
                try:
                    self._apply_truncation(a, (answer.leader_epoch, answer.end_offset))
                except Exception as e:  # noqa: BLE001 - e.g. a failed log dir: this partition only
                    code, message = error_code_for(e, context="follower truncation")
                    log.warning("%s: truncation failed: %s %s", a.partition.tp,
                                pb.ErrorCode.Name(code), message)
                    a.retry_at = time.monotonic() + self.manager.config.replica_fetch_backoff_ms / 1000

    def _apply_truncation(self, a: FetchAssignment, leader_answer: tuple[int, int]) -> None:
        partition = a.partition
        step = follower_truncation(leader_answer, partition.log.leader_epoch_cache,
                                   partition.log_end_offset, partition.high_watermark)
        before = partition.log_end_offset
        partition.truncate_to(step.truncate_to)
        a.truncating = not step.done
        if before != partition.log_end_offset or step.done:
            log.info("%s: leader answered %s, truncated to %d (LEO was %d)%s", partition.tp,
                     leader_answer, step.truncate_to, before, "" if step.done else ", asking again")

    # ------------------------------------------------------------------ fetch

    def _fetch_request(self, active: list[FetchAssignment]) -> tuple[pb.FetchRequest, dict]:
        """The request for ``active`` and, by (topic, partition), its (assignment, fetch offset).

        The message is built once per assignment set and reused: only what moves per
        round (the broker epoch, each partition's offsets and latest epoch) is set.
        Rounds are sequential, so a request is never changed while it is in flight.
        """
        if active != self._request_for:
            self._build_request(active)
        request = self._request
        request.replica_broker_epoch = self.manager.broker_epoch()
        # The assignment each answer belongs to is the one the request was built
        # from, never whatever is assigned when the answer arrives.
        sent = {}
        for a, (p, key) in zip(active, self._request_partitions, strict=True):
            log_ = a.partition.log
            fetch_offset = p.fetch_offset = log_.log_end_offset
            p.last_fetched_epoch = log_.leader_epoch_cache.latest_epoch
            p.log_start_offset = log_.log_start_offset
            sent[key] = (a, fetch_offset)
        return request, sent

    def _build_request(self, active: list[FetchAssignment]) -> None:
        config = self.manager.config
        request = pb.FetchRequest(replica_id=self.manager.broker_id,
                                  max_wait_ms=config.replica_fetch_wait_max_ms, min_bytes=1,
                                  max_bytes=config.replica_fetch_max_bytes)
        partitions = []
        for a in active:
            tp = a.partition.tp
            # The topic ID: a leader never serves us another incarnation's records.
            p = request.partitions.add(topic=tp.topic, partition=tp.partition,
                                       current_leader_epoch=a.leader_epoch,
                                       partition_max_bytes=config.replica_fetch_max_bytes,
                                       topic_id=a.partition.topic_id)
            partitions.append((p, (tp.topic, tp.partition)))
        self._request, self._request_for, self._request_partitions = request, list(active), partitions

    async def _apply_response(self, response: pb.FetchResponse, sent: dict) -> None:
        config = self.manager.config
        if response.error_code != pb.NONE:
            raise RuntimeError(f"fetch refused: {pb.ErrorCode.Name(response.error_code)}")
        for p in response.partitions:
            a, fetch_offset = sent.get((p.topic, p.partition), (None, -1))
            if a is None:
                continue
            async with a.partition.lock:
                if self.assignments.get(a.partition.tp) is not a or not a.current:
                    continue  # leader epoch changed while in flight: drop the answer
                if a.partition.log_end_offset != fetch_offset:
                    continue  # the log moved meanwhile (truncated): fetch again from its LEO
                try:
                    self._apply_fetch(a, p)
                except Exception as e:  # noqa: BLE001
                    code, message = error_code_for(e, context="follower append")
                    log.warning("%s: follower append failed: %s %s", a.partition.tp,
                                pb.ErrorCode.Name(code), message)
                    a.retry_at = time.monotonic() + config.replica_fetch_backoff_ms / 1000

    def _apply_fetch(self, a: FetchAssignment, p: pb.FetchPartitionResponse) -> None:
        partition = a.partition
        if p.error_code == pb.OFFSET_OUT_OF_RANGE and p.log_start_offset > partition.log_end_offset:
            # The leader deleted what we would fetch next (retention): start over there.
            log.info("%s: leader log starts at %d past our LEO %d: truncating fully",
                     partition.tp, p.log_start_offset, partition.log_end_offset)
            partition.truncate_fully_and_start_at(p.log_start_offset)
            return
        if p.error_code != pb.NONE:
            self._on_error(a, p.error_code, "Fetch")
            return
        if p.HasField("diverging_epoch"):
            self._apply_truncation(a, (p.diverging_epoch.epoch, p.diverging_epoch.end_offset))
            return
        records = self._records_from_log_end(partition, p.records)
        if records:
            partition.log.append_as_follower(records, wall_ms())
            self.manager.replica_manager.metrics.replication_bytes_in.inc(len(records))
        partition.set_follower_high_watermark(p.high_watermark)

    @staticmethod
    def _records_from_log_end(partition: Partition, records: bytes) -> bytes:
        """The part of a fetched chunk that starts exactly at our LEO.

        The leader answers with whole batches from the one holding the fetch
        offset. Batches wholly below our LEO are skipped; a batch straddling it
        means our batch boundaries differ from the leader's there (it should
        not happen after truncation by epochs), so we cut our log back to that
        batch's base and take the leader's batch instead; if our own batches do
        not end exactly there either, the next fetch starts from the new LEO.
        """
        log_end_offset = partition.log_end_offset
        for position, header in iter_batches(records, validate=False):
            if header.next_offset <= log_end_offset:
                continue
            if header.base_offset < log_end_offset:
                log.warning("%s: leader batch %d..%d straddles our LEO %d: truncating to %d",
                            partition.tp, header.base_offset, header.last_offset,
                            log_end_offset, header.base_offset)
                partition.truncate_to(header.base_offset)
                if partition.log_end_offset != header.base_offset:
                    return b""
            return records[position:]
        return b""

    def _on_error(self, a: FetchAssignment, code: int, rpc: str) -> None:
        backoff_s = self.manager.config.replica_fetch_backoff_ms / 1000
        name = pb.ErrorCode.Name(code)
        if code == pb.FENCED_LEADER_EPOCH:
            a.parked = True  # we are behind the leader: the controller will tell us more
        elif code == pb.OFFSET_OUT_OF_RANGE:
            a.truncating = True
            a.retry_at = time.monotonic() + backoff_s
        else:
            a.retry_at = time.monotonic() + backoff_s
        log.info("%s: %s from leader %d answered %s", a.partition.tp, rpc, self.leader_id, name)


class FetcherManager:
    """Owns the fetcher tasks: one per leader broker id."""

    def __init__(self, replica_manager: ReplicaManager):
        self.replica_manager = replica_manager
        self.config = replica_manager.config
        self.broker_id = replica_manager.broker_id
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._by_tp: dict = {}

    def broker_epoch(self) -> int:
        return self.replica_manager._broker_epoch()

    def add_partition(self, partition: Partition, leader_id: int) -> None:
        """Follow ``partition`` from ``leader_id`` in its current leader epoch (truncate first)."""
        self.remove_partition(partition.tp)
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = LeaderFetcher(self, leader_id)
        fetcher.add(FetchAssignment(partition, leader_id, partition.leader_epoch))
        self._by_tp[partition.tp] = leader_id

    def ensure_partition(self, partition: Partition, leader_id: int) -> None:
        """Resume a parked or missing assignment for the same state (a LeaderAndIsr resend)."""
        fetcher = self.fetchers.get(self._by_tp.get(partition.tp, -1))
        a = fetcher.assignments.get(partition.tp) if fetcher else None
        if a is None or a.leader_id != leader_id or a.leader_epoch != partition.leader_epoch:
            self.add_partition(partition, leader_id)
        elif a.parked:
            a.parked = False
            a.truncating = True
            fetcher.mark_changed()

    def remove_partition(self, tp) -> None:
        leader_id = self._by_tp.pop(tp, None)
        if leader_id is not None and leader_id in self.fetchers:
            self.fetchers[leader_id].remove(tp)

    def assignment(self, tp) -> FetchAssignment | None:
        leader_id = self._by_tp.get(tp)
        fetcher = self.fetchers.get(leader_id) if leader_id is not None else None
        return fetcher.assignments.get(tp) if fetcher else None

    async def shutdown(self) -> None:
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        self._by_tp.clear()
        await asyncio.gather(*(f.close() for f in fetchers), return_exceptions=True)
