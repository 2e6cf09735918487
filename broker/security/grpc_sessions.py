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
   clients do so before it expires, ``client.sasl_session``). An exchange that names
   the client's current, unexpired token (``renews``) and authenticates the same user
   keeps that token for a new lifetime (``renew``) and answers it again: the streams
   opened with it live on (``stream_expiry``), as a Kafka connection that
   re-authenticated. Otherwise (another user, an expired or unknown token) a new one.

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
    REAUTHENTICATE_HINT,
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
    renews: str = ""  # the session token this exchange re-authenticates (KIP-368)


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

    def open(self, mechanism: str, now_ms: int, *, renews: str = "") -> bytes:
        """A new SCRAM exchange of ``mechanism`` (the caller checked it is enabled);
        ``renews``: the client's current session token, which lives on to the new
        session's expiry if this exchange authenticates the same user (``renew``)."""
        if mechanism not in MECHANISMS:
            raise SaslAuthenticationError(f"{mechanism!r} is not a SCRAM mechanism")
        self._drop_stale_exchanges(now_ms)
        while len(self._exchanges) >= EXCHANGES_MAX:
            self._exchanges.popitem(last=False)
        exchange_id = self._random(EXCHANGE_ID_BYTES)
        self._exchanges[exchange_id] = _Exchange(
            ScramServer(mechanism, self._lookup, iterations_seen=self._iterations_seen), now_ms,
            renews=renews if len(renews) <= TOKEN_TEXT_MAX else "")
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
        if exchange.renews and self.renew(exchange.renews, user, now_ms):
            return answer, Issued(exchange.renews, self.lifetime_ms), user
        return answer, self.issue(user, now_ms), user

    def renew(self, token: str, user: str, now_ms: int) -> bool:
        """KIP-368 re-authentication of the session ``token`` by ``user``, who just
        authenticated again: it now expires a lifetime from ``now_ms`` (so the streams
        opened with it are not ended). False (nothing changed) for an unknown or expired
        token, or one of another user: a re-authentication cannot take over a session."""
        key = _digest(token)
        entry = self._sessions.get(key)
        if entry is None or entry[0] != user or entry[1] is None or now_ms >= entry[1]:
            return False
        self._sessions[key] = (user, now_ms + self.lifetime_ms)
        return True

    def expiry_ms(self, token: str) -> int | None:
        """When the session ``token`` ends (``now_ms`` units): None if it never does;
        0 for an unknown token (already gone: a stream opened with it ends at once)."""
        entry = self._sessions.get(_digest(token)) if token else None
        if entry is None:
            return 0
        return entry[1]

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
                                          f"or dropped): {REAUTHENTICATE_HINT}")
        user, expiry = entry
        if expiry is not None and now_ms >= expiry:
            del self._sessions[key]
            raise SaslAuthenticationError("session token expired (connections.max.reauth.ms): "
                                          f"{REAUTHENTICATE_HINT}")
        return user

    def __len__(self) -> int:
        return len(self._sessions)
