"""The broker's side of the controller protocol: registration, heartbeats, AlterPartition,
ReportCorruptReplica.

Theory of operation:
- ``register()`` retries RegisterBroker until the controller answers NONE (or
  raises ``DuplicateBrokerRegistrationError`` once another live process held
  this broker ID for two session timeouts: the process exits); the
  answer's ``broker_epoch`` identifies this incarnation in every later call, and
  its ``control_token`` authenticates them: we send it on every heartbeat,
  AlterPartition and ReportCorruptReplica, and take the controller's requests
  only when they carry it (``control_rules``). While a registration is under
  way the epoch is -1, so the controller's requests for the coming epoch are
  answered "try again" (not refused for good) until its answer is here.
- ``run_heartbeats()`` sends a heartbeat every ``broker.heartbeat.interval.ms``
  on one ``BrokerHeartbeats`` stream (request, then its answer, in order). The
  stream matters beyond transport: when this process dies, the kernel closes
  its connection, the stream ends and the controller fences this broker at
  once instead of after ``broker.session.timeout.ms``, so its leaderships move
  in milliseconds. A stream that fails (controller restarted or unreachable,
  an answer not coming within ``heartbeat_timeout_s``) is dropped and re-opened
  by the next heartbeat, one heartbeat interval later: the controller does not
  fence us for its own restart (it ends streams without fencing, and its
  successor starts us with a fresh session), and a stream that broke while we
  live costs at most a leader change (the next heartbeat unfences us). A
  server without the stream (UNIMPLEMENTED: not a controller of this release)
  gets no other kind of heartbeat: the typed ``UnsupportedVersionError`` is
  logged at ERROR, and the next heartbeat tries the stream again, as for an
  unreachable controller (we are fenced meanwhile). One lock orders the
  heartbeats of ``run_heartbeats`` and ``controlled_shutdown``, which may run
  at once.
  STALE_BROKER_EPOCH / BROKER_ID_NOT_REGISTERED / CLUSTER_AUTHORIZATION_FAILED
  means the controller no longer knows this registration: register again, and the controller resends the full
  LeaderAndIsr for our partitions. A heartbeat from a fenced broker (e.g.
  after a long pause) unfences it and brings a full resync too; if we stay
  fenced for two session timeouts anyway, we register again as a safety net.
- ``controlled_shutdown()`` heartbeats with ``want_shutdown`` until the answer
  says ``should_shutdown`` (leadership moved away) or the timeout passes; from
  its start every heartbeat (also ``run_heartbeats``') carries
  ``want_shutdown``. Once ``should_shutdown`` came, the stream is half-closed
  and heartbeats stop: the controller knows the shutdown finished and does not
  take the stream's end for a crash. A shutdown that timed out leaves the
  stream to end with the process, which fences the broker at once (its
  leaderships must move anyway).
- A quorum of controllers (``--controller`` with several entries, Kafka's
  ``controller.quorum.bootstrap.servers``): one channel per controller, calls go
  to the current one. A call failing with UNAVAILABLE (a standby's
  NOT_CONTROLLER, a dead or stopping controller) moves the current controller:
  to the leader a standby names (trailing metadata ``tidewater-controller-leader``,
  when ``ID@HOST:PORT`` told us its address), else to the next in the list. Unary
  calls through ``stub`` are retried once per controller at most (an UNAVAILABLE
  call was not taken), without gRPC's wait-for-ready (a dead controller must fail
  fast, not hold the call until its deadline), all within the call's one timeout (not
  a timeout per controller); the heartbeat stream and
  ``register`` move on and retry with their own backoff. A new active controller
  resyncs every broker at once (LeaderAndIsr / UpdateMetadata of a newer controller
  epoch, with its node id): ``follow_active`` then moves the current controller to it
  and drops the heartbeat stream, so the next heartbeat reaches it within a heartbeat
  interval even when the old one was cut off rather than killed (its stream would
  hang until ``heartbeat_timeout_s``, longer than the new controller's first session
  of one ``broker.session.timeout.ms``). With one controller nothing of this applies.
- A controller that cannot be reached is retried with a backoff; no call here
  raises for a transport error except ``alter_partition`` and
  ``report_corrupt_replica``, whose callers keep their state and retry later.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import grpc

from tidewater.broker.channels import channel_options
from tidewater.broker.clock import mono_ms
from tidewater.broker.controller_link.controller_choice import ControllerChoice
from tidewater.broker.controller_link.registration import REGISTER_AGAIN, Registration
from tidewater.client.sasl_session import ScramLogin
from tidewater.client.security import aio_metadata_interceptors, scram_aio_channel
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import DuplicateBrokerRegistrationError, UnsupportedVersionError
from tidewater.proto.scram import MECHANISMS, plain_metadata
from tidewater.proto.tls import controller_channel_options, open_aio_channel

log = logging.getLogger("tidewater.broker.controller_link.channel")

RPC_TIMEOUT_S = 5.0
RETRY_BACKOFF_S = 0.2
STREAM_CLOSE_TIMEOUT_S = 1.0
# A standby controller's NOT_CONTROLLER answer names the leader here (controller.quorum.owner).
LEADER_HINT_KEY = "tidewater-controller-leader"


class _FailoverStub:
    """A ``ControllerStub`` over the link's current controller: unary calls that fail with
    UNAVAILABLE move to the next controller and are sent again (at most once each)."""

    def __init__(self, link: ControllerChannel):
        self._link = link

    def __getattr__(self, name: str) -> Any:
        link = self._link
        if name == "BrokerHeartbeats":  # a stream: the heartbeat loop moves on by itself
            return link.current_stub.BrokerHeartbeats

        async def call(request: Any, **kwargs: Any) -> Any:
            kwargs["wait_for_ready"] = False
            # The caller's timeout bounds the whole call, not each controller's attempt:
            # a forward is answered by its deadline however many controllers it tries.
            loop = asyncio.get_running_loop()
            timeout = kwargs.get("timeout")
            deadline = None if timeout is None else loop.time() + timeout
            for attempt in range(link.controller_count):
                if deadline is not None:
                    kwargs["timeout"] = max(deadline - loop.time(), 0.001)
                try:
                    return await getattr(link.current_stub, name)(request, **kwargs)
                except grpc.aio.AioRpcError as e:
                    if (attempt + 1 == link.controller_count or not link.maybe_move(e)
                            or (deadline is not None and loop.time() >= deadline)):
                        raise
            raise AssertionError("unreachable")  # the loop returns or raises
        return call


class ControllerChannel:
    def __init__(self, *, broker_id: int, controller_address: tuple[str, int],
                 listeners: list[pb.Listener], heartbeat_interval_ms: int,
                 session_timeout_ms: int, max_message_bytes: int = 100 * 1024 * 1024,
                 on_registered: Callable[[int], Awaitable[None]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None, rack: str = "",
                 sasl_user: tuple[str, str] | None = None, sasl_mechanism: str = "PLAIN",
                 controller_bootstrap: Sequence[tuple[int, str, int]] = ()):
        self.broker_id = broker_id
        self.rack = rack
        # (node id or -1, host, port) per controller; the current one gets our calls.
        self._controllers = list(controller_bootstrap) or [(-1, *controller_address)]
        self._choice = ControllerChoice([node_id for node_id, _, _ in self._controllers])
        self.listeners = list(listeners)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.incarnation_id = uuid.uuid4().hex
        # Epoch, control token, fencing: the rules the simulation's broker runs too.
        self.registration = Registration(session_timeout_ms=session_timeout_ms)
        self._on_registered = on_registered
        self._stopping = False
        self._want_shutdown = False
        self._shutdown_done = False
        self._heartbeat_lock = asyncio.Lock()
        self._stream: grpc.aio.StreamStreamCall[pb.BrokerHeartbeatRequest,
                                                pb.BrokerHeartbeatResponse] | None = None
        self._stream_failures = 0  # in a row, for logging
        # Cancelling a stream whose answer is late makes the controller fence us, so
        # wait as long as a session could last before giving up on it.
        self.heartbeat_timeout_s = max(RPC_TIMEOUT_S, 2 * session_timeout_ms / 1000)
        # ``credentials``: TLS, presenting this broker's certificate (the controller's
        # listener requires it and takes this broker's calls only from broker-<id>).
        # ``sasl_user``: (user, password) this broker authenticates as, for a controller
        # with SASL on (also for the admin calls forwarded on this channel): with a SCRAM
        # ``sasl_mechanism`` by a SCRAM exchange, every call then carrying the session
        # token (``client.sasl_session``); with PLAIN the password goes on every call.
        def open_channel(host: str, port: int) -> grpc.aio.Channel:
            target = f"{host}:{port}"
            options: list[tuple[str, int | str]] = [*channel_options(max_message_bytes)]
            if credentials is not None:
                # Only a controller's certificate: a broker's or a client's of the same CA
                # (a stolen broker key) cannot stand in for the controller.
                options += controller_channel_options()
            if sasl_user is not None and sasl_mechanism in MECHANISMS:
                return scram_aio_channel(target, options, credentials,
                                         ScramLogin(sasl_mechanism, *sasl_user))
            return open_aio_channel(
                target, options, credentials,
                aio_metadata_interceptors((plain_metadata(*sasl_user),)) if sasl_user else None)
        self._channels = [open_channel(host, port) for _, host, port in self._controllers]
        self._stubs = [pb_grpc.ControllerStub(channel) for channel in self._channels]
        # The failover stub answers every ControllerStub method (by name).
        self.stub: pb_grpc.ControllerStub = (
            self._stubs[0] if len(self._stubs) == 1
            else cast(pb_grpc.ControllerStub, _FailoverStub(self)))

    @property
    def controller_address(self) -> tuple[str, int]:
        _, host, port = self._controllers[self._choice.current]
        return host, port

    @property
    def controller_count(self) -> int:
        return len(self._controllers)

    @property
    def current_stub(self) -> pb_grpc.ControllerStub:
        return self._stubs[self._choice.current]

    def maybe_move(self, error: grpc.aio.AioRpcError) -> bool:
        """After a failed call to the current controller: move to the leader a standby
        named, else to the next controller. False (no move) with one controller, or for
        an error that says nothing about which controller to ask."""
        if len(self._controllers) == 1 or error.code() not in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return False
        hint = dict(error.trailing_metadata() or ()).get(LEADER_HINT_KEY)
        leader_hint = (int(hint) if isinstance(hint, str) and hint.lstrip("-").isdigit()
                       else -1)
        old = self.controller_address
        self._choice.on_unavailable(leader_hint)
        log.info("controller %s:%d answered %s; asking %s:%d next", *old, error.code().name,
                 *self.controller_address)
        return True

    def follow_active(self, controller_id: int, controller_epoch: int) -> None:
        """A request of controller epoch ``controller_epoch`` came from node
        ``controller_id``, the new active controller: heartbeat to it from now on. The
        stream to the old one is dropped (it no longer decides: its end fences nobody).
        Nothing when it is the current one, or not one ``ID@HOST:PORT`` named."""
        old = self.controller_address
        if not self._choice.follow_active(controller_id):
            return
        self._drop_stream()
        log.info("controller %d is active (controller epoch %d): heartbeats move from "
                 "%s:%d to %s:%d", controller_id, controller_epoch, *old,
                 *self.controller_address)

    @property
    def broker_epoch(self) -> int:
        return self.registration.broker_epoch

    @property
    def control_token(self) -> bytes:
        return self.registration.control_token

    @property
    def cluster_id(self) -> str:
        return self.registration.cluster_id

    @property
    def is_fenced(self) -> bool:
        return self.registration.is_fenced

    async def close(self) -> None:
        self._stopping = True
        self._drop_stream()
        for channel in self._channels:
            await channel.close()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def register(self) -> int:
        """Register until the controller accepts; returns the new broker epoch."""
        self.registration.begin()
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self.stub.RegisterBroker(
                    pb.RegisterBrokerRequest(broker_id=self.broker_id,
                                             incarnation_id=self.incarnation_id,
                                             listeners=self.listeners, rack=self.rack),
                    timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                if attempt == 1 or attempt % 25 == 0:
                    if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                        # Wrong inter-broker credentials, or a controller that does not
                        # know them yet: said with the reason, retried (as Kafka does).
                        log.warning("controller %s:%d refuses this broker's credentials (%s), "
                                    "retrying", *self.controller_address, e.details())
                    else:
                        log.info("controller %s:%d not reachable (%s), retrying",
                                 *self.controller_address, e.code().name)
                self.maybe_move(e)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if not self.registration.on_register_answer(resp):
                if self.registration.duplicate_wait_over(resp, mono_ms()):
                    raise DuplicateBrokerRegistrationError(
                        f"broker {self.broker_id} is already registered with the controller by "
                        "another live process (DUPLICATE_BROKER_REGISTRATION): is a second "
                        f"broker running with broker id {self.broker_id}? Giving up after "
                        f"{2 * self.session_timeout_ms} ms; {resp.error_message}")
                if resp.error_code == pb.DUPLICATE_BROKER_REGISTRATION and attempt == 1:
                    log.error("broker id %d is registered by another live process; retrying "
                              "for up to %d ms (its session may be ending), then exiting: %s",
                              self.broker_id, 2 * self.session_timeout_ms, resp.error_message)
                elif attempt == 1 or attempt % 25 == 0:
                    log.warning("registration refused: %s %s (attempt %d)",
                                pb.ErrorCode.Name(resp.error_code), resp.error_message, attempt)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            log.info("registered broker %d with broker epoch %d", self.broker_id,
                     self.broker_epoch)
            if self._on_registered is not None:
                await self._on_registered(self.broker_epoch)
            return self.broker_epoch

    async def heartbeat(self, *, want_shutdown: bool = False) -> pb.BrokerHeartbeatResponse | None:
        """One heartbeat; None when the controller could not be reached."""
        async with self._heartbeat_lock:
            if self._shutdown_done or self._stopping:
                return None
            request = self.registration.heartbeat_request(
                self.broker_id, want_shutdown=want_shutdown or self._want_shutdown)
            return await self._stream_heartbeat(request)

    async def _stream_heartbeat(self, request: pb.BrokerHeartbeatRequest
                                ) -> pb.BrokerHeartbeatResponse | None:
        """Write ``request`` on the stream (opened when there is none) and read its answer."""
        if self._stream is None:
            self._stream = self.current_stub.BrokerHeartbeats()
        stream = self._stream
        try:
            async with asyncio.timeout(self.heartbeat_timeout_s):
                await stream.write(request)
                resp = await stream.read()
        except grpc.aio.AioRpcError as e:
            self._stream = None
            self._stream_failures += 1
            self.maybe_move(e)
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._log_unsupported(e)
                return None
            # Once per outage (a controller that is down fails every heartbeat).
            log.log(logging.INFO if self._stream_failures == 1 else logging.DEBUG,
                    "heartbeat stream failed (%s); re-opening it with the next heartbeat",
                    e.code().name)
            return None
        except (TimeoutError, asyncio.InvalidStateError) as e:
            log.warning("heartbeat stream %s; re-opening it with the next heartbeat",
                        "unanswered" if isinstance(e, TimeoutError) else "finished")
            self._drop_stream()
            if isinstance(e, TimeoutError) and len(self._controllers) > 1:
                # A controller that answers nothing for that long may be cut off: ask the
                # next one (a standby names the leader; the same one answers again).
                self._choice.on_unavailable()
            return None
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError from a call cancelled locally: when
            # follow_active dropped this stream (not this task being cancelled), the
            # heartbeat simply went unanswered and the next one goes to the new controller.
            task = asyncio.current_task()
            if self._stream is stream or (task is not None and task.cancelling()):
                raise
            return None
        if resp is grpc.aio.EOF:  # the controller ended it (it is stopping)
            log.info("controller ended the heartbeat stream; re-opening it with the next heartbeat")
            self._stream = None
            return None
        # read() is typed ``object | response`` (grpc's EOF is a plain object).
        assert isinstance(resp, pb.BrokerHeartbeatResponse), type(resp)
        if self._stream_failures:
            log.info("heartbeat stream open again after %d failed attempts", self._stream_failures)
            self._stream_failures = 0
        return resp

    def _log_unsupported(self, e: grpc.aio.AioRpcError) -> None:
        """At ERROR, the first time in a row and every 25th after (once per ~12 s at the
        default interval): the controller address reaches something that cannot take
        heartbeats, which only the operator can fix."""
        if self._stream_failures == 1 or self._stream_failures % 25 == 0:
            host, port = self.controller_address
            error = UnsupportedVersionError(
                f"{host}:{port} does not implement BrokerHeartbeats (not a Tidewater "
                f"controller of this release?): {e.details()}")
            log.error("heartbeat failed: %s %s (%d in a row); trying again every %d ms",
                      error.error_name, error, self._stream_failures, self.heartbeat_interval_ms)

    async def _close_stream_after_shutdown(self) -> None:
        """Half-close: the controller sees a finished stream after a finished shutdown."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            async with asyncio.timeout(STREAM_CLOSE_TIMEOUT_S):
                await stream.done_writing()
                while await stream.read() is not grpc.aio.EOF:
                    pass
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
            pass
        stream.cancel()

    async def run_heartbeats(self) -> None:
        """Heartbeat forever (until cancelled), re-registering when the controller says so."""
        while not self._stopping and not self._shutdown_done:
            resp = await self.heartbeat()
            if resp is not None:
                if self.registration.on_heartbeat_answer(resp, mono_ms()):
                    log.info("heartbeat answered %s fenced=%s: registering again",
                             pb.ErrorCode.Name(resp.error_code), resp.is_fenced)
                    await self.register()
                    continue
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)

    async def controlled_shutdown(self, timeout_ms: int) -> bool:
        """Ask the controller to move leadership away; True when it said should_shutdown."""
        deadline = time.monotonic() + timeout_ms / 1000
        self._want_shutdown = True
        while time.monotonic() < deadline:
            resp = await self.heartbeat(want_shutdown=True)
            if resp is not None:
                if resp.should_shutdown:
                    async with self._heartbeat_lock:
                        self._shutdown_done = True
                        await self._close_stream_after_shutdown()
                    return True
                if resp.error_code in REGISTER_AGAIN:
                    return False
            await asyncio.sleep(min(self.heartbeat_interval_ms, 200) / 1000)
        return False

    async def report_corrupt_replica(self, replicas: list[pb.CorruptReplica]
                                     ) -> pb.ReportCorruptReplicaResponse:
        """Report replicas here holding a batch that fails its CRC (the controller takes this
        broker out of their ISRs and moves their leadership); raises grpc.aio.AioRpcError
        when the controller is unreachable: the caller keeps the report and retries."""
        response: pb.ReportCorruptReplicaResponse = await self.stub.ReportCorruptReplica(
            pb.ReportCorruptReplicaRequest(broker_id=self.broker_id,
                                           broker_epoch=self.broker_epoch, replicas=replicas,
                                           control_token=self.control_token),
            timeout=RPC_TIMEOUT_S)
        return response

    async def allocate_producer_ids(self) -> pb.AllocateProducerIdsResponse:
        """Ask for a block of producer ids; raises grpc.aio.AioRpcError when the controller
        is unreachable."""
        response: pb.AllocateProducerIdsResponse = await self.stub.AllocateProducerIds(
            pb.AllocateProducerIdsRequest(broker_id=self.broker_id,
                                          broker_epoch=self.broker_epoch,
                                          control_token=self.control_token),
            timeout=RPC_TIMEOUT_S)
        return response

    async def alter_partition(self, items: list[pb.AlterPartitionItem]) -> pb.AlterPartitionResponse:
        """Send an AlterPartition; raises grpc.aio.AioRpcError when the controller is unreachable."""
        response: pb.AlterPartitionResponse = await self.stub.AlterPartition(
            pb.AlterPartitionRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch,
                                     items=items, control_token=self.control_token),
            timeout=RPC_TIMEOUT_S)
        return response
