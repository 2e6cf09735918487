"""broker/process.py: the work that waits for the broker to serve (the coordinators' build,
the log cleaner, /metrics, __main__'s gc pass) starts ``SETTLE_AFTER_SERVING_S`` after it
serves, so the first answers after serving come before it (issue 30, restart time)."""

from __future__ import annotations

import asyncio
import types

from tidewater.broker import process
from tidewater.broker.process import BrokerProcess


def test_settled_comes_a_moment_after_serving_and_the_build_after_it(monkeypatch) -> None:
    monkeypatch.setattr(process, "SETTLE_AFTER_SERVING_S", 0.05)
    built: list[bool] = []
    cleaner_made: list[tuple[bool, list[bool]]] = []

    async def scenario() -> None:
        broker = BrokerProcess.__new__(BrokerProcess)
        broker.config = types.SimpleNamespace(broker_id=1)
        broker.metadata_cache = types.SimpleNamespace(endpoint=lambda broker_id: ("h", 1))
        broker.serving, broker.settled = asyncio.Event(), asyncio.Event()
        broker.coordinators = types.SimpleNamespace(
            ensure_built=lambda: built.append(broker.settled.is_set()))

        async def make_cleaner() -> None:  # after the build, once settled
            cleaner_made.append((broker.settled.is_set(), list(built)))

        broker.replica_manager = types.SimpleNamespace(
            background=types.SimpleNamespace(make_cleaner=make_cleaner))
        channel = types.SimpleNamespace(is_fenced=False)
        task = asyncio.ensure_future(broker._build_coordinators_once_serving(channel))
        await asyncio.wait_for(broker.serving.wait(), 5)
        assert not broker.settled.is_set() and built == []
        await asyncio.wait_for(task, 5)
        assert broker.settled.is_set() and built == [True]
        assert cleaner_made == [(True, [True])]

    asyncio.run(scenario())
