"""A LeaderAndIsr's new leader epochs are written at once (ReadyCarrier.apply_all): every
partition's epoch is in its cache file before any partition's Ready is carried out, and a
failed write fails only its own partition, as one at a time did."""
from __future__ import annotations

import pytest

from tests.unit.test_broker_replica_manager import lai, make_manager
from tidewater.broker.replicas.ready_carrier import in_turn
from tidewater.broker.replication.replica_base import Role
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import KafkaStorageError

pytestmark = pytest.mark.timeout(60)

TPS = [TopicPartition("orders", p) for p in range(3)]


def leader_and_isr(leader_epoch: int) -> pb.LeaderAndIsrRequest:
    request = lai(leader=1, leader_epoch=leader_epoch, isr=(1,), replicas=(1,))
    item = request.partitions[0]
    del request.partitions[:]
    for tp in TPS:
        copy = request.partitions.add()
        copy.CopyFrom(item)
        copy.state.partition = tp.partition
    return request


async def test_new_epochs_are_all_written_before_any_ready_is_carried_out(tmp_path):
    rm, _ = make_manager(tmp_path)
    first = await rm.leader_and_isr(leader_and_isr(0))
    assert [p.error_code for p in first.partitions] == [pb.NONE] * 3
    events: list[str] = []
    for tp in TPS:
        cache = rm.partitions[tp].log.leader_epoch_cache
        assign = cache.assign

        def recorded(epoch, start, *, assign=assign, tp=tp):
            assign(epoch, start)
            events.append(f"assign {tp.partition}")
        cache.assign = recorded
    rm.carrier.note = lambda line: events.append("note")

    resp = await rm.leader_and_isr(leader_and_isr(1))

    assert [p.error_code for p in resp.partitions] == [pb.NONE] * 3
    assert sorted(events[:3]) == ["assign 0", "assign 1", "assign 2"]
    assert events[3:] == ["note"] * 3
    for tp in TPS:
        assert rm.partitions[tp].log.leader_epoch_cache.entries() == [(1, 0)]
        assert rm.partitions[tp].replica.role == Role.LEADER


async def test_a_failed_epoch_write_fails_its_partition_only(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(leader_and_isr(0))
    broken = rm.partitions[TPS[1]].log.leader_epoch_cache

    def refuse(epoch, start):
        raise KafkaStorageError("disk gone", path="leader-epoch-checkpoint")
    broken.assign = refuse

    resp = await rm.leader_and_isr(leader_and_isr(1))

    assert [p.error_code for p in resp.partitions] == [
        pb.NONE, pb.KAFKA_STORAGE_ERROR, pb.NONE]
    assert rm.partitions[TPS[1]].replica.role != Role.LEADER
    assert rm.partitions[TPS[1]].log.leader_epoch_cache.entries() == [(0, 0)]
    for tp in (TPS[0], TPS[2]):
        assert rm.partitions[tp].replica.role == Role.LEADER
        assert rm.partitions[tp].log.leader_epoch_cache.entries() == [(1, 0)]


async def test_a_partition_named_twice_takes_both_states_in_order(tmp_path):
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(leader_and_isr(0))
    request = leader_and_isr(1)
    again = request.partitions.add()
    again.CopyFrom(request.partitions[0])
    again.state.leader_epoch = 2

    resp = await rm.leader_and_isr(request)

    assert [p.error_code for p in resp.partitions] == [pb.NONE] * 4
    assert rm.partitions[TPS[0]].log.leader_epoch_cache.entries() == [(2, 0)]
    assert rm.partitions[TPS[0]].replica.leader_epoch == 2


async def test_each_new_epoch_is_written_as_soon_as_its_partition_decided(tmp_path):
    """Issue 30: a restart's epoch writes overlap the later partitions' decisions, instead
    of starting once all 60 decided; the Readies' rest still waits for every write."""
    rm, _ = make_manager(tmp_path)
    await rm.leader_and_isr(leader_and_isr(0))
    rm.carrier.run_all = in_turn  # the order is then one: each write where it starts
    events: list[str] = []
    for tp in TPS:
        partition = rm.partitions[tp]
        cache, replica = partition.log.leader_epoch_cache, partition.replica

        def recorded(epoch, start, *, assign=cache.assign, tp=tp):
            assign(epoch, start)
            events.append(f"assign {tp.partition}")

        def decided(state, now_ms, *, decide=replica.on_leader_and_isr, tp=tp):
            events.append(f"decide {tp.partition}")
            return decide(state, now_ms)
        cache.assign = recorded
        replica.on_leader_and_isr = decided
    rm.carrier.note = lambda line: events.append("note")

    resp = await rm.leader_and_isr(leader_and_isr(1))

    assert [p.error_code for p in resp.partitions] == [pb.NONE] * 3
    assert events == ["decide 0", "assign 0", "decide 1", "assign 1", "decide 2", "assign 2",
                      "note", "note", "note"]
