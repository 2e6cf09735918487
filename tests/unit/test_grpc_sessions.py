"""SCRAM over gRPC without sockets: the exchange and its session tokens
(broker/security/grpc_sessions.py) against the client's side (client/sasl_session.py)."""

from __future__ import annotations

import pytest

from tidewater.broker.security.grpc_auth import GrpcLogins, PasswordChecker, grpc_session
from tidewater.broker.security.grpc_sessions import (
    EXCHANGE_TIMEOUT_MS,
    SESSIONS_MAX,
    GrpcSessions,
)
from tidewater.client.sasl_session import ScramLogin
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.scram import (
    SaslAuthenticationError,
    ScramClient,
    make_credential,
    plain_metadata,
)

pytestmark = pytest.mark.timeout(60)

MECHANISM = "SCRAM-SHA-512"
ALICE = make_credential(MECHANISM, "alice-pw")


def lookup(user: str, mechanism: str):
    return ALICE if (user, mechanism) == ("alice", MECHANISM) else None


def sessions(lifetime_ms: int = 0) -> GrpcSessions:
    return GrpcSessions(lookup, lambda mechanism: [ALICE.iterations], lifetime_ms=lifetime_ms)


def login(s: GrpcSessions, user: str, password: str, now_ms: int = 0):
    client = ScramClient(MECHANISM, user, password)
    exchange = s.open(MECHANISM, now_ms)
    first, issued, _ = s.step(exchange, client.first(), now_ms)
    assert issued is None
    final, issued, who = s.step(exchange, client.final(first), now_ms)
    client.check(final)
    return issued, who


def test_a_good_exchange_issues_a_token_that_names_the_user_until_it_expires():
    s = sessions(lifetime_ms=1000)
    issued, who = login(s, "alice", "alice-pw", now_ms=5000)
    assert who == "alice" and issued.lifetime_ms == 1000
    assert s.resolve(issued.token, 5999) == "alice"
    with pytest.raises(SaslAuthenticationError, match="expired"):
        s.resolve(issued.token, 6000)
    with pytest.raises(SaslAuthenticationError, match="unknown"):  # dropped once expired
        s.resolve(issued.token, 6000)


def test_no_lifetime_means_no_expiry_and_tokens_differ():
    s = sessions()
    a, _ = login(s, "alice", "alice-pw")
    b, _ = login(s, "alice", "alice-pw")
    assert a.token != b.token
    assert s.resolve(a.token, 10**12) == "alice"


def test_wrong_password_and_unknown_user_fail_alike_and_end_the_exchange():
    s = sessions()
    messages = []
    for user, password in (("alice", "nope"), ("mallory", "nope")):
        client = ScramClient(MECHANISM, user, password)
        exchange = s.open(MECHANISM, 0)
        first, _, _ = s.step(exchange, client.first(), 0)
        with pytest.raises(SaslAuthenticationError) as refused:
            s.step(exchange, client.final(first), 0)
        messages.append(str(refused.value).replace(repr(user), "U"))
        with pytest.raises(SaslAuthenticationError, match="no SASL exchange"):
            s.step(exchange, b"again", 0)
    assert messages[0] == messages[1]
    assert len(s) == 0


def test_forged_garbage_and_another_servers_tokens_are_refused():
    mine, theirs = sessions(), sessions()
    issued, _ = login(theirs, "alice", "alice-pw")
    for token in (issued.token, "A" * 43, "x" * 1000, ""):
        with pytest.raises(SaslAuthenticationError):
            mine.resolve(token, 0)


def test_stale_exchanges_are_dropped_and_sessions_are_bounded():
    s = sessions()
    client = ScramClient(MECHANISM, "alice", "alice-pw")
    exchange = s.open(MECHANISM, 0)
    with pytest.raises(SaslAuthenticationError, match="timed out"):
        s.step(exchange, client.first(), EXCHANGE_TIMEOUT_MS)
    first = s.issue("alice", 0)
    for _ in range(SESSIONS_MAX):
        s.issue("alice", 0)
    assert len(s) == SESSIONS_MAX
    with pytest.raises(SaslAuthenticationError, match="unknown"):
        s.resolve(first.token, 0)


def test_grpc_session_takes_the_token_and_refuses_plain_when_not_enabled():
    s = sessions()
    issued, _ = login(s, "alice", "alice-pw")
    checker = PasswordChecker(lambda user: [ALICE] if user == "alice" else [])
    logins = GrpcLogins(checker, s, plain_allowed=False, now_ms=lambda: 0)
    session = grpc_session([("authorization", "Session " + issued.token)], {},
                           "ipv4:10.0.0.1:5", logins=logins, sasl_required=True)
    assert session.principal == "User:alice"
    with pytest.raises(SaslAuthenticationError, match="PLAIN is not an enabled"):
        grpc_session([plain_metadata("alice", "alice-pw")], {}, "ipv4:10.0.0.1:5",
                      logins=logins, sasl_required=True)


def test_the_client_renews_its_session_inside_kafkas_window():
    """ScramLogin against the server's sessions, with a fake clock: a new exchange once
    90 % of the lifetime passed (the window's point is fixed here), not before."""
    s = sessions(lifetime_ms=10_000)
    now = [0.0]
    client = ScramLogin(MECHANISM, "alice", "alice-pw", clock=lambda: now[0],
                        window=lambda: 0.9)
    exchanges: dict[bytes, bytes] = {}

    def call(method: str, request):
        if method.endswith("SaslHandshake"):
            return pb.GrpcSaslHandshakeResponse(exchange_id=s.open(request.mechanism, 0))
        answer, issued, _ = s.step(request.exchange_id, request.auth_bytes,
                                   int(now[0] * 1000))
        exchanges[request.exchange_id] = answer
        return pb.GrpcSaslAuthenticateResponse(
            auth_bytes=answer, session_token=issued.token if issued else "",
            session_lifetime_ms=issued.lifetime_ms if issued else 0)
    first = client.metadata_sync(call)
    now[0] = 8.9
    assert client.metadata_sync(call) == first and client.exchanges == 1
    now[0] = 9.0
    renewed = client.metadata_sync(call)
    assert renewed != first and client.exchanges == 2
    assert s.resolve(renewed[0][1].removeprefix("Session "), 9000) == "alice"


def test_a_server_with_sasl_off_gets_no_credentials_and_one_with_other_mechanisms_refuses():
    # SASL off there (no mechanism enabled): its certificate check or nothing names the
    # caller, so calls go without credentials, as the PLAIN metadata was ignored before.
    def off(method, request):
        return pb.GrpcSaslHandshakeResponse(error_code=pb.UNSUPPORTED_SASL_MECHANISM)

    client = ScramLogin("SCRAM-SHA-512", "alice", "secret")
    assert client.metadata_sync(off) == () and client.exchanges == 0
    client.forget(())  # a call refused UNAUTHENTICATED: the next one asks again
    assert client._current() is None

    def plain_only(method, request):
        return pb.GrpcSaslHandshakeResponse(error_code=pb.UNSUPPORTED_SASL_MECHANISM,
                                            enabled_mechanisms=["PLAIN"])

    with pytest.raises(Exception, match="does not enable SCRAM-SHA-512"):
        ScramLogin("SCRAM-SHA-512", "alice", "secret").metadata_sync(plain_only)


def _renewing_login(s: GrpcSessions, user: str, password: str, renews: str, now_ms: int):
    client = ScramClient(MECHANISM, user, password)
    exchange = s.open(MECHANISM, now_ms, renews=renews)
    first, _, _ = s.step(exchange, client.first(), now_ms)
    final, issued, _ = s.step(exchange, client.final(first), now_ms)
    client.check(final)
    return issued


def test_a_reauthentication_keeps_the_token_for_a_new_lifetime_only_for_its_user():
    """KIP-368 for streams: the exchange names the current token; the same user gets that
    token back, living a lifetime from the renewal (``stream_expiry`` reads it); an
    expired token or another user's is not taken over (a new token)."""
    s = sessions(lifetime_ms=1000)
    issued, _ = login(s, "alice", "alice-pw", now_ms=0)
    assert s.expiry_ms(issued.token) == 1000
    renewed = _renewing_login(s, "alice", "alice-pw", issued.token, now_ms=900)
    assert renewed.token == issued.token and s.expiry_ms(issued.token) == 1900
    assert s.resolve(issued.token, 1500) == "alice"
    # Too late: the token expired at 1900; a new one, the old stays gone.
    late = _renewing_login(s, "alice", "alice-pw", issued.token, now_ms=1900)
    assert late.token != issued.token
    assert s.expiry_ms("never-issued") == 0
    assert not s.renew(late.token, "bob", 2000)  # another user's session: untouched
    assert s.expiry_ms(late.token) == 2900
