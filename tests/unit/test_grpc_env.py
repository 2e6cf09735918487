"""proto.grpc_env: importing a Tidewater package turns gRPC's EventEngine I/O threads
off for the process (one thread hand-off less per message), unless the environment
already says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proto import grpc_env

ROOT = Path(__file__).resolve().parents[2]

# Echo 300 messages on a grpc.aio stream inside one process and count the context
# switches of gRPC's "event_engine" threads per round trip: ~7 when they do the socket
# I/O, ~0 when the completion queue's poller does it.
ECHO = """
import os, sys, asyncio
import {package}
import grpc

def event_engine_switches():
    n = 0
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{{t}}/comm") as f:
            if f.read().strip() != "event_engine":
                continue
        with open(f"/proc/self/task/{{t}}/status") as f:
            n += sum(int(l.split()[1]) for l in f if "ctxt_switches" in l)
    return n

async def main():
    async def echo(requests, context):
        async for m in requests:
            yield m
    handler = grpc.method_handlers_generic_handler(
        "t.Echo", {{"S": grpc.stream_stream_rpc_method_handler(echo)}})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{{port}}") as channel:
        call = channel.stream_stream("/t.Echo/S")()
        await call.write(b"x"); await call.read()
        before = event_engine_switches()
        for _ in range(300):
            await call.write(b"x"); await call.read()
        print(repr(os.environ.get("GRPC_EXPERIMENTS")), (event_engine_switches() - before) / 300)
    await server.stop(None)

asyncio.run(main())
"""


def run_echo(package: str, env_value: str | None) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    out = subprocess.run([sys.executable, "-c", ECHO.format(package=package)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("package", ["broker", "controller", "client"])
def test_importing_a_package_takes_the_event_engine_off_the_message_path(package):
    value, switches_per_round_trip = run_echo(package, None)
    assert value == repr(grpc_env.GRPC_EXPERIMENTS)
    assert switches_per_round_trip < 1


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_value_already_set_is_kept_and_grpc_defaults_return():
    value, switches_per_round_trip = run_echo("client", "")
    assert value == "''"
    assert switches_per_round_trip > 2  # gRPC's own EventEngine threads carry the messages


def test_apply_keeps_an_existing_value(monkeypatch):
    monkeypatch.setenv("GRPC_EXPERIMENTS", "-something_else")
    grpc_env.apply()
    assert os.environ["GRPC_EXPERIMENTS"] == "-something_else"
    monkeypatch.delenv("GRPC_EXPERIMENTS")
    grpc_env.apply()
    assert os.environ["GRPC_EXPERIMENTS"] == grpc_env.GRPC_EXPERIMENTS
