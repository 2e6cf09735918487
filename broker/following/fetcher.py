"""Follower fetchers: one task per leader broker, all its partitions in one request.

What to ask and what an answer means is the replication core's
(``ReplicaState``: ``follower_wants``, ``fetch_position``,
``on_offset_for_leader_epoch_answer``, ``on_fetch_answer``); this module is the
transport. Per leader broker, each round:

1. the partitions that want to truncate (a new leader epoch, or an
   OFFSET_OUT_OF_RANGE) ask ``OffsetForLeaderEpoch(latest local epoch)``;
2. otherwise the partitions that want to fetch send one long-poll fetch with
   their ``fetch_position`` (LEO, last fetched epoch, log start offset);

and each answer goes back to its partition's core (synchronously, with its Ready),
tagged with the leader epoch and fetch offset it was asked in, so the core
drops answers that a change of epoch (or a truncation) made stale. The
resulting ``Ready`` (truncate, append the fetched records, back off, park) is
carried out by ``ReadyCarrier``.

Transport: one ReplicaFetch stream per leader broker, one request then its one
answer; a changed assignment set cancels the stream (and so the leader's
pending long-poll) and the next round opens another. A broken stream is
dropped and reopened after ``replica.fetch.backoff.ms``. A leader answering
UNIMPLEMENTED (not a broker of this release: there is no other way to fetch
from it) is logged at ERROR as ``UnsupportedVersionError`` and its partitions'
cores park them (UNSUPPORTED_VERSION) until the next LeaderAndIsr. Answers are
read from the FetchResponse bytes received (``fetch_wire``), the records handed
on as slices of them; bytes that do not parse break the stream like a silence.

Fetch sessions (``serving/replica_fetch_session``): the first request on a stream names
every partition (``SESSION_FULL``); once an answer says ``session_held``, each request
names only the partitions whose position or leader epoch moved since the one before
(``SESSION_INCREMENTAL``), and the answer leaves out the partitions with nothing new,
whose cores then hear nothing. A changed set of fetching partitions, a round that
truncates, or a new stream starts over with a full request; a leader of an earlier
release never says ``session_held`` and so only ever gets full ones.

Cost per round (a follower sends one request per record at one record per
produce request, so this is paid at the record rate): the fetcher task itself
awaits the stream's read, with no task, future or ``asyncio.wait`` per round;
what cuts the read short (a changed assignment set, an answer overdue) cancels
the stream call instead, and the deadline is one timer re-armed lazily. The
full request message is built once per assignment set and only its offsets and
epochs are set per round (~1.5 µs; building it each round cost ~13 µs); an
incremental one is filled with the partitions that moved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from tidewater.broker.channels import channel_options
from tidewater.broker.clock import mono_ms
from tidewater.broker.config import BrokerConfig
from tidewater.broker.following.throttle import ReplicationQuota
from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.broker.replication.ready import Ready
from tidewater.broker.replication.replica import FollowerCycle, FollowerPhase
from tidewater.broker.security.inter_broker import ChannelOpener, plain_channel
from tidewater.broker.serving.replica_fetch_wire import (
    FetchAnswer,
    MalformedFetchResponseError,
    decode_fetch_response,
)
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.batch import BytesLike
from tidewater.proto.errors import TidewaterError, UnsupportedVersionError, code_name
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.following.fetcher")

RPC_MARGIN_S = 5.0



class _LeaderStubs:
    """The two of the leader's services a follower calls on one channel: ReplicaFetch is
    ``BrokerControl`` (INTERNAL listener only), OffsetForLeaderEpoch is ``Broker`` (clients
    truncate with it too, KIP-320)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        # The generated stub's method, except that answers stay the bytes received, read by
        # ``fetch_wire`` (records as slices, not copies). Parsed in ``_checked``, not by a
        # response_deserializer: grpc.aio logs a deserializer's exception and reads None.
        self.ReplicaFetch: grpc.aio.StreamStreamMultiCallable[pb.FetchRequest, bytes] = (
            channel.stream_stream(  # type: ignore[call-arg]  # grpc-stubs lack _registered_method
                "/tidewater.BrokerControl/ReplicaFetch",
                request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=None, _registered_method=True))
        self.OffsetForLeaderEpoch: grpc.aio.UnaryUnaryMultiCallable[
            pb.OffsetForLeaderEpochRequest, pb.OffsetForLeaderEpochResponse] = (
            pb_grpc.BrokerStub(channel).OffsetForLeaderEpoch)


# What each partition of a fetch request was asked with, by (topic, partition):
# (partition, leader epoch, fetch offset).
_Sent = dict[tuple[str, int], tuple[Partition, int, int]]
# A partition's ask as the session's last request sent it: (leader epoch, fetch offset,
# last fetched epoch, log start offset).
_Asked = tuple[int, int, int, int]


def _cycle(partition: Partition) -> FollowerCycle:
    """The follower cycle of a partition a round truncates or fetches: ``_wanting`` chose it
    for having one, and nothing is awaited between that and building the request."""
    cycle = partition.replica.follower
    assert cycle is not None, f"{partition.tp}: no follower cycle"
    return cycle


class StreamBrokenError(Exception):
    """The ReplicaFetch stream ended or went silent: reconnect after the backoff.
    ``error_code``: the leader's request-level refusal, if that was it."""

    def __init__(self, message: str, error_code: int = pb.NONE) -> None:
        super().__init__(message)
        self.error_code = error_code


class LeaderFetcher:
    """Fetches every partition this broker follows from ``leader_id``."""

    def __init__(self, manager: FetcherManager, leader_id: int):
        self.manager = manager
        self.leader_id = leader_id
        self.partitions: dict[TopicPartition, Partition] = {}
        self._changed = asyncio.Event()
        self._refusal_logged = False
        self._channel: grpc.aio.Channel | None = None
        self._endpoint: tuple[str, int] | None = None
        self._stub: _LeaderStubs | None = None
        self._stream: grpc.aio.StreamStreamCall[pb.FetchRequest, bytes] | None = None
        # While the task awaits an answer on the stream (``_read_answer``): what cuts
        # the wait short cancels the stream call, so the read needs no task of its own.
        self._reading = False
        self._read_deadline = 0.0  # loop time; an answer not read by then breaks the stream
        self._read_timer: asyncio.TimerHandle | None = None
        # The full request, built once per assignment set (``_fetch_request``), and the
        # incremental one, filled each round with the partitions that moved.
        self._request: pb.FetchRequest | None = None
        self._incremental: pb.FetchRequest | None = None
        self._request_for: list[Partition] = []
        # The full request's FetchPartition messages, in _request_for order.
        self._request_partitions: list[pb.FetchPartition] = []
        # The stream's fetch session: held once the leader said so in an answer to this
        # stream; what each partition of _request_for was last asked with on it.
        self._session_held = False
        self._last_asked: list[_Asked | None] = []
        self._loop = asyncio.get_running_loop()
        self.task = manager.supervisor.spawn(self._run(), name=f"fetcher-{leader_id}")

    def add(self, partition: Partition) -> None:
        self.partitions[partition.tp] = partition
        self.mark_changed()

    def remove(self, tp: TopicPartition) -> None:
        if self.partitions.pop(tp, None) is not None:
            self.mark_changed()

    def mark_changed(self) -> None:
        """The assignment set (or a partition's state) changed: start a new round now.

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

    def _connect(self) -> _LeaderStubs | None:
        endpoint = self.manager.leader_endpoint(self.leader_id)
        if endpoint is None:
            return None
        if endpoint != self._endpoint:
            self._drop_stream()
            if self._channel is not None:
                self.manager.supervisor.spawn(self._channel.close(),
                                              f"close-channel-{self.leader_id}")
            limit = self.manager.config.socket_request_max_bytes
            self._channel = self.manager.open_channel(f"{endpoint[0]}:{endpoint[1]}",
                                                      channel_options(limit),
                                                      self.manager.channel_credentials)
            self._stub = _LeaderStubs(self._channel)
            self._endpoint = endpoint
        return self._stub

    def _wanting(self, now_ms: int) -> tuple[list[Partition], list[Partition]]:
        """(partitions that want to truncate, partitions that want to fetch) now."""
        truncating, fetching = [], []
        for partition in self.partitions.values():
            replica = partition.replica
            cycle = replica.follower
            if cycle is None or cycle.leader_id != self.leader_id:
                continue
            wants = replica.follower_wants(now_ms)
            if wants == FollowerPhase.TRUNCATING:
                truncating.append(partition)
            elif wants == FollowerPhase.FETCHING:
                fetching.append(partition)
        return truncating, fetching

    def _next_retry_s(self, now_ms: int) -> float | None:
        waits = [p.replica.follower.retry_at_ms - now_ms for p in self.partitions.values()
                 if p.replica.follower is not None and not p.replica.follower.parked
                 and p.replica.follower.retry_at_ms > now_ms]
        return min(waits) / 1000 if waits else None

    async def _run(self) -> None:
        backoff_s = self.manager.config.replica_fetch_backoff_ms / 1000
        while True:
            self._changed.clear()
            now = mono_ms()
            truncating, fetching = self._wanting(now)
            throttle_s = None
            if fetching and (delay_ms := self.manager.quota.delay_ms(now)):
                # Over follower.replication.throttled.rate: the throttled replicas
                # wait (``throttle``); the others fetch on.
                fetching = [p for p in fetching if not self.manager.throttled(p.tp)]
                throttle_s = delay_ms / 1000
            stub = self._connect()
            if not (truncating or fetching) or stub is None:
                timeout = self._next_retry_s(now)
                if throttle_s is not None:
                    timeout = throttle_s if timeout is None else min(timeout, throttle_s)
                if timeout is None and stub is None:
                    timeout = backoff_s
                try:
                    async with asyncio.timeout(timeout):  # not wait_for: see proto/supervisor.py
                        await self._changed.wait()
                except TimeoutError:
                    pass
                continue
            try:
                if truncating:
                    self._session_held = False  # the next fetch says every partition anew
                    await self._truncate(stub, truncating)
                else:
                    await self._fetch_round(stub, fetching)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._unsupported(truncating or fetching, e,
                                      "OffsetForLeaderEpoch" if truncating else "ReplicaFetch")
                    continue
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    self._refused(e.details() or "UNAUTHENTICATED")
                log.debug("fetch from broker %d failed: %s", self.leader_id, e.code().name)
                await asyncio.sleep(backoff_s)
            except (StreamBrokenError, asyncio.InvalidStateError) as e:
                # InvalidStateError: a write on a stream the leader already closed.
                if isinstance(e, StreamBrokenError) \
                        and e.error_code == pb.CLUSTER_AUTHORIZATION_FAILED:
                    self._refused("CLUSTER_AUTHORIZATION_FAILED")
                log.debug("ReplicaFetch stream to broker %d broke: %s", self.leader_id, e)
                await asyncio.sleep(backoff_s)

    def _refused(self, why: str) -> None:
        """The leader does not take this broker as a cluster member: said once per
        fetcher at WARNING (retrying every backoff cannot help until the configuration
        changes), then at DEBUG with every retry."""
        if not self._refusal_logged:
            self._refusal_logged = True
            log.warning("broker %d refuses this broker's follower fetches (%s): with SASL or "
                        "an authorizer a follower needs a principal with CLUSTER_ACTION on the "
                        "cluster (inter.broker.credentials.file naming a super user)",
                        self.leader_id, why)

    def _unsupported(self, partitions: list[Partition], e: grpc.aio.AioRpcError,
                     rpc: str) -> None:
        """The leader does not implement ``rpc``: retrying cannot help. Each partition's
        core hears UNSUPPORTED_VERSION, which parks it until the controller's next
        LeaderAndIsr (a new leader, or this one restarted)."""
        host, port = self._endpoint or ("?", 0)
        error = UnsupportedVersionError(
            f"broker {self.leader_id} at {host}:{port} does not implement {rpc} "
            f"(not a Tidewater broker of this release?): {e.details()}")
        log.error("%s %s; not following %s until the next LeaderAndIsr", error.error_name,
                  error, ", ".join(str(p.tp) for p in partitions))
        now = mono_ms()
        for partition in partitions:
            replica = partition.replica
            cycle = replica.follower
            if cycle is None:
                continue
            if rpc == "OffsetForLeaderEpoch":
                ready = replica.on_offset_for_leader_epoch_answer(
                    cycle.leader_epoch, pb.UNSUPPORTED_VERSION, (-1, -1), now)
            else:
                ready = replica.on_fetch_answer(
                    cycle.leader_epoch, replica.fetch_position()[0], pb.UNSUPPORTED_VERSION,
                    high_watermark=-1, leader_log_start_offset=-1, diverging_epoch=None,
                    now_ms=now)
            self._carry_out(partition, ready)

    async def _fetch_round(self, stub: _LeaderStubs, fetching: list[Partition]) -> None:
        """One request on the stream, then its answer applied.

        Invariant: between rounds nothing is outstanding on the stream, so the next
        answer read is the next request's. When the assignment set changes during the
        long-poll, the stream is cancelled (the leader drops the pending fetch) and the
        next round opens another for the new set; so does any failure mid-round.
        """
        call = self._stream
        if call is None:
            call = self._stream = stub.ReplicaFetch(metadata=self.manager.call_metadata or None)
        try:
            request, sent = self._fetch_request(fetching)
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

    async def _read_answer(self, call: grpc.aio.StreamStreamCall[pb.FetchRequest, bytes]
                           ) -> object:
        """The stream's next answer (bytes, or grpc's EOF), or None if ``mark_changed``
        cut the wait short.

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
            task = asyncio.current_task()
            if task is not None and task.cancelling():
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

    def _checked(self, response: object) -> FetchAnswer:
        """The answer read (FetchResponse wire bytes); StreamBrokenError at the stream's
        end or for bytes that do not parse."""
        if response is grpc.aio.EOF:
            raise StreamBrokenError("the leader ended the ReplicaFetch stream")
        assert isinstance(response, bytes), type(response)  # no deserializer: the bytes
        try:
            return decode_fetch_response(response)
        except MalformedFetchResponseError as e:
            log.warning("broker %d sent a malformed fetch answer (%d bytes): %s",
                        self.leader_id, len(response) if isinstance(response, bytes) else -1, e)
            raise StreamBrokenError(f"malformed answer from broker {self.leader_id}: {e}") from e

    def _drop_stream(self) -> None:
        self._session_held = False  # the session was the stream's
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    # ------------------------------------------------------------------ truncation

    async def _truncate(self, stub: _LeaderStubs, truncating: list[Partition]) -> None:
        request = pb.OffsetForLeaderEpochRequest(replica_id=self.manager.broker_id)
        sent: dict[tuple[str, int], tuple[Partition, int]] = {}
        for partition in truncating:
            epochs = partition.replica.offset_for_leader_epoch_request()
            if epochs is None:
                continue  # no longer a follower
            leader_epoch, latest_epoch = epochs
            request.partitions.add(topic=partition.tp.topic, partition=partition.tp.partition,
                                   current_leader_epoch=leader_epoch, leader_epoch=latest_epoch,
                                   topic_id=partition.topic_id)
            sent[(partition.tp.topic, partition.tp.partition)] = (partition, leader_epoch)
        if not sent:
            return
        response = await stub.OffsetForLeaderEpoch(
            request, timeout=RPC_MARGIN_S, metadata=self.manager.call_metadata or None)
        for answer in response.partitions:
            asked = sent.pop((answer.topic, answer.partition), None)
            if asked is None:
                continue
            partition, leader_epoch = asked
            ready = partition.replica.on_offset_for_leader_epoch_answer(
                leader_epoch, answer.error_code, (answer.leader_epoch, answer.end_offset),
                mono_ms())
            self._carry_out(partition, ready)

    # ------------------------------------------------------------------ fetch

    def _fetch_request(self, fetching: list[Partition]) -> tuple[pb.FetchRequest, _Sent]:
        """The request for ``fetching`` and, by (topic, partition), what it was asked with:
        (partition, leader epoch, fetch offset): every partition, whether the request
        names it or the session holds its ask.

        The full message is built once per assignment set and reused: only what moves per
        round (the broker epoch, each partition's epoch and position) is set. Within the
        stream's session the incremental message is filled with the partitions whose ask
        moved since the last request. Rounds are sequential, so a request is never changed
        while it is in flight.
        """
        if fetching != self._request_for:
            self._build_request(fetching)
        incremental = self._session_held
        request = self._incremental if incremental else self._request
        assert request is not None  # both built above for this assignment set
        request.replica_broker_epoch = self.manager.broker_epoch()
        if incremental:
            del request.partitions[:]
        add = request.partitions.add
        sent: _Sent = {}
        last_asked = self._last_asked
        for index, (partition, p) in enumerate(zip(fetching, self._request_partitions,
                                                   strict=True)):
            leader_epoch = _cycle(partition).leader_epoch
            fetch_offset, last_fetched_epoch, log_start_offset = (
                partition.replica.fetch_position())
            asked = (leader_epoch, fetch_offset, last_fetched_epoch, log_start_offset)
            key = (p.topic, p.partition)
            if not incremental:
                (p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch,
                 p.log_start_offset) = asked
            elif asked != last_asked[index]:
                add(topic=key[0], partition=key[1], current_leader_epoch=leader_epoch,
                    fetch_offset=fetch_offset, last_fetched_epoch=last_fetched_epoch,
                    log_start_offset=log_start_offset,
                    partition_max_bytes=p.partition_max_bytes, topic_id=p.topic_id)
            last_asked[index] = asked
            sent[key] = (partition, leader_epoch, fetch_offset)
        return request, sent

    def _build_request(self, fetching: list[Partition]) -> None:
        config = self.manager.config
        request = pb.FetchRequest(replica_id=self.manager.broker_id,
                                  max_wait_ms=config.replica_fetch_wait_max_ms, min_bytes=1,
                                  max_bytes=config.replica_fetch_max_bytes)
        self._incremental = pb.FetchRequest()
        self._incremental.CopyFrom(request)
        self._incremental.session_mode = pb.SESSION_INCREMENTAL
        request.session_mode = pb.SESSION_FULL
        # With the topic ID: a leader never serves us another incarnation's records.
        partitions = [request.partitions.add(topic=p.tp.topic, partition=p.tp.partition,
                                             partition_max_bytes=config.replica_fetch_max_bytes,
                                             topic_id=p.topic_id)
                      for p in fetching]
        self._request, self._request_for, self._request_partitions = (
            request, list(fetching), partitions)
        self._session_held = False  # a new set of partitions: a full request first
        self._last_asked = [None] * len(fetching)

    async def _apply_response(self, answer: FetchAnswer, sent: _Sent) -> None:
        if answer.error_code != pb.NONE:
            raise StreamBrokenError(f"fetch refused: {code_name(answer.error_code)}",
                                    answer.error_code)
        self._session_held = answer.session_held
        quota = self.manager.quota
        for p in answer.partitions:
            asked = sent.get((p.topic, p.partition))
            if asked is None:
                continue
            partition, leader_epoch, fetch_offset = asked
            if quota.rate is not None and p.records and self.manager.throttled(partition.tp):
                quota.record(len(p.records), mono_ms())
            ready = partition.replica.on_fetch_answer(
                leader_epoch, fetch_offset, p.error_code, high_watermark=p.high_watermark,
                leader_log_start_offset=p.log_start_offset, diverging_epoch=p.diverging,
                now_ms=mono_ms())
            self._carry_out(partition, ready, fetched=p.records)

    def _carry_out(self, partition: Partition, ready: Ready, fetched: BytesLike = b"") -> None:
        try:
            self.manager.carrier.apply(partition, ready, fetched=fetched)
        except TidewaterError as e:
            # A failed append or truncation: the core was told (it backs off); this
            # partition only, the others of the round go on.
            log.warning("%s: applying the leader's answer failed: %s", partition.tp, e)


class FetcherManager:
    """Owns the fetcher tasks: one per leader broker id."""

    def __init__(self, *, config: BrokerConfig, carrier: ReadyCarrier,
                 supervisor: TaskSupervisor, broker_epoch: Callable[[], int],
                 leader_endpoint: Callable[[int], tuple[str, int] | None],
                 channel_credentials: grpc.ChannelCredentials | None = None,
                 call_metadata: tuple[tuple[str, str], ...] = (),
                 open_channel: ChannelOpener = plain_channel):
        self.config = config
        # SASL with SCRAM: channels that run an exchange and carry its session token.
        self.open_channel = open_channel
        # TLS: present this broker's certificate (leaders take ReplicaFetch from broker-<id>).
        self.channel_credentials = channel_credentials
        # SASL: this broker's user on every call to a leader (with SASL or an authorizer,
        # leaders take follower fetches only from a principal with CLUSTER_ACTION).
        self.call_metadata = call_metadata
        self.broker_id = config.broker_id
        self.carrier = carrier
        self.supervisor = supervisor
        self.broker_epoch = broker_epoch
        self.leader_endpoint = leader_endpoint
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._by_tp: dict[TopicPartition, int] = {}
        # follower.replication.throttled.rate and which replicas it holds (``throttle``;
        # the replica manager sets both from the metadata snapshot).
        self.quota = ReplicationQuota()
        self.throttled: Callable[[TopicPartition], bool] = lambda tp: False

    def follow(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        """Fetch ``partition`` from ``leader_id`` (its core decides what and when)."""
        current = self._by_tp.get(partition.tp)
        if current is not None and current != leader_id:
            self.stop_following(partition)
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = LeaderFetcher(self, leader_id)
        fetcher.add(partition)
        self._by_tp[partition.tp] = leader_id

    def stop_following(self, partition: Partition) -> None:
        leader_id = self._by_tp.pop(partition.tp, None)
        if leader_id is not None and leader_id in self.fetchers:
            self.fetchers[leader_id].remove(partition.tp)

    def following(self, tp: TopicPartition) -> int | None:
        return self._by_tp.get(tp)

    async def shutdown(self) -> None:
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        self._by_tp.clear()
        await asyncio.gather(*(f.close() for f in fetchers), return_exceptions=True)
