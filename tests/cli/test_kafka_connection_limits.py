"""Issue 29 item 4, against a real broker: connection limits and the idle timeout.

One broker with ``max.connections.per.ip.overrides=127.0.0.2:5`` and
``connections.max.idle.ms=3000``. A hostile client on 127.0.0.2 (loopback takes any
127/8 source address) opens 8 connections: 3 are closed at once (the per-IP limit),
the other 5 are closed once idle, two of them while sending a frame a byte every
half second (an incomplete request does not count as activity). Meanwhile a producer
on 127.0.0.1 is served, and the broker's metrics count what it refused and closed.
Before this, every connection stayed open for ever.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import urllib.request

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
confluent_kafka = pytest.importorskip("confluent_kafka")

HOSTILE = "127.0.0.2"


def _is_closed(s: socket.socket) -> bool:
    """Has the broker closed ``s`` (EOF or reset)? Does not wait."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name + ("{" + labels + "}" if labels else "")) + r" ([0-9.e+]+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def test_limits_and_idle_expiry_hold_off_a_hostile_client(tmp_path):
    c = start_cluster(tmp_path / "cluster", 1, "connections.max.idle.ms=3000",
                      f"max.connections.per.ip.overrides={HOSTILE}:5")
    stop = threading.Event()
    sockets: list[socket.socket] = []
    try:
        manifest = c.manifest()
        broker = manifest["processes"]["broker-1"]
        host, port = broker["kafka"].rsplit(":", 1)
        for _ in range(8):
            s = socket.socket()
            s.bind((HOSTILE, 0))
            s.connect((host, int(port)))
            sockets.append(s)

        def trickle(s: socket.socket) -> None:
            try:
                s.sendall(struct.pack(">i", 1000))  # a frame of 1000 bytes, a byte at a time
                while not stop.wait(0.5):
                    s.sendall(b"x")
            except OSError:
                pass  # closed by the broker
        trickling = [threading.Thread(target=trickle, args=(s,), daemon=True)
                     for s in sockets[:2]]
        for t in trickling:
            t.start()

        producer = confluent_kafka.Producer({"bootstrap.servers": manifest["kafka_bootstrap"],
                                             "acks": "all", "message.timeout.ms": 30000})
        errors: list[object] = []
        for i in range(20):
            producer.produce("limits", value=f"v{i}".encode(),
                             on_delivery=lambda err, _m: err and errors.append(err))
        assert producer.flush(60) == 0 and errors == []

        # Every hostile connection ends: 3 at once, 5 after the idle timeout (the two
        # trickling ones included).
        wait_for(lambda: all(_is_closed(s) for s in sockets), "every hostile connection closed")
        metrics_url = f"http://127.0.0.1:{broker['metrics_port']}/metrics"
        text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        prefix = "tidewater_broker_"
        assert _metric(text, prefix + "kafka_connections_refused_total",
                       'limit="max.connections.per.ip"') == 3
        assert _metric(text, prefix + "kafka_connections_closed_idle_total") >= 5
        # The producer is still served (a new connection after its own went idle).
        producer.produce("limits", value=b"after")
        assert producer.flush(60) == 0
    finally:
        stop.set()
        for s in sockets:
            s.close()
        stop_cluster(c)
