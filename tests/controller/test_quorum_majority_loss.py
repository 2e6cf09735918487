"""Issue 26's Done-when with real processes: 3 controllers on the Raft quorum, 3 brokers,
Kafka clients, acks=all throughout.

1. The active controller and partition 0's leader SIGKILLed at the same moment: a new
   active controller elects a new leader for partition 0, and writes go on.
2. Two of three controllers SIGKILLed: the partition leaders keep taking acks=all
   writes; a CreateTopics fails with an error within its timeout (no hang); with one
   controller back (a majority) it succeeds.
3. All three SIGKILLed and restarted: every topic is still there, writes go on.

Every acknowledged record is read back at the end.
"""

from __future__ import annotations

import threading

import pytest
from test_quorum_cluster_failover import (
    RETRIED,
    TOPIC,
    BrokerProcess,
    admin_module,
    confluent_kafka,
    describe_cluster,
    leaders,
    read_back,
)
from test_quorum_metadata_owner import start_quorum

from tests.cli.cluster_fixtures import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

BATCH = 300
SECOND_TOPIC = "made-with-a-majority"


def create(admin, name: str, *, operation_timeout_s: float = 15):
    """One CreateTopics attempt; the error's name, or None when it was created."""
    [future] = admin.create_topics([admin_module.NewTopic(
        name, num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})],
        operation_timeout=operation_timeout_s, request_timeout=operation_timeout_s + 5,
    ).values()
    try:
        future.result(operation_timeout_s + 30)  # a hang fails the test here
    except confluent_kafka.KafkaException as e:
        return e.args[0].name()
    return None


def test_controller_majority_loss_and_simultaneous_failures_keep_every_record(tmp_path):
    controllers, _ = start_quorum(tmp_path, session_timeout_ms=6000)
    bootstrap_servers = ",".join(f"{i + 1}@{c.address}" for i, c in enumerate(controllers))
    brokers = [BrokerProcess(i, bootstrap_servers, tmp_path) for i in (1, 2, 3)]
    acknowledged: set[bytes] = set()
    failed: list = []
    lock = threading.Lock()
    sent = 0

    def on_delivery(error, message):
        with lock:
            (failed.append(error) if error is not None else acknowledged.add(message.value()))

    try:
        for broker in brokers:
            broker.start()

        def active(live: int = 3):
            for i, c in enumerate(controllers):
                if c.proc is not None and c.proc.poll() is None:
                    answer = describe_cluster(c.address)
                    if answer is not None and sum(not b.fenced for b in answer.brokers) == live:
                        return i, answer
            return None

        first, described = wait_for(active, "an active controller with 3 live brokers", 90)
        kafka = ",".join(f"127.0.0.1:{b.kafka_port}" for b in brokers)
        admin = admin_module.AdminClient({"bootstrap.servers": kafka})
        wait_for(lambda: create(admin, TOPIC) in (None, "TOPIC_ALREADY_EXISTS")
                 or None, "the topic created", 90)
        wait_for(lambda: (placed := leaders(kafka)) is not None
                 and all(isr == 3 for _, isr in placed.values()), "3 in-sync replicas")
        producer = confluent_kafka.Producer({
            "bootstrap.servers": kafka, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": 90_000, "retry.backoff.ms": 100})

        def produce_batch(timeout_s: float = 90) -> None:
            """BATCH more records, all acknowledged (acks=all) before it returns."""
            nonlocal sent
            before = len(acknowledged)
            for _ in range(BATCH):
                producer.produce(TOPIC, key=str(sent % 13).encode(), value=b"entry-%06d" % sent,
                                 on_delivery=on_delivery)
                sent += 1
                producer.poll(0)
            assert producer.flush(timeout_s) == 0
            assert not failed, failed[:5]
            assert len(acknowledged) == before + BATCH

        produce_batch()

        # 1. The active controller and partition 0's leader at the same moment.
        placed = leaders(kafka)
        assert placed is not None
        victim = placed[0][0]
        brokers[victim - 1].kill()
        controllers[first].stop()  # SIGKILL
        survivors = ",".join(f"127.0.0.1:{b.kafka_port}" for b in brokers
                             if b.broker_id != victim)
        successor, after = wait_for(lambda: active(live=2), "a new active controller", 90)
        assert successor != first and after.controller_epoch > described.controller_epoch
        wait_for(lambda: (now := leaders(survivors)) is not None and now[0][0] != victim,
                 f"partition 0 led away from broker {victim}", 90)
        produce_batch()
        # Both come back: the controller rejoins the quorum from its own directory.
        controllers[first].start()
        brokers[victim - 1].start()
        wait_for(lambda: (now := leaders(kafka)) is not None
                 and all(isr == 3 for _, isr in now.values()), "3 in-sync replicas again", 90)

        # 2. Two of three controllers gone: no majority.
        leader_index, _ = wait_for(active, "an active controller", 60)
        standby = next(i for i in range(3) if i != leader_index)
        remaining = next(i for i in range(3) if i not in (leader_index, standby))
        controllers[leader_index].stop()
        controllers[standby].stop()
        produce_batch()  # the partition leaders keep serving
        error = create(admin, SECOND_TOPIC, operation_timeout_s=5)
        assert error in RETRIED, error
        assert controllers[remaining].proc is not None
        assert controllers[remaining].proc.poll() is None
        controllers[standby].start()  # a majority again
        wait_for(lambda: create(admin, SECOND_TOPIC) in (None, "TOPIC_ALREADY_EXISTS")
                 or None, "CreateTopics with a majority back", 90)
        produce_batch()

        # 3. Every controller SIGKILLed, then restarted: every topic is still there.
        for c in controllers:
            c.stop()
        for c in controllers:
            c.start()
        wait_for(active, "an active controller after a full restart", 90)
        for name in (TOPIC, SECOND_TOPIC):
            # The first answer that is not "no active controller yet" says it exists (a
            # lost topic would be created: None).
            answer = wait_for(lambda n=name: (e := create(admin, n)) not in RETRIED
                              and (e or "created again"), f"an answer about {name}", 90)
            assert answer == "TOPIC_ALREADY_EXISTS", (name, answer)
        produce_batch()

        lost = acknowledged - read_back(kafka, acknowledged, 30)
        assert len(acknowledged) == sent
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
        print(f"acknowledged {len(acknowledged)} of {sent}, all read back; CreateTopics "
              f"without a majority: {error}")
    finally:
        for broker in brokers:
            broker.kill()
        for c in controllers:
            c.stop()

