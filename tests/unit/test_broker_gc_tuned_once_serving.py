"""broker/__main__.py: the start-up's full collection and freeze (``tune_gc``) wait until
the broker serves, or a bounded time without (issue 30, restart time)."""

from __future__ import annotations

import asyncio

import tidewater.broker.__main__ as main


def test_tune_gc_waits_for_serving(monkeypatch) -> None:
    tuned: list[int] = []
    monkeypatch.setattr(main, "tune_gc", lambda: tuned.append(1))

    async def scenario() -> None:
        serving = asyncio.Event()
        task = asyncio.ensure_future(main.tune_gc_once_serving(serving))
        for _ in range(5):
            await asyncio.sleep(0)
        assert tuned == [] and not task.done()
        serving.set()
        await asyncio.wait_for(task, 5)
        assert tuned == [1]

    asyncio.run(scenario())


def test_tune_gc_runs_after_the_limit_without_serving(monkeypatch) -> None:
    tuned: list[int] = []
    monkeypatch.setattr(main, "tune_gc", lambda: tuned.append(1))
    monkeypatch.setattr(main, "GC_TUNE_WAIT_S_MAX", 0.01)

    async def scenario() -> None:
        await asyncio.wait_for(main.tune_gc_once_serving(asyncio.Event()), 5)

    asyncio.run(scenario())
    assert tuned == [1]


def test_cancelled_before_serving_tunes_nothing(monkeypatch) -> None:
    tuned: list[int] = []
    monkeypatch.setattr(main, "tune_gc", lambda: tuned.append(1))

    async def scenario() -> None:
        task = asyncio.ensure_future(main.tune_gc_once_serving(asyncio.Event()))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    asyncio.run(scenario())
    assert tuned == []
