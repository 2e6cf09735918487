"""Kafka's client quota APIs on the Kafka listener, forwarded to the controller
(``controller/quota_records.py``), as kafka-configs.sh --entity-type users/clients
and Admin.alterClientQuotas / describeClientQuotas send them.

=========================== ===== ============================================
API (key)                   vers  needs (when an authorizer is on)
=========================== ===== ============================================
DescribeClientQuotas (48)   0-1   DESCRIBE_CONFIGS on the cluster
AlterClientQuotas (49)      0-1   ALTER_CONFIGS on the cluster
=========================== ===== ============================================

An entity is a list of (entity_type, entity_name) with entity_type ``user`` or
``client-id`` and a null name for ``<default>``; anything else (another type, one
type twice) is INVALID_REQUEST for that entry, nothing forwarded for it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from tidewater.broker.kafka.client_quotas import ENTITY_CLIENT_ID, ENTITY_USER
from tidewater.broker.kafka.codec import RequestBody, RequestHead
from tidewater.broker.kafka.security_apis import AdminServices
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ALTER_CONFIGS, CLUSTER, CLUSTER_NAME, DESCRIBE_CONFIGS

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
SUPPORTED: dict[int, tuple[int, int]] = {DESCRIBE_CLIENT_QUOTAS: (0, 1),
                                         ALTER_CLIENT_QUOTAS: (0, 1)}
API_NAMES = {DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
             ALTER_CLIENT_QUOTAS: "AlterClientQuotas"}
_DENIED = "CLUSTER_AUTHORIZATION_FAILED: needs {op} on the cluster"


class BadEntityError(ValueError):
    """An entity the client sent that is no user / client-id entity."""


def entity_from_wire(parts: Any) -> pb.ClientQuotaEntity:
    entity = pb.ClientQuotaEntity()
    seen = set()
    for part in parts:
        if part.entity_type not in (ENTITY_USER, ENTITY_CLIENT_ID) or part.entity_type in seen:
            raise BadEntityError(f"entity type {part.entity_type!r} unknown or given twice")
        seen.add(part.entity_type)
        name = part.entity_name if part.entity_name is not None else ""
        if part.entity_type == ENTITY_USER:
            entity.user = name
        else:
            entity.client_id = name
    if not seen:
        raise BadEntityError("an empty entity")
    return entity


def entity_to_wire(entity: pb.ClientQuotaEntity) -> list[dict[str, Any]]:
    parts = []
    if entity.HasField("user"):
        parts.append({"entity_type": ENTITY_USER, "entity_name": entity.user or None})
    if entity.HasField("client_id"):
        parts.append({"entity_type": ENTITY_CLIENT_ID, "entity_name": entity.client_id or None})
    return parts


async def on_alter_client_quotas(s: AdminServices, head: RequestHead, body: RequestBody
                                 ) -> Awaitable[dict[str, Any]]:
    if not s.allowed(ALTER_CONFIGS, CLUSTER, CLUSTER_NAME):
        return _done({"throttle_time": 0, "entries": [
            {"error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
             "error_message": _DENIED.format(op="ALTER_CONFIGS"), "entity": list(e.entity)}
            for e in body.entries]})
    request = pb.AlterClientQuotasRequest(validate_only=bool(body.validate_only))
    # Per entry: its index in the forwarded request, or the refusal answered for it.
    slots: list[int | dict[str, Any]] = []
    for e in body.entries:
        try:
            entity = entity_from_wire(e.entity)
        except BadEntityError as error:
            slots.append({"error_code": pb.INVALID_REQUEST, "error_message": str(error),
                          "entity": [{"entity_type": p.entity_type,
                                      "entity_name": p.entity_name} for p in e.entity]})
            continue
        slots.append(len(request.alterations))
        request.alterations.add(entity=entity, ops=[
            pb.ClientQuotaOp(key=op.key, value=float(op.value), remove=bool(op.remove))
            for op in e.ops])

    async def answer() -> dict[str, Any]:
        response = (await s.controller.AlterClientQuotas(request, None)
                    if request.alterations else pb.AlterClientQuotasResponse())
        entries = []
        for slot in slots:
            if isinstance(slot, dict):
                entries.append(slot)
                continue
            r = response.results[slot]
            entries.append({"error_code": r.error_code, "error_message": r.error_message or None,
                            "entity": entity_to_wire(request.alterations[slot].entity)})
        return {"throttle_time": 0, "entries": entries}
    return answer()


async def on_describe_client_quotas(s: AdminServices, head: RequestHead, body: RequestBody
                                    ) -> Awaitable[dict[str, Any]]:
    if not s.allowed(DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME):
        return _done({"throttle_time": 0, "error_code": pb.CLUSTER_AUTHORIZATION_FAILED,
                      "error_message": _DENIED.format(op="DESCRIBE_CONFIGS"), "entries": None})
    request = pb.DescribeClientQuotasRequest(strict=bool(body.strict), components=[
        pb.ClientQuotaFilterComponent(entity_type=c.entity_type, match_type=int(c.match_type),
                                      match=c.match or "")
        for c in body.components])

    async def answer() -> dict[str, Any]:
        response = await s.controller.DescribeClientQuotas(request, None)
        if response.error_code != pb.NONE:
            return {"throttle_time": 0, "error_code": response.error_code,
                    "error_message": response.error_message or None, "entries": None}
        return {"throttle_time": 0, "error_code": pb.NONE, "error_message": None, "entries": [
            {"entity": entity_to_wire(e.entity),
             "values": [{"key": k, "value": v} for k, v in sorted(e.values.items())]}
            for e in response.entries]}
    return answer()


def _done(value: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    async def answer() -> dict[str, Any]:
        return value
    return answer()


HANDLERS = {DESCRIBE_CLIENT_QUOTAS: on_describe_client_quotas,
            ALTER_CLIENT_QUOTAS: on_alter_client_quotas}
