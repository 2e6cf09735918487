"""SCRAM over gRPC: the exchanges under way and the session tokens they issue.

Theory of operation (the ``Sasl`` service, ``broker/servicers/sasl.py``, is the shell;
this module keeps no sockets and reads no clock: ``now_ms`` comes in):

1. ``SaslHandshake(mechanism)``: a SCRAM mechanism enabled here opens an exchange
   (``open``): a ``proto.scram.ScramServer``, the code the Kafka listener runs, under a
   random exchange id. At most ``EXCHANGES_MAX`` are open; one not finished within
   ``EXCHANGE_TIMEOUT_MS`` is dropped (a client that vanished mid-way).
2. ``SaslAuthenticate(exchange id, client-first)`` -> server-first;
   ``SaslAuthenticate(exchange id, client-final)`` -> server-final and a session token
   (``step``). Any failure ends the exchange (SaslAuthenticationError: unknown user and
   wrong password alike, as on the Kafka listener).
3. Later calls carry ``authorization: Session <token>`` (``resolve``): the token names
   its user until ``connections.max.reauth.ms`` after it was issued (0: as long as this
   process lives), then it is refused and the client authenticates again (KIP-368; our
   clients do so before it expires, ``client.sasl_session``).

A token is 32 random bytes (URL-safe base64); only its SHA-256 is kept, so neither this
process's memory nor a log line holds a usable token. Tokens live in this process only:
another broker's token, a forged or a garbled one are all unknown here. At most
``SESSIONS_MAX`` tokens live; issuing one more drops the oldest (its client authenticates
again when refused).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tidewater.proto.scram import (
    MECHANISMS,
    CredentialLookup,
    IterationsSeen,
    SaslAuthenticationError,
    ScramServer,
)

SESSION_SCHEME = "Session "
TOKEN_BYTES = 32
EXCHANGE_ID_BYTES = 16
EXCHANGES_MAX = 256
EXCHANGE_TIMEOUT_MS = 30_000
SESSIONS_MAX = 10_000
TOKEN_TEXT_MAX = 128  # longer "tokens" are refused unread


@dataclass
class _Exchange:
    server: ScramServer
    opened_ms: int
    steps: int = 0


@dataclass(frozen=True, slots=True)
class Issued:
    token: str
    lifetime_ms: int  # 0: no expiry


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class GrpcSessions:
    def __init__(self, lookup: CredentialLookup, iterations_seen: IterationsSeen, *,
                 lifetime_ms: int, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self._lookup = lookup
        self._iterations_seen = iterations_seen
        self.lifetime_ms = lifetime_ms
        self._random = random_bytes
        self._exchanges: OrderedDict[bytes, _Exchange] = OrderedDict()
        # sha256(token) -> (user, expiry in ms or None), oldest first
        self._sessions: OrderedDict[bytes, tuple[str, int | None]] = OrderedDict()

    def open(self, mechanism: str, now_ms: int) -> bytes:
        """A new SCRAM exchange of ``mechanism`` (the caller checked it is enabled)."""
        if mechanism not in MECHANISMS:
            raise SaslAuthenticationError(f"{mechanism!r} is not a SCRAM mechanism")
        self._drop_stale_exchanges(now_ms)
        while len(self._exchanges) >= EXCHANGES_MAX:
            self._exchanges.popitem(last=False)
        exchange_id = self._random(EXCHANGE_ID_BYTES)
        self._exchanges[exchange_id] = _Exchange(
            ScramServer(mechanism, self._lookup, iterations_seen=self._iterations_seen), now_ms)
        return exchange_id

    def _drop_stale_exchanges(self, now_ms: int) -> None:
        while self._exchanges:
            oldest = next(iter(self._exchanges.values()))
            if now_ms - oldest.opened_ms < EXCHANGE_TIMEOUT_MS:
                break
            self._exchanges.popitem(last=False)

    def step(self, exchange_id: bytes, data: bytes, now_ms: int
             ) -> tuple[bytes, Issued | None, str | None]:
        """The server's answer to the client's next message; with the last one, the
        issued session and its user. SaslAuthenticationError ends the exchange."""
        self._drop_stale_exchanges(now_ms)
        exchange = self._exchanges.get(exchange_id)
        if exchange is None:
            raise SaslAuthenticationError("no SASL exchange under this id (never opened, "
                                          "finished, or timed out)")
        try:
            if exchange.steps == 0:
                exchange.steps = 1
                return exchange.server.first(data), None, None
            answer = exchange.server.final(data)
        except SaslAuthenticationError:
            self._exchanges.pop(exchange_id, None)
            raise
        self._exchanges.pop(exchange_id, None)
        user = exchange.server.user
        if user is None:  # final() returns only once authenticated
            raise SaslAuthenticationError("SCRAM exchange ended without a user")
        return answer, self.issue(user, now_ms), user

    def issue(self, user: str, now_ms: int) -> Issued:
        token = base64.urlsafe_b64encode(self._random(TOKEN_BYTES)).decode().rstrip("=")
        expiry = now_ms + self.lifetime_ms if self.lifetime_ms > 0 else None
        self._sessions[_digest(token)] = (user, expiry)
        while len(self._sessions) > SESSIONS_MAX:
            self._sessions.popitem(last=False)
        return Issued(token, self.lifetime_ms)

    def resolve(self, token: str, now_ms: int) -> str:
        """The user ``token`` was issued to; SaslAuthenticationError for an unknown or
        expired one (the message never holds the token)."""
        if not token or len(token) > TOKEN_TEXT_MAX:
            raise SaslAuthenticationError("malformed session token")
        key = _digest(token)
        entry = self._sessions.get(key)
        if entry is None:
            raise SaslAuthenticationError("unknown session token (not issued by this server, "
                                          "or dropped): authenticate again")
        user, expiry = entry
        if expiry is not None and now_ms >= expiry:
            del self._sessions[key]
            raise SaslAuthenticationError("session token expired (connections.max.reauth.ms): "
                                          "authenticate again")
        return user

    def __len__(self) -> int:
        return len(self._sessions)
