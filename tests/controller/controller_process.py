"""A real controller process, an in-process one, and fake brokers (grpc.aio servicers in the
test's loop)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc

from tidewater.controller.config import ControllerConfig
from tidewater.controller.server import ControllerServer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

PROJECT_DIR = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControllerProcess:
    """``python -m controller`` on a free port; always stop() it (kills by pid)."""

    def __init__(self, data_dir: Path, settings=(), port: int | None = None,
                 metrics_port: int = 0):
        self.data_dir = data_dir
        self.settings = list(settings)
        self.port = port or free_port()
        self.metrics_port = metrics_port
        self.proc: subprocess.Popen | None = None
        self.stderr_path = data_dir.parent / f"controller-{self.port}.stderr"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15) -> ControllerProcess:
        cmd = [sys.executable, "-m", "tidewater.controller", "--listen", self.address,
               "--data-dir", str(self.data_dir), "--metrics-port", str(self.metrics_port)]
        for s in self.settings:
            cmd += ["--set", s]
        stderr = open(self.stderr_path, "ab")  # closed after Popen dups it
        try:
            self.proc = subprocess.Popen(cmd, cwd=PROJECT_DIR, stdout=subprocess.PIPE,
                                         stderr=stderr)
        finally:
            stderr.close()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode() if ready else ""
        if "listening" not in line:
            self.stop()
            raise RuntimeError(f"controller did not start: {line!r}\n{self.stderr()}")
        return self

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def wait(self, timeout_s: float = 10) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class InProcessController:
    """A ControllerServer in the test's event loop, with its exit recorded instead of done."""

    def __init__(self, data_dir, settings=()):
        self.exits: list[int] = []
        config = ControllerConfig(listen=f"127.0.0.1:{free_port()}", data_dir=data_dir)
        config.apply_settings(["broker.session.timeout.ms=30000",
                               "auto.leader.rebalance.enable=false",
                               # a sender that failed to deliver retries within 50 ms
                               "controller.sender.retry.backoff.max.ms=50", *settings])
        self.server = ControllerServer(config, exit_process=self.exits.append)
        self.address = config.listen

    async def __aenter__(self):
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = pb_grpc.ControllerStub(self.channel)
        return self

    async def __aexit__(self, *exc):
        await self.channel.close()
        await self.server.stop()


class FakeBroker(pb_grpc.BrokerControlServicer):
    """Registers, heartbeats, and records what the controller pushes to it."""

    def __init__(self, broker_id: int, controller_address: str, heartbeat_interval_ms: int = 100,
                 rack: str = ""):
        self.broker_id = broker_id
        self.rack = rack
        self.controller_address = controller_address
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.incarnation_id = uuid.uuid4().hex
        self.broker_epoch = -1
        self.control_token = b""  # the registration's
        self.leader_and_isr: list[pb.LeaderAndIsrRequest] = []
        self.update_metadata: list[pb.UpdateMetadataRequest] = []
        self.stop_replica: list[pb.StopReplicaRequest] = []
        self.heartbeat_responses: list[pb.BrokerHeartbeatResponse] = []
        self.heartbeating = True
        self.want_shutdown = False
        self.refuse_partitions_with = pb.NONE  # the error LeaderAndIsr answers per partition
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task | None = None
        self.port = None

    # ------------------------------------------------------------ BrokerControl service

    async def LeaderAndIsr(self, request, context):
        self.leader_and_isr.append(request)
        response = pb.LeaderAndIsrResponse(error_code=pb.NONE)
        if self.refuse_partitions_with != pb.NONE:  # as a broker that cannot host them
            for item in request.partitions:
                response.partitions.add(topic=item.state.topic, partition=item.state.partition,
                                        error_code=self.refuse_partitions_with,
                                        error_message="refused by the fake broker")
        return response

    async def UpdateMetadata(self, request, context):
        self.update_metadata.append(request)
        return pb.UpdateMetadataResponse(error_code=pb.NONE)

    async def StopReplica(self, request, context):
        self.stop_replica.append(request)
        return pb.StopReplicaResponse(error_code=pb.NONE)

    # ------------------------------------------------------------ life cycle

    async def start(self, *, serve: bool = True) -> FakeBroker:
        """Register and heartbeat; with ``serve=False`` the Broker service starts only at serve()."""
        if serve:
            await self.serve()
        else:
            self.port = free_port()
        self._channel = grpc.aio.insecure_channel(self.controller_address)
        self.controller = pb_grpc.ControllerStub(self._channel)
        await self.register()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        return self

    async def serve(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_BrokerControlServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port or 0}")
        await self._server.start()

    async def register(self) -> int:
        response = await self.controller.RegisterBroker(pb.RegisterBrokerRequest(
            broker_id=self.broker_id, incarnation_id=self.incarnation_id,
            listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=self.port)],
            rack=self.rack),
            timeout=5)
        assert response.error_code == pb.NONE, response
        self.broker_epoch = response.broker_epoch
        self.control_token = response.control_token
        return self.broker_epoch

    async def _heartbeat_loop(self) -> None:
        """Heartbeats on one BrokerHeartbeats stream, re-opened after it fails, as a broker
        does. ``heartbeating`` False: silent on an open stream (a paused broker)."""
        call = None
        while True:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            if not self.heartbeating:
                continue
            if call is None:
                call = self.controller.BrokerHeartbeats()
            try:
                await call.write(pb.BrokerHeartbeatRequest(
                    broker_id=self.broker_id, broker_epoch=self.broker_epoch,
                    want_shutdown=self.want_shutdown, control_token=self.control_token))
                async with asyncio.timeout(2):  # wait_for could swallow stop()'s cancel
                    response = await call.read()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
                response = grpc.aio.EOF  # controller down: keep trying, as a broker does
            if response is grpc.aio.EOF:
                call.cancel()
                call = None
                continue
            self.heartbeat_responses.append(response)
            if response.error_code == pb.STALE_BROKER_EPOCH:
                try:
                    await self.register()
                except grpc.aio.AioRpcError:
                    pass

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        if self._server is not None:
            await self._server.stop(0)

    # ------------------------------------------------------------ what it saw

    def latest_states(self) -> dict[tuple[str, int], pb.PartitionState]:
        """The newest LeaderAndIsr state per partition received so far."""
        states = {}
        for request in self.leader_and_isr:
            for item in request.partitions:
                states[(item.state.topic, item.state.partition)] = item.state
        return states


async def eventually(predicate, timeout_s: float = 10, interval_s: float = 0.05):
    """Wait until ``predicate()`` (sync or async) is truthy; returns its value.

    A KeyError or IndexError counts as "not yet" (a message not received so far).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
        except (KeyError, IndexError):
            value = None  # what it looks up has not arrived yet
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)
