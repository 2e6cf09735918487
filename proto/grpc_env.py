"""gRPC core settings every Tidewater process makes before gRPC starts.

Why: since grpcio 1.6x, gRPC core does its socket I/O on its own EventEngine
threads by default. Under grpc.aio a message read then crosses three threads
(the EventEngine thread that reads the socket, grpc.aio's poller thread that
waits on the completion queue, the asyncio loop), and a write's completion
comes back the same way. With the EventEngine client and listener turned off,
gRPC's older I/O manager does the socket I/O in the thread that waits on the
completion queue (grpc.aio's poller), so one hand-off per message goes.

Measured on our 2-core machines (``bench/probes/transport_floor.py``, a grpc.aio
stream round trip, 5,000 one at a time): 288-369 µs p50 and 178-218 µs of
client CPU with the EventEngine, 167-177 µs and 109-132 µs without; at 1,000
acks=all records/s the whole cluster's context switches per replication round
fell from ~90 to ~45.

How: ``GRPC_EXPERIMENTS`` (gRPC's documented environment variable; "-name"
turns an experiment off), read by gRPC core once, when ``grpc`` is first
imported. So ``apply()`` runs in Tidewater's own programs before anything
imports ``grpc``: ``python -m broker`` / ``tide-broker`` (broker/__main__.py),
the controller package, ``tide`` (client/cli.py), the demo and the benchmarks
(bench/bench_common.py). Importing the client library changes nothing
process-wide: a program using it may call ``apply()`` itself, first. A
process that imported ``grpc`` earlier keeps gRPC's defaults, and child
processes inherit the variables.

The older I/O manager only makes progress on a connection while some thread
polls for it. A sync channel (the clients' unary calls, ``tide``) whose broker
was down fails its calls fast and polls nothing, so its reconnect waited for
gRPC's backup poller, every 5 s by default: a restarted broker was answered
~4.7 s after it listened, against 0.2 s with the EventEngine. So
``GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS`` (also gRPC's documented
variable) is set to ``BACKUP_POLL_INTERVAL_MS``: 0.2 s again, for ten timer
wake-ups a second per process.

Opting out: a value of either variable already in the environment is left as
it is (``GRPC_EXPERIMENTS= GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS=5000
tide-broker ...`` runs with gRPC's defaults; an empty backup interval makes gRPC
print an error line). A gRPC release without these experiments would print
"Unknown experiment" once per process and run with its defaults;
tests/unit/test_grpc_env.py then fails, which is the cue to look again.
"""

from __future__ import annotations

import os

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
BACKUP_POLL_INTERVAL_MS = 100


def apply() -> None:
    """Set both variables, each unless the environment already has it."""
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
    os.environ.setdefault("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", str(BACKUP_POLL_INTERVAL_MS))
