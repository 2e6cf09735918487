"""SASL on the Kafka listener: per-connection state and the SaslHandshake (17) and
SaslAuthenticate (36) APIs (KIP-43, KIP-152), as Kafka's clients speak them.

A connection on a listener with SASL mechanisms starts unauthenticated: it
may send only ApiVersions, SaslHandshake and SaslAuthenticate; any other
request closes it (Kafka does the same). Then:

* SaslHandshake(mechanism): one of the enabled mechanisms, else
  UNSUPPORTED_SASL_MECHANISM with the list (and the connection closes).
  v1: the exchange follows in SaslAuthenticate requests. v0 (older clients):
  the exchange follows as raw size-prefixed SASL tokens with no Kafka header
  (``raw_tokens``), answered the same way.
* PLAIN: one token ``authzid NUL user NUL password``; the password is
  checked against the user's stored SCRAM credential (the controller keeps no
  password, so a PLAIN user is a user with a SCRAM credential).
* SCRAM-SHA-256/512: two tokens (``proto.scram.ScramServer``).
* Success: the connection's principal is ``User:<name>`` from then on.
  Failure (wrong password, unknown user, garbage): SASL_AUTHENTICATION_FAILED
  with a message, then the connection closes; a SaslAuthenticate out of order
  is ILLEGAL_SASL_STATE and closes too. Only that connection is affected.

Re-authentication (KIP-368), with ``connections.max.reauth.ms`` > 0: a successful
SaslAuthenticate answers ``session_lifetime_ms`` = that setting and the session
expires then. Before it does, the client sends SaslHandshake (the same mechanism)
and SaslAuthenticate again on the same connection; other requests are served
meanwhile as the old session's. Success as the same user starts a new session;
another user, another mechanism or a failure closes the connection. Once the
session has expired, any request but SaslHandshake/SaslAuthenticate closes the
connection (a client without KIP-368 reconnects and authenticates anew), so a
removed user or a changed password takes effect on long-lived connections too.
Time comes in (``now_ms``, monotonic); nothing here reads a clock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tidewater.broker.clock import mono_ms
from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.settings import PLAIN, BrokerSecurity
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ANONYMOUS, user_principal
from tidewater.proto.errors import InvariantViolation
from tidewater.proto.scram import (
    MECHANISMS,
    SaslAuthenticationError,
    ScramServer,
    parse_plain,
)

log = logging.getLogger("tidewater.broker.kafka")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
API_VERSIONS = 18
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
REAUTHENTICATION = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})


class ConnectionSecurity:
    """Who one Kafka connection is and where its SASL exchange stands (no I/O)."""

    def __init__(self, security: BrokerSecurity, *, host: str = "",
                 tls_principal: str | None = None,
                 on_failure: Callable[[], None] = lambda: None):
        self.security = security
        self._on_failure = on_failure
        self.session = Session(tls_principal or ANONYMOUS, host)
        self.authenticated = not security.sasl_enabled
        self.close_after_answer = False  # a refused exchange: answer, then close
        self.raw_tokens = False  # after SaslHandshake v0: tokens without Kafka framing
        self._mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._scram_first_done = False
        self._exchanging = False  # between a SaslHandshake and the exchange's end
        self.expires_at_ms: int | None = None  # the session's end (KIP-368); None: never

    @property
    def exchanging(self) -> bool:
        """A SASL exchange is under way (between SaslHandshake and its success)."""
        return self._exchanging

    @property
    def session_lifetime_ms(self) -> int:
        """What SaslAuthenticate answers (v1+): 0 when sessions do not expire."""
        return self.security.settings.reauth_ms

    def refusal(self, api_key: int, now_ms: int) -> str | None:
        """Why a request with ``api_key`` closes the connection now, or None to serve it."""
        if not self.authenticated:
            return None if api_key in BEFORE_AUTHENTICATION else "before SASL authentication"
        if (self.expires_at_ms is not None and now_ms >= self.expires_at_ms
                and api_key not in REAUTHENTICATION):
            return "after the SASL session expired (connections.max.reauth.ms)"
        return None

    def allows(self, operation: int, resource_type: int, name: str) -> bool:
        """The check every request path makes (``Services.allowed`` calls it)."""
        return self.security.allows(self.session, operation, resource_type, name)

    def allows_any(self, operation: int, resource_type: int) -> bool:
        return self.security.allows_any(self.session, operation, resource_type)

    def handshake(self, mechanism: str, version: int) -> tuple[int, list[str]]:
        """(error code, enabled mechanisms) answering SaslHandshake."""
        enabled = list(self.security.settings.sasl_mechanisms)
        reauthenticating = (self.authenticated and self.expires_at_ms is not None
                            and not self._exchanging)
        if self._exchanging or (self.authenticated and not reauthenticating):
            self.close_after_answer = True
            return pb.ILLEGAL_SASL_STATE, enabled
        if mechanism not in enabled or (reauthenticating and mechanism != self._mechanism):
            self.close_after_answer = True
            return pb.UNSUPPORTED_SASL_MECHANISM, enabled
        self._mechanism = mechanism
        self._exchanging = True
        self._scram_first_done = False
        self.raw_tokens = version == 0 and not reauthenticating
        if mechanism in MECHANISMS:
            self._scram = ScramServer(mechanism, self.security.scram_credential,
                                      iterations_seen=self.security.scram_iterations)
        return pb.NONE, enabled

    async def authenticate(self, token: bytes, now_ms: int) -> bytes:
        """The server's token answering ``token``; SaslAuthenticationError refuses (the
        connection then closes, after ``failure_delay``). PLAIN's password check runs off
        the event loop (``BrokerSecurity.password_ok_off_loop``); the caller awaits this
        before reading the connection's next request, so its state is settled by then."""
        if not self._exchanging:
            self.close_after_answer = True
            self._on_failure()
            raise _IllegalState("SaslAuthenticate without a SaslHandshake, or after success")
        try:
            if self._scram is None:  # PLAIN
                user, password = parse_plain(token)
                if not await self.security.password_ok_off_loop(user, password):
                    raise SaslAuthenticationError(
                        f"authentication failed for user {user!r} ({PLAIN})")
                self._succeed(user, now_ms)
                return b""
            if not self._scram_first_done:
                self._scram_first_done = True
                return self._scram.first(token)
            answer = self._scram.final(token)
            if self._scram.user is None:
                raise InvariantViolation("a SCRAM exchange ended with no user")
            self._succeed(self._scram.user, now_ms)
            return answer
        except SaslAuthenticationError:
            self.close_after_answer = True
            self._on_failure()
            raise

    async def failure_delay(self) -> None:
        """KIP-306 (connection.failed.authentication.delay.ms): a refused exchange is
        answered this late (this connection only; the loop serves the others), so one
        connection gets few guesses a second."""
        await self.security.failure_delay()

    def _succeed(self, user: str, now_ms: int) -> None:
        principal = user_principal(user)
        again = self.authenticated
        if again and principal != self.session.principal:
            raise SaslAuthenticationError(f"re-authentication as {principal} on a connection "
                                          f"of {self.session.principal}")
        self.session = Session(principal, self.session.host)
        self.authenticated = True
        self._exchanging = False
        self.raw_tokens = False
        lifetime_ms = self.session_lifetime_ms
        self.expires_at_ms = now_ms + lifetime_ms if lifetime_ms > 0 else None
        log.info("kafka: %s %s as %s (%s)", self.session.host,
                 "re-authenticated" if again else "authenticated", principal, self._mechanism)


class _IllegalState(SaslAuthenticationError):
    error_code = pb.ILLEGAL_SASL_STATE


class SaslServices(Protocol):
    """What the SASL APIs reach of ``apis.Services``."""

    @property
    def connection(self) -> ConnectionSecurity | None: ...


def _done(value: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    async def answer() -> dict[str, Any]:
        return value
    return answer()


async def on_sasl_handshake(s: SaslServices, head: RequestHead, body: RequestBody
                            ) -> Awaitable[dict[str, Any]]:
    if s.connection is None:  # a listener without security settings: no SASL here
        return _done({"error_code": pb.UNSUPPORTED_SASL_MECHANISM, "mechanisms": []})
    code, mechanisms = s.connection.handshake(body.mechanism, head.api_version)
    return _done({"error_code": code, "mechanisms": mechanisms})


async def on_sasl_authenticate(s: SaslServices, head: RequestHead, body: RequestBody
                               ) -> Awaitable[dict[str, Any]]:
    if s.connection is None:
        return _done({"error_code": pb.ILLEGAL_SASL_STATE, "error_message": "no SASL here",
                      "auth_bytes": b"", "session_lifetime": 0})
    try:
        token = await s.connection.authenticate(bytes(body.auth_bytes), mono_ms())
    except SaslAuthenticationError as e:
        log.warning("kafka: closing %s: %s", s.connection.session.host, e)
        await s.connection.failure_delay()
        return _done({"error_code": e.error_code, "error_message": str(e), "auth_bytes": b"",
                      "session_lifetime": 0})
    # Only the exchange's last answer starts a session: its lifetime goes with that one.
    lifetime_ms = s.connection.session_lifetime_ms if s.connection.authenticated and \
        not s.connection.exchanging else 0
    return _done({"error_code": pb.NONE, "error_message": None, "auth_bytes": token,
                  "session_lifetime": lifetime_ms})


def tls_principal(peercert: dict[str, Any] | None) -> str | None:
    """``User:<CN>`` of a verified client certificate (``ssl`` getpeercert form)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return user_principal(value)
    return None
