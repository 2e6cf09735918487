"""SASL/PLAIN password checks (``grpc_auth.PasswordChecker``): an unknown user costs the
same PBKDF2 work as a known one, and the Kafka path runs it through a runner (a thread)."""

from __future__ import annotations

import asyncio

import pytest

from tidewater.broker.security import grpc_auth
from tidewater.broker.security.grpc_auth import PasswordChecker
from tidewater.proto.scram import fake_credential, make_credential, password_matches

pytestmark = pytest.mark.timeout(30)

ALICE = [make_credential(m, "alice-pw", iterations=8192)
         for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")]


def _checker() -> PasswordChecker:
    return PasswordChecker(lambda user: ALICE if user == "alice" else [],
                           lambda mechanism: [8192])


def test_an_unknown_user_runs_the_same_pbkdf2_work_as_a_known_one(monkeypatch):
    iterations: list[int] = []

    def counting(credential, password):
        iterations.append(credential.iterations)
        return password_matches(credential, password)
    monkeypatch.setattr(grpc_auth, "password_matches", counting)
    checker = _checker()
    assert not checker.check("alice", "wrong")
    known = list(iterations)
    iterations.clear()
    assert not checker.check("mallory", "wrong")
    assert iterations == known == [8192, 8192]
    assert checker.check("alice", "alice-pw")


def test_the_fake_credential_is_stable_per_user_and_never_matches():
    first = fake_credential("SCRAM-SHA-512", "mallory", [4096, 8192, 8192], secret=b"s")
    again = fake_credential("SCRAM-SHA-512", "mallory", [4096, 8192, 8192], secret=b"s")
    other = fake_credential("SCRAM-SHA-512", "trudy", [4096, 8192, 8192], secret=b"s")
    assert first == again and first.salt != other.salt and len(first.salt) == 32
    assert first.iterations in (4096, 8192)
    assert fake_credential("SCRAM-SHA-256", "x", []).iterations == 4096
    assert len(first.stored_key) == 64 and not password_matches(first, "")


async def test_check_with_runs_the_work_through_the_runner_and_caches_the_verdict():
    ran = []

    async def runner(work):
        ran.append(work)
        return await asyncio.get_running_loop().run_in_executor(None, work)
    checker = _checker()
    assert await checker.check_with("alice", "alice-pw", runner)
    assert not await checker.check_with("mallory", "x", runner)
    assert len(ran) == 2
    assert await checker.check_with("alice", "alice-pw", runner)  # cached: no work
    assert len(ran) == 2
