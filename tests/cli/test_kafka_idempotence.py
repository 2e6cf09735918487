"""Issue 17: Kafka's own idempotent producers through the Kafka listener, across a
leader SIGKILL: every acknowledged record is read back exactly once, in send order.

confluent-kafka with ``enable.idempotence=true`` (librdkafka: acks=all, 5 in flight)
and kafka-python 3.x with its default settings (idempotent) produce one partition
of a topic with replication factor 3 while its leader is SIGKILLed and restarted.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from cluster_fixtures import fully_replicated, kafka_cluster, run_tide, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

RECORDS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from kafka_cluster(tmp_path_factory, "idempotence")


def new_topic(c) -> tuple[str, int]:
    name = f"idem-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.kafka})  # alive until the answer comes
    [(_, future)] = admin.create_topics(
        [NewTopic(name, num_partitions=1, replication_factor=3)]).items()
    future.result(30)
    topic = wait_for(lambda: fully_replicated(c, name), f"{name} fully replicated")
    return name, topic["partitions"][0]["leader"]


def read_values(c, topic: str, expected: int, timeout_s=60) -> list[int]:
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": "assign-only",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if len(values) >= expected:
                    break
                continue
            assert message.error() is None, message.error()
            values.append(int(message.value()))
    finally:
        consumer.close()
    return values


class Sending:
    """Produces 0..RECORDS-1 from a thread; ``acked`` holds what was acknowledged."""

    def __init__(self, send_all):
        self.acked: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=send_all, args=(self,), daemon=True)

    def on_result(self, value: int, error) -> None:
        with self.lock:
            if error is None:
                self.acked.append(value)
            else:
                self.failed.append((value, str(error)))

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def confluent_send_all(sending: Sending, servers: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True,
                         "linger.ms": 5, "max.in.flight.requests.per.connection": 5,
                         "message.timeout.ms": 120_000})
    for i in range(RECORDS):
        producer.produce(topic, value=str(i).encode(), partition=0,
                         on_delivery=lambda e, m, i=i: sending.on_result(i, e))
        producer.poll(0)
        if i % 50 == 0:
            time.sleep(0.05)
    assert producer.flush(150) == 0


def kafka_python_send_all(sending: Sending, servers: str, topic: str) -> None:
    import kafka

    producer = kafka.KafkaProducer(bootstrap_servers=servers.split(","))  # the defaults
    assert producer.config["enable_idempotence"]
    for i in range(RECORDS):
        future = producer.send(topic, value=str(i).encode(), partition=0)
        future.add_callback(lambda _m, i=i: sending.on_result(i, None))
        future.add_errback(lambda e, i=i: sending.on_result(i, e))
        if i % 50 == 0:
            time.sleep(0.05)
    producer.flush(150)
    producer.close(10)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_every_acknowledged_record_once_and_in_order_across_a_leader_sigkill(cluster, client):
    if client == "kafka-python":
        pytest.importorskip("kafka")
    topic, leader = new_topic(cluster)
    send_all = confluent_send_all if client == "confluent-kafka" else kafka_python_send_all
    sending = Sending(lambda s: send_all(s, cluster.kafka, topic))
    sending.thread.start()
    killed = False
    try:
        wait_for(lambda: sending.count() >= RECORDS // 4, "a quarter acknowledged", 60)
        assert run_tide("cluster", "kill", str(leader), "--signal", "KILL",
                        "--data-dir", str(cluster.data_dir)).returncode == 0
        killed = True
        at_kill = sending.count()
        wait_for(lambda: sending.count() >= at_kill + RECORDS // 4,
                 "records acknowledged by the new leader", 90)
    finally:
        if killed:
            assert run_tide("cluster", "start", str(leader), "--data-dir",
                            str(cluster.data_dir), timeout_s=90).returncode == 0
    sending.thread.join(180)
    assert not sending.thread.is_alive()
    assert not sending.failed, sending.failed[:5]
    assert sorted(sending.acked) == list(range(RECORDS))
    values = read_values(cluster, topic, RECORDS)
    assert len(values) == len(set(values)), "a record was written twice"
    assert values == sorted(values), "records are out of send order"
    assert set(sending.acked) <= set(values)


def test_aiokafka_idempotent_producer(cluster):
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    topic, _leader = new_topic(cluster)

    async def produce() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka.split(","),
                                             enable_idempotence=True)
        await producer.start()
        try:
            for i in range(200):
                await producer.send(topic, str(i).encode(), partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(produce())
    assert read_values(cluster, topic, 200) == list(range(200))
