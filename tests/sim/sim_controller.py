"""The simulated controller process: the product's controller behind a fake network and disk.

Every decision is the product's own: ``ControllerStateMachine`` (registrations,
broker epochs, sessions, fencing, elections, AlterPartition, topics and their
IDs) driven through ``MetadataOwner.run_now`` over ``SimMetadataLog`` (the fake
disk), with ``now_ms`` from the simulation's clock. This module is only the
transport around them, as ``controller/service.py``, ``controller/sender.py`` and
``controller/server.py`` are over gRPC:

* calls (``ControllerCall`` carrying the product's protobuf requests) become the
  machine's commands; their answers go back as ``ControllerAnswer``;
* heartbeat streams: each broker process's heartbeats form one stream, with an
  id given by this controller process; a ``HeartbeatStreamClosed`` (a dead
  broker's kernel closing the connection) ends it through
  ``heartbeat_stream_closed``, as the service does;
* senders (``SimSender``, one per unfenced broker registration): the marks of
  ``BrokerSender`` set from each commit's ``Effects`` as ``BrokerSenders.on_commit``
  does, one request at a time built from the image when sent (StopReplica, then
  LeaderAndIsr, then UpdateMetadata), retried with a backoff until answered;
* timers: session expiry (``check_sessions``) and preferred leader election
  (``preferred_leader_check``), at the server's intervals;
* the process: ``start`` replays the durable log into a fresh image and machine
  and runs ``start`` (a new controller epoch); ``crash`` stops it at once. The
  owner's fatal hook (a failed metadata write) stops it at once too, before
  anything else runs, as ``ControllerServer._on_fatal`` exits the process. An
  owner failure that arrives without that hook (the owner of a broken variant)
  takes the server's other path, a graceful stop: no new calls or timers, but
  the senders go on for ``graceful_stop_ms`` (streams closing, the gRPC grace
  period) before the process is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidewater.controller import requests
from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import BrokerInfo, ClusterMetadata
from tidewater.controller.owner import ImageAheadOfDiskError, MetadataOwner, OwnerStoppedError
from tidewater.controller.sender import NOT_RETRIED
from tidewater.controller.state_machine import ControllerStateMachine, Effects
from tidewater.proto import tidewater_pb2 as pb

from .messages import (
    BrokerAnswer,
    BrokerCall,
    ControllerAnswer,
    ControllerCall,
    HeartbeatStreamClosed,
    TopicPartition,
)
from .network import CONTROLLER, Network

RUNNING, STOPPING, DOWN = "running", "stopping", "down"
SESSION_CHECK_INTERVAL_MS_MAX = 100  # controller/server.py


@dataclass
class _InFlight:
    call_id: int
    kind: str
    marks: object  # what to mark again when it fails
    sent_ms: int


class SimSender:
    """``controller/sender.py``'s ``BrokerSender`` for one broker registration, without gRPC.

    Marks, not requests, are queued; a request is built from the image when it is
    sent, so it carries the latest durable state. One request in flight; no answer
    within the request timeout puts its marks back and retries after a backoff.
    """

    def __init__(self, controller: SimController, broker_id: int, broker_epoch: int):
        self.controller = controller
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        config = controller.config
        self.pending_partitions: dict[TopicPartition, bool] = {}  # -> is_new
        self.pending_metadata = False
        self.pending_stop: dict[TopicPartition, PartitionRecord] = {}
        self.inflight: _InFlight | None = None
        self.next_send_ms = 0
        self.backoff_ms = config.sender_retry_backoff_ms

    # ------------------------------------------------------------ marks (as BrokerSender)

    def mark_partitions(self, tps, *, new=frozenset()) -> None:
        for tp in tps:
            self.pending_partitions[tp] = self.pending_partitions.get(tp, False) or tp in new

    def mark_metadata(self) -> None:
        self.pending_metadata = True

    def mark_stop(self, partitions) -> None:
        metadata = self.controller.machine.metadata
        for p in partitions:
            tp = TopicPartition(p.topic, p.partition)
            self.pending_stop[tp] = p
            current = metadata.partition(*tp)
            if current is None or self.broker_id not in current.replicas:
                self.pending_partitions.pop(tp, None)  # a LeaderAndIsr for it would be stale

    @property
    def idle(self) -> bool:
        return not (self.pending_partitions or self.pending_metadata or self.pending_stop)

    # ------------------------------------------------------------ delivery

    def maybe_send(self, now_ms: int) -> None:
        config = self.controller.config
        if self.inflight is not None:
            if now_ms - self.inflight.sent_ms < config.sender_request_timeout_ms:
                return
            self._failed(now_ms)
        if self.idle or now_ms < self.next_send_ms:
            return
        metadata = self.controller.machine.metadata
        node_id = config.node_id
        if self.pending_stop:
            stops, self.pending_stop = self.pending_stop, {}
            self._send("StopReplica", requests.stop_replica(
                metadata, node_id, self.broker_id, stops.values(), delete=True), stops, now_ms)
            return
        if self.pending_partitions:
            marks, self.pending_partitions = self.pending_partitions, {}
            partitions = []
            for (topic, number), is_new in sorted(marks.items()):
                p = metadata.partition(topic, number)
                if p is not None and self.broker_id in p.replicas:
                    partitions.append((p, is_new))
            if partitions:
                self._send("LeaderAndIsr", requests.leader_and_isr(
                    metadata, node_id, self.broker_id, partitions), marks, now_ms)
                return
        if self.pending_metadata:
            self.pending_metadata = False
            self._send("UpdateMetadata", requests.update_metadata(
                metadata, node_id, self.broker_id, self.controller.machine.sessions), None, now_ms)

    def on_answer(self, call_id: int, response, now_ms: int) -> None:
        inflight = self.inflight
        if inflight is None or inflight.call_id != call_id:
            return  # timed out already: its marks were put back
        if response is None:  # the call failed (UNAVAILABLE): as a timeout, sooner
            self._failed(now_ms)
            return
        self.inflight = None
        self.backoff_ms = self.controller.config.sender_retry_backoff_ms
        if response.error_code in NOT_RETRIED:
            self.controller.count(f"broker refused {inflight.kind} "
                                  f"{pb.ErrorCode.Name(response.error_code)}")
        for item in getattr(response, "partitions", ()):
            if item.error_code != pb.NONE:
                # Not retried, as the real sender: the broker cannot take this state.
                self.controller.count(f"broker refused {inflight.kind} partition "
                                      f"{pb.ErrorCode.Name(item.error_code)}")
        self.maybe_send(now_ms)  # the rest of the round

    def _send(self, kind: str, request, marks, now_ms: int) -> None:
        controller = self.controller
        call_id = controller.next_call_id()
        self.inflight = _InFlight(call_id, kind, marks, now_ms)
        controller.network.send(CONTROLLER, self.broker_id,
                                BrokerCall(call_id, controller.run_id, request), now_ms)

    def _failed(self, now_ms: int) -> None:
        inflight, self.inflight = self.inflight, None
        if inflight.kind == "StopReplica":
            self.pending_stop = {**inflight.marks, **self.pending_stop}
        elif inflight.kind == "LeaderAndIsr":
            for tp, is_new in inflight.marks.items():
                self.pending_partitions[tp] = self.pending_partitions.get(tp, False) or is_new
        else:
            self.pending_metadata = True
        self.next_send_ms = now_ms + self.backoff_ms
        self.backoff_ms = min(self.backoff_ms * 2, self.controller.config.sender_retry_backoff_max_ms)


class SimController:
    def __init__(self, network: Network, metadata_log, config: ControllerConfig, *,
                 clock_ms: Callable[[], int], uuid4, trace,
                 owner_class: type[MetadataOwner] = MetadataOwner, graceful_stop_ms: int = 2500):
        self.network = network
        self.metadata_log = metadata_log
        self.config = config
        self.clock_ms = clock_ms
        self.uuid4 = uuid4
        self.trace = trace
        self.owner_class = owner_class
        self.graceful_stop_ms = graceful_stop_ms
        self.state = DOWN
        self.run_id = 0  # controller processes started
        self.machine: ControllerStateMachine | None = None
        self.owner: MetadataOwner | None = None
        self.senders: dict[int, SimSender] = {}
        self._streams: dict[tuple[int, int], int] = {}  # (broker, stream) -> this process's id
        self._next_stream_id = 0
        self._stream_bound: dict[int, tuple[int, int]] = {}  # stream id -> (broker, broker epoch)
        self._view: ClusterMetadata = ClusterMetadata()  # the durable image while none runs
        self._stop_at_ms = 0
        self._next_call_id = 0
        self._next_session_check_ms = 0
        self._next_preferred_ms = 0
        self._traced: dict[TopicPartition, PartitionRecord] = {}
        self.leader_changes = 0
        self.crashes = 0
        self.fatal_stops = 0
        self.graceful_stops = 0
        self.counters: dict[str, int] = {}

    # ------------------------------------------------------------------ views

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def image(self) -> ClusterMetadata:
        """The running controller's image, else what a restarted one would replay."""
        return self.machine.metadata if self.state == RUNNING else self._view

    def partition(self, tp: TopicPartition) -> PartitionRecord | None:
        return self.image.partition(*tp)

    def broker(self, broker_id: int) -> BrokerInfo | None:
        return self.image.brokers.get(broker_id)

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def next_call_id(self) -> int:
        self._next_call_id += 1
        return self._next_call_id

    # ------------------------------------------------------------------ the process

    def start(self, now_ms: int) -> None:
        """A new process: replay the durable log into a fresh image, then the machine's
        ``start`` (a new controller epoch, fresh sessions, every broker resynced)."""
        self.run_id += 1
        self.metadata_log.open()
        self.machine = ControllerStateMachine(self.config, ClusterMetadata(), uuid4=self.uuid4)
        self.owner = self.owner_class(self.metadata_log, self.machine, on_commit=self._on_commit,
                                      on_fatal=self._on_fatal, clock_ms=self.clock_ms)
        self.senders = {}
        self._streams.clear()
        self._stream_bound.clear()
        self._traced.clear()
        self.state = RUNNING
        replayed = self.owner.recover()
        self._command(self.machine.start)
        if self.state == RUNNING:
            self.trace(now_ms, f"controller: started (run {self.run_id}, controller epoch "
                               f"{self.machine.metadata.controller_epoch}, {replayed} records "
                               f"replayed)")
        self._next_session_check_ms = now_ms + self._session_check_interval_ms()
        self._next_preferred_ms = now_ms + int(
            self.config.leader_imbalance_check_interval_seconds * 1000)

    def crash(self, now_ms: int) -> None:
        """The process dies (SIGKILL, power): nothing more is sent or answered."""
        if self.state == DOWN:
            return
        self.crashes += 1
        self.trace(now_ms, "controller: crashed")
        self._stop()

    def _on_fatal(self, error: ImageAheadOfDiskError) -> None:
        """The owner's fatal hook (image ahead of the log): the real server aborts its
        senders and exits at once, before any other coroutine runs; so does this."""
        self.fatal_stops += 1
        self.trace(self.clock_ms(), f"controller: exits at once: {error}")
        self._stop()

    def _stop(self) -> None:
        self.state = DOWN
        self.senders = {}
        self._streams.clear()
        self._stream_bound.clear()
        self._view = self.metadata_log.durable_image()

    def _command(self, command):
        """``owner.run_now``; None when the process cannot answer (gRPC's UNAVAILABLE)."""
        if self.state != RUNNING:
            return None
        try:
            return self.owner.run_now(command)
        except (ImageAheadOfDiskError, OwnerStoppedError) as e:
            if self.state == RUNNING:
                # The owner failed and nothing stopped the process: the supervisor's fail
                # stops it gracefully (streams, gRPC grace period, then the senders).
                self.graceful_stops += 1
                self.state = STOPPING
                self._stop_at_ms = self.clock_ms() + self.graceful_stop_ms
                self.trace(self.clock_ms(), f"controller: owner failed ({e}); stopping "
                                            f"gracefully")
            return None

    def _session_check_interval_ms(self) -> int:
        return min(SESSION_CHECK_INTERVAL_MS_MAX, self.config.broker_session_timeout_ms // 10 or 1)

    # ------------------------------------------------------------------ messages

    def handle(self, src: int, message, now_ms: int) -> None:
        if self.state == DOWN:
            return
        if isinstance(message, BrokerAnswer):
            sender = self.senders.get(src)
            if sender is not None and message.controller_run == self.run_id:
                sender.on_answer(message.call_id, message.response, now_ms)
            return
        if self.state != RUNNING:
            return  # stopping: the gRPC server takes no new calls
        if isinstance(message, HeartbeatStreamClosed):
            self._on_stream_closed(message)
            return
        if not isinstance(message, ControllerCall):
            raise TypeError(f"controller cannot handle {message!r}")
        request = message.request
        machine = self.machine
        if isinstance(request, pb.BrokerHeartbeatRequest):
            stream_id = self._streams.get((src, message.stream))
            if stream_id is None:  # the first heartbeat opens the stream
                self._next_stream_id += 1
                stream_id = self._streams[(src, message.stream)] = self._next_stream_id
            response = self._command(lambda tx, now: machine.broker_heartbeat(
                tx, now, request, stream_id))
            if response is not None and response.error_code == pb.NONE:
                self._stream_bound[stream_id] = (request.broker_id, request.broker_epoch)
        elif isinstance(request, pb.RegisterBrokerRequest):
            response = self._command(lambda tx, now: machine.register_broker(tx, now, request))
        elif isinstance(request, pb.AlterPartitionRequest):
            response = self._command(lambda tx, now: machine.alter_partition(tx, now, request))
        elif isinstance(request, pb.CreateTopicsRequest):
            response = self._command(lambda tx, now: machine.create_topics(tx, now, request))
        elif isinstance(request, pb.DeleteTopicsRequest):
            response = self._command(lambda tx, now: machine.delete_topics(tx, now, request))
        else:
            raise TypeError(f"controller cannot handle {request!r}")
        if response is not None:
            self.network.send(CONTROLLER, src, ControllerAnswer(message.call_id, response), now_ms)

    def _on_stream_closed(self, message: HeartbeatStreamClosed) -> None:
        stream_id = self._streams.pop((message.broker_id, message.stream), None)
        bound = self._stream_bound.pop(stream_id, None) if stream_id is not None else None
        if bound is None:
            return  # no heartbeat accepted on it: the service fences nobody
        broker_id, broker_epoch = bound
        if self._command(lambda tx, now: self.machine.heartbeat_stream_closed(
                tx, now, broker_id, broker_epoch, stream_id)):
            self.count("fenced: heartbeat stream closed")

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        if self.state == DOWN:
            return
        if self.state == STOPPING and now_ms >= self._stop_at_ms:
            self.trace(now_ms, "controller: stopped")
            self._stop()
            return
        if self.state == RUNNING and now_ms >= self._next_session_check_ms:
            self._next_session_check_ms = now_ms + self._session_check_interval_ms()
            if self._command(self.machine.check_sessions):
                self.count("fenced: session expired")
        if (self.state == RUNNING and self.config.auto_leader_rebalance_enable
                and now_ms >= self._next_preferred_ms):
            self._next_preferred_ms = now_ms + int(
                self.config.leader_imbalance_check_interval_seconds * 1000)
            self._command(self.machine.preferred_leader_check)
        # After the timers: their changes go out in the same step (the real senders'
        # debounce is 5 ms).
        for sender in list(self.senders.values()):
            sender.maybe_send(now_ms)

    # ------------------------------------------------------------------ committed effects

    def _on_commit(self, effects: Effects) -> None:
        """``BrokerSenders.on_commit``: who must hear what, once the records are durable."""
        metadata = self.machine.metadata
        now_ms = self.clock_ms()
        self.leader_changes += effects.leader_elections
        for broker_id in sorted(effects.fenced_brokers):
            self.trace(now_ms, f"controller: broker {broker_id} fenced")
            self.senders.pop(broker_id, None)
        for broker_id in sorted(effects.resync_brokers):
            sender = self._ensure_sender(broker_id)
            if sender is not None:
                hosted = [TopicPartition(p.topic, p.partition)
                          for p in metadata.partitions_of_broker(broker_id)]
                sender.mark_partitions(hosted, new=effects.new_partitions)
                sender.mark_metadata()
        for broker_id, partitions in effects.stop_replicas:
            sender = self.senders.get(broker_id)
            if sender is not None:
                sender.mark_stop(partitions)
        for tp in sorted(effects.changed_partitions):
            p = metadata.partition(*tp)
            if p is None:
                continue
            self._trace_change(TopicPartition(*tp), p, now_ms)
            for replica in p.replicas:
                sender = self.senders.get(replica)
                if sender is not None:
                    sender.mark_partitions([TopicPartition(*tp)], new=effects.new_partitions)
        if effects.metadata_changed:
            for sender in self.senders.values():
                sender.mark_metadata()

    def _ensure_sender(self, broker_id: int) -> SimSender | None:
        broker = self.machine.metadata.brokers.get(broker_id)
        if broker is None or broker.fenced:
            return None
        sender = self.senders.get(broker_id)
        if sender is None or sender.broker_epoch != broker.broker_epoch:
            self.trace(self.clock_ms(), f"controller: broker {broker_id} registered with epoch "
                                        f"{broker.broker_epoch}" if sender is None else
                                        f"controller: broker {broker_id} now epoch "
                                        f"{broker.broker_epoch}")
            sender = self.senders[broker_id] = SimSender(self, broker_id, broker.broker_epoch)
        return sender

    def _trace_change(self, tp: TopicPartition, p: PartitionRecord, now_ms: int) -> None:
        old = self._traced.get(tp)
        self._traced[tp] = p
        if old is not None and old.topic_id != p.topic_id:
            old = None
        self.trace(now_ms, f"controller: {tp[0]}-{tp[1]} leader "
                           f"{old.leader if old else '(new)'}->{p.leader} epoch {p.leader_epoch} "
                           f"ISR {p.isr} pe {p.partition_epoch}")
