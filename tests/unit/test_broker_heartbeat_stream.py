"""ControllerChannel's BrokerHeartbeats stream against an in-process fake controller."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
import pytest

from tidewater.broker.controller_link.channel import ControllerChannel
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


class StreamController(pb_grpc.ControllerServicer):
    def __init__(self):
        self.epoch = 10
        self.streams: list[list[pb.BrokerHeartbeatRequest]] = []
        self.endings: list[str] = []  # per finished stream: "half-closed" or "cancelled"

    async def RegisterBroker(self, request, context):
        self.epoch += 1
        return pb.RegisterBrokerResponse(error_code=pb.NONE, broker_epoch=self.epoch)

    async def BrokerHeartbeats(self, request_iterator, context):
        seen: list[pb.BrokerHeartbeatRequest] = []
        self.streams.append(seen)
        try:
            async for request in request_iterator:
                seen.append(request)
                await context.write(pb.BrokerHeartbeatResponse(
                    error_code=pb.NONE, should_shutdown=request.want_shutdown))
            self.endings.append("half-closed")
        except asyncio.CancelledError:
            self.endings.append("cancelled")
            raise


async def serve(fake, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def channel_to(port: int) -> ControllerChannel:
    return ControllerChannel(broker_id=1, controller_address=("127.0.0.1", port),
                             listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=1)],
                             heartbeat_interval_ms=20, session_timeout_ms=200)


async def until(predicate, timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.01)


async def test_heartbeats_ride_one_stream_and_a_finished_shutdown_half_closes_it():
    fake = StreamController()
    server, port = await serve(fake)
    channel = channel_to(port)
    try:
        await channel.register()
        beats = asyncio.create_task(channel.run_heartbeats())
        await until(lambda: fake.streams and len(fake.streams[0]) >= 5)
        assert len(fake.streams) == 1
        assert all(r.broker_epoch == 11 and not r.want_shutdown for r in fake.streams[0])

        assert await channel.controlled_shutdown(2000) is True
        await until(lambda: fake.endings)
        assert fake.endings == ["half-closed"]  # not a crash: the controller must not fence
        assert fake.streams[0][-1].want_shutdown
        await asyncio.wait_for(beats, 5)  # heartbeats stop after should_shutdown
        assert len(fake.streams) == 1
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_broken_stream_is_reopened_when_the_controller_is_back():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = StreamController()
    server, _ = await serve(first, port)
    channel = channel_to(port)
    beats = None
    try:
        await channel.register()
        beats = asyncio.create_task(channel.run_heartbeats())
        await until(lambda: first.streams and first.streams[0])
        await server.stop(0)  # the controller restarts
        second = StreamController()
        server, _ = await serve(second, port)
        await until(lambda: second.streams and len(second.streams[-1]) >= 3)
        assert not beats.done()
        assert all(r.broker_epoch == 11 for r in second.streams[-1])  # same epoch carries on
    finally:
        if beats is not None:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
        await channel.close()
        await server.stop(0)


class StreamlessController(StreamController):
    """Not a controller of this release: the stream is UNIMPLEMENTED. (The generated base
    sets UNIMPLEMENTED and then raises, which grpc's aio server at times answers INTERNAL
    on a stream: aborting says it the one way.)"""

    async def BrokerHeartbeats(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


async def test_a_controller_without_the_stream_is_an_error_not_a_fallback(caplog):
    caplog.set_level(logging.INFO, logger="tidewater.broker.controller_link.channel")
    fake = StreamlessController()
    server, port = await serve(fake)
    channel = channel_to(port)
    try:
        await channel.register()
        for _ in range(3):  # each heartbeat tries the stream again; none is answered
            assert await asyncio.wait_for(channel.heartbeat(), 10) is None
        errors = [r.getMessage() for r in caplog.records
                  if r.name == "tidewater.broker.controller_link.channel" and r.levelno == logging.ERROR]
        assert len(errors) == 1  # once in a row, not per heartbeat
        assert "UNSUPPORTED_VERSION" in errors[0] and "does not implement BrokerHeartbeats" in errors[0]
        assert not fake.streams
        assert await channel.controlled_shutdown(300) is False  # no way to ask it
    finally:
        await channel.close()
        await server.stop(0)
