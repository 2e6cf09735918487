"""Issue 29: ``sasl.mechanism.inter.broker.protocol``, as Kafka's setting. Brokers
authenticate to the controller and to each other with the configured mechanism; a
cluster comes up with SCRAM-SHA-512 between members (acks=all with
min.insync.replicas=2 needs the follower fetches), a broker showing a wrong password is
refused by the controller and never registers, and a mechanism the brokers do not
enable is a configuration error, as in Kafka.

Before: the setting was unknown (``cluster up --set`` failed) and the mechanism was
always picked from the enabled list."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

from tests.cli.test_replica_fetch_auth import _Admin
from tidewater.tools.local_cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MECHANISM_SETTING = "sasl.mechanism.inter.broker.protocol"


@pytest.fixture(scope="module")
def scram512(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("inter-broker-512"), 2, "min.insync.replicas=2",
                      f"{MECHANISM_SETTING}=SCRAM-SHA-512",
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512"))
    yield c
    stop_cluster(c)


def _extra_broker_command(c, broker_id: int, data_dir: Path, credentials: Path,
                          settings: dict[str, str]) -> list[str]:
    """broker-1's command line as a new broker: its own id, ports, data dir, credentials."""
    command = list(c.manifest()["processes"]["broker-1"]["command"])
    out, i = [], 0
    replace = {"--broker-id": str(broker_id), "--data-dir": str(data_dir),
               "--controller-sasl-config": str(credentials)}
    while i < len(command):
        arg = command[i]
        if arg in replace:
            out += [arg, replace[arg]]
            i += 2
        elif arg in ("--listen", "--external-listen", "--kafka-listen", "--advertise",
                     "--external-advertise", "--kafka-advertise"):
            out += [arg, f"127.0.0.1:{free_port()}"]
            i += 2
        elif arg == "--metrics-port":
            out += [arg, "0"]
            i += 2
        elif arg == "--set" and command[i + 1].split("=", 1)[0] in (
                "inter.broker.credentials.file", MECHANISM_SETTING):
            i += 2
        else:
            out.append(arg)
            i += 1
    out += ["--set", f"inter.broker.credentials.file={credentials}"]
    for name, value in settings.items():
        out += ["--set", f"{name}={value}"]
    return out


def _registered_brokers(tide) -> set[int]:
    described = tide("cluster", "describe", "--json")
    assert described.returncode == 0, described.stderr
    return {b["id"] for b in json.loads(described.stdout)["brokers"]}


def test_scram_sha_512_between_members_and_a_wrong_password_refused(scram512, tmp_path):
    c = scram512
    manifest = c.manifest()
    config = manifest["sasl"]["command_config"]

    def tide(*args, **kwargs):
        return run_tide(*args, "--command-config", config, bootstrap=c.bootstrap, **kwargs)

    for name in ("broker-1", "broker-2"):
        log = Path(manifest["processes"][name]["log"]).read_text()
        assert "authenticates with SCRAM-SHA-512" in log, name
    created = tide("topics", "create", "orders", "--partitions", "1", "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    wait_for(lambda: fully_replicated(_Admin(tide), "orders", replicas=2), "orders replicated")
    produced = tide("produce", "orders", "--acks", "all", input="a\nb\n")
    assert produced.returncode == 0, produced.stderr
    assert _registered_brokers(tide) == {1, 2}

    # A third broker with the brokers' user but a wrong password: the controller refuses
    # its SCRAM exchange; it never registers.
    wrong = tmp_path / "wrong.properties"
    wrong.write_text("sasl.username=broker\nsasl.password=guessed-wrong\n")
    log_path = tmp_path / "broker-3.log"
    command = _extra_broker_command(c, 3, tmp_path / "broker-3", wrong,
                                    {MECHANISM_SETTING: "SCRAM-SHA-512"})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: "authentication failed for user 'broker' (SCRAM-SHA-512)"
                 in log_path.read_text(),
                 "broker 3 refused", timeout_s=60)
        assert proc.poll() is None or proc.returncode != 0
        assert _registered_brokers(tide) == {1, 2}
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_mechanism_the_brokers_do_not_enable_is_a_config_error(scram512, tmp_path):
    credentials = Path(scram512.manifest()["processes"]["broker-1"]["command"][
        scram512.manifest()["processes"]["broker-1"]["command"].index(
            "--controller-sasl-config") + 1])
    command = _extra_broker_command(scram512, 4, tmp_path / "broker-4", credentials,
                                    {MECHANISM_SETTING: "PLAIN"})
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert MECHANISM_SETTING in done.stderr and "not an enabled mechanism" in done.stderr, \
        done.stderr[-2000:]
