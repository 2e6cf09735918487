"""Producer id blocks (AllocateProducerIds, Kafka's KIP-730): each block is in the
metadata log before it is handed out, so no id is given twice, across restarts,
compaction and a failed write."""

import asyncio

import grpc
import pytest
from controller_harness import Harness
from controller_process import ControllerProcess, FakeBroker
from test_controller_durability import FullDisk

from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.owner import OwnerStoppedError
from tidewater.controller.state_machine import PRODUCER_ID_BLOCK_SIZE
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    yield harness
    harness.log.close()


def allocate(h, broker_id, *, epoch=None, token=None):
    return h.run(h.machine.allocate_producer_ids, pb.AllocateProducerIdsRequest(
        broker_id=broker_id, broker_epoch=h.epochs[broker_id] if epoch is None else epoch,
        control_token=h.token(broker_id) if token is None else token))


def block(response):
    assert response.error_code == pb.NONE
    return range(response.producer_id_start,
                 response.producer_id_start + response.producer_id_len)


def test_blocks_never_overlap_also_after_a_restart_and_compaction(h):
    h.register(1)
    h.register(2)
    given = [block(allocate(h, 1)), block(allocate(h, 2)), block(allocate(h, 1))]
    assert [len(b) for b in given] == [PRODUCER_ID_BLOCK_SIZE] * 3
    h2 = h.restart()
    h2.epochs = dict(h.epochs)
    given += [block(allocate(h2, 1)) for _ in range(20)]
    assert h2.owner.maybe_compact(0)  # the snapshot keeps next_producer_id
    h3 = h2.restart()
    h3.epochs = dict(h.epochs)
    given.append(block(allocate(h3, 2)))
    ids = [i for b in given for i in b]
    assert len(ids) == len(set(ids)) and min(ids) == 0
    h3.log.close()


def test_a_stale_or_unauthenticated_broker_gets_no_block_and_nothing_is_written(h):
    h.register(1)
    before = h.log.next_offset
    assert allocate(h, 1, epoch=h.epochs[1] + 99).error_code == pb.STALE_BROKER_EPOCH
    assert allocate(h, 1, token=b"\0" * 16).error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    assert h.log.next_offset == before and h.metadata.next_producer_id == 0


async def test_a_failed_metadata_write_hands_out_no_block(tmp_path):
    h = Harness(tmp_path / "ctl")
    h.register(1)
    first = block(allocate(h, 1))
    task = asyncio.get_running_loop().create_task(h.owner.run())
    h.log._file = FullDisk(h.log._file)
    with pytest.raises(OwnerStoppedError):  # the caller never sees a block
        await h.owner.submit(lambda tx, now: h.machine.allocate_producer_ids(
            tx, now, pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=h.epochs[1],
                                                   control_token=h.token(1))))
    with pytest.raises(Exception):  # noqa: B017 - the owner stops (ImageAheadOfDiskError)
        await task
    assert len(h.fatal) == 1
    h.log._file = h.log._file._file
    h.log.close()
    log = MetadataLog.open(tmp_path / "ctl")
    nexts = [r["next_producer_id"] for _, r in log.recovered_records()
             if r["type"] == "producer_ids"]
    log.close()
    assert nexts == [first.stop]  # the failed block is not in the log
    h2 = Harness(tmp_path / "ctl")
    h2.epochs = dict(h.epochs)
    assert block(allocate(h2, 1)).start == first.stop
    h2.log.close()


@pytest.mark.integration
async def test_blocks_over_grpc_survive_a_controller_sigkill(tmp_path):
    controller = ControllerProcess(tmp_path / "controller").start()
    channel = grpc.aio.insecure_channel(controller.address)
    stub = pb_grpc.ControllerStub(channel)
    broker = await FakeBroker(1, controller.address).start()
    try:
        def request():
            return pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=broker.broker_epoch,
                                                 control_token=broker.control_token)
        first = block(await stub.AllocateProducerIds(request(), timeout=5))
        controller.stop()  # SIGKILL
        controller = ControllerProcess(tmp_path / "controller", port=controller.port).start()
        second = await stub.AllocateProducerIds(request(), timeout=10, wait_for_ready=True)
        assert block(second).start >= first.stop
    finally:
        await broker.stop()
        await channel.close()
        controller.stop()
