"""Issue 29: an open gRPC stream ends with its SCRAM session, as Kafka closes a connection
whose session expired without re-authentication (connections.max.reauth.ms, KIP-368),
against `tide cluster up --sasl-mechanisms SCRAM-SHA-512` (2 brokers, sessions of 3 s).

- a FetchStream opened with a session token that is never renewed is ended
  UNAUTHENTICATED at the token's expiry (before: it stayed open for ever);
- one whose session is re-authenticated (a SCRAM exchange naming the token) lives past
  the first expiry, on the same token;
- a Producer and a Consumer running over three lifetimes keep working, and the
  brokers' own streams (ReplicaFetch, heartbeats to the controller) too: the clients
  renew an open stream's session in time;
- with that renewal switched off in the test's clients, their streams are ended at
  each expiry and reopened without an error reaching the application.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

from tidewater.broker.security.stream_expiry import SESSION_ENDED
from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer
from tidewater.client.sasl_session import ScramLogin, sync_caller
from tidewater.client.security import AioScramAuth
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MECHANISM = "SCRAM-SHA-512"
REAUTH_MS = 3000
CUT_LOG = "ending a stream of"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("stream-expiry"), 2, "min.insync.replicas=2",
                      f"connections.max.reauth.ms={REAUTH_MS}",
                      up_flags=("--sasl-mechanisms", MECHANISM))
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.manifest_ = manifest  # type: ignore[attr-defined]
    c.config = manifest["sasl"]["command_config"]  # type: ignore[attr-defined]
    c.password = read_password(c.config)  # type: ignore[attr-defined]
    created = run_tide("topics", "create", "expiry", "--partitions", "1",
                       "--replication-factor", "2", "--command-config", c.config,
                       bootstrap=c.bootstrap)
    assert created.returncode == 0, created.stderr
    yield c
    stop_cluster(c)


def _logs(c) -> dict[str, str]:
    return {name: Path(p["log"]).read_text() for name, p in c.manifest_["processes"].items()}


class _Fetches:
    """A FetchStream's request iterator: sends when told, ends when closed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[pb.FetchRequest] = []
        self._closed = False

    def send(self) -> None:
        with self._cond:
            self._queue.append(pb.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
                pb.FetchPartition(topic="expiry", partition=0, current_leader_epoch=-1,
                                  fetch_offset=0)]))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def __iter__(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                request = self._queue.pop(0)
            yield request


def _open_stream(c, login: ScramLogin):
    target = c.bootstrap.split(",")[0]
    channel = grpc.insecure_channel(target)
    metadata = login.metadata_sync(sync_caller(channel))
    fetches = _Fetches()
    answers = pb_grpc.BrokerStub(channel).FetchStream(
        iter(fetches), metadata=metadata, timeout=REAUTH_MS / 1000 + 30)
    return channel, fetches, answers, metadata


def test_a_stream_is_ended_when_its_session_expires_unrenewed(cluster):
    login = ScramLogin(MECHANISM, "admin", cluster.password, window=lambda: 0.9)
    channel, fetches, answers, _ = _open_stream(cluster, login)
    try:
        fetches.send()
        assert next(answers).error_code == pb.NONE
        with pytest.raises(grpc.RpcError) as ended:
            next(answers)  # no renewal: ended at the session's expiry
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ended.value.details() == SESSION_ENDED
    finally:
        fetches.close()
        channel.close()


def test_a_renewed_session_keeps_its_stream_open(cluster):
    # Renewal due at 30 % of the lifetime: the exchange names the current token.
    login = ScramLogin(MECHANISM, "admin", cluster.password, window=lambda: 0.3)
    channel, fetches, answers, metadata = _open_stream(cluster, login)
    try:
        fetches.send()
        assert next(answers).error_code == pb.NONE
        opened = time.monotonic()
        time.sleep(0.4 * REAUTH_MS / 1000)
        renewed = login.metadata_sync(sync_caller(channel))
        assert login.exchanges == 2 and renewed == metadata  # the same token, kept
        # Past the first expiry, the stream still answers.
        time.sleep(max(0.0, opened + 1.3 * REAUTH_MS / 1000 - time.monotonic()))
        fetches.send()
        assert next(answers).error_code == pb.NONE
    finally:
        fetches.close()
        channel.close()


def _produce_and_consume(c, topic: str) -> None:
    """A Producer (acks=all) and a Consumer of a new ``topic`` over 3.5 session
    lifetimes: every record acknowledged without an error and read back, in order."""
    created = run_tide("topics", "create", topic, "--partitions", "1",
                       "--replication-factor", "2", "--command-config", c.config,
                       bootstrap=c.bootstrap)
    assert created.returncode == 0, created.stderr
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
                "sasl_plain_username": "admin", "sasl_plain_password": c.password}
    errors: list = []
    sent: list[bytes] = []
    got: list[bytes] = []
    with Producer(c.bootstrap, acks="all", **security) as producer, \
            Consumer(c.bootstrap, **security) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 3.5 * REAUTH_MS / 1000
        while time.monotonic() < deadline:
            value = b"%d" % len(sent)
            future = producer.send(topic, value=value)
            future.add_done_callback(lambda f: f.exception() and errors.append(f.exception()))
            sent.append(value)
            got.extend(r.value for r in consumer.poll(50))
        producer.flush()
        end = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < end:
            got.extend(r.value for r in consumer.poll(500))
    assert errors == []
    assert got == sent


def test_clients_and_brokers_keep_their_streams_across_expiries(cluster):
    """With the clients' renewal of open streams (``AioScramAuth.keep_renewed``): the
    Producer's and the Consumer's streams and the brokers' own (follower fetches for
    acks=all with min.insync.replicas=2, heartbeats) carry on over 3.5 lifetimes. (Whether
    a renewal came before its expiry depends on the machine's load, so no count of
    ended streams is asserted; the next test makes every stream end.)"""
    _produce_and_consume(cluster, "renewed")
    described = run_tide("cluster", "describe", "--json", "--command-config", cluster.config,
                         bootstrap=cluster.bootstrap)
    assert described.returncode == 0, described.stderr
    brokers = json.loads(described.stdout)["brokers"]
    assert sorted(b["id"] for b in brokers if not b["fenced"]) == [1, 2]


def test_clients_reopen_streams_ended_by_an_expiry(cluster, monkeypatch):
    """The clients' streams, not renewed (as a client that renews too late): each is
    ended at its session's expiry, and the Producer and the Consumer reopen it after a
    new exchange without an error reaching the application."""
    monkeypatch.setattr(AioScramAuth, "keep_renewed", lambda self, call, metadata: call)
    cuts_before = sum(log.count(CUT_LOG) for log in _logs(cluster).values())
    _produce_and_consume(cluster, "reopened")
    assert sum(log.count(CUT_LOG) for log in _logs(cluster).values()) > cuts_before
