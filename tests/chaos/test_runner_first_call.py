"""The chaos run's first call (creating its topic) is retried for a while when the
cluster misses its deadline, then fails with the cluster's error (tools/chaos/runner.py)."""

from __future__ import annotations

import pytest

from tidewater.proto.errors import BrokerNotAvailableError
from tidewater.tools.chaos import runner
from tidewater.tools.chaos.runner import ChaosOptions, ChaosRun

pytestmark = pytest.mark.timeout(30)


class FakeCluster:
    def bootstrap(self) -> str:
        return "127.0.0.1:1"

    def client_security(self) -> dict:
        return {}


class FlakyAdmin:
    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0

    def create_topics(self, topics):
        self.calls += 1
        if self.calls <= self.failures:
            raise BrokerNotAvailableError("Handshake read failed")
        return {t.name: None for t in topics}


@pytest.fixture
def run(monkeypatch, tmp_path):
    clock = [0.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(runner.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(ChaosRun, "wait_settled", lambda self, admin, timeout_s: None)
    chaos = ChaosRun(FakeCluster(), ChaosOptions(out_dir=tmp_path))
    said: list[str] = []
    monkeypatch.setattr(chaos, "say", said.append)
    return chaos, said


def test_a_missed_first_call_is_retried(run):
    chaos, said = run
    admin = FlakyAdmin(failures=3)
    chaos.ensure_topic(admin)
    assert admin.calls == 4 and len(said) == 3 and "retrying" in said[0]


def test_a_cluster_that_never_answers_fails_after_the_retry_window(run):
    chaos, _said = run
    admin = FlakyAdmin(failures=10**6)
    with pytest.raises(BrokerNotAvailableError):
        chaos.ensure_topic(admin)
    assert admin.calls == int(runner.FIRST_CALL_RETRY_S / 2) + 1
