"""SCRAM over gRPC, the client's side: one session per channel (per server).

Before a channel's first call, ``ScramLogin`` runs the ``Sasl`` service's exchange
(``broker/servicers/sasl.py``): SaslHandshake(mechanism), then SaslAuthenticate with
the SCRAM client-first and client-final messages (``proto.scram.ScramClient``, which
also checks the server's signature: a server that does not know the credential cannot
pass for one that does). The answer's session token goes in every later call's metadata
(``authorization: Session <token>``); the password never leaves this process.

Re-authentication (KIP-368): a session of ``session_lifetime_ms`` > 0 is renewed by a
new exchange once 85-95 % of the lifetime passed (Kafka's clients pick the same window,
at random so that many clients do not all come at once). The renewing exchange names the
current token; the server keeps that token for the new lifetime, so streams opened with
it are not ended at its first expiry (``broker.security.stream_expiry``); an open aio
stream renews its session in time even when no other call is made
(``client.security.AioScramAuth.keep_renewed``). A call that is nevertheless
refused UNAUTHENTICATED with a token (the server restarted and forgot it, or dropped
it) makes the next call authenticate again, and a unary call is retried once at once
(UNAUTHENTICATED means the server did nothing with it).

Failures are typed: wrong credentials are ``SaslAuthenticationError``, a mechanism the
server does not enable ``UnsupportedSaslMechanismError``; gRPC transport errors of the
exchange reach the caller as the call's own would.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import grpc

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError
from tidewater.proto.scram import AUTHORIZATION_KEY, SaslAuthenticationError, ScramClient

SASL_METHOD_PREFIX = "/tidewater.Sasl/"
HANDSHAKE_METHOD = SASL_METHOD_PREFIX + "SaslHandshake"
AUTHENTICATE_METHOD = SASL_METHOD_PREFIX + "SaslAuthenticate"
EXCHANGE_TIMEOUT_S = 15.0
SESSION_SCHEME = "Session "
# Kafka's clients re-authenticate at a random point in this window of the lifetime.
REAUTH_WINDOW = (0.85, 0.95)


class UnsupportedSaslMechanismError(TidewaterError):
    """The server does not enable the mechanism the client is configured with."""

    error_code = pb.UNSUPPORTED_SASL_MECHANISM


class SaslRefusedRpcError(grpc.aio.AioRpcError):
    """What a call whose channel could not authenticate fails with: the gRPC error the
    server itself answers unauthenticated calls with (UNAUTHENTICATED), so callers
    handle it as they handle any refused call (``client.metadata.rpc_error_to_typed``
    makes it a ``SaslAuthenticationError``); ``error`` is the typed cause. An
    ``AioRpcError``, so that every handler of a failed call takes it: a follower whose
    leader has just restarted and does not know its credential yet retries, it does not
    stop its broker."""

    def __init__(self, error: TidewaterError) -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(),
                         grpc.aio.Metadata(),
                         f"{pb.ErrorCode.Name(error.error_code)}: {error}")
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


Step = tuple[str, Any]  # (method, request)


class ScramLogin:
    """One session at one server. Thread-safe (sync channels) or loop-bound (aio)."""

    def __init__(self, mechanism: str, user: str, password: str, *,
                 clock: Callable[[], float] = time.monotonic,
                 window: Callable[[], float] = lambda: random.uniform(*REAUTH_WINDOW)):
        self.mechanism = mechanism
        self._user = user
        self._password = password
        self._clock = clock
        self._window = window
        self._token: str | None = None
        self._refresh_at: float | None = None  # monotonic s; None: never
        self._lock = threading.Lock()
        self._aio_lock: asyncio.Lock | None = None
        # The server enables no SASL mechanism (SASL off there: a TLS certificate or
        # nothing names the caller), so calls carry no credentials, as they did when the
        # PLAIN metadata was ignored by such a server.
        self._sasl_off = False
        self.exchanges = 0  # completed, for tests and logs

    def _current(self) -> tuple[tuple[str, str], ...] | None:
        if self._sasl_off:
            return ()
        token = self._token
        if token is None or (self._refresh_at is not None and self._clock() >= self._refresh_at):
            return None
        return ((AUTHORIZATION_KEY, SESSION_SCHEME + token),)

    def forget(self, token_metadata: Any = None) -> None:
        """Drop the session (the server refused it): the next call authenticates again.
        With ``token_metadata``, only if that is still the session (not a newer one)."""
        if token_metadata is None or token_metadata == self._current():
            self._token = None
            self._sasl_off = False

    def seconds_to_refresh(self) -> float | None:
        """How long until this session is due for renewal (0: due); None if it never is
        or there is none (``keep_renewed`` then has nothing to do)."""
        if self._token is None or self._refresh_at is None:
            return None
        return max(0.0, self._refresh_at - self._clock())

    def _exchange(self) -> Generator[Step, Any, None]:
        # A renewal names the session it renews: the server keeps that token (and the
        # streams opened with it) alive to the new expiry and answers it again (KIP-368).
        answer = yield HANDSHAKE_METHOD, pb.GrpcSaslHandshakeRequest(
            mechanism=self.mechanism, previous_session_token=self._token or "")
        if answer.error_code == pb.UNSUPPORTED_SASL_MECHANISM and not answer.enabled_mechanisms:
            self._sasl_off = True
            return
        if answer.error_code == pb.UNSUPPORTED_SASL_MECHANISM:
            raise UnsupportedSaslMechanismError(
                f"the server does not enable {self.mechanism} (enabled: "
                f"{', '.join(answer.enabled_mechanisms) or 'none'})")
        if answer.error_code != pb.NONE:
            raise SaslAuthenticationError(f"SaslHandshake failed: {answer.error_message}")
        exchange_id = answer.exchange_id
        scram = ScramClient(self.mechanism, self._user, self._password)
        first = yield AUTHENTICATE_METHOD, pb.GrpcSaslAuthenticateRequest(
            exchange_id=exchange_id, auth_bytes=scram.first())
        if first.error_code != pb.NONE:
            raise SaslAuthenticationError(first.error_message or "SCRAM exchange refused")
        final = yield AUTHENTICATE_METHOD, pb.GrpcSaslAuthenticateRequest(
            exchange_id=exchange_id, auth_bytes=scram.final(first.auth_bytes))
        if final.error_code != pb.NONE:
            raise SaslAuthenticationError(final.error_message or "SCRAM exchange refused")
        scram.check(final.auth_bytes)
        if not final.session_token:
            raise SaslAuthenticationError("the server answered no session token")
        now = self._clock()
        self._token = final.session_token
        self._refresh_at = (now + final.session_lifetime_ms / 1000 * self._window()
                            if final.session_lifetime_ms > 0 else None)
        self.exchanges += 1

    def metadata_sync(self, call: Callable[[str, Any], Any]) -> tuple[tuple[str, str], ...]:
        """The session's call metadata, authenticating first when needed; ``call(method,
        request)`` makes one unary Sasl call."""
        with self._lock:
            current = self._current()
            if current is not None:
                return current
            steps = self._exchange()
            method, request = next(steps)
            try:
                while True:
                    method, request = steps.send(call(method, request))
            except StopIteration:
                pass
            current = self._current()
            assert current is not None, "an exchange that ended well leaves a session"
            return current

    async def metadata_async(self, call: Callable[[str, Any], Awaitable[Any]]
                             ) -> tuple[tuple[str, str], ...]:
        if self._aio_lock is None:
            self._aio_lock = asyncio.Lock()
        async with self._aio_lock:
            current = self._current()
            if current is not None:
                return current
            steps = self._exchange()
            method, request = next(steps)
            try:
                while True:
                    method, request = steps.send(await call(method, request))
            except StopIteration:
                pass
            current = self._current()
            assert current is not None, "an exchange that ended well leaves a session"
            return current


def _serializers(method: str) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    response = (pb.GrpcSaslHandshakeResponse if method == HANDSHAKE_METHOD
                else pb.GrpcSaslAuthenticateResponse)
    return (lambda m: m.SerializeToString()), response.FromString


def sync_caller(channel: grpc.Channel) -> Callable[[str, Any], Any]:
    """``call(method, request)`` for ``ScramLogin.metadata_sync`` on ``channel`` (the
    channel under the interceptor)."""
    def call(method: str, request: Any) -> Any:
        serialize, deserialize = _serializers(method)
        return channel.unary_unary(method, request_serializer=serialize,
                                   response_deserializer=deserialize)(
            request, timeout=EXCHANGE_TIMEOUT_S)
    return call


def aio_caller(channel: grpc.aio.Channel) -> Callable[[str, Any], Awaitable[Any]]:
    async def call(method: str, request: Any) -> Any:
        serialize, deserialize = _serializers(method)
        return await channel.unary_unary(method, request_serializer=serialize,
                                         response_deserializer=deserialize)(
            request, timeout=EXCHANGE_TIMEOUT_S)
    return call
