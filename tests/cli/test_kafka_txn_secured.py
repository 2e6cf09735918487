"""Issue 27: transaction markers between brokers on secured clusters.

The transaction coordinator sends WriteTxnMarkers to other partitions' leaders over
their INTERNAL gRPC, presenting what the follower fetchers present: with SASL the
brokers' ``inter.broker.credentials.file`` user, with TLS the broker's certificate. A
caller without credentials is refused (UNAUTHENTICATED), one without CLUSTER_ACTION gets
CLUSTER_AUTHORIZATION_FAILED for every partition and nothing is written; a transaction
over partitions led by all three brokers commits and aborts with confluent-kafka on a
SASL_PLAINTEXT cluster and on a SASL_SSL (mutual TLS inside) cluster (each leader
verifying the transaction's first batch with the coordinator, KIP-890, with the same
credentials; a caller without CLUSTER_ACTION is refused there too).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import describe_topic, run_tide, start_cluster, stop_cluster, wait_for
from test_kafka_txn_e2e import read_all

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.scram import plain_metadata
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")


def _secured(tmp_path_factory, name: str, tls: bool):
    c = start_cluster(tmp_path_factory.mktemp(name), 3, "min.insync.replicas=2",
                      "transaction.state.log.num.partitions=3", tls=tls,
                      up_flags=("--sasl-mechanisms", "PLAIN"))
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.manifest_data = manifest  # type: ignore[attr-defined]
    c.kafka = manifest["kafka_bootstrap"]  # type: ignore[attr-defined]
    c.sasl = manifest["sasl"]  # type: ignore[attr-defined]
    c.ca = manifest["tls"]["ca"] if tls else None  # type: ignore[attr-defined]
    return c


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory):
    c = _secured(tmp_path_factory, "txn-sasl", tls=False)
    yield c
    stop_cluster(c)


def client_config(c) -> dict:
    config = {"bootstrap.servers": c.kafka,
              "security.protocol": "SASL_SSL" if c.ca else "SASL_PLAINTEXT",
              "sasl.mechanism": "PLAIN", "sasl.username": c.sasl["username"],
              "sasl.password": read_password(c.sasl["command_config"])}
    if c.ca:
        config["ssl.ca.location"] = c.ca
    return config


def tide(c, *args: str, **kwargs):
    return run_tide(*args, "--command-config", c.sasl["command_config"],
                    bootstrap=c.bootstrap, **kwargs)


class _Admin:
    def __init__(self, c):
        self.c = c

    def tide(self, *args: str, **kwargs):
        return tide(self.c, *args, **kwargs)


def spread_topic(c) -> str:
    """A topic whose 3 partitions are led by 3 different brokers (markers cross brokers
    whichever broker coordinates)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    created = tide(c, "topics", "create", name, "--partitions", "3",
                   "--replication-factor", "3")
    assert created.returncode == 0, created.stderr
    topic = wait_for(lambda: (t := describe_topic(_Admin(c), name)) is not None
                     and all(p["leader"] >= 0 for p in t["partitions"]) and t, f"{name} led")
    assert {p["leader"] for p in topic["partitions"]} == {1, 2, 3}
    return name


def commit_and_abort(c) -> None:
    topic = spread_topic(c)
    config = client_config(c)
    producer = confluent_kafka.Producer({**config, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(60)
    for outcome in ("commit", "abort", "last"):
        producer.begin_transaction()
        for p in range(3):
            producer.produce(topic, value=f"{outcome}-{p}".encode(), partition=p)
        assert producer.flush(30) == 0
        if outcome == "abort":
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
    committed = read_all(c, topic, "read_committed", bootstrap=None, config=config)
    assert sorted(committed) == sorted(f"{o}-{p}".encode() for o in ("commit", "last")
                                       for p in range(3))


def test_transactions_commit_across_brokers_with_sasl(sasl_cluster):
    commit_and_abort(sasl_cluster)


def _write_markers(internal: str, metadata=()) -> pb.WriteTxnMarkersResponse:
    request = pb.WriteTxnMarkersRequest(timeout_ms=5000, markers=[pb.TxnMarker(
        producer_id=4242, producer_epoch=0, coordinator_epoch=0, committed=True,
        partitions=[pb.TxnMarkerPartition(topic="__consumer_offsets", partition=0)])])
    with grpc.insecure_channel(internal) as channel:
        return pb_grpc.BrokerControlStub(channel).WriteTxnMarkers(
            request, metadata=list(metadata) or None, timeout=10)


def test_write_txn_markers_needs_a_broker_principal(sasl_cluster):
    c = sasl_cluster
    assert tide(c, "users", "create", "mallory", "--password", "mallory-pw").returncode == 0
    internal = c.manifest_data["processes"]["broker-1"]["internal"]
    with pytest.raises(grpc.RpcError) as anonymous:
        _write_markers(internal)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    refused = wait_for(lambda: (r := _write_markers(
        internal, [plain_metadata("mallory", "mallory-pw")])).results and r,
        "mallory's answer")
    assert [r.error_code for r in refused.results] == [pb.CLUSTER_AUTHORIZATION_FAILED]


def _verify(internal: str, metadata=()) -> pb.AddPartitionsToTxnResponse:
    request = pb.AddPartitionsToTxnRequest(
        transactional_id="someone-elses", producer_id=4242, producer_epoch=0,
        partitions=[pb.TxnPartition(topic="__consumer_offsets", partition=0)])
    with grpc.insecure_channel(internal) as channel:
        return pb_grpc.BrokerControlStub(channel).VerifyTxnPartitions(
            request, metadata=list(metadata) or None, timeout=10)


def test_verify_txn_partitions_needs_a_broker_principal(sasl_cluster):
    """KIP-890's leader-to-coordinator question tells what a transaction holds: only
    brokers (CLUSTER_ACTION) may ask; the brokers themselves ask with their own
    credentials (test_transactions_commit_across_brokers_*: every partition's first
    batch of a transaction is verified, whichever broker coordinates)."""
    c = sasl_cluster
    assert tide(c, "users", "create", "eve", "--password", "eve-pw").returncode == 0
    internal = c.manifest_data["processes"]["broker-1"]["internal"]
    with pytest.raises(grpc.RpcError) as anonymous:
        _verify(internal)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    refused = wait_for(lambda: (r := _verify(
        internal, [plain_metadata("eve", "eve-pw")])).partitions and r, "eve's answer")
    assert [p.error_code for p in refused.partitions] == [pb.CLUSTER_AUTHORIZATION_FAILED]


def test_transactions_commit_across_brokers_with_sasl_ssl(tmp_path_factory):
    c = _secured(tmp_path_factory, "txn-sasl-ssl", tls=True)
    try:
        commit_and_abort(c)
    finally:
        stop_cluster(c)
