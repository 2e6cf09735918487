"""KIP-890 part 1 on the produce path: a replica manager with real logs, verification on,
and a stand-in transaction coordinator (``ProducePath.verify``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_broker_replica_manager import TP
from tests.unit.test_txn_markers_service import leading_manager, txn_records
from tidewater.broker.serving.txn_markers import TxnMarkerEntry
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)

PID = 1


class Coordinator:
    """Answers each verification with ``code``; counts the questions. ``gate``: held
    until set (to end the transaction while a question is out)."""

    def __init__(self, code: pb.ErrorCode = pb.NONE):
        self.code = code
        self.asked: list[tuple[str, int, int, list]] = []
        self.gate: asyncio.Event | None = None

    async def verify(self, transactional_id, producer_id, producer_epoch, partitions):
        self.asked.append((transactional_id, producer_id, producer_epoch, partitions))
        if self.gate is not None:
            await self.gate.wait()
        return {tp: self.code for tp in partitions}


async def produce(rm, records: bytes, transactional_id: str = "tx") -> pb.ProducePartitionResponse:
    response = await rm.produce(pb.ProduceRequest(
        acks=1, timeout_ms=5000, transactional_id=transactional_id, partitions=[
            pb.ProducePartitionData(topic=TP.topic, partition=TP.partition, records=records)]))
    return response.partitions[0]


async def end(rm, committed: bool = True) -> None:
    [result] = await rm.txn_markers.write_txn_markers(
        [TxnMarkerEntry(PID, 0, 0, committed, ((TP.topic, TP.partition),))], timeout_ms=5000)
    assert result.error_code == pb.NONE


def log_end(rm) -> int:
    return rm.partitions[TP].log.log_end_offset


async def manager(tmp_path, coordinator: Coordinator | None):
    rm = await leading_manager(tmp_path, verification=True)
    if coordinator is not None:
        rm.producer.verify = coordinator.verify
    return rm


async def test_a_partition_not_in_the_transaction_is_refused_and_nothing_appended(tmp_path):
    coordinator = Coordinator(pb.INVALID_TXN_STATE)
    rm = await manager(tmp_path, coordinator)
    answer = await produce(rm, txn_records(PID, 0, b"a"))
    assert answer.error_code == pb.INVALID_TXN_STATE and answer.base_offset == -1
    assert answer.error_message == "Partition was not added to the transaction"
    assert coordinator.asked == [("tx", PID, 0, [(TP.topic, TP.partition)])]
    assert log_end(rm) == 0


async def test_a_transactional_batch_without_a_transactional_id_is_refused(tmp_path):
    rm = await manager(tmp_path, Coordinator())
    answer = await produce(rm, txn_records(PID, 0, b"a"), transactional_id="")
    assert answer.error_code == pb.INVALID_TXN_STATE
    assert log_end(rm) == 0


async def test_a_coordinator_that_cannot_answer_now_is_a_retriable_refusal(tmp_path):
    rm = await manager(tmp_path, Coordinator(pb.COORDINATOR_LOAD_IN_PROGRESS))
    answer = await produce(rm, txn_records(PID, 0, b"a"))
    assert answer.error_code == pb.NOT_ENOUGH_REPLICAS
    assert log_end(rm) == 0


async def test_one_question_per_transaction_per_partition(tmp_path):
    coordinator = Coordinator()
    rm = await manager(tmp_path, coordinator)
    assert (await produce(rm, txn_records(PID, 0, b"a"))).error_code == pb.NONE
    assert (await produce(rm, txn_records(PID, 1, b"b"))).error_code == pb.NONE
    assert len(coordinator.asked) == 1  # the open transaction needs no second one
    await end(rm)
    # The same producer and epoch after the marker: a new transaction, asked again.
    coordinator.code = pb.INVALID_TXN_STATE
    answer = await produce(rm, txn_records(PID, 2, b"late"))
    assert answer.error_code == pb.INVALID_TXN_STATE and len(coordinator.asked) == 2
    assert log_end(rm) == 3  # a, b and the marker
    # A plain produce is never asked about.
    rm.producer.verify = None
    from tidewater.proto.records import encode_batch
    plain = await produce(rm, encode_batch([(None, b"p")]), transactional_id="")
    assert plain.error_code == pb.NONE and len(coordinator.asked) == 2


async def test_a_marker_written_while_the_question_is_out_wins(tmp_path):
    coordinator = Coordinator()
    rm = await manager(tmp_path, coordinator)
    assert (await produce(rm, txn_records(PID, 0, b"a"))).error_code == pb.NONE
    await end(rm)
    coordinator.gate = asyncio.Event()
    late = asyncio.ensure_future(produce(rm, txn_records(PID, 1, b"late")))
    while not coordinator.asked[1:]:
        await asyncio.sleep(0.01)
    await end(rm, committed=False)  # the coordinator ended the transaction meanwhile
    coordinator.gate.set()  # and its (stale) answer says "in the transaction"
    answer = await late
    assert answer.error_code == pb.INVALID_TXN_STATE
    assert log_end(rm) == 3  # a, and the two markers


async def test_verification_off_takes_any_transactional_batch(tmp_path):
    rm = await leading_manager(tmp_path, verification=False)
    assert not rm.producer.verification_enabled
    assert (await produce(rm, txn_records(PID, 0, b"a"), transactional_id="")
            ).error_code == pb.NONE
