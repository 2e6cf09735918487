"""SASL and ACLs on the Kafka listener, with raw frames over real TCP: the exchanges
(PLAIN, SCRAM v1 and raw v0 tokens), what is refused before authentication, forged
frames, and the authorizer on produce, fetch and metadata."""

from __future__ import annotations

import asyncio
import datetime
import struct

import pytest

from tests.unit.test_broker_fakes import make_batch
from tests.unit.test_broker_replica_manager import CLUSTER_ID, TOPIC_ID, TP
from tests.unit.test_kafka_listener import (
    API_VERSIONS_V3,
    Connection,
    Listening,
    fetch_values,
    produce_values,
)
from tidewater.broker.kafka import apis
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings
from tidewater.proto import acls as a
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.scram import ScramClient, make_credential

pytestmark = pytest.mark.timeout(60)

HANDSHAKE, AUTHENTICATE = 17, 36


class Users:
    """Stands in for the MetadataCache's users and ACLs (what UpdateMetadata carries)."""

    def __init__(self, acls=()):
        self.credentials = {(user, mech): make_credential(mech, password)
                            for user, password in (("alice", "alice-pw"), ("bob", "bob-pw"))
                            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
        self._acls = tuple(acls)

    def scram_credential(self, user, mechanism):
        return self.credentials.get((user, mechanism))

    def user_credentials(self, user):
        return [c for (u, _), c in self.credentials.items() if u == user]

    def acls(self):
        return self._acls

    def scram_iterations(self, mechanism):
        return [c.iterations for (_, m), c in self.credentials.items() if m == mechanism]


class SecureListening(Listening):
    def __init__(self, tmp_path, *, mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                 authorizer="none", acls=(), reauth_ms=0):
        super().__init__(tmp_path)
        settings = SecuritySettings(sasl_mechanisms=mechanisms, authorizer=authorizer,
                                    super_users=frozenset({"User:admin"}), reauth_ms=reauth_ms)
        self.security = BrokerSecurity(settings, Users(acls))

    async def prepare(self) -> None:
        await self.rm.update_metadata(pb.UpdateMetadataRequest(
            controller_id=3000, controller_epoch=1, cluster_id=CLUSTER_ID, brokers=[
                pb.BrokerRegistration(broker_id=1, broker_epoch=7, listeners=[
                    pb.Listener(name="KAFKA", host="127.0.0.1", port=1)])],
            partitions=[pb.PartitionState(topic=t, partition=0, leader=1, leader_epoch=0,
                                          replicas=[1], isr=[1],
                                          topic_id=TOPIC_ID if t == TP.topic else b"\1" * 16)
                        for t in (TP.topic, "secret")],
            topics=[pb.TopicConfig(name=TP.topic), pb.TopicConfig(name="secret")]))


async def authenticate_scram(c: Connection, user, password, mechanism="SCRAM-SHA-512"):
    """Returns the last SaslAuthenticate answer (error 0 on success)."""
    body = await c.call(HANDSHAKE, 1, {"mechanism": mechanism})
    assert body.error_code == 0 and mechanism in body.mechanisms
    client = ScramClient(mechanism, user, password)
    first = await c.call(AUTHENTICATE, 2, {"auth_bytes": client.first()})
    assert first.error_code == 0
    final = await c.call(AUTHENTICATE, 2, {"auth_bytes": client.final(first.auth_bytes)})
    if final.error_code == 0:
        client.check(final.auth_bytes)  # the server proved it knows the credential too
    return final


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_then_produce_and_fetch(tmp_path, mechanism):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        assert (await c.call(apis.API_VERSIONS, 3, API_VERSIONS_V3)).error_code == 0
        assert (await authenticate_scram(c, "alice", "alice-pw", mechanism)).error_code == 0
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(3)))
        assert body.responses[0].partition_responses[0].error_code == 0
        body = await c.call(apis.FETCH, 12, fetch_values(0))
        assert body.responses[0].partitions[0].error_code == 0
        c.close()


async def test_an_expired_session_serves_only_reauthentication(tmp_path, caplog):
    """KIP-368: the session lasts connections.max.reauth.ms; re-authenticating on the
    same connection (even after it expired) renews it; any other request after the end
    closes the connection."""
    async with SecureListening(tmp_path, reauth_ms=300) as listening:
        c = await listening.connect()
        final = await authenticate_scram(c, "alice", "alice-pw")
        assert final.error_code == 0 and final.session_lifetime == datetime.timedelta(milliseconds=300)
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0
        await asyncio.sleep(0.4)  # expired: re-authentication is still served
        final = await authenticate_scram(c, "alice", "alice-pw")
        assert final.error_code == 0 and final.session_lifetime == datetime.timedelta(milliseconds=300)
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0  # renewed
        await asyncio.sleep(0.4)
        await c.send(apis.PRODUCE, 9, 8, produce_values(make_batch(1)))
        assert await c.closed_by_server()
        assert "after the SASL session expired" in caplog.text


async def test_reauthentication_as_another_user_or_mechanism_closes(tmp_path):
    async with SecureListening(tmp_path, reauth_ms=60_000) as listening:
        c = await listening.connect()
        assert (await authenticate_scram(c, "alice", "alice-pw")).error_code == 0
        final = await authenticate_scram(c, "bob", "bob-pw")
        assert final.error_code == pb.SASL_AUTHENTICATION_FAILED
        assert await c.closed_by_server()
        c = await listening.connect()
        assert (await authenticate_scram(c, "alice", "alice-pw")).error_code == 0
        body = await c.call(HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        assert body.error_code == pb.UNSUPPORTED_SASL_MECHANISM
        assert await c.closed_by_server()


async def test_without_reauth_a_second_handshake_is_illegal(tmp_path):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        final = await authenticate_scram(c, "alice", "alice-pw")
        assert final.error_code == 0 and final.session_lifetime == datetime.timedelta(0)
        body = await c.call(HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        assert body.error_code == pb.ILLEGAL_SASL_STATE
        assert await c.closed_by_server()


async def test_wrong_password_is_refused_and_the_connection_closed(tmp_path):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        final = await authenticate_scram(c, "alice", "not-it")
        assert final.error_code == pb.SASL_AUTHENTICATION_FAILED
        assert "authentication failed" in final.error_message
        assert await c.closed_by_server()
        c = await listening.connect()  # an unknown user fails the same way, at the end
        assert (await authenticate_scram(c, "mallory", "x")).error_code == \
            pb.SASL_AUTHENTICATION_FAILED
        assert await c.closed_by_server()


async def test_plain_checks_the_password_against_the_scram_credential(tmp_path):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        assert (await c.call(HANDSHAKE, 1, {"mechanism": "PLAIN"})).error_code == 0
        body = await c.call(AUTHENTICATE, 0, {"auth_bytes": b"\0bob\0bob-pw"})
        assert body.error_code == 0
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0
        c.close()
        c = await listening.connect()
        await c.call(HANDSHAKE, 1, {"mechanism": "PLAIN"})
        body = await c.call(AUTHENTICATE, 0, {"auth_bytes": b"\0bob\0alice-pw"})
        assert body.error_code == pb.SASL_AUTHENTICATION_FAILED
        assert await c.closed_by_server()


async def test_nothing_but_api_versions_and_sasl_before_authentication(tmp_path):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        assert (await c.call(apis.API_VERSIONS, 3, API_VERSIONS_V3)).error_code == 0
        await c.send(apis.PRODUCE, 9, 1, produce_values(make_batch(1)))
        assert await c.closed_by_server()
        assert listening.rm.partitions[TP].log.log_end_offset == 0  # nothing appended


async def test_unsupported_mechanism_and_out_of_order_authenticate(tmp_path):
    async with SecureListening(tmp_path, mechanisms=("SCRAM-SHA-512",)) as listening:
        c = await listening.connect()
        body = await c.call(HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert body.error_code == pb.UNSUPPORTED_SASL_MECHANISM
        assert list(body.mechanisms) == ["SCRAM-SHA-512"]
        assert await c.closed_by_server()
        c = await listening.connect()
        body = await c.call(AUTHENTICATE, 2, {"auth_bytes": b"n,,n=alice,r=x"})
        assert body.error_code == pb.ILLEGAL_SASL_STATE
        assert await c.closed_by_server()


async def test_v0_handshake_then_raw_scram_tokens(tmp_path):
    async with SecureListening(tmp_path) as listening:
        c = await listening.connect()
        assert (await c.call(HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-256"})).error_code == 0
        client = ScramClient("SCRAM-SHA-256", "alice", "alice-pw")

        async def raw(token: bytes) -> bytes:
            c.writer.write(struct.pack(">i", len(token)) + token)
            size = struct.unpack(">i", await c.reader.readexactly(4))[0]
            return await c.reader.readexactly(size)
        client.check(await raw(client.final(await raw(client.first()))))
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0
        c.close()


@pytest.mark.parametrize("garbage", [
    b"\xff" * 40, b"n,,n=alice", b"", b"\0\0\0", b"y,,n=alice,r=abc", b"n,,n=a=XX,r=1"])
async def test_garbage_tokens_close_only_that_connection(tmp_path, garbage):
    async with SecureListening(tmp_path) as listening:
        bystander = await listening.connect()
        assert (await authenticate_scram(bystander, "bob", "bob-pw")).error_code == 0
        c = await listening.connect()
        await c.call(HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        body = await c.call(AUTHENTICATE, 2, {"auth_bytes": garbage})
        assert body.error_code == pb.SASL_AUTHENTICATION_FAILED
        assert await c.closed_by_server()
        # A raw v0 garbage token, too.
        c = await listening.connect()
        await c.call(HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-512"})
        c.writer.write(struct.pack(">i", len(garbage) + 1) + garbage + b"\xfe")
        assert await c.closed_by_server()
        body = await bystander.call(apis.PRODUCE, 9, produce_values(make_batch(2)))
        assert body.responses[0].partition_responses[0].error_code == 0
        bystander.close()


READ_ONLY = [a.Acl(a.TOPIC, TP.topic, a.LITERAL, "User:alice", "*", a.READ, a.ALLOW)]


async def test_read_acl_lets_alice_consume_but_not_produce(tmp_path):
    async with SecureListening(tmp_path, authorizer="acl", acls=READ_ONLY) as listening:
        admin = await listening.connect()
        assert (await authenticate_scram(admin, "alice", "alice-pw")).error_code == 0
        body = await admin.call(apis.PRODUCE, 9, produce_values(make_batch(2)))
        assert body.responses[0].partition_responses[0].error_code == \
            pb.TOPIC_AUTHORIZATION_FAILED
        assert listening.rm.partitions[TP].log.log_end_offset == 0
        body = await admin.call(apis.FETCH, 12, fetch_values(0))
        assert body.responses[0].partitions[0].error_code == 0
        meta = await admin.call(apis.METADATA, 12, {"topics": None,
                                                     "allow_auto_topic_creation": False,
                                                     "include_topic_authorized_operations": False})
        assert [t.name for t in meta.topics] == [TP.topic]  # not "secret"
        admin.close()
        bob = await listening.connect()
        assert (await authenticate_scram(bob, "bob", "bob-pw")).error_code == 0
        meta = await bob.call(apis.METADATA, 12, {"topics": None,
                                                   "allow_auto_topic_creation": False,
                                                   "include_topic_authorized_operations": False})
        assert meta.topics == ()  # he may describe nothing: sees nothing
        meta = await bob.call(apis.METADATA, 12, {
            "topics": [{"name": TP.topic, "topic_id": None}],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
        assert meta.topics[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
        assert meta.topics[0].partitions == ()
        body = await bob.call(apis.FETCH, 12, fetch_values(0))
        part = body.responses[0].partitions[0]
        assert part.error_code == pb.TOPIC_AUTHORIZATION_FAILED and not part.records
        bob.close()


async def test_a_listener_without_sasl_answers_sasl_requests_and_carries_on(tmp_path):
    async with Listening(tmp_path) as listening:  # no security at all (tests, tools)
        c = await listening.connect()
        body = await c.call(HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert body.error_code == pb.UNSUPPORTED_SASL_MECHANISM and body.mechanisms == ()
        c = await listening.connect()
        body = await c.call(AUTHENTICATE, 2, {"auth_bytes": b"\0a\0b"})
        assert body.error_code == pb.ILLEGAL_SASL_STATE
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0


async def test_security_on_but_no_sasl_serves_at_once_as_anonymous(tmp_path):
    async with SecureListening(tmp_path, mechanisms=(), authorizer="acl",
                               acls=[a.Acl(a.TOPIC, "*", a.LITERAL, "User:ANONYMOUS", "*",
                                           a.WRITE, a.ALLOW)]) as listening:
        c = await listening.connect()
        body = await c.call(apis.PRODUCE, 9, produce_values(make_batch(1)))
        assert body.responses[0].partition_responses[0].error_code == 0
        body = await c.call(apis.FETCH, 12, fetch_values(0))
        assert body.responses[0].partitions[0].error_code == pb.TOPIC_AUTHORIZATION_FAILED
        c.close()
