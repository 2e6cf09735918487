"""Issue 18, authentication and authorization for clients, against `tide cluster up`.

- confluent-kafka and kcat produce and consume over SASL_SSL with SCRAM-SHA-512
  (the admin super user that ``cluster up --sasl-mechanisms`` makes), and over
  SASL_PLAINTEXT with PLAIN;
- a wrong password is refused (SASL_AUTHENTICATION_FAILED) and nothing is served;
- a user created with confluent-kafka's AdminClient (AlterUserScramCredentials)
  whose only ACL (CreateAcls) allows READ on one topic consumes it, and nothing
  else: its produce is refused, the other topic is invisible, admin calls are
  refused; DescribeAcls/DeleteAcls work for the admin;
- garbage SASL frames close only their own connection;
- `tide users` / `tide acls` and the Python gRPC clients with SASL credentials;
- without SASL, a Kafka client's TLS certificate names its principal.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.broker.kafka.codec import encode_request
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

KCAT = shutil.which("kcat")


def _manifest(c) -> dict:
    return json.loads((Path(c.data_dir) / "cluster.json").read_text())


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sasl-ssl"), 1, tls=True,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"))
    m = _manifest(c)
    c.kafka, c.sasl, c.ca = m["kafka_bootstrap"], m["sasl"], m["tls"]["ca"]
    yield c
    stop_cluster(c)


def conf(c, user=None, password=None, mechanism=None, **more) -> dict:
    out = {"bootstrap.servers": c.kafka,
           "security.protocol": "SASL_SSL" if getattr(c, "ca", None) else "SASL_PLAINTEXT",
           "sasl.mechanism": mechanism or c.sasl["mechanism"],
           "sasl.username": user or c.sasl["username"],
           "sasl.password": password or read_password(c.sasl["command_config"]), **more}
    if getattr(c, "ca", None):
        out["ssl.ca.location"] = c.ca
    return out


def create_topics(c, *names):
    admin = admin_mod.AdminClient(conf(c))
    for future in admin.create_topics([admin_mod.NewTopic(n, 1, 1) for n in names]).values():
        future.result(30)


def produce(config, topic, values, timeout_ms=20000) -> list:
    errors = []
    producer = confluent_kafka.Producer({**config, "acks": "all",
                                         "message.timeout.ms": timeout_ms})
    for v in values:
        producer.produce(topic, value=v, on_delivery=lambda err, _m: err and errors.append(err))
    assert producer.flush(30) == 0
    return errors


def consume(config, topic, count, timeout_s=30) -> list[bytes]:
    consumer = confluent_kafka.Consumer({**config, "group.id": "assign-only",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got


def kcat_flags(c, user=None, password=None, mechanism=None) -> list[str]:
    return [f"-X{k}={v}" for k, v in conf(c, user, password, mechanism).items()
            if k != "bootstrap.servers"] + ["-b", c.kafka]


def test_confluent_kafka_and_kcat_over_sasl_ssl_scram_sha_512(sasl_ssl):
    c = sasl_ssl
    create_topics(c, "scram-orders")
    assert produce(conf(c), "scram-orders", [f"v{i}".encode() for i in range(20)]) == []
    assert consume(conf(c), "scram-orders", 20) == [f"v{i}".encode() for i in range(20)]
    if KCAT is None:
        pytest.skip("kcat not installed (make kcat): confluent-kafka checked only")
    subprocess.run([KCAT, *kcat_flags(c), "-P", "-t", "scram-orders", "-X", "acks=all"],
                   input=b"kcat-1\nkcat-2\n", check=True, timeout=60)
    read = subprocess.run([KCAT, *kcat_flags(c), "-C", "-t", "scram-orders", "-o", "beginning",
                           "-e", "-q"], capture_output=True, check=True, timeout=60)
    assert read.stdout.decode().splitlines() == [f"v{i}" for i in range(20)] + ["kcat-1",
                                                                                "kcat-2"]
    # PLAIN and SCRAM-SHA-256 on the same listener, with the same credential.
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        read = subprocess.run([KCAT, *kcat_flags(c, mechanism=mechanism), "-C", "-t",
                               "scram-orders", "-o", "-1", "-e", "-q"],
                              capture_output=True, check=True, timeout=60)
        assert read.stdout.decode().splitlines() == ["kcat-2"]


def test_a_wrong_password_is_refused(sasl_ssl):
    c = sasl_ssl
    errors = []
    admin = admin_mod.AdminClient({**conf(c, password="wrong"),
                                   "error_cb": lambda e: errors.append(e)})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # error callbacks are served by poll
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
    assert any("SASL" in e.str() or "uthentication" in e.str() for e in errors), errors
    if KCAT is not None:
        listed = subprocess.run([KCAT, *kcat_flags(c, password="wrong"), "-L", "-m", "5"],
                                capture_output=True, timeout=60)
        assert listed.returncode != 0


def test_a_read_only_acl_lets_a_user_consume_one_topic_and_nothing_else(sasl_ssl):
    c = sasl_ssl
    create_topics(c, "ro-orders", "ro-secret")
    assert produce(conf(c), "ro-orders", [b"a", b"b"]) == []
    admin = admin_mod.AdminClient(conf(c))
    upsert = admin_mod.UserScramCredentialUpsertion(
        "alice", admin_mod.ScramCredentialInfo(admin_mod.ScramMechanism.SCRAM_SHA_512, 8192),
        b"alice-pw")
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (admin_mod.ScramMechanism.SCRAM_SHA_512, 8192)]
    read_acl = admin_mod.AclBinding(
        admin_mod.ResourceType.TOPIC, "ro-orders", admin_mod.ResourcePatternType.LITERAL,
        "User:alice", "*", admin_mod.AclOperation.READ, admin_mod.AclPermissionType.ALLOW)
    for future in admin.create_acls([read_acl]).values():
        future.result(30)
    everything = admin_mod.AclBindingFilter(
        admin_mod.ResourceType.ANY, None, admin_mod.ResourcePatternType.ANY, None, None,
        admin_mod.AclOperation.ANY, admin_mod.AclPermissionType.ANY)
    assert read_acl in admin.describe_acls(everything).result(30)
    alice = conf(c, "alice", "alice-pw")
    time.sleep(1)  # UpdateMetadata reaches the broker (the controller waits, bounded)
    assert consume(alice, "ro-orders", 2) == [b"a", b"b"]
    errors = produce(alice, "ro-orders", [b"not allowed"])
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # Idempotent: InitProducerId needs WRITE on some topic (KIP-679); librdkafka fails
    # the delivery with the fatal error it got.
    fatal: list = []
    idempotent = confluent_kafka.Producer({**alice, "enable.idempotence": True,
                                           "error_cb": fatal.append})
    deadline = time.monotonic() + 20
    try:  # the fatal error comes back from produce() or poll(), or reaches error_cb
        idempotent.produce("ro-orders", value=b"not allowed")
        while not fatal and time.monotonic() < deadline:
            idempotent.poll(0.2)
    except confluent_kafka.KafkaException as e:
        fatal.append(e.args[0])
    assert fatal and fatal[0].code() in (confluent_kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                         confluent_kafka.KafkaError._FATAL), fatal
    assert "authoriz" in str(fatal[0]).lower(), fatal
    assert consume(conf(c), "ro-orders", 3, timeout_s=5) == [b"a", b"b"]  # nothing appended
    alice_admin = admin_mod.AdminClient(alice)
    assert set(alice_admin.list_topics(timeout=10).topics) == {"ro-orders"}
    assert consume(alice, "ro-secret", 1, timeout_s=5) == []
    # librdkafka answers an empty list for a refused DescribeAcls; kafka-python raises.
    assert alice_admin.describe_acls(everything).result(30) == []
    kafka_admin = pytest.importorskip("kafka.admin")
    kafka_errors = pytest.importorskip("kafka.errors")
    ka = kafka_admin.KafkaAdminClient(
        bootstrap_servers=c.kafka, security_protocol="SASL_SSL", ssl_cafile=c.ca,
        sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
        sasl_plain_password="alice-pw")
    with pytest.raises(kafka_errors.ClusterAuthorizationFailedError):
        ka.describe_acls(kafka_admin.ACLFilter(
            principal=None, host="*", operation=kafka_admin.ACLOperation.ANY,
            permission_type=kafka_admin.ACLPermissionType.ANY,
            resource_pattern=kafka_admin.ResourcePatternFilter(
                kafka_admin.ResourceType.ANY, None, kafka_admin.ACLResourcePatternType.ANY)))
    ka.close()
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        alice_admin.create_topics([admin_mod.NewTopic("alice-topic", 1, 1)])["alice-topic"].result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    # The admin takes the ACL away: alice reads nothing more.
    deleted = admin.delete_acls([admin_mod.AclBindingFilter(
        admin_mod.ResourceType.TOPIC, "ro-orders", admin_mod.ResourcePatternType.ANY,
        "User:alice", None, admin_mod.AclOperation.ANY, admin_mod.AclPermissionType.ANY)])
    assert [b for f in deleted.values() for b in f.result(30)] == [read_acl]
    time.sleep(1)
    assert consume(alice, "ro-orders", 1, timeout_s=5) == []


def test_garbage_sasl_frames_close_only_their_connection(sasl_ssl):
    """Over plaintext TCP to the TLS port the handshake fails; so this uses a SASL_PLAINTEXT
    cluster's port when there is one (below); here: a TLS socket."""
    import ssl
    c = sasl_ssl
    host, port = c.kafka.split(",")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=c.ca)
    for garbage in (b"\xff" * 64, b"n,,n=admin", struct.pack(">i", 2**30)):
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(encode_request(17, 1, 1, {"mechanism": "SCRAM-SHA-512"}))
            s.recv(4096)  # the handshake's answer
            s.sendall(encode_request(36, 2, 2, {"auth_bytes": garbage}))
            answer = b""
            try:
                while chunk := s.recv(4096):
                    answer += chunk
            except (ConnectionResetError, TimeoutError, ssl.SSLError):
                pass
            (_size, correlation_id, _tags, code) = struct.unpack(">iibh", answer[:11])
            assert correlation_id == 2 and code == 58  # SASL_AUTHENTICATION_FAILED, then closed
    # The cluster still serves a good client.
    create_topics(c, "after-garbage")
    assert produce(conf(c), "after-garbage", [b"ok"]) == []


@pytest.fixture(scope="module")
def sasl_plaintext(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sasl-plain"), 1,
                      up_flags=("--sasl-mechanisms", "PLAIN"))
    m = _manifest(c)
    c.kafka, c.sasl, c.ca = m["kafka_bootstrap"], m["sasl"], None
    yield c
    stop_cluster(c)


def test_confluent_kafka_and_kcat_over_sasl_plaintext_plain(sasl_plaintext):
    c = sasl_plaintext
    assert c.sasl["mechanism"] == "PLAIN"
    plain = conf(c, mechanism="PLAIN")
    create_topics(c, "plain-orders")
    assert produce(plain, "plain-orders", [b"p1", b"p2"]) == []
    assert consume(plain, "plain-orders", 2) == [b"p1", b"p2"]
    if KCAT is not None:
        read = subprocess.run([KCAT, *kcat_flags(c, mechanism="PLAIN"), "-C", "-t",
                               "plain-orders", "-o", "beginning", "-e", "-q"],
                              capture_output=True, check=True, timeout=60)
        assert read.stdout.decode().splitlines() == ["p1", "p2"]
        wrong = subprocess.run([KCAT, *kcat_flags(c, password="nope", mechanism="PLAIN"),
                                "-L", "-m", "5"], capture_output=True, timeout=60)
        assert wrong.returncode != 0
    # No SASL at all: only ApiVersions and the SASL APIs are served, so nothing is listed.
    errors = []
    anonymous = admin_mod.AdminClient({"bootstrap.servers": c.kafka,
                                       "error_cb": lambda e: errors.append(e)})
    with pytest.raises(confluent_kafka.KafkaException):
        anonymous.list_topics(timeout=5)


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Did the broker close ``s`` (EOF or reset) within ``seconds``?"""
    s.settimeout(seconds)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_large_frame_before_authentication_is_refused_unread(sasl_plaintext):
    """sasl.server.max.receive.size (Kafka's 512 KiB): a client that has not authenticated
    cannot make the broker read, buffer or decode a large request; its connection is
    closed at the size prefix. Below the limit the broker waits for the body as usual,
    and once authenticated a client sends requests up to socket.request.max.bytes."""
    c = sasl_plaintext
    host, port = c.kafka.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 600_000))  # the size prefix alone
        assert _closed_within(s, 5)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 400_000))
        assert not _closed_within(s, 1)  # waiting for the rest of the frame
    # Authenticated, a request larger than the pre-authentication limit goes through.
    create_topics(c, "plain-large")
    value = b"v" * 700_000
    assert produce(conf(c, mechanism="PLAIN"), "plain-large", [value]) == []
    assert consume(conf(c, mechanism="PLAIN"), "plain-large", 1) == [value]


# ---------------------------------------------------------------------- gRPC clients and tide


def test_tide_users_and_acls_and_grpc_clients_with_sasl_credentials(sasl_ssl, tmp_path):
    from cluster_fixtures import run_tide

    from tidewater.client.consumer import Consumer
    from tidewater.client.producer import Producer
    from tidewater.proto.errors import ClusterAuthorizationFailedError, TidewaterError
    c = sasl_ssl

    def tide(*args, config=c.sasl["command_config"], **kwargs):
        return run_tide(*args, "--command-config", config, bootstrap=c.bootstrap, **kwargs)

    for topic in ("g-orders", "g-secret"):
        assert tide("topics", "create", topic, "--partitions", "1").returncode == 0
    assert tide("users", "create", "carol", "--password", "carol-pw").returncode == 0
    listed = tide("users", "list", "--json")
    users = json.loads(listed.stdout)
    assert {m["mechanism"] for m in users["carol"]} == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert "carol-pw" not in listed.stdout
    added = tide("acls", "add", "--allow-principal", "User:carol", "--operation", "read",
                 "--topic", "g-orders")
    assert added.returncode == 0, added.stderr
    assert "allow User:carol from * read on topic literal 'g-orders'" in tide(
        "acls", "list", "--topic", "g-orders").stdout
    assert tide("produce", "g-orders", input="one\ntwo\n").returncode == 0
    carol = {"security_protocol": "SASL_SSL", "ssl_cafile": c.ca,
             "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "carol",
             "sasl_plain_password": "carol-pw"}
    time.sleep(1)
    with Consumer(c.bootstrap, auto_offset_reset="earliest", **carol) as consumer:
        consumer.assign([("g-orders", 0)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(values) < 2 and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(1000)]
    assert values == [b"one", b"two"]
    # Idempotent (the default with acks=all): no producer id without WRITE somewhere
    # (KIP-679); without idempotence the produce itself is refused.
    with Producer(c.bootstrap, acks="all", **carol) as producer, \
            pytest.raises(ClusterAuthorizationFailedError, match="IDEMPOTENT_WRITE"):
        producer.send("g-orders", b"refused").result(20)
    with Producer(c.bootstrap, acks="all", enable_idempotence=False, **carol) as producer, \
            pytest.raises(TidewaterError, match="TOPIC_AUTHORIZATION_FAILED|needs WRITE"):
        producer.send("g-orders", b"refused").result(20)
    # The CLI as carol: topics she may not describe are not hers to see or delete.
    config = tmp_path / "carol.properties"
    config.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                      f"sasl.username=carol\nsasl.password=carol-pw\nssl.ca.location={c.ca}\n")
    listed = tide("topics", "list", config=str(config))
    assert listed.returncode == 0 and listed.stdout.split() == ["g-orders"], listed
    refused = tide("topics", "delete", "g-secret", config=str(config))
    assert refused.returncode != 0 and "TOPIC_AUTHORIZATION_FAILED" in refused.stderr
    refused = tide("acls", "add", "--allow-principal", "User:carol", "--operation", "all",
                   "--topic", "g-secret", config=str(config))
    assert refused.returncode != 0 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    # A wrong password: refused at once, not retried as a network error.
    config.write_text(config.read_text().replace("carol-pw", "wrong"))
    wrong = tide("consume", "g-orders", "--from-beginning", "--timeout-ms", "3000",
                 config=str(config))
    assert wrong.returncode != 0 and "SASL_AUTHENTICATION_FAILED" in wrong.stderr
    # The admin removes carol's ACL and then carol herself.
    removed = tide("acls", "remove", "--allow-principal", "User:carol", "--topic", "g-orders")
    assert "removed: allow User:carol" in removed.stdout
    assert tide("users", "delete", "carol").returncode == 0
    assert "carol" not in json.loads(tide("users", "list", "--json").stdout)


# ---------------------------------------------------------------------- SSL client certificates


@pytest.fixture(scope="module")
def ssl_acl(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("ssl-acl"), 1, tls=True,
                      up_flags=("--authorizer", "acl"))
    m = _manifest(c)
    c.kafka, c.sasl, c.tls = m["kafka_bootstrap"], m["sasl"], m["tls"]
    yield c
    stop_cluster(c)


def test_ssl_client_certificate_names_the_principal(ssl_acl):
    """No SASL: a Kafka client's certificate (CN=tide-client) is its principal, and the
    ACLs apply to it; without a certificate a client is User:ANONYMOUS."""
    from cluster_fixtures import run_tide
    c = ssl_acl
    tide = ["--command-config", c.sasl["command_config"]]  # the admin, over gRPC
    assert run_tide(*tide, "topics", "create", "cert-topic", "--partitions", "1",
                    bootstrap=c.bootstrap).returncode == 0
    added = run_tide(*tide, "acls", "add", "--allow-principal", "User:tide-client",
                     "--operation", "write", "--operation", "read", "--topic", "cert-topic",
                     bootstrap=c.bootstrap)
    assert added.returncode == 0, added.stderr
    time.sleep(1)
    ssl = {"bootstrap.servers": c.kafka, "security.protocol": "SSL",
           "ssl.ca.location": c.tls["ca"]}
    with_cert = {**ssl, "ssl.certificate.location": c.tls["cert"],
                 "ssl.key.location": c.tls["key"]}
    assert produce(with_cert, "cert-topic", [b"by-certificate"]) == []
    assert consume(with_cert, "cert-topic", 1) == [b"by-certificate"]
    # User:ANONYMOUS may not even describe the topic: it never learns of it.
    errors = produce(ssl, "cert-topic", [b"anonymous"], timeout_ms=3000)
    assert len(errors) == 1 and errors[0].code() in (
        confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
        confluent_kafka.KafkaError._MSG_TIMED_OUT, confluent_kafka.KafkaError._UNKNOWN_TOPIC,
        confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert consume(with_cert, "cert-topic", 2, timeout_s=5) == [b"by-certificate"]


def user_reading(c, user: str, password: bytes, topic: str):
    """A SCRAM user allowed READ on ``topic`` alone (records in it already); returns the
    admin client and ``allow_read_on_group(group)``, which grants READ on a group."""
    create_topics(c, topic)
    assert produce(conf(c), topic, [b"x", b"y"]) == []
    admin = admin_mod.AdminClient(conf(c))
    upsert = admin_mod.UserScramCredentialUpsertion(
        user, admin_mod.ScramCredentialInfo(admin_mod.ScramMechanism.SCRAM_SHA_512, 8192),
        password)
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)

    def allow_read(resource_type, name):
        binding = admin_mod.AclBinding(resource_type, name,
                                       admin_mod.ResourcePatternType.LITERAL, f"User:{user}",
                                       "*", admin_mod.AclOperation.READ,
                                       admin_mod.AclPermissionType.ALLOW)
        for future in admin.create_acls([binding]).values():
            future.result(30)
        time.sleep(1)  # UpdateMetadata reaches the broker
    allow_read(admin_mod.ResourceType.TOPIC, topic)
    return lambda group: allow_read(admin_mod.ResourceType.GROUP, group)


def test_a_group_needs_read_on_the_group_as_well_as_the_topic(sasl_ssl):
    """Issue 16 with issue 18: the group APIs ask the authorizer (GROUP READ/DESCRIBE)."""
    c = sasl_ssl
    allow_group = user_reading(c, "gina", b"gina-pw", "gr-orders")
    gina = conf(c, "gina", "gina-pw", **{"group.id": "gina-group",
                                        "auto.offset.reset": "earliest"})

    def subscribe_and_poll(seconds: float):
        consumer = confluent_kafka.Consumer(gina)
        consumer.subscribe(["gr-orders"])
        values, errors = [], []
        deadline = time.monotonic() + seconds
        while len(values) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                errors.append(m.error().code())
                break
            values.append(m.value())
        if values:
            consumer.commit(asynchronous=False)
        consumer.close()
        return values, errors
    values, errors = subscribe_and_poll(20)
    assert values == [] and errors == [confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED]
    allow_group("gina-group")
    values, errors = subscribe_and_poll(30)
    assert values == [b"x", b"y"] and errors == []


def test_grpc_group_calls_are_authorized_too(sasl_ssl):
    """The gRPC group RPCs ask the same ACLs: the Tidewater Consumer in a group."""
    from tidewater.client.consumer import Consumer
    from tidewater.proto.errors import TidewaterError
    c = sasl_ssl
    allow_group = user_reading(c, "gus", b"gus-pw", "gg-orders")
    gus = {"security_protocol": "SASL_SSL", "ssl_cafile": c.ca,
           "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "gus",
           "sasl_plain_password": "gus-pw", "group_id": "gus-group",
           "auto_offset_reset": "earliest", "session_timeout_ms": 6000,
           "enable_auto_commit": False}
    with Consumer(c.bootstrap, **gus) as consumer:
        consumer.subscribe(["gg-orders"])
        with pytest.raises(TidewaterError) as refused:
            consumer.poll(5000)
        assert refused.value.error_code == 30  # GROUP_AUTHORIZATION_FAILED
    allow_group("gus-group")
    with Consumer(c.bootstrap, **gus) as consumer:
        consumer.subscribe(["gg-orders"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(500)]
        consumer.commit()
        assert got == [b"x", b"y"]


@pytest.fixture(scope="module")
def sasl_reauth(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sasl-reauth"), 1, "connections.max.reauth.ms=1500",
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512"))
    m = _manifest(c)
    c.kafka, c.sasl = m["kafka_bootstrap"], m["sasl"]
    yield c
    stop_cluster(c)


def test_confluent_kafka_reauthenticates_its_connections(sasl_reauth):
    """KIP-368: with connections.max.reauth.ms=1500 librdkafka re-authenticates its
    connections as they near the lifetime the broker answered, and 6 s of acks=all
    produce go on without an error or a closed connection (a client that does not
    re-authenticate is closed: tests/unit/test_kafka_sasl.py)."""
    c = sasl_reauth
    create_topics(c, "reauth")
    errors: list = []
    producer = confluent_kafka.Producer({**conf(c), "acks": "all"})
    sent = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        producer.produce("reauth", value=b"%d" % sent,
                         on_delivery=lambda err, _m: err and errors.append(err))
        sent += 1
        producer.poll(0.02)
    assert producer.flush(30) == 0 and errors == []
    assert consume(conf(c), "reauth", sent) == [b"%d" % i for i in range(sent)]
    log = Path(_manifest(c)["processes"]["broker-1"]["log"]).read_text()
    assert log.count("re-authenticated as User:admin") >= 3  # every ~1.5 s, per connection
    assert "session expired" not in log  # no connection had to be closed


def test_auto_creation_needs_create_on_the_cluster_or_the_topic(sasl_ssl):
    """Kafka's rule: a principal that may DESCRIBE (and WRITE) a new topic but not CREATE
    it gets TOPIC_AUTHORIZATION_FAILED and nothing is created; CREATE on the topic lets
    its first produce create it."""
    c = sasl_ssl
    admin = admin_mod.AdminClient(conf(c))
    upsert = admin_mod.UserScramCredentialUpsertion(
        "bob", admin_mod.ScramCredentialInfo(admin_mod.ScramMechanism.SCRAM_SHA_512, 8192),
        b"bob-pw")
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)
    grants = [(topic, operation) for topic in ("bob-denied", "bob-made")
              for operation in (admin_mod.AclOperation.DESCRIBE, admin_mod.AclOperation.WRITE)]
    grants.append(("bob-made", admin_mod.AclOperation.CREATE))
    acls = [admin_mod.AclBinding(admin_mod.ResourceType.TOPIC, topic,
                                 admin_mod.ResourcePatternType.LITERAL, "User:bob", "*",
                                 operation, admin_mod.AclPermissionType.ALLOW)
            for topic, operation in grants]
    for future in admin.create_acls(acls).values():
        future.result(30)
    time.sleep(1)  # UpdateMetadata reaches the broker
    bob = conf(c, "bob", "bob-pw")
    errors = produce(bob, "bob-denied", [b"no"], timeout_ms=5000)
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert produce(bob, "bob-made", [b"yes"]) == []
    assert consume(conf(c), "bob-made", 1) == [b"yes"]
    assert "bob-denied" not in admin.list_topics(timeout=10).topics
