"""Issue 26, a secured quorum: `tide cluster up --controllers 3 --tls --sasl-mechanisms
SCRAM-SHA-512 --authorizer acl`, real processes.

- Every controller's /metrics has Kafka's raft-metrics (``tidewater_raft_*``): one
  leader that all three name, the same epoch, a lag per voter on the leader only.
- The Raft port speaks mTLS and takes Raft messages and metadata-log reads only from
  a controller's certificate: the tide client's and a broker's are refused
  (CLUSTER_AUTHORIZATION_FAILED), no certificate fails the handshake, and
  controller-2's certificate may not speak as node 1; controller-2 as itself is taken.
- A SCRAM user and its ACL are created through the brokers (so through the active
  controller's replicated log); the active controller is SIGKILLed; the new one lists
  the ACL and the credential, the user authenticates and produces with acks=all (also
  through a broker restarted after the failover, whose image the new controller sent),
  a user without an ACL is still refused, and the leader's metrics show the dead
  voter lagging.
"""

from __future__ import annotations

import math
import ssl
import urllib.request
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster, wait_for

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

TOPIC = "secured-ledger"
MECHANISM = "SCRAM-SHA-512"


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("quorum-secured"), 3, "min.insync.replicas=2",
                      tls=True, up_flags=("--controllers", "3", "--sasl-mechanisms", MECHANISM,
                                          "--authorizer", "acl"))
    m = c.manifest()
    c.m, c.kafka, c.sasl, c.tls = m, m["kafka_bootstrap"], m["sasl"], m["tls"]
    yield c
    stop_cluster(c)


def controllers(c) -> dict[str, dict]:
    return {n: p for n, p in c.manifest()["processes"].items() if p["kind"] == "controller"}


def raft_address(c, node_id: int) -> str:
    """Controller ``node_id``'s Raft endpoint, from its controller.quorum.voters."""
    [voters] = [a.split("=", 1)[1] for a in controllers(c)["controller-1"]["command"]
                if a.startswith("controller.quorum.voters=")]
    for voter in voters.split(","):
        ident, _, address = voter.partition("@")
        if int(ident) == node_id:
            return address
    raise AssertionError(f"no voter {node_id} in {voters}")


def scrape(c, name: str) -> dict[str, float] | None:
    """``tidewater_raft_*`` samples of a controller's /metrics (HTTPS with the CA and the
    client certificate: a secured /metrics answers cluster members only)."""
    context = ssl.create_default_context(cafile=c.tls["ca"])
    context.load_cert_chain(c.tls["cert"], c.tls["key"])
    port = controllers(c)[name]["metrics_port"]
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5,
                                    context=context) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("tidewater_raft_")}


def leader_of(c, names) -> str | None:
    """The controller whose metrics say it leads and whom every given controller names."""
    samples = {n: scrape(c, n) for n in names}
    if any(s is None for s in samples.values()):
        return None
    leading = [n for n, s in samples.items() if s['tidewater_raft_current_state{state="leader"}'] == 1]
    if len(leading) != 1:
        return None
    leader_id = int(leading[0].rsplit("-", 1)[1])
    if any(s["tidewater_raft_current_leader"] != leader_id for s in samples.values()):
        return None
    return leading[0]


def conf(c, user: str | None = None, password: str | None = None, bootstrap: str | None = None,
         **more) -> dict:
    return {"bootstrap.servers": bootstrap or c.kafka, "security.protocol": "SASL_SSL",
            "ssl.ca.location": c.tls["ca"], "sasl.mechanism": MECHANISM,
            "sasl.username": user or c.sasl["username"],
            "sasl.password": password or read_password(c.sasl["command_config"]),
            "log_level": 0, **more}


def produce(config: dict, values: list[bytes]) -> list:
    errors: list = []
    producer = confluent_kafka.Producer({**config, "acks": "all", "message.timeout.ms": 30000})
    for v in values:
        producer.produce(TOPIC, value=v, on_delivery=lambda err, _m: err and errors.append(err))
    assert producer.flush(60) == 0
    return errors


def test_every_controller_reports_kafkas_raft_metrics(quorum):
    c = quorum
    names = sorted(controllers(c))
    leader = wait_for(lambda: leader_of(c, names), "one leader all three controllers name")
    samples = {n: scrape(c, n) for n in names}
    epochs = {s["tidewater_raft_current_epoch"] for s in samples.values() if s}
    assert len(epochs) == 1 and epochs.pop() >= 1
    for name, s in samples.items():
        assert s is not None
        for metric in ("current_vote", "high_watermark", "log_end_offset", "commit_latency_avg",
                       "commit_latency_max", "commit_latency_p50", "commit_latency_p99",
                       "append_records_rate", "election_latency_avg",
                       "election_latency_max"):
            assert f"tidewater_raft_{metric}" in s, (name, metric)
        assert s["tidewater_raft_number_unknown_voter_connections"] == 0
        assert s["tidewater_raft_log_end_offset"] >= s["tidewater_raft_high_watermark"] > 0
        lags = {k for k in s if k.startswith("tidewater_raft_voter_lag")}
        if name == leader:
            assert lags == {f'tidewater_raft_voter_lag{{voter="{i}"}}' for i in (1, 2, 3)}
            # The bootstrap users and the brokers' registrations were proposed here.
            assert s["tidewater_raft_append_records_total"] > 0
            assert not math.isnan(s["tidewater_raft_commit_latency_max"])
            assert (s["tidewater_raft_commit_latency_p50"]
                    <= s["tidewater_raft_commit_latency_p99"]
                    <= s["tidewater_raft_commit_latency_max"])
        else:
            assert lags == set(), name  # only the leader knows the voters' progress


def test_tide_quorum_describe_over_mtls_and_through_a_broker(quorum):
    c = quorum
    leader = wait_for(lambda: leader_of(c, sorted(controllers(c))), "the quorum leader")
    raft = ",".join(raft_address(c, i) for i in (1, 2, 3))
    direct = run_tide("quorum", "describe", "--status", "--bootstrap-controller", raft,
                      "--command-config", c.tls["command_config"])
    assert direct.returncode == 0, direct.stderr
    assert f"LeaderId:               {leader.rsplit('-', 1)[1]}" in direct.stdout.splitlines()
    # Without a certificate the Raft port's handshake fails: the tool says so, in one line.
    plain = run_tide("quorum", "describe", "--status", "--bootstrap-controller", raft)
    assert plain.returncode != 0 and "LeaderId" not in plain.stdout
    brokered = run_tide("quorum", "describe", "--status", "--command-config",
                        c.sasl["command_config"], bootstrap=c.bootstrap)
    assert brokered.returncode == 0, brokered.stderr
    assert direct.stdout.splitlines()[1] == brokered.stdout.splitlines()[1]  # LeaderId


def _batch(source_id: int, destination_id: int) -> pb.RaftMessageBatch:
    return pb.RaftMessageBatch(source_id=source_id, destination_id=destination_id)


def _raft_stub(c, node_id: int, cert_name: str | None):
    directory = Path(c.tls["ca"]).parent
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(directory / "ca.pem").read_bytes(),
        private_key=(directory / f"{cert_name}.key").read_bytes() if cert_name else None,
        certificate_chain=(directory / f"{cert_name}.pem").read_bytes() if cert_name else None)
    channel = grpc.secure_channel(raft_address(c, node_id), credentials)
    return channel, pb_grpc.ControllerQuorumStub(channel)


def test_raft_rpcs_take_only_controller_certificates(quorum):
    c = quorum
    for cert_name in ("tide-client", "broker-1"):
        channel, stub = _raft_stub(c, 1, cert_name)
        with channel:
            ack = stub.RaftMessages(_batch(2, 1), timeout=10)
            assert ack.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (cert_name, ack)
            assert "controllers" in ack.error_message
            read = stub.QuorumRead(pb.QuorumReadRequest(), timeout=10)
            assert read.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
            assert list(read.records) == []
            proposed = stub.QuorumPropose(pb.QuorumProposeRequest(records=[b"x"]), timeout=10)
            assert proposed.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
            # With an authorizer, a client certificate does not change the voters either.
            changed = stub.ChangeQuorumVoters(pb.ChangeQuorumVotersRequest(
                remove=pb.QuorumVoter(id=3, directory_id="0" * 32)), timeout=10)
            assert changed.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    # No certificate: the mTLS handshake fails.
    channel, stub = _raft_stub(c, 1, None)
    with channel, pytest.raises(grpc.RpcError):
        stub.RaftMessages(_batch(2, 1), timeout=5)
    # A controller's certificate is bound to its node id ...
    channel, stub = _raft_stub(c, 2, "controller-3")
    with channel:
        ack = stub.RaftMessages(_batch(1, 2), timeout=10)
        assert ack.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
        assert "controller-3" in ack.error_message
        # ... and taken as that node (an empty batch: nothing for the node to act on).
        assert stub.RaftMessages(_batch(3, 2), timeout=10).error_code == pb.NONE


def test_acls_and_scram_users_survive_a_failover_of_the_active_controller(quorum):
    c = quorum
    admin = admin_mod.AdminClient(conf(c))
    for future in admin.create_topics([admin_mod.NewTopic(TOPIC, 3, 3)]).values():
        future.result(60)
    for user in ("alice", "mallory"):
        upsert = admin_mod.UserScramCredentialUpsertion(
            user, admin_mod.ScramCredentialInfo(admin_mod.ScramMechanism.SCRAM_SHA_512, 4096),
            f"{user}-secret".encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(60)
    acls = [admin_mod.AclBinding(admin_mod.ResourceType.TOPIC, TOPIC,
                                 admin_mod.ResourcePatternType.LITERAL, "User:alice", "*",
                                 operation, admin_mod.AclPermissionType.ALLOW)
            for operation in (admin_mod.AclOperation.WRITE, admin_mod.AclOperation.DESCRIBE)]
    for future in admin.create_acls(acls).values():
        future.result(60)
    alice = conf(c, "alice", "alice-secret")
    before = [f"before-{i}".encode() for i in range(50)]
    assert wait_for(lambda: produce(alice, before[:1]) == [], "alice's first write") is True
    assert produce(alice, before[1:]) == []

    names = sorted(controllers(c))
    old = wait_for(lambda: leader_of(c, names), "the active controller")
    result = run_tide("cluster", "kill", old, "--data-dir", str(c.data_dir))
    assert result.returncode == 0, result.stderr
    survivors = [n for n in names if n != old]
    new = wait_for(lambda: leader_of(c, survivors), "a new leader of the survivors")
    assert new != old
    elected = scrape(c, new)
    assert elected is not None
    # The election just measured (within the metrics' 60 s window).
    assert elected["tidewater_raft_election_latency_max"] >= 0
    assert elected["tidewater_raft_current_epoch"] > 1

    # The new active controller has the ACL and the credential (forwarded to it).
    everything = admin_mod.AclBindingFilter(
        admin_mod.ResourceType.ANY, None, admin_mod.ResourcePatternType.ANY, "User:alice",
        None, admin_mod.AclOperation.ANY, admin_mod.AclPermissionType.ANY)

    def alice_acls():
        try:
            return admin.describe_acls(everything).result(30)
        except confluent_kafka.KafkaException:
            return None  # the brokers still looking for the new controller
    listed = wait_for(alice_acls, "DescribeAcls through the new controller")
    assert {(b.name, b.operation) for b in listed} == {
        (TOPIC, admin_mod.AclOperation.WRITE), (TOPIC, admin_mod.AclOperation.DESCRIBE)}
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert [i.mechanism for i in described.scram_credential_infos] == [
        admin_mod.ScramMechanism.SCRAM_SHA_512]

    # A broker restarted now gets its users and ACLs from the new controller.
    assert run_tide("cluster", "kill", "broker-1", "--data-dir", str(c.data_dir)).returncode == 0
    started = run_tide("cluster", "start", "broker-1", "--data-dir", str(c.data_dir),
                       timeout_s=120)
    assert started.returncode == 0, started.stderr
    broker_1 = c.manifest()["processes"]["broker-1"]["kafka"]
    after = [f"after-{i}".encode() for i in range(50)]
    assert wait_for(lambda: produce(conf(c, "alice", "alice-secret", bootstrap=broker_1),
                                    after[:1]) == [], "alice's write after the failover") is True
    assert produce(conf(c, "alice", "alice-secret", bootstrap=broker_1), after[1:]) == []
    # mallory authenticates, and still has no ACL: the topic is hidden from it, not alice.
    def topic_seen_by(user: str):
        metadata = admin_mod.AdminClient(conf(c, user, f"{user}-secret", bootstrap=broker_1)
                                         ).list_topics(TOPIC, timeout=30)
        return metadata.topics.get(TOPIC)
    seen_by_alice = topic_seen_by("alice")
    assert seen_by_alice is not None and seen_by_alice.error is None
    assert len(seen_by_alice.partitions) == 3
    seen_by_mallory = topic_seen_by("mallory")
    # (This broker answers a hidden topic as unknown; Kafka names it unauthorized.)
    assert seen_by_mallory is None or (not seen_by_mallory.partitions and (
        seen_by_mallory.error.code() in (confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART,
                                         confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED))
    ), seen_by_mallory
    # A wrong password is still refused.
    with pytest.raises(confluent_kafka.KafkaException):
        admin_mod.AdminClient(conf(c, "alice", "wrong", bootstrap=broker_1)).list_topics(
            timeout=10)

    # Every acknowledged record reads back, as the admin.
    consumer = confluent_kafka.Consumer(conf(c, **{"group.id": "secured-check",
                                                   "auto.offset.reset": "earliest",
                                                   "enable.auto.commit": False}))
    consumer.subscribe([TOPIC])
    seen: set[bytes] = set()
    wanted = set(before) | set(after)

    def read_all() -> bool:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            seen.add(message.value())
        return wanted <= seen
    wait_for(read_all, "every acknowledged record", timeout_s=90)
    consumer.close()

    # The leader's metrics: the dead voter lags behind what the new leader appended.
    dead_id = old.rsplit("-", 1)[1]
    samples = scrape(c, new)
    assert samples is not None
    assert samples[f'tidewater_raft_voter_lag{{voter="{dead_id}"}}'] > 0
