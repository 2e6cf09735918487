"""Issue 18: the compose cluster with TLS on every port, as `make up TLS=1` runs it.

deploy/compose-tls.yml on top of docker-compose.yml, certificates from
`tide certs cluster --controllers 3 --names-as-hosts` (a quorum of three controllers
with their own certificates): every container is healthy (the health
check speaks TLS), every published port refuses plaintext, `tide` with
``--command-config`` and kcat with ``security.protocol=SSL`` produce and
consume from the host, kafka-python does inside the network against the
brokers' compose names, and a chaos run passes its verdict over TLS.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.kafka_wire import answered_as_kafka, plaintext_api_versions_answer
from tidewater.tools.chaos.targets import ComposeCluster

pytestmark = pytest.mark.timeout(1200)

KCAT = shutil.which("kcat")
WAIT_S = 60
SERVICES = ("controller", "controller-2", "controller-3", "broker-1", "broker-2", "broker-3")

# kafka-python over SSL inside the compose network; argv: bootstrap, topic, count; prints
# [[partition, value], ...] read from the beginning.
SSL_ROUND_TRIP_IN_NETWORK = r"""
import json, sys, time
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
bootstrap, topic, count = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
ssl = dict(security_protocol="SSL", ssl_cafile="/tls/ca.pem", ssl_certfile="/tls/client.pem",
           ssl_keyfile="/tls/client.key")
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **ssl)
for f in [producer.send(topic, f"inside-{i:05d}".encode()) for i in range(count)]:
    f.get(timeout=60)
producer.close()
consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **ssl)
consumer.assign([TopicPartition(topic, p) for p in range(3)])
consumer.seek_to_beginning()
got, deadline = [], time.monotonic() + 60
while len(got) < count and time.monotonic() < deadline:
    for records in consumer.poll(timeout_ms=500).values():
        got += [[r.partition, r.value.decode()] for r in records if r.value.startswith(b"inside-")]
consumer.close()
print(json.dumps(got))
"""


def tls_files(c) -> dict[str, str]:
    tls_dir = c.env["TIDE_TLS_DIR"]
    return {"ca": f"{tls_dir}/ca.pem", "cert": f"{tls_dir}/client.pem",
            "key": f"{tls_dir}/client.key", "dir": tls_dir}


def kcat_ssl(c) -> list[str]:
    files = tls_files(c)
    return ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={files['ca']}",
            "-X", f"ssl.certificate.location={files['cert']}",
            "-X", f"ssl.key.location={files['key']}"]


def test_every_service_is_healthy_over_tls_and_every_port_refuses_plaintext(compose_tls_cluster):
    c = compose_tls_cluster
    for service in SERVICES:
        c.wait_healthy(service, timeout_s=60)
    assert "TLS on every port" in c.up_output, c.up_output
    # tide without the client settings: refused, one line.
    plain = subprocess.run([sys.executable, "-m", "tidewater.tools", "--bootstrap-server",
                            c.bootstrap, "topics", "list"], capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in c.env.items()
                                             if k != "TIDE_COMMAND_CONFIG"})
    assert plain.returncode != 0 and "no broker reachable" in plain.stderr, plain
    # The Kafka ports: a plaintext ApiVersions gets no Kafka answer.
    for port in c.kafka_ports.values():
        answer = plaintext_api_versions_answer("127.0.0.1", port)
        assert not answered_as_kafka(answer), answer
    # The chaos tooling finds the client certificate through the containers' /tls mount.
    security = ComposeCluster(c.project).client_security()
    assert security["security_protocol"] == "SSL"
    assert security["ssl_certfile"] == tls_files(c)["cert"]



def test_the_console_reads_the_cluster_over_tls(compose_tls_cluster):
    """The `console` service connects with the client certificate (compose-tls.yml)."""
    import urllib.request

    port = compose_tls_cluster.env["TIDE_CONSOLE_PORT"]
    assert f"web console: http://127.0.0.1:{port}/" in compose_tls_cluster.up_output
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
    for broker in (1, 2, 3):
        assert f'id="broker-{broker}" data-status="alive"' in page

def test_tide_kcat_and_kafka_python_over_tls(compose_tls_cluster):
    c = compose_tls_cluster
    sent = [f"host-{i:05d}" for i in range(300)]
    produced = c.tide("produce", "demo", "--acks", "all", input="\n".join(sent) + "\n")
    assert produced.returncode == 0, produced.stderr
    consumed = c.tide("consume", "demo", "--from-beginning", "--json", "--timeout-ms", "3000",
                      check=True)
    got = [json.loads(line)["value"] for line in consumed.stdout.splitlines() if line.strip()]
    assert sorted(v for v in got if v.startswith("host-")) == sent

    if KCAT is not None:
        keyed = [(f"k{i % 8}", f"kcat-{i:05d}") for i in range(200)]
        r = subprocess.run([KCAT, "-b", c.kafka_bootstrap, *kcat_ssl(c), "-P", "-t", "demo",
                            "-K:", "-X", "acks=all", "-X", f"message.timeout.ms={WAIT_S * 1000}"],
                           input="".join(f"{k}:{v}\n" for k, v in keyed), capture_output=True,
                           text=True, timeout=WAIT_S * 2)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([KCAT, "-b", c.kafka_bootstrap, *kcat_ssl(c), "-C", "-t", "demo",
                            "-o", "beginning", "-e", "-q", "-f", "%k\t%s\n"],
                           capture_output=True, text=True, timeout=WAIT_S * 2)
        assert r.returncode == 0, r.stderr
        rows = [line.split("\t") for line in r.stdout.splitlines()]
        assert sorted((k, v) for k, v in rows if v.startswith("kcat-")) == sorted(keyed)
        # Without the SSL settings kcat gets nowhere.
        r = subprocess.run([KCAT, "-b", c.kafka_bootstrap, "-L", "-m", "5"],
                           capture_output=True, text=True, timeout=WAIT_S)
        assert r.returncode != 0 or "brokers:" not in r.stdout, r.stdout

    # Inside the network, by the brokers' compose names (their certificates name them).
    target = ComposeCluster(c.project)
    cmd = ["docker", "run", "--rm", "--network", target.network,
           *[arg for f in ("ca.pem", "client.pem", "client.key")  # a client's files only
             for arg in ("-v", f"{tls_files(c)['dir']}/{f}:/tls/{f}:ro")], c.image, "python", "-c",
           SSL_ROUND_TRIP_IN_NETWORK, target.kafka_network_bootstrap(), "demo", "200"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S * 3)
    assert r.returncode == 0, r.stderr[-3000:]
    inside = json.loads(r.stdout)
    assert sorted(v for _, v in inside) == [f"inside-{i:05d}" for i in range(200)]


def test_chaos_run_over_tls(compose_tls_cluster, tmp_path):
    c = compose_tls_cluster
    out = tmp_path / "chaos"
    r = c.tide("chaos", "--compose", "--compose-project", c.project, "--duration", "45",
               "--seed", "6", "--out", str(out), "--hold", "2,5", "--gap", "1,3",
               "--scrape-interval-ms", "1000", timeout_s=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "VERDICT: PASS" in r.stdout
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and sum(p["acked"] for p in verdict["partitions"]) > 500
    for service in SERVICES:
        c.wait_healthy(service, timeout_s=90)
