"""Issue 27: the marker-writing port (``serving/txn_markers.py``) behind a replica
manager with real logs, over BrokerControl's WriteTxnMarkers gRPC, and Kafka's
WriteTxnMarkers authorization; gRPC Fetch/ListOffsets with read_committed."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from tests.unit.test_broker_replica_manager import TP, lai, make_manager, serve
from tidewater.broker.kafka.marker_apis import on_write_txn_markers
from tidewater.broker.serving.txn_markers import (
    RemoteMarkerWriter,
    TxnMarkerEntry,
    TxnMarkerResult,
)
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.meta_properties import MetaProperties, write_meta_properties
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.records import encode_batch

pytestmark = pytest.mark.timeout(60)

CLUSTER_ID = "txn-markers-cluster"


async def leading_manager(tmp_path, verification: bool = False):
    """``verification``: KIP-890's (off: these tests write the log side alone, with no
    transaction coordinator to ask)."""
    data_dir = tmp_path / "broker"
    data_dir.mkdir()
    write_meta_properties(data_dir, MetaProperties(1, CLUSTER_ID))
    manager = LogManager(data_dir, LogConfig())
    manager.load(now_ms=0)
    rm, _ = make_manager(data_dir, log_manager=manager, **{
        "transaction.partition.verification.enable": str(verification).lower()})
    rm.load()
    answer = await rm.leader_and_isr(lai(isr=(1,), replicas=(1,)))  # alone: HW = LEO
    assert all(p.error_code == pb.NONE for p in answer.partitions), answer
    return rm


def txn_records(pid: int, sequence: int, *values: bytes) -> bytes:
    return encode_batch([(None, v) for v in values], producer_id=pid, producer_epoch=0,
                        base_sequence=sequence, attributes=TRANSACTIONAL_MASK)


async def produce(rm, records: bytes) -> None:
    response = await rm.produce(pb.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
        pb.ProducePartitionData(topic=TP.topic, partition=TP.partition, records=records)]))
    assert response.partitions[0].error_code == pb.NONE, response


async def test_markers_in_process_end_transactions_and_fetch_honours_read_committed(tmp_path):
    rm = await leading_manager(tmp_path)
    await produce(rm, txn_records(1, 0, b"a"))          # 0
    await produce(rm, txn_records(2, 0, b"b"))          # 1
    results = await rm.txn_markers.write_txn_markers([
        TxnMarkerEntry(1, 0, 0, False, ((TP.topic, 0), ("nowhere", 0)))])  # abort at 2
    assert [(r.topic, r.error_code) for r in results] == [
        (TP.topic, pb.NONE), ("nowhere", pb.UNKNOWN_TOPIC_OR_PARTITION)]

    def fetch(isolation_level: int) -> pb.FetchPartitionResponse:
        return pb.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=isolation_level, partitions=[pb.FetchPartition(
                                   topic=TP.topic, partition=0, current_leader_epoch=-1,
                                   fetch_offset=0, last_fetched_epoch=-1,
                                   partition_max_bytes=1 << 20)])
    committed = (await rm.fetch(fetch(1))).partitions[0]
    assert committed.error_code == pb.NONE
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 1)
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(1, 0)]
    uncommitted = (await rm.fetch(fetch(0))).partitions[0]
    assert uncommitted.last_stable_offset == 1 and not uncommitted.aborted_transactions
    assert len(uncommitted.records) > len(committed.records)  # producer 2's batch too

    def latest(isolation_level: int) -> int:
        return rm.list_offsets(pb.ListOffsetsRequest(
            replica_id=-1, isolation_level=isolation_level, partitions=[pb.ListOffsetsPartition(
                topic=TP.topic, partition=0, current_leader_epoch=-1, timestamp=-1)])
        ).partitions[0].offset
    assert (latest(0), latest(1)) == (3, 1)

    # Over the internal gRPC, as a coordinator on another broker calls it.
    server, port = await serve(rm)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = await pb_grpc.BrokerControlStub(channel).WriteTxnMarkers(
                pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
                    producer_id=2, producer_epoch=0, coordinator_epoch=3, committed=True,
                    partitions=[pb.TxnMarkerPartition(topic=TP.topic, partition=0)])]))
            assert [(r.producer_id, r.error_code) for r in answer.results] == [(2, pb.NONE)]
            stale = await pb_grpc.BrokerControlStub(channel).WriteTxnMarkers(
                pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
                    producer_id=2, producer_epoch=0, coordinator_epoch=2, committed=False,
                    partitions=[pb.TxnMarkerPartition(topic=TP.topic, partition=0)])]))
            assert [r.error_code for r in stale.results] == [pb.TRANSACTION_COORDINATOR_FENCED]
            # The same port as in process, over the channel.
            remote = RemoteMarkerWriter(channel)
            again = await remote.write_txn_markers(
                [TxnMarkerEntry(2, 0, 3, True, ((TP.topic, 0), ("nowhere", 1)))])
            assert [(r.topic, r.partition, r.error_code) for r in again] == [
                (TP.topic, 0, pb.NONE), ("nowhere", 1, pb.UNKNOWN_TOPIC_OR_PARTITION)]
    finally:
        await server.stop(0)
    assert (latest(0), latest(1)) == (5, 5)  # two COMMITs for producer 2: the retry too
    # A client cannot produce a marker itself.
    from tidewater.proto.control_records import encode_marker_batch
    response = await rm.produce(pb.ProduceRequest(acks=1, partitions=[pb.ProducePartitionData(
        topic=TP.topic, partition=0, records=encode_marker_batch(
            2, 0, committed=True, coordinator_epoch=9, timestamp_ms=0))]))
    assert response.partitions[0].error_code == pb.INVALID_RECORD
    await rm.stop()


async def test_kafka_write_txn_markers_needs_cluster_action():
    class Refusing:
        replica_manager = None

        def allowed(self, operation: int, resource_type: int, name: str) -> bool:
            return False
    body = SimpleNamespace(markers=(SimpleNamespace(
        producer_id=5, producer_epoch=0, coordinator_epoch=0, transaction_result=True,
        topics=(SimpleNamespace(name="t", partition_indexes=(0, 1)),)),))
    answer = await (await on_write_txn_markers(Refusing(), None, body))  # type: ignore[arg-type]
    [marker] = answer["markers"]
    assert marker["producer_id"] == 5
    assert [p["error_code"] for p in marker["topics"][0]["partitions"]] == [
        pb.CLUSTER_AUTHORIZATION_FAILED] * 2


async def test_the_lso_never_falls_below_the_log_start(tmp_path):
    rm = await leading_manager(tmp_path)
    await produce(rm, txn_records(1, 0, b"open"))                      # 0: left open
    await produce(rm, encode_batch([(None, b"x")]))                    # 1
    await produce(rm, encode_batch([(None, b"y")]))                    # 2
    [deleted] = await rm.delete_records([(TP.topic, 0, 2)], 5000)
    assert (deleted.error_code, deleted.low_watermark) == (pb.NONE, 2)
    answer = rm.list_offsets(pb.ListOffsetsRequest(
        replica_id=-1, isolation_level=1, partitions=[pb.ListOffsetsPartition(
            topic=TP.topic, partition=0, current_leader_epoch=-1, timestamp=-1)]))
    assert answer.partitions[0].offset == 2  # not 0: below the log start
    # The coordinator ends it: the LSO reaches the HW.
    await rm.txn_markers.write_txn_markers([TxnMarkerEntry(1, 0, 0, True, ((TP.topic, 0),))])
    answer = rm.list_offsets(pb.ListOffsetsRequest(
        replica_id=-1, isolation_level=1, partitions=[pb.ListOffsetsPartition(
            topic=TP.topic, partition=0, current_leader_epoch=-1, timestamp=-1)]))
    assert answer.partitions[0].offset == 4
    await rm.stop()


@pytest.mark.parametrize("version", [0, 1, 2])
def test_write_txn_markers_every_version_round_trips_through_the_codec(version):
    from tidewater.broker.kafka import codec
    from tidewater.broker.kafka.apis import SUPPORTED
    from tidewater.broker.kafka.marker_apis import WRITE_TXN_MARKERS, write_txn_markers_values

    entries = [TxnMarkerEntry(7, 1, 3, True, ((TP.topic, 0), (TP.topic, 2)))]
    frame = codec.encode_request(WRITE_TXN_MARKERS, version, 5, {"markers": [{
        "producer_id": 7, "producer_epoch": 1, "transaction_result": True,
        "topics": [{"name": TP.topic, "partition_indexes": [0, 2]}], "coordinator_epoch": 3}]})
    head, body = codec.decode_request(frame[4:], SUPPORTED)
    assert head.api_version == version
    [marker] = body.markers
    assert (marker.producer_id, marker.coordinator_epoch, marker.transaction_result) == (7, 3, True)
    values = write_txn_markers_values(
        entries, [TxnMarkerResult(7, TP.topic, p, pb.NONE) for p in (0, 2)])
    answer = codec.encode_response(head, codec.build(
        codec.response_type(WRITE_TXN_MARKERS, version), values))
    _, decoded = codec.decode_response(WRITE_TXN_MARKERS, version, answer[4:])
    assert [p.partition_index for p in decoded.markers[0].topics[0].partitions] == [0, 2]


async def test_the_writer_tells_on_committed_of_each_marker_committed_and_no_other(tmp_path):
    """``on_committed`` (the group coordinator's complete_transaction in the broker) hears
    of a marker once it is committed here, never of a refused one."""
    rm = await leading_manager(tmp_path)
    await produce(rm, txn_records(1, 0, b"a"))
    told: list[tuple[int, bool, str, int]] = []
    rm.txn_markers.on_committed = lambda m, t, p: told.append((m.producer_id, m.committed,
                                                              t, p))
    results = await rm.txn_markers.write_txn_markers([
        TxnMarkerEntry(1, 0, 5, True, ((TP.topic, 0), ("nowhere", 0)))])
    assert [r.error_code for r in results] == [pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION]
    stale = await rm.txn_markers.write_txn_markers([
        TxnMarkerEntry(1, 0, 4, False, ((TP.topic, 0),))])  # an older coordinator epoch
    assert [r.error_code for r in stale] == [pb.TRANSACTION_COORDINATOR_FENCED]
    assert told == [(1, True, TP.topic, 0)]
