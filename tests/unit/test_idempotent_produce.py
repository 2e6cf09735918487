"""Idempotent producers through the broker: producer id blocks (pure and shell),
InitProducerId over the Kafka listener, and a produce whose answer is lost being
retried: the record is in the log once, at the offset the retry is told."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_broker_replica_manager import TP, lai, make_manager
from tests.unit.test_kafka_listener import Listening, fetch_values, produce_values
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.producer_apis import INIT_PRODUCER_ID
from tidewater.broker.kafka.server import KafkaListener
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.broker.serving import producer_ids
from tidewater.broker.serving.producer_ids import ProducerIdBlocks, ProducerIdManager
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import encode_batch
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- blocks (pure)


def test_blocks_hand_out_each_id_once_and_prefetch_at_ninety_percent():
    blocks = ProducerIdBlocks()
    assert blocks.take() is None and blocks.wants_block()
    blocks.on_block(100, 10)
    got = [blocks.take() for _ in range(9)]
    assert got == list(range(100, 109)) and blocks.wants_block()
    blocks.on_block(500, 10)  # ahead: the current block still has 109
    assert not blocks.wants_block()
    assert [blocks.take(), blocks.take(), blocks.take()] == [109, 500, 501]


def quiet_supervisor() -> TaskSupervisor:
    """A death is logged at CRITICAL and kept in ``failure``; nothing to stop here."""
    return TaskSupervisor(on_fatal=lambda error: None)


class FakeController:
    def __init__(self, failures=0, block=3):
        self.next, self.block, self.failures, self.calls = 0, block, failures, 0

    async def allocate(self):
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("controller unreachable")
        start, self.next = self.next, self.next + self.block
        return pb.AllocateProducerIdsResponse(error_code=pb.NONE, producer_id_start=start,
                                              producer_id_len=self.block)


async def test_manager_gives_unique_ids_across_blocks_and_rides_out_failures(monkeypatch):
    monkeypatch.setattr(producer_ids, "RETRY_BACKOFF_MS", 1)
    controller = FakeController(failures=2)
    manager = ProducerIdManager(controller.allocate, quiet_supervisor())
    answers = await asyncio.gather(*(manager.init_producer_id(pb.InitProducerIdRequest(
        producer_id=-1, producer_epoch=-1)) for _ in range(20)))
    assert all(a.error_code == pb.NONE and a.producer_epoch == 0 for a in answers)
    assert sorted(a.producer_id for a in answers) == list(range(20))
    await manager.stop()


async def test_no_block_is_coordinator_load_in_progress_and_transactions_are_refused(
        monkeypatch):
    monkeypatch.setattr(producer_ids, "INIT_WAIT_MS_MAX", 50)
    manager = ProducerIdManager(None, quiet_supervisor())
    answer = await manager.init_producer_id(pb.InitProducerIdRequest(producer_id=-1,
                                                                      producer_epoch=-1))
    assert answer.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS and answer.producer_id == -1
    manager = ProducerIdManager(FakeController().allocate, quiet_supervisor())
    refused = await manager.init_producer_id(pb.InitProducerIdRequest(
        transactional_id="tx", producer_id=-1, producer_epoch=-1))
    assert refused.error_code == pb.INVALID_REQUEST
    half = await manager.init_producer_id(pb.InitProducerIdRequest(producer_id=5,
                                                                   producer_epoch=-1))
    assert half.error_code == pb.INVALID_REQUEST
    await manager.stop()


# ---------------------------------------------------------------- over the Kafka listener


class IdempotentListening(Listening):
    """The Kafka listener on a ReplicaManager with real logs (they keep producer state)."""

    async def __aenter__(self):
        self.rm, _ = make_manager(self.tmp_path, log_manager=LogManager(
            self.tmp_path / "data", LogConfig()))
        self.controller = FakeController(block=1000)
        self.rm.producer_ids = ProducerIdManager(self.controller.allocate, self.rm.supervisor)
        await self.rm.leader_and_isr(lai(leader=1, leader_epoch=0, isr=(1,), replicas=(1,)))
        services = apis.Services(replica_manager=self.rm, metadata_cache=self.rm.metadata_cache,
                                 controller=ControllerForwarder(None), listener_name="KAFKA")
        self.listener = KafkaListener(services, host="127.0.0.1", port=0,
                                      max_request_bytes=1 << 20, supervisor=self.rm.supervisor)
        self.port = await self.listener.start()
        return self


def idempotent_batch(producer_id, seq, n=1, epoch=0, value=b"v"):
    return encode_batch([(None, value)] * n, producer_id=producer_id, producer_epoch=epoch,
                        base_sequence=seq)


def partition_answer(body):
    [[partition]] = [t.partition_responses for t in body.responses]
    return partition


@pytest.mark.parametrize("version", range(0, 6))
async def test_init_producer_id_every_version(tmp_path, version):
    async with IdempotentListening(tmp_path) as listening:
        c = await listening.connect()
        values = {"transactional_id": None, "transaction_timeout": 60000,
                  "producer_id": -1, "producer_epoch": -1}
        first = await c.call(INIT_PRODUCER_ID, version, values)
        second = await c.call(INIT_PRODUCER_ID, version, values)
        assert (first.error_code, first.producer_epoch) == (0, 0)
        assert second.producer_id == first.producer_id + 1
        # (a transactional id goes to the transaction coordinator: test_kafka_txn_apis.py)
        c.close()


async def test_a_retry_after_a_lost_answer_is_written_once_at_the_offset_it_is_told(tmp_path):
    async with IdempotentListening(tmp_path) as listening:
        c = await listening.connect()
        pid = (await c.call(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60000,
                                     "producer_id": -1, "producer_epoch": -1})).producer_id
        assert partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid, 0, 2)))).base_offset == 0
        # The next produce is appended, but its answer never reaches the client: the
        # connection breaks before it reads it.
        await c.send(apis.PRODUCE, 9, 8, produce_values(idempotent_batch(pid, 2, 3)))
        await asyncio.sleep(0.2)
        c.close()
        assert listening.rm.partitions[TP].log.log_end_offset == 5
        # The producer retries the same batch (same sequence) on a new connection.
        c = await listening.connect()
        retry = partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid, 2, 3))))
        assert (retry.error_code, retry.base_offset) == (0, 2)
        gap = partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid, 9))))
        assert gap.error_code == pb.OUT_OF_ORDER_SEQUENCE_NUMBER
        unknown = partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid + 1, 4))))
        assert unknown.error_code == pb.UNKNOWN_PRODUCER_ID
        bumped = partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid, 0, epoch=1))))
        old = partition_answer(await c.call(apis.PRODUCE, 9, produce_values(
            idempotent_batch(pid, 5, epoch=0))))
        assert (bumped.base_offset, old.error_code) == (5, pb.INVALID_PRODUCER_EPOCH)
        fetched = await c.call(apis.FETCH, 12, fetch_values(0))
        [[data]] = [t.partitions for t in fetched.responses]
        batches = [(h.base_offset, h.base_sequence) for _, h in iter_batches(bytes(data.records))]
        assert batches == [(0, 0), (2, 2), (5, 0)]  # the retried batch once
        c.close()
