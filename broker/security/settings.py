"""A broker's client security settings and the live authorizer built from them.

``SecuritySettings`` come from the broker's flags (``--sasl-mechanisms``,
``--authorizer``, ``--super-users``, ``--allow-everyone-if-no-acl-found``) or
Kafka's names given with ``--set`` (``sasl.enabled.mechanisms``,
``authorizer.class.name`` = ``acl`` or Kafka's StandardAuthorizer/AclAuthorizer
class names, ``super.users``, ``allow.everyone.if.no.acl.found``,
``connections.max.reauth.ms``: a SASL session's lifetime, 0 = forever, KIP-368);
``BrokerSecurity`` joins them with the users and ACLs the controller pushed
(``MetadataCache``): ``allows(session, operation, resource_type, name)`` is the
one check every request path calls, and answers True for everything when no
authorizer is configured (as before security existed). The ``Authorizer`` is
rebuilt only when a new ACL set arrives.

Principals: a SASL user ``alice`` is ``User:alice``; on a TLS listener a
client certificate's CN is ``User:<CN>`` when the client does not use SASL;
anyone else is ``User:ANONYMOUS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tidewater.broker.security.authorizer import Authorizer, Session
from tidewater.broker.security.grpc_auth import (
    GrpcLogins,
    PasswordChecker,
    grpc_session,
    grpc_session_off_loop,
)
from tidewater.broker.security.grpc_sessions import GrpcSessions
from tidewater.broker.security.inter_broker import may_fetch_as_follower
from tidewater.proto.acls import CLUSTER, CLUSTER_NAME, IDEMPOTENT_WRITE, TOPIC, WRITE, Acl
from tidewater.proto.scram import MECHANISMS, SaslAuthenticationError, ScramCredential

PLAIN = "PLAIN"
SECURITY_SETTING_NAMES = frozenset({"sasl.enabled.mechanisms", "authorizer.class.name",
                                    "super.users", "allow.everyone.if.no.acl.found",
                                    "connections.max.reauth.ms",
                                    "connection.failed.authentication.delay.ms",
                                    "sasl.mechanism.inter.broker.protocol"})
# Kafka's authorizer class names mean "check ACLs" here; empty means none.
_KAFKA_AUTHORIZERS = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "kafka.security.authorizer.AclAuthorizer")
SASL_MECHANISMS = (PLAIN, *MECHANISMS)
AUTHORIZERS = ("none", "acl")
# SASL/PLAIN's password checks, off the event loop (``password_ok_off_loop``): one thread
# (the broker's other work needs the other cores), at most this many checks waiting.
PASSWORD_CHECK_THREADS = 1
PASSWORD_CHECKS_QUEUED_MAX = 32


@dataclass(frozen=True)
class SecuritySettings:
    sasl_mechanisms: tuple[str, ...] = ()  # empty: no SASL on the Kafka listeners
    authorizer: str = "none"  # "acl": every request is checked against the ACLs
    super_users: frozenset[str] = field(default_factory=frozenset)
    allow_everyone_if_no_acl_found: bool = False
    # KIP-368: a SASL session lasts this long, then the client must re-authenticate on
    # its connection or have it closed; 0 (Kafka's default): sessions never expire.
    reauth_ms: int = 0
    # KIP-306 (connection.failed.authentication.delay.ms): a failed authentication is
    # answered this late, on the Kafka listeners and gRPC alike.
    failed_authentication_delay_ms: int = 100
    # Kafka's sasl.mechanism.inter.broker.protocol: what a broker authenticates with to
    # the controller and to other brokers; "" picks (``inter_broker.inter_broker_mechanism``).
    inter_broker_mechanism: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.sasl_mechanisms) - set(SASL_MECHANISMS)
        if unknown:
            raise ValueError(f"unknown SASL mechanisms {sorted(unknown)}; known: "
                             f"{', '.join(SASL_MECHANISMS)}")
        if self.authorizer not in AUTHORIZERS:
            raise ValueError(f"--authorizer is one of {', '.join(AUTHORIZERS)}")
        for user in self.super_users:
            if not user.startswith("User:") or len(user) <= len("User:"):
                raise ValueError(f"super user {user!r} is not User:<name>")
        if self.failed_authentication_delay_ms < 0:
            raise ValueError("connection.failed.authentication.delay.ms must not be negative, "
                             f"not {self.failed_authentication_delay_ms}")
        if self.reauth_ms < 0:
            raise ValueError(f"connections.max.reauth.ms must not be negative, not {self.reauth_ms}")
        if self.inter_broker_mechanism and self.inter_broker_mechanism not in SASL_MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {self.inter_broker_mechanism!r}; known: "
                             f"{', '.join(SASL_MECHANISMS)}")

    def with_setting(self, name: str, value: str) -> SecuritySettings:
        """These settings with one of Kafka's (``SECURITY_SETTING_NAMES``); ValueError."""
        value = value.strip()
        if name == "sasl.enabled.mechanisms":
            return dataclasses.replace(self, sasl_mechanisms=tuple(
                m.strip() for m in value.split(",") if m.strip()))
        if name == "authorizer.class.name":
            authorizer = "acl" if value in _KAFKA_AUTHORIZERS else (value or "none")
            return dataclasses.replace(self, authorizer=authorizer)
        if name == "super.users":
            return dataclasses.replace(self, super_users=self.parse_super_users(value))
        if name == "allow.everyone.if.no.acl.found":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"expected true or false, not {value!r}")
            return dataclasses.replace(self, allow_everyone_if_no_acl_found=value.lower() == "true")
        if name == "connection.failed.authentication.delay.ms":
            if not value.isdigit():
                raise ValueError(f"expected milliseconds (0 or more), not {value!r}")
            return dataclasses.replace(self, failed_authentication_delay_ms=int(value))
        if name == "connections.max.reauth.ms":
            if not value.isdigit():
                raise ValueError(f"expected milliseconds (0 or more), not {value!r}")
            return dataclasses.replace(self, reauth_ms=int(value))
        if name == "sasl.mechanism.inter.broker.protocol":
            return dataclasses.replace(self, inter_broker_mechanism=value.upper())
        raise ValueError(f"not a security setting: {name}")

    @classmethod
    def parse_super_users(cls, text: str) -> frozenset[str]:
        """Kafka's ``super.users``: principals separated by ``;``."""
        return frozenset(u.strip() for u in text.split(";") if u.strip())


class UsersAndAcls(Protocol):
    """What ``BrokerSecurity`` reads of the metadata the controller pushed
    (``broker.replicas.metadata_cache.MetadataCache``; tests pass their own)."""

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None: ...

    def user_credentials(self, user: str) -> list[ScramCredential]: ...

    def acls(self) -> tuple[Acl, ...]: ...

    def scram_iterations(self, mechanism: str) -> list[int]:
        """The iteration counts of the known users' credentials of ``mechanism``."""
        ...


class CallerContext(Protocol):
    """What ``BrokerSecurity.grpc_session`` reads of a call (``grpc.aio.ServicerContext``).
    Typed without ``grpc``: ``broker/__main__.py`` imports this module (via config.py)
    before ``proto/grpc_env.py`` may let anything import ``grpc``."""

    def invocation_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...

    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...

    def peer(self) -> str: ...


class BrokerSecurity:
    def __init__(self, settings: SecuritySettings, metadata_cache: UsersAndAcls) -> None:
        self.settings = settings
        self._cache = metadata_cache
        self._acls: tuple[Acl, ...] | None = None
        self._authorizer: Authorizer | None = None
        self._passwords = PasswordChecker(self.user_credentials, metadata_cache.scram_iterations)
        # SCRAM over gRPC (the Sasl service) and the session tokens it issues.
        self.grpc_sessions = GrpcSessions(self.scram_credential, self.scram_iterations,
                                          lifetime_ms=settings.reauth_ms)
        self._logins = GrpcLogins(self._passwords, self.grpc_sessions,
                                  plain_allowed=self.plain_over_grpc)
        # SASL/PLAIN's PBKDF2 (~4 ms a check) runs on these threads, not the event loop, at
        # most PASSWORD_CHECKS_QUEUED_MAX checks queued or running (more wait their turn,
        # each on its own connection): a burst of wrong guesses delays only logins.
        self._password_threads: ThreadPoolExecutor | None = None
        self._password_slots: asyncio.Semaphore | None = None

    @property
    def sasl_enabled(self) -> bool:
        return bool(self.settings.sasl_mechanisms)

    @property
    def plain_over_grpc(self) -> bool:
        """May a gRPC call carry a PLAIN password? Only where PLAIN is an enabled
        mechanism (or none is): with SCRAM only, passwords never cross the network."""
        return not self.settings.sasl_mechanisms or PLAIN in self.settings.sasl_mechanisms

    @property
    def secured(self) -> bool:
        """SASL or an authorizer: the gRPC client paths check who calls."""
        return self.sasl_enabled or self.settings.authorizer != "none"

    def password_ok(self, user: str, password: str) -> bool:
        """``password`` against ``user``'s SCRAM credentials (SASL/PLAIN, gRPC), the
        verdict cached per credential so a client's reconnects cost no PBKDF2."""
        return self._passwords.check(user, password)

    async def password_ok_off_loop(self, user: str, password: str) -> bool:
        """``password_ok`` with the PBKDF2 work on the password threads (SASL/PLAIN on the
        Kafka listeners): the event loop serves other connections meanwhile."""
        return await self._passwords.check_with(user, password, self._run_password_work)

    async def _run_password_work(self, work: Callable[[], bool]) -> bool:
        if self._password_threads is None:
            self._password_threads = ThreadPoolExecutor(PASSWORD_CHECK_THREADS,
                                                        thread_name_prefix="password-check")
        if self._password_slots is None:
            self._password_slots = asyncio.Semaphore(PASSWORD_CHECKS_QUEUED_MAX)
        async with self._password_slots:
            return await asyncio.get_running_loop().run_in_executor(self._password_threads, work)

    def close(self) -> None:
        """Stop the password threads (a check in progress finishes; queued ones are
        dropped, their connections are closing with the broker)."""
        if self._password_threads is not None:
            self._password_threads.shutdown(wait=False, cancel_futures=True)
            self._password_threads = None

    def scram_iterations(self, mechanism: str) -> list[int]:
        return self._cache.scram_iterations(mechanism)

    async def authenticate_grpc(self, context: CallerContext) -> Session:
        """The gRPC caller's Session, its password checked off the event loop; a refusal
        (SaslAuthenticationError) comes ``failed_authentication_delay_ms`` late (KIP-306,
        as on the Kafka listeners; only this call waits)."""
        try:
            return await grpc_session_off_loop(
                context.invocation_metadata() or (),
                {k: list(v) for k, v in context.auth_context().items()}, context.peer() or "",
                logins=self._logins, run=self._run_password_work,
                sasl_required=self.sasl_enabled)
        except SaslAuthenticationError:
            await self.failure_delay()
            raise

    async def check_call_metadata(self, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Does the call's metadata alone (a session token, a PLAIN password) authenticate
        its caller? SaslAuthenticationError, ``failed_authentication_delay_ms`` late, if
        not (``grpc_preauth``: before anything of the request is read)."""
        try:
            await grpc_session_off_loop(metadata, {}, "", logins=self._logins,
                                        run=self._run_password_work, sasl_required=True)
        except SaslAuthenticationError:
            await self.failure_delay()
            raise

    async def failure_delay(self) -> None:
        """KIP-306's wait before a failed authentication is answered."""
        if self.settings.failed_authentication_delay_ms > 0:
            await asyncio.sleep(self.settings.failed_authentication_delay_ms / 1000)

    def grpc_session(self, context: CallerContext) -> Session:
        """The gRPC caller's Session (``grpc_security``); SaslAuthenticationError refuses."""
        return grpc_session(context.invocation_metadata() or (),
                            {k: list(v) for k, v in context.auth_context().items()},
                            context.peer() or "", logins=self._logins,
                            sasl_required=self.sasl_enabled)

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._cache.scram_credential(user, mechanism)

    def user_credentials(self, user: str) -> list[ScramCredential]:
        return self._cache.user_credentials(user)

    def authorizer(self) -> Authorizer | None:
        if self.settings.authorizer == "none":
            return None
        acls = self._cache.acls()
        if acls is not self._acls or self._authorizer is None:
            self._authorizer = Authorizer(
                acls, self.settings.super_users,
                allow_if_no_acl=self.settings.allow_everyone_if_no_acl_found)
            self._acls = acls
        return self._authorizer

    def allows(self, session: Session, operation: int, resource_type: int, name: str) -> bool:
        authorizer = self.authorizer()
        return authorizer is None or authorizer.allows(session, operation, resource_type, name)

    def may_fetch_as_follower(self, session: Session) -> bool:
        """CLUSTER_ACTION on the cluster (``inter_broker.may_fetch_as_follower``)."""
        return may_fetch_as_follower(session, has_authorizer=self.settings.authorizer != "none",
                                     allows=self.allows, super_users=self.settings.super_users)

    def allows_any(self, session: Session, operation: int, resource_type: int) -> bool:
        """May ``session`` do ``operation`` on some resource of the type (KIP-679)?"""
        authorizer = self.authorizer()
        return authorizer is None or authorizer.authorize_any(session.principal, session.host,
                                                              operation, resource_type)


def may_init_producer_id(allows: Callable[[int, int, str], bool],
                         allows_any: Callable[[int, int], bool]) -> bool:
    """May a caller get a producer id (idempotent, no transactional id)? Kafka's rule
    since KIP-679: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic. ``allows``:
    (operation, resource type, name) -> bool for the caller; ``allows_any``: (operation,
    resource type) -> bool. The one rule of both the Kafka listener and gRPC."""
    return allows(IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME) or allows_any(WRITE, TOPIC)


def open_security() -> BrokerSecurity:
    """No SASL, no authorizer: every request taken (tests and tools that build Services)."""

    class _NoCache:
        def scram_credential(self, user: str, mechanism: str) -> None:
            return None

        def user_credentials(self, user: str) -> list[ScramCredential]:
            return []

        def acls(self) -> tuple[Acl, ...]:
            return ()

        def scram_iterations(self, mechanism: str) -> list[int]:
            return []
    return BrokerSecurity(SecuritySettings(), _NoCache())


def read_user_config(path: Path) -> tuple[str, str]:
    """(sasl.username, sasl.password) of a Kafka client properties file; ValueError."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    user, password = values.get("sasl.username"), values.get("sasl.password")
    if not user or not password:
        raise ValueError(f"{path} needs sasl.username and sasl.password")
    return user, password
