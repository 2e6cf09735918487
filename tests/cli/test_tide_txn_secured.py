"""Issue 27 item 4 with an authorizer: Tidewater's transactional Producer over gRPC is
checked as Kafka clients are (``txn_apis``' rules): without WRITE and DESCRIBE on the
TRANSACTIONAL_ID a SCRAM user's ``init_transactions`` fails with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (fatal: not retried); granted them (through the
Kafka listener's CreateAcls, confluent-kafka's admin), the same user commits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

MECHANISM = "SCRAM-SHA-512"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("tidetxn-acl"), 1,
                      "transaction.state.log.num.partitions=1",
                      up_flags=("--sasl-mechanisms", MECHANISM))
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.kafka = manifest["kafka_bootstrap"]  # type: ignore[attr-defined]
    c.sasl = manifest["sasl"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def tide(c, *args: str, **kwargs):
    return run_tide(*args, "--command-config", c.sasl["command_config"],
                    bootstrap=c.bootstrap, **kwargs)


def dave(c) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
            "sasl_plain_username": "dave", "sasl_plain_password": "dave-pw"}


def test_the_transactional_id_acl_decides(cluster):
    c = cluster
    assert tide(c, "topics", "create", "payments", "--partitions", "1").returncode == 0
    assert tide(c, "users", "create", "dave", "--password", "dave-pw").returncode == 0
    granted = tide(c, "acls", "add", "--allow-principal", "User:dave", "--operation", "write",
                   "--operation", "describe", "--topic", "payments")
    assert granted.returncode == 0, granted.stderr
    time.sleep(1)  # the ACLs reach the broker's metadata
    refused = Producer(c.bootstrap, transactional_id="dave-tx", max_block_ms=20000, **dave(c))
    try:
        with pytest.raises(TidewaterError) as raised:
            refused.init_transactions()
        assert raised.value.error_code == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    finally:
        refused.close()

    admin = admin_mod.AdminClient({
        "bootstrap.servers": c.kafka, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM, "sasl.username": c.sasl["username"],
        "sasl.password": read_password(c.sasl["command_config"])})
    bindings = [admin_mod.AclBinding(admin_mod.ResourceType.TRANSACTIONAL_ID, "dave-tx",
                                     admin_mod.ResourcePatternType.LITERAL, "User:dave", "*",
                                     operation, admin_mod.AclPermissionType.ALLOW)
                for operation in (admin_mod.AclOperation.WRITE, admin_mod.AclOperation.DESCRIBE)]
    for future in admin.create_acls(bindings).values():
        future.result(30)
    time.sleep(1)
    with Producer(c.bootstrap, transactional_id="dave-tx", max_block_ms=30000,
                  **dave(c)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("payments", b"debit 10", partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("payments", b"aborted", partition=0)
        producer.abort_transaction()
    admin_security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
                      "sasl_plain_username": c.sasl["username"],
                      "sasl_plain_password": read_password(c.sasl["command_config"])}
    with Consumer(c.bootstrap, isolation_level="read_committed", **admin_security) as consumer:
        consumer.assign([("payments", 0)])
        consumer.seek_to_beginning()
        end = consumer.end_offsets([("payments", 0)])[("payments", 0)]
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while consumer.position(("payments", 0)) < end:
            assert time.monotonic() < deadline, values
            values += [r.value for r in consumer.poll(500)]
    assert values == [b"debit 10"]
