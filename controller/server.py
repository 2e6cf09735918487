"""Wiring of the controller process: log, owner, senders, timers, gRPC server, metrics.

``ControllerServer.start()`` recovers the metadata log (compacting it when it
grew large), appends the new controller epoch, starts the owner task, the
session and preferred-leader timers, the gRPC server and (optionally) the
metrics endpoint. ``stop()``
undoes it in reverse: heartbeat streams first (ended without fencing: a
broker losing its controller is not a broker crash), then gRPC (with a grace
period, so in-flight requests finish), then timers, owner and senders, then
the log file.

A metadata write that fails (or a command that fails after appending) ends
the process at once with ``EXIT_METADATA_NOT_DURABLE``, from inside the
owner's synchronous failure path (``_on_fatal``): the senders are aborted and
the image poisoned before any other coroutine runs, so nothing the log lacks
ever reaches a broker or a client. No graceful stop: that would keep the gRPC
server and the senders running for seconds. ``exit_process`` is injectable
for tests.

Every task the controller starts (the owner, the timers, a sender per broker)
runs under ``supervisor``, the broker's own ``TaskSupervisor``: one that dies
is logged at CRITICAL and stops the process with exit code 1, as does an
``InvariantViolation`` that reaches the owner or a gRPC handler.

Security (``--sasl-mechanisms``, ``--authorizer``, ``--super-users``): with either on,
``access.ControllerGuard`` authenticates every call and checks it as Kafka's controller
does; ``--bootstrap-user-config`` gives the first user its SCRAM credentials at start-up
(after replay, through the owner: durable before anything is served).

TLS (``--tls-*``): the listener speaks TLS only and requires a client
certificate of the cluster's CA (brokers, and admin tools with a ``client``
certificate; clients reach the controller through a broker); the senders
present the controller's certificate to the brokers' INTERNAL listeners.

Connections (``max.connections``, ``connections.max.idle.ms``; ``grpc_limits``): the
port serves at most that many at once (gRPC core closes the others before their
handshake) and sends GOAWAY to one with no call open for the idle time; a broker's
heartbeat stream is a call open, so its connection is never idle.

Fencing has two detectors: the session timer (``broker.session.timeout.ms``
without a heartbeat: a paused, partitioned or hung broker) and the end of a
broker's ``BrokerHeartbeats`` stream (a dead process, whose kernel closed the
connection: fenced at once). Both go through the same state-machine path and
are counted in ``brokers_fenced{reason}``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc

from tidewater.broker.security.grpc_preauth import PreAuthentication
from tidewater.broker.security.settings import read_user_config
from tidewater.broker.security.stream_expiry import SessionStreamLimit
from tidewater.broker.servicers.grpc_limits import GrpcLimits
from tidewater.broker.servicers.sasl import SaslServicer
from tidewater.controller.access import ControllerGuard, controller_security
from tidewater.controller.config import ControllerConfig, parse_host_port
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.metrics import ControllerMetrics
from tidewater.controller.owner import MetadataOwner, OwnerStoppedError
from tidewater.controller.quorum.config import QuorumConfig, parse_initial_controllers
from tidewater.controller.quorum.formatting import (
    format_raft_directory,
    is_formatted,
    raft_directory,
    require_formatted,
)
from tidewater.controller.quorum.metadata_app import MetadataApplication
from tidewater.controller.quorum.metrics import RaftMetrics
from tidewater.controller.quorum.migration import require_migrated
from tidewater.controller.quorum.owner import NotActiveError, QuorumOwner
from tidewater.controller.quorum.shell import QuorumShell
from tidewater.controller.sender import BrokerSenders
from tidewater.controller.service import ControllerService
from tidewater.controller.state_machine import ControllerStateMachine, Effects, Tx
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvalidConfigError, InvariantViolation, RequestTimedOutError
from tidewater.proto.scram import MECHANISMS, credential_to_pb, make_credential
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import channel_credentials, server_credentials

log = logging.getLogger(__name__)

SESSION_CHECK_INTERVAL_MS_MAX = 100
# The process's exit code when the image got ahead of the metadata log (see the docstring).
EXIT_METADATA_NOT_DURABLE = 3


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def exit_now(code: int) -> None:
    """End the process without unwinding: no finally block, task or gRPC grace period runs."""
    logging.shutdown()  # flushes the CRITICAL line
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class InvariantBoundary(grpc.aio.ServerInterceptor):
    """The gRPC boundary for a broken invariant: an ``InvariantViolation`` escaping any
    handler stops the controller (``TaskSupervisor.fail``) and ends the call with
    INTERNAL, instead of grpc's UNKNOWN answer to a caller and serving on."""

    def __init__(self, supervisor: TaskSupervisor):
        self._supervisor = supervisor

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        guarded: dict[str, Any] = {}
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind, None)
            # Every ControllerService method is a coroutine function (streams write
            # through the context), so one wrapper fits them all.
            if behavior is not None and inspect.iscoroutinefunction(behavior):
                guarded[kind] = self._guard(behavior)
        return handler._replace(**guarded) if guarded else handler  # type: ignore[attr-defined]

    def _guard(self, behavior: Callable[[Any, Any], Awaitable[Any]],
               ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def guarded(request: Any, context: Any) -> Any:
            try:
                return await behavior(request, context)
            except InvariantViolation as e:
                self._supervisor.fail(e)
                await context.abort(grpc.StatusCode.INTERNAL, f"controller invariant broken: {e}")
        return guarded


class ControllerServer:
    def __init__(self, config: ControllerConfig, *,
                 exit_process: Callable[[int], None] = exit_now):
        self.config = config
        self._exit_process = exit_process
        self.machine = ControllerStateMachine(config)
        self.metrics = ControllerMetrics()
        self.metadata_log: MetadataLog | None = None
        self.owner: MetadataOwner | QuorumOwner | None = None
        self.quorum_shell: QuorumShell | None = None
        self.senders: BrokerSenders | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.service: ControllerService | None = None
        self.port: int | None = None
        self.supervisor = TaskSupervisor(on_fatal=self._stop_after, process="controller")
        self._tasks: list[asyncio.Task[None]] = []  # the owner and the timers
        self._metrics_http: tuple[WSGIServer, threading.Thread] | None = None
        self.stopped = asyncio.Event()
        self.failure: BaseException | None = None
        self._stopping = False

    def _on_commit(self, effects: Effects) -> None:
        if self.senders is None:  # made in start(), before the owner that calls this
            raise InvariantViolation("a commit before the senders were made")
        self.senders.on_commit(effects)
        self.metrics.on_commit(self.machine, effects)

    async def start(self) -> None:
        self.supervisor.watch_callbacks(asyncio.get_running_loop())
        if self.config.quorum_voters:
            self._check_formatted()
        tls = self.config.tls.load() if self.config.tls is not None else None
        self.senders = BrokerSenders(
            self.machine, self.config,
            credentials=channel_credentials(tls) if tls is not None else None,
            on_delivered=lambda kind: self.metrics.requests_delivered.labels(kind).inc(),
            supervisor=self.supervisor,
            on_partition_error=lambda kind, error: (
                self.metrics.broker_partition_errors.labels(kind, error).inc()))
        quorum = self.config.quorum_config(tls) if self.config.quorum_voters else None
        if quorum is None:
            self.metadata_log = MetadataLog.open(self.config.data_dir)
            self.owner = MetadataOwner(self.metadata_log, self.machine,
                                       on_commit=self._on_commit, on_fatal=self._on_fatal,
                                       clock_ms=monotonic_ms,
                                       queue_size_max=self.config.metadata_queue_size_max)
        else:
            self.owner = QuorumOwner(self.machine, on_commit=self._on_commit,
                                     on_activated=self._on_activated,
                                     on_start=self._add_bootstrap_users,
                                     on_renounce=self._on_renounce, clock_ms=monotonic_ms,
                                     queue_size_max=self.config.metadata_queue_size_max)
        # Bind before writing anything: a controller that cannot serve must not
        # bump the controller epoch.
        host, port = parse_host_port(self.config.listen)
        security = self.config.security
        secured = bool(security.sasl_mechanisms) or security.authorizer != "none"
        # Authentication and Kafka's authorizer in front of every call (``access``).
        guard_security = controller_security(security, lambda: self.machine.metadata)
        # A heartbeat stream opened with a session token ends with its session unless
        # the broker re-authenticated it (``stream_expiry``).
        # With SASL and no TLS (which would require a certificate in the handshake), a
        # call whose metadata does not authenticate it is refused before its request is
        # read (``grpc_preauth``). What a connection may hold: ``grpc_limits``.
        preauthentication = ([PreAuthentication(guard_security.check_call_metadata)]
                             if security.sasl_mechanisms and tls is None else [])
        self.grpc_server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0),
                     *GrpcLimits(max_concurrent_streams=1_000,
                                 max_connection_idle_ms=self.config.connections_max_idle_ms,
                                 max_connections=self.config.max_connections).options()],
            interceptors=[InvariantBoundary(self.supervisor), *preauthentication,
                          SessionStreamLimit(guard_security.grpc_sessions)])
        self.service = ControllerService(self.owner, self.machine, self.metrics, self.senders,
                                         supervisor=self.supervisor,
                                         authenticating=tls is not None)
        servicer: pb_grpc.ControllerServicer = (
            ControllerGuard(self.service, guard_security) if secured else self.service)
        pb_grpc.add_ControllerServicer_to_server(servicer, self.grpc_server)
        # SCRAM over gRPC: its session tokens are what the guard takes (``servicers.sasl``).
        pb_grpc.add_SaslServicer_to_server(SaslServicer(guard_security), self.grpc_server)
        try:
            if tls is None:
                self.port = self.grpc_server.add_insecure_port(f"{host}:{port}")
            else:
                self.port = self.grpc_server.add_secure_port(
                    f"{host}:{port}", server_credentials(tls, require_client_auth=True))
        except RuntimeError as e:  # grpc's way of saying the bind failed
            raise OSError(f"cannot listen on {self.config.listen}: {e}") from e
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        if self.config.metrics_port:
            # On metrics.bind.address (127.0.0.1 unless told otherwise), not the gRPC
            # host; with TLS, HTTPS with the controller's certificate, as every port.
            # In secure mode only to a scraper with a certificate of the CA or a user's
            # password (HTTP Basic) checked against the SCRAM credentials.
            self._metrics_http = self.metrics.serve(
                self.config.metrics_port, self.config.metrics_bind_address,
                tls=self.config.tls, secured=secured, check_password=guard_security.password_ok)

        if isinstance(self.owner, MetadataOwner):
            assert self.metadata_log is not None  # opened with the owner
            replayed = self.owner.recover()
            self.owner.maybe_compact(self.config.metadata_compaction_records_min)
            self.owner.run_now(self.machine.start)
            for path in self.config.bootstrap_user_configs:
                self._bootstrap_user(path)
            metadata = self.machine.metadata
            log.info("metadata log %s: replayed %d records; cluster %s, controller epoch %d, "
                     "%d brokers, %d topics", self.metadata_log.path, replayed,
                     metadata.cluster_id, metadata.controller_epoch, len(metadata.brokers),
                     len(metadata.topics))
            self.metrics.active_controller.set(1)
        else:
            assert quorum is not None
            await self._start_quorum(self.owner, quorum)
        self.metrics.refresh(self.machine)

        self._spawn(self.owner.run(), "metadata-owner")
        self._spawn(self._session_timer(), "session-timer")
        if self.config.auto_leader_rebalance_enable:
            self._spawn(self._preferred_leader_timer(), "preferred-leader-timer")
        await self.grpc_server.start()
        log.info("controller %d listening on %s:%d%s (SASL %s, authorizer %s, metrics port %s)",
                 self.config.node_id, host, self.port,
                 " (TLS, client certificates required)" if tls else "",
                 ",".join(security.sasl_mechanisms) or "off", security.authorizer,
                 self.config.metrics_port or "off")

    def _check_formatted(self) -> None:
        """Before anything binds: a Raft directory never formatted (new or wiped) refuses
        to start, or with ``--format-if-empty`` is formatted for ``--initial-controllers``
        (``quorum.formatting``: never again under an id that may have voted)."""
        raft_dir = raft_directory(self.config.data_dir)
        format_command = (f"tide quorum format --data-dir {self.config.data_dir} "
                          f"--node-id {self.config.node_id}")
        # A single controller's metadata.log here and not in Raft: the quorum would start
        # without every topic (``quorum.migration``).
        require_migrated(self.config.data_dir, format_command)
        if is_formatted(raft_dir):
            return
        if not self.config.format_if_empty:
            require_formatted(raft_dir, format_command)
        local = format_raft_directory(raft_dir, self.config.node_id,
                                      parse_initial_controllers(self.config.initial_controllers))
        log.warning("%s was empty: formatted (--format-if-empty) as node %d with directory "
                    "id %s", raft_dir, local.id, local.directory_id)

    async def _start_quorum(self, owner: QuorumOwner, quorum: QuorumConfig) -> None:
        """The Raft node, applying committed records into the image (``quorum.owner``), on
        a directory formatted before (``_check_formatted``)."""
        self.quorum_shell = QuorumShell(
            quorum, on_fatal=self.supervisor.fail,
            application=MetadataApplication(self.machine, on_applied=owner.on_applied),
            on_leadership=owner.on_leadership,
            metrics=RaftMetrics(self.metrics.registry))
        owner.shell = self.quorum_shell
        await self.quorum_shell.start()
        log.info("controller %d: quorum node on port %d (voters %s); standby until it "
                 "leads", quorum.node_id, self.quorum_shell.port, self.config.quorum_voters)

    def _on_activated(self, controller_epoch: int) -> None:
        # Epoch first: a scrape never pairs "active" with the previous holder's epoch
        # (chaos counts failovers by the active epochs, verdict.controller_failovers).
        self.metrics.controller_epoch.set(controller_epoch)
        self.metrics.active_controller.set(1)

    def _on_renounce(self) -> None:
        self.metrics.active_controller.set(0)
        if self.senders is not None:
            self.senders.renounce()

    def _bootstrap_user(self, path: Path) -> None:
        """SCRAM credentials for the user of ``path`` in every mechanism it lacks (as
        `kafka-storage format --add-scram`): the first admin and the brokers' user exist
        before anyone can authenticate to create them. A credential already there is
        kept (an operator may have changed the password since)."""
        if not isinstance(self.owner, MetadataOwner):
            raise InvariantViolation("the bootstrap user before the owner (or with a quorum)")
        self.owner.run_now(lambda tx, now: self._add_bootstrap_user(tx, now, path))

    def _add_bootstrap_users(self, tx: Tx, now_ms: int) -> None:
        """With a quorum, in the command that makes a leader the active controller: every
        ``--bootstrap-user-config`` user's missing credentials, proposed with it through the
        replicated log (so every standby has them, and a later leader finds them there)."""
        for path in self.config.bootstrap_user_configs:
            self._add_bootstrap_user(tx, now_ms, path)

    def _add_bootstrap_user(self, tx: Tx, now_ms: int, path: Path) -> None:
        try:
            user, password = read_user_config(path)
        except ValueError as e:
            raise InvalidConfigError(f"--bootstrap-user-config: {e}") from e
        credentials = self.machine.metadata.security.credentials
        missing = [m for m in sorted(MECHANISMS) if (user, m) not in credentials]
        if not missing:
            return
        request = pb.AlterUserScramCredentialsRequest(upsertions=[
            credential_to_pb(user, make_credential(m, password)) for m in missing])
        response = self.machine.alter_user_scram_credentials(tx, now_ms, request)
        for result in response.results:
            if result.error_code != pb.NONE:
                raise InvalidConfigError(f"--bootstrap-user-config: user {user!r}: "
                                         f"{pb.ErrorCode.Name(result.error_code)} "
                                         f"{result.error_message}")
        log.info("bootstrap user %r: SCRAM credentials added (%s)", user, ", ".join(missing))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(self.supervisor.spawn(coro, name))

    def _on_fatal(self, error: BaseException) -> None:
        """The image got ahead of the log (called synchronously by the owner, image poisoned)."""
        try:
            if self.senders is not None:
                self.senders.abort()
        finally:
            log.critical("metadata image ahead of its log: %s. Exiting at once with code %d, "
                         "sending nothing more; a restart replays the log and resyncs every "
                         "broker", error, EXIT_METADATA_NOT_DURABLE)
            self._exit_process(EXIT_METADATA_NOT_DURABLE)
        self.supervisor.fail(error)  # only with an injected exit_process (tests)

    def _stop_after(self, error: BaseException) -> None:
        """The supervisor's fatal path (once): ``serve`` sees ``stopped`` and exits with 1."""
        self.failure = error
        self.stopped.set()

    async def _session_timer(self) -> None:
        interval_s = min(SESSION_CHECK_INTERVAL_MS_MAX,
                         self.config.broker_session_timeout_ms // 10 or 1) / 1000
        owner = self.owner
        if owner is None:  # the timers start after the owner
            raise InvariantViolation("the session timer before the owner")
        while True:
            await asyncio.sleep(interval_s)
            if self._stopping:
                # Brokers lose their heartbeat path to a stopping controller: their
                # silence is ours, and the next controller gives them fresh sessions.
                return
            try:
                fenced = await owner.submit(self.machine.check_sessions)
            except NotActiveError:
                continue  # a standby: it decides nothing until it leads
            except OwnerStoppedError:
                return
            except RequestTimedOutError as e:
                # Its records did not commit in time (a slow quorum): they may still; the
                # next check decides again on what did.
                log.warning("session check not committed in time: %s", e)
                continue
            for broker_id in fenced:
                self.metrics.brokers_fenced.labels("session_timeout").inc()
                log.warning("broker %d fenced: no heartbeat for %d ms", broker_id,
                            self.config.broker_session_timeout_ms)

    async def _preferred_leader_timer(self) -> None:
        owner = self.owner
        if owner is None:  # the timers start after the owner
            raise InvariantViolation("the preferred-leader timer before the owner")
        while True:
            await asyncio.sleep(self.config.leader_imbalance_check_interval_seconds)
            try:
                moved = await owner.submit(self.machine.preferred_leader_check)
            except NotActiveError:
                continue
            except OwnerStoppedError:
                return
            except RequestTimedOutError as e:
                log.warning("preferred leader election not committed in time: %s", e)
                continue
            if moved:
                log.info("preferred leader election moved %d partitions", moved)

    async def stop(self) -> None:
        self._stopping = True
        if self.service is not None:
            # Before the gRPC server: streams never finish on their own (they would
            # hold the stop for the whole grace period), and their end must not
            # fence brokers that only lose this controller.
            await self.service.close_streams()
        if self.grpc_server is not None:
            await self.grpc_server.stop(self.config.shutdown_grace_seconds)
        if self.owner is not None:
            self.owner.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.senders is not None:
            await self.senders.close()
        await self.supervisor.stop()  # anything left (a sender's close)
        if self._metrics_http is not None:
            server, thread = self._metrics_http
            server.shutdown()
            server.server_close()
            thread.join(timeout=2)
        if self.quorum_shell is not None:
            await self.quorum_shell.stop()
        if self.metadata_log is not None:
            self.metadata_log.close()
        self.metrics.active_controller.set(0)
        self.stopped.set()
