"""Issue 29 item 9, the listening half: a broker's /metrics listens on 127.0.0.1 unless
``metrics.bind.address`` says otherwise. It used to listen on the INTERNAL listener's
host, so a broker listening on 0.0.0.0 (every Docker broker) published its metrics on
every address it had. 127.0.0.2 stands for "another address of this host": a socket
bound to 127.0.0.1 refuses connections to it, one bound to 0.0.0.0 takes them."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from tests.integration.conftest import FAST_BROKER_SETTINGS, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _scrape(host: str, port: int) -> str:
    return urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()


def _answers(host: str, port: int) -> bool:
    try:
        return "tidewater_broker_" in _scrape(host, port)
    except OSError:
        return False


def test_metrics_listen_on_loopback_unless_configured(cluster):
    c = cluster(0)
    ports = {broker_id: (free_port(), free_port()) for broker_id in (1, 2)}

    def start(broker_id: int, settings: dict[str, str]) -> None:
        grpc_port, metrics_port = ports[broker_id]
        c.add_broker(broker_id, {**FAST_BROKER_SETTINGS, **settings},
                     ["--listen", f"0.0.0.0:{grpc_port}", "--advertise", f"127.0.0.1:{grpc_port}",
                      "--metrics-port", str(metrics_port)])
    start(1, {})
    start(2, {"metrics.bind.address": "0.0.0.0"})
    c.wait_registered([1, 2])
    for broker_id in (1, 2):
        wait_for(lambda b=broker_id: _answers("127.0.0.1", ports[b][1]),
                 message=f"broker {broker_id}'s metrics")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", ports[1][1]), timeout=5).close()
    assert _answers("127.0.0.2", ports[2][1])  # configured: every address
