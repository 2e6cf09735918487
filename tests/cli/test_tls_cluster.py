"""Issue 18, encryption and identity: a ``tide cluster up --tls`` cluster.

- the CLI (``--command-config``) and the Python clients (``security_protocol``,
  ``ssl_*``) produce and consume over TLS; confluent-kafka and kcat do on the
  Kafka listener (``security.protocol=SSL``);
- every port refuses plaintext: a broker's EXTERNAL and INTERNAL listeners, the
  controller's, the Kafka listener;
- a certificate of another CA is refused by the cluster members' listeners,
  and a server certificate of another CA is not trusted by a client;
- a client certificate of the cluster's own CA cannot register a broker nor
  send the controller's requests, and broker 2's certificate cannot act as
  broker 1 (register, heartbeat, fetch as its follower): all
  CLUSTER_AUTHORIZATION_FAILED, and nothing changes.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

from tests.kafka_wire import answered_as_kafka, plaintext_api_versions_answer
from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.tools import certs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KCAT = shutil.which("kcat")
RPC_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("tls"), 3, tls=True)
    manifest = c.manifest()
    c.tls = manifest["tls"]
    c.tls_dir = Path(manifest["data_dir"]) / "tls"
    c.kafka = manifest["kafka_bootstrap"]
    c.brokers = [p for p in manifest["processes"].values() if p["kind"] == "broker"]
    c.controller = manifest["controller"]
    yield c
    stop_cluster(c)


def tide(c, *args, **kwargs):
    return run_tide(*args, "--command-config", c.tls["command_config"], bootstrap=c.bootstrap,
                    **kwargs)


def new_topic(c, partitions: int = 2) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    created = tide(c, "topics", "create", name, "--partitions", str(partitions),
                   "--replication-factor", "3")
    assert created.returncode == 0, created.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        described = tide(c, "topics", "describe", name, "--json")
        if described.returncode == 0:
            [topic] = json.loads(described.stdout)["topics"]
            if all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in topic["partitions"]):
                return name
        time.sleep(0.2)
    pytest.fail(f"{name} not fully replicated over TLS")


def credentials(c, name: str, *, tls_dir: Path | None = None,
                trust: Path | None = None) -> grpc.ChannelCredentials:
    """Channel credentials presenting ``name``'s certificate (of ``tls_dir``'s CA), trusting
    ``trust`` (default: the cluster's CA)."""
    tls_dir = tls_dir or c.tls_dir
    return grpc.ssl_channel_credentials(
        root_certificates=(trust or c.tls_dir / "ca.pem").read_bytes(),
        private_key=(tls_dir / f"{name}.key").read_bytes(),
        certificate_chain=(tls_dir / f"{name}.pem").read_bytes())


def secure(address: str, creds: grpc.ChannelCredentials) -> grpc.Channel:
    return grpc.secure_channel(address, creds)


def describe_cluster(c) -> pb.DescribeClusterResponse:
    with secure(c.controller, credentials(c, "tide-client")) as channel:
        return pb_grpc.ControllerStub(channel).DescribeCluster(pb.DescribeClusterRequest(),
                                                               timeout=RPC_TIMEOUT_S)


def assert_unavailable(call) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value


# ---------------------------------------------------------------------- clients over TLS


def test_cli_and_python_client_produce_and_consume_over_tls(cluster):
    topic = new_topic(cluster)
    produced = tide(cluster, "produce", topic, "--acks", "all",
                    input="".join(f"cli-{i}\n" for i in range(50)))
    assert produced.returncode == 0, produced.stderr
    tls = {"security_protocol": "SSL", "ssl_cafile": cluster.tls["ca"],
           "ssl_certfile": cluster.tls["cert"], "ssl_keyfile": cluster.tls["key"]}
    with Producer(cluster.bootstrap, acks="all", **tls) as producer:
        futures = [producer.send(topic, f"py-{i}".encode(), partition=i % 2) for i in range(50)]
        assert all(f.result(30).offset >= 0 for f in futures)
    # A client certificate is not needed on the clients' listener: the CA is enough.
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", security_protocol="SSL",
                  ssl_cafile=cluster.tls["ca"]) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 100 and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(1000)]
    assert sorted(values) == sorted([f"cli-{i}".encode() for i in range(50)]
                                    + [f"py-{i}".encode() for i in range(50)])
    consumed = tide(cluster, "consume", topic, "--from-beginning", "--timeout-ms", "3000")
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 100
    status = run_tide("cluster", "status", "--data-dir", str(cluster.data_dir), "--json")
    assert status.returncode == 0, status
    assert all(p["serving"] for p in json.loads(status.stdout)["processes"]), status.stdout


# ---------------------------------------------------------------------- plaintext refused


def test_every_port_refuses_plaintext(cluster):
    for broker in cluster.brokers:
        for address in (broker["listen"], broker["internal"]):
            with grpc.insecure_channel(address) as channel:
                assert_unavailable(lambda ch=channel: pb_grpc.BrokerStub(ch).Metadata(
                    pb.MetadataRequest(), timeout=RPC_TIMEOUT_S))
    with grpc.insecure_channel(cluster.controller) as channel:
        assert_unavailable(lambda: pb_grpc.ControllerStub(channel).DescribeCluster(
            pb.DescribeClusterRequest(), timeout=RPC_TIMEOUT_S))
    # The CLI without --command-config: one line, non-zero.
    plain = run_tide("topics", "list", bootstrap=cluster.bootstrap, timeout_s=60)
    assert plain.returncode != 0 and "no broker reachable" in plain.stderr, plain
    # The Kafka listener: a plaintext ApiVersions v0 gets no Kafka answer.
    for broker in cluster.brokers:
        host, port = broker["kafka"].rsplit(":", 1)
        answer = plaintext_api_versions_answer(host, int(port), RPC_TIMEOUT_S)
        assert not answered_as_kafka(answer), answer


def test_confluent_kafka_and_kcat_over_ssl(cluster):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic = new_topic(cluster, partitions=1)
    ssl = {"bootstrap.servers": cluster.kafka, "security.protocol": "SSL",
           "ssl.ca.location": cluster.tls["ca"]}
    producer = confluent_kafka.Producer({**ssl, "acks": "all"})
    errors = []
    for i in range(30):
        producer.produce(topic, key=f"k{i}".encode(), value=f"confluent-{i}".encode(),
                         on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(30) == 0 and not errors, errors
    consumer = confluent_kafka.Consumer({**ssl, "group.id": "assign-only",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 30 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [f"confluent-{i}".encode() for i in range(30)]
    # The records are the gRPC clients' records too.
    consumed = tide(cluster, "consume", topic, "--from-beginning", "--timeout-ms", "3000")
    assert consumed.stdout.splitlines() == [f"confluent-{i}" for i in range(30)]
    if KCAT is None:
        pytest.skip("kcat not installed (make kcat): confluent-kafka checked only")
    flags = ["-b", cluster.kafka, "-X", "security.protocol=SSL",
             "-X", f"ssl.ca.location={cluster.tls['ca']}"]
    subprocess.run([KCAT, *flags, "-P", "-t", topic, "-X", "acks=all"], input=b"kcat-1\nkcat-2\n",
                   check=True, timeout=60)
    read = subprocess.run([KCAT, *flags, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                          capture_output=True, check=True, timeout=60)
    assert read.stdout.decode().splitlines()[-2:] == ["kcat-1", "kcat-2"]
    plain = subprocess.run([KCAT, "-b", cluster.kafka, "-L", "-m", "3"], capture_output=True,
                           timeout=60)
    assert plain.returncode != 0


# ---------------------------------------------------------------------- certificates and identity


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """Another CA, with a broker-1 and a client certificate of its own."""
    directory = tmp_path_factory.mktemp("other-ca")
    now = datetime.datetime.now(datetime.UTC)
    certs.init_ca_dir(directory, now=now)
    certs.issue_to_dir(directory, name="broker-1", role="broker", now=now)
    certs.issue_to_dir(directory, name="tide-client", role="client", now=now)
    return directory


def test_certificates_of_another_ca_are_refused(cluster, other_ca):
    impostor = credentials(cluster, "broker-1", tls_dir=other_ca)  # trusts the right CA
    with secure(cluster.controller, impostor) as channel:
        assert_unavailable(lambda: pb_grpc.ControllerStub(channel).RegisterBroker(
            pb.RegisterBrokerRequest(broker_id=1, incarnation_id="impostor",
                                     listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1",
                                                            port=1)]),
            timeout=RPC_TIMEOUT_S))
    with secure(cluster.brokers[0]["internal"], impostor) as channel:
        assert_unavailable(lambda: pb_grpc.BrokerStub(channel).Metadata(
            pb.MetadataRequest(), timeout=RPC_TIMEOUT_S))
    # A client that trusts only another CA does not trust the brokers.
    fooled = credentials(cluster, "tide-client", tls_dir=other_ca, trust=other_ca / "ca.pem")
    with secure(cluster.brokers[0]["listen"], fooled) as channel:
        assert_unavailable(lambda: pb_grpc.BrokerStub(channel).Metadata(
            pb.MetadataRequest(), timeout=RPC_TIMEOUT_S))
    # The cluster's own certificates work on the same ports (the refusals are the CA's).
    with secure(cluster.brokers[0]["internal"], credentials(cluster, "tide-client")) as channel:
        pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=RPC_TIMEOUT_S)


def test_no_certificate_but_a_brokers_own_may_act_as_that_broker(cluster):
    topic = new_topic(cluster, partitions=1)
    assert tide(cluster, "produce", topic, "--acks", "all", input="a\nb\nc\n").returncode == 0
    before = {b.broker_id: (b.broker_epoch, b.fenced) for b in describe_cluster(cluster).brokers}
    assert set(before) == {1, 2, 3} and not any(fenced for _, fenced in before.values())
    register = pb.RegisterBrokerRequest(
        broker_id=1, incarnation_id=uuid.uuid4().hex,
        listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1", port=1)])
    for name in ("tide-client", "broker-2", "controller"):
        with secure(cluster.controller, credentials(cluster, name)) as channel:
            stub = pb_grpc.ControllerStub(channel)
            answer = stub.RegisterBroker(register, timeout=RPC_TIMEOUT_S)
            assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (name, answer)
            assert "broker-1" in answer.error_message
            heartbeat = pb.BrokerHeartbeatRequest(broker_id=1, broker_epoch=before[1][0],
                                                  want_shutdown=True)
            [reply] = list(stub.BrokerHeartbeats(iter([heartbeat]), timeout=RPC_TIMEOUT_S))
            assert reply.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (name, reply)
            altered = stub.AlterPartition(pb.AlterPartitionRequest(
                broker_id=1, broker_epoch=before[1][0]), timeout=RPC_TIMEOUT_S)
            assert altered.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (name, altered)
    # The controller's requests to a broker need the controller's certificate; a follower's
    # fetch needs the follower's own.
    internal = next(b["internal"] for b in cluster.brokers if b["broker_id"] == 1)
    for name in ("tide-client", "broker-2"):
        with secure(internal, credentials(cluster, name)) as channel:
            control = pb_grpc.BrokerControlStub(channel)
            stopped = control.StopReplica(pb.StopReplicaRequest(
                controller_id=3000, controller_epoch=1000, broker_epoch=before[1][0],
                delete_partitions=True,
                partitions=[pb.PartitionState(topic=topic, partition=0, leader=-1)]),
                timeout=RPC_TIMEOUT_S)
            assert stopped.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (name, stopped)
    with secure(internal, credentials(cluster, "broker-2")) as channel:
        # broker-2's certificate fetching as follower 1
        fetch = pb.FetchRequest(replica_id=1, max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)])
        [answer] = list(pb_grpc.BrokerControlStub(channel).ReplicaFetch(iter([fetch]),
                                                                         timeout=RPC_TIMEOUT_S))
        assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, answer
    # Nothing changed: same registrations, nobody fenced, the records all there.
    after = {b.broker_id: (b.broker_epoch, b.fenced) for b in describe_cluster(cluster).brokers}
    assert after == before
    consumed = tide(cluster, "consume", topic, "--from-beginning", "--timeout-ms", "3000")
    assert consumed.stdout.splitlines() == ["a", "b", "c"]


def test_the_container_health_check_speaks_tls_with_the_process_own_certificate(cluster):
    """deploy/healthcheck.py as Docker runs it in a TLS container (TIDE_TLS_* set): healthy
    over TLS; the same check without them fails on a TLS port (plaintext refused)."""
    import os
    import sys

    script = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.py"
    broker = cluster.brokers[0]
    controller_port = cluster.controller.rsplit(":", 1)[1]
    broker_port = broker["internal"].rsplit(":", 1)[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_TLS_")}

    def check(role: str, port: str, name: str | None):
        env = dict(clean)
        if name is not None:
            env.update(TIDE_TLS_CA=str(cluster.tls_dir / "ca.pem"),
                       TIDE_TLS_CERT=str(cluster.tls_dir / f"{name}.pem"),
                       TIDE_TLS_KEY=str(cluster.tls_dir / f"{name}.key"))
        return subprocess.run([sys.executable, str(script), role, port], env=env,
                              capture_output=True, text=True, timeout=30)

    for role, port, name in (("broker", broker_port, "broker-1"),
                             ("controller", controller_port, "controller")):
        healthy = check(role, port, name)
        assert healthy.returncode == 0, healthy.stderr
        plain = check(role, port, None)
        assert plain.returncode == 1 and "unhealthy" in plain.stderr, plain


def test_a_client_certificate_cannot_send_admin_calls_straight_to_the_controller(cluster):
    """Clients' admin calls go through a broker, which checks their ACLs; straight to the
    controller's port a client certificate is refused (it could grant itself any ACL),
    and the same call through a broker works."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    create = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name=name, num_partitions=1, replication_factor=1)], timeout_ms=10_000)
    with secure(cluster.controller, credentials(cluster, "tide-client")) as channel:
        stub = pb_grpc.ControllerStub(channel)
        for call, request in ((stub.CreateTopics, create),
                              (stub.CreateAcls, pb.CreateAclsRequest()),
                              (stub.DescribeAcls, pb.DescribeAclsRequest()),
                              (stub.DescribeUserScramCredentials,
                               pb.DescribeUserScramCredentialsRequest())):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=RPC_TIMEOUT_S)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
            assert "CLUSTER_AUTHORIZATION_FAILED" in refused.value.details()
        assert stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=RPC_TIMEOUT_S).brokers
    assert name not in tide(cluster, "topics", "list").stdout.split()
    # The same request through a broker (forwarded with the broker's certificate) works.
    with secure(cluster.brokers[0]["listen"], credentials(cluster, "tide-client")) as channel:
        created = pb_grpc.ControllerStub(channel).CreateTopics(create, timeout=30)
    assert created.topics[0].error_code == pb.NONE, created
