"""A broker refusing a partition of a LeaderAndIsr is logged at ERROR and counted (issue 14,
bug 7: the controller used to log it at INFO only, and nobody saw the topic was not hosted)."""

from __future__ import annotations

import logging

from controller_process import FakeBroker, InProcessController, eventually

from tidewater.proto import tidewater_pb2 as pb


async def test_a_refused_partition_is_an_error_line_and_a_metric(tmp_path, caplog):
    async with InProcessController(tmp_path / "controller") as controller:
        broker = FakeBroker(1, controller.address)
        broker.refuse_partitions_with = pb.INVALID_CONFIG
        await broker.start()
        try:
            with caplog.at_level(logging.ERROR, logger="tidewater.controller.sender"):
                created = await controller.stub.CreateTopics(pb.CreateTopicsRequest(
                    topics=[pb.CreatableTopic(name="t", num_partitions=2, replication_factor=1)],
                    timeout_ms=5000), timeout=10)
                assert created.topics[0].error_code == pb.NONE

                def refused_count():
                    return controller.server.metrics.registry.get_sample_value(
                        "tidewater_controller_broker_partition_errors_total",
                        {"request": "LeaderAndIsr", "error": "INVALID_CONFIG"})
                assert await eventually(lambda: refused_count() == 2)
            lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert any("broker 1 refused LeaderAndIsr for t-0: INVALID_CONFIG" in line
                       for line in lines), lines
        finally:
            await broker.stop()
