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
* senders (``SimSender``, one per unfenced broker registration): the product's
  ``controller/send_marks.py`` (marks set from each commit's ``Effects`` by
  ``route_effects``, requests built from the image when sent in its order, marks
  put back and a backoff on failure) over the fake network, one request in flight;
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
from typing import Any

from tidewater.controller.config import ControllerConfig
from tidewater.controller.election import PartitionRecord
from tidewater.controller.metadata import BrokerInfo, ClusterMetadata
from tidewater.controller.owner import ImageAheadOfDiskError, MetadataOwner, OwnerStoppedError
from tidewater.controller.send_marks import Outgoing, RetryBackoff, SendMarks, route_effects
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
    outgoing: Outgoing  # its marks go back when it fails
    sent_ms: int


class SimSender:
    """``controller/sender.py``'s ``BrokerSender`` for one broker registration, without gRPC.

    The marks, the order of requests, the put-back on failure and the backoff are the
    product's (``controller/send_marks.py``); this is only the transport: one request
    in flight; no answer within the request timeout fails it as gRPC's deadline does.
    """

    def __init__(self, controller: SimController, broker_id: int, broker_epoch: int):
        self.controller = controller
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        config = controller.config
        self.marks = SendMarks(broker_id)
        self.backoff = RetryBackoff(config.sender_retry_backoff_ms,
                                    config.sender_retry_backoff_max_ms)
        self.inflight: _InFlight | None = None

    # ------------------------------------------------------------ marks (as BrokerSender)

    def mark_partitions(self, tps, *, new=frozenset()) -> None:
        self.marks.mark_partitions(tps, new=new)

    def mark_metadata(self) -> None:
        self.marks.mark_metadata()

    def mark_stop(self, partitions) -> None:
        self.marks.mark_stop(partitions, self.controller.machine.metadata)

    # ------------------------------------------------------------ delivery

    def maybe_send(self, now_ms: int) -> None:
        controller = self.controller
        config = controller.config
        if self.inflight is not None:
            if now_ms - self.inflight.sent_ms < config.sender_request_timeout_ms:
                return
            self._failed(now_ms)
        if self.marks.idle or not self.backoff.may_send(now_ms):
            return
        outgoing = self.marks.take_next(controller.machine.metadata, config.node_id,
                                        controller.machine.sessions)
        if outgoing is None:
            return
        call_id = controller.next_call_id()
        self.inflight = _InFlight(call_id, outgoing, now_ms)
        controller.network.send(controller.address, self.broker_id,
                                BrokerCall(call_id, controller.run_id, outgoing.request), now_ms)

    def on_answer(self, call_id: int, response, now_ms: int) -> None:
        inflight = self.inflight
        if inflight is None or inflight.call_id != call_id:
            return  # timed out already: its marks were put back
        if response is None:  # the call failed (UNAVAILABLE): as a timeout, sooner
            self._failed(now_ms)
            return
        self.inflight = None
        self.backoff.succeeded()
        kind = inflight.outgoing.kind
        if response.error_code in NOT_RETRIED:
            self.controller.count(f"broker refused {kind} "
                                  f"{pb.ErrorCode.Name(response.error_code)}")
        for item in getattr(response, "partitions", ()):
            if item.error_code != pb.NONE:
                # Not retried, as the real sender: the broker cannot take this state.
                self.controller.count(f"broker refused {kind} partition "
                                      f"{pb.ErrorCode.Name(item.error_code)}")
        self.maybe_send(now_ms)  # the rest of the round

    def _failed(self, now_ms: int) -> None:
        inflight, self.inflight = self.inflight, None
        self.marks.put_back(inflight.outgoing)
        self.backoff.failed(now_ms)


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
        self.address = CONTROLLER  # its node on the network
        self.name = "controller"  # in the trace
        self.state = DOWN
        self.run_id = 0  # controller processes started
        self.machine: ControllerStateMachine | None = None
        self.owner: MetadataOwner | None = None
        self.senders: dict[int, SimSender] = {}
        # Told of each change of a partition's leader or ISR as it commits, before the
        # requests that announce it go out (old, new, now; the simulation's aimed
        # faults); None: nobody listens.
        self.on_partition_change: Callable[[PartitionRecord, PartitionRecord, int], None] | None \
            = None
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

    def _command(self, command, on_result: Callable[[Any], None] | None = None):
        """``owner.run_now``; None when the process cannot answer (gRPC's UNAVAILABLE).
        ``on_result`` gets a result that is not None (a quorum's owner answers later)."""
        if self.state != RUNNING:
            return None
        try:
            result = self.owner.run_now(command)
            if on_result is not None and result is not None:
                on_result(result)
            return result
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
        call_id = message.call_id

        def answer(response) -> None:
            self.network.send(self.address, src, ControllerAnswer(call_id, response),
                              self.clock_ms())

        if isinstance(request, pb.BrokerHeartbeatRequest):
            stream_id = self._streams.get((src, message.stream))
            if stream_id is None:  # the first heartbeat opens the stream
                self._next_stream_id += 1
                stream_id = self._streams[(src, message.stream)] = self._next_stream_id

            def heartbeat_answered(response) -> None:
                if response.error_code == pb.NONE and self._streams.get(
                        (src, message.stream)) == stream_id:
                    self._stream_bound[stream_id] = (request.broker_id, request.broker_epoch)
                answer(response)

            self._command(lambda tx, now: machine.broker_heartbeat(tx, now, request, stream_id),
                          self._answered_by(src, call_id, heartbeat_answered))
        elif isinstance(request, pb.RegisterBrokerRequest):
            self._command(lambda tx, now: machine.register_broker(tx, now, request),
                          self._answered_by(src, call_id, answer))
        elif isinstance(request, pb.AlterPartitionRequest):
            self._command(lambda tx, now: machine.alter_partition(tx, now, request),
                          self._answered_by(src, call_id, answer))
        elif isinstance(request, pb.CreateTopicsRequest):
            self._command(lambda tx, now: machine.create_topics(tx, now, request),
                          self._answered_by(src, call_id, answer))
        elif isinstance(request, pb.DeleteTopicsRequest):
            self._command(lambda tx, now: machine.delete_topics(tx, now, request),
                          self._answered_by(src, call_id, answer))
        else:
            raise TypeError(f"controller cannot handle {request!r}")

    def _answered_by(self, src: int, call_id: int, answer: Callable[[Any], None]
                     ) -> Callable[[Any], None]:
        """The callback that answers a call (a quorum controller adds NOT_CONTROLLER)."""
        return answer

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
        route_effects(effects, metadata, self.senders,
                      drop_sender=self._drop_sender, ensure_sender=self._ensure_sender)
        for tp in sorted(effects.changed_partitions):
            p = metadata.partition(*tp)
            if p is not None:
                self._trace_change(TopicPartition(*tp), p, now_ms)

    def _drop_sender(self, broker_id: int) -> None:
        self.trace(self.clock_ms(), f"{self.name}: broker {broker_id} fenced")
        self.senders.pop(broker_id, None)

    def _ensure_sender(self, broker_id: int) -> SimSender | None:
        broker = self.machine.metadata.brokers.get(broker_id)
        if broker is None or broker.fenced:
            return None
        sender = self.senders.get(broker_id)
        if sender is None or sender.broker_epoch != broker.broker_epoch:
            self.trace(self.clock_ms(), f"{self.name}: broker {broker_id} registered with epoch "
                                        f"{broker.broker_epoch}" if sender is None else
                                        f"{self.name}: broker {broker_id} now epoch "
                                        f"{broker.broker_epoch}")
            sender = self.senders[broker_id] = SimSender(self, broker_id, broker.broker_epoch)
        return sender

    def _trace_change(self, tp: TopicPartition, p: PartitionRecord, now_ms: int) -> None:
        old = self._traced.get(tp)
        self._traced[tp] = p
        if old is not None and old.topic_id != p.topic_id:
            old = None
        if old is not None and self.on_partition_change is not None:
            self.on_partition_change(old, p, now_ms)
        self.trace(now_ms, f"{self.name}: {tp[0]}-{tp[1]} leader "
                           f"{old.leader if old else '(new)'}->{p.leader} epoch {p.leader_epoch} "
                           f"ISR {p.isr} pe {p.partition_epoch}")
