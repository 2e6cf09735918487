"""The compose cluster from the host: health checks, produce/consume, leader failover, chaos.

Tests run in file order against one cluster (conftest.py); the chaos run is
last because it disturbs everything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.docker.conftest import BROKER_SERVICES, CONTROLLER_SERVICES
from tidewater.tools.chaos.targets import ComposeCluster
from tidewater.tools.scrape import read_snapshots

pytestmark = pytest.mark.timeout(1200)  # includes the first image build of the session

KCAT = shutil.which("kcat")
KAFKA_WAIT_S = 60

# kafka-python (in the image: the kafka-client extra) inside the compose network. Both
# scripts print JSON on stdout; argv: bootstrap, topic, seconds to wait (then what to read).
CONSUME_IN_NETWORK = r"""
import json, sys, time
from kafka import KafkaConsumer, TopicPartition
bootstrap, topic, wait_s, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","), enable_auto_commit=False)
consumer.assign([TopicPartition(topic, p) for p in range(3)])
consumer.seek_to_beginning()
got, deadline = [], time.monotonic() + wait_s
while len(got) < count and time.monotonic() < deadline:
    for records in consumer.poll(timeout_ms=500).values():
        got += [[r.partition, r.key.decode(), r.value.decode()] for r in records]
consumer.close()
print(json.dumps(got))
"""

# Records [[key, value], ...] on stdin; idempotence off here (the idempotent producer is
# tested against real processes in tests/cli/test_kafka_idempotence.py).
PRODUCE_IN_NETWORK = r"""
import json, sys
from kafka import KafkaProducer
bootstrap, topic, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all",
                         enable_idempotence=False)
futures = [producer.send(topic, key=k.encode(), value=v.encode()) for k, v in json.load(sys.stdin)]
acked = [f.get(timeout=wait_s) for f in futures]
producer.close()
print(json.dumps([[m.partition, m.offset] for m in acked]))
"""


def values(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


def consumed_values(cluster, topic: str) -> list[str]:
    r = cluster.tide("consume", topic, "--from-beginning", "--json", "--timeout-ms", "3000", check=True)
    return [json.loads(line)["value"] for line in r.stdout.splitlines() if line.strip()]


def wait_full_isr(cluster, topic: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        parts = cluster.describe(topic)
        if all(p["leader"] >= 0 and sorted(p["isr"]) == sorted(p["replicas"]) for p in parts.values()):
            return parts
        if time.monotonic() > deadline:
            pytest.fail(f"ISR not full after {timeout_s} s: {parts}")
        time.sleep(0.5)


def test_every_service_is_healthy_and_the_check_fails_when_nothing_serves(compose_cluster):
    c = compose_cluster
    for service in CONTROLLER_SERVICES + BROKER_SERVICES:
        assert c.state(service)["Health"]["Status"] == "healthy"
    broker = c.container("broker-1")
    ok = subprocess.run(["docker", "exec", broker, "tidewater-healthcheck", "broker", "9092"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # A port where nothing serves gRPC (the metrics HTTP port) must fail the check.
    bad = subprocess.run(["docker", "exec", broker, "tidewater-healthcheck", "broker", "9100"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "unhealthy" in bad.stderr
    # The three controllers are one quorum: one leader, every voter caught up or close.
    r = subprocess.run(["docker", "exec", c.container("controller-2"), "tide", "quorum",
                        "describe", "--status", "--bootstrap-controller",
                        "controller:9093,controller-2:9093,controller-3:9093"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    voters = json.loads(next(line.split(":", 1)[1] for line in r.stdout.splitlines()
                             if line.startswith("CurrentVoters:")))
    assert sorted(v["id"] for v in voters) == [1, 2, 3]



def test_the_console_service_shows_the_cluster(compose_cluster):
    """`make up` starts the web console; up.py prints its URL; it sees all three brokers."""
    import urllib.request

    port = compose_cluster.env["TIDE_CONSOLE_PORT"]
    url = f"http://127.0.0.1:{port}"
    assert f"web console: {url}/" in compose_cluster.up_output
    page = urllib.request.urlopen(url + "/", timeout=30).read().decode()
    for broker in (1, 2, 3):
        assert f'id="broker-{broker}" data-status="alive"' in page
    topic = urllib.request.urlopen(url + "/topics/demo", timeout=30).read().decode()
    assert 'id="p-2"' in topic and "read-only" in topic

def test_produce_and_consume_from_the_host(compose_cluster, tmp_path):
    c = compose_cluster
    sent = values("host", 300)
    ack_log = tmp_path / "acks.jsonl"
    r = c.tide("produce", "demo", "--acks", "all", "--ack-log", str(ack_log), input="\n".join(sent) + "\n")
    assert r.returncode == 0, r.stderr
    assert len(ack_log.read_text().splitlines()) == 300
    # Any broker's external listener works as bootstrap; metadata names host addresses.
    other = f"127.0.0.1:{c.broker_ports[3]}"
    described = c.tide("cluster", "describe", bootstrap=other, check=True).stdout
    assert f"localhost:{c.broker_ports[2]}" in described
    got = consumed_values(c, "demo")
    assert sorted(v for v in got if v.startswith("host-")) == sent
    # The data folders are bind mounts readable on the host.
    logs = list((c.data_dir / "broker-1").glob("demo-*/*.log"))
    assert logs and sum(p.stat().st_size for p in logs) > 0


def keyed_records(prefix: str, n: int, keys: int = 16) -> list[tuple[str, str]]:
    return [(f"{prefix}-key{i % keys:02d}", f"{prefix}-{i:05d}") for i in range(n)]


def in_network(image: str, network: str, script: str, *args: str, input=None):
    """A throwaway container of the cluster's image on its network runs a Python script."""
    cmd = ["docker", "run", "--rm", "-i", "--network", network, image, "python", "-c", script, *args]
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=KAFKA_WAIT_S * 3)
    assert r.returncode == 0, f"in-network client exited {r.returncode}:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def assert_every_record_once_keys_in_order(got: list[tuple[int, str, str]],
                                           sent: list[tuple[str, str]]) -> None:
    """Each record back exactly once; one partition per key, in the order sent."""
    assert sorted((k, v) for _, k, v in got) == sorted(sent)
    for key in {k for k, _ in sent}:
        assert len({p for p, k, _ in got if k == key}) == 1, key
        assert [v for _, k, v in got if k == key] == [v for k, v in sent if k == key], key


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (`make kcat` installs it from "
                                         "Debian): the host side of the Kafka test needs it")
def test_kafka_from_the_host_with_kcat_and_inside_the_network(compose_cluster):
    c = compose_cluster
    target = ComposeCluster(c.project)  # what `make up` and chaos read from docker inspect
    network_bootstrap = target.kafka_network_bootstrap()
    assert network_bootstrap == "broker-1:9094,broker-2:9094,broker-3:9094"
    assert f"kafka bootstrap from the host: {c.kafka_bootstrap}\n" in c.up_output, c.up_output
    topic = "kafka-dual"
    r = c.tide("topics", "create", topic, "--partitions", "3", "--replication-factor", "3")
    assert r.returncode == 0, r.stderr
    wait_full_isr(c, topic)
    # Any broker's published port bootstraps; Metadata names the host side of every broker.
    listed = subprocess.run([KCAT, "-b", f"127.0.0.1:{c.kafka_ports[2]}", "-L", "-t", topic],
                            capture_output=True, text=True, timeout=KAFKA_WAIT_S)
    assert listed.returncode == 0, listed.stderr
    for i, port in c.kafka_ports.items():
        assert f"broker {i} at localhost:{port}" in listed.stdout, listed.stdout

    # Host -> network: kcat produces (acks=all, keyed), kafka-python reads inside.
    sent = keyed_records("kcat", 300)
    produced = subprocess.run(
        [KCAT, "-b", c.kafka_bootstrap, "-P", "-t", topic, "-K:", "-X", "acks=all",
         "-X", f"message.timeout.ms={KAFKA_WAIT_S * 1000}"],
        input="".join(f"{k}:{v}\n" for k, v in sent), capture_output=True, text=True,
        timeout=KAFKA_WAIT_S * 2)
    assert produced.returncode == 0, produced.stderr
    got = in_network(c.image, target.network, CONSUME_IN_NETWORK, network_bootstrap, topic,
                     str(KAFKA_WAIT_S), str(len(sent)))
    assert_every_record_once_keys_in_order([tuple(g) for g in got], sent)

    # Network -> host: kafka-python produces inside (acks=all, keyed), kcat reads on the host.
    sent_inside = keyed_records("inside", 300)
    acked = in_network(c.image, target.network, PRODUCE_IN_NETWORK, network_bootstrap, topic,
                       str(KAFKA_WAIT_S), input=json.dumps(sent_inside))
    assert len(acked) == len(sent_inside) and all(offset >= 0 for _, offset in acked)
    consumed = subprocess.run(
        [KCAT, "-b", c.kafka_bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-f", "%p\t%k\t%s\n"],
        capture_output=True, text=True, timeout=KAFKA_WAIT_S * 2)
    assert consumed.returncode == 0, consumed.stderr
    rows = [line.split("\t") for line in consumed.stdout.splitlines()]
    got_host = [(int(p), k, v) for p, k, v in rows]
    assert_every_record_once_keys_in_order(
        [g for g in got_host if g[1].startswith("inside-")], sent_inside)
    assert sorted((k, v) for _, k, v in got_host if k.startswith("kcat-")) == sorted(sent)


def test_killing_the_leader_fails_over_without_losing_acknowledged_records(compose_cluster, tmp_path):
    c = compose_cluster
    before = wait_full_isr(c, "demo")
    old_leader = before[0]["leader"]
    service = f"broker-{old_leader}"
    first = values("failover-a", 200)
    r = c.tide("produce", "demo", "--acks", "all", "--partition", "0", input="\n".join(first) + "\n")
    assert r.returncode == 0, r.stderr

    subprocess.run(["docker", "kill", "-s", "KILL", c.container(service)], check=True, capture_output=True)
    second = values("failover-b", 200)
    ack_log = tmp_path / "acks.jsonl"
    r = c.tide("produce", "demo", "--acks", "all", "--partition", "0", "--ack-log", str(ack_log),
               "--timeout-ms", "60000", input="\n".join(second) + "\n", timeout_s=180)
    assert r.returncode == 0, r.stderr
    acked = [json.loads(line) for line in ack_log.read_text().splitlines()]
    assert len(acked) == 200

    after = c.describe("demo")[0]
    assert after["leader"] not in (-1, old_leader)
    assert old_leader not in after["isr"]
    # A SIGKILLed container stays down (restart policy unless-stopped): chaos decides.
    assert not c.state(service)["Running"]

    got = consumed_values(c, "demo")
    assert set(first) <= set(got) and set(second) <= set(got)
    assert len([v for v in got if v.startswith("failover-")]) == 400  # no duplicates

    subprocess.run(["docker", "start", c.container(service)], check=True, capture_output=True)
    c.wait_healthy(service)
    parts = wait_full_isr(c, "demo")
    assert old_leader in parts[0]["isr"]


def test_metrics_scrape_finds_every_container(compose_cluster, tmp_path):
    c = compose_cluster
    out = tmp_path / "metrics"
    r = c.tide("metrics", "scrape", "--compose", "--compose-project", c.project, "--interval-ms", "500",
               "--duration-s", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    sources = json.loads((out / "sources.json").read_text())
    assert sources["broker-2"]["url"] == f"http://127.0.0.1:{c.metrics_ports['broker-2']}/metrics"
    assert sorted(sources) == sorted(CONTROLLER_SERVICES + BROKER_SERVICES)
    for node in sources:
        snaps = list(read_snapshots(out / f"{node}.prom"))
        assert len(snaps) >= 3 and all(s.ok for s in snaps), node
    broker = list(read_snapshots(out / "broker-1.prom"))[-1].text
    assert "tidewater_broker_replica_high_watermark" in broker
    assert "tidewater_controller_" in list(read_snapshots(out / "controller.prom"))[-1].text


def test_chaos_run_against_the_compose_cluster(compose_cluster, chaos_run_dir):
    c = compose_cluster
    out = chaos_run_dir
    r = c.tide("chaos", "--compose", "--compose-project", c.project, "--duration", "60", "--seed", "95",
               "--out", str(out), "--hold", "2,5", "--gap", "1,3", "--scrape-interval-ms", "1000",
               timeout_s=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "VERDICT: PASS" in r.stdout

    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and sum(p["acked"] for p in verdict["partitions"]) > 1000
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    applied = {f["fault"] for f in faults if f["action"] in ("kill", "pause", "isolate") and f["ok"]}
    # Seed 95 plans every kind of fault once at least in 60 s, with a quorum: the active
    # controller killed (twice) and paused, a standby cut off.
    assert applied == {"kill_leader", "kill_broker", "kill_controller", "pause_broker",
                       "isolate_broker", "pause_controller", "isolate_controller"}
    hit = {(f["fault"], f["target"]) for f in faults if f["fault"].endswith("_controller")}
    assert {("kill_controller", "active"), ("isolate_controller", "standby")} <= hit
    # Killing the active controller made another one active: the verdict counts it.
    assert verdict["controllers"]["names"] == list(CONTROLLER_SERVICES)
    assert verdict["controllers"]["failovers"] >= 1, verdict["controllers"]
    assert "controller failover(s)" in r.stdout
    for node in CONTROLLER_SERVICES + BROKER_SERVICES:
        snaps = list(read_snapshots(out / "metrics" / f"{node}.prom"))
        assert len(snaps) >= 30 and any(s.ok for s in snaps)
        assert (out / "data" / node).is_dir()
    # Everything is back: every container runs and is healthy.
    for service in CONTROLLER_SERVICES + BROKER_SERVICES:
        c.wait_healthy(service, timeout_s=60)
