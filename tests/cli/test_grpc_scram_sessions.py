"""Issue 29 item 6: SCRAM over gRPC, against `tide cluster up --sasl-mechanisms
SCRAM-SHA-512` (2 brokers, connections.max.reauth.ms=3000).

- `tide` produces and consumes with SCRAM-SHA-512 over gRPC, on a topic replicated to
  both brokers: the followers' fetches and the brokers' controller channels
  authenticate with SCRAM too (the broker refuses PLAIN passwords: SCRAM only);
- a capture of every call's metadata and request bytes shows no password, only the
  SCRAM exchange and then ``authorization: Session <token>``;
- PLAIN metadata, a forged token, a garbage one, an expired one and another broker's
  token are refused (UNAUTHENTICATED, SASL_AUTHENTICATION_FAILED); a wrong password and
  an unknown user get the same refusal, after the failed-authentication delay;
- a producer running longer than three session lifetimes re-authenticates without an
  error;
- issue 29 item 7: OffsetCommit and OffsetFetch check the topics (READ, DESCRIBE) as
  well as the group, on gRPC and on the Kafka listener.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster, wait_for

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import MetadataClient
from tidewater.client.producer import Producer
from tidewater.client.sasl_session import ScramLogin, sync_caller
from tidewater.client.security import ClientSecurity, SyncScramAuth, sync_channel
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.scram import SaslAuthenticationError, plain_metadata
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")

MECHANISM = "SCRAM-SHA-512"
REAUTH_MS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("grpc-scram"), 2,
                      f"connections.max.reauth.ms={REAUTH_MS}",
                      up_flags=("--sasl-mechanisms", MECHANISM))
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.sasl = manifest["sasl"]  # type: ignore[attr-defined]
    c.password = read_password(c.sasl["command_config"])  # type: ignore[attr-defined]
    c.manifest_ = manifest  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def tide(c, *args: str, **kwargs):
    return run_tide(*args, "--command-config", c.sasl["command_config"],
                    bootstrap=c.bootstrap, **kwargs)


def admin_security(c) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
            "sasl_plain_username": "admin", "sasl_plain_password": c.password}


def first(c) -> str:
    return c.bootstrap.split(",")[0]


def broker_addresses(c) -> list[str]:
    """Each broker's gRPC address (from a Metadata answer, as a client learns them)."""
    channel, _login = recording_channel(first(c), c, [])
    with channel:
        answer = pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=10)
    return [f"{b.host}:{b.port}" for b in sorted(answer.brokers, key=lambda b: b.broker_id)]


def broker_log(c, broker_id: int) -> str:
    return process_log(c, f"broker-{broker_id}")


def process_log(c, name: str) -> str:
    return Path(c.manifest_["processes"][name]["log"]).read_text()


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """Keeps every unary call's method, metadata and request bytes, as they leave."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def intercept_unary_unary(self, continuation, details, request):
        self.seen.append((details.method, tuple(details.metadata or ()),
                          request.SerializeToString()))
        return continuation(details, request)


def recording_channel(target: str, c, seen: list, *, user: str = "admin",
                      password: str | None = None):
    """The client's own SCRAM interceptor (``client.security``) over a channel whose
    wire-side calls ``Recorder`` sees."""
    login = ScramLogin(MECHANISM, user, password or c.password)
    raw = grpc.intercept_channel(grpc.insecure_channel(target), Recorder(seen))
    return grpc.intercept_channel(raw, SyncScramAuth(login, sync_caller(raw))), login


def metadata_call(target: str, metadata) -> pb.MetadataResponse:
    with grpc.insecure_channel(target) as channel:
        return pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), metadata=metadata,
                                                    timeout=10)


def refusal(target: str, metadata) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        metadata_call(target, metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "SASL_AUTHENTICATION_FAILED" in refused.value.details()
    return refused.value.details()


def token_of(login: ScramLogin, target: str) -> str:
    with grpc.insecure_channel(target) as channel:
        [(_key, value)] = login.metadata_sync(sync_caller(channel))
    assert value.startswith("Session ")
    return value[len("Session "):]


def test_tide_produces_and_consumes_with_scram_over_grpc(cluster):
    c = cluster
    created = tide(c, "topics", "create", "scram-grpc", "--partitions", "1",
                   "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    lines = "".join(f"v{i}\n" for i in range(30))
    produced = tide(c, "produce", "scram-grpc", "--acks", "all", input=lines)
    assert produced.returncode == 0, produced.stderr
    consumed = tide(c, "consume", "scram-grpc", "--from-beginning", "--max-messages", "30",
                    "--timeout-ms", "20000")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [f"v{i}" for i in range(30)]
    # acks=all on a 2-replica topic: the follower fetched from the leader as the brokers'
    # user, over SCRAM (this cluster takes no PLAIN), and both brokers registered with
    # the controller the same way.
    [partition] = json.loads(tide(c, "topics", "describe", "scram-grpc",
                                  "--json").stdout)["topics"][0]["partitions"]
    assert sorted(partition["isr"]) == [1, 2]
    assert "authenticated as User:broker" in broker_log(c, partition["leader"])
    assert process_log(c, "controller").count("authenticated as User:broker") >= 2
    for name in ("controller", "broker-1", "broker-2"):
        assert c.password not in process_log(c, name)


def test_no_password_crosses_the_wire_after_the_exchange(cluster):
    c = cluster
    seen: list = []
    channel, login = recording_channel(first(c), c, seen)
    with channel:
        stub = pb_grpc.BrokerStub(channel)
        for _ in range(3):
            assert stub.Metadata(pb.MetadataRequest(), timeout=10).brokers
    methods = [method for method, _, _ in seen]
    assert methods == ["/tidewater.Sasl/SaslHandshake", "/tidewater.Sasl/SaslAuthenticate",
                       "/tidewater.Sasl/SaslAuthenticate"] + ["/tidewater.Broker/Metadata"] * 3
    secret_forms = [c.password.encode(), base64.b64encode(c.password.encode()),
                    plain_metadata("admin", c.password)[1].encode()]
    for method, metadata, request in seen:
        wire = request + repr(metadata).encode()
        assert not any(form in wire for form in secret_forms), method
    authorizations = [v for _, metadata, _ in seen for k, v in metadata if k == "authorization"]
    assert len(authorizations) == 3 and all(v.startswith("Session ") for v in authorizations)
    assert len(set(authorizations)) == 1 and login.exchanges == 1
    # This broker enables SCRAM only: a PLAIN password in metadata is refused.
    assert "PLAIN is not an enabled SASL mechanism" in refusal(
        first(c), (plain_metadata("admin", c.password),))


def test_forged_garbage_expired_and_other_brokers_tokens_are_refused(cluster):
    c = cluster
    one, two = broker_addresses(c)
    assert "unknown session token" in refusal(
        one, (("authorization", "Session " + secrets.token_urlsafe(32)),))
    assert "malformed session token" in refusal(one, (("authorization", "Session " + "x" * 500),))
    assert "malformed session token" in refusal(one, (("authorization", "Session "),))
    refusal(one, (("authorization", "Bearer abc"),))
    # A token of the second broker, replayed at the first: unknown there.
    token = token_of(ScramLogin(MECHANISM, "admin", c.password), two)
    assert metadata_call(two, (("authorization", "Session " + token),)).brokers
    assert "unknown session token" in refusal(one, (("authorization", "Session " + token),))
    # connections.max.reauth.ms later, the token has expired.
    time.sleep(REAUTH_MS / 1000 + 0.3)
    assert "session token expired" in refusal(two, (("authorization", "Session " + token),))
    for broker_id in (1, 2):
        assert token not in broker_log(c, broker_id)  # tokens are never logged


def test_wrong_password_and_unknown_user_get_the_same_delayed_refusal(cluster):
    c = cluster
    answers = []
    for user, password in (("admin", "not-the-password"), ("nobody", "whatever")):
        login = ScramLogin(MECHANISM, user, password)
        started = time.monotonic()
        with grpc.insecure_channel(first(c)) as channel, \
                pytest.raises(SaslAuthenticationError) as refused:
            login.metadata_sync(sync_caller(channel))
        assert time.monotonic() - started >= 0.09  # connection.failed.authentication.delay.ms
        answers.append(str(refused.value).replace(repr(user), "USER"))
    assert answers[0] == answers[1]
    assert "authentication failed for user USER (SCRAM-SHA-512)" in answers[0]
    # The client-side path reaches the same typed error through a client.
    with pytest.raises(SaslAuthenticationError):
        MetadataClient(c.bootstrap, security=ClientSecurity.from_options(
            **{**admin_security(c), "sasl_plain_password": "wrong"})).refresh()


def test_a_long_running_producer_reauthenticates_without_errors(cluster):
    c = cluster
    created = tide(c, "topics", "create", "scram-long", "--partitions", "1",
                   "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    security = ClientSecurity.from_options(**admin_security(c))
    before = broker_log(c, 1).count("authenticated as User:admin")
    # Metadata every 500 ms: the producer's calls keep going past several lifetimes.
    metadata = MetadataClient(c.bootstrap, metadata_max_age_ms=500, security=security)
    sent = 0
    errors: list = []
    with Producer(c.bootstrap, metadata=metadata, **admin_security(c)) as producer:
        deadline = time.monotonic() + 3.5 * REAUTH_MS / 1000
        while time.monotonic() < deadline:
            future = producer.send("scram-long", value=b"%d" % sent)
            future.add_done_callback(lambda f: f.exception() and errors.append(f.exception()))
            sent += 1
            time.sleep(0.02)
        producer.flush()
    assert errors == []
    after = broker_log(c, 1).count("authenticated as User:admin")
    assert after - before >= 3  # a session lasts REAUTH_MS: renewed at least 3 times
    got: list[bytes] = []
    with Consumer(c.bootstrap, **admin_security(c)) as consumer:
        consumer.assign([("scram-long", 0)])
        consumer.seek_to_beginning()
        wait_for(lambda: got.extend(r.value for r in consumer.poll(500)) or len(got) >= sent,
                 "the records back", timeout_s=30)
    assert got == [b"%d" % i for i in range(sent)]


def test_offset_commit_and_fetch_check_the_topics_as_well_as_the_group(cluster):
    """Issue 29 item 7, Kafka's rule on both the Kafka listener and gRPC: OffsetCommit
    needs READ on each topic besides the group, OffsetFetch DESCRIBE; a refused topic's
    partitions are TOPIC_AUTHORIZATION_FAILED (the others are served), and a fetch of
    all the group's offsets leaves refused topics out."""
    c = cluster
    for topic in ("oc-ok", "oc-no"):
        assert tide(c, "topics", "create", topic, "--partitions", "1").returncode == 0
    assert tide(c, "users", "create", "carol", "--password", "carol-pw").returncode == 0
    for grant in (("--group", "carol-grpc"), ("--group", "carol-kafka"), ("--topic", "oc-ok")):
        added = tide(c, "acls", "add", "--allow-principal", "User:carol", "--operation", "read",
                     "--operation", "describe", *grant)
        assert added.returncode == 0, added.stderr
    # As the admin (a super user), commit offsets of both topics for both groups first:
    # carol's fetch then has something to be refused or hidden.
    admin = ClientSecurity.from_options(**admin_security(c))
    carol = ClientSecurity.from_options(**{**admin_security(c), "sasl_plain_username": "carol",
                                           "sasl_plain_password": "carol-pw"})
    time.sleep(1)  # the user and the ACLs reach the brokers

    def coordinator_stub(security: ClientSecurity, group: str):
        with sync_channel(first(c), security, ()) as channel:
            def ask():
                answer = pb_grpc.BrokerStub(channel).FindCoordinator(
                    pb.FindCoordinatorRequest(group_id=group), timeout=10)
                return answer if answer.error_code == pb.NONE else None
            found = wait_for(ask, f"a coordinator for {group}", timeout_s=30)
        return sync_channel(f"{found.host}:{found.port}", security, ())

    def commit(security: ClientSecurity, group: str, offset: int) -> dict:
        with coordinator_stub(security, group) as channel:
            answer = pb_grpc.BrokerStub(channel).OffsetCommit(pb.OffsetCommitRequest(
                group_id=group, generation_id=-1, offsets=[
                    pb.GroupOffset(topic=t, partition=0, offset=offset)
                    for t in ("oc-ok", "oc-no")]), timeout=10)
        return {o.topic: o.error_code for o in answer.offsets}

    def fetch(security: ClientSecurity, group: str, *topics: str) -> dict:
        with coordinator_stub(security, group) as channel:
            answer = pb_grpc.BrokerStub(channel).OffsetFetch(pb.OffsetFetchRequest(
                group_id=group, partitions=[pb.GroupOffset(topic=t, partition=0)
                                            for t in topics]), timeout=10)
        assert answer.error_code == pb.NONE
        return {o.topic: (o.offset, o.error_code) for o in answer.offsets}
    for group in ("carol-grpc", "carol-kafka"):
        assert commit(admin, group, 3) == {"oc-ok": pb.NONE, "oc-no": pb.NONE}
    # gRPC
    assert commit(carol, "carol-grpc", 7) == {"oc-ok": pb.NONE,
                                              "oc-no": pb.TOPIC_AUTHORIZATION_FAILED}
    assert fetch(carol, "carol-grpc", "oc-ok", "oc-no") == {
        "oc-ok": (7, pb.NONE), "oc-no": (-1, pb.TOPIC_AUTHORIZATION_FAILED)}
    assert fetch(carol, "carol-grpc") == {"oc-ok": (7, pb.NONE)}
    assert fetch(admin, "carol-grpc") == {"oc-ok": (7, pb.NONE), "oc-no": (3, pb.NONE)}
    # The Kafka listener, with confluent-kafka
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": c.manifest_["kafka_bootstrap"], "group.id": "carol-kafka",
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM,
        "sasl.username": "carol", "sasl.password": "carol-pw", "enable.auto.commit": False})
    try:
        offsets = [confluent_kafka.TopicPartition(t, 0, 9) for t in ("oc-ok", "oc-no")]
        try:
            committed = consumer.commit(offsets=offsets, asynchronous=False)
            codes = {tp.topic: tp.error.code() if tp.error else 0 for tp in committed}
        except confluent_kafka.KafkaException as e:
            codes = {"request": e.args[0].code()}
        assert codes.get("oc-no", codes.get("request")) == \
            confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
        got = consumer.committed([confluent_kafka.TopicPartition(t, 0) for t in
                                  ("oc-ok", "oc-no")], timeout=10)
        by_topic = {tp.topic: tp for tp in got}
        assert by_topic["oc-ok"].offset == 9 and by_topic["oc-ok"].error is None
        assert by_topic["oc-no"].error is not None and by_topic["oc-no"].error.code() == \
            confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    assert fetch(admin, "carol-kafka") == {"oc-ok": (9, pb.NONE), "oc-no": (3, pb.NONE)}
