"""The quorum shell in this process: a one-voter quorum on a real gRPC port. Requests from
peers that are not configured, forged, misrouted, malformed or oversized are refused with
an error code; a failed Raft write stops the node without acting on it."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tidewater.controller.quorum import codec
from tidewater.controller.quorum.__main__ import EXIT_RAFT_NOT_DURABLE, exit_code_for
from tidewater.controller.quorum.config import Endpoint, QuorumConfig
from tidewater.controller.quorum.shell import QuorumShell, QuorumStoppedError
from tidewater.controller.quorum.transport import BATCH_BYTES_MAX, PeerSender
from tidewater.controller.raft import RaftConfig, VoterKey
from tidewater.controller.raft import messages as m
from tidewater.controller.raft.storage import RaftStorage
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import KafkaStorageError

pytestmark = pytest.mark.timeout(60)

LEADER_DIRECTORY_ID = "11" * 16
OBSERVER_DIRECTORY_ID = "22" * 16
OBSERVER = VoterKey(2, OBSERVER_DIRECTORY_ID)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Harness:
    def __init__(self, shell: QuorumShell, stub: pb_grpc.ControllerQuorumStub):
        self.shell = shell
        self.stub = stub
        self.fatal: list[BaseException] = []

    async def send(self, *messages: m.Message | bytes, source_id: int = 2,
                   destination_id: int = 1) -> pb.RaftMessageAck:
        encoded = [x if isinstance(x, bytes) else codec.encode(x) for x in messages]
        ack: pb.RaftMessageAck = await self.stub.RaftMessages(pb.RaftMessageBatch(
            source_id=source_id, destination_id=destination_id, messages=encoded), timeout=10)
        return ack


async def start(tmp_path: Path, *, observer_host: str = "127.0.0.1") -> tuple[Harness,
                                                                             grpc.aio.Channel]:
    RaftStorage.format(tmp_path, 1, frozenset({VoterKey(1, LEADER_DIRECTORY_ID)}),
                       directory_id=LEADER_DIRECTORY_ID)
    port = free_port()
    config = QuorumConfig(
        node_id=1, data_dir=tmp_path, voters={1: Endpoint("127.0.0.1", port)},
        observers={2: Endpoint(observer_host, free_port())},
        raft=RaftConfig(election_timeout_ms=50, fetch_timeout_ms=500), tick_interval_ms=10)
    fatal: list[BaseException] = []
    shell = QuorumShell(config, on_fatal=fatal.append)
    await shell.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    harness = Harness(shell, pb_grpc.ControllerQuorumStub(channel))
    harness.fatal = fatal
    async with asyncio.timeout(10):  # a one-voter quorum elects itself after one timeout
        while not shell.node.is_leader:
            await asyncio.sleep(0.01)
    return harness, channel


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h, channel = await start(tmp_path)
    try:
        yield h
    finally:
        await channel.close()
        await h.shell.stop()


def fetch_from(source: VoterKey, destination: int = 1, epoch: int = 1) -> m.FetchRequest:
    return m.FetchRequest(source, destination, epoch, 0, 0, 1)


async def test_proposals_commit_and_read_back(harness: Harness) -> None:
    answer = await harness.stub.QuorumPropose(pb.QuorumProposeRequest(records=[b"a", b"b"]))
    assert answer.error_code == pb.NONE and answer.first_offset == 1  # 0: LEADER_CHANGE
    read = await harness.stub.QuorumRead(pb.QuorumReadRequest())
    assert [(r.offset, r.data) for r in read.records] == [(1, b"a"), (2, b"b")]
    described = await harness.stub.DescribeQuorum(pb.DescribeQuorumRequest())
    assert (described.role, described.leader_id, described.high_watermark) == ("leader", 1, 3)


async def test_a_configured_observer_is_served(harness: Harness) -> None:
    ack = await harness.send(fetch_from(OBSERVER))
    assert ack.error_code == pb.NONE, ack.error_message
    described = await harness.stub.DescribeQuorum(pb.DescribeQuorumRequest())
    observers = [r for r in described.replicas if not r.is_voter]
    assert [(r.replica.id, r.replica.directory_id) for r in observers] == [
        (2, OBSERVER_DIRECTORY_ID)]


async def test_unknown_peer_is_refused(harness: Harness) -> None:
    stranger = VoterKey(9, "99" * 16)
    ack = await harness.send(fetch_from(stranger), source_id=9)
    assert ack.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    assert "not a configured voter or observer" in ack.error_message
    # and nothing of it reached the core: no replica 9 in the leader's progress
    described = await harness.stub.DescribeQuorum(pb.DescribeQuorumRequest())
    assert 9 not in [r.replica.id for r in described.replicas]


async def test_forged_source_is_refused(harness: Harness) -> None:
    # the batch says node 2 (allowed), the message inside claims to come from node 1
    ack = await harness.send(fetch_from(VoterKey(1, LEADER_DIRECTORY_ID)))
    assert ack.error_code == pb.INVALID_REQUEST and "in a batch from node 2" in ack.error_message
    # a vote request for us "from" the leader itself, forged by an observer
    vote = m.VoteRequest(VoterKey(3, "33" * 16), 1, LEADER_DIRECTORY_ID, 99, 99, 99, False)
    ack = await harness.send(vote)
    assert ack.error_code == pb.INVALID_REQUEST
    assert harness.shell.node.epoch == 1  # the forged epoch 99 never reached the core


async def test_misrouted_batches_and_messages_are_refused(harness: Harness) -> None:
    ack = await harness.send(fetch_from(OBSERVER), destination_id=5)
    assert ack.error_code == pb.INVALID_REQUEST and "for node 5" in ack.error_message
    ack = await harness.send(fetch_from(OBSERVER, destination=7))
    assert ack.error_code == pb.INVALID_REQUEST


async def test_malformed_messages_are_refused(harness: Harness) -> None:
    ack = await harness.send(b"\xff not json")
    assert ack.error_code == pb.INVALID_REQUEST and "not JSON" in ack.error_message
    ack = await harness.send(b'{"type": "FetchRequest", "fields": {}}')
    assert ack.error_code == pb.INVALID_REQUEST


async def test_oversized_requests_are_refused(harness: Harness) -> None:
    many = [fetch_from(OBSERVER)] * 257
    ack = await harness.send(*many)
    assert ack.error_code == pb.MESSAGE_TOO_LARGE
    ack = await harness.send(b" " * (codec.ENCODED_BYTES_MAX + 1))
    assert ack.error_code == pb.MESSAGE_TOO_LARGE
    # past the whole request's limit gRPC itself refuses it
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await harness.send(*[b" " * (6 * 1024 * 1024)] * 3)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert harness.shell.failure is None  # refusing is no failure of ours


async def test_peer_from_another_host_is_refused(tmp_path: Path) -> None:
    h, channel = await start(tmp_path, observer_host="127.0.0.2")
    try:
        ack = await h.send(fetch_from(OBSERVER))
        assert ack.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
        assert "configured at 127.0.0.2" in ack.error_message
    finally:
        await channel.close()
        await h.shell.stop()


async def test_failed_write_stops_the_node_before_acting(harness: Harness) -> None:
    shell = harness.shell
    storage = shell.storage

    def disk_full(entries: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    storage._append = disk_full  # type: ignore[method-assign]
    log_end_before = storage.log_end_offset
    answer = await harness.stub.QuorumPropose(pb.QuorumProposeRequest(records=[b"lost"]))
    assert answer.error_code == pb.KAFKA_STORAGE_ERROR
    assert isinstance(shell.failure, KafkaStorageError)
    assert harness.fatal == [shell.failure]  # the process is told to stop
    assert exit_code_for(shell.failure) == EXIT_RAFT_NOT_DURABLE
    # never advanced, never applied
    assert shell.records.read(0, 100) == []
    assert storage.log_end_offset == log_end_before
    # and it takes nothing more
    with pytest.raises(QuorumStoppedError):
        await shell.propose([b"more"])
    answer = await harness.stub.QuorumPropose(pb.QuorumProposeRequest(records=[b"more"]))
    assert answer.error_code == pb.NOT_CONTROLLER and answer.leader_id == -1


async def test_sender_batches_stay_under_the_request_limit() -> None:
    sender = PeerSender(1, 2, Endpoint("127.0.0.1", free_port()), queue_max=16, batch_max=64,
                        request_timeout_ms=500)
    batches: list[list[bytes]] = []

    class RecordingStub:
        async def RaftMessages(self, request: pb.RaftMessageBatch,
                               timeout: float) -> pb.RaftMessageAck:
            batches.append(list(request.messages))
            return pb.RaftMessageAck()

    sender._stub = RecordingStub()  # type: ignore[assignment]
    big = m.FetchResponse(VoterKey(1, LEADER_DIRECTORY_ID), 2, 1, 1, 0, m.FetchError.NONE,
                          entries=(m.Entry(0, 1, m.EntryKind.DATA, b"x" * (5 * 1024 * 1024)),))
    small = fetch_from(OBSERVER)
    sent = [big, small, big, big, small]
    for message in sent:
        sender.send(message)
    task = asyncio.get_running_loop().create_task(sender.run())
    try:
        async with asyncio.timeout(30):
            while sum(map(len, batches)) < len(sent):
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sender.close()
    assert [codec.decode(x) for batch in batches for x in batch] == sent  # all, in order
    assert len(batches) > 1
    assert all(sum(map(len, batch)) <= BATCH_BYTES_MAX for batch in batches)
