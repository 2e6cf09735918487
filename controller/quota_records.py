"""Client quotas (issue 29): their part of the metadata image, their record, and the
controller's commands on them (pure, as ``security_records``).

Record in the metadata log (``metadata`` applies it through ``QuotaImage``):

=============  ==============================================================
type           fields
=============  ==============================================================
client_quota   user, client_id (each absent: null; ``<default>``: ""), key
               (``producer_byte_rate``, ``consumer_byte_rate``,
               ``request_percentage``), value (a number; null removes it)
=============  ==============================================================

Every change is a record appended through ``Tx``, durable before it is answered, and
reaches every broker in the next full ``UpdateMetadata`` (``client_quotas``), where
``broker.kafka.client_quotas.ClientQuotas`` enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidewater.broker.kafka.client_quotas import (
    ENTITY_CLIENT_ID,
    ENTITY_USER,
    QuotaConfigError,
    QuotaEntity,
    entity_from_pb,
    entity_to_pb,
    validate_quota,
)
from tidewater.proto import tidewater_pb2 as pb

if TYPE_CHECKING:
    from tidewater.controller.metadata_log import MetadataRecord
    from tidewater.controller.state_machine import Tx

ENTITIES_MAX = 100_000
ALTERATIONS_PER_REQUEST_MAX = 1_000
# Kafka's DescribeClientQuotas match types.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

RECORD_TYPES = ("client_quota",)


@dataclass
class QuotaImage:
    configs: dict[QuotaEntity, dict[str, float]] = field(default_factory=dict)

    def apply(self, kind: str, r: MetadataRecord) -> None:
        if kind != "client_quota":
            raise ValueError(f"not a quota record: {kind}")
        entity = QuotaEntity(r["user"], r["client_id"])
        if r["value"] is None:
            values = self.configs.get(entity, {})
            values.pop(str(r["key"]), None)
            if not values:
                self.configs.pop(entity, None)
        else:
            self.configs.setdefault(entity, {})[str(r["key"])] = float(r["value"])

    def snapshot_records(self) -> list[MetadataRecord]:
        return [quota_record(entity, key, value)
                for entity in sorted(self.configs, key=_sort_key)
                for key, value in sorted(self.configs[entity].items())]

    def quotas_pb(self) -> list[pb.ClientQuotaValues]:
        return [pb.ClientQuotaValues(entity=entity_to_pb(entity), values=values)
                for entity, values in sorted(self.configs.items(), key=lambda i: _sort_key(i[0]))]


def _sort_key(entity: QuotaEntity) -> tuple[str, str]:
    return ("\0" if entity.user is None else entity.user,
            "\0" if entity.client_id is None else entity.client_id)


def quota_record(entity: QuotaEntity, key: str, value: float | None) -> MetadataRecord:
    return {"type": "client_quota", "user": entity.user, "client_id": entity.client_id,
            "key": key, "value": value}


# ---------------------------------------------------------------- commands

def alter_client_quotas(tx: Tx, image: QuotaImage, req: pb.AlterClientQuotasRequest,
                        ) -> pb.AlterClientQuotasResponse:
    """One result per alteration, in order; an alteration is applied whole or not at
    all (INVALID_REQUEST: a bad entity or op; Kafka answers INVALID_REQUEST for an
    unknown key and a non-positive value too)."""
    response = pb.AlterClientQuotasResponse()
    entities_after = set(image.configs)
    for alteration in req.alterations:
        result = response.results.add(error_code=pb.NONE, entity=alteration.entity)
        try:
            if len(req.alterations) > ALTERATIONS_PER_REQUEST_MAX:
                raise QuotaConfigError(f"more than {ALTERATIONS_PER_REQUEST_MAX} alterations")
            entity = entity_from_pb(alteration.entity)
            keys = [op.key for op in alteration.ops]
            if len(set(keys)) != len(keys):
                raise QuotaConfigError("the same quota twice in one entity's alteration")
            for op in alteration.ops:
                validate_quota(op.key, 1.0 if op.remove else op.value)
            adds = any(not op.remove for op in alteration.ops)
            if adds and entity not in entities_after and len(entities_after) >= ENTITIES_MAX:
                raise QuotaConfigError(f"the cluster holds {ENTITIES_MAX} quota entities")
        except QuotaConfigError as e:
            result.error_code, result.error_message = pb.INVALID_REQUEST, str(e)
            continue
        if req.validate_only:
            continue
        current = image.configs.get(entity, {})
        for op in alteration.ops:
            if op.remove:
                if op.key in current:
                    tx.append(quota_record(entity, op.key, None))
            elif current.get(op.key) != op.value:
                tx.append(quota_record(entity, op.key, op.value))
        if adds:
            entities_after.add(entity)
    return response


def _component_matches(entity: QuotaEntity, c: pb.ClientQuotaFilterComponent) -> bool:
    name = entity.user if c.entity_type == ENTITY_USER else entity.client_id
    if name is None:
        return False
    if c.match_type == MATCH_EXACT:
        return name == c.match
    if c.match_type == MATCH_DEFAULT:
        return name == ""
    return True


def describe_client_quotas(image: QuotaImage, req: pb.DescribeClientQuotasRequest,
                           ) -> pb.DescribeClientQuotasResponse:
    """Kafka's filter: every component must match; ``strict`` also excludes entities
    with a part no component names."""
    types = [c.entity_type for c in req.components]
    for c in req.components:
        if c.entity_type not in (ENTITY_USER, ENTITY_CLIENT_ID) or types.count(c.entity_type) > 1 \
                or c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return pb.DescribeClientQuotasResponse(
                error_code=pb.INVALID_REQUEST,
                error_message=f"bad filter component {c.entity_type!r} {c.match_type}")
    response = pb.DescribeClientQuotasResponse(error_code=pb.NONE)
    for entity, values in sorted(image.configs.items(), key=lambda i: _sort_key(i[0])):
        if not all(_component_matches(entity, c) for c in req.components):
            continue
        parts = {t for t, n in ((ENTITY_USER, entity.user), (ENTITY_CLIENT_ID, entity.client_id))
                 if n is not None}
        if req.strict and parts - set(types):
            continue
        response.entries.add(entity=entity_to_pb(entity), values=values)
    return response
