"""The transaction coordinator's shell against a fake replica manager and a fake
``TxnMarkerSender``: writes with acks=all before answers, markers then CompleteCommit,
a new leader finishing a PrepareCommit; and the group coordinator's loader holding
TxnOffsetCommit offsets until the marker it meets in the log."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from test_group_coordinator import FakeLog, FakePartition
from test_group_coordinator import FakeReplicaManager as FakeOffsetsReplicaManager
from test_group_coordinator import make_coordinator as make_group_coordinator

from tidewater.broker.group import records as group_records
from tidewater.broker.group import service as group_service
from tidewater.broker.group.coordinator import OFFSETS_TOPIC, write_batch
from tidewater.broker.group.coordinator import partition_for as group_partition_for
from tidewater.broker.group.state import Write as GroupWrite
from tidewater.broker.storage.topics import TRANSACTION_STATE_TOPIC, TopicPartition
from tidewater.broker.txn import markers
from tidewater.broker.txn.coordinator import TransactionCoordinator
from tidewater.broker.txn.markers import TxnMarker
from tidewater.broker.txn.state import CodeAnswer, TxnState
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import CONTROL_MASK, TRANSACTIONAL_MASK, set_producer_fields
from tidewater.proto.records import encode_batch
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(30)
PARTITIONS = 2


class FakeReplicaManager(FakeOffsetsReplicaManager):
    def __init__(self) -> None:
        super().__init__()
        self.partitions = {TopicPartition(TRANSACTION_STATE_TOPIC, i): FakePartition()
                           for i in range(PARTITIONS)}


class FakeMetadata:
    def partition_state(self, topic: str, partition: int) -> pb.PartitionState | None:
        if topic == TRANSACTION_STATE_TOPIC and partition < PARTITIONS:
            return pb.PartitionState(topic=topic, partition=partition, leader=1)
        if topic == "t":
            return pb.PartitionState(topic=topic, partition=partition, leader=2)
        return None

    def topics(self) -> list[str]:
        return [TRANSACTION_STATE_TOPIC, "t"]


class RecordingSender:
    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[int, TxnMarker]] = []
        self.fail_first = fail_first

    async def write_markers(self, leader_broker_id: int, markers: Sequence[TxnMarker]
                            ) -> list[dict[tuple[str, int], pb.ErrorCode]]:
        self.calls += [(leader_broker_id, m) for m in markers]
        if self.fail_first > 0:
            self.fail_first -= 1
            raise ConnectionError("leader unreachable")
        return [{tp: pb.NONE for tp in m.partitions} for m in markers]


def make(rm: FakeReplicaManager, sender: RecordingSender) -> TransactionCoordinator:
    config = SimpleNamespace(transaction_max_timeout_ms=60_000,
                             transactional_id_expiration_ms=10**9,
                             transaction_state_log_num_partitions=PARTITIONS,
                             transaction_abort_timed_out_transaction_cleanup_interval_ms=10)
    ids = iter(range(500, 600))

    async def next_producer_id() -> int:
        return next(ids)
    return TransactionCoordinator(
        replica_manager=rm, metadata_cache=FakeMetadata(), controller=None,  # type: ignore[arg-type]
        config=config, supervisor=TaskSupervisor(on_fatal=lambda error: None),  # type: ignore[arg-type]
        marker_sender=sender, next_producer_id=next_producer_id)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(markers, "MARKER_RETRY_BACKOFF_MS", 1)


async def settle(condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.002)
    pytest.fail(f"never: {what}")


async def begin_and_commit(coordinator: TransactionCoordinator) -> None:
    answer = await coordinator.init_producer_id("tx", 10_000, -1, -1)
    assert (answer.error_code, answer.producer_epoch) == (pb.NONE, 0)
    added = await coordinator.request("tx", lambda state, token, now_ms: state.add_partitions(
        token, now_ms, transactional_id="tx", producer_id=answer.producer_id,
        producer_epoch=0, partitions=[("t", 0), ("t", 1)]))
    assert added == CodeAnswer(pb.NONE)
    ended = await coordinator.request("tx", lambda state, token, now_ms: state.end_txn(
        token, now_ms, transactional_id="tx", producer_id=answer.producer_id,
        producer_epoch=0, committed=True))
    assert ended == CodeAnswer(pb.NONE)


async def test_a_commit_is_written_marked_then_completed():
    rm, sender = FakeReplicaManager(), RecordingSender(fail_first=2)
    coordinator = make(rm, sender)
    await coordinator.scan()
    await begin_and_commit(coordinator)
    await settle(lambda: coordinator.describe("tx").state == TxnState.COMPLETE_COMMIT,
                 "CompleteCommit")
    assert len(rm.appended) == 4  # Empty, Ongoing, PrepareCommit, CompleteCommit
    assert len(sender.calls) == 3  # two failures retried
    leader, marker = sender.calls[-1]
    assert leader == 2 and marker.committed and marker.partitions == (("t", 0), ("t", 1))
    await coordinator.stop()


async def test_a_new_leader_finishes_a_prepared_commit():
    rm, silent = FakeReplicaManager(), RecordingSender(fail_first=10**6)
    old = make(rm, silent)
    await old.scan()
    await begin_and_commit(old)
    await asyncio.sleep(0.01)
    assert old.describe("tx").state == TxnState.PREPARE_COMMIT  # no marker written
    await old.stop()
    index = next(tp.partition for tp, p in rm.partitions.items() if p.log.log_end_offset)
    rm.partitions[TopicPartition(TRANSACTION_STATE_TOPIC, index)] = FakePartition(
        rm.partitions[TopicPartition(TRANSACTION_STATE_TOPIC, index)].log, leader_epoch=4)
    sender = RecordingSender()
    successor = make(rm, sender)
    await successor.scan()
    await settle(lambda: successor.describe("tx").state == TxnState.COMPLETE_COMMIT,
                 "CompleteCommit by the successor")
    assert [m.coordinator_epoch for _, m in sender.calls] == [4]
    await successor.stop()


def control_batch(producer_id: int, committed: bool) -> bytes:
    built = bytearray(encode_batch([(b"\x00\x00\x00" + bytes([committed]),
                                     b"\x00\x00\x00\x00\x00\x00")], producer_id=producer_id,
                                   producer_epoch=0))
    built[21:23] = (CONTROL_MASK | TRANSACTIONAL_MASK).to_bytes(2, "big")
    set_producer_fields(built, producer_id, 0, -1)
    return bytes(built)


async def test_the_group_loader_holds_transactional_offsets_until_their_marker():
    rm = FakeOffsetsReplicaManager()
    index = group_partition_for("g", 2)
    log: FakeLog = rm.partitions[(OFFSETS_TOPIC, index)].log

    def offsets(producer_id: int, offset: int) -> bytes:
        return write_batch(GroupWrite(0, (group_records.OffsetCommitRecord(
            "g", "t", 0, group_records.OffsetCommitValue(offset, -1, "", 1)),),
            producer=(producer_id, 0)))
    log.append(offsets(7, 70))
    log.append(offsets(8, 80))
    log.append(control_batch(8, committed=False))
    loaded = make_group_coordinator(rm)
    await loaded.scan()
    assert group_service.fetch_offsets(loaded, "g", [("t", 0)])[1][("t", 0)] is None
    log.append(control_batch(7, committed=True))
    reloaded = make_group_coordinator(rm)
    await reloaded.scan()
    assert group_service.fetch_offsets(reloaded, "g", [("t", 0)])[1][("t", 0)].offset == 70
    # at run time the marker's writer tells the coordinator instead
    loaded.complete_transaction(index, 7, True)
    assert group_service.fetch_offsets(loaded, "g", [("t", 0)])[1][("t", 0)].offset == 70


async def test_the_topic_is_created_as_the_broker_not_as_the_client_that_asked():
    """The creation task copies the context of the FindCoordinator that spawned it; the
    forwarded client principal must not go with it, or the controller would check that
    client's rights (CREATE on the cluster) for the broker's own internal topic."""
    from tidewater.proto.forwarded_principal import FORWARDED
    seen: list[object] = []

    class RecordingController:
        async def CreateTopics(self, request, context):
            seen.append(FORWARDED.get())
            return pb.CreateTopicsResponse(topics=[pb.CreateTopicResult(
                name=request.topics[0].name, error_code=pb.NONE)])

    class NoTopicYet(FakeMetadata):
        def metadata_response(self, topics, listener):
            return pb.MetadataResponse(brokers=[pb.BrokerEndpoint(broker_id=1)])

    coordinator = make(FakeReplicaManager(), RecordingSender())
    coordinator.metadata_cache = NoTopicYet()  # type: ignore[assignment]
    coordinator.controller = RecordingController()  # type: ignore[assignment]
    coordinator.config.transaction_state_log_replication_factor = 3
    coordinator.config.transaction_state_log_min_isr = 2
    coordinator.config.transaction_state_log_segment_bytes = 1 << 20
    FORWARDED.set(("User:alice", "10.0.0.7"))
    await coordinator._create_topic()
    assert seen == [None]


class HeldAcksReplicaManager(FakeReplicaManager):
    """Appends at once but holds each acks=all wait until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list = []

    def produce_watch(self, request, response, waits, done):
        self.held.append(lambda: done(response))
        return lambda: None

    def release(self) -> None:
        for settle_one in self.held:
            settle_one()
        self.held.clear()


async def test_a_write_in_flight_when_leadership_is_lost_is_answered_once_and_not_fatal():
    """A shard dropped (another broker leads now) answers its waiting requests at once
    (abandon); the append still in flight finishes later and must not report its write
    to the abandoned state a second time: that was an InvariantViolation that stopped
    the broker (seen killing a broker in the EOS e2e test)."""
    rm, sender = HeldAcksReplicaManager(), RecordingSender()
    coordinator = make(rm, sender)
    await coordinator.scan()
    pending = asyncio.ensure_future(coordinator.init_producer_id("tx", 10_000, -1, -1))
    await settle(lambda: rm.held, "the InitProducerId write waiting for the ISR")
    for partition in rm.partitions.values():
        partition.is_leader = False  # moved away while the write waits
    await coordinator.scan()
    answer = await pending
    assert answer.error_code == pb.NOT_COORDINATOR
    rm.release()  # the old append's outcome arrives after the drop
    for _ in range(20):
        await asyncio.sleep(0)
    assert coordinator.supervisor.failure is None
    await coordinator.stop()
