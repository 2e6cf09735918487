"""Three real controller quorum processes on 127.0.0.1 (``python -m
tidewater.controller.quorum``): election, replication in one order, failover after
SIGKILL, no majority, a cold restart of all, and a wiped directory.

Waits are for conditions, each bounded by a generous deadline (the machine is shared):
a test fails only if the condition never holds in that time, never because it took
longer than some typical duration.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import is_retriable

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 40.0  # the bound on any one wait: far above an election (~1-3 s) on a busy machine
FETCH_TIMEOUT_MS = 1000
ELECTION_TIMEOUT_MS = 300
T = TypeVar("T")
Record = tuple[int, int, bytes]  # offset, epoch, data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


class QuorumCluster:
    def __init__(self, root: Path, *, snapshot_interval_entries: int = 1000):
        self.root = root
        self.ids = (1, 2, 3)
        self.ports = {i: free_port() for i in self.ids}
        self.directory_ids = {i: uuid.uuid4().hex for i in self.ids}
        self.snapshot_interval_entries = snapshot_interval_entries
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.channels = {i: grpc.insecure_channel(f"127.0.0.1:{self.ports[i]}") for i in self.ids}
        self.stubs = {i: pb_grpc.ControllerQuorumStub(c) for i, c in self.channels.items()}
        for i in self.ids:
            self.format(i)

    def data_dir(self, node_id: int) -> Path:
        return self.root / f"node-{node_id}"

    def _quorum(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidewater.controller.quorum", *args],
                              cwd=REPO, capture_output=True, text=True, timeout=60)

    def format(self, node_id: int, *, new_directory_id: bool = False) -> str:
        initial = ",".join(f"{i}@127.0.0.1:{self.ports[i]}:{self.directory_ids[i]}"
                           for i in self.ids)
        args = ["format", "--node-id", str(node_id), "--data-dir", str(self.data_dir(node_id)),
                "--initial-controllers", initial]
        if new_directory_id:
            args.append("--new-directory-id")
        result = self._quorum(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().rpartition(":")[2]  # "formatted D as ID:DIRID"

    def start(self, node_id: int) -> None:
        voters = ",".join(f"{i}@127.0.0.1:{self.ports[i]}" for i in self.ids)
        log_file = open(self.root / f"node-{node_id}.log", "ab")
        self.processes[node_id] = subprocess.Popen(
            [sys.executable, "-m", "tidewater.controller.quorum", "run",
             "--node-id", str(node_id), "--data-dir", str(self.data_dir(node_id)),
             "--voters", voters, "--fetch-timeout-ms", str(FETCH_TIMEOUT_MS),
             "--election-timeout-ms", str(ELECTION_TIMEOUT_MS),
             "--snapshot-interval-entries", str(self.snapshot_interval_entries)],
            cwd=REPO, stdout=log_file, stderr=log_file)
        log_file.close()
        wait_for(f"node {node_id} serves", lambda: self.describe(node_id))

    def kill(self, node_id: int) -> None:
        process = self.processes.pop(node_id)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def stop_all(self) -> None:
        for node_id in list(self.processes):
            process = self.processes.pop(node_id)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)
        for channel in self.channels.values():
            channel.close()

    def describe(self, node_id: int) -> pb.DescribeQuorumResponse | None:
        try:
            answer: pb.DescribeQuorumResponse = self.stubs[node_id].DescribeQuorum(
                pb.DescribeQuorumRequest(), timeout=2)
        except grpc.RpcError:
            return None
        return answer if answer.error_code == pb.NONE else None

    def leader(self, among: tuple[int, ...] | None = None, *, newer_than: int = 0) -> int:
        """The node that leads, once a live node says it leads an epoch past ``newer_than``."""
        def probe() -> int | None:
            for node_id in among or tuple(self.processes):
                described = self.describe(node_id)
                if described and described.role == "leader" and described.epoch > newer_than:
                    return node_id
            return None
        return wait_for(f"a leader among {among or tuple(self.processes)}", probe)

    def epoch(self, node_id: int) -> int:
        described = self.describe(node_id)
        assert described is not None
        return described.epoch

    def propose_once(self, node_id: int, records: list[bytes],
                     timeout_ms: int = 5000) -> pb.QuorumProposeResponse:
        answer: pb.QuorumProposeResponse = self.stubs[node_id].QuorumPropose(
            pb.QuorumProposeRequest(records=records, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 10)
        return answer

    def propose(self, records: list[bytes]) -> list[Record]:
        """Propose until committed, following NOT_CONTROLLER hints (as a broker will)."""
        def attempt() -> list[Record] | None:
            node_id = self.leader()
            try:
                answer = self.propose_once(node_id, records)
            except grpc.RpcError:
                return None
            if answer.error_code == pb.NONE:
                return [(answer.first_offset + i, answer.epoch, r) for i, r in enumerate(records)]
            assert is_retriable(answer.error_code), answer
            return None
        return wait_for(f"{records[:1]}... committed", attempt)

    def read(self, node_id: int) -> list[Record]:
        answer = self.stubs[node_id].QuorumRead(pb.QuorumReadRequest(), timeout=5)
        return [(r.offset, r.epoch, r.data) for r in answer.records]

    def wait_applied(self, node_id: int, expected: list[Record]) -> list[Record]:
        """Wait until ``node_id`` applied at least ``expected`` (up to its last offset:
        records the test did not see committed, such as a proposal that timed out
        without a majority and was committed later, may come before it); its records
        then."""
        last_offset = expected[-1][0] if expected else -1

        def probe() -> list[Record] | None:
            try:
                records = self.read(node_id)
            except grpc.RpcError:
                return None
            applied = records[-1][0] if records else -1
            return records if len(records) >= len(expected) and applied >= last_offset else None
        return wait_for(f"node {node_id} applies {len(expected)} records", probe)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[QuorumCluster]:
    cluster = QuorumCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def start_all(cluster: QuorumCluster) -> None:
    for node_id in cluster.ids:
        cluster.start(node_id)


def assert_prefix(committed: list[Record], applied: list[Record]) -> None:
    assert applied[:len(committed)] == committed


def test_election_and_records_applied_in_one_order_everywhere(cluster: QuorumCluster) -> None:
    start_all(cluster)
    leader = cluster.leader()
    followers = [i for i in cluster.ids if i != leader]
    # A follower refuses with a retriable NOT_CONTROLLER naming the leader.
    refused = cluster.propose_once(followers[0], [b"to a follower"])
    assert refused.error_code == pb.NOT_CONTROLLER and refused.leader_id == leader
    committed: list[Record] = []
    for batch in range(5):
        committed += cluster.propose([b"r%d-%d" % (batch, i) for i in range(4)])
    assert [data for _, _, data in committed] == [b"r%d-%d" % (b, i) for b in range(5)
                                                  for i in range(4)]
    views = {i: cluster.wait_applied(i, committed) for i in cluster.ids}
    for node_id, records in views.items():
        assert records == committed, f"node {node_id}"
    described = cluster.describe(leader)
    assert described is not None and described.leader_id == leader
    replicas = {r.replica.id: r for r in described.replicas}
    assert set(replicas) == set(cluster.ids) and all(r.is_voter for r in replicas.values())
    assert described.high_watermark >= committed[-1][0] + 1


def test_sigkill_of_the_leader_elects_another_and_loses_nothing(cluster: QuorumCluster) -> None:
    start_all(cluster)
    old_leader = cluster.leader()
    old_epoch = cluster.epoch(old_leader)
    committed = cluster.propose([b"before-%d" % i for i in range(10)])
    cluster.kill(old_leader)
    survivors = tuple(i for i in cluster.ids if i != old_leader)
    new_leader = cluster.leader(survivors, newer_than=old_epoch)
    assert new_leader != old_leader
    committed += cluster.propose([b"after-%d" % i for i in range(5)])
    for node_id in survivors:
        assert cluster.wait_applied(node_id, committed) == committed
    cluster.start(old_leader)  # comes back as a follower and catches up
    assert cluster.wait_applied(old_leader, committed) == committed


def test_no_majority_fails_clearly_then_recovers(cluster: QuorumCluster) -> None:
    start_all(cluster)
    leader = cluster.leader()
    committed = cluster.propose([b"one"])
    down = [i for i in cluster.ids if i != leader]
    for node_id in down:
        cluster.kill(node_id)
    # Without a majority nothing commits: each proposal answers a retriable error within
    # its own timeout (no hang), first REQUEST_TIMED_OUT on the old leader, then
    # NOT_CONTROLLER once it resigned (check-quorum).
    # (propose_once's gRPC deadline is the proposal's timeout + 10 s: a hang would raise
    # DEADLINE_EXCEEDED here instead of answering.)
    for attempt in range(3):
        answer = cluster.propose_once(leader, [b"no majority %d" % attempt], timeout_ms=1500)
        assert answer.error_code in (pb.REQUEST_TIMED_OUT, pb.NOT_CONTROLLER), answer
        assert is_retriable(answer.error_code)
    wait_for("the leader without a majority resigns", lambda: (
        d := cluster.describe(leader)) is not None and d.role != "leader" or None)
    answer = cluster.propose_once(leader, [b"refused"], timeout_ms=1500)
    assert answer.error_code == pb.NOT_CONTROLLER
    # A majority back: proposals succeed again.
    cluster.start(down[0])
    committed += cluster.propose([b"two"])
    alive = (leader, down[0])
    for node_id in alive:
        records = cluster.wait_applied(node_id, committed)
        assert_prefix(committed[:1], records)
        assert records[-1][2] == b"two"
        # what timed out may or may not have committed later: it is never applied twice
        # and never out of order
        assert [r[0] for r in records] == sorted({r[0] for r in records})
    assert records == cluster.read(alive[0]) == cluster.wait_applied(alive[1], records)


def test_all_three_sigkilled_and_restarted_keep_every_committed_record(
        cluster: QuorumCluster) -> None:
    start_all(cluster)
    committed = []
    for batch in range(4):
        committed += cluster.propose([b"c%d-%d" % (batch, i) for i in range(3)])
    for node_id in cluster.ids:
        cluster.kill(node_id)
    # On disk, read offline by `tide dump-log`: every node's log is a prefix of what was
    # committed, and a majority holds all of it.
    complete = 0
    for node_id in cluster.ids:
        dumped = subprocess.run(
            [sys.executable, "-m", "tidewater.tools", "dump-log", "--json", "--print-data",
             str(cluster.data_dir(node_id) / "raft.log")],
            cwd=REPO, capture_output=True, text=True, timeout=60)
        assert dumped.returncode == 0, dumped.stderr
        events = [json.loads(line) for line in dumped.stdout.splitlines()]
        on_disk = [(e["offset"], e["epoch"], e["record"].encode()) for e in events
                   if e["type"] == "raft_entry" and e["kind"] == "data"]
        assert on_disk == committed[:len(on_disk)], f"node {node_id}"
        complete += on_disk == committed
    assert complete >= 2
    start_all(cluster)
    cluster.leader()
    committed += cluster.propose([b"after restart"])
    for node_id in cluster.ids:
        assert cluster.wait_applied(node_id, committed) == committed


def test_wiped_directory_is_a_new_replica_and_catches_up_through_a_snapshot(
        tmp_path: Path) -> None:
    cluster = QuorumCluster(tmp_path, snapshot_interval_entries=8)
    try:
        start_all(cluster)
        leader = cluster.leader()
        wiped = next(i for i in cluster.ids if i != leader)
        other = next(i for i in cluster.ids if i not in (leader, wiped))
        committed = []
        for batch in range(6):
            committed += cluster.propose([b"w%d-%d" % (batch, i) for i in range(4)])
        described = cluster.describe(leader)
        assert described is not None and described.log_start_offset > 0  # a snapshot cut it
        old_key = (wiped, cluster.directory_ids[wiped])

        cluster.kill(wiped)
        shutil.rmtree(cluster.data_dir(wiped))
        new_directory_id = cluster.format(wiped, new_directory_id=True)
        assert new_directory_id != cluster.directory_ids[wiped]
        cluster.start(wiped)
        mine = cluster.describe(wiped)
        assert mine is not None and mine.local.directory_id == new_directory_id
        # It is not the voter it replaces: it catches up as an observer, through the
        # leader's snapshot (its log start is past 0), ...
        assert cluster.wait_applied(wiped, committed) == committed
        mine = cluster.describe(wiped)
        assert mine is not None and mine.log_start_offset > 0
        assert old_key in [(v.id, v.directory_id) for v in mine.voters]
        assert (wiped, new_directory_id) not in [(v.id, v.directory_id) for v in mine.voters]
        # ... and it cannot stand in for the old voter: with the other voter down, the
        # leader and the new incarnation are no majority, nothing commits.
        cluster.kill(other)
        answer = cluster.propose_once(leader, [b"unsafe"], timeout_ms=1500)
        assert answer.error_code in (pb.REQUEST_TIMED_OUT, pb.NOT_CONTROLLER), answer
        for node_id in (leader, wiped):
            assert b"unsafe" not in [data for _, _, data in cluster.read(node_id)]
        cluster.start(other)
        committed += cluster.propose([b"safe again"])

        # Replace the old voter by the new incarnation (KIP-853: remove, then add).
        def change(**voters: pb.QuorumVoter) -> pb.ChangeQuorumVotersResponse | None:
            node_id = cluster.leader()
            answer: pb.ChangeQuorumVotersResponse = cluster.stubs[node_id].ChangeQuorumVoters(
                pb.ChangeQuorumVotersRequest(timeout_ms=5000, **voters), timeout=20)
            if answer.error_code == pb.NONE:
                return answer
            assert is_retriable(answer.error_code), answer
            return None
        wait_for("the old voter removed", lambda: change(
            remove=pb.QuorumVoter(id=wiped, directory_id=cluster.directory_ids[wiped])))
        wait_for("the new incarnation added", lambda: change(
            add=pb.QuorumVoter(id=wiped, directory_id=new_directory_id)))
        leader = cluster.leader()
        described = cluster.describe(leader)
        assert described is not None
        assert sorted((v.id, v.directory_id) for v in described.voters) == sorted(
            [(i, cluster.directory_ids[i]) for i in cluster.ids if i != wiped]
            + [(wiped, new_directory_id)])
        committed += cluster.propose([b"with the new voter"])
        # "unsafe" timed out, but stayed in the leader's log: it may have committed once
        # the other voter was back. Every node applies the same records, in one order.
        reference = cluster.wait_applied(leader, committed)
        assert [r for r in reference if r[2] != b"unsafe"] == committed
        for node_id in cluster.ids:
            assert cluster.wait_applied(node_id, reference) == reference, f"node {node_id}"
    finally:
        cluster.stop_all()


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidewater.controller.quorum", "run", "--node-id", "1",
         "--data-dir", str(tmp_path), "--voters", "1@127.0.0.1"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ})
    assert result.returncode == 2 and "ID@HOST:PORT" in result.stderr


def test_a_failed_write_stops_the_process_with_exit_3_and_restart_recovers(
        tmp_path: Path) -> None:
    """A file size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so writes past it fail with
    EFBIG) plays a full disk under a one-voter quorum."""
    import resource

    port = free_port()
    directory_id = uuid.uuid4().hex
    data_dir = tmp_path / "node-1"
    quorum = [sys.executable, "-m", "tidewater.controller.quorum"]
    formatted = subprocess.run(
        [*quorum, "format", "--node-id", "1", "--data-dir", str(data_dir),
         "--initial-controllers", f"1@127.0.0.1:{port}:{directory_id}"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert formatted.returncode == 0, formatted.stderr
    run = [*quorum, "run", "--node-id", "1", "--data-dir", str(data_dir),
           "--voters", f"1@127.0.0.1:{port}", "--election-timeout-ms", "100"]
    file_bytes_max = 16 * 1024

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes_max, file_bytes_max))

    log_path = tmp_path / "node-1.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(run, cwd=REPO, stdout=log_file, stderr=log_file,
                                   preexec_fn=limit_file_size)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ControllerQuorumStub(channel)
    try:
        def leads() -> bool | None:
            try:
                described = stub.DescribeQuorum(pb.DescribeQuorumRequest(), timeout=2)
            except grpc.RpcError:
                return None
            return described.role == "leader" or None
        wait_for("the one voter leads", leads)
        committed: list[bytes] = []
        failed = None
        for n in range(2 * file_bytes_max // 1000):
            record = b"%04d" % n + b"x" * 996
            try:
                answer = stub.QuorumPropose(pb.QuorumProposeRequest(records=[record]), timeout=20)
            except grpc.RpcError as e:  # the process ended before it answered
                failed = e.code()
                break
            if answer.error_code != pb.NONE:
                failed = answer.error_code
                assert answer.error_code == pb.KAFKA_STORAGE_ERROR, answer
                break
            committed.append(record)
        assert failed is not None, "the file size limit never hit"
        assert process.wait(timeout=60) == 3
        assert 5 < len(committed) < 2 * file_bytes_max // 1000
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    # Without the limit the node recovers from its directory (a torn tail is cut) and has
    # every record it answered as committed, and none it refused.
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(run, cwd=REPO, stdout=log_file, stderr=log_file)
    try:
        wait_for("the one voter leads again", leads)
        read = stub.QuorumRead(pb.QuorumReadRequest(), timeout=5)
        assert [r.data for r in read.records] == committed
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        channel.close()
