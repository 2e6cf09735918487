"""The group coordinator's shell (broker/group/coordinator.py) against a fake replica
manager: loading a partition on leadership, NOT_COORDINATOR / LOAD_IN_PROGRESS, writes
through the produce path with acks=all, and injected write failures."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from tidewater.broker.group import records, service
from tidewater.broker.group.coordinator import (
    OFFSETS_TOPIC,
    CoordinatorError,
    GroupCoordinator,
    partition_for,
)
from tidewater.broker.storage.log import ReadResult
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.records import decode_records, encode_batch
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(30)
PARTITIONS = 2
GROUP = "g"
INDEX = partition_for(GROUP, PARTITIONS)


@dataclass
class FakeLog:
    data: bytes = b""
    log_start_offset: int = 0
    log_end_offset: int = 0

    def append(self, batch: bytes) -> None:
        count = len(list(decode_records(batch)))
        from tidewater.proto.batch import set_base_offset_and_epoch
        buf = bytearray(batch)
        set_base_offset_and_epoch(buf, 0, self.log_end_offset, 0)
        self.data += bytes(buf)
        self.log_end_offset += count

    def read(self, offset, max_bytes, max_offset=None):
        return ReadResult(self.data if offset == 0 else b"", 0, self.log_end_offset)


@dataclass
class FakePartition:
    log: FakeLog = field(default_factory=FakeLog)
    is_leader: bool = True
    leader_epoch: int = 0


class FakeReplicaManager:
    def __init__(self):
        self.partitions = {TopicPartition(OFFSETS_TOPIC, i): FakePartition()
                           for i in range(PARTITIONS)}
        self.fail_with = pb.NONE  # the next appends' outcome
        self.appended: list[bytes] = []

    async def produce_append(self, request, *, internal_topics_allowed=False):
        assert internal_topics_allowed and request.acks == -1
        [data] = request.partitions
        response = pb.ProduceResponse()
        result = response.partitions.add(topic=data.topic, partition=data.partition,
                                         error_code=self.fail_with)
        if self.fail_with == pb.NONE:
            self.partitions[(data.topic, data.partition)].log.append(data.records)
            self.appended.append(data.records)
        return response, [(result, None)]

    def produce_watch(self, request, response, waits, done):
        asyncio.get_running_loop().call_soon(done, response)  # the ISR caught up
        return lambda: None


class FakeMetadata:
    offsets_leader = 1  # this broker (config.broker_id); None: the topic is not known yet

    def partition_state(self, topic, partition):
        if topic == OFFSETS_TOPIC and partition < PARTITIONS:
            if self.offsets_leader is None:
                return None
            return pb.PartitionState(topic=topic, partition=partition,
                                     leader=self.offsets_leader)
        if topic == "t":
            return pb.PartitionState(topic=topic, partition=partition, leader=1)
        return None


def make_coordinator(rm: FakeReplicaManager) -> GroupCoordinator:
    config = SimpleNamespace(broker_id=1, group_min_session_timeout_ms=1000,
                             group_max_session_timeout_ms=60000,
                             group_initial_rebalance_delay_ms=0,
                             offsets_topic_num_partitions=PARTITIONS,
                             offsets_topic_replication_factor=1,
                             offsets_commit_timeout_ms=1000, offsets_retention_minutes=60,
                             offsets_retention_check_interval_ms=1000)
    # A task that dies is logged at CRITICAL and kept in ``supervisor.failure``.
    supervisor = TaskSupervisor(on_fatal=lambda error: None)
    return GroupCoordinator(replica_manager=rm, metadata_cache=FakeMetadata(), controller=None,
                            config=config, supervisor=supervisor)


def commit(coordinator, offset: int):
    return service.commit(coordinator, coordinator.metadata_cache, group_id=GROUP,
                                generation_id=-1, member_id="",
                                offsets={("t", 0): (offset, 0, "")})


def committed(coordinator) -> int | None:
    code, found, _ = service.fetch_offsets(coordinator, GROUP, [("t", 0)])
    assert code == pb.NONE
    return found[("t", 0)].offset if found[("t", 0)] else None


async def test_commits_are_written_then_answered_and_a_new_leader_loads_them():
    rm = FakeReplicaManager()
    coordinator = make_coordinator(rm)
    with pytest.raises(CoordinatorError) as e:
        coordinator.shard_for(GROUP)
    assert e.value.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
    await coordinator.scan()
    assert await commit(coordinator, 7) == {("t", 0): pb.NONE}
    assert committed(coordinator) == 7
    [batch] = rm.appended
    [record] = decode_records(batch)
    assert records.decode(record.key, record.value).value.offset == 7

    # Leadership moves: the old coordinator stops answering ...
    rm.partitions[(OFFSETS_TOPIC, INDEX)].is_leader = False
    coordinator.metadata_cache.offsets_leader = 2
    await coordinator.scan()
    with pytest.raises(CoordinatorError) as e:
        coordinator.shard_for(GROUP)
    assert e.value.error_code == pb.NOT_COORDINATOR
    # ... and a new one (same log: the follower had the records) loads the commit.
    successor = make_coordinator(rm)
    rm.partitions[TopicPartition(OFFSETS_TOPIC, INDEX)] = FakePartition(
        rm.partitions[(OFFSETS_TOPIC, INDEX)].log, is_leader=True, leader_epoch=1)
    await successor.scan()
    assert committed(successor) == 7


@pytest.mark.parametrize("offsets_leader, hosted, code", [
    (None, False, pb.COORDINATOR_LOAD_IN_PROGRESS),  # the topic not known here yet
    (1, False, pb.COORDINATOR_LOAD_IN_PROGRESS),  # led here, its LeaderAndIsr not applied
    (1, True, pb.COORDINATOR_LOAD_IN_PROGRESS),  # ... while a follower here
    (2, False, pb.NOT_COORDINATOR),
    (2, True, pb.NOT_COORDINATOR),
])
def test_a_client_sent_here_ahead_of_the_leadership_is_told_to_retry(offsets_leader, hosted,
                                                                      code):
    # Another broker's newer metadata names this one while its LeaderAndIsr, or the new
    # topic, is still on its way: librdkafka's committed() fails outright on
    # NOT_COORDINATOR (it looks the coordinator up, and is sent here again), and
    # retries COORDINATOR_LOAD_IN_PROGRESS.
    rm = FakeReplicaManager()
    if hosted:
        rm.partitions[(OFFSETS_TOPIC, INDEX)].is_leader = False
    else:
        del rm.partitions[(OFFSETS_TOPIC, INDEX)]
    coordinator = make_coordinator(rm)
    coordinator.metadata_cache.offsets_leader = offsets_leader
    with pytest.raises(CoordinatorError) as e:
        coordinator.shard_for(GROUP)
    assert e.value.error_code == code


@pytest.mark.parametrize("failure,answer", [
    (pb.NOT_ENOUGH_REPLICAS, pb.COORDINATOR_NOT_AVAILABLE),
    (pb.NOT_LEADER_OR_FOLLOWER, pb.NOT_COORDINATOR),
    (pb.REQUEST_TIMED_OUT, pb.COORDINATOR_NOT_AVAILABLE),
])
async def test_a_failed_write_answers_a_coordinator_error_and_keeps_the_old_offset(failure,
                                                                                  answer):
    rm = FakeReplicaManager()
    coordinator = make_coordinator(rm)
    await coordinator.scan()
    assert await commit(coordinator, 3) == {("t", 0): pb.NONE}
    rm.fail_with = failure
    assert await commit(coordinator, 9) == {("t", 0): answer}
    assert committed(coordinator) == 3
    rm.fail_with = pb.NONE
    reloaded = make_coordinator(rm)
    await reloaded.scan()
    assert committed(reloaded) == 3  # nothing of the failed write reached the log


async def test_a_write_after_the_leader_epoch_moved_is_not_appended():
    rm = FakeReplicaManager()
    coordinator = make_coordinator(rm)
    await coordinator.scan()
    pending = commit(coordinator, 4)  # accepted; its write is not appended yet
    rm.partitions[(OFFSETS_TOPIC, INDEX)].leader_epoch = 5  # a newer leadership meanwhile
    assert await pending == {("t", 0): pb.NOT_COORDINATOR}
    assert rm.appended == []
    assert committed_or_loading(coordinator) == pb.COORDINATOR_LOAD_IN_PROGRESS


def committed_or_loading(coordinator) -> int:
    return service.fetch_offsets(coordinator, GROUP, [("t", 0)])[0]


async def test_commits_to_unknown_topics_are_refused():
    rm = FakeReplicaManager()
    coordinator = make_coordinator(rm)
    await coordinator.scan()
    errors = await service.commit(coordinator, coordinator.metadata_cache, group_id=GROUP,
                                  generation_id=-1, member_id="",
                                  offsets={("nope", 0): (1, 0, "")})
    assert errors == {("nope", 0): pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert rm.appended == []


async def test_a_damaged_record_is_skipped_on_load():
    rm = FakeReplicaManager()
    log = rm.partitions[(OFFSETS_TOPIC, INDEX)].log
    good = records.OffsetCommitRecord(GROUP, "t", 0, records.OffsetCommitValue(5, 0, "", 1))
    log.append(encode_batch([(b"\x00\x09garbage", b"x"),
                             (records.encode_key(good), records.encode_value(good))]))
    coordinator = make_coordinator(rm)
    await coordinator.scan()
    assert committed(coordinator) == 5


async def test_a_load_that_fails_answers_load_in_progress_and_is_retried_later():
    rm = FakeReplicaManager()
    log = rm.partitions[TopicPartition(OFFSETS_TOPIC, INDEX)].log
    log.append(encode_batch([(b"k", b"v")]))
    broken = log.read

    def failing_read(*args, **kwargs):
        raise OSError("disk gone")
    log.read = failing_read
    coordinator = make_coordinator(rm)
    await coordinator.scan()
    await coordinator.scan()  # not retried at once
    with pytest.raises(CoordinatorError) as e:
        coordinator.shard_for(GROUP)
    assert e.value.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
    log.read = broken
    coordinator._load_retry_at.clear()  # the retry delay has passed
    await coordinator.scan()
    coordinator.shard_for(GROUP)  # loaded now


async def test_a_broken_invariant_in_a_group_write_stops_the_broker_unanswered():
    """Not answered as a failed write (UNKNOWN_SERVER_ERROR, then a coordinator error):
    the write's task dies and its supervisor stops the broker."""
    rm = FakeReplicaManager()
    coordinator = make_coordinator(rm)
    failures = []
    coordinator.supervisor.on_fatal = failures.append
    await coordinator.scan()

    async def broken(request, *, internal_topics_allowed=False):
        raise InvariantViolation("the log's end went back")
    rm.produce_append = broken
    answer = asyncio.ensure_future(commit(coordinator, 7))
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.01)
    assert [str(e) for e in failures] == ["the log's end went back"]
    await asyncio.sleep(0.05)
    assert not answer.done()
    answer.cancel()
    await coordinator.stop()
