"""The controller runs its tasks under the broker's TaskSupervisor: a task that dies, or a
broken invariant in the state machine or a handler, stops the process with exit code 1
and a CRITICAL line, instead of answering a caller and serving on.

The real-process tests replace one function before the controller's ``main`` in a
``python -c`` of their own (``PATCHES``): the seam is the test's, not the controller's.
"""

from __future__ import annotations

import select
import subprocess
import sys

import grpc
import pytest
from controller_process import PROJECT_DIR, InProcessController, free_port

from tidewater.controller.service import ControllerService
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvariantViolation

pytestmark = pytest.mark.timeout(120)

PATCHES = {
    "session timer dies": """
import asyncio
from tidewater.controller.server import ControllerServer

async def _session_timer(self):
    await asyncio.sleep(0.3)
    raise RuntimeError("the session timer broke (test)")
ControllerServer._session_timer = _session_timer
""",
    "state machine breaks an invariant": """
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto.errors import InvariantViolation

def create_topics(self, tx, now_ms, request):
    raise InvariantViolation("two leaders in one epoch (test)")
ControllerStateMachine.create_topics = create_topics
""",
}


class PatchedController:
    """``python -c``: PATCHES[patch], then the controller's main; stopped by pid."""

    def __init__(self, tmp_path, patch: str):
        self.address = f"127.0.0.1:{free_port()}"
        self.stderr_path = tmp_path / "controller.stderr"
        script = ("from tidewater.controller import __main__ as controller_main\n"
                  + PATCHES[patch]
                  + "\nimport sys\nsys.exit(controller_main.main(sys.argv[1:]))\n")
        argv = [sys.executable, "-c", script, "--listen", self.address,
                "--data-dir", str(tmp_path / "controller")]
        with open(self.stderr_path, "wb") as stderr:
            self.popen = subprocess.Popen(argv, cwd=PROJECT_DIR, stdout=subprocess.PIPE,
                                          stderr=stderr)
        ready, _, _ = select.select([self.popen.stdout], [], [], 30)
        line = self.popen.stdout.readline().decode() if ready else ""
        assert "listening" in line, f"{line!r}\n{self.stderr()}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_exit(self, timeout_s: float = 30) -> int:
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the controller did not stop:\n{self.stderr()[-3000:]}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()  # by its pid
        self.popen.wait(10)
        self.popen.stdout.close()


@pytest.fixture
def patched_controller(tmp_path):
    started: list[PatchedController] = []

    def start(patch: str) -> PatchedController:
        controller = PatchedController(tmp_path, patch)
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.kill()


@pytest.mark.integration
def test_a_dead_background_task_stops_the_controller_process_with_1(patched_controller):
    controller = patched_controller("session timer dies")
    assert controller.wait_exit() == 1
    stderr = controller.stderr()
    assert "CRITICAL" in stderr and "controller: background task session-timer died" in stderr
    assert "tide-controller: stopped after a fatal error: RuntimeError" in stderr, stderr


@pytest.mark.integration
def test_an_invariant_broken_in_the_state_machine_stops_the_controller_process(
        patched_controller):
    controller = patched_controller("state machine breaks an invariant")
    with grpc.insecure_channel(controller.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControllerStub(channel).CreateTopics(pb.CreateTopicsRequest(
                topics=[pb.CreatableTopic(name="t", num_partitions=1, replication_factor=1)]),
                timeout=10)
    # Not handed to the caller as its own error: the owner stopped.
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert controller.wait_exit() == 1
    stderr = controller.stderr()
    assert "controller: background task metadata-owner died" in stderr, stderr
    assert "tide-controller: stopped after a fatal error: InvariantViolation" in stderr, stderr


async def test_an_invariant_broken_in_a_handler_stops_the_controller(tmp_path, monkeypatch):
    """Outside the owner too: the gRPC boundary (``InvariantBoundary``) hands it to the
    supervisor and ends the call with INTERNAL instead of grpc's UNKNOWN."""

    def broken(self, principal, broker_id, rpc):
        raise InvariantViolation("a heartbeat stream bound twice (test)")
    monkeypatch.setattr(ControllerService, "_refusal", broken)
    async with InProcessController(tmp_path / "controller") as controller:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await controller.stub.RegisterBroker(pb.RegisterBrokerRequest(broker_id=1), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INTERNAL
        assert "controller invariant broken" in refused.value.details()
        server = controller.server
        assert server.stopped.is_set()
        assert isinstance(server.failure, InvariantViolation)
        assert server.supervisor.failure is server.failure
