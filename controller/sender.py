"""Delivery of LeaderAndIsr, UpdateMetadata and StopReplica to the brokers.

One ``BrokerSender`` task per live (unfenced) broker incarnation talks to the
broker's INTERNAL listener. Its queue is a set of *marks*, not of requests:
which partitions need a LeaderAndIsr, whether an UpdateMetadata is due, which
deleted partitions need a StopReplica. Marks coalesce (a partition that
changed three times is sent once, in its latest state), so the queue is
bounded by the number of partitions. Requests are built from the image when
they are sent, after a short debounce, so a burst of changes becomes one
request. Order within a round: StopReplica, LeaderAndIsr, UpdateMetadata.

A failed delivery keeps its marks and is retried with exponential backoff
until it succeeds or the sender is closed (the broker was fenced or
re-registered with a new epoch; a new incarnation gets a new sender and a
full resync). A broker answering STALE_CONTROLLER_EPOCH, STALE_BROKER_EPOCH or
CLUSTER_AUTHORIZATION_FAILED (the request's control token is not the one its
registration holds) is logged and not retried: that request can never succeed.
Requests go to the broker's ``BrokerControl`` service (INTERNAL listener only)
and carry the registration's control token (``state_machine``); with TLS the
channel presents the controller's certificate (``credentials``), which the
brokers' INTERNAL listeners require. An error a broker
answers for one partition (e.g. INVALID_CONFIG: it cannot host the topic) is
logged at ERROR and counted (``on_partition_error``), not retried.

Durability: a request is built from the image only between two awaits, and
the image never holds records that are not durable at such a point (the owner
writes them in the same synchronous step that applies them). When a write
fails, the owner poisons the image and the process's fatal hook calls
``BrokerSenders.abort`` before anything else runs: every sender task is
cancelled where it waits, and a round that would read the image after that
meets ``ImagePoisonedError`` instead. A request already handed to gRPC was
built before the failure, from durable state.

Every sender task (and the close of a replaced sender) runs under the
controller's ``TaskSupervisor``: a sender that dies would silently starve its
broker, so its death stops the controller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Set

import grpc

from tidewater.controller import requests
from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import ImagePoisonedError
from tidewater.controller.state_machine import ControllerStateMachine, Effects
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import open_aio_channel

log = logging.getLogger(__name__)

SYNC_POLL_INTERVAL_S = 0.005
NOT_RETRIED = (pb.STALE_CONTROLLER_EPOCH, pb.STALE_BROKER_EPOCH, pb.CLUSTER_AUTHORIZATION_FAILED)


def channel_options(config: ControllerConfig) -> list[tuple[str, int]]:
    """gRPC's own reconnect backoff grows to 120 s by default; a broker that was down
    for a while would then stay unreachable long after it is back. Cap it at our retry cap."""
    return [("grpc.initial_reconnect_backoff_ms", config.sender_retry_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", config.sender_retry_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", config.sender_retry_backoff_max_ms),
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]


class BrokerSender:
    def __init__(self, machine: ControllerStateMachine, broker_id: int, broker_epoch: int,
                 target: str, config: ControllerConfig, supervisor: TaskSupervisor,
                 on_delivered: Callable[[str], None] | None = None,
                 on_partition_error: Callable[[str, str], None] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        self.machine = machine
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.target = target
        self.config = config
        self._on_delivered = on_delivered or (lambda kind: None)
        self._on_partition_error = on_partition_error or (lambda kind, error: None)
        self._pending_partitions: dict[tuple[str, int], bool] = {}  # -> is_new
        self._pending_metadata = False
        self._pending_stop: dict[tuple[str, int], PartitionRecord] = {}
        self._wake = asyncio.Event()
        self._closed = False
        self._channel = open_aio_channel(target, channel_options(config), credentials)
        self._stub = pb_grpc.BrokerControlStub(self._channel)
        # Supervised: a sender that dies (a bug) stops the controller, which would
        # otherwise starve this broker of every decision in silence.
        self._task = supervisor.spawn(self._run(), name=f"sender-{broker_id}-{broker_epoch}")
        self.synced_offset = -1  # every change up to this metadata offset is delivered
        self.delivered_counts = {"LeaderAndIsr": 0, "UpdateMetadata": 0, "StopReplica": 0}

    # ------------------------------------------------------------ marks

    def mark_partitions(self, tps: Iterable[tuple[str, int]], *,
                        new: Set[tuple[str, int]] = frozenset()) -> None:
        for tp in tps:
            self._pending_partitions[tp] = self._pending_partitions.get(tp, False) or tp in new
        self._wake.set()

    def mark_metadata(self) -> None:
        self._pending_metadata = True
        self._wake.set()

    def mark_stop(self, partitions: Iterable[PartitionRecord]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._pending_stop[tp] = p
            current = self.machine.metadata.partition(*tp)
            if current is None or self.broker_id not in current.replicas:
                self._pending_partitions.pop(tp, None)  # a LeaderAndIsr for it would be stale
        self._wake.set()

    @property
    def idle(self) -> bool:
        return not (self._pending_partitions or self._pending_metadata or self._pending_stop)

    # ------------------------------------------------------------ loop

    async def _run(self) -> None:
        try:
            await self._deliver()
        except ImagePoisonedError:
            # The owner failed: the process is exiting, and must send nothing more.
            self._closed = True

    async def _deliver(self) -> None:
        backoff_ms = self.config.sender_retry_backoff_ms
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            if self.config.sender_debounce_ms:
                await asyncio.sleep(self.config.sender_debounce_ms / 1000)
            while not self._closed and not self.idle:
                # Every mark set by a commit up to this offset is taken by this round.
                round_offset = self.machine.metadata.last_offset
                try:
                    await self._send_round()
                    self.synced_offset = max(self.synced_offset, round_offset)
                    backoff_ms = self.config.sender_retry_backoff_ms
                except (TimeoutError, grpc.aio.AioRpcError) as e:
                    detail = e.code().name if isinstance(e, grpc.aio.AioRpcError) else "timeout"
                    log.info("broker %d at %s unreachable (%s); retrying in %d ms",
                             self.broker_id, self.target, detail, backoff_ms)
                    await asyncio.sleep(backoff_ms / 1000)
                    backoff_ms = min(backoff_ms * 2, self.config.sender_retry_backoff_max_ms)

    async def _send_round(self) -> None:
        metadata = self.machine.metadata
        node_id = self.config.node_id
        timeout_s = self.config.sender_request_timeout_ms / 1000
        if self._pending_stop:
            stops, self._pending_stop = self._pending_stop, {}
            stop = requests.stop_replica(metadata, node_id, self.broker_id, stops.values(),
                                         delete=True)
            try:
                stopped = await self._stub.StopReplica(stop, timeout=timeout_s)
            except BaseException:
                self._pending_stop = {**stops, **self._pending_stop}
                raise
            self._check("StopReplica", stopped.error_code, stopped.partitions)
        if self._pending_partitions:
            marks, self._pending_partitions = self._pending_partitions, {}
            partitions = []
            for (topic, number), is_new in sorted(marks.items()):
                p = metadata.partition(topic, number)
                if p is not None and self.broker_id in p.replicas:
                    partitions.append((p, is_new))
            if partitions:
                request = requests.leader_and_isr(metadata, node_id, self.broker_id, partitions)
                try:
                    response = await self._stub.LeaderAndIsr(request, timeout=timeout_s)
                except BaseException:
                    for tp, is_new in marks.items():
                        self._pending_partitions[tp] = self._pending_partitions.get(tp, False) or is_new
                    raise
                self._check("LeaderAndIsr", response.error_code, response.partitions)
        if self._pending_metadata:
            self._pending_metadata = False
            update = requests.update_metadata(metadata, node_id, self.broker_id, self.machine.sessions)
            try:
                updated = await self._stub.UpdateMetadata(update, timeout=timeout_s)
            except BaseException:
                self._pending_metadata = True
                raise
            self._check("UpdateMetadata", updated.error_code, ())

    def _check(self, kind: str, error_code: int,
               partitions: Iterable[pb.PartitionError]) -> None:
        if error_code in NOT_RETRIED:
            log.warning("broker %d refused %s: %s (controller epoch %d, broker epoch %d)",
                        self.broker_id, kind, pb.ErrorCode.Name(error_code),
                        self.machine.metadata.controller_epoch, self.broker_epoch)
        elif error_code != pb.NONE:
            log.warning("broker %d answered %s with %s", self.broker_id, kind,
                        pb.ErrorCode.Name(error_code))
        for item in partitions:
            if item.error_code != pb.NONE:
                # A broker refusing the controller's decision for a partition (e.g. topic
                # configs it cannot host): not retried, the partition is not served there.
                error = pb.ErrorCode.Name(item.error_code)
                log.error("broker %d refused %s for %s-%d: %s %s", self.broker_id, kind,
                          item.topic, item.partition, error, item.error_message)
                self._on_partition_error(kind, error)
        self.delivered_counts[kind] += 1
        self._on_delivered(kind)

    def abort(self) -> None:
        """Stop now, synchronously: the task is cancelled where it waits and sends nothing more."""
        self._closed = True
        self._pending_partitions.clear()
        self._pending_metadata = False
        self._pending_stop.clear()
        self._task.cancel()

    async def close(self) -> None:
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        except Exception:  # the supervisor logged it and stops the controller
            pass
        await self._channel.close()


class BrokerSenders:
    """The set of senders, one per unfenced broker, fed by committed effects."""

    def __init__(self, machine: ControllerStateMachine, config: ControllerConfig, *,
                 supervisor: TaskSupervisor,
                 on_delivered: Callable[[str], None] | None = None,
                 on_partition_error: Callable[[str, str], None] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        self.machine = machine
        self.config = config
        self._credentials = credentials  # TLS: the controller's certificate, to every broker
        self._on_delivered = on_delivered
        self._supervisor = supervisor
        self._on_partition_error = on_partition_error
        self.senders: dict[int, BrokerSender] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._aborted = False

    def _close_later(self, sender: BrokerSender) -> None:
        task = self._supervisor.spawn(sender.close(),
                                      f"close-sender-{sender.broker_id}-{sender.broker_epoch}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _ensure_sender(self, broker_id: int) -> BrokerSender | None:
        broker = self.machine.metadata.brokers.get(broker_id)
        if broker is None or broker.fenced or broker.internal is None:
            return None
        sender = self.senders.get(broker_id)
        if sender is not None and sender.broker_epoch == broker.broker_epoch:
            return sender
        if sender is not None:
            self._close_later(sender)
        endpoint = broker.internal
        sender = BrokerSender(self.machine, broker_id, broker.broker_epoch,
                              f"{endpoint.host}:{endpoint.port}", self.config, self._supervisor,
                              self._on_delivered, self._on_partition_error,
                              credentials=self._credentials)
        self.senders[broker_id] = sender
        return sender

    def abort(self) -> None:
        """The image got ahead of the disk: stop every sender now (no await) and for good."""
        self._aborted = True
        for sender in self.senders.values():
            sender.abort()

    def renounce(self) -> None:
        """This controller lost the quorum's leadership: stop every sender now (no await;
        the next leader resyncs every broker), keeping the set usable if it leads again."""
        senders, self.senders = list(self.senders.values()), {}
        for sender in senders:
            sender.abort()
            self._close_later(sender)

    def on_commit(self, effects: Effects) -> None:
        if self._aborted:
            return
        metadata = self.machine.metadata
        for broker_id in effects.fenced_brokers:
            sender = self.senders.pop(broker_id, None)
            if sender is not None:
                self._close_later(sender)
        for broker_id in effects.resync_brokers:
            sender = self._ensure_sender(broker_id)
            if sender is not None:
                hosted = [(p.topic, p.partition) for p in metadata.partitions_of_broker(broker_id)]
                sender.mark_partitions(hosted, new=effects.new_partitions)
                sender.mark_metadata()
        for broker_id, partitions in effects.stop_replicas:
            sender = self.senders.get(broker_id)
            if sender is not None:
                sender.mark_stop(partitions)
        for tp in effects.changed_partitions:
            p = metadata.partition(*tp)
            if p is None:
                continue
            for replica in p.replicas:
                sender = self.senders.get(replica)
                if sender is not None:
                    sender.mark_partitions([tp], new=effects.new_partitions)
        if effects.metadata_changed:
            for sender in self.senders.values():
                sender.mark_metadata()

    async def wait_synced(self, offset: int, timeout_s: float) -> bool:
        """Wait until every live broker has received all changes up to ``offset``.

        Returns False on timeout (e.g. a broker is unreachable but not fenced yet).
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            if all(s.synced_offset >= offset for s in self.senders.values()):
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(SYNC_POLL_INTERVAL_S)

    async def close(self) -> None:
        senders, self.senders = list(self.senders.values()), {}
        await asyncio.gather(*(s.close() for s in senders), *self._closing,
                             return_exceptions=True)
