"""Every background task of the broker is supervised; a broken invariant fails loudly.

A task that dies (not one that is cancelled) stops the broker with a CRITICAL line
and exit code 70, and an InvariantViolation reaching a request boundary does the same
instead of being answered UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from tests.unit.test_broker_replica_manager import make_manager, serve
from tidewater.broker import __main__ as broker_main
from tidewater.broker.config import BrokerConfig
from tidewater.broker.process import BrokerProcess
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(60)


async def test_a_task_that_dies_is_fatal_and_a_cancelled_one_is_not(caplog):
    failures = []
    supervisor = TaskSupervisor(on_fatal=failures.append)

    async def forever():
        await asyncio.sleep(3600)

    async def dies():
        raise RuntimeError("boom")

    cancelled = supervisor.spawn(forever(), "forever")
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert failures == [] and supervisor.failure is None
    with caplog.at_level(logging.CRITICAL, logger="tidewater.supervisor"):
        died = supervisor.spawn(dies(), "dies")
        await asyncio.gather(died, return_exceptions=True)
        await asyncio.sleep(0)
    assert [str(e) for e in failures] == ["boom"]
    assert any("background task dies died" in r.getMessage() for r in caplog.records)
    supervisor.spawn(dies(), "again")  # a second death: on_fatal is called once
    await asyncio.sleep(0.01)
    assert len(failures) == 1
    await supervisor.stop()
    assert supervisor.running == 0


async def test_the_broker_exits_70_when_a_background_task_dies(tmp_path, monkeypatch, caplog):
    original_start = BrokerProcess.start

    async def start_then_lose_a_task(self):
        await original_start(self)

        async def checkpoint_bug():
            await asyncio.sleep(0.05)
            raise RuntimeError("a bug in a background loop")
        self.supervisor.spawn(checkpoint_bug(), "checkpoint-bug")

    monkeypatch.setattr(BrokerProcess, "start", start_then_lose_a_task)
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("127.0.0.1", 1),
                          data_dir=tmp_path / "broker")
    with caplog.at_level(logging.CRITICAL):
        code = await asyncio.wait_for(broker_main._serve(config), 30)
    assert code == broker_main.EXIT_FATAL == 70
    assert any("checkpoint-bug died" in r.getMessage() for r in caplog.records)
    # It shut down on its way out: the clean-shutdown marker is written.
    assert (tmp_path / "broker" / ".kafka_cleanshutdown").exists()


async def test_an_invariant_violation_at_a_request_boundary_stops_the_broker(tmp_path):
    rm, _ = make_manager(tmp_path)
    failures = []
    rm.supervisor.on_fatal = failures.append

    async def broken_fetch(request):
        raise InvariantViolation("a leader's LEO went back")
    rm.fetch = broken_fetch
    server, port = await serve(rm)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.BrokerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Fetch(pb.FetchRequest(replica_id=-1), timeout=5)
            assert refused.value.code() == grpc.StatusCode.INTERNAL
            assert "invariant broken" in refused.value.details()
            # Not answered as UNKNOWN_SERVER_ERROR on a stream either.
            call = stub.FetchStream()
            await call.write(pb.FetchRequest(replica_id=-1))
            with pytest.raises(grpc.aio.AioRpcError) as stream_refused:
                await call.read()
            assert stream_refused.value.code() == grpc.StatusCode.INTERNAL
        assert [str(e) for e in failures] == ["a leader's LEO went back"]
    finally:
        await server.stop(0)
        await rm.stop()
