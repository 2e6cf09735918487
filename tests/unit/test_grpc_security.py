"""Who a gRPC caller is and what of its request it keeps (broker/security/grpc_auth.py)."""

import base64

import pytest

from tidewater.broker.security.grpc_auth import (
    GrpcLogins,
    PasswordChecker,
    fetch_refusals,
    grpc_session,
    hide_undescribable,
    list_offsets_refusals,
    peer_host,
    produce_refusals,
)
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings
from tidewater.proto import acls as a
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.scram import SaslAuthenticationError, make_credential, plain_metadata

pytestmark = pytest.mark.timeout(60)

CREDENTIAL = make_credential("SCRAM-SHA-512", "pw")


def checker(counter=None):
    def credentials_of(user):
        if counter is not None:
            counter.append(user)
        return [CREDENTIAL] if user == "alice" else []
    return PasswordChecker(credentials_of)


def session(metadata=(), auth_context=None, *, sasl_required=False, check=None):
    return grpc_session(metadata, auth_context or {}, "ipv4:10.1.2.3:5555",
                        logins=GrpcLogins(check or checker()), sasl_required=sasl_required)


def test_password_metadata_names_the_user():
    got = session([plain_metadata("alice", "pw")])
    assert (got.principal, got.host) == ("User:alice", "10.1.2.3")


@pytest.mark.parametrize("value", [
    plain_metadata("alice", "wrong")[1], plain_metadata("mallory", "pw")[1], "Basic abc",
    "PLAIN !!!", "PLAIN " + base64.b64encode(b"no-separators").decode()])
def test_bad_credentials_are_refused(value):
    with pytest.raises(SaslAuthenticationError):
        session([("authorization", value)])


def test_certificate_then_anonymous_and_sasl_required():
    cert = {"x509_common_name": [b"svc"], "x509_subject": [b"CN=svc,OU=client"]}
    assert session(auth_context=cert).principal == "User:svc"
    assert session().principal == a.ANONYMOUS
    with pytest.raises(SaslAuthenticationError, match="requires SASL"):
        session(sasl_required=True)


def test_password_verdicts_are_cached_per_credential():
    calls = []
    c = checker(calls)
    for _ in range(3):
        assert c.check("alice", "pw")
        assert not c.check("alice", "nope")
    assert calls == ["alice"] * 6  # credentials looked up each time (they may change) ...
    assert len(c._verdicts) == 2  # ... but PBKDF2 ran once per password


def test_peer_hosts():
    assert peer_host("ipv4:127.0.0.1:80") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:80") == "::1"
    assert peer_host("unix:/tmp/x") == "/tmp/x"


def allow_only(topic):
    return lambda operation, name: name == topic


def test_refusals_split_requests_in_place():
    produce = pb.ProduceRequest(partitions=[pb.ProducePartitionData(topic=t, partition=0)
                                            for t in ("ok", "no", "ok")])
    refused = produce_refusals(produce, allow_only("ok"))
    assert [p.topic for p in produce.partitions] == ["ok", "ok"]
    assert [(r.topic, r.error_code) for r in refused] == [("no", pb.TOPIC_AUTHORIZATION_FAILED)]
    fetch = pb.FetchRequest(partitions=[pb.FetchPartition(topic="no", partition=1)])
    refused = fetch_refusals(fetch, allow_only("ok"))
    assert not fetch.partitions and refused[0].error_code == pb.TOPIC_AUTHORIZATION_FAILED
    assert not refused[0].records
    offsets = pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(topic="ok")])
    assert list_offsets_refusals(offsets, allow_only("ok")) == []
    assert len(offsets.partitions) == 1


@pytest.mark.parametrize("named", [False, True])
def test_metadata_hides_what_may_not_be_described(named):
    response = pb.MetadataResponse(topics=[
        pb.TopicMetadata(name="ok", partitions=[pb.PartitionMetadata(partition=0)]),
        pb.TopicMetadata(name="secret", partitions=[pb.PartitionMetadata(partition=0)])])
    hide_undescribable(response, allow_only("ok"), named=named)
    if named:
        assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [
            ("ok", pb.NONE, 1), ("secret", pb.UNKNOWN_TOPIC_OR_PARTITION, 0)]
    else:
        assert [t.name for t in response.topics] == ["ok"]


class Cache:
    def __init__(self, acls):
        self._acls = acls

    def acls(self):
        return self._acls

    def user_credentials(self, user):
        return []

    def scram_iterations(self, mechanism):
        return []

    def scram_credential(self, user, mechanism):
        return None


def test_broker_security_rebuilds_the_authorizer_only_for_a_new_acl_set():
    acls = (a.Acl(a.TOPIC, "t", a.LITERAL, "User:x", "*", a.READ, a.ALLOW),)
    cache = Cache(acls)
    security = BrokerSecurity(SecuritySettings(authorizer="acl"), cache)
    first = security.authorizer()
    assert security.authorizer() is first
    cache._acls = ()
    assert security.authorizer() is not first
    assert BrokerSecurity(SecuritySettings(), cache).authorizer() is None  # off: allow all


@pytest.mark.parametrize("bad", [dict(sasl_mechanisms=("GSSAPI",)), dict(authorizer="x"),
                                 dict(super_users=frozenset({"admin"}))])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SecuritySettings(**bad)


def test_kafka_named_security_settings_with_set():
    from tidewater.broker.config import ConfigError, config_from_args
    base = ["--broker-id", "1", "--listen", "127.0.0.1:1", "--controller", "127.0.0.1:2",
            "--data-dir", "/tmp/x"]
    config = config_from_args([
        *base, "--set", "sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN",
        "--set", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--set", "super.users=User:admin;User:ops",
        "--set", "allow.everyone.if.no.acl.found=true"])
    assert config.security == SecuritySettings(
        sasl_mechanisms=("SCRAM-SHA-512", "PLAIN"), authorizer="acl",
        super_users=frozenset({"User:admin", "User:ops"}), allow_everyone_if_no_acl_found=True)
    flags = config_from_args([*base, "--sasl-mechanisms", "PLAIN", "--authorizer", "acl"])
    assert flags.security.sasl_mechanisms == ("PLAIN",) and flags.security.authorizer == "acl"
    for bad in ("sasl.enabled.mechanisms=GSSAPI", "super.users=admin",
                "allow.everyone.if.no.acl.found=maybe", "authorizer.class.name=x.Y"):
        with pytest.raises(ConfigError):
            config_from_args([*base, "--set", bad])
