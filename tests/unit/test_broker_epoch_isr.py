"""KIP-903: a follower fetch from a broker incarnation that is not the live registered one is
served but never adds the replica to the ISR."""

from __future__ import annotations

from tests.unit.test_broker_replica_manager import TP, lai, make_manager
from tidewater.broker.replication.leader_state import LeadershipState
from tidewater.proto import tidewater_pb2 as pb

T0 = 1_000_000


def test_ineligible_fetch_records_the_offset_but_proposes_no_expansion():
    s = LeadershipState(local_broker_id=1, replicas=(1, 2), isr=(1,), leader_epoch=0,
                             partition_epoch=0, high_watermark=5, log_end_offset=5,
                             epoch_start_offset=0, min_insync_replicas=1,
                             replica_lag_time_max_ms=1000, now_ms=T0)
    decision = s.on_follower_fetch(2, 5, T0 + 1, isr_eligible=False)
    assert decision.propose_isr is None and s.pending_isr is None
    assert s.followers[2].log_end_offset == 5
    assert s.on_follower_fetch(2, 5, T0 + 2).propose_isr == (1, 2)


def update_metadata(*brokers: tuple[int, int, bool, bool]) -> pb.UpdateMetadataRequest:
    """``brokers``: (broker_id, broker_epoch, fenced, in_controlled_shutdown)."""
    return pb.UpdateMetadataRequest(controller_id=0, controller_epoch=1, brokers=[
        pb.BrokerRegistration(broker_id=b, broker_epoch=e, fenced=f, in_controlled_shutdown=s,
                              listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=9)])
        for b, e, f, s in brokers])


def follower_fetch(broker_epoch: int) -> pb.FetchRequest:
    return pb.FetchRequest(replica_id=2, replica_broker_epoch=broker_epoch, max_wait_ms=0,
                           min_bytes=1, partitions=[pb.FetchPartition(
                               topic=TP.topic, partition=0, current_leader_epoch=0,
                               fetch_offset=0, last_fetched_epoch=-1)])


async def expansion_proposed(tmp_path, name: str, metadata, broker_epoch: int) -> bool:
    rm, _ = make_manager(tmp_path / name)
    try:
        await rm.leader_and_isr(lai(isr=(1,)))
        if metadata is not None:
            assert (await rm.update_metadata(metadata)).error_code == pb.NONE
        response = await rm.fetch(follower_fetch(broker_epoch))
        assert response.partitions[0].error_code == pb.NONE  # served either way
        return rm.partitions[TP].replica.leader.pending_isr is not None \
            or rm.partitions[TP].replica.leader_isr == (1, 2)
    finally:
        await rm.stop()


async def test_only_the_live_incarnation_can_join_the_isr(tmp_path):
    live = update_metadata((1, 3, False, False), (2, 7, False, False))
    assert await expansion_proposed(tmp_path, "current", live, 7)
    # -1 is not a wildcard: a fetch naming no incarnation vouches for none.
    assert not await expansion_proposed(tmp_path, "no-epoch", live, -1)
    assert not await expansion_proposed(tmp_path, "stale", live, 6)
    assert not await expansion_proposed(tmp_path, "absent", update_metadata((1, 3, False, False)), 7)
    fenced = update_metadata((1, 3, False, False), (2, 7, True, False))
    assert not await expansion_proposed(tmp_path, "fenced", fenced, 7)
    shutting_down = update_metadata((1, 3, False, False), (2, 7, False, True))
    assert not await expansion_proposed(tmp_path, "shutting-down", shutting_down, 7)
    # Before any snapshot the controller's own liveness check on AlterPartition is the guard.
    assert await expansion_proposed(tmp_path, "no-snapshot", None, 6)
