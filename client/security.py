"""How a client connects: plaintext or TLS, with Kafka's names for the settings.

``ClientSecurity`` is what ``Producer``, ``Consumer``, ``AdminClient`` and
``AsyncProducer`` take as ``security_protocol`` (``PLAINTEXT`` or ``SSL``),
``ssl_cafile`` (PEM CA certificates to trust; gRPC's default roots when
absent), ``ssl_certfile`` and ``ssl_keyfile`` (a client certificate, for
listeners that require one) — kafka-python's names. ``tide
--command-config FILE`` reads the same from a Kafka client properties file
(``properties_security``): ``security.protocol``, ``ssl.cafile`` or
``ssl.ca.location``, ``ssl.certfile`` or ``ssl.certificate.location``,
``ssl.keyfile`` or ``ssl.key.location``.

SASL (``security_protocol`` ``SASL_PLAINTEXT`` or ``SASL_SSL``, with
``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password`` —
kafka-python's names; in a properties file ``sasl.mechanism``,
``sasl.username``, ``sasl.password`` as librdkafka names them). With a SCRAM
mechanism each channel first runs a SCRAM exchange on the server's ``Sasl``
service and then sends only the session token it answered, re-authenticating
before the token expires (``client.sasl_session``, KIP-368); the password never
crosses the network. With PLAIN every gRPC call carries the user and password as
``authorization: PLAIN ...`` metadata (taken only by servers that enable PLAIN);
use SASL_SSL then: over SASL_PLAINTEXT the password crosses the network in clear
(a warning is logged).
Java keystores
(``ssl.truststore.*``, ``ssl.keystore.*``) are refused with a message: gRPC
reads PEM only.

A security value is hashable: channel pools keep it with their channels, so
clients with different settings never share a channel. Files are read when
the first channel needs them (``channel_credentials``, cached per value).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import grpc

from tidewater.client.sasl_session import (
    SASL_METHOD_PREFIX,
    SaslRefusedRpcError,
    ScramLogin,
    UnsupportedSaslMechanismError,
    aio_caller,
    sync_caller,
)
from tidewater.proto.errors import InvariantViolation, TidewaterError
from tidewater.proto.scram import MECHANISMS, SaslAuthenticationError, plain_metadata
from tidewater.proto.tls import open_aio_channel

log = logging.getLogger(__name__)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# An open stream checks no more often than this whether its session is due for renewal.
RENEW_POLL_S_MIN = 0.05
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SecurityConfigError(ValueError):
    """Security settings a client cannot connect with (a caller's mistake, not retriable)."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                     ssl_certfile: str | None = None,
                     ssl_keyfile: str | None = None, *, sasl_mechanism: str | None = None,
                     sasl_plain_username: str | None = None,
                     sasl_plain_password: str | None = None) -> ClientSecurity:
        protocol = (security_protocol or "PLAINTEXT").strip().upper()
        if protocol not in PROTOCOLS:
            raise SecurityConfigError(
                f"security_protocol {security_protocol!r} is not supported "
                f"({', '.join(PROTOCOLS)})")
        sasl = protocol.startswith("SASL_")
        if sasl:
            mechanism = (sasl_mechanism or "PLAIN").strip().upper()
            if mechanism not in SASL_MECHANISMS:
                raise SecurityConfigError(f"sasl_mechanism {sasl_mechanism!r} is not one of "
                                          f"{', '.join(SASL_MECHANISMS)}")
            if not sasl_plain_username or not sasl_plain_password:
                raise SecurityConfigError(f"{protocol} needs sasl_plain_username and "
                                          "sasl_plain_password")
        elif sasl_plain_username or sasl_plain_password:
            raise SecurityConfigError("sasl_* settings need security_protocol SASL_PLAINTEXT "
                                      "or SASL_SSL")
        sasl_fields = ((mechanism, sasl_plain_username, sasl_plain_password) if sasl
                       else (None, None, None))
        if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            if ssl_cafile or ssl_certfile or ssl_keyfile:
                raise SecurityConfigError("ssl_* settings need security_protocol 'SSL' or "
                                          "'SASL_SSL'")
            return cls(protocol, None, None, None, *sasl_fields)
        if bool(ssl_certfile) != bool(ssl_keyfile):
            raise SecurityConfigError("ssl_certfile and ssl_keyfile go together")
        return cls(protocol, ssl_cafile or None, ssl_certfile or None, ssl_keyfile or None,
                   *sasl_fields)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """What every gRPC call carries: with SASL/PLAIN, the user and password (SCRAM
        sends a session token instead: ``scram_login``)."""
        if self.sasl_username is None or self.sasl_password is None \
                or self.sasl_mechanism in MECHANISMS:
            return ()
        return (plain_metadata(self.sasl_username, self.sasl_password),)

    def scram_login(self) -> ScramLogin | None:
        """A new SCRAM session for one channel, when the mechanism is a SCRAM one."""
        if self.sasl_username is None or self.sasl_password is None \
                or self.sasl_mechanism not in MECHANISMS:
            return None
        return ScramLogin(self.sasl_mechanism, self.sasl_username, self.sasl_password)


PLAINTEXT = ClientSecurity()


class SecurityOptions(TypedDict, total=False):
    """The clients' security keyword arguments (Producer, Consumer, AdminClient), Kafka's names."""

    security_protocol: str
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    sasl_mechanism: str | None
    sasl_plain_username: str | None
    sasl_plain_password: str | None


def security_kwargs(security: ClientSecurity) -> SecurityOptions:
    """``security`` as the clients' keyword arguments (Producer, Consumer, AdminClient)."""
    return {"security_protocol": security.protocol, "ssl_cafile": security.cafile,
            "ssl_certfile": security.certfile, "ssl_keyfile": security.keyfile,
            "sasl_mechanism": security.sasl_mechanism,
            "sasl_plain_username": security.sasl_username,
            "sasl_plain_password": security.sasl_password}


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"cannot read {path}: {e.strerror}") from None


@functools.lru_cache(maxsize=16)
def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials | None:
    """The gRPC credentials of ``security``; None for plaintext."""
    if not security.tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(security.cafile),
                                        private_key=_read(security.keyfile),
                                        certificate_chain=_read(security.certfile))


# Channel options (grpc.* keys) and the metadata every call of a client carries.
ChannelOptions = Sequence[tuple[str, int | str]]
CallMetadata = tuple[tuple[str, str], ...]


def _warn_plain_in_clear(security: ClientSecurity, target: str) -> None:
    if security.sasl_mechanism == "PLAIN" and not security.tls:
        log.warning("SASL/PLAIN over a plaintext channel to %s: the password crosses the "
                    "network in clear (use SASL_SSL, or a SCRAM mechanism)", target)


def sync_channel(target: str, security: ClientSecurity, options: ChannelOptions) -> grpc.Channel:
    credentials = channel_credentials(security)
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    login = security.scram_login()
    if login is not None:
        return grpc.intercept_channel(channel, SyncScramAuth(login, sync_caller(channel)))
    metadata = security.call_metadata()
    if metadata:
        _warn_plain_in_clear(security, target)
        channel = grpc.intercept_channel(channel, *_sync_interceptors(metadata))
    return channel


def aio_channel(target: str, security: ClientSecurity, options: ChannelOptions) -> grpc.aio.Channel:
    login = security.scram_login()
    if login is not None:
        return scram_aio_channel(target, options, channel_credentials(security), login)
    metadata = security.call_metadata()
    if metadata:
        _warn_plain_in_clear(security, target)
    return open_aio_channel(target, options, channel_credentials(security),
                            interceptors=aio_metadata_interceptors(metadata) if metadata else None)


def scram_aio_channel(target: str, options: ChannelOptions,
                      credentials: grpc.ChannelCredentials | None,
                      login: ScramLogin) -> grpc.aio.Channel:
    """An aio channel whose calls carry ``login``'s session (a client's, or a broker's on
    its channels to the controller and to other brokers)."""
    auth = AioScramAuth(login)
    channel = open_aio_channel(target, options, credentials, interceptors=auth.interceptors())
    auth.caller = aio_caller(channel)
    return channel


class SyncScramAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the SCRAM session's token to every call (``client.sasl_session``)."""

    def __init__(self, login: ScramLogin, caller: Callable[[str, Any], Any]) -> None:
        self.login = login
        self._caller = caller

    def _details(self, details: grpc.ClientCallDetails
                 ) -> tuple[grpc.ClientCallDetails, CallMetadata | None]:
        if details.method.startswith(SASL_METHOD_PREFIX):
            return details, None
        try:
            metadata = self.login.metadata_sync(self._caller)
        except (SaslAuthenticationError, UnsupportedSaslMechanismError) as e:
            raise SaslRefusedRpcError(e) from e
        return _ClientCallDetails.of(details, metadata), metadata

    def _watch(self, outcome: Any, metadata: CallMetadata | None) -> Any:
        if metadata is not None and hasattr(outcome, "add_done_callback"):
            def done(future: Any) -> None:
                if future.code() == grpc.StatusCode.UNAUTHENTICATED:
                    self.login.forget(metadata)
            outcome.add_done_callback(done)
        return outcome

    def intercept_unary_unary(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                              client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        details, metadata = self._details(client_call_details)
        outcome = continuation(details, request)
        if metadata is not None and outcome.done() \
                and outcome.code() == grpc.StatusCode.UNAUTHENTICATED:
            # The server forgot or dropped the session: once more with a new one.
            self.login.forget(metadata)
            details, metadata = self._details(client_call_details)
            outcome = continuation(details, request)
        return self._watch(outcome, metadata)

    def intercept_unary_stream(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                               client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        details, metadata = self._details(client_call_details)
        return self._watch(continuation(details, request), metadata)

    def intercept_stream_unary(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Any) -> Any:
        details, metadata = self._details(client_call_details)
        return self._watch(continuation(details, request_iterator), metadata)

    def intercept_stream_stream(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        details, metadata = self._details(client_call_details)
        return self._watch(continuation(details, request_iterator), metadata)


class AioScramAuth:
    """The aio channels' ``SyncScramAuth``; ``caller`` is set once the channel exists
    (the exchange goes over the same channel, its Sasl calls not intercepted)."""

    def __init__(self, login: ScramLogin) -> None:
        self.login = login
        self.caller: Callable[[str, Any], Awaitable[Any]] | None = None
        self._checks: set[asyncio.Task[None]] = set()

    async def details(self, details: grpc.aio.ClientCallDetails
                      ) -> tuple[grpc.aio.ClientCallDetails, CallMetadata | None]:
        method = details.method
        if (method.decode() if isinstance(method, bytes) else method).startswith(
                SASL_METHOD_PREFIX):
            return details, None
        if self.caller is None:
            raise InvariantViolation("AioScramAuth used before its channel was made")
        try:
            metadata = await self.login.metadata_async(self.caller)
        except (SaslAuthenticationError, UnsupportedSaslMechanismError) as e:
            raise SaslRefusedRpcError(e) from e
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout,
            grpc.aio.Metadata(*(tuple(details.metadata or ()) + metadata)),
            details.credentials, details.wait_for_ready), metadata

    def watch(self, call: Any, metadata: CallMetadata | None) -> Any:
        """A stream refused UNAUTHENTICATED drops the session it carried."""
        if metadata is None:
            return call

        async def check(done: Any) -> None:
            if await done.code() == grpc.StatusCode.UNAUTHENTICATED:
                self.login.forget(metadata)

        def on_done(done: Any) -> None:
            task = asyncio.get_running_loop().create_task(check(done))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
        call.add_done_callback(on_done)
        return call

    def keep_renewed(self, call: Any, metadata: CallMetadata | None) -> Any:
        """While the stream ``call`` is open, renew its session when due (a stream makes
        no further calls that would): the server ends a stream whose session expired
        without re-authentication (``broker.security.stream_expiry``)."""
        if metadata is None or self.login.seconds_to_refresh() is None:
            return call

        async def renew() -> None:
            while not call.done():
                delay = self.login.seconds_to_refresh()
                if delay is None:
                    return
                await asyncio.sleep(max(delay, RENEW_POLL_S_MIN))
                if call.done():
                    return
                try:
                    assert self.caller is not None  # set before any call is made
                    await self.login.metadata_async(self.caller)
                except (grpc.RpcError, TidewaterError) as e:
                    # The stream ends at its session's expiry; its owner reopens it.
                    log.info("could not renew a stream's SASL session: %s", e)
                    return

        task = asyncio.get_running_loop().create_task(renew())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)
        call.add_done_callback(lambda _done: task.cancel())
        return call

    def interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        auth = self

        class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
            async def intercept_unary_unary(
                    self, continuation: Callable[[grpc.aio.ClientCallDetails, Any],
                                                 Awaitable[Any]],
                    details: grpc.aio.ClientCallDetails, request: Any) -> Any:
                sent, metadata = await auth.details(details)
                call = await continuation(sent, request)
                if metadata is not None and await call.code() == grpc.StatusCode.UNAUTHENTICATED:
                    auth.login.forget(metadata)  # the server forgot it: once more
                    sent, metadata = await auth.details(details)
                    call = await continuation(sent, request)
                return call

        class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
            async def intercept_unary_stream(
                    self, continuation: Callable[[grpc.aio.ClientCallDetails, Any],
                                                 Awaitable[Any]],
                    details: grpc.aio.ClientCallDetails, request: Any) -> Any:
                sent, metadata = await auth.details(details)
                return auth.keep_renewed(auth.watch(await continuation(sent, request), metadata),
                                         metadata)

        class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
            async def intercept_stream_unary(
                    self, continuation: Callable[[grpc.aio.ClientCallDetails, Any],
                                                 Awaitable[Any]],
                    details: grpc.aio.ClientCallDetails, request_iterator: Any) -> Any:
                sent, metadata = await auth.details(details)
                return auth.keep_renewed(
                    auth.watch(await continuation(sent, request_iterator), metadata), metadata)

        class StreamStream(grpc.aio.StreamStreamClientInterceptor):
            async def intercept_stream_stream(
                    self, continuation: Callable[[grpc.aio.ClientCallDetails, Any],
                                                 Awaitable[Any]],
                    details: grpc.aio.ClientCallDetails, request_iterator: Any) -> Any:
                sent, metadata = await auth.details(details)
                return auth.keep_renewed(
                    auth.watch(await continuation(sent, request_iterator), metadata), metadata)
        return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


# The interceptors pass every RPC's request (or request iterator) and call through
# untouched, whatever their types: those are Any here.
class _AddMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata: CallMetadata) -> None:
        self._metadata = metadata

    def intercept_unary_unary(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                              client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(_ClientCallDetails.of(client_call_details, self._metadata), request)

    def intercept_unary_stream(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                               client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(_ClientCallDetails.of(client_call_details, self._metadata), request)

    def intercept_stream_unary(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Any) -> Any:
        return continuation(_ClientCallDetails.of(client_call_details, self._metadata),
                            request_iterator)

    def intercept_stream_stream(self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        return continuation(_ClientCallDetails.of(client_call_details, self._metadata),
                            request_iterator)


def _sync_interceptors(metadata: CallMetadata) -> list[_AddMetadata]:
    return [_AddMetadata(metadata)]


class _ClientCallDetails(grpc.ClientCallDetails):
    """grpc's ClientCallDetails is abstract; this one carries our metadata too."""

    def __init__(self, method: str, timeout: float | None,
                 metadata: tuple[tuple[str, str | bytes], ...] | None,
                 credentials: grpc.CallCredentials | None, wait_for_ready: bool | None,
                 compression: grpc.Compression | None) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = (
            credentials, wait_for_ready, compression)

    @classmethod
    def of(cls, details: grpc.ClientCallDetails, metadata: CallMetadata) -> _ClientCallDetails:
        return cls(details.method, details.timeout,
                   tuple(details.metadata or ()) + tuple(metadata), details.credentials,
                   getattr(details, "wait_for_ready", None), getattr(details, "compression", None))


def aio_metadata_interceptors(metadata: CallMetadata) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors adding ``metadata`` to every call of an aio channel (a broker's SASL
    credentials on its controller channel use them too)."""
    def details_of(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout,
            grpc.aio.Metadata(*(tuple(details.metadata or ()) + tuple(metadata))),
            details.credentials, details.wait_for_ready)

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(
                self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
                details: grpc.aio.ClientCallDetails, request: Any) -> Any:
            return await continuation(details_of(details), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(
                self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
                details: grpc.aio.ClientCallDetails, request: Any) -> Any:
            return await continuation(details_of(details), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(
                self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
                details: grpc.aio.ClientCallDetails, request_iterator: Any) -> Any:
            return await continuation(details_of(details), request_iterator)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(
                self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
                details: grpc.aio.ClientCallDetails, request_iterator: Any) -> Any:
            return await continuation(details_of(details), request_iterator)
    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


# ---------------------------------------------------------------------- Kafka properties files

# Kafka client property -> ClientSecurity.from_options argument (librdkafka and
# kafka-python names for the same thing).
_PROPERTY_NAMES = {
    "security.protocol": "security_protocol",
    "ssl.cafile": "ssl_cafile",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certfile": "ssl_certfile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.keyfile": "ssl_keyfile",
    "ssl.key.location": "ssl_keyfile",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}


def parse_properties(text: str) -> dict[str, str]:
    """Java properties, the subset client configs use: ``key=value`` or ``key: value``
    lines, ``#`` and ``!`` comments, surrounding spaces dropped."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise SecurityConfigError(f"line {number}: expected key=value, got {raw.strip()!r}")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def properties_security(properties: dict[str, str]) -> ClientSecurity:
    """The security settings of a Kafka client properties file; other keys are ignored
    (a file written for Kafka's tools may hold producer or consumer settings)."""
    keystores = sorted(k for k in properties if k.startswith(("ssl.truststore.", "ssl.keystore.")))
    if keystores:
        raise SecurityConfigError(f"{', '.join(keystores)}: Java keystores are not read here; "
                                  "give PEM files (ssl.cafile, ssl.certfile, ssl.keyfile)")
    options: dict[str, str] = {}
    for key, value in properties.items():
        name = _PROPERTY_NAMES.get(key)
        if name is not None and value:
            options[name] = value
    return ClientSecurity.from_options(**options)
