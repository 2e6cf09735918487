"""Issue 29 items 5 and 11 against a real broker (SASL_PLAINTEXT, PLAIN and SCRAM-SHA-512).

- A burst of wrong PLAIN guesses (each a PBKDF2 check of ~4 ms per credential, which
  ran on the event loop) no longer holds up another client: an authenticated client's
  request sent after the burst is answered before most of the guesses are (it used to
  come after all of them), and each refusal comes at least
  ``connection.failed.authentication.delay.ms`` (Kafka's 100) after its guess (KIP-306).
- An unknown user's SCRAM server-first looks like a known user's (the same iteration
  count as the cluster's users, a 32-byte salt that is stable per name); it used to say
  ``i=4096`` where tide's users have 8192.
"""

from __future__ import annotations

import base64
import re
import selectors
import socket
import struct
import time

import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.broker.kafka.codec import decode_response, encode_request
from tidewater.tools.cluster_sasl import read_password
from tidewater.tools.scrape import ScrapeCredentials, fetch_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

API_VERSIONS, HANDSHAKE, AUTHENTICATE = 18, 17, 36
GUESSES = 48


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sasl-guessing"), 1,
                      up_flags=("--sasl-mechanisms", "PLAIN,SCRAM-SHA-512"))
    yield c
    stop_cluster(c)


def _read_frame(s: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data
    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def _call(s: socket.socket, api_key: int, version: int, values: dict, correlation_id=1):
    s.sendall(encode_request(api_key, version, correlation_id, values))
    return decode_response(api_key, version, _read_frame(s))[1]


def _connect(c) -> socket.socket:
    host, port = c.manifest()["kafka_bootstrap"].split(",")[0].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=60)


def _plain(user: str, password: str) -> dict:
    return {"auth_bytes": b"\0" + user.encode() + b"\0" + password.encode()}


def test_wrong_plain_guesses_are_delayed_and_do_not_stall_other_clients(cluster):
    c = cluster
    admin_password = read_password(c.manifest()["sasl"]["command_config"]) or ""
    legit = _connect(c)
    assert _call(legit, HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
    assert _call(legit, AUTHENTICATE, 0, _plain("admin", admin_password)).error_code == 0

    guessers = []
    for _ in range(GUESSES):
        s = _connect(c)
        assert _call(s, HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        guessers.append(s)
    # Every guess a different password: no cached verdict helps the broker.
    frames = [encode_request(AUTHENTICATE, 0, 2, _plain("admin", f"guess-{i}"))
              for i in range(GUESSES)]
    sent_at = {}
    for s, frame in zip(guessers, frames, strict=True):
        s.sendall(frame)
        sent_at[s] = time.monotonic()
    legit.sendall(encode_request(API_VERSIONS, 0, 3, {}))

    selector = selectors.DefaultSelector()
    for s in [*guessers, legit]:
        s.setblocking(True)
        selector.register(s, selectors.EVENT_READ)
    order: list[str] = []
    delays: list[float] = []
    deadline = time.monotonic() + 90
    while len(order) < GUESSES + 1 and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            frame = _read_frame(s)
            selector.unregister(s)
            if s is legit:
                assert decode_response(API_VERSIONS, 0, frame)[1].error_code == 0
                order.append("legit")
            else:
                delays.append(time.monotonic() - sent_at[s])
                assert decode_response(AUTHENTICATE, 0, frame)[1].error_code == 58
                order.append("guess")
    assert len(order) == GUESSES + 1, "not every request was answered"
    # Progress, not a time limit: the other client is not queued behind the guesses.
    assert order.index("legit") < GUESSES // 2, order
    # KIP-306: no refusal comes sooner than the delay (a lower bound: load only adds).
    assert min(delays) >= 0.1
    for s in guessers:  # refused connections are closed after their answer
        s.settimeout(30)
        assert s.recv(1) == b""
        s.close()
    legit.close()

    metrics_port = c.manifest()["processes"]["broker-1"]["metrics_port"]
    # In secure mode /metrics wants a cluster user's password (test_metrics_auth.py).
    manifest = c.manifest()
    admin = ScrapeCredentials(username=manifest["sasl"]["username"],
                              password=read_password(manifest["sasl"]["command_config"]))
    text = fetch_metrics(f"http://127.0.0.1:{metrics_port}/metrics", 10, None, admin)
    found = re.search(r"tidewater_broker_kafka_failed_authentications_total ([0-9.]+)", text)
    assert found and float(found.group(1)) >= GUESSES


def _server_first(c, user: str) -> dict[str, str]:
    s = _connect(c)
    try:
        assert _call(s, HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == 0
        answer = _call(s, AUTHENTICATE, 0, {"auth_bytes": f"n,,n={user},r=abcdef".encode()})
        assert answer.error_code == 0
        return dict(part.split("=", 1) for part in answer.auth_bytes.decode().split(","))
    finally:
        s.close()


def test_an_unknown_user_looks_like_a_known_one_in_scram(cluster):
    known = _server_first(cluster, "admin")
    unknown = _server_first(cluster, "nobody-here")
    assert unknown["i"] == known["i"]  # tide's users have 8192, not RFC 7677's 4096
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(known["s"]))
    assert _server_first(cluster, "nobody-here")["s"] == unknown["s"]  # stable per name
    assert _server_first(cluster, "someone-else")["s"] != unknown["s"]
