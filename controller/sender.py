"""Delivery of LeaderAndIsr, UpdateMetadata and StopReplica to the brokers.

One ``BrokerSender`` task per live (unfenced) broker incarnation talks to the
broker's INTERNAL listener. Its queue is a set of *marks*, not of requests:
which partitions need a LeaderAndIsr, whether an UpdateMetadata is due, which
deleted partitions need a StopReplica. Marks coalesce (a partition that
changed three times is sent once, in its latest state), so the queue is
bounded by the number of partitions. Requests are built from the image when
they are sent, after a short debounce (not before a new sender's first round, the
broker's full resync), so a burst of changes becomes one
request. Order: StopReplica, LeaderAndIsr, UpdateMetadata. The marks, that
order, the put-back of a failed request's marks, the backoff and which sender
hears what from a commit are ``controller/send_marks.py``'s (no I/O; the
simulation drives the same classes); this module is the asyncio/gRPC shell.

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
from collections.abc import Awaitable, Callable, Iterable, Set
from typing import Any

import grpc

from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import ImagePoisonedError
from tidewater.controller.send_marks import (
    LEADER_AND_ISR,
    STOP_REPLICA,
    UPDATE_METADATA,
    Outgoing,
    RetryBackoff,
    SendMarks,
    route_effects,
)
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
        self.marks = SendMarks(broker_id)
        self.backoff = RetryBackoff(config.sender_retry_backoff_ms,
                                    config.sender_retry_backoff_max_ms)
        self._wake = asyncio.Event()
        self._closed = False
        self._channel = open_aio_channel(target, channel_options(config), credentials)
        # Connect now, not when the first request is sent: the handshake overlaps the
        # building of the first round's requests.
        self._channel.get_state(try_to_connect=True)
        self._stub = pb_grpc.BrokerControlStub(self._channel)
        # Supervised: a sender that dies (a bug) stops the controller, which would
        # otherwise starve this broker of every decision in silence.
        self._task = supervisor.spawn(self._run(), name=f"sender-{broker_id}-{broker_epoch}")
        self.synced_offset = -1  # every change up to this metadata offset is delivered
        self.delivered_counts = {"LeaderAndIsr": 0, "UpdateMetadata": 0, "StopReplica": 0}

    # ------------------------------------------------------------ marks

    def mark_partitions(self, tps: Iterable[tuple[str, int]], *,
                        new: Set[tuple[str, int]] = frozenset()) -> None:
        self.marks.mark_partitions(tps, new=new)
        self._wake.set()

    def mark_metadata(self) -> None:
        self.marks.mark_metadata()
        self._wake.set()

    def mark_stop(self, partitions: Iterable[PartitionRecord]) -> None:
        self.marks.mark_stop(partitions, self.machine.metadata)
        self._wake.set()

    @property
    def idle(self) -> bool:
        return self.marks.idle

    # ------------------------------------------------------------ loop

    async def _run(self) -> None:
        try:
            await self._deliver()
        except ImagePoisonedError:
            # The owner failed: the process is exiting, and must send nothing more.
            self._closed = True

    async def _deliver(self) -> None:
        loop = asyncio.get_running_loop()
        # The first round is the broker's full resync, all marked by the commit that made
        # this sender: nothing to gather by waiting, and a (re)started broker serves only
        # once it has this LeaderAndIsr (issue 30's restart time).
        first_round = True
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            if self.config.sender_debounce_ms and not first_round:
                await asyncio.sleep(self.config.sender_debounce_ms / 1000)
            first_round = False
            while not self._closed and not self.idle:
                # Every mark set by a commit up to this offset is taken by this round.
                round_offset = self.machine.metadata.last_offset
                try:
                    await self._send_round()
                    self.synced_offset = max(self.synced_offset, round_offset)
                    self.backoff.succeeded()
                except (TimeoutError, grpc.aio.AioRpcError) as e:
                    detail = e.code().name if isinstance(e, grpc.aio.AioRpcError) else "timeout"
                    wait_ms = self.backoff.failed(int(loop.time() * 1000))
                    log.info("broker %d at %s unreachable (%s); retrying in %d ms",
                             self.broker_id, self.target, detail, wait_ms)
                    await asyncio.sleep(wait_ms / 1000)

    async def _send_round(self) -> None:
        """Send what the marks call for, one request at a time, until none is due."""
        timeout_s = self.config.sender_request_timeout_ms / 1000
        while not self._closed:
            outgoing = self.marks.take_next(self.machine.metadata, self.config.node_id,
                                            self.machine.sessions)
            if outgoing is None:
                return
            try:
                response = await self._call(outgoing, timeout_s)
            except BaseException:
                self.marks.put_back(outgoing)
                raise
            self._check(outgoing.kind, response.error_code,
                        getattr(response, "partitions", ()))

    def _call(self, outgoing: Outgoing, timeout_s: float) -> Awaitable[Any]:
        calls: dict[str, Callable[..., Awaitable[Any]]] = {
            STOP_REPLICA: self._stub.StopReplica, LEADER_AND_ISR: self._stub.LeaderAndIsr,
            UPDATE_METADATA: self._stub.UpdateMetadata}
        return calls[outgoing.kind](outgoing.request, timeout=timeout_s)

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
        self.marks.clear()
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
        route_effects(effects, self.machine.metadata, self.senders,
                      drop_sender=self._drop_sender, ensure_sender=self._ensure_sender)

    def _drop_sender(self, broker_id: int) -> None:
        sender = self.senders.pop(broker_id, None)
        if sender is not None:
            self._close_later(sender)

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
