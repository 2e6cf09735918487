"""broker/servicers/grpc_quotas.py: who a gRPC call is charged as, and what."""

from __future__ import annotations

from tidewater.broker.kafka.client_quotas import (
    PRODUCER_BYTE_RATE,
    ClientQuotas,
    QuotaEntity,
)
from tidewater.broker.security.authorizer import Session
from tidewater.broker.servicers.grpc_quotas import GrpcQuotas, client_id_of, quota_user
from tidewater.proto import tidewater_pb2 as pb


def test_the_quota_user_is_the_principals_name_or_anonymous():
    assert quota_user(Session("User:alice")) == "alice"
    assert quota_user(None) == "ANONYMOUS"


def test_the_client_id_comes_from_call_metadata_when_sent():
    assert client_id_of([("authorization", "x"), ("client-id", "app")]) == "app"
    assert client_id_of([("client-id", b"app")]) == "app"
    assert client_id_of(None) == ""


def test_a_producer_over_its_quota_is_told_to_wait_and_others_are_not():
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity(user="alice"), PRODUCER_BYTE_RATE, 1000.0)
    now = [0]
    charged = GrpcQuotas(lambda: quotas, clock_ms=lambda: now[0])
    request = pb.ProduceRequest(partitions=[
        pb.ProducePartitionData(topic="t", partition=0, records=b"x" * 3000)])
    assert charged.charge_produce("alice", "", request) > 0   # 3 s of quota at once
    assert charged.charge_produce("bob", "", request) == 0    # no quota for bob
