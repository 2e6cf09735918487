"""Issue 26 item 5: a second broker process started with a live broker's ID is refused
(DUPLICATE_BROKER_REGISTRATION), exits non-zero naming the ID, and fences no one: the
real broker keeps its epoch and serves produce and fetch throughout. In every security
mode: plaintext, and SASL/SCRAM over TLS (the impostor holds the real broker's
certificate and credentials, as an operator's second process with one ID would)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cluster_fixtures import PROJECT_DIR, start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", params=["plaintext", "sasl-ssl"])
def cluster(request, tmp_path_factory):
    secured = request.param == "sasl-ssl"
    c = start_cluster(tmp_path_factory.mktemp(f"dup-id-{request.param}"), 2, tls=secured,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512") if secured else ())
    manifest = json.loads((Path(c.data_dir) / "cluster.json").read_text())
    c.admin_flags = (["--command-config", manifest["sasl"]["command_config"]] if secured
                     else [])
    yield c
    stop_cluster(c)


def tide(c, *args: str, **kwargs):
    """``tide ARGS`` as the cluster's admin (its command config on a secured cluster)."""
    return c.tide(*args, *c.admin_flags, **kwargs)


def brokers(c) -> dict[int, dict]:
    result = tide(c, "cluster", "describe", "--json")
    assert result.returncode == 0, result.stderr
    return {b["id"]: b for b in json.loads(result.stdout)["brokers"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def impostor_command(c, broker_id: int, data_dir) -> list[str]:
    """broker-<id>'s own command line, on free ports and another data dir."""
    command = list(c.manifest()["processes"][f"broker-{broker_id}"]["command"])
    for flag in ("--listen", "--external-listen", "--kafka-listen"):
        # Real ports: the registration advertises them.
        command[command.index(flag) + 1] = f"127.0.0.1:{free_port()}"
    command[command.index("--metrics-port") + 1] = "0"
    command[command.index("--data-dir") + 1] = str(data_dir)
    return command


def produce_and_read(c, topic: str, values: list[str], expected: list[str]) -> None:
    """Produce ``values`` with acks=all, then read the topic: exactly ``expected``."""
    produced = tide(c, "produce", topic, "--acks", "all",
                    input="".join(f"{v}\n" for v in values))
    assert produced.returncode == 0, produced.stderr
    consumed = tide(c, "consume", topic, "--from-beginning", "--timeout-ms", "3000")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.splitlines()) == sorted(expected)


def test_a_second_process_with_a_live_brokers_id_exits_and_fences_no_one(cluster, tmp_path):
    created = tide(cluster, "topics", "create", "dup", "--partitions", "2",
                   "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    produce_and_read(cluster, "dup", ["before"], ["before"])
    before = brokers(cluster)
    assert not before[1]["fenced"]

    started = time.monotonic()
    impostor = subprocess.run(impostor_command(cluster, 1, tmp_path / "impostor"),
                              capture_output=True, text=True, timeout=90, cwd=PROJECT_DIR)
    assert impostor.returncode == 70, impostor.stderr[-3000:]  # the broker's fatal-error code
    assert "DUPLICATE_BROKER_REGISTRATION" in impostor.stderr
    assert "broker 1 is already registered" in impostor.stderr
    # It retried for two session timeouts (3 s each by default), then gave up.
    assert time.monotonic() - started < 60

    after = brokers(cluster)
    assert after[1]["epoch"] == before[1]["epoch"] and not after[1]["fenced"]
    assert after[1]["addresses"] == before[1]["addresses"]
    produce_and_read(cluster, "dup", ["after"], ["before", "after"])
    controller_log = (cluster.data_dir / "controller.log").read_text()
    assert "broker 1 fenced" not in controller_log
