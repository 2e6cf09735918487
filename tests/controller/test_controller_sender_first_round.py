"""A new sender's first round, the broker's full resync, goes without the debounce (issue 30:
a restarted broker serves only once its LeaderAndIsr arrives); later rounds still wait
``controller.sender.debounce.ms`` to gather a burst of changes into one request."""

from __future__ import annotations

import asyncio

from controller_process import FakeBroker, InProcessController, eventually

from tidewater.proto import tidewater_pb2 as pb

LONG_DEBOUNCE = "controller.sender.debounce.ms=600000"  # longer than any test waits


async def test_the_first_round_is_not_debounced(tmp_path):
    async with InProcessController(tmp_path / "controller", [LONG_DEBOUNCE]) as controller:
        broker = FakeBroker(1, controller.address)
        await broker.start()
        try:
            assert await eventually(lambda: broker.update_metadata)  # the resync, at once
            created = await controller.stub.CreateTopics(pb.CreateTopicsRequest(
                topics=[pb.CreatableTopic(name="t", num_partitions=1, replication_factor=1)],
                timeout_ms=100), timeout=10)
            assert created.topics[0].error_code in (pb.NONE, pb.REQUEST_TIMED_OUT)
            await asyncio.sleep(0.3)
            assert not broker.leader_and_isr  # the next round waits for its debounce
        finally:
            await broker.stop()
