"""Issue 15: through confluent-kafka at acks=all, SIGKILL the partition leader mid-stream:
every acknowledged record is read back by kafka-python (a client of another lineage)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

RECORDS = 3000


def leaders(c, topic: str) -> dict[int, int] | None:
    result = c.tide("topics", "describe", topic, "--json")
    if result.returncode != 0:
        return None
    [info] = json.loads(result.stdout)["topics"]
    if any(len(p["isr"]) != 3 or p["leader"] < 0 for p in info["partitions"]):
        return None
    return {p["partition"]: p["leader"] for p in info["partitions"]}


def test_acknowledged_records_survive_a_leader_sigkill(tmp_path):
    c = start_cluster(tmp_path / "cluster", 3, "min.insync.replicas=2")
    kafka_bootstrap = c.manifest()["kafka_bootstrap"]
    try:
        assert c.tide("topics", "create", "payments", "--partitions", "3",
                      "--replication-factor", "3").returncode == 0
        deadline = time.monotonic() + 60
        while (placed := leaders(c, "payments")) is None:
            assert time.monotonic() < deadline, "payments not fully replicated"
            time.sleep(0.2)
        victim = placed[0]

        acknowledged: set[bytes] = set()
        failed: list = []
        lock = threading.Lock()

        def on_delivery(error, message):
            with lock:
                if error is None:
                    acknowledged.add(message.value())
                else:
                    failed.append(error)

        producer = confluent_kafka.Producer({
            "bootstrap.servers": kafka_bootstrap, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": 60_000, "retry.backoff.ms": 100})
        for i in range(RECORDS):
            producer.produce("payments", key=str(i % 17).encode(), value=b"payment-%06d" % i,
                             on_delivery=on_delivery)
            producer.poll(0)
            if i == RECORDS // 3:
                producer.flush(30)
                assert run_tide("cluster", "kill", str(victim), "--signal", "KILL",
                                "--data-dir", str(c.data_dir)).returncode == 0
            if i % 100 == 0:
                time.sleep(0.02)  # spread the stream over the failover
        assert producer.flush(90) == 0
        assert len(acknowledged) + len(failed) >= RECORDS  # every record got its outcome
        assert len(acknowledged) > RECORDS // 2
        print(f"acknowledged {len(acknowledged)}, failed {len(failed)}")
        moved = c.tide("topics", "describe", "payments", "--json")
        [info] = json.loads(moved.stdout)["topics"]
        assert info["partitions"][0]["leader"] not in (-1, victim)  # the failover happened

        consumer = kafka.KafkaConsumer(bootstrap_servers=kafka_bootstrap.split(","),
                                       enable_auto_commit=False, consumer_timeout_ms=5000)
        consumer.assign([kafka.TopicPartition("payments", p) for p in range(3)])
        consumer.seek_to_beginning()
        read = [m.value for m in consumer]
        consumer.close()
        lost = acknowledged - set(read)
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    finally:
        stop_cluster(c)
