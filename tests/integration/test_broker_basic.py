"""Produce/fetch through real processes: acks 0/1/all, errors, consumers below the HW."""

from __future__ import annotations

import grpc
import pytest

from tests.integration.conftest import consume_all, fetch, produce, wait_for
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.records import encode_batch

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


def test_consumers_never_read_above_the_high_watermark(cluster):
    import signal

    c = cluster(2)
    c.create_topic("hw", replication_factor=2)
    leader = c.wait_leader_ready("hw", isr_size=2)
    assert produce(leader, "hw", [b"committed"], acks=-1).error_code == pb.NONE
    follower = c.brokers[3 - leader.broker_id]
    follower.proc.signal(signal.SIGSTOP)
    try:
        r = produce(leader, "hw", [b"pending"], acks=1)
        assert r.error_code == pb.NONE and r.base_offset == 1
        p = fetch(leader, "hw", 0)
        assert (p.high_watermark, p.log_end_offset) == (1, 2)
        from tidewater.proto.records import decode_records
        assert [rec.value for rec in decode_records(p.records)] == [b"committed"]
        assert fetch(leader, "hw", 1).records == b""
        # A consumer long-poll at the HW returns once the record commits (ISR shrink here).
        p = fetch(leader, "hw", 1, max_wait_ms=8000)
        assert [rec.value for rec in decode_records(p.records)] == [b"pending"]
        assert p.high_watermark == 2
    finally:
        follower.proc.signal(signal.SIGCONT)


def test_external_listener_metadata(cluster):
    from tests.integration.conftest import free_port

    ports = {1: free_port()}
    c = cluster(1, extra_args=lambda i: ["--external-listen", f"127.0.0.1:{ports[i]}",
                                         "--external-advertise", f"localhost:{ports[i]}"])
    c.create_topic("ext", replication_factor=1)
    b = c.brokers[1]
    internal = b.stub.Metadata(pb.MetadataRequest(), timeout=5)
    assert [(x.host, x.port) for x in internal.brokers] == [("127.0.0.1", b.port)]
    ext_channel = grpc.insecure_channel(f"127.0.0.1:{ports[1]}")
    try:
        from tidewater.proto import tidewater_pb2_grpc as pb_grpc
        ext = pb_grpc.BrokerStub(ext_channel)
        meta = wait_for(lambda: ext.Metadata(pb.MetadataRequest(topics=["ext"]), timeout=5))
        assert [(x.host, x.port) for x in meta.brokers] == [("localhost", ports[1])]
        assert meta.topics[0].partitions[0].leader == 1
        # The external listener serves data too.
        r = ext.Produce(pb.ProduceRequest(acks=1, timeout_ms=2000, partitions=[
            pb.ProducePartitionData(topic="ext", partition=0,
                                    records=encode_batch([(None, b"e")]))]), timeout=10)
        assert r.partitions[0].error_code == pb.NONE
    finally:
        ext_channel.close()


def test_admin_calls_are_forwarded_and_controller_restart_keeps_serving(cluster):
    c = cluster(2)
    c.create_topic("fw", replication_factor=2, via=2)  # CreateTopics through broker 2
    described = c.brokers[1].admin.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
    assert described.error_code == pb.NONE and {b.broker_id for b in described.brokers} == {1, 2}
    leader = c.wait_leader_ready("fw", isr_size=2)
    assert produce(leader, "fw", [b"before"], acks=-1).error_code == pb.NONE
    c.controller.terminate()
    # Without a controller, data still flows and admin calls answer NOT_CONTROLLER.
    assert produce(leader, "fw", [b"during"], acks=-1).error_code == pb.NONE
    down = leader.admin.DescribeCluster(pb.DescribeClusterRequest(), timeout=15)
    assert down.error_code == pb.NOT_CONTROLLER
    c.controller.start()
    c.wait_registered([1, 2])
    leader = c.wait_leader_ready("fw", isr_size=2)
    assert produce(leader, "fw", [b"after"], acks=-1).error_code == pb.NONE
    assert [v for _, v in consume_all(leader, "fw")] == [b"before", b"during", b"after"]
    resp = leader.admin.DeleteTopics(pb.DeleteTopicsRequest(names=["fw"], timeout_ms=5000),
                                     timeout=15)
    assert resp.topics[0].error_code == pb.NONE
    wait_for(lambda: all(b.replica("fw") is None for b in c.brokers.values()),
             message="replicas deleted")
    assert not any((b.data_dir / "fw-0").exists() for b in c.brokers.values())


def test_list_offsets_and_offset_for_leader_epoch(cluster):
    c = cluster(1)
    c.create_topic("lo", replication_factor=1)
    b = c.leader("lo")
    for i, ts in enumerate((1000, 2000, 3000)):
        batch = encode_batch([(None, b"%d" % i)], base_timestamp_ms=ts)
        r = b.stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=2000, partitions=[
            pb.ProducePartitionData(topic="lo", partition=0, records=batch)]), timeout=10)
        assert r.partitions[0].error_code == pb.NONE

    def list_offsets(ts, replica_id=-1, epoch=-1):
        resp = b.stub.ListOffsets(pb.ListOffsetsRequest(replica_id=replica_id, partitions=[
            pb.ListOffsetsPartition(topic="lo", partition=0, current_leader_epoch=epoch,
                                    timestamp=ts)]), timeout=5)
        return resp.partitions[0]

    assert list_offsets(-2).offset == 0
    assert list_offsets(-1).offset == 3
    found = list_offsets(1500)
    assert (found.error_code, found.offset, found.timestamp) == (pb.NONE, 1, 2000)
    assert list_offsets(9999).offset == -1
    epoch = b.replica("lo").leader_epoch
    assert list_offsets(-1, epoch=epoch + 1).error_code == pb.UNKNOWN_LEADER_EPOCH
    resp = b.stub.OffsetForLeaderEpoch(pb.OffsetForLeaderEpochRequest(replica_id=-1, partitions=[
        pb.OffsetForLeaderEpochPartition(topic="lo", partition=0, current_leader_epoch=epoch,
                                         leader_epoch=epoch)]), timeout=5)
    p = resp.partitions[0]
    assert (p.error_code, p.leader_epoch, p.end_offset) == (pb.NONE, epoch, 3)
