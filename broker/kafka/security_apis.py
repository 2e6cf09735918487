"""Kafka's ACL and SCRAM-user APIs on the Kafka listener, forwarded to the controller.

============================== ===== ==========================================
API (key)                      vers  needs (when an authorizer is on)
============================== ===== ==========================================
DescribeAcls (29)              1-3   DESCRIBE on the cluster
CreateAcls (30)                1-3   ALTER on the cluster
DeleteAcls (31)                1-3   ALTER on the cluster
DescribeUserScramCredentials   0     DESCRIBE on the cluster
(50)
AlterUserScramCredentials (51) 0     ALTER on the cluster
============================== ===== ==========================================

Refused: CLUSTER_AUTHORIZATION_FAILED on every item, nothing forwarded.
AlterUserScramCredentials carries Kafka's SaltedPassword; the broker derives
StoredKey and ServerKey from it (``proto.scram``) and forwards only those.
v0 of the ACL APIs (no pattern type) is not served: confluent-kafka and
kafka-python send v1+.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable
from typing import Any, Protocol

from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.servicers.admin_forwarding import ControllerForwarder
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE, Acl
from tidewater.proto.scram import MECHANISMS

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
SUPPORTED: dict[int, tuple[int, int]] = {
    DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0), ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}
# Kafka's ScramMechanism numbers on the wire.
MECHANISM_NUMBERS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_BY_NUMBER = {n: name for name, n in MECHANISM_NUMBERS.items()}
_DENIED = "CLUSTER_AUTHORIZATION_FAILED: needs {op} on the cluster"


class AdminServices(Protocol):
    """What these APIs reach of ``apis.Services``."""

    @property
    def controller(self) -> ControllerForwarder: ...

    def allowed(self, operation: int, resource_type: int, name: str) -> bool: ...


def _allowed(s: AdminServices, operation: int) -> bool:
    return s.allowed(operation, CLUSTER, CLUSTER_NAME)


async def on_create_acls(s: AdminServices, head: RequestHead, body: RequestBody
                        ) -> Awaitable[dict[str, Any]]:
    if not _allowed(s, ALTER):
        return _done({"throttle_time": 0, "results": [
            {"error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
             "error_message": _DENIED.format(op="ALTER")} for _ in body.creations]})
    request = pb.CreateAclsRequest(creations=[
        pb.AclBinding(resource_type=c.resource_type, resource_name=c.resource_name,
                      pattern_type=c.resource_pattern_type, principal=c.principal, host=c.host,
                      operation=c.operation, permission_type=c.permission_type)
        for c in body.creations])

    async def answer() -> dict[str, Any]:
        response = await s.controller.CreateAcls(request, None)
        return {"throttle_time": 0, "results": [
            {"error_code": r.error_code, "error_message": r.error_message or None}
            for r in response.results]}
    return answer()


def _filter(f: RequestBody) -> pb.AclBinding:
    """A Kafka filter (describe or delete) in the gRPC form (0/"" = any)."""
    return pb.AclBinding(resource_type=f.resource_type_filter,
                         resource_name=f.resource_name_filter or "",
                         pattern_type=f.pattern_type_filter, principal=f.principal_filter or "",
                         host=f.host_filter or "", operation=f.operation,
                         permission_type=f.permission_type)


async def on_describe_acls(s: AdminServices, head: RequestHead, body: RequestBody
                          ) -> Awaitable[dict[str, Any]]:
    if not _allowed(s, DESCRIBE):
        return _done({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                      "error_message": _DENIED.format(op="DESCRIBE"), "resources": []})
    request = pb.DescribeAclsRequest(filter=_filter(body))

    async def answer() -> dict[str, Any]:
        response = await s.controller.DescribeAcls(request, None)
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in response.acls:
            resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                {"principal": b.principal, "host": b.host, "operation": b.operation,
                 "permission_type": b.permission_type})
        return {"throttle_time": 0, "error_code": response.error_code,
                "error_message": response.error_message or None, "resources": [
                    {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                    for (t, n, p), acls in resources.items()]}
    return answer()


async def on_delete_acls(s: AdminServices, head: RequestHead, body: RequestBody
                        ) -> Awaitable[dict[str, Any]]:
    if not _allowed(s, ALTER):
        return _done({"throttle_time": 0, "filter_results": [
            {"error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
             "error_message": _DENIED.format(op="ALTER"), "matching_acls": []}
            for _ in body.filters]})
    request = pb.DeleteAclsRequest(filters=[_filter(f) for f in body.filters])

    async def answer() -> dict[str, Any]:
        response = await s.controller.DeleteAcls(request, None)
        return {"throttle_time": 0, "filter_results": [
            {"error_code": r.error_code, "error_message": r.error_message or None,
             "matching_acls": [{"error_code": pb.NONE, "error_message": None,
                                **_acl_fields(Acl.from_pb(b))} for b in r.deleted]}
            for r in response.results]}
    return answer()


def _acl_fields(acl: Acl) -> dict[str, Any]:
    return {"resource_type": acl.resource_type, "resource_name": acl.resource_name,
            "pattern_type": acl.pattern_type, "principal": acl.principal, "host": acl.host,
            "operation": acl.operation, "permission_type": acl.permission}


def derived_credential(user: str, mechanism: str, iterations: int, salt: bytes,
                       salted_password: bytes) -> pb.ScramCredential:
    """StoredKey and ServerKey from Kafka's SaltedPassword (RFC 5802)."""
    name = MECHANISMS[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", name).digest()
    return pb.ScramCredential(user=user, mechanism=mechanism, salt=salt, iterations=iterations,
                              stored_key=hashlib.new(name, client_key).digest(),
                              server_key=hmac.new(salted_password, b"Server Key", name).digest())


async def on_alter_user_scram_credentials(s: AdminServices, head: RequestHead, body: RequestBody
                                         ) -> Awaitable[dict[str, Any]]:
    names = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
    if not _allowed(s, ALTER):
        return _done({"throttle_time": 0, "results": [
            {"user": n, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
             "error_message": _DENIED.format(op="ALTER")} for n in names]})
    refused: list[dict[str, Any]] = []
    request = pb.AlterUserScramCredentialsRequest()
    for d in body.deletions:
        if d.mechanism not in MECHANISM_BY_NUMBER:
            refused.append({"user": d.name, "error_code": pb.UNACCEPTABLE_CREDENTIAL,
                            "error_message": f"unknown SCRAM mechanism {d.mechanism}"})
        else:
            request.deletions.add(user=d.name, mechanism=MECHANISM_BY_NUMBER[d.mechanism])
    for u in body.upsertions:
        mechanism = MECHANISM_BY_NUMBER.get(u.mechanism)
        size = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}.get(mechanism or "")
        if mechanism is None or len(u.salted_password) != size:
            refused.append({"user": u.name, "error_code": pb.UNACCEPTABLE_CREDENTIAL,
                            "error_message": f"mechanism {u.mechanism} with a salted password "
                                             f"of {len(u.salted_password)} bytes"})
            continue
        request.upsertions.append(derived_credential(u.name, mechanism, u.iterations,
                                                     bytes(u.salt), bytes(u.salted_password)))

    async def answer() -> dict[str, Any]:
        response = await s.controller.AlterUserScramCredentials(request, None)
        # Kafka answers one result per user.
        results: dict[str, dict[str, Any]] = {}
        for r in [*({"user": r.user, "error_code": r.error_code,
                     "error_message": r.error_message or None} for r in response.results),
                  *refused]:
            if r["user"] not in results or results[r["user"]]["error_code"] == pb.NONE:
                results[r["user"]] = r
        return {"throttle_time": 0, "results": list(results.values())}
    return answer()


async def on_describe_user_scram_credentials(s: AdminServices, head: RequestHead, body: RequestBody
                                            ) -> Awaitable[dict[str, Any]]:
    if not _allowed(s, DESCRIBE):
        return _done({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                      "error_message": _DENIED.format(op="DESCRIBE"), "results": []})
    request = pb.DescribeUserScramCredentialsRequest(
        users=[u.name for u in (body.users or ())])

    async def answer() -> dict[str, Any]:
        response = await s.controller.DescribeUserScramCredentials(request, None)
        return {"throttle_time": 0, "error_code": pb.NONE, "error_message": None, "results": [
            {"user": u.user, "error_code": u.error_code,
             "error_message": "no SCRAM credential" if u.error_code else None,
             "credential_infos": [{"mechanism": MECHANISM_NUMBERS[m], "iterations": i}
                                  for m, i in zip(u.mechanisms, u.iterations, strict=False)]}
            for u in response.users]}
    return answer()


def _done(value: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    async def answer() -> dict[str, Any]:
        return value
    return answer()


HANDLERS = {
    DESCRIBE_ACLS: on_describe_acls, CREATE_ACLS: on_create_acls, DELETE_ACLS: on_delete_acls,
    DESCRIBE_USER_SCRAM_CREDENTIALS: on_describe_user_scram_credentials,
    ALTER_USER_SCRAM_CREDENTIALS: on_alter_user_scram_credentials,
}
