"""The marker loop through a fake ``TxnMarkerSender``: every partition is retried until
its leader wrote the marker; fencing stops it; deleted topics are dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from tidewater.broker.txn import markers
from tidewater.broker.txn.markers import TxnMarker, UnwiredMarkerSender, send_until_written
from tidewater.broker.txn.state import MarkerJob
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)

TopicPartition = tuple[str, int]


@dataclass
class FakeMetadata:
    leaders: dict[TopicPartition, int]

    def partition_state(self, topic: str, partition: int) -> pb.PartitionState | None:
        leader = self.leaders.get((topic, partition))
        return None if leader is None else pb.PartitionState(leader=leader)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.leaders})


class ScriptedSender:
    """Answers each partition from a script of codes (NONE once the script runs out);
    an exception in the script fails the whole call."""

    def __init__(self, script: dict[TopicPartition, list[object]]):
        self.script = script
        self.calls: list[tuple[int, TxnMarker]] = []

    async def write_markers(self, leader_broker_id: int, markers: Sequence[TxnMarker]
                            ) -> list[dict[TopicPartition, pb.ErrorCode]]:
        [marker] = markers
        self.calls.append((leader_broker_id, marker))
        answers: dict[TopicPartition, pb.ErrorCode] = {}
        for tp in marker.partitions:
            step = self.script.get(tp, [])
            outcome = step.pop(0) if step else pb.NONE
            if isinstance(outcome, Exception):
                raise outcome
            answers[tp] = outcome  # type: ignore[assignment]
        return [answers]


JOB = MarkerJob("tx", 7, 3, True, 11, frozenset({("a", 0), ("a", 1), ("b", 0)}))


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(markers, "MARKER_RETRY_BACKOFF_MS", 1)
    monkeypatch.setattr(markers, "MARKER_RETRY_BACKOFF_MS_MAX", 2)


def run(job, sender, metadata, current=lambda: True) -> bool:
    return asyncio.run(send_until_written(job, sender, metadata, current))  # type: ignore[arg-type]


def test_one_call_per_leader_with_the_coordinator_epoch():
    sender = ScriptedSender({})
    assert run(JOB, sender, FakeMetadata({("a", 0): 1, ("a", 1): 2, ("b", 0): 1}))
    assert sorted((leader, m.partitions) for leader, m in sender.calls) == [
        (1, (("a", 0), ("b", 0))), (2, (("a", 1),))]
    assert {(m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch)
            for _, m in sender.calls} == {(7, 3, True, 11)}


def test_failed_partitions_and_failed_calls_are_retried_until_written():
    sender = ScriptedSender({("a", 0): [pb.NOT_LEADER_OR_FOLLOWER, pb.NOT_ENOUGH_REPLICAS],
                             ("a", 1): [ConnectionError("broker 2 unreachable")]})
    assert run(JOB, sender, FakeMetadata({("a", 0): 1, ("a", 1): 2, ("b", 0): 1}))
    written_b = [m for _, m in sender.calls if ("b", 0) in m.partitions]
    assert len(written_b) == 1  # a written partition is not sent again
    assert sum(("a", 0) in m.partitions for _, m in sender.calls) == 3


def test_a_fenced_answer_stops_this_coordinator():
    sender = ScriptedSender({("a", 0): [pb.TRANSACTION_COORDINATOR_FENCED]})
    assert not run(JOB, sender, FakeMetadata({("a", 0): 1, ("a", 1): 1, ("b", 0): 1}))


def test_a_deleted_topic_needs_no_marker():
    sender = ScriptedSender({})
    assert run(JOB, sender, FakeMetadata({("a", 0): 1, ("a", 1): 1}))
    assert all(("b", 0) not in m.partitions for _, m in sender.calls)


def test_a_coordinator_that_lost_its_partition_stops():
    assert not run(JOB, ScriptedSender({}), FakeMetadata({("a", 0): 1}), lambda: False)


def test_the_unwired_sender_never_claims_a_marker_written():
    async def bounded() -> None:
        with pytest.raises(TimeoutError):  # still retrying: the job never completes
            async with asyncio.timeout(0.2):
                await send_until_written(JOB, UnwiredMarkerSender(), FakeMetadata(  # type: ignore[arg-type]
                    {("a", 0): 1, ("a", 1): 1, ("b", 0): 1}), lambda: True)
    asyncio.run(bounded())


def test_a_moved_leader_gets_the_retry_once_the_metadata_names_it():
    """NOT_LEADER_OR_FOLLOWER from the old leader; UpdateMetadata then names broker 2:
    the next round sends the partition there (Kafka's TransactionMarkerChannelManager)."""
    metadata = FakeMetadata({("a", 0): 1})
    job = MarkerJob("tx", 7, 3, True, 11, frozenset({("a", 0)}))

    class MovingLeader(ScriptedSender):
        async def write_markers(self, leader_broker_id, markers):
            [marker] = markers
            self.calls.append((leader_broker_id, marker))
            if leader_broker_id == 1:
                metadata.leaders[("a", 0)] = 2  # the controller moved it meanwhile
                return [{("a", 0): pb.NOT_LEADER_OR_FOLLOWER}]
            return [{("a", 0): pb.NONE}]
    sender = MovingLeader({})
    assert run(job, sender, metadata)
    assert [leader for leader, _ in sender.calls] == [1, 2]
