"""Who may do what under mutual TLS: principals from certificates and the pure rules.

``proto.tls.principal_of`` reads gRPC's auth context; ``broker.control_rules``
decides BrokerControl calls, ``controller.authorization`` the brokers' calls to
the controller; ``client.security`` reads Kafka's client properties.
"""

from __future__ import annotations

import pytest

from tidewater.broker.replication.control_rules import control_principal_refusal
from tidewater.client.security import (
    ClientSecurity,
    SecurityConfigError,
    parse_properties,
    properties_security,
)
from tidewater.controller.authorization import broker_request_refusal
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.tls import Principal, TlsConfigError, TlsFiles, broker_id_of, principal_of

DENIED = pb.CLUSTER_AUTHORIZATION_FAILED
CONTROLLER = Principal("controller", "controller")
BROKER_1 = Principal("broker-1", "broker")
BROKER_2 = Principal("broker-2", "broker")
CLIENT = Principal("tide-client", "client")
# A client certificate named like a broker: the role (OU) decides, not the name alone.
CLIENT_NAMED_BROKER_1 = Principal("broker-1", "client")


def test_principal_from_grpc_auth_context():
    context = {"transport_security_type": [b"ssl"], "x509_common_name": [b"broker-1"],
               "x509_subject": [b"OU=broker,CN=broker-1"]}
    assert principal_of(context) == BROKER_1
    assert principal_of({"transport_security_type": [b"ssl"]}) is None  # no client certificate
    assert principal_of({}) is None  # plaintext
    escaped = {"x509_common_name": [b"a,b"], "x509_subject": [b"OU=client,CN=a\\,b"]}
    assert principal_of(escaped) == Principal("a,b", "client")


@pytest.mark.parametrize("principal, broker_id", [
    (BROKER_1, 1), (Principal("broker-12", "broker"), 12), (CLIENT_NAMED_BROKER_1, None),
    (Principal("broker-01", "broker"), None), (Principal("broker-x", "broker"), None),
    (Principal("broker-", "broker"), None), (CONTROLLER, None)])
def test_broker_id_of(principal, broker_id):
    assert broker_id_of(principal) == broker_id


@pytest.mark.parametrize("rpc, principal, replica_id, refused", [
    ("LeaderAndIsr", CONTROLLER, None, False),
    ("StopReplica", CONTROLLER, None, False),
    ("UpdateMetadata", CONTROLLER, None, False),
    ("StopReplica", BROKER_1, None, True),
    ("LeaderAndIsr", CLIENT, None, True),
    ("UpdateMetadata", None, None, True),
    ("ReplicaFetch", BROKER_1, 1, False),
    ("ReplicaFetch", BROKER_2, 1, True),  # another broker's certificate
    ("ReplicaFetch", CLIENT_NAMED_BROKER_1, 1, True),
    ("ReplicaFetch", CONTROLLER, 1, True),
    ("ReplicaFetch", BROKER_1, -1, True),
    ("ReplicaFetch", None, 1, True),
    ("WriteTxnMarkers", BROKER_1, None, False),  # a coordinator on any broker
    ("WriteTxnMarkers", BROKER_2, None, False),
    ("WriteTxnMarkers", CLIENT_NAMED_BROKER_1, None, True),
    ("WriteTxnMarkers", CONTROLLER, None, True),
    ("WriteTxnMarkers", None, None, True),
    ("VerifyTxnPartitions", BROKER_2, None, False),  # a leader asks a coordinator (KIP-890)
    ("VerifyTxnPartitions", CLIENT_NAMED_BROKER_1, None, True),
    ("VerifyTxnPartitions", CONTROLLER, None, True),
    ("VerifyTxnPartitions", None, None, True),
])
def test_broker_control_calls_under_mutual_tls(rpc, principal, replica_id, refused):
    code = control_principal_refusal(rpc, principal, authenticating=True, replica_id=replica_id)
    assert code == (DENIED if refused else None)


def test_without_tls_the_broker_rule_takes_everything():
    for rpc in ("LeaderAndIsr", "StopReplica", "UpdateMetadata", "ReplicaFetch"):
        assert control_principal_refusal(rpc, None, authenticating=False, replica_id=7) is None


def test_an_unknown_control_call_is_a_programming_error():
    with pytest.raises(ValueError):
        control_principal_refusal("Produce", CONTROLLER, authenticating=True)


@pytest.mark.parametrize("principal, broker_id, refused", [
    (BROKER_1, 1, False), (BROKER_2, 1, True), (CLIENT, 1, True),
    (CLIENT_NAMED_BROKER_1, 1, True), (CONTROLLER, 1, True), (None, 1, True)])
def test_controller_takes_a_brokers_calls_only_from_its_own_certificate(principal, broker_id,
                                                                        refused):
    code = broker_request_refusal(principal, broker_id, authenticating=True)
    assert code == (DENIED if refused else None)
    assert broker_request_refusal(principal, broker_id, authenticating=False) is None


def test_tls_flags_all_or_none():
    assert TlsFiles.from_flags(None, None, None) is None
    files = TlsFiles.from_flags("ca.pem", "b.pem", "b.key")
    assert files is not None and files.cert is not None and files.cert.name == "b.pem"
    for flags in [("ca.pem", None, None), (None, "b.pem", "b.key"), ("ca.pem", "b.pem", None)]:
        with pytest.raises(TlsConfigError):
            TlsFiles.from_flags(*flags)


def test_kafka_client_properties():
    text = """# written for kafka-console-producer
security.protocol = SSL
ssl.ca.location=/etc/ca.pem
ssl.certificate.location: /etc/c.pem
ssl.key.location=/etc/c.key
linger.ms=5
"""
    assert properties_security(parse_properties(text)) == ClientSecurity(
        "SSL", "/etc/ca.pem", "/etc/c.pem", "/etc/c.key")
    assert properties_security(parse_properties(
        "security.protocol=SSL\nssl.cafile=/ca.pem\n")) == ClientSecurity("SSL", "/ca.pem")
    assert properties_security({}) == ClientSecurity()
    for bad in ("security.protocol=SASL_SSL\n", "ssl.cafile=/ca.pem\n",
                "security.protocol=SSL\nssl.truststore.location=/t.jks\n",
                "security.protocol=SSL\nssl.certfile=/c.pem\n", "no separator\n"):
        with pytest.raises(SecurityConfigError):
            properties_security(parse_properties(bad))


def test_clients_with_other_settings_never_share_a_channel_pool_key():
    plain, tls = ClientSecurity(), ClientSecurity.from_options("ssl", "/ca.pem")
    assert plain != tls and hash(plain) != hash(tls) and tls.protocol == "SSL"


def test_tls_flags_default_to_the_environment_and_flags_win():
    import argparse

    from tidewater.proto.tls import add_tls_arguments

    env = {"TIDE_TLS_CA": "/tls/ca.pem", "TIDE_TLS_CERT": "/tls/b.pem", "TIDE_TLS_KEY": ""}
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser, env)
    args = parser.parse_args(["--tls-cert", "/elsewhere.pem"])
    assert (args.tls_ca, args.tls_cert, args.tls_key) == ("/tls/ca.pem", "/elsewhere.pem", None)
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser, {})
    args = parser.parse_args([])
    assert (args.tls_ca, args.tls_cert, args.tls_key) == (None, None, None)


def test_member_only_admin_calls_need_a_broker_or_controller_certificate():
    from tidewater.controller.authorization import (
        MEMBER_ONLY_ADMIN_RPCS,
        admin_request_refusal,
    )
    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto.tls import Principal

    broker, controller, client = (Principal("broker-2", "broker"),
                                  Principal("controller", "controller"),
                                  Principal("alice", "client"))
    for rpc in MEMBER_ONLY_ADMIN_RPCS:
        assert admin_request_refusal(broker, rpc, authenticating=True) is None
        assert admin_request_refusal(controller, rpc, authenticating=True) is None
        assert admin_request_refusal(client, rpc, authenticating=True) == \
            pb.CLUSTER_AUTHORIZATION_FAILED
        assert admin_request_refusal(None, rpc, authenticating=True) == \
            pb.CLUSTER_AUTHORIZATION_FAILED
        assert admin_request_refusal(None, rpc, authenticating=False) is None  # no TLS
    assert admin_request_refusal(client, "DescribeCluster", authenticating=True) is None
