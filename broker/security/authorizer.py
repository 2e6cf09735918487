"""Who may do what: Kafka's StandardAuthorizer rules as a pure class.

``Authorizer(acls, super_users, allow_if_no_acl).authorize(principal, host,
operation, resource_type, name)``:

1. a principal in ``super_users`` may do everything;
2. a resource no ACL applies to (whatever its principal or operation) is
   allowed only with ``allow_if_no_acl`` (Kafka's
   ``allow.everyone.if.no.acl.found``, default false);
3. a DENY that matches the principal (or ``User:*``), the host (or ``*``) and
   the operation (or ALL) refuses, whatever allows it: deny wins;
4. an ALLOW of the operation, of ALL, or of an operation that implies it
   (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
   DESCRIBE_CONFIGS) allows;
5. anything else is refused.

``authorize_any(principal, host, operation, resource_type)`` is Kafka's
``authorizeByResourceType`` (KIP-679: an idempotent producer needs WRITE on
some topic): allowed when an ALLOW of the operation matches the principal on
some resource of the type and no DENY of it covers every name (literal ``*``).

ACLs are kept indexed by resource type; an instance is immutable and rebuilt
when the controller pushes a new set (``UpdateMetadata``).

``Session`` is what a connection authenticated as; ``allow_all`` answers for
a broker with no authorizer configured (every request taken, as before).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidewater.proto.acls import (
    ALL,
    ALLOW,
    ALTER,
    ALTER_CONFIGS,
    ANONYMOUS,
    ANY_HOST,
    ANY_PRINCIPAL,
    DELETE,
    DENY,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    LITERAL,
    READ,
    WILDCARD,
    WRITE,
    Acl,
)

_IMPLIED_BY: dict[int, frozenset[int]] = {
    DESCRIBE: frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER, ALL}),
    DESCRIBE_CONFIGS: frozenset({DESCRIBE_CONFIGS, ALTER_CONFIGS, ALL}),
}


@dataclass(frozen=True, slots=True)
class Session:
    """Who a connection is: ``User:<name>`` (or ANONYMOUS) and its peer address."""

    principal: str = ANONYMOUS
    host: str = ""


class Authorizer:
    def __init__(self, acls: Iterable[Acl], super_users: Iterable[str] = (), *,
                 allow_if_no_acl: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._by_type: dict[int, tuple[Acl, ...]] = {}
        grouped: dict[int, list[Acl]] = {}
        for acl in acls:
            grouped.setdefault(acl.resource_type, []).append(acl)
        self._by_type = {t: tuple(a) for t, a in grouped.items()}

    def authorize(self, principal: str, host: str, operation: int, resource_type: int,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        applying = [a for a in self._by_type.get(resource_type, ())
                    if a.matches_resource(resource_type, name)]
        if not applying:
            return self.allow_if_no_acl
        mine = [a for a in applying if a.principal in (principal, ANY_PRINCIPAL)
                and a.host in (host, ANY_HOST)]
        if any(a.permission == DENY and a.operation in (operation, ALL) for a in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, frozenset({operation, ALL}))
        return any(a.permission == ALLOW and a.operation in allowing for a in mine)

    def authorize_any(self, principal: str, host: str, operation: int,
                      resource_type: int) -> bool:
        if principal in self.super_users:
            return True
        rules = self._by_type.get(resource_type, ())
        if not rules:
            return self.allow_if_no_acl
        mine = [a for a in rules if a.principal in (principal, ANY_PRINCIPAL)
                and a.host in (host, ANY_HOST)]
        if any(a.permission == DENY and a.operation in (operation, ALL)
               and a.pattern_type == LITERAL and a.resource_name == WILDCARD for a in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, frozenset({operation, ALL}))
        return any(a.permission == ALLOW and a.operation in allowing for a in mine)

    def allows(self, session: Session, operation: int, resource_type: int, name: str) -> bool:
        return self.authorize(session.principal, session.host, operation, resource_type, name)
