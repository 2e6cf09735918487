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

Sessions do not expire (session_lifetime 0: no re-authentication, KIP-368).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from tidewater.broker.authorizer import Session
from tidewater.broker.security import PLAIN, BrokerSecurity
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ANONYMOUS, user_principal
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


class ConnectionSecurity:
    """Who one Kafka connection is and where its SASL exchange stands (no I/O)."""

    def __init__(self, security: BrokerSecurity, *, host: str = "",
                 tls_principal: str | None = None):
        self.security = security
        self.session = Session(tls_principal or ANONYMOUS, host)
        self.authenticated = not security.sasl_enabled
        self.close_after_answer = False  # a refused exchange: answer, then close
        self.raw_tokens = False  # after SaslHandshake v0: tokens without Kafka framing
        self._mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._scram_first_done = False

    def may_serve(self, api_key: int) -> bool:
        return self.authenticated or api_key in BEFORE_AUTHENTICATION

    def allows(self, operation: int, resource_type: int, name: str) -> bool:
        """The check every request path makes (``Services.allowed`` calls it)."""
        return self.security.allows(self.session, operation, resource_type, name)

    def allows_any(self, operation: int, resource_type: int) -> bool:
        return self.security.allows_any(self.session, operation, resource_type)

    def handshake(self, mechanism: str, version: int) -> tuple[int, list[str]]:
        """(error code, enabled mechanisms) answering SaslHandshake."""
        enabled = list(self.security.settings.sasl_mechanisms)
        if self.authenticated or self._mechanism is not None:
            self.close_after_answer = True
            return pb.ILLEGAL_SASL_STATE, enabled
        if mechanism not in enabled:
            self.close_after_answer = True
            return pb.UNSUPPORTED_SASL_MECHANISM, enabled
        self._mechanism = mechanism
        self.raw_tokens = version == 0
        if mechanism in MECHANISMS:
            self._scram = ScramServer(mechanism, self.security.scram_credential)
        return pb.NONE, enabled

    def authenticate(self, token: bytes) -> bytes:
        """The server's token answering ``token``; SaslAuthenticationError refuses (the
        connection then closes)."""
        if self._mechanism is None or self.authenticated:
            self.close_after_answer = True
            raise _IllegalState("SaslAuthenticate without a SaslHandshake, or after success")
        try:
            if self._scram is None:  # PLAIN
                user, password = parse_plain(token)
                if not self.security.password_ok(user, password):
                    raise SaslAuthenticationError(
                        f"authentication failed for user {user!r} ({PLAIN})")
                self._succeed(user)
                return b""
            if not self._scram_first_done:
                self._scram_first_done = True
                return self._scram.first(token)
            answer = self._scram.final(token)
            assert self._scram.user is not None
            self._succeed(self._scram.user)
            return answer
        except SaslAuthenticationError:
            self.close_after_answer = True
            raise

    def _succeed(self, user: str) -> None:
        self.session = Session(user_principal(user), self.session.host)
        self.authenticated = True
        self.raw_tokens = False
        log.info("kafka: %s authenticated as %s (%s)", self.session.host, self.session.principal,
                 self._mechanism)


class _IllegalState(SaslAuthenticationError):
    error_code = pb.ILLEGAL_SASL_STATE


def _done(value: Any) -> Awaitable[Any]:
    async def answer() -> Any:
        return value
    return answer()


async def on_sasl_handshake(s, head, body) -> Awaitable[Any]:
    if s.connection is None:  # a listener without security settings: no SASL here
        return _done({"error_code": pb.UNSUPPORTED_SASL_MECHANISM, "mechanisms": []})
    code, mechanisms = s.connection.handshake(body.mechanism, head.api_version)
    return _done({"error_code": code, "mechanisms": mechanisms})


async def on_sasl_authenticate(s, head, body) -> Awaitable[Any]:
    if s.connection is None:
        return _done({"error_code": pb.ILLEGAL_SASL_STATE, "error_message": "no SASL here",
                      "auth_bytes": b"", "session_lifetime": 0})
    try:
        token = s.connection.authenticate(bytes(body.auth_bytes))
    except SaslAuthenticationError as e:
        log.warning("kafka: closing %s: %s", s.connection.session.host, e)
        return _done({"error_code": e.error_code, "error_message": str(e), "auth_bytes": b"",
                      "session_lifetime": 0})
    return _done({"error_code": pb.NONE, "error_message": None, "auth_bytes": token,
                  "session_lifetime": 0})


def tls_principal(peercert: dict | None) -> str | None:
    """``User:<CN>`` of a verified client certificate (``ssl`` getpeercert form)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return user_principal(value)
    return None
