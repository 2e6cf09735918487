"""A controller's timers ride out a command whose records did not commit in time (a
slow quorum under load): the session check and the preferred-leader election run again
at their next tick instead of ending, which the task supervisor would have taken as
fatal and stopped the active controller for."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tidewater.controller.owner import OwnerStoppedError
from tidewater.controller.server import ControllerServer
from tidewater.proto.errors import RequestTimedOutError

pytestmark = pytest.mark.timeout(30)


class SlowQuorumOwner:
    """``submit`` raises RequestTimedOutError the first ``timeouts`` times, then runs the
    command ``runs`` times, then is stopped."""

    def __init__(self, timeouts: int, runs: int) -> None:
        self.timeouts, self.runs, self.calls = timeouts, runs, 0

    async def submit(self, command):
        self.calls += 1
        if self.timeouts:
            self.timeouts -= 1
            raise RequestTimedOutError("not committed within 2000 ms")
        if self.runs:
            self.runs -= 1
            return command(None, 0)
        raise OwnerStoppedError("the controller is shutting down")


def server_like(owner: SlowQuorumOwner) -> SimpleNamespace:
    return SimpleNamespace(
        owner=owner, _stopping=False,
        config=SimpleNamespace(broker_session_timeout_ms=10,
                               leader_imbalance_check_interval_seconds=0.001),
        machine=SimpleNamespace(check_sessions=lambda tx, now: [],
                                preferred_leader_check=lambda tx, now: 0),
        metrics=None)


@pytest.mark.parametrize("timer", ["_session_timer", "_preferred_leader_timer"])
async def test_a_timer_goes_on_after_a_commit_timeout(timer):
    owner = SlowQuorumOwner(timeouts=2, runs=1)
    await asyncio.wait_for(getattr(ControllerServer, timer)(server_like(owner)), 10)
    assert owner.calls == 4  # two timeouts ridden out, one run, then the stop ends it
