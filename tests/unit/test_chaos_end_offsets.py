"""The chaos run's end offsets after the healing (tools/chaos/runner.py): a broker not
answering in time, or a partition without a known leader, is asked again for a while
(a CI run's verdict once failed on one TLS handshake that timed out)."""

from __future__ import annotations

import io

import pytest

from tidewater.client.metadata import BrokerConnectionError, TopicPartition
from tidewater.proto.errors import InvalidRequestError, RequestTimedOutError
from tidewater.tools.chaos import runner
from tidewater.tools.chaos.runner import ChaosOptions, ChaosRun


class ScriptedConsumer:
    """``end_offsets`` answers from a script: an exception to raise, or offsets found."""

    def __init__(self, script):
        self.script = list(script)
        self.asked: list[list[int]] = []

    def end_offsets(self, tps):
        self.asked.append(sorted(tp.partition for tp in tps))
        step = self.script.pop(0) if self.script else {}
        if isinstance(step, Exception):
            raise step
        return {TopicPartition("chaos", p): off for p, off in step.items()
                if TopicPartition("chaos", p) in tps}


def chaos_run() -> ChaosRun:
    run = ChaosRun.__new__(ChaosRun)
    run.opt = ChaosOptions(log=io.StringIO())
    run.partitions = [0, 1, 2]
    return run


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)


def test_a_timed_out_handshake_and_a_missing_leader_are_asked_again():
    consumer = ScriptedConsumer([
        BrokerConnectionError("connection attempt timed out before receiving SETTINGS frame"),
        {0: 10, 2: 30},  # partition 1 has no leader known yet
        {1: 20},
    ])
    run = chaos_run()
    assert run.end_offsets(consumer) == {TopicPartition("chaos", p): off
                                         for p, off in ((0, 10), (1, 20), (2, 30))}
    assert consumer.asked == [[0, 1, 2], [0, 1, 2], [1]]
    assert "SETTINGS frame; retrying" in run.opt.log.getvalue()


def test_it_gives_up_at_the_deadline_and_at_once_on_a_fatal_error(monkeypatch):
    monkeypatch.setattr(runner, "FIRST_CALL_RETRY_S", 0.0)
    with pytest.raises(RequestTimedOutError, match=r"no leader answered for \[1\]"):
        chaos_run().end_offsets(ScriptedConsumer([{0: 1, 2: 3}]))
    monkeypatch.setattr(runner, "FIRST_CALL_RETRY_S", 60.0)
    consumer = ScriptedConsumer([InvalidRequestError("bad"), {0: 1, 1: 2, 2: 3}])
    with pytest.raises(InvalidRequestError):
        chaos_run().end_offsets(consumer)
    assert len(consumer.asked) == 1
