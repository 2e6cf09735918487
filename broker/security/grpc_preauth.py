"""Nothing of a gRPC call is read before its caller is authenticated (issue 29).

The handlers authenticate their caller (``grpc_auth.grpc_session``), but a handler of a
unary request runs only once gRPC has received the whole request and protobuf has
decoded it: up to ``socket.request.max.bytes`` (100 MiB) from anyone. ``PreAuthentication``
is a grpc.aio server interceptor that decides from the call's metadata alone, in
``intercept_service``, before anything of the request is read:

- ``authorization: Session <token>``: a known, unexpired session token;
- ``authorization: PLAIN ...`` (where PLAIN is enabled): the password checked against the
  user's SCRAM credential (on the password threads, the verdict cached, so the handler's
  own check costs nothing);
- anything else, or nothing: refused UNAUTHENTICATED, ``failed_authentication_delay_ms``
  late (KIP-306).

A refused call gets a handler of the same response kind that reads no request (a
stream-request handler that never iterates its requests) and aborts: gRPC core then holds
no more of the request than the HTTP/2 stream's flow-control window, and the client's
further DATA frames wait on that window until the abort resets the stream. The handler
the call would have had is not run.

Install it only where SASL is required and no certificate was checked in the TLS
handshake: a listener that requires client certificates (INTERNAL with TLS, the
controller with TLS) lets no one without a certificate of the cluster's CA open a
connection at all, and its members authenticate by certificate, not metadata.

Open before authentication: the ``Sasl`` service (the SCRAM exchange that issues the
tokens). Its requests are small; one larger than ``OPEN_REQUEST_BYTES_MAX`` (Kafka's
``sasl.server.max.receive.size``, 512 KiB) is refused before protobuf decodes it. On a
broker's INTERNAL listener without TLS, also the controller's LeaderAndIsr,
UpdateMetadata and StopReplica (``CONTROLLER_CALLS``): the controller authenticates them
with the registration's control token inside the request (``control_rules``), not with
call metadata, so they are decoded before that check (with TLS the handshake has checked
the controller's certificate first).

What gRPC cannot do: its receive limit (``grpc.max_receive_message_length``) is one per
server, not per call or per authentication state, so a request to an open method is still
received whole (up to the server's limit) by gRPC core before the size check here sees
it; only its decoding is avoided. And the metadata itself (HTTP/2 headers) is read
before any interceptor, bounded by gRPC's own header limits (``grpc.max_metadata_size``,
8 KiB by default).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc

from tidewater.proto.scram import SaslAuthenticationError

log = logging.getLogger(__name__)

OPEN_SERVICES = ("/tidewater.Sasl/",)
CONTROLLER_CALLS = tuple(f"/tidewater.BrokerControl/{name}"
                         for name in ("LeaderAndIsr", "UpdateMetadata", "StopReplica"))
OPEN_REQUEST_BYTES_MAX = 512 * 1024  # Kafka's sasl.server.max.receive.size default

Metadata = Iterable[tuple[str, str | bytes]]
# Raises SaslAuthenticationError unless the metadata authenticates its caller (after the
# failed-authentication delay).
MetadataCheck = Callable[[Metadata], Awaitable[None]]


def refusal(handler: grpc.RpcMethodHandler[Any, Any], message: str
            ) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler for the call ``handler`` would have served that aborts it UNAUTHENTICATED
    without reading its request: a stream-request handler (gRPC reads a stream's requests
    only as the handler iterates them) with no deserializer."""

    async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
                     ) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            refuse, response_serializer=handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(
        refuse, response_serializer=handler.response_serializer)


def size_limited(handler: grpc.RpcMethodHandler[Any, Any], bytes_max: int
                 ) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` (a unary-request one) with its request refused (RESOURCE_EXHAUSTED)
    when larger than ``bytes_max``, before it is decoded."""
    behavior = handler.unary_unary or handler.unary_stream
    deserialize = handler.request_deserializer
    if handler.request_streaming or behavior is None or not inspect.iscoroutinefunction(behavior):
        return handler

    async def limited(raw: bytes, context: Any) -> Any:
        if len(raw) > bytes_max:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"a request before authentication is at most {bytes_max} "
                                f"bytes; this one is {len(raw)}")
        return await behavior(deserialize(raw) if deserialize is not None else raw, context)

    kind = "unary_stream" if handler.response_streaming else "unary_unary"
    limited_handler: grpc.RpcMethodHandler[Any, Any] = handler._replace(  # type: ignore[attr-defined]
        request_deserializer=None, **{kind: limited})
    return limited_handler


class PreAuthentication(grpc.aio.ServerInterceptor):
    """Refuses, before its request is read, every call whose metadata does not
    authenticate its caller (``check``), except the open ``Sasl`` service's (size-limited)
    and ``token_authenticated`` ones."""

    def __init__(self, check: MetadataCheck, *, token_authenticated: tuple[str, ...] = (),
                 open_request_bytes_max: int = OPEN_REQUEST_BYTES_MAX) -> None:
        """``token_authenticated``: methods authenticated by what their request carries
        (``CONTROLLER_CALLS``), let through unchecked and unlimited."""
        self._check = check
        self._token_authenticated = token_authenticated
        self._open_request_bytes_max = open_request_bytes_max

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # UNIMPLEMENTED, answered by gRPC without reading
            return None
        method = handler_call_details.method or ""
        if method in self._token_authenticated:
            return handler
        if method.startswith(OPEN_SERVICES):
            return size_limited(handler, self._open_request_bytes_max)
        try:
            await self._check(handler_call_details.invocation_metadata or ())
        except SaslAuthenticationError as e:
            log.info("refusing %s before reading its request: %s", method, e)
            return refusal(handler, f"SASL_AUTHENTICATION_FAILED: {e}")
        return handler
