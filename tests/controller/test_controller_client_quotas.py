"""Client quota records and commands (``controller/quota_records.py``): what an
alteration appends, what it refuses, Kafka's describe filter, and a snapshot that
replays to the same image."""

from __future__ import annotations

import pytest

from tidewater.broker.kafka.client_quotas import QuotaEntity
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.quota_records import alter_client_quotas, describe_client_quotas
from tidewater.controller.state_machine import Tx
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)


def entity(user: str | None = None, client_id: str | None = None) -> pb.ClientQuotaEntity:
    e = pb.ClientQuotaEntity()
    if user is not None:
        e.user = user
    if client_id is not None:
        e.client_id = client_id
    return e


def alter(metadata: ClusterMetadata, *alterations: pb.ClientQuotaAlteration,
          validate_only: bool = False) -> tuple[list[int], list[dict]]:
    tx = Tx(metadata, metadata.last_offset + 1)
    response = alter_client_quotas(tx, metadata.quotas, pb.AlterClientQuotasRequest(
        alterations=list(alterations), validate_only=validate_only))
    return [r.error_code for r in response.results], tx.records


def op(key: str, value: float = 0, remove: bool = False) -> pb.ClientQuotaOp:
    return pb.ClientQuotaOp(key=key, value=value, remove=remove)


def test_alter_appends_records_and_refuses_bad_alterations_alone():
    metadata = ClusterMetadata()
    codes, records = alter(
        metadata,
        pb.ClientQuotaAlteration(entity=entity("alice"), ops=[op("producer_byte_rate", 1000)]),
        pb.ClientQuotaAlteration(entity=entity(client_id=""), ops=[op("bogus", 5)]),
        pb.ClientQuotaAlteration(entity=entity(), ops=[op("producer_byte_rate", 5)]),
        pb.ClientQuotaAlteration(entity=entity("bob", "app"),
                                 ops=[op("consumer_byte_rate", -1)]))
    assert codes == [pb.NONE, pb.INVALID_REQUEST, pb.INVALID_REQUEST, pb.INVALID_REQUEST]
    assert records == [{"type": "client_quota", "user": "alice", "client_id": None,
                        "key": "producer_byte_rate", "value": 1000.0}]
    assert metadata.quotas.configs == {QuotaEntity("alice", None): {"producer_byte_rate": 1000}}
    # The same value again appends nothing; removing what is not there appends nothing.
    assert alter(metadata, pb.ClientQuotaAlteration(
        entity=entity("alice"), ops=[op("producer_byte_rate", 1000),
                                     op("consumer_byte_rate", remove=True)]))[1] == []
    assert alter(metadata, pb.ClientQuotaAlteration(
        entity=entity("alice"), ops=[op("producer_byte_rate", remove=True)]),
        validate_only=True)[1] == []
    codes, records = alter(metadata, pb.ClientQuotaAlteration(
        entity=entity("alice"), ops=[op("producer_byte_rate", remove=True)]))
    assert codes == [pb.NONE] and len(records) == 1
    assert metadata.quotas.configs == {}


def test_describe_filters_as_kafka_and_snapshot_replays():
    metadata = ClusterMetadata()
    for e in (entity("alice"), entity("alice", "app"), entity("", ""), entity(client_id="app"),
              entity(client_id="")):
        assert alter(metadata, pb.ClientQuotaAlteration(
            entity=e, ops=[op("consumer_byte_rate", 100)]))[0] == [pb.NONE]

    def described(strict: bool, *components: tuple[str, int, str]) -> list[tuple]:
        response = describe_client_quotas(metadata.quotas, pb.DescribeClientQuotasRequest(
            strict=strict, components=[pb.ClientQuotaFilterComponent(
                entity_type=t, match_type=m, match=n) for t, m, n in components]))
        assert response.error_code == pb.NONE
        return [(e.entity.user if e.entity.HasField("user") else None,
                 e.entity.client_id if e.entity.HasField("client_id") else None)
                for e in response.entries]

    assert set(described(False, ("user", 0, "alice"))) == {("alice", None), ("alice", "app")}
    assert described(True, ("user", 0, "alice")) == [("alice", None)]
    assert described(True, ("client-id", 1, "")) == [(None, "")]
    assert set(described(False, ("client-id", 2, ""))) == {
        (None, ""), (None, "app"), ("", ""), ("alice", "app")}
    bad = describe_client_quotas(metadata.quotas, pb.DescribeClientQuotasRequest(
        components=[pb.ClientQuotaFilterComponent(entity_type="ip", match_type=2)]))
    assert bad.error_code == pb.INVALID_REQUEST

    replayed = ClusterMetadata()
    for offset, record in enumerate(metadata.quotas.snapshot_records()):
        replayed.apply(offset, record)
    assert replayed.quotas.configs == metadata.quotas.configs
    assert len(metadata.quotas.quotas_pb()) == 5
