"""proto.grpc_env: the broker, the controller and ``tide`` turn gRPC's EventEngine I/O
threads off for their process (one thread hand-off less per message), unless the
environment already says otherwise; importing the client library changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.proto import grpc_env

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
@pytest.mark.parametrize("package", ["tidewater.broker.__main__", "tidewater.controller", "tidewater.tools.cli"])
def test_tidewater_programs_take_the_event_engine_off_the_message_path(package):
    value, switches_per_round_trip = run_echo(package, None)
    assert value == repr(grpc_env.GRPC_EXPERIMENTS)
    assert switches_per_round_trip < 1


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_value_already_set_is_kept_and_grpc_defaults_return():
    value, switches_per_round_trip = run_echo("tidewater.tools.cli", "")
    assert value == "''"
    assert switches_per_round_trip > 2  # gRPC's own EventEngine threads carry the messages


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_importing_the_client_library_changes_nothing_process_wide():
    value, switches_per_round_trip = run_echo("client.producer, client.consumer", None)
    assert value == "None"
    assert switches_per_round_trip > 2


def test_apply_keeps_an_existing_value(monkeypatch):
    monkeypatch.setenv("GRPC_EXPERIMENTS", "-something_else")
    monkeypatch.setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "")
    grpc_env.apply()
    assert os.environ["GRPC_EXPERIMENTS"] == "-something_else"
    assert os.environ["GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS"] == ""
    monkeypatch.delenv("GRPC_EXPERIMENTS")
    monkeypatch.delenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS")
    grpc_env.apply()
    assert os.environ["GRPC_EXPERIMENTS"] == grpc_env.GRPC_EXPERIMENTS
    assert os.environ["GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS"] == str(
        grpc_env.BACKUP_POLL_INTERVAL_MS)


# A sync channel (the clients' unary calls) to a port nobody listens on yet; a server
# starts there after the first failed call; the client calls until one is answered.
RECONNECT = """
import socket, subprocess, sys, time
from tidewater.proto import grpc_env
grpc_env.apply()
import grpc
from tidewater.client.metadata import CHANNEL_OPTIONS

probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
call = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS).unary_unary("/t.E/S")
try:
    call(b"", timeout=0.5)
except grpc.RpcError:
    pass
server = subprocess.Popen([sys.executable, "-c",
    "import grpc, time; from concurrent.futures import ThreadPoolExecutor; "
    f"s = grpc.server(ThreadPoolExecutor(1)); s.add_insecure_port('127.0.0.1:{port}'); "
    "s.start(); print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
try:
    server.stdout.readline()
    listening = time.monotonic()
    while True:
        try:
            call(b"", timeout=1.0)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                break  # answered: the server is reached
        time.sleep(0.05)
    print(time.monotonic() - listening)
finally:
    server.kill()
"""


def test_a_sync_client_reaches_a_restarted_server_without_waiting_for_the_backup_poller():
    # gRPC's backup poller runs every 5 s by default; with the older I/O manager a sync
    # channel waited for it (~4.7 s) to reconnect. BACKUP_POLL_INTERVAL_MS brings it
    # back to a fraction of a second; 3 s leaves a loaded machine plenty of room.
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRPC_EXPERIMENTS", "GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS")}
    out = subprocess.run([sys.executable, "-c", RECONNECT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert float(out.split()[-1]) < 3.0
