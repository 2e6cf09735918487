"""``python -m broker`` / ``tide-broker``: run one broker until SIGTERM or SIGINT.

Exit codes: 0 after a clean shutdown, 2 for a bad flag or ``--set`` value
(one line on stderr), 1 when start-up fails (the port is taken, a corrupt file in
the data dir such as partition.metadata), 70
(EX_SOFTWARE) when a background task died or an invariant broke (the cause
is logged at CRITICAL and printed on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys

import uvloop

from tidewater.broker.config import BrokerConfig, ConfigError, config_from_args
from tidewater.proto import grpc_env
from tidewater.proto.errors import TidewaterError

# Before anything imports grpc (broker.process does, in main): proto/grpc_env.py.
grpc_env.apply()


EXIT_FATAL = 70
# The longest the collector stays off after start() returns, waiting for the broker to
# serve (``tune_gc_once_serving``).
GC_TUNE_WAIT_S_MAX = 10.0


def import_kafka_types_without_hypothesis() -> None:
    """Import kio (the Kafka protocol's types) with hypothesis hidden from it.

    kio imports ``hypothesis.strategies`` whenever it is installed (a dev venv has it)
    to register strategies for its types; hypothesis brings trio, pytest, attrs and
    pygments along: about 40% of the broker's import time measured on a dev venv
    (``python -X importtime``), for nothing a broker uses. A ``None`` in ``sys.modules``
    makes that import fail as if hypothesis were absent (kio catches ImportError); it
    is removed again at once, so a test process that imports hypothesis later gets it.
    Nothing is hidden when hypothesis or kio is loaded already.
    """
    if "hypothesis" in sys.modules or "kio" in sys.modules:
        return
    sys.modules["hypothesis"] = None  # type: ignore[assignment]
    try:
        import kio.static._phantom  # noqa: F401  (the module that asks for hypothesis)
    finally:
        del sys.modules["hypothesis"]


def tune_gc() -> None:
    """After start-up: move everything alive now (modules, config, loaded logs) out of the
    collector's sight, so the full collections that still happen walk only what came later,
    and turn the collector back on (``main`` turns it off for the start-up: the imports
    and the log loading make objects that live on, and collecting among them cost
    0.06-0.15 s of CPU of a 0.55-0.7 s import, measured on a loaded 2-core machine).

    The gen0 threshold stays CPython's (700): a collection's pause grows with the young
    objects it walks, and at 20,000 the single pauses measured 4-11 ms on a loaded
    2-core machine against 0.2 ms at the default, a tail cost for no gain.
    """
    gc.collect()
    gc.freeze()
    gc.enable()


async def tune_gc_once_serving(serving: asyncio.Event) -> None:
    """``tune_gc`` once the broker serves (``settled``: a moment after it serves, so
    that the first answers come first), or after ``GC_TUNE_WAIT_S_MAX`` without.

    Why wait: its full collection walks every object the start made (20-30 ms of CPU
    with 60 logs, measured with py-spy on a 2-core machine) and ran as soon as
    ``start`` returned, i.e. before the registration and the LeaderAndIsr that make the
    broker serve, on the one thread they run on (issue 30, restart time). Why a limit:
    a broker that cannot reach its controller should not keep the collector off.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(GC_TUNE_WAIT_S_MAX):
            await serving.wait()
    tune_gc()


async def _serve(config: BrokerConfig) -> int:
    from tidewater.broker.process import BrokerProcess

    process = BrokerProcess(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await process.start()
    except (OSError, TidewaterError) as e:  # a taken port; a corrupt file in the data dir
        print(f"tide-broker: cannot start: {e}", file=sys.stderr)
        await process.shutdown()
        return 1
    gc_tuned = asyncio.ensure_future(tune_gc_once_serving(process.settled))
    # Not background tasks: two waits on events, awaited at once and cancelled after.
    stopped = asyncio.ensure_future(stop.wait())
    fatal = asyncio.ensure_future(process.fatal.wait())
    await asyncio.wait({stopped, fatal}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    fatal.cancel()
    gc_tuned.cancel()  # stopped before serving: main's finally turns the collector on
    await process.shutdown()
    if process.supervisor.failure is not None:
        print(f"tide-broker: stopped after a fatal error: {process.supervisor.failure!r}",
              file=sys.stderr)
        return EXIT_FATAL
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        config = config_from_args(argv)
    except ConfigError as e:
        print(f"tide-broker: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level, stream=sys.stderr,
        format=f"%(asctime)s broker-{config.broker_id} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    gc.disable()  # until tune_gc, once serving
    try:
        import_kafka_types_without_hypothesis()  # before broker.process imports the codec
        return uvloop.run(_serve(config))
    finally:
        gc.enable()


if __name__ == "__main__":
    sys.exit(main())
