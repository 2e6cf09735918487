"""The group and transaction coordinators wait for their first use (issue 30, restart
time): importing the broker process loads none of their modules, the Kafka handlers of
their APIs import them at the first request, and the accessor builds them once."""

from __future__ import annotations

import json
import subprocess
import sys

from tidewater.broker.coordinators import Coordinators
from tidewater.broker.kafka import apis, group_apis, txn_apis
from tidewater.broker.kafka.coordinator_api_keys import (
    END_TXN,
    FIND_COORDINATOR,
    GROUP_VERSIONS,
    TXN_VERSIONS,
)

# What a broker must not import before it serves (broker/coordinators.py).
WAITING_MODULES = (
    "tidewater.broker.group.coordinator",
    "tidewater.broker.group.state",
    "tidewater.broker.group.grpc_service",
    "tidewater.broker.txn.coordinator",
    "tidewater.broker.txn.state",
    "tidewater.broker.txn.marker_sender",
    "tidewater.broker.txn.verifier",
    "tidewater.broker.txn.grpc_service",
    "tidewater.broker.coordination.partitioned",
    "tidewater.broker.kafka.group_apis",
    "tidewater.broker.kafka.txn_apis",
    # Not the coordinators', but as rarely asked for: WriteTxnMarkers v0's schemas.
    "tidewater.broker.kafka.schemas.write_txn_markers_v0_request",
    "tidewater.broker.kafka.schemas.write_txn_markers_v0_response",
    # crc32c's package __init__ and the importlib.metadata scan it runs (proto/crc.py).
    "crc32c",
    "importlib.metadata",
    # prometheus_client and the http.server stack its package imports: /metrics is
    # answered once the broker serves (broker/process.py _serve_metrics).
    "prometheus_client",
    "wsgiref.simple_server",
    "http.server",
    "tidewater.broker.security.metrics_http",
    # The log cleaner, made before its first pass (broker/replicas/background.py).
    "tidewater.broker.storage.cleaner",
    "tidewater.broker.storage.cleaner_plan",
    "tidewater.broker.storage.cleaner_rewrite",
)

# As broker/__main__.py imports the process (bench/machine_limits.BROKER_IMPORT_PRELUDE).
IMPORT_AS_THE_BROKER = """
import json, sys
import tidewater.broker.__main__ as main
main.import_kafka_types_without_hypothesis()
import tidewater.broker.process
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_broker_process_loads_no_coordinator_module() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_AS_THE_BROKER], check=True,
                          capture_output=True, text=True, timeout=120)
    loaded = set(json.loads(done.stdout))
    assert "tidewater.broker.process" in loaded
    assert "tidewater.broker.coordinators" in loaded
    assert sorted(loaded.intersection(WAITING_MODULES)) == []


def test_group_and_txn_handlers_delegate_to_their_modules(monkeypatch) -> None:
    called = []

    def fake(name):
        def handler(services, head, body):
            called.append((name, services, head, body))
            return "answer"
        return handler

    monkeypatch.setitem(group_apis.GROUP_HANDLERS, FIND_COORDINATOR, fake("find"))
    monkeypatch.setitem(txn_apis.TXN_HANDLERS, END_TXN, fake("end"))
    assert apis.HANDLERS[FIND_COORDINATOR]("s", "h", "b") == "answer"
    assert apis.HANDLERS[END_TXN]("s2", "h2", "b2") == "answer"
    assert called == [("find", "s", "h", "b"), ("end", "s2", "h2", "b2")]
    # Every key the handler modules answer is advertised, and the other way round.
    assert set(group_apis.GROUP_HANDLERS) == set(GROUP_VERSIONS)
    assert set(txn_apis.TXN_HANDLERS) == set(TXN_VERSIONS)
    assert {**GROUP_VERSIONS, **TXN_VERSIONS}.items() <= apis.SUPPORTED.items()


def test_coordinators_are_built_once_at_first_use() -> None:
    builds = []

    def build():
        builds.append(1)
        return "groups", "txns"

    coordinators = Coordinators(build)
    assert coordinators.built is None and builds == []
    assert coordinators.txn == "txns"
    assert coordinators.group == "groups"
    assert coordinators.ensure_built() == ("groups", "txns")
    assert coordinators.built == ("groups", "txns")
    assert builds == [1]
