"""ComposeCluster against a fake `docker` command: discovery and fault commands (no engine needed)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from tidewater.tools.chaos.targets import ChaosTargetError, ComposeCluster, controller_node

FAKE_DOCKER = r'''
import json, os, sys
state_path = os.environ["FAKE_DOCKER_STATE"]
state = json.load(open(state_path))
args = sys.argv[1:]
with open(state_path + ".log", "a") as log:
    log.write(" ".join(args) + "\n")
by_id = {c["Id"]: c for c in state["containers"]}
if args[0] == "ps":
    project = args[args.index("--filter") + 1].split("=", 2)[2]
    for c in state["containers"]:
        if c["Config"]["Labels"]["com.docker.compose.project"] == project:
            print(c["Id"] + "\t" + c["Config"]["Labels"]["com.docker.compose.service"])
elif args[0] == "inspect":
    print(json.dumps([by_id[i] for i in args[1:]]))
elif args[0] == "kill":
    by_id[args[-1]]["State"].update(Running=False)
elif args[0] == "start":
    by_id[args[-1]]["State"].update(Running=True, Health={"Status": "healthy"})
elif args[0] in ("pause", "unpause"):
    by_id[args[-1]]["State"]["Paused"] = args[0] == "pause"
elif args[:2] == ["network", "disconnect"]:
    by_id[args[-1]]["NetworkSettings"]["Networks"].pop(args[2])
elif args[:2] == ["network", "connect"]:
    by_id[args[-1]]["NetworkSettings"]["Networks"][args[-2]] = {}
else:
    print("fake docker: unsupported " + " ".join(args), file=sys.stderr)
    sys.exit(1)
json.dump(state, open(state_path, "w"))
'''


def container(service: str, index: int, project="p") -> dict:
    ports = {"9100/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(9200 + index)}]}
    command = ["python", "-m", "tidewater.controller"]
    if not service.startswith("controller"):
        ports["19092/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(9300 + index)}]
        ports["29092/tcp"] = [{"HostIp": "127.0.0.1", "HostPort": str(19300 + index)}]
        command = ["python", "-m", "tidewater.broker", f"--kafka-advertise={service}:9094"]
    return {"Id": f"id{index}", "Config": {"Labels": {"com.docker.compose.project": project,
                                                      "com.docker.compose.service": service},
                                           "Cmd": command},
            "State": {"Running": True, "Paused": False, "Health": {"Status": "healthy"}},
            "HostConfig": {"PortBindings": ports},
            "Mounts": [{"Type": "bind", "Source": f"/host/data/{service}", "Destination": "/data"}],
            "NetworkSettings": {"Networks": {"p_tidewater": {}}}}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    containers = [container(s, i) for i, s in enumerate(["controller", "broker-1", "broker-2", "broker-3"])]
    containers.append(container("broker-9", 9, project="someone-else"))
    state.write_text(json.dumps({"containers": containers}))
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))

    class Fake:
        path = str(docker)

        def log(self) -> list[str]:
            return Path(str(state) + ".log").read_text().splitlines()

    return Fake()


def test_discovery_from_labels_and_inspect(fake):
    c = ComposeCluster("p", docker=fake.path)
    assert c.node_names() == ["controller", "broker-1", "broker-2", "broker-3"]
    assert c.broker_ids() == [1, 2, 3]
    assert c.network == "p_tidewater"
    assert c.bootstrap() == "127.0.0.1:9301,127.0.0.1:9302,127.0.0.1:9303"  # 0.0.0.0 -> loopback
    assert c.kafka_bootstrap() == "127.0.0.1:19301,127.0.0.1:19302,127.0.0.1:19303"
    assert c.kafka_network_bootstrap() == "broker-1:9094,broker-2:9094,broker-3:9094"
    assert [(t.source, t.url) for t in c.metrics_targets()][:2] == [
        ("controller", "http://127.0.0.1:9200/metrics"), ("broker-1", "http://127.0.0.1:9201/metrics")]
    assert c.data_dirs()["broker-2"] == Path("/host/data/broker-2")


def test_a_quorum_projects_controllers_are_nodes_with_their_node_ids(tmp_path, monkeypatch):
    """docker-compose.yml's quorum: `controller` (node 1), controller-2, controller-3."""
    state = tmp_path / "state.json"
    services = ["controller-3", "controller", "broker-1", "controller-2", "broker-2", "broker-3"]
    state.write_text(json.dumps({"containers": [container(s, i) for i, s in enumerate(services)]}))
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    c = ComposeCluster("p", docker=str(docker))
    assert c.controller_names() == ["controller", "controller-2", "controller-3"]
    assert c.node_names() == ["controller", "controller-2", "controller-3", "broker-1",
                              "broker-2", "broker-3"]
    assert c.broker_ids() == [1, 2, 3]
    assert [t.source for t in c.metrics_targets()][:3] == c.controller_names()
    assert controller_node(c.controller_names(), 3) == "controller-3"
    assert controller_node(c.controller_names(), 1) == "controller"
    assert controller_node(c.controller_names(), 3000) is None  # a lone controller's id
    assert controller_node(["controller-1", "controller-2"], 1) == "controller-1"  # local


def test_faults_use_the_docker_commands_chaos_documents(fake):
    c = ComposeCluster("p", docker=fake.path)
    c.kill("broker-2")
    c.pause("broker-1")
    c.isolate("broker-3")
    assert not c.is_running("broker-2") and c.is_paused("broker-1") and c.is_isolated("broker-3")
    done = c.heal_everything()
    assert sorted(done) == ["heal broker-3", "start broker-2", "unpause broker-1"]
    assert all(c.is_running(n) for n in c.node_names()) and not c.is_isolated("broker-3")
    log = fake.log()
    assert "kill -s KILL id2" in log
    assert "network disconnect p_tidewater id3" in log
    assert "network connect --alias broker-3 p_tidewater id3" in log


def test_missing_project_and_failing_commands_are_typed_errors(fake):
    with pytest.raises(ChaosTargetError, match="has no controller and brokers"):
        ComposeCluster("nothing-here", docker=fake.path)
    c = ComposeCluster("p", docker=fake.path)
    with pytest.raises(ChaosTargetError, match="no service 'broker-7'"):
        c.kill("broker-7")
    with pytest.raises(ChaosTargetError, match="command not found"):
        ComposeCluster("p", docker="/nonexistent/docker")


@pytest.mark.timeout(60)
def test_tls_clients_find_the_hosts_folder_through_the_ca_file_mount(tmp_path, monkeypatch):
    """compose-tls.yml mounts only /tls/ca.pem and the container's own files: the client's
    files are found beside the CA certificate's source on the host; every /metrics is HTTPS."""
    containers = [container(s, i) for i, s in enumerate(["controller", "broker-1"])]
    for c in containers:
        name = c["Config"]["Labels"]["com.docker.compose.service"]
        c["Config"]["Env"] = ["TIDE_TLS_CA=/tls/ca.pem", f"TIDE_TLS_CERT=/tls/{name}.pem"]
        c["Mounts"] += [{"Type": "bind", "Source": f"/host/tls/{f}", "Destination": f"/tls/{f}"}
                        for f in ("ca.pem", f"{name}.pem", f"{name}.key")]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"containers": containers}))
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    c = ComposeCluster("p", docker=str(docker))
    assert c.client_security() == {"security_protocol": "SSL", "ssl_cafile": "/host/tls/ca.pem",
                                   "ssl_certfile": "/host/tls/client.pem",
                                   "ssl_keyfile": "/host/tls/client.key"}
    assert [t.url for t in c.metrics_targets()] == ["https://127.0.0.1:9200/metrics",
                                                    "https://127.0.0.1:9201/metrics"]
    for c_info in containers:
        c_info["Mounts"] = [m for m in c_info["Mounts"] if m["Destination"] != "/tls/ca.pem"]
    state.write_text(json.dumps({"containers": containers}))
    with pytest.raises(ChaosTargetError, match="mount no /tls/ca.pem"):
        ComposeCluster("p", docker=str(docker)).client_security()


@pytest.mark.timeout(60)
def test_a_sasl_cluster_is_reached_as_the_admin_the_controller_mounts(tmp_path, monkeypatch):
    """compose-sasl.yml: the controller mounts the admin's properties at
    /sasl/admin.properties; the chaos clients use that user over SASL_SSL (librdkafka's
    names for the transactional workload too)."""
    from tidewater.tools.chaos.txn_workload import kafka_config

    admin = tmp_path / "admin.properties"
    admin.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                     "sasl.username=admin\nsasl.password=s3cret\n")
    containers = [container(s, i) for i, s in enumerate(["controller", "broker-1"])]
    for c in containers:
        c["Config"]["Env"] = ["TIDE_TLS_CA=/tls/ca.pem"]
        c["Mounts"].append({"Type": "bind", "Source": "/host/tls/ca.pem",
                            "Destination": "/tls/ca.pem"})
    containers[0]["Mounts"].append({"Type": "bind", "Source": str(admin),
                                    "Destination": "/sasl/admin.properties"})
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"containers": containers}))
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    security = ComposeCluster("p", docker=str(docker)).client_security()
    assert security["security_protocol"] == "SASL_SSL"
    assert (security["sasl_mechanism"], security["sasl_plain_username"],
            security["sasl_plain_password"]) == ("SCRAM-SHA-512", "admin", "s3cret")
    assert security["ssl_cafile"] == "/host/tls/ca.pem"
    assert kafka_config(security) == {
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/host/tls/ca.pem",
        "ssl.certificate.location": "/host/tls/client.pem",
        "ssl.key.location": "/host/tls/client.key", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin", "sasl.password": "s3cret"}
    admin.write_text("security.protocol SASL_SSL\n")  # not key=value: a typed error
    with pytest.raises(ChaosTargetError, match="cannot read the SASL admin"):
        ComposeCluster("p", docker=str(docker)).client_security()
