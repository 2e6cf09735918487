"""Produce/fetch through real processes: acks 0/1/all, errors, consumers below the HW."""

from __future__ import annotations

import grpc
import pytest

from proto import tidewater_pb2 as pb
from proto.records import encode_batch
from tests.integration.conftest import consume_all, fetch, produce, wait_for

pytestmark = pytest.mark.integration


def test_round_trip_acks_0_1_all(cluster):
    c = cluster(2)
    c.create_topic("rt", replication_factor=2)
    leader = c.leader("rt")
    r1 = produce(leader, "rt", [b"a", b"b"], acks=1)
    assert r1.error_code == pb.NONE and r1.base_offset == 0
    rall = produce(leader, "rt", [b"c"], acks=-1)
    assert rall.error_code == pb.NONE and rall.base_offset == 2
    assert produce(leader, "rt", [b"d"], acks=0) is None  # acks=0: empty success
    wait_for(lambda: leader.replica("rt").high_watermark == 4, message="HW 4")
    assert [v for _, v in consume_all(leader, "rt")] == [b"a", b"b", b"c", b"d"]
    follower = c.brokers[3 - leader.broker_id]
    wait_for(lambda: follower.replica("rt").log_end_offset == 4, message="follower LEO 4")
    # Consumers fetch from the leader only.
    assert fetch(follower, "rt", 0).error_code == pb.NOT_LEADER_OR_FOLLOWER
    meta = leader.stub.Metadata(pb.MetadataRequest(topics=["rt", "nope"]), timeout=5)
    assert {b.broker_id for b in meta.brokers} == {1, 2}
    assert meta.topics[0].partitions[0].leader == leader.broker_id
    assert meta.topics[1].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION


def test_malformed_requests_get_typed_errors(cluster):
    c = cluster(1, broker_settings={"socket.request.max.bytes": str(256 * 1024),
                                    "message.max.bytes": "2000"})
    c.create_topic("bad", replication_factor=1)
    b = c.leader("bad")

    def one(topic="bad", records=None, acks=1, partition=0):
        resp = b.stub.Produce(pb.ProduceRequest(acks=acks, timeout_ms=2000, partitions=[
            pb.ProducePartitionData(topic=topic, partition=partition,
                                    records=encode_batch([(None, b"v")]) if records is None
                                    else records)]), timeout=10)
        return resp.partitions[0].error_code

    corrupt = bytearray(encode_batch([(None, b"hello")]))
    corrupt[-1] ^= 0x01
    assert one(records=bytes(corrupt)) == pb.CORRUPT_MESSAGE
    assert one(records=b"\x00" * 7) == pb.CORRUPT_MESSAGE
    assert one(topic="nope") == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert one(partition=5) == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert one(topic="../etc") == pb.INVALID_TOPIC_EXCEPTION
    assert one(acks=2) == pb.INVALID_REQUIRED_ACKS
    assert one(records=encode_batch([(None, b"x" * 5000)])) == pb.MESSAGE_TOO_LARGE
    with pytest.raises(grpc.RpcError) as info:
        one(records=b"x" * (300 * 1024))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Nothing of the above was written.
    assert b.replica("bad").log_end_offset == 0
    assert not (c.brokers[1].data_dir.parent / "etc").exists()
    assert one() == pb.NONE
