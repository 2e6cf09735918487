"""broker/txn/grpc_service.py: gRPC's transaction RPCs refuse as the Kafka APIs do (the
same functions of txn_apis): WRITE on the TRANSACTIONAL_ID for InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn, DESCRIBE for
FindCoordinator; WRITE on each topic for AddPartitionsToTxn, READ on the group for
AddOffsetsToTxn. Refused requests reach no coordinator (none is given here). A
Produce naming a transactional id needs WRITE on it (Kafka's rule)."""

from __future__ import annotations

import asyncio

import pytest

from tidewater.broker.servicers.grpc_server import _produce_refusals
from tidewater.broker.txn.grpc_service import TxnRpcs
from tidewater.proto import acls
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)


class EveryPartitionKnown:
    def partition_state(self, topic: str, partition: int) -> object:
        return object()


def rpcs() -> TxnRpcs:
    return TxnRpcs(None, None, EveryPartitionKnown(), "INTERNAL")  # type: ignore[arg-type]


def no_transactional_id(operation: int, kind: int, name: str) -> bool:
    return kind != acls.TRANSACTIONAL_ID


def test_every_rpc_needs_the_transactional_id():
    r = rpcs()

    async def run() -> None:
        denied = pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        found = await r.find_coordinator(
            pb.FindCoordinatorRequest(group_id="tx", key_type=pb.KEY_TYPE_TRANSACTION),
            no_transactional_id)
        assert found.error_code == denied
        init = await r.init_producer_id(
            pb.InitProducerIdRequest(transactional_id="tx", producer_id=-1, producer_epoch=-1,
                                     transaction_timeout_ms=1000), no_transactional_id)
        assert (init.error_code, init.producer_id) == (denied, -1)
        added = await r.add_partitions(pb.AddPartitionsToTxnRequest(
            transactional_id="tx", partitions=[pb.TxnPartition(topic="t", partition=0),
                                               pb.TxnPartition(topic="t", partition=1)]),
            no_transactional_id)
        assert [p.error_code for p in added.partitions] == [denied, denied]
        offsets = await r.add_offsets(pb.AddOffsetsToTxnRequest(transactional_id="tx",
                                                                group_id="g"),
                                      no_transactional_id)
        assert offsets.error_code == denied
        committed = await r.txn_offset_commit(pb.TxnOffsetCommitRequest(
            transactional_id="tx", group_id="g",
            offsets=[pb.GroupOffset(topic="t", partition=0, offset=3)]), no_transactional_id)
        assert [o.error_code for o in committed.offsets] == [denied]
        ended = await r.end_txn(pb.EndTxnRequest(transactional_id="tx", committed=True),
                                no_transactional_id)
        assert ended.error_code == denied
    asyncio.run(run())


def test_topics_and_groups_are_checked_too():
    r = rpcs()

    def no_topic_b(operation: int, kind: int, name: str) -> bool:
        return not (kind == acls.TOPIC and name == "b")

    def no_group(operation: int, kind: int, name: str) -> bool:
        return kind != acls.GROUP

    async def run() -> None:
        added = await r.add_partitions(pb.AddPartitionsToTxnRequest(
            transactional_id="tx", partitions=[pb.TxnPartition(topic="a", partition=0),
                                               pb.TxnPartition(topic="b", partition=0)]),
            no_topic_b)
        assert {p.topic: p.error_code for p in added.partitions} == {
            "a": pb.OPERATION_NOT_ATTEMPTED, "b": pb.TOPIC_AUTHORIZATION_FAILED}
        offsets = await r.add_offsets(pb.AddOffsetsToTxnRequest(transactional_id="tx",
                                                                group_id="g"), no_group)
        assert offsets.error_code == pb.GROUP_AUTHORIZATION_FAILED
    asyncio.run(run())


def test_a_transactional_produce_needs_write_on_its_transactional_id():
    def request() -> pb.ProduceRequest:
        return pb.ProduceRequest(acks=-1, transactional_id="tx", partitions=[
            pb.ProducePartitionData(topic="a", partition=0),
            pb.ProducePartitionData(topic="b", partition=0)])

    refused_id = request()
    denied = _produce_refusals(refused_id, no_transactional_id)
    assert [d.error_code for d in denied] == [pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED] * 2
    assert not refused_id.partitions  # nothing of it is appended

    def no_topic_b(operation: int, kind: int, name: str) -> bool:
        return not (kind == acls.TOPIC and name == "b")
    topic_checked = request()
    denied = _produce_refusals(topic_checked, no_topic_b)
    assert [(d.topic, d.error_code) for d in denied] == [("b", pb.TOPIC_AUTHORIZATION_FAILED)]
    assert [p.topic for p in topic_checked.partitions] == ["a"]
