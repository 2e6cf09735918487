"""The broker's marker sender (broker/txn/marker_sender.py): markers for partitions led
here go to the local writer; others over the leader's INTERNAL gRPC with the broker's
call metadata (SASL credentials); answers come back per marker, per partition. Also the
log's rule that only the coordinator's own transactional batch may lack a sequence."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from tidewater.broker.serving.txn_markers import (
    TxnMarkerEntry,
    TxnMarkerResult,
    markers_from_proto,
    results_to_proto,
)
from tidewater.broker.storage.producer_state import ProducerBatch, ProducerStateManager
from tidewater.broker.txn.marker_sender import LeaderMarkerSender, codes_by_marker
from tidewater.broker.txn.markers import TxnMarker
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvalidProducerEpochError, OutOfOrderSequenceError

pytestmark = pytest.mark.timeout(30)

MARKER = TxnMarker(producer_id=5, producer_epoch=2, committed=True, coordinator_epoch=3,
                   partitions=(("out", 0), ("out", 1)))


class LocalWriter:
    def __init__(self) -> None:
        self.calls: list[list[TxnMarkerEntry]] = []

    async def write_txn_markers(self, markers: Sequence[TxnMarkerEntry], *,
                                timeout_ms: int = 0) -> list[TxnMarkerResult]:
        self.calls.append(list(markers))
        return [TxnMarkerResult(m.producer_id, t, p, pb.NONE)
                for m in markers for t, p in m.partitions]


class LeaderControl(pb_grpc.BrokerControlServicer):
    """A remote leader: partition 1 moved away (NOT_LEADER_OR_FOLLOWER)."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.requests: list[pb.WriteTxnMarkersRequest] = []

    async def WriteTxnMarkers(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        self.requests.append(request)
        return results_to_proto([
            TxnMarkerResult(m.producer_id, t, p,
                            pb.NONE if p == 0 else pb.NOT_LEADER_OR_FOLLOWER)
            for m in markers_from_proto(request) for t, p in m.partitions])


async def _with_leader(body):
    server = grpc.aio.server()
    control = LeaderControl()
    pb_grpc.add_BrokerControlServicer_to_server(control, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await body(control, port)
    finally:
        await server.stop(0)


def test_markers_for_partitions_led_here_go_to_the_local_writer():
    async def run():
        local = LocalWriter()
        sender = LeaderMarkerSender(broker_id=1, local_writer=local, endpoint=lambda b: None,
                                    max_message_bytes=1 << 20)
        answer = await sender.write_markers(1, [MARKER])
        await sender.close()
        return local, answer
    local, answer = asyncio.run(run())
    assert answer == [{("out", 0): pb.NONE, ("out", 1): pb.NONE}]
    [[entry]] = local.calls
    assert (entry.producer_id, entry.producer_epoch, entry.coordinator_epoch,
            entry.committed) == (5, 2, 3, True)


def test_markers_for_another_leader_go_over_grpc_with_the_brokers_credentials():
    async def body(control: LeaderControl, port: int):
        local = LocalWriter()
        sender = LeaderMarkerSender(
            broker_id=1, local_writer=local,
            endpoint=lambda b: ("127.0.0.1", port) if b == 2 else None,
            max_message_bytes=1 << 20, call_metadata=(("sasl-user", "broker"),))
        try:
            answer = await sender.write_markers(2, [MARKER])
            with pytest.raises(Exception, match="no INTERNAL endpoint"):
                await sender.write_markers(3, [MARKER])
        finally:
            await sender.close()
        return local, answer
    control_holder: list[LeaderControl] = []

    async def run():
        async def wrapped(control, port):
            control_holder.append(control)
            return await body(control, port)
        return await _with_leader(wrapped)
    local, answer = asyncio.run(run())
    [control] = control_holder
    assert local.calls == []
    assert answer == [{("out", 0): pb.NONE, ("out", 1): pb.NOT_LEADER_OR_FOLLOWER}]
    [request] = control.requests
    assert [(p.topic, p.partition) for p in request.markers[0].partitions] == [
        ("out", 0), ("out", 1)]
    assert control.metadata[0].get("sasl-user") == "broker"


def test_a_short_or_misordered_answer_leaves_partitions_unanswered_for_a_retry():
    entries = [TxnMarkerEntry(5, 2, 3, True, (("out", 0), ("out", 1)))]
    assert codes_by_marker(entries, [TxnMarkerResult(5, "out", 0, pb.NONE)]) == [
        {("out", 0): pb.NONE}]
    assert codes_by_marker(entries, [TxnMarkerResult(5, "out", 1, pb.NONE)]) == [{}]


def test_only_the_coordinators_transactional_batch_may_lack_a_sequence():
    state = ProducerStateManager()
    batch = ProducerBatch(9, 1, -1, 0, is_transactional=True)
    with pytest.raises(OutOfOrderSequenceError):
        state.check_leader_append([batch])
    assert state.check_leader_append([batch], coordinator_origin=True) is None
    with pytest.raises(OutOfOrderSequenceError):  # not transactional: no exemption
        state.check_leader_append([ProducerBatch(9, 1, -1, 0)], coordinator_origin=True)
    state.on_batch(9, 1, -1, 10, 10, 0, is_transactional=True)
    assert state.first_unstable_offset == 10
    with pytest.raises(InvalidProducerEpochError):
        state.check_leader_append([ProducerBatch(9, 0, -1, 0, is_transactional=True)],
                                  coordinator_origin=True)
