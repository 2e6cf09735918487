"""Issue 29 item 1: the controller authenticates and authorizes, as Kafka's does.

A `tide cluster up --sasl-mechanisms ...` cluster without TLS (SASL_PLAINTEXT, ACL
authorizer, the ``admin`` super user). At the controller's own port:

- a client without credentials (or with a wrong password) gets nothing: no ACL, no
  SCRAM credential, no topic, no broker registration;
- an authenticated user who is not a super user is refused where Kafka refuses
  (CLUSTER_AUTHORIZATION_FAILED / TOPIC_AUTHORIZATION_FAILED), and may not make a call
  in another principal's name (what forwarding brokers do);
- the admin may; a call the admin forwards for a user is checked as that user;
- the brokers (which authenticate as the admin) register, heartbeat and serve.
"""

from __future__ import annotations

import grpc
import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.acls import ALLOW, ANY_HOST, CLUSTER, CLUSTER_NAME, CREATE, LITERAL, TOPIC, Acl
from tidewater.proto.forwarded_principal import HOST_KEY, PRINCIPAL_KEY
from tidewater.proto.scram import credential_to_pb, make_credential, plain_metadata
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RPC_TIMEOUT_S = 10
BOB, BOB_PASSWORD = "bob", "bob-secret-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("ctl-auth"), 2,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512,PLAIN"))
    manifest = c.manifest()
    c.controller = manifest["controller"]
    c.admin_password = read_password(manifest["sasl"]["command_config"])
    channel = grpc.insecure_channel(c.controller)
    c.stub = pb_grpc.ControllerStub(channel)
    admin = (plain_metadata("admin", c.admin_password),)
    created = c.stub.AlterUserScramCredentials(pb.AlterUserScramCredentialsRequest(
        upsertions=[credential_to_pb(BOB, make_credential("SCRAM-SHA-512", BOB_PASSWORD))]),
        metadata=admin, timeout=RPC_TIMEOUT_S)
    assert [r.error_code for r in created.results] == [pb.NONE]
    yield c
    channel.close()
    stop_cluster(c)


def as_admin(c):
    return (plain_metadata("admin", c.admin_password),)


def as_bob():
    return (plain_metadata(BOB, BOB_PASSWORD),)


def everything_for_everyone() -> pb.CreateAclsRequest:
    return pb.CreateAclsRequest(creations=[
        Acl(TOPIC, "*", LITERAL, "User:*", ANY_HOST, 2, ALLOW).to_pb(),  # ALL on every topic
        Acl(CLUSTER, CLUSTER_NAME, LITERAL, "User:*", ANY_HOST, 2, ALLOW).to_pb()])


def replace_admin_credential() -> pb.AlterUserScramCredentialsRequest:
    return pb.AlterUserScramCredentialsRequest(upsertions=[
        credential_to_pb("admin", make_credential("SCRAM-SHA-512", "taken-over"))])


def new_topic(name: str) -> pb.CreateTopicsRequest:
    return pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name=name, num_partitions=1, replication_factor=1)], timeout_ms=5000)


def register_as_broker_1() -> pb.RegisterBrokerRequest:
    return pb.RegisterBrokerRequest(broker_id=1, incarnation_id="impostor", listeners=[
        pb.Listener(name="INTERNAL", host="127.0.0.1", port=1)])


def refused_status(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


def acls(c) -> list:
    return list(c.stub.DescribeAcls(pb.DescribeAclsRequest(filter=pb.AclBinding()),
                                    metadata=as_admin(c), timeout=RPC_TIMEOUT_S).acls)


def brokers(c) -> dict[int, pb.BrokerDescription]:
    described = c.stub.DescribeCluster(pb.DescribeClusterRequest(), metadata=as_admin(c),
                                       timeout=RPC_TIMEOUT_S)
    return {b.broker_id: b for b in described.brokers}


@pytest.mark.parametrize("credentials", [(), (plain_metadata("admin", "wrong"),)],
                         ids=["none", "wrong-password"])
def test_a_client_that_does_not_authenticate_gets_nothing(cluster, credentials):
    c = cluster
    before = brokers(c)
    calls = {
        "CreateAcls": lambda: c.stub.CreateAcls(everything_for_everyone(),
                                                metadata=credentials, timeout=RPC_TIMEOUT_S),
        "AlterUserScramCredentials": lambda: c.stub.AlterUserScramCredentials(
            replace_admin_credential(), metadata=credentials, timeout=RPC_TIMEOUT_S),
        "CreateTopics": lambda: c.stub.CreateTopics(new_topic("anon-topic"),
                                                    metadata=credentials, timeout=RPC_TIMEOUT_S),
        "DeleteTopics": lambda: c.stub.DeleteTopics(pb.DeleteTopicsRequest(names=["x"]),
                                                    metadata=credentials, timeout=RPC_TIMEOUT_S),
        "RegisterBroker": lambda: c.stub.RegisterBroker(register_as_broker_1(),
                                                        metadata=credentials,
                                                        timeout=RPC_TIMEOUT_S),
        "DescribeCluster": lambda: c.stub.DescribeCluster(pb.DescribeClusterRequest(),
                                                          metadata=credentials,
                                                          timeout=RPC_TIMEOUT_S),
    }
    for rpc, call in calls.items():
        assert refused_status(call) == grpc.StatusCode.UNAUTHENTICATED, rpc
    assert acls(c) == []
    assert "anon-topic" not in {t.name for t in c.stub.DescribeCluster(
        pb.DescribeClusterRequest(), metadata=as_admin(c), timeout=RPC_TIMEOUT_S).topics}
    # The admin's password still works, and broker 1 kept its registration.
    after = brokers(c)
    assert after[1].broker_epoch == before[1].broker_epoch and not after[1].fenced


def test_a_user_without_acls_is_refused_where_kafka_refuses(cluster):
    c = cluster
    before = brokers(c)
    created = c.stub.CreateAcls(everything_for_everyone(), metadata=as_bob(),
                                timeout=RPC_TIMEOUT_S)
    assert {r.error_code for r in created.results} == {pb.CLUSTER_AUTHORIZATION_FAILED}
    altered = c.stub.AlterUserScramCredentials(replace_admin_credential(), metadata=as_bob(),
                                               timeout=RPC_TIMEOUT_S)
    assert [r.error_code for r in altered.results] == [pb.CLUSTER_AUTHORIZATION_FAILED]
    topics = c.stub.CreateTopics(new_topic("bobs-topic"), metadata=as_bob(),
                                 timeout=RPC_TIMEOUT_S)
    assert [t.error_code for t in topics.topics] == [pb.TOPIC_AUTHORIZATION_FAILED]
    registered = c.stub.RegisterBroker(register_as_broker_1(), metadata=as_bob(),
                                       timeout=RPC_TIMEOUT_S)
    assert registered.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    assert "CLUSTER_ACTION" in registered.error_message
    [heartbeat] = list(c.stub.BrokerHeartbeats(iter([pb.BrokerHeartbeatRequest(
        broker_id=1, broker_epoch=before[1].broker_epoch, want_shutdown=True)]),
        metadata=as_bob(), timeout=RPC_TIMEOUT_S))
    assert heartbeat.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    # Naming another principal (what a forwarding broker does) needs CLUSTER_ACTION.
    forged = as_bob() + ((PRINCIPAL_KEY, "User:admin"), (HOST_KEY, "127.0.0.1"))
    assert refused_status(lambda: c.stub.CreateAcls(
        everything_for_everyone(), metadata=forged, timeout=RPC_TIMEOUT_S)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert acls(c) == []
    after = brokers(c)
    assert after[1].broker_epoch == before[1].broker_epoch and not after[1].fenced
    assert not after[1].in_controlled_shutdown


def test_the_admin_may_and_a_call_it_forwards_is_checked_as_the_user(cluster):
    c = cluster
    grant = pb.CreateAclsRequest(creations=[
        Acl(TOPIC, "bob-", 4, f"User:{BOB}", ANY_HOST, CREATE, ALLOW).to_pb()])  # PREFIXED
    assert [r.error_code for r in c.stub.CreateAcls(
        grant, metadata=as_admin(c), timeout=RPC_TIMEOUT_S).results] == [pb.NONE]
    created = c.stub.CreateTopics(new_topic("admins-topic"), metadata=as_admin(c),
                                  timeout=RPC_TIMEOUT_S)
    assert [t.error_code for t in created.topics] == [pb.NONE]
    # Bob may now create his own topics, and still not ACLs.
    mine = c.stub.CreateTopics(new_topic("bob-events"), metadata=as_bob(),
                               timeout=RPC_TIMEOUT_S)
    assert [t.error_code for t in mine.topics] == [pb.NONE]
    refused = c.stub.CreateAcls(everything_for_everyone(), metadata=as_bob(),
                                timeout=RPC_TIMEOUT_S)
    assert {r.error_code for r in refused.results} == {pb.CLUSTER_AUTHORIZATION_FAILED}
    # The admin (a super user, so a cluster member) calling for bob: bob's rights count.
    for_bob = as_admin(c) + ((PRINCIPAL_KEY, f"User:{BOB}"), (HOST_KEY, "127.0.0.1"))
    forwarded = c.stub.CreateTopics(new_topic("other-topic"), metadata=for_bob,
                                    timeout=RPC_TIMEOUT_S)
    assert [t.error_code for t in forwarded.topics] == [pb.TOPIC_AUTHORIZATION_FAILED]
    altered = c.stub.AlterUserScramCredentials(replace_admin_credential(), metadata=for_bob,
                                               timeout=RPC_TIMEOUT_S)
    assert [r.error_code for r in altered.results] == [pb.CLUSTER_AUTHORIZATION_FAILED]


def test_brokers_authenticate_and_clients_go_through_them(cluster):
    c = cluster
    assert all(not b.fenced for b in brokers(c).values()) and set(brokers(c)) == {1, 2}
    command_config = c.manifest()["sasl"]["command_config"]
    created = c.tide("--command-config", command_config, "topics", "create", "through-broker",
                     "--partitions", "2", "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    produced = c.tide("--command-config", command_config, "produce", "through-broker",
                      "--acks", "all", input="a\nb\n")
    assert produced.returncode == 0, produced.stderr
    consumed = c.tide("--command-config", command_config, "consume", "through-broker",
                      "--from-beginning", "--timeout-ms", "3000")
    assert sorted(consumed.stdout.split()) == ["a", "b"], consumed.stderr
