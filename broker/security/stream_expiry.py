"""Streams end with their session (KIP-368 for gRPC streams).

A call authenticated by a session token (``authorization: Session <token>``,
``grpc_sessions``) is checked once, when it starts: a unary call is over long before its
session ends, a stream (FetchStream, ProduceStream, ReplicaFetch, BrokerHeartbeats) may
outlive it by days. Kafka closes a connection whose session expired unless the client
re-authenticated on it (``connections.max.reauth.ms``); here the stream is ended
UNAUTHENTICATED at its session's expiry, unless the client re-authenticated that session
(a SCRAM exchange naming it, ``GrpcSaslHandshakeRequest.previous_session_token``:
``GrpcSessions.renew`` moves its expiry), in which case it lives on to the new expiry.

``SessionStreamLimit`` is a grpc.aio server interceptor: for a streaming method called
with a session token whose session expires, it sets a timer at the session's expiry
(``GrpcSessions.expiry_ms``, read again when it fires, so a renewal counts); at an
expiry that was not moved, it cancels the handler (in the call's own task) and aborts the call
UNAUTHENTICATED with a message saying to authenticate again (``REAUTHENTICATE_HINT``:
clients reopen such a stream after a new exchange, ``client.metadata``). Calls with no
token (certificates, PLAIN, no SASL), unary calls and sessions that never expire pass
untouched.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidewater.broker.clock import mono_ms
from tidewater.broker.security.grpc_auth import session_token
from tidewater.broker.security.grpc_sessions import GrpcSessions
from tidewater.proto.scram import REAUTHENTICATE_HINT

log = logging.getLogger(__name__)

SESSION_ENDED = ("session expired (connections.max.reauth.ms) and not re-authenticated: "
                 f"{REAUTHENTICATE_HINT} and reopen the stream")


async def run_until_session_ends(handler: Awaitable[Any],
                                 context: grpc.aio.ServicerContext[Any, Any],
                                 expiry_ms: Callable[[], int | None],
                                 now_ms: Callable[[], int] = mono_ms) -> Any:
    """``handler``'s result, or the call aborted UNAUTHENTICATED once ``expiry_ms()``
    (read again at each expiry: a renewal moves it) has passed.

    The handler runs in the call's own task, as without this wrapper (a client's cancel
    reaches it the same way); at the expiry a timer cancels that task, and the
    cancellation it caused (and only that) becomes the abort."""
    task = asyncio.current_task()
    assert task is not None  # a grpc.aio handler runs in a task
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None
    cut = False

    def arm() -> None:
        nonlocal timer
        expiry = expiry_ms()
        if expiry is not None:
            timer = loop.call_later(max(0, expiry - now_ms()) / 1000, check)

    def check() -> None:
        nonlocal cut
        expiry = expiry_ms()
        if expiry is None:
            return
        if now_ms() < expiry:
            arm()  # renewed: watch the new expiry
            return
        cut = True
        task.cancel()

    arm()
    try:
        return await handler
    except asyncio.CancelledError:
        if not cut:
            raise
        task.uncancel()
    finally:
        if timer is not None:
            timer.cancel()
    log.info("ending a stream of %s: %s", context.peer(), SESSION_ENDED)
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, SESSION_ENDED)


class SessionStreamLimit(grpc.aio.ServerInterceptor):
    def __init__(self, sessions: GrpcSessions, now_ms: Callable[[], int] = mono_ms) -> None:
        self._sessions = sessions
        self._now_ms = now_ms

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        token = session_token(handler_call_details.invocation_metadata or ())
        if not token or self._sessions.lifetime_ms <= 0:
            return handler
        sessions, now_ms = self._sessions, self._now_ms

        def expiry() -> int | None:
            return sessions.expiry_ms(token)

        def wrap(behavior: Callable[[Any, Any], Awaitable[Any]]
                 ) -> Callable[[Any, Any], Awaitable[Any]]:
            async def guarded(request: Any, context: Any) -> Any:
                return await run_until_session_ends(behavior(request, context), context,
                                                    expiry, now_ms)
            return guarded

        guarded: dict[str, Any] = {}
        for kind in ("unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind, None)
            # Every streaming handler here is a coroutine function (it writes through the
            # context); an async generator would pass unwatched.
            if behavior is not None and inspect.iscoroutinefunction(behavior):
                guarded[kind] = wrap(behavior)
        return handler._replace(**guarded) if guarded else handler  # type: ignore[attr-defined]
