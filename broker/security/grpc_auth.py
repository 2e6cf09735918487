"""Who a gRPC client is, and what of its request it may have (the gRPC side of
``broker.security``).

Authentication (``grpc_session``), in order:

1. call metadata ``authorization: Session <token>``: a token the ``Sasl`` service
   issued after a SCRAM exchange (``grpc_sessions``), naming its user until
   ``connections.max.reauth.ms`` passed; unknown or expired ones are refused;
2. call metadata ``authorization: PLAIN <base64 of the SASL/PLAIN message
   "\\0user\\0password">`` (``client.security`` sends it for ``sasl_*``
   settings): the password is checked against the user's SCRAM credential,
   like SASL/PLAIN on the Kafka listener (verdicts cached per credential, so
   PBKDF2 runs once per user and password, not per call). A wrong one is
   refused (gRPC UNAUTHENTICATED, "SASL_AUTHENTICATION_FAILED: ..."). Use it
   over TLS: on a plaintext port the password crosses the network in clear, as
   SASL_PLAINTEXT's PLAIN does. Taken only when PLAIN is an enabled mechanism
   (or no mechanism is): a SCRAM-only server refuses passwords in call metadata;
3. else a verified client certificate's CN (where the listener asks for one:
   INTERNAL with TLS) is ``User:<CN>``;
4. else ``User:ANONYMOUS`` — refused outright when the broker has SASL
   mechanisms configured (an unauthenticated client gets nothing, as on the
   Kafka listener).

Authorization: the pure ``*_refusals`` functions take a request and
``allowed(operation, topic) -> bool``, remove what is refused from the request
in place and return the answers for it (TOPIC_AUTHORIZATION_FAILED), as
the Kafka listener does (``broker/kafka/apis.py``).
"""

from __future__ import annotations

import base64
import hashlib
from collections import OrderedDict
from collections.abc import (
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    MutableSequence,
    Sequence,
)
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tidewater.broker.clock import mono_ms
from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.grpc_sessions import SESSION_SCHEME, GrpcSessions
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ANONYMOUS, DESCRIBE, READ, WRITE, user_principal
from tidewater.proto.scram import (
    AUTHORIZATION_KEY,
    MECHANISMS,
    PLAIN_SCHEME,
    IterationsSeen,
    SaslAuthenticationError,
    ScramCredential,
    fake_credential,
    parse_plain,
    password_matches,
)
from tidewater.proto.tls import principal_of

VERDICTS_MAX = 1024

Allowed = Callable[[int, str], bool]  # (operation, topic) -> may


class _Topical(Protocol):
    """A request's item about one topic's partition (produce, fetch, list offsets...)."""

    @property
    def topic(self) -> str: ...


_Item = TypeVar("_Item", bound=_Topical)
_Answer = TypeVar("_Answer")


_VerdictKey = tuple[str, tuple[bytes, ...], bytes]
# Runs a check's PBKDF2 work somewhere (a thread, off the event loop) and gives its result.
WorkRunner = Callable[[Callable[[], bool]], Awaitable[bool]]


class PasswordChecker:
    """Password -> credential checks with a bounded cache of verdicts. The key holds the
    credential's StoredKey, so a changed or deleted credential never hits an old verdict.

    An unknown user costs the same work as a known one: the password is checked against
    a fake credential per SCRAM mechanism (``proto.scram.fake_credential``), always
    refused, so the time a wrong guess takes does not say whether the user exists."""

    def __init__(self, credentials_of: Callable[[str], list[ScramCredential]],
                 iterations_seen: IterationsSeen = lambda mechanism: ()):
        self._credentials_of = credentials_of
        self._iterations_seen = iterations_seen
        self._verdicts: OrderedDict[_VerdictKey, bool] = OrderedDict()

    def _lookup(self, user: str, password: str
                ) -> tuple[_VerdictKey, bool | None, Callable[[], bool]]:
        """(cache key, cached verdict or None, the work that decides it)."""
        credentials = self._credentials_of(user)
        key = (user, tuple(c.stored_key for c in credentials),
               hashlib.sha256(password.encode()).digest())
        if credentials:
            def work() -> bool:
                return any(password_matches(c, password) for c in credentials)
        else:
            fakes = [fake_credential(m, user, self._iterations_seen(m)) for m in MECHANISMS]

            def work() -> bool:
                for fake in fakes:  # the same PBKDF2 a known user's check runs
                    password_matches(fake, password)
                return False
        return key, self._verdicts.get(key), work

    def _remember(self, key: _VerdictKey, verdict: bool) -> None:
        self._verdicts[key] = verdict
        if len(self._verdicts) > VERDICTS_MAX:
            self._verdicts.popitem(last=False)

    def check(self, user: str, password: str) -> bool:
        """On the caller's thread (the gRPC paths)."""
        key, verdict, work = self._lookup(user, password)
        if verdict is None:
            verdict = work()
            self._remember(key, verdict)
        return verdict

    async def check_with(self, user: str, password: str, run: WorkRunner) -> bool:
        """The PBKDF2 work through ``run`` (a thread); the cache stays on the loop."""
        key, verdict, work = self._lookup(user, password)
        if verdict is None:
            verdict = await run(work)
            self._remember(key, verdict)
        return verdict


def peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` -> the address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:rest.find("]")]
    return rest.rpartition(":")[0] if kind == "ipv4" else rest


def _authorization(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    header = next((v for k, v in metadata if k == AUTHORIZATION_KEY), None)
    if header is None:
        return None
    return header.decode(errors="replace") if isinstance(header, bytes) else header


def plain_credentials(metadata: Iterable[tuple[str, str | bytes]]) -> tuple[str, str] | None:
    """(user, password) of the call's ``authorization: PLAIN ...`` metadata, or None
    without one; SaslAuthenticationError for a malformed one."""
    text = _authorization(metadata)
    if text is None or text.startswith(SESSION_SCHEME):
        return None
    if not text.startswith(PLAIN_SCHEME):
        raise SaslAuthenticationError("authorization metadata: only PLAIN and Session "
                                      "are understood")
    try:
        token = base64.b64decode(text[len(PLAIN_SCHEME):], validate=True)
    except ValueError:
        raise SaslAuthenticationError("authorization metadata is not base64") from None
    return parse_plain(token)


def session_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of the call's ``authorization: Session <token>`` metadata, or None."""
    text = _authorization(metadata)
    if text is None or not text.startswith(SESSION_SCHEME):
        return None
    return text[len(SESSION_SCHEME):].strip()


@dataclass(frozen=True)
class GrpcLogins:
    """What the server takes on its gRPC calls besides a certificate: a session token
    (after a SCRAM exchange, ``grpc_sessions``) and, only when PLAIN is an enabled
    mechanism (or none is), the PLAIN password in every call's metadata."""

    checker: PasswordChecker
    sessions: GrpcSessions | None = None
    plain_allowed: bool = True
    now_ms: Callable[[], int] = mono_ms


def _by_token(metadata: Iterable[tuple[str, str | bytes]], host: str,
              logins: GrpcLogins) -> Session | None:
    token = session_token(metadata)
    if token is None:
        return None
    if logins.sessions is None:
        raise SaslAuthenticationError("this server issues no session tokens")
    return Session(user_principal(logins.sessions.resolve(token, logins.now_ms())), host)


def _plain_of(metadata: Iterable[tuple[str, str | bytes]],
              logins: GrpcLogins) -> tuple[str, str] | None:
    credentials = plain_credentials(metadata)
    if credentials is not None and not logins.plain_allowed:
        raise SaslAuthenticationError("PLAIN is not an enabled SASL mechanism here: "
                                      "authenticate with SCRAM (the Sasl service)")
    return credentials


def _without_password(auth_context: Mapping[str, Sequence[bytes]], host: str, *,
                      sasl_required: bool) -> Session:
    principal = principal_of(auth_context)
    if principal is not None:
        return Session(user_principal(principal.name), host)
    if sasl_required:
        raise SaslAuthenticationError("this broker requires SASL credentials "
                                      "(sasl.username / sasl.password)")
    return Session(ANONYMOUS, host)


def grpc_session(metadata: Iterable[tuple[str, str | bytes]],
                 auth_context: Mapping[str, Sequence[bytes]], peer: str, *,
                 logins: GrpcLogins, sasl_required: bool) -> Session:
    """The caller's Session; SaslAuthenticationError refuses the call. The password is
    checked on the caller's thread (``grpc_session_off_loop`` for the broker's loop)."""
    host = peer_host(peer)
    metadata = tuple(metadata)
    if (session := _by_token(metadata, host, logins)) is not None:
        return session
    credentials = _plain_of(metadata, logins)
    if credentials is None:
        return _without_password(auth_context, host, sasl_required=sasl_required)
    user, password = credentials
    if not logins.checker.check(user, password):
        raise SaslAuthenticationError(f"authentication failed for user {user!r}")
    return Session(user_principal(user), host)


async def grpc_session_off_loop(metadata: Iterable[tuple[str, str | bytes]],
                                auth_context: Mapping[str, Sequence[bytes]], peer: str, *,
                                logins: GrpcLogins, run: WorkRunner,
                                sasl_required: bool) -> Session:
    """``grpc_session`` with the password's PBKDF2 work given to ``run`` (a thread)."""
    host = peer_host(peer)
    metadata = tuple(metadata)
    if (session := _by_token(metadata, host, logins)) is not None:
        return session
    credentials = _plain_of(metadata, logins)
    if credentials is None:
        return _without_password(auth_context, host, sasl_required=sasl_required)
    user, password = credentials
    if not await logins.checker.check_with(user, password, run):
        raise SaslAuthenticationError(f"authentication failed for user {user!r}")
    return Session(user_principal(user), host)


def _refusals(repeated: MutableSequence[_Item], allowed: Allowed, operation: int,
              answer: Callable[[_Item], _Answer]) -> list[_Answer]:
    """Remove from ``repeated`` the items whose topic the caller may not ``operation``;
    returns ``answer(item)`` for each (one authorizer question per topic)."""
    verdicts: dict[str, bool] = {}
    kept: list[_Item] = []
    refused: list[_Item] = []
    for item in repeated:
        if item.topic not in verdicts:
            verdicts[item.topic] = allowed(operation, item.topic)
        (kept if verdicts[item.topic] else refused).append(item)
    if refused:
        del repeated[:]
        repeated.extend(kept)
    return [answer(item) for item in refused]


def produce_refusals(request: pb.ProduceRequest,
                     allowed: Allowed) -> list[pb.ProducePartitionResponse]:
    return _refusals(request.partitions, allowed, WRITE, lambda p: pb.ProducePartitionResponse(
        topic=p.topic, partition=p.partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
        error_message=f"needs WRITE on topic {p.topic!r}", base_offset=-1, log_start_offset=-1))


def fetch_refusals(request: pb.FetchRequest,
                   allowed: Allowed) -> list[pb.FetchPartitionResponse]:
    return _refusals(request.partitions, allowed, READ, lambda p: pb.FetchPartitionResponse(
        topic=p.topic, partition=p.partition, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
        error_message=f"needs READ on topic {p.topic!r}", high_watermark=-1,
        log_start_offset=-1, log_end_offset=-1, leader_epoch=-1))


def list_offsets_refusals(request: pb.ListOffsetsRequest,
                          allowed: Allowed) -> list[pb.ListOffsetsPartitionResponse]:
    return _refusals(request.partitions, allowed, DESCRIBE,
                     lambda p: pb.ListOffsetsPartitionResponse(
                         topic=p.topic, partition=p.partition,
                         error_code=pb.TOPIC_AUTHORIZATION_FAILED, timestamp=-1, offset=-1,
                         leader_epoch=-1))


def offset_for_leader_epoch_refusals(request: pb.OffsetForLeaderEpochRequest, allowed: Allowed
                                     ) -> list[pb.OffsetForLeaderEpochPartitionResponse]:
    return _refusals(request.partitions, allowed, DESCRIBE,
                     lambda p: pb.OffsetForLeaderEpochPartitionResponse(
                         topic=p.topic, partition=p.partition,
                         error_code=pb.TOPIC_AUTHORIZATION_FAILED, leader_epoch=-1,
                         end_offset=-1))


def hide_undescribable(response: pb.MetadataResponse, allowed: Allowed, *,
                       named: bool) -> None:
    """Metadata: a topic the caller may not DESCRIBE is left out of a listing of every
    topic, and reported UNKNOWN_TOPIC_OR_PARTITION when named (existing or not)."""
    kept = []
    for t in response.topics:
        if allowed(DESCRIBE, t.name):
            kept.append(t)
        elif named:
            kept.append(pb.TopicMetadata(name=t.name, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION))
    del response.topics[:]
    response.topics.extend(kept)
