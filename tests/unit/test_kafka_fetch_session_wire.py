"""Fetch sessions on the wire: raw Fetch v12/v13 frames to a real listener and replica
manager, a consumer of 100 partitions (broker/kafka/fetch_session_apis.py)."""

from __future__ import annotations

import uuid

import pytest

from tests.unit.test_broker_fakes import make_batch
from tests.unit.test_broker_replica_manager import CLUSTER_ID, TOPIC_ID
from tests.unit.test_kafka_listener import Listening
from tidewater.broker.kafka import apis
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)

TOPIC = "wide"
PARTITIONS = 100
WIDE_TOPIC_ID = bytes(range(16))


class ManyPartitions(Listening):
    async def prepare(self) -> None:
        state = [pb.LeaderAndIsrPartition(
            state=pb.PartitionState(topic=TOPIC, partition=p, leader=1, leader_epoch=0,
                                    partition_epoch=0, replicas=[1], isr=[1],
                                    topic_id=WIDE_TOPIC_ID),
            is_new=True) for p in range(PARTITIONS)]
        await self.rm.leader_and_isr(pb.LeaderAndIsrRequest(
            controller_id=0, controller_epoch=1, broker_epoch=7, cluster_id=CLUSTER_ID,
            partitions=state))
        await self.rm.update_metadata(pb.UpdateMetadataRequest(
            controller_id=0, controller_epoch=1, partitions=[s.state for s in state]))


def fetch(session_id: int, epoch: int, offsets: dict[int, int], forgotten=(),
          version: int = 12) -> dict:
    topic = ({"topic_id": uuid.UUID(bytes=WIDE_TOPIC_ID)} if version >= 13
             else {"topic": TOPIC})
    gone = ({"topic_id": uuid.UUID(bytes=WIDE_TOPIC_ID)} if version >= 13
            else {"topic": TOPIC})
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 50 << 20,
            "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
            "rack_id": "", "topics": [{**topic, "partitions": [{
                "partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20} for p, offset in offsets.items()]}]
            if offsets else [],
            "forgotten_topics_data": [{**gone, "partitions": list(forgotten)}]
            if forgotten else []}


def produce(partitions, records: int = 2) -> dict:
    return {"transactional_id": None, "acks": 1, "timeout": 5000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": p, "records": make_batch(records)}
                                           for p in partitions]}]}


def answered(body) -> dict[int, tuple[int, int]]:
    """partition -> (high watermark, bytes of records) of a Fetch answer."""
    return {p.partition_index: (p.high_watermark, len(bytes(p.records or b"")))
            for t in body.responses for p in t.partitions}


async def test_incremental_fetches_answer_only_partitions_with_news(tmp_path):
    async with ManyPartitions(tmp_path) as listening:
        c = await listening.connect()
        await c.call(apis.PRODUCE, 9, produce(range(PARTITIONS)))
        full = await c.call(apis.FETCH, 12, fetch(0, 0, dict.fromkeys(range(PARTITIONS), 0)))
        assert full.error_code == 0 and full.session_id != 0
        assert len(answered(full)) == PARTITIONS
        session_id = full.session_id
        # The consumer now asks from offset 2 everywhere (all changed: sent in full).
        moved = await c.call(apis.FETCH, 12, fetch(session_id, 1,
                                                   dict.fromkeys(range(PARTITIONS), 2)))
        assert moved.error_code == 0 and moved.session_id == session_id
        assert answered(moved) == {}  # nothing new: no partition listed
        # New records in 3 partitions: an incremental fetch naming none lists those 3.
        await c.call(apis.PRODUCE, 9, produce([5, 50, 99], records=3))
        news = await c.call(apis.FETCH, 12, fetch(session_id, 2, {}))
        assert {p: hw for p, (hw, _) in answered(news).items()} == {5: 5, 50: 5, 99: 5}
        assert all(size > 0 for _, size in answered(news).values())
        # Forget partition 5, move 50 and 99 on: nothing to answer.
        quiet = await c.call(apis.FETCH, 12, fetch(session_id, 3, {50: 5, 99: 5},
                                                   forgotten=[5]))
        assert answered(quiet) == {}
        # Partition 5 gets records; it is no longer in the session.
        await c.call(apis.PRODUCE, 9, produce([5, 7]))
        after = await c.call(apis.FETCH, 12, fetch(session_id, 4, {}))
        assert set(answered(after)) == {7}
        counters = listening.listener.services.fetch_sessions.counters
        assert (counters.full_fetches, counters.incremental_fetches) == (1, 4)
        c.close()


async def test_session_errors_then_a_new_session(tmp_path):
    async with ManyPartitions(tmp_path) as listening:
        c = await listening.connect()
        full = await c.call(apis.FETCH, 12, fetch(0, 0, {0: 0, 1: 0}))
        wrong_epoch = await c.call(apis.FETCH, 12, fetch(full.session_id, 7, {}))
        assert wrong_epoch.error_code == pb.INVALID_FETCH_SESSION_EPOCH
        assert wrong_epoch.session_id == 0 and not wrong_epoch.responses
        unknown = await c.call(apis.FETCH, 12, fetch(full.session_id + 1, 1, {}))
        assert unknown.error_code == pb.FETCH_SESSION_ID_NOT_FOUND
        # Closing the session (epoch -1) answers sessionless, in full.
        closing = await c.call(apis.FETCH, 12, fetch(full.session_id, -1, {0: 0, 1: 0}))
        assert closing.error_code == 0 and closing.session_id == 0
        assert set(answered(closing)) == {0, 1}
        gone = await c.call(apis.FETCH, 12, fetch(full.session_id, 1, {}))
        assert gone.error_code == pb.FETCH_SESSION_ID_NOT_FOUND
        again = await c.call(apis.FETCH, 12, fetch(0, 0, {0: 0}))
        assert again.error_code == 0 and again.session_id not in (0, full.session_id)
        c.close()


@pytest.mark.parametrize("version", [13, 15, 17])
async def test_fetch_v13_on_names_topics_by_id_and_refuses_unknown_ids(tmp_path, version):
    async with ManyPartitions(tmp_path) as listening:
        c = await listening.connect()
        await c.call(apis.PRODUCE, 9, produce([3]))
        full = await c.call(apis.FETCH, version, fetch(0, 0, {3: 0, 4: 0}, version=version))
        assert full.error_code == 0 and full.session_id != 0
        [topic] = full.responses
        assert topic.topic_id == uuid.UUID(bytes=WIDE_TOPIC_ID)
        assert {p: hw for p, (hw, _) in answered(full).items()} == {3: 2, 4: 0}
        # A session opened with topic ids cannot go on with names (v12).
        mixed = await c.call(apis.FETCH, 12, fetch(full.session_id, 1, {}))
        assert mixed.error_code == pb.FETCH_SESSION_TOPIC_ID_ERROR
        unknown_id = fetch(0, -1, {0: 0}, version=version)
        unknown_id["topics"][0]["topic_id"] = uuid.UUID(bytes=TOPIC_ID)
        refused = await c.call(apis.FETCH, version, unknown_id)
        [[partition]] = [t.partitions for t in refused.responses]
        assert partition.error_code == pb.UNKNOWN_TOPIC_ID
        c.close()
