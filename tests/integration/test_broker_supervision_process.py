"""A real broker process stops with exit code 70 and a CRITICAL line when a background
task dies or an invariant breaks inside a request, on the gRPC and the Kafka listener.

The seam is the test's own: the broker runs from ``python -c`` with one function of its
code replaced before ``main`` (``PATCHES``), so nothing in the broker's code paths (no
environment variable, no flag) exists for a test. The broker alone is enough: it serves
its listeners and runs its background loops while it looks for the (absent) controller.
"""

from __future__ import annotations

import socket
import subprocess
import time

import grpc
import pytest

from tests.integration.conftest import PY, ROOT, free_port, wait_for
from tests.kafka_wire import answered_as_kafka, plaintext_api_versions_answer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXIT_FATAL = 70  # broker/__main__.py

# Each runs in the broker process before main(); the broker's __main__ is imported first
# (it sets gRPC's environment before anything imports grpc).
PATCHES = {
    "checkpoint loop dies": """
import asyncio
from tidewater.broker.replicas import background

async def _checkpoint_loop(self):
    await asyncio.sleep(0.3)
    raise RuntimeError("the HW checkpoint loop broke (test)")
background.BackgroundWork._checkpoint_loop = _checkpoint_loop
""",
    "grpc handler breaks an invariant": """
from tidewater.broker.replicas.replica_manager import ReplicaManager
from tidewater.proto.errors import InvariantViolation

def describe_replicas(self, request):
    raise InvariantViolation("a replica's LEO below its HW (test)")
ReplicaManager.describe_replicas = describe_replicas
""",
    "kafka handler breaks an invariant": """
from tidewater.broker.kafka import apis
from tidewater.proto.errors import InvariantViolation

async def api_versions(services, head, body):
    raise InvariantViolation("a leader epoch went back (test)")
apis.HANDLERS[apis.API_VERSIONS] = api_versions
""",
}


class PatchedBroker:
    """``python -c``: PATCHES[patch], then the broker's main; stopped by pid."""

    def __init__(self, tmp_path, patch: str):
        self.port, self.kafka_port = free_port(), free_port()
        self.log_path = tmp_path / "broker.log"
        script = ("from tidewater.broker import __main__ as broker_main\n" + PATCHES[patch]
                  + "\nimport sys\nsys.exit(broker_main.main(sys.argv[1:]))\n")
        argv = [PY, "-c", script, "--broker-id", "1", "--listen", f"127.0.0.1:{self.port}",
                "--kafka-listen", f"127.0.0.1:{self.kafka_port}",
                "--controller", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data")]
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def serving(self) -> bool:
        for port in (self.port, self.kafka_port):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
        return True

    def wait_exit(self, timeout_s: float = 30) -> int:
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the broker did not stop:\n{self.log()[-3000:]}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()  # by its pid
        self.popen.wait(10)


@pytest.fixture
def patched_broker(tmp_path):
    started: list[PatchedBroker] = []

    def start(patch: str) -> PatchedBroker:
        broker = PatchedBroker(tmp_path, patch)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.kill()


def test_a_dead_background_task_stops_the_broker_process_with_70(patched_broker):
    broker = patched_broker("checkpoint loop dies")
    assert broker.wait_exit() == EXIT_FATAL
    log = broker.log()
    assert "CRITICAL" in log and "broker: background task hw-checkpoint died" in log, log
    assert "tide-broker: stopped after a fatal error: RuntimeError" in log, log


def test_an_invariant_broken_in_a_grpc_handler_stops_the_broker_process(patched_broker):
    broker = patched_broker("grpc handler breaks an invariant")
    wait_for(broker.serving, timeout_s=30, message="the broker's listeners")
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BrokerStub(channel).DescribeReplicas(pb.DescribeReplicasRequest(), timeout=10)
    # Not answered as if it were fine (no response with UNKNOWN_SERVER_ERROR in it).
    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert "invariant broken" in refused.value.details()
    assert broker.wait_exit() == EXIT_FATAL
    log = broker.log()
    assert "stopping the broker after: InvariantViolation" in log, log
    assert "tide-broker: stopped after a fatal error: InvariantViolation" in log, log


def test_an_invariant_broken_in_a_kafka_handler_stops_the_broker_process(patched_broker):
    broker = patched_broker("kafka handler breaks an invariant")
    wait_for(broker.serving, timeout_s=30, message="the broker's listeners")
    started = time.monotonic()
    answer = plaintext_api_versions_answer("127.0.0.1", broker.kafka_port, timeout_s=10)
    assert not answered_as_kafka(answer), answer  # closed, not answered
    assert time.monotonic() - started < 10
    assert broker.wait_exit() == EXIT_FATAL
    log = broker.log()
    assert "stopping the broker after: InvariantViolation" in log, log
    assert "a leader epoch went back (test)" in log, log
