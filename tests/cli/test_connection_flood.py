"""Issue 29 "done when", scaled to the test budget: connections that send nothing, or
announce a 100 MiB frame and send a byte of it a second, leave a broker serving a
producer and its session with the controller intact (``bench/connection_flood.py``
runs the 1,000-connection case and prints a table).

150 silent and 150 trickling connections stay open (the broker's default
connections.max.idle.ms is 10 minutes) while a producer sends 500 acks=all records:
every one is acknowledged, the broker keeps its broker epoch and is not fenced, and
each trickling connection's 100 MiB frame was not allocated (the broker's resident
memory grows by far less than one such frame per connection).
"""

from __future__ import annotations

import sys
import time

import pytest
from cluster_fixtures import PROJECT_DIR, start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
pytest.importorskip("confluent_kafka")
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench.connection_flood import (  # noqa: E402
    TRICKLE_FRAME_BYTES,
    TRICKLE_INTERVAL_S,
    Flood,
    broker_session,
    produce_rate,
    resident_mib,
)

CONNECTIONS = 150


def test_idle_and_trickling_connections_leave_the_broker_serving(tmp_path):
    c = start_cluster(tmp_path / "cluster", 1)
    floods: list[Flood] = []
    try:
        manifest = c.manifest()
        broker = manifest["processes"]["broker-1"]
        host, port = broker["kafka"].rsplit(":", 1)
        produce_rate(manifest["kafka_bootstrap"], "flood", 50)
        epoch, fenced = broker_session(manifest["controller"], 1)
        assert not fenced
        before_mib = resident_mib(broker["pid"])
        floods.append(Flood(host, int(port), CONNECTIONS, trickle=False))
        floods.append(Flood(host, int(port), CONNECTIONS, trickle=True))
        time.sleep(3 * TRICKLE_INTERVAL_S)  # a few trickled bytes have arrived

        produce_rate(manifest["kafka_bootstrap"], "flood", 500)  # raises unless all acked

        assert broker_session(manifest["controller"], 1) == (epoch, False)
        assert all(f.closed_by_broker() == 0 for f in floods)  # held, not refused
        grown_mib = resident_mib(broker["pid"]) - before_mib
        assert grown_mib < CONNECTIONS * TRICKLE_FRAME_BYTES / 2**20 / 100, grown_mib
    finally:
        for f in floods:
            f.close()
        stop_cluster(c)
