"""ACLs as Kafka has them: the binding, its validation and its filters (pure).

An ``Acl`` says: ``principal`` from ``host`` is ALLOWed or DENYed ``operation``
on resources of ``resource_type`` whose name equals ``resource_name``
(LITERAL; the literal name ``*`` is every resource of the type) or starts
with it (PREFIXED). Numbers are Kafka's (``ResourceType``, ``PatternType``,
``AclOperation``, ``AclPermissionType``), so they cross the Kafka wire,
``tidewater.proto`` (``AclBinding``) and the controller's metadata log
(``acl_created``/``acl_deleted`` records: the ``to_json`` fields) unchanged.

Principals are ``User:<name>``: a SASL user name, or a client certificate's
common name (CN); ``User:*`` is everyone. ``ANONYMOUS`` is a connection that
did not authenticate (plaintext, or TLS without a client certificate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidewater.proto import tidewater_pb2 as pb

# ResourceType
RESOURCE_ANY, TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 1, 2, 3, 4, 5
RESOURCE_NAMES = {TOPIC: "topic", GROUP: "group", CLUSTER: "cluster",
                  TRANSACTIONAL_ID: "transactional-id"}
CLUSTER_NAME = "kafka-cluster"
# PatternType
PATTERN_ANY, PATTERN_MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
PATTERN_NAMES = {LITERAL: "literal", PREFIXED: "prefixed"}
WILDCARD = "*"
# AclOperation
(OP_ANY, ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
 ALTER_CONFIGS, IDEMPOTENT_WRITE) = range(1, 13)
OPERATION_NAMES = {ALL: "all", READ: "read", WRITE: "write", CREATE: "create",
                   DELETE: "delete", ALTER: "alter", DESCRIBE: "describe",
                   CLUSTER_ACTION: "cluster_action", DESCRIBE_CONFIGS: "describe_configs",
                   ALTER_CONFIGS: "alter_configs", IDEMPOTENT_WRITE: "idempotent_write"}
# The operations each resource type has (Kafka's AclEntry.supportedOperations): what an
# authorized-operations bit field (KIP-430) is made of.
SUPPORTED_OPERATIONS: dict[int, tuple[int, ...]] = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER,
              DESCRIBE),
    TRANSACTIONAL_ID: (DESCRIBE, WRITE),
}
# Kafka's Int32.MIN_VALUE: "not asked for" in every authorized_operations field.
AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)
# AclPermissionType
PERMISSION_ANY, DENY, ALLOW = 1, 2, 3
PERMISSION_NAMES = {DENY: "deny", ALLOW: "allow"}

ANONYMOUS = "User:ANONYMOUS"
ANY_PRINCIPAL = "User:*"
ANY_HOST = "*"
NAME_BYTES_MAX = 1000


class InvalidAclError(ValueError):
    """A binding Kafka would refuse (INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def to_json(self) -> dict[str, Any]:
        return {"resource_type": self.resource_type, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type, "principal": self.principal,
                "host": self.host, "operation": self.operation, "permission": self.permission}

    @classmethod
    def from_json(cls, r: dict[str, Any]) -> Acl:
        return cls(int(r["resource_type"]), str(r["resource_name"]), int(r["pattern_type"]),
                   str(r["principal"]), str(r["host"]), int(r["operation"]),
                   int(r["permission"]))

    def to_pb(self) -> pb.AclBinding:
        return pb.AclBinding(resource_type=self.resource_type, resource_name=self.resource_name,
                             pattern_type=self.pattern_type, principal=self.principal,
                             host=self.host, operation=self.operation,
                             permission_type=self.permission)

    @classmethod
    def from_pb(cls, b: pb.AclBinding) -> Acl:
        return cls(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
                   b.operation, b.permission_type)

    def describe(self) -> str:
        return (f"{PERMISSION_NAMES.get(self.permission, self.permission)} {self.principal} "
                f"from {self.host} {OPERATION_NAMES.get(self.operation, self.operation)} on "
                f"{RESOURCE_NAMES.get(self.resource_type, self.resource_type)} "
                f"{PATTERN_NAMES.get(self.pattern_type, self.pattern_type)} "
                f"{self.resource_name!r}")

    def matches_resource(self, resource_type: int, name: str) -> bool:
        """Does this ACL apply to the resource (type, name)?"""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == LITERAL:
            return self.resource_name in (name, WILDCARD)
        return self.pattern_type == PREFIXED and name.startswith(self.resource_name)


def validate(acl: Acl) -> None:
    """InvalidAclError for a binding that cannot be stored (Kafka's checks)."""
    if acl.resource_type not in RESOURCE_NAMES:
        raise InvalidAclError(f"resource type {acl.resource_type} is not topic (2), "
                              "group (3), cluster (4) or transactional-id (5)")
    if acl.pattern_type not in PATTERN_NAMES:
        raise InvalidAclError(f"pattern type {acl.pattern_type} is not literal (3) or "
                              "prefixed (4)")
    if acl.operation not in OPERATION_NAMES:
        raise InvalidAclError(f"operation {acl.operation} is not one of 2..12")
    if acl.permission not in PERMISSION_NAMES:
        raise InvalidAclError(f"permission {acl.permission} is not deny (2) or allow (3)")
    if not acl.resource_name or len(acl.resource_name.encode()) > NAME_BYTES_MAX:
        raise InvalidAclError("resource name is empty or too long")
    if acl.resource_type == CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"the cluster resource is named {CLUSTER_NAME!r}")
    if acl.pattern_type == PREFIXED and acl.resource_name == WILDCARD:
        raise InvalidAclError("a prefixed pattern of '*' is not allowed: use literal '*'")
    kind, sep, name = acl.principal.partition(":")
    if kind != "User" or not sep or not name or len(acl.principal.encode()) > NAME_BYTES_MAX:
        raise InvalidAclError(f"principal {acl.principal!r} is not User:<name>")
    if not acl.host or len(acl.host) > 255:
        raise InvalidAclError("host is empty or too long")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: ``*_ANY`` / None mean any; PATTERN_MATCH with a name
    takes every ACL that applies to that name (literal, ``*`` and matching prefixes)."""

    resource_type: int = RESOURCE_ANY
    resource_name: str | None = None
    pattern_type: int = PATTERN_ANY
    principal: str | None = None
    host: str | None = None
    operation: int = OP_ANY
    permission: int = PERMISSION_ANY

    @classmethod
    def from_pb(cls, b: pb.AclBinding) -> AclFilter:
        """From the gRPC form, where 0 or 1 and "" mean any."""
        return cls(b.resource_type or RESOURCE_ANY, b.resource_name or None,
                   b.pattern_type or PATTERN_ANY, b.principal or None, b.host or None,
                   b.operation or OP_ANY, b.permission_type or PERMISSION_ANY)

    def matches(self, acl: Acl) -> bool:
        if self.resource_type != RESOURCE_ANY and acl.resource_type != self.resource_type:
            return False
        if self.pattern_type == PATTERN_MATCH:
            if self.resource_name is not None and not (
                    acl.matches_resource(acl.resource_type, self.resource_name)):
                return False
        else:
            if self.pattern_type != PATTERN_ANY and acl.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and acl.resource_name != self.resource_name:
                return False
        return ((self.principal is None or acl.principal == self.principal)
                and (self.host is None or acl.host == self.host)
                and (self.operation == OP_ANY or acl.operation == self.operation)
                and (self.permission == PERMISSION_ANY or acl.permission == self.permission))


def user_principal(name: str) -> str:
    return f"User:{name}"


def authorized_operations(allowed: Callable[[int, int, str], bool], resource_type: int,
                          name: str) -> int:
    """KIP-430's bit field: bit ``op`` set for each operation of the resource type that
    ``allowed(op, resource_type, name)`` grants (Kafka's ``Utils.to32BitField``). Without
    an authorizer ``allowed`` grants all, and every supported operation is set, as Kafka."""
    return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type]
               if allowed(op, resource_type, name))
