"""client.consumer's fetch-round pieces that the threaded Consumer and AsyncConsumer
share: the plan by leader and the answer table (one copy of each)."""

from __future__ import annotations

import pytest

from tidewater.client.aio_consumer import AsyncConsumer
from tidewater.client.consumer import Consumer
from tidewater.client.metadata import BrokerConnectionError, LeaderInfo, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvalidRequestError

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
ADDRESS_1, ADDRESS_2 = ("127.0.0.1", 1), ("127.0.0.1", 2)


class FakeMetadata:
    def __init__(self):
        self.invalidations = 0

    def invalidate(self):
        self.invalidations += 1


def consumer(positions):
    """A Consumer with positions only: no connections."""
    c = Consumer.__new__(Consumer)
    c._positions = dict(positions)
    c._pending_reset = {}
    c._backoff_until = {}
    c.retry_backoff_ms = 100
    c.auto_offset_reset = "earliest"
    c.metadata = FakeMetadata()
    return c


def test_the_plan_groups_by_leader_and_backs_off_a_partition_without_one():
    c = consumer({A: 5, B: 7, C: None})
    leaders = {A: LeaderInfo(1, ADDRESS_1, 3), B: None}
    wanted = c.fetch_plan(c.fetchable(0.0), leaders.get)
    assert wanted == {ADDRESS_1: ((A, 5, 3),)}  # C has no position yet
    assert c.metadata.invalidations == 1 and B in c._backoff_until
    assert c.fetchable(0.0) == [(A, 5)]  # B backs off now


def test_the_answer_table_for_one_leader():
    c = consumer({A: 0, B: 0})
    items = ((A, 0, 1), (B, 0, 1))
    answer = pb.FetchResponse(partitions=[
        pb.FetchPartitionResponse(topic="t", partition=0, high_watermark=9, records=b"batch",
                                  aborted_transactions=[pb.AbortedTransaction(
                                      producer_id=4, first_offset=2)]),
        pb.FetchPartitionResponse(topic="t", partition=1, error_code=pb.NOT_LEADER_OR_FOLLOWER),
        pb.FetchPartitionResponse(topic="t", partition=3, records=b"unassigned"),
    ])
    chunks, clean = c.read_fetch_answer(items, answer)
    assert chunks == [(A, b"batch", 9, [(4, 2)])] and not clean
    assert B in c._backoff_until and A not in c._backoff_until

    c = consumer({A: 0})
    chunks, clean = c.read_fetch_answer(((A, 0, 1),), pb.FetchResponse(partitions=[
        pb.FetchPartitionResponse(topic="t", partition=0, records=b"batch")]), {A: b"read by the loop"})
    assert chunks == [(A, b"read by the loop", 0, ())] and clean


def test_a_transport_or_response_error_backs_off_the_leaders_partitions():
    c = consumer({A: 0, B: 0})
    assert c.read_fetch_answer(((A, 0, 1),), BrokerConnectionError("down")) == ([], False)
    assert A in c._backoff_until and B not in c._backoff_until
    answer = pb.FetchResponse(error_code=pb.NOT_LEADER_OR_FOLLOWER)
    assert c.read_fetch_answer(((B, 0, 1),), answer) == ([], False)
    assert B in c._backoff_until


def test_a_partition_error_not_retriable_raises_with_its_message():
    c = consumer({A: 0})
    answer = pb.FetchResponse(partitions=[pb.FetchPartitionResponse(
        topic="t", partition=0, error_code=pb.INVALID_REQUEST, error_message="bad fetch")])
    with pytest.raises(InvalidRequestError, match="bad fetch"):
        c.read_fetch_answer(((A, 0, 1),), answer)


def test_the_async_consumer_keeps_no_copy_of_the_table():
    assert not hasattr(AsyncConsumer, "_records_of")
