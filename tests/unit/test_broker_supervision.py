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
from tests.unit.test_kafka_listener import API_VERSIONS_V3, Listening
from tidewater.broker import __main__ as broker_main
from tidewater.broker.config import BrokerConfig
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.server import KafkaListener
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


def test_a_supervisor_without_a_fatal_path_cannot_be_made():
    """An unwired supervisor would let tasks die in silence: there is no default."""
    with pytest.raises(TypeError):
        TaskSupervisor()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        TaskSupervisor(on_fatal=None)  # type: ignore[arg-type]


async def test_an_invariant_violation_in_a_loop_callback_is_fatal(caplog):
    """A timer or done-callback runs in no task: asyncio would only log what it raises."""
    failures = []
    supervisor = TaskSupervisor(on_fatal=failures.append, process="controller")
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    supervisor.watch_callbacks(loop)

    def other_bug():
        raise RuntimeError("not an invariant")

    def broken_invariant():
        raise InvariantViolation("an acks=all wait outlived its leadership")
    with caplog.at_level(logging.ERROR):
        loop.call_soon(other_bug)
        await asyncio.sleep(0.01)
        assert failures == []  # logged by the handler there was, as before
        assert any("not an invariant" in repr(r.exc_info) for r in caplog.records)
        loop.call_later(0.001, broken_invariant)
        await asyncio.sleep(0.05)
    assert [str(e) for e in failures] == ["an acks=all wait outlived its leadership"]
    assert any("stopping the controller after" in r.getMessage() for r in caplog.records)
    await supervisor.stop()
    assert loop.get_exception_handler() is before


async def test_an_invariant_broken_in_a_kafka_answer_stops_the_broker_unanswered(
        tmp_path, monkeypatch):
    async def api_versions(services, head, body):
        async def answer():
            raise InvariantViolation("a fetch session served past the HW")
        return answer()
    monkeypatch.setitem(apis.HANDLERS, apis.API_VERSIONS, api_versions)
    async with Listening(tmp_path) as listening:
        failures = []
        listening.rm.supervisor.on_fatal = failures.append
        c = await listening.connect()
        await c.send(apis.API_VERSIONS, 3, 7, API_VERSIONS_V3)
        assert await c.closed_by_server()  # no answer, not even an error code
        c.close()
        assert [str(e) for e in failures] == ["a fetch session served past the HW"]


async def test_a_kafka_connection_task_that_fails_is_logged_not_lost(tmp_path, monkeypatch,
                                                                     caplog):
    """Its failure is the connection's (closed; the broker serves on), but it is logged."""
    async def broken_reader(self, reader, answers, peer, connection, mute):
        raise RuntimeError("a bug in the request loop")
    monkeypatch.setattr(KafkaListener, "_read_requests", broken_reader)
    async with Listening(tmp_path) as listening:
        with caplog.at_level(logging.ERROR, logger="tidewater.broker.kafka"):
            c = await listening.connect()
            assert await c.closed_by_server()
            c.close()
            await asyncio.sleep(0.05)
        assert listening.rm.supervisor.failure is None
    failed = [r for r in caplog.records if "a connection's task failed" in r.getMessage()]
    assert failed and "a bug in the request loop" in repr(failed[0].exc_info)


async def test_a_kafka_writer_that_dies_closes_its_connection(tmp_path, monkeypatch, caplog):
    """Else the reader would go on taking requests nobody answers, until it blocks."""
    async def broken_writer(self, answers, writer, peer, connection, mute):
        raise RuntimeError("a bug in the answer loop")
    monkeypatch.setattr(KafkaListener, "_send_answers", broken_writer)
    async with Listening(tmp_path) as listening:
        with caplog.at_level(logging.ERROR, logger="tidewater.broker.kafka"):
            c = await listening.connect()
            await c.send(apis.API_VERSIONS, 3, 7, API_VERSIONS_V3)
            assert await c.closed_by_server()
            c.close()
            await asyncio.sleep(0.05)
    failed = [r for r in caplog.records if "a connection's task failed" in r.getMessage()]
    assert failed and "a bug in the answer loop" in repr(failed[0].exc_info)
