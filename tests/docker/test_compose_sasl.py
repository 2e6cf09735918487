"""Issue 29: the compose cluster as `make up TLS=1 SASL=1` runs it, and what each
container may see.

- ``docker-compose config`` (TLS, and TLS with SASL): every service mounts the CA
  certificate and its own certificate, key and properties only, file by file; no
  service mounts ca.key, another member's key, or a folder holding either;
- in the running containers: the same mounts (docker inspect), and no file anywhere in
  a container's filesystem holds the CA's or another process's private key or
  another user's password;
- the Kafka listeners are SASL_SSL: the admin produces and consumes, a client with the
  client certificate but no SASL user gets nowhere, and the console's user (DESCRIBE
  ACLs only) describes the cluster but is refused writes (TOPIC_AUTHORIZATION_FAILED);
  the web console reads the cluster as that user;
- `make chaos` against it: VERDICT PASS (nothing acknowledged lost) and the audit passes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient as KafkaAdminClient

from tidewater.tools.chaos.targets import ComposeCluster

pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_TLS_FILE = ROOT / "deploy" / "compose-tls.yml"
COMPOSE_SASL_FILE = ROOT / "deploy" / "compose-sasl.yml"

CONTROLLERS = ("controller", "controller-2", "controller-3")  # the quorum's three nodes
MEMBERS = (*CONTROLLERS, "broker-1", "broker-2", "broker-3")
SERVICES = (*MEMBERS, "console")
KEYS = ("ca", *MEMBERS, "client")
USERS = ("admin", "broker", "console")


def run(cmd, *, env=None, timeout_s=120, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n"
                    f"{r.stderr[-3000:]}")
    return r


def own_files(service: str, *, sasl: bool) -> dict[str, str]:
    """What ``service`` mounts from the TLS folder: container path -> file under it."""
    name = "client" if service == "console" else service
    files = {f"/tls/{f}": f for f in ("ca.pem", f"{name}.pem", f"{name}.key")}
    if sasl:
        users = (USERS if service in CONTROLLERS
                 else ("console",) if service == "console" else ("broker",))
        files.update({f"/sasl/{u}.properties": f"sasl/{u}.properties" for u in users})
    return files


def config_sources(text: str) -> dict[str, dict[str, str]]:
    """``docker-compose config`` output -> {service: {target: source}} of its volumes
    (compose v1 prints them in the short syntax, ``- SOURCE:TARGET:MODE``)."""
    out: dict[str, dict[str, str]] = {}
    service, in_services, in_volumes = None, False, False
    for line in text.splitlines():
        if not line.startswith(" "):
            in_services, service, in_volumes = line.startswith("services:"), None, False
        elif in_services and (named := re.match(r"^  (\S+):\s*$", line)):
            service, in_volumes = named.group(1), False
            out[service] = {}
        elif service and in_volumes and (item := re.match(r"^    - (.+)$", line)):
            source, target = item.group(1).strip().split(":")[:2]
            out[service][target] = source
        elif service and re.match(r"^    \S", line):
            in_volumes = line.strip() == "volumes:"
    return out


@pytest.mark.parametrize("sasl", [False, True], ids=["tls", "tls+sasl"])
def test_compose_config_mounts_only_each_services_own_files(tmp_path, sasl):
    tls_dir = tmp_path / "tls"
    run([sys.executable, "-m", "tidewater.tools", "certs", "cluster", "--dir", str(tls_dir),
         "--brokers", "3", "--controllers", "3", "--names-as-hosts"])
    files = ["-f", str(COMPOSE_FILE), "-f", str(COMPOSE_TLS_FILE)]
    env = dict(os.environ, TIDE_TLS_DIR=str(tls_dir), TIDE_DATA_DIR=str(tmp_path / "data"))
    if sasl:
        run([sys.executable, str(ROOT / "deploy" / "sasl_users.py"), "--dir", str(tls_dir)])
        files += ["-f", str(COMPOSE_SASL_FILE)]
        env["TIDE_SASL_DIR"] = str(tls_dir / "sasl")
    r = run(["docker-compose", "-p", "tidewater-config-check", *files, "config"], env=env)
    sources = config_sources(r.stdout)
    assert set(SERVICES) <= set(sources), sorted(sources)
    for service in SERVICES:
        secret = {target: source for target, source in sources[service].items()
                  if Path(source).resolve().is_relative_to(tls_dir.resolve())}
        expected = {target: str((tls_dir / f).resolve())
                    for target, f in own_files(service, sasl=sasl).items()}
        assert {t: str(Path(s).resolve()) for t, s in secret.items()} == expected, service
        for source in sources[service].values():  # no folder mount reaches the secrets
            assert not tls_dir.resolve().is_relative_to(Path(source).resolve()), (service, source)


def key_markers(tls_dir: Path) -> dict[str, str]:
    """A line of each private key's PEM body and each user's password -> whose it is."""
    markers = {(tls_dir / f"{name}.key").read_text().splitlines()[1]: f"{name}.key"
               for name in KEYS}
    for user in USERS:
        text = (tls_dir / "sasl" / f"{user}.properties").read_text()
        password = re.search(r"^sasl\.password=(.+)$", text, re.M).group(1)
        markers[password] = f"{user} password"
    return markers


def secrets_seen(container: str, markers: dict[str, str]) -> set[str]:
    """Whose secrets appear anywhere in ``container``'s files (grep over its filesystem)."""
    args = [arg for marker in markers for arg in ("-e", marker)]
    r = subprocess.run(["docker", "exec", container, "grep", "-rhoF", *args, "/",
                        "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 1: nothing found
    return {markers[line] for line in r.stdout.splitlines() if line in markers}


def test_no_container_holds_the_ca_key_or_another_members_secrets(compose_sasl_cluster):
    c = compose_sasl_cluster
    tls_dir = Path(c.env["TIDE_TLS_DIR"])
    markers = key_markers(tls_dir)
    for service in SERVICES:
        container = c.container(service)
        info = json.loads(run(["docker", "inspect", container]).stdout)[0]
        mounted = {m["Destination"]: str(Path(m["Source"]).resolve()) for m in info["Mounts"]
                   if Path(m["Source"]).resolve().is_relative_to(tls_dir.resolve())}
        assert mounted == {t: str((tls_dir / f).resolve())
                           for t, f in own_files(service, sasl=True).items()}, service
        seen = secrets_seen(container, markers)
        name = "client" if service == "console" else service
        allowed = {f"{name}.key"} | {f"{Path(f).stem} password"
                                     for f in own_files(service, sasl=True)
                                     if f.startswith("/sasl/")}
        assert f"{name}.key" in seen, (service, seen)  # the scan does find what is there
        assert seen <= allowed, (service, seen - allowed)
        assert "ca.key" not in seen


def kafka(c, user: str | None, **extra) -> dict:
    tls_dir = Path(c.env["TIDE_TLS_DIR"])
    config = {"bootstrap.servers": c.kafka_bootstrap, "ssl.ca.location": str(tls_dir / "ca.pem"),
              "socket.timeout.ms": 10000, "log_level": 2, **extra}
    if user is None:  # the client certificate, no SASL
        config.update({"security.protocol": "SSL",
                       "ssl.certificate.location": str(tls_dir / "client.pem"),
                       "ssl.key.location": str(tls_dir / "client.key")})
    else:
        text = (tls_dir / "sasl" / f"{user}.properties").read_text()
        props = dict(line.split("=", 1) for line in text.splitlines()
                     if "=" in line and not line.startswith("#"))
        config.update({"security.protocol": "SASL_SSL", "sasl.mechanism": props["sasl.mechanism"],
                       "sasl.username": props["sasl.username"],
                       "sasl.password": props["sasl.password"]})
    return config


def produce(config: dict, values: list[str]) -> list[confluent_kafka.KafkaError | None]:
    producer = confluent_kafka.Producer({**config, "acks": "all", "message.timeout.ms": 30000})
    results: list[confluent_kafka.KafkaError | None] = []
    for value in values:
        producer.produce("demo", value.encode(), on_delivery=lambda err, _m: results.append(err))
    producer.flush(60)
    return results


def test_kafka_listeners_are_sasl_ssl_with_acls(compose_sasl_cluster):
    c = compose_sasl_cluster
    assert "SASL_SSL Kafka listeners and ACLs" in c.up_output, c.up_output
    sent = [f"sasl-{i:04d}" for i in range(100)]
    assert produce(kafka(c, "admin"), sent) == [None] * len(sent)
    consumer = confluent_kafka.Consumer({**kafka(c, "admin"), "group.id": "sasl-check",
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["demo"])
    got: list[str] = []
    for _ in range(120):
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value().decode())
        if len([v for v in got if v.startswith("sasl-")]) >= len(sent):
            break
    consumer.close()
    assert sorted(v for v in got if v.startswith("sasl-")) == sent

    # The client certificate alone (SSL, no SASL user) gets no metadata.
    admin = KafkaAdminClient(kafka(c, None))
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=10)
    # The console's user may describe, not write.
    described = KafkaAdminClient(kafka(c, "console")).list_topics(timeout=30)
    assert "demo" in described.topics and len(described.brokers) == 3
    refused = produce(kafka(c, "console"), ["nope"])
    assert len(refused) == 1 and refused[0] is not None
    assert refused[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, refused


def test_the_console_reads_the_cluster_as_its_own_user(compose_sasl_cluster):
    port = compose_sasl_cluster.env["TIDE_CONSOLE_PORT"]
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
    for broker in (1, 2, 3):
        assert f'id="broker-{broker}" data-status="alive"' in page


def test_make_chaos_against_the_sasl_cluster(compose_sasl_cluster, tmp_path):
    c = compose_sasl_cluster
    security = ComposeCluster(c.project).client_security()
    assert security["security_protocol"] == "SASL_SSL" and security["sasl_plain_username"] == "admin"
    out = tmp_path / "chaos"
    r = run(["make", "--no-print-directory", "chaos", f"COMPOSE_PROJECT={c.project}",
             "CHAOS_DURATION_S=60", "CHAOS_SEED=6", f"CHAOS_OUT={out}"],
            env=c.env, timeout_s=1200, check=False)
    logs = ROOT / "build" / "docker-test-logs"  # kept after pytest's tmp folders go
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{c.project}-chaos.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    # make chaos: the verdict table, then the audit's lines (both on stdout or stderr).
    output = r.stdout + r.stderr
    assert "VERDICT: PASS" in output and "audit: PASS" in output, output[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    acked = sum(p["acked"] for p in verdict["partitions"])
    lost = sum(p.get("lost", 0) for p in verdict["partitions"])
    print(f"chaos over SASL_SSL: acked {acked}, lost {lost}, ok {verdict['ok']}")
    assert verdict["ok"] and acked > 500 and lost == 0
    for service in MEMBERS:
        c.wait_healthy(service, timeout_s=90)
