"""The broker's side of the controller protocol: registration, heartbeats, AlterPartition.

Theory of operation:
- ``register()`` retries RegisterBroker until the controller answers NONE; the
  answer's ``broker_epoch`` identifies this incarnation in every later call.
- ``run_heartbeats()`` sends BrokerHeartbeat every ``broker.heartbeat.interval.ms``.
  STALE_BROKER_EPOCH / BROKER_ID_NOT_REGISTERED means the controller no longer
  knows this epoch: register again, and the controller resends the full
  LeaderAndIsr for our partitions. A heartbeat from a fenced broker (e.g.
  after a long pause) unfences it and brings a full resync too; if we stay
  fenced for two session timeouts anyway, we register again as a safety net.
- ``controlled_shutdown()`` heartbeats with ``want_shutdown`` until the answer
  says ``should_shutdown`` (leadership moved away) or the timeout passes.
- A controller that cannot be reached is retried with a backoff; no call here
  raises for a transport error except ``alter_partition``, whose caller keeps
  its old state and retries later.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc

from broker.channels import channel_options
from proto import tidewater_pb2 as pb
from proto import tidewater_pb2_grpc as pb_grpc

log = logging.getLogger("tidewater.broker.controller_channel")

RPC_TIMEOUT_S = 5.0
RETRY_BACKOFF_S = 0.2


class ControllerChannel:
    def __init__(self, *, broker_id: int, controller_address: tuple[str, int],
                 listeners: list[pb.Listener], heartbeat_interval_ms: int,
                 session_timeout_ms: int, max_message_bytes: int = 100 * 1024 * 1024,
                 on_registered: Callable[[int], Awaitable[None]] | None = None):
        self.broker_id = broker_id
        self.controller_address = controller_address
        self.listeners = list(listeners)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.incarnation_id = uuid.uuid4().hex
        self.broker_epoch = -1
        self.cluster_id = ""
        self.is_fenced = True
        self._on_registered = on_registered
        self._fenced_since: float | None = None
        self._stopping = False
        host, port = controller_address
        self._channel = grpc.aio.insecure_channel(f"{host}:{port}",
                                                  options=channel_options(max_message_bytes))
        self.stub = pb_grpc.ControllerStub(self._channel)

    async def close(self) -> None:
        self._stopping = True
        await self._channel.close()

    async def register(self) -> int:
        """Register until the controller accepts; returns the new broker epoch."""
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self.stub.RegisterBroker(
                    pb.RegisterBrokerRequest(broker_id=self.broker_id,
                                             incarnation_id=self.incarnation_id,
                                             listeners=self.listeners),
                    timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                if attempt == 1 or attempt % 25 == 0:
                    log.info("controller %s:%d not reachable (%s), retrying",
                             *self.controller_address, e.code().name)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if resp.error_code != pb.NONE:
                if attempt == 1 or attempt % 25 == 0:
                    log.warning("registration refused: %s %s (attempt %d)",
                                pb.ErrorCode.Name(resp.error_code), resp.error_message, attempt)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            self.broker_epoch = resp.broker_epoch
            self.cluster_id = resp.cluster_id
            self._fenced_since = None
            log.info("registered broker %d with broker epoch %d", self.broker_id,
                     self.broker_epoch)
            if self._on_registered is not None:
                await self._on_registered(self.broker_epoch)
            return self.broker_epoch

    async def heartbeat(self, *, want_shutdown: bool = False) -> pb.BrokerHeartbeatResponse | None:
        """One heartbeat; None when the controller could not be reached."""
        try:
            resp = await self.stub.BrokerHeartbeat(
                pb.BrokerHeartbeatRequest(broker_id=self.broker_id,
                                          broker_epoch=self.broker_epoch,
                                          want_shutdown=want_shutdown),
                timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.debug("heartbeat failed: %s", e.code().name)
            return None
        return resp

    def _needs_registration(self, resp: pb.BrokerHeartbeatResponse) -> bool:
        if resp.error_code in (pb.STALE_BROKER_EPOCH, pb.BROKER_ID_NOT_REGISTERED):
            return True
        if resp.error_code != pb.NONE:
            return False
        if not resp.is_fenced:
            self._fenced_since = None
            return False
        now = time.monotonic()
        if self._fenced_since is None:
            self._fenced_since = now
        return (now - self._fenced_since) * 1000 > 2 * self.session_timeout_ms

    async def run_heartbeats(self) -> None:
        """Heartbeat forever (until cancelled), re-registering when the controller says so."""
        while not self._stopping:
            resp = await self.heartbeat()
            if resp is not None:
                self.is_fenced = resp.is_fenced
                if self._needs_registration(resp):
                    log.info("heartbeat answered %s fenced=%s: registering again",
                             pb.ErrorCode.Name(resp.error_code), resp.is_fenced)
                    await self.register()
                    continue
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)

    async def controlled_shutdown(self, timeout_ms: int) -> bool:
        """Ask the controller to move leadership away; True when it said should_shutdown."""
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            resp = await self.heartbeat(want_shutdown=True)
            if resp is not None:
                if resp.should_shutdown:
                    return True
                if resp.error_code in (pb.STALE_BROKER_EPOCH, pb.BROKER_ID_NOT_REGISTERED):
                    return False
            await asyncio.sleep(min(self.heartbeat_interval_ms, 200) / 1000)
        return False

    async def alter_partition(self, items: list[pb.AlterPartitionItem]) -> pb.AlterPartitionResponse:
        """Send an AlterPartition; raises grpc.aio.AioRpcError when the controller is unreachable."""
        return await self.stub.AlterPartition(
            pb.AlterPartitionRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch,
                                     items=items),
            timeout=RPC_TIMEOUT_S)
