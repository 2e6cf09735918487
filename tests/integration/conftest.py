"""Real controller and broker processes on 127.0.0.1 for the integration tests.

``cluster`` (a fixture factory) starts ``python -m controller`` and N
``python -m broker`` processes on free ports with tmp data dirs; every process
is stopped by pid in the fixture's finalizer. Helpers talk raw gRPC (sync
stubs) and build batches with ``proto.records.encode_batch``. Waiting is
always "until a condition holds, with a deadline", never a bare sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.records import decode_records, encode_batch

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

# Fast failure detection for tests (documented defaults are 3000 / 500).
FAST_BROKER_SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "1500",
    "replica.fetch.wait.max.ms": "300",
    "log.flush.offset.checkpoint.interval.ms": "200",
    "controlled.shutdown.timeout.ms": "3000",
}
FAST_CONTROLLER_SETTINGS = {"broker.session.timeout.ms": "1500"}
# Deadlines stretch on a loaded machine (TIDE_TEST_WAIT_SCALE, default 2).
WAIT_SCALE = float(os.environ.get("TIDE_TEST_WAIT_SCALE", "2"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout_s: float = 15.0, interval_s: float = 0.05,
             message: str = "condition") -> object:
    """Return the first truthy value of ``predicate()``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s * WAIT_SCALE
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (grpc.RpcError, OSError, AssertionError, KeyError, IndexError) as e:
            last_error = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {message}" + (f" (last error: {last_error})"
                                                               if last_error else ""))


class Proc:
    """One child process we own; stopped by pid."""

    def __init__(self, name: str, argv: list[str], log_path: Path):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        assert self.popen is None or self.popen.poll() is not None
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGCONT)
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.popen is None:
            return 0
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGCONT)
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                return self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.name} did not stop on SIGTERM") from None
        return self.popen.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Broker:
    def __init__(self, broker_id: int, controller_address: str, data_dir: Path, log_dir: Path,
                 settings: dict[str, str], extra_args: list[str] | None = None):
        self.broker_id = broker_id
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data_dir = data_dir
        argv = [PY, "-m", "tidewater.broker", "--broker-id", str(broker_id), "--listen", self.address,
                "--controller", controller_address, "--data-dir", str(data_dir)]
        for name, value in settings.items():
            argv += ["--set", f"{name}={value}"]
        argv += extra_args or []
        self.proc = Proc(f"broker-{broker_id}", argv, log_dir / f"broker-{broker_id}.log")
        self._channel: grpc.Channel | None = None

    @property
    def stub(self) -> pb_grpc.BrokerStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return pb_grpc.BrokerStub(self._channel)

    @property
    def admin(self) -> pb_grpc.ControllerStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return pb_grpc.ControllerStub(self._channel)

    def reset_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def replica(self, topic: str, partition: int = 0) -> pb.ReplicaInfo | None:
        resp = self.stub.DescribeReplicas(pb.DescribeReplicasRequest(topics=[topic]), timeout=5)
        for r in resp.replicas:
            if r.partition == partition:
                return r
        return None


class Cluster:
    def __init__(self, base: Path):
        self.base = base
        self.controller_port = free_port()
        self.controller_address = f"127.0.0.1:{self.controller_port}"
        self.brokers: dict[int, Broker] = {}
        self.controller: Proc | None = None

    def start_controller(self, settings: dict[str, str]) -> None:
        argv = [PY, "-m", "tidewater.controller", "--listen", self.controller_address, "--data-dir",
                str(self.base / "controller")]
        for name, value in settings.items():
            argv += ["--set", f"{name}={value}"]
        self.controller = Proc("controller", argv, self.base / "controller.log")
        self.controller.start()

    def add_broker(self, broker_id: int, settings: dict[str, str],
                   extra_args: list[str] | None = None) -> Broker:
        b = Broker(broker_id, self.controller_address, self.base / f"broker-{broker_id}",
                   self.base, settings, extra_args)
        self.brokers[broker_id] = b
        b.proc.start()
        return b

    def controller_stub(self) -> pb_grpc.ControllerStub:
        return pb_grpc.ControllerStub(grpc.insecure_channel(self.controller_address))

    def describe(self) -> pb.DescribeClusterResponse:
        return self.controller_stub().DescribeCluster(pb.DescribeClusterRequest(), timeout=5)

    def wait_registered(self, ids, timeout_s: float = 20) -> None:
        def registered():
            live = {b.broker_id for b in self.describe().brokers if not b.fenced}
            return set(ids) <= live
        wait_for(registered, timeout_s, message=f"brokers {sorted(ids)} registered")

    def partition_state(self, topic: str, partition: int = 0) -> pb.PartitionState | None:
        for t in self.describe().topics:
            if t.name == topic:
                for p in t.partitions:
                    if p.partition == partition:
                        return p
        return None

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 2,
                     configs: dict[str, str] | None = None, via: int | None = None) -> None:
        broker = self.brokers[via if via is not None else min(self.brokers)]
        resp = broker.admin.CreateTopics(pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=name, num_partitions=partitions,
                                      replication_factor=replication_factor,
                                      configs=configs or {})], timeout_ms=10000), timeout=20)
        assert resp.topics[0].error_code == pb.NONE, resp
        for index in range(partitions):
            self.wait_leader_ready(name, index)

    def leader(self, topic: str, partition: int = 0) -> Broker:
        state = self.partition_state(topic, partition)
        assert state is not None and state.leader >= 0, state
        return self.brokers[state.leader]

    def wait_leader_ready(self, topic: str, partition: int = 0, timeout_s: float = 20,
                          isr_size: int | None = None) -> Broker:
        """Wait until the controller's leader serves the partition as leader in its epoch."""
        def ready():
            state = self.partition_state(topic, partition)
            if state is None or state.leader < 0 or state.leader not in self.brokers:
                return None
            if isr_size is not None and len(state.isr) != isr_size:
                return None
            broker = self.brokers[state.leader]
            info = broker.replica(topic, partition)
            if info is None or not info.is_leader or info.leader_epoch != state.leader_epoch:
                return None
            return broker
        return wait_for(ready, timeout_s, message=f"leader of {topic}-{partition} ready")

    def stop_all(self) -> None:
        for b in self.brokers.values():
            b.reset_channel()
            b.proc.kill()
        if self.controller is not None:
            self.controller.kill()

    def logs(self, lines: int = 40) -> str:
        parts = []
        for proc in [self.controller] + [b.proc for b in self.brokers.values()]:
            if proc is not None:
                parts.append(f"----- {proc.name}\n{proc.log_tail(lines)}")
        return "\n".join(parts)


@pytest.fixture
def cluster(tmp_path, request):
    """Factory: ``cluster(n, broker_settings=..., controller_settings=...)`` -> Cluster."""
    clusters: list[Cluster] = []

    def make(n: int = 2, broker_settings: dict[str, str] | None = None,
             controller_settings: dict[str, str] | None = None,
             extra_args: Callable[[int], list[str]] | None = None) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(clusters)}")
        c.base.mkdir(parents=True)
        clusters.append(c)
        c.start_controller({**FAST_CONTROLLER_SETTINGS, **(controller_settings or {})})
        for broker_id in range(1, n + 1):
            c.add_broker(broker_id, {**FAST_BROKER_SETTINGS, **(broker_settings or {})},
                         extra_args(broker_id) if extra_args else None)
        c.wait_registered(range(1, n + 1))
        return c

    yield make
    failed = getattr(request.node, "rep_call", None)
    for c in clusters:
        # TIDE_TEST_LOGS=1 prints the process logs of passing tests too.
        if (failed is not None and failed.failed) or os.environ.get("TIDE_TEST_LOGS"):
            print(c.logs(400))
        c.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# ---------------------------------------------------------------- data helpers

def produce(broker: Broker, topic: str, values: list[bytes], *, acks: int = -1,
            partition: int = 0, timeout_ms: int = 5000) -> pb.ProducePartitionResponse:
    batch = encode_batch([(None, v) for v in values])
    resp = broker.stub.Produce(pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
        pb.ProducePartitionData(topic=topic, partition=partition, records=batch)]),
        timeout=timeout_ms / 1000 + 10)
    return resp.partitions[0] if resp.partitions else None


def fetch(broker: Broker, topic: str, offset: int, *, partition: int = 0, max_wait_ms: int = 0,
          max_bytes: int = 1 << 20) -> pb.FetchPartitionResponse:
    resp = broker.stub.Fetch(pb.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        partitions=[pb.FetchPartition(topic=topic, partition=partition, current_leader_epoch=-1,
                                      fetch_offset=offset, partition_max_bytes=max_bytes)]),
        timeout=max_wait_ms / 1000 + 10)
    return resp.partitions[0]


def consume_all(broker: Broker, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every record from offset 0, as (offset, value), once all of them are committed.

    Call it when nothing is being produced: it first waits until the leader's
    HW reaches its LEO (a new leader's HW catches up only after its followers
    fetched in its epoch).
    """
    wait_for(lambda: (lambda r: r.high_watermark == r.log_end_offset)(
        broker.replica(topic, partition)), message=f"{topic}-{partition} fully committed")
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        p = fetch(broker, topic, offset, partition=partition)
        assert p.error_code == pb.NONE, pb.ErrorCode.Name(p.error_code)
        if not p.records:
            return out
        for r in decode_records(p.records):
            if r.offset >= offset:
                out.append((r.offset, r.value))
        offset = out[-1][0] + 1 if out else offset
        if offset >= p.high_watermark:
            return out
