"""Issue 28: DeleteRecords (key 21) from Kafka's admin clients against a 3-broker cluster.

confluent-kafka's ``AdminClient.delete_records`` and kafka-python's
``KafkaAdminClient.delete_records`` move the partition's log start: consumers
no longer get the records below it (ListOffsets earliest moves), every
replica's log start is there when the answer comes (``tide topics describe
--json``; Kafka's DelayedDeleteRecords), an offset past
the high watermark is OFFSET_OUT_OF_RANGE, -1 deletes up to the high
watermark, and the start survives every broker being SIGKILLed and started
again.
"""

from __future__ import annotations

import time

import pytest
from cluster_fixtures import describe_topic, fully_replicated, kafka_cluster, run_tide, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, OffsetSpec  # noqa: E402

TOPIC = "purge"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from kafka_cluster(tmp_path_factory, "delete-records")


@pytest.fixture(scope="module")
def topic(cluster):
    assert cluster.tide("topics", "create", TOPIC, "--partitions", "1",
                        "--replication-factor", "3").returncode == 0
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the topic fully replicated")
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka, "acks": "all",
                                         "linger.ms": 5})
    for i in range(100):
        producer.produce(TOPIC, value=b"record-%03d" % i)
    assert producer.flush(30) == 0
    return TOPIC


def earliest(c) -> int:
    admin = AdminClient({"bootstrap.servers": c.kafka})
    answer = admin.list_offsets({TopicPartition(TOPIC, 0): OffsetSpec.earliest()})
    return answer[TopicPartition(TOPIC, 0)].result(30).offset


def replica_starts(c) -> dict[int, int]:
    described = describe_topic(c, TOPIC)
    if described is None:
        return {}
    [partition] = described["partitions"]
    return {r["broker"]: r["log_start_offset"] for r in partition["replicas_state"]}


def every_replica_starts_at(c, offset: int) -> bool:
    starts = replica_starts(c)
    return len(starts) == 3 and set(starts.values()) == {offset}


def consumed_offsets(c) -> list[int]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=c.kafka.split(","),
                                   enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([kafka.TopicPartition(TOPIC, 0)])
        consumer.seek_to_beginning()
        return [m.offset for m in consumer]
    finally:
        consumer.close()


def test_confluent_admin_deletes_records_on_every_replica(cluster, topic):
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [future] = admin.delete_records([TopicPartition(topic, 0, 40)]).values()
    deleted = future.result(30)
    assert deleted.low_watermark == 40
    # Answered once every in-sync replica's log start reached it (DelayedDeleteRecords).
    assert every_replica_starts_at(cluster, 40), replica_starts(cluster)
    assert earliest(cluster) == 40
    assert consumed_offsets(cluster) == list(range(40, 100))

    # Past the high watermark: OFFSET_OUT_OF_RANGE, nothing moves.
    [future] = admin.delete_records([TopicPartition(topic, 0, 1000)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert earliest(cluster) == 40


def test_kafka_python_admin_deletes_records(cluster, topic):
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka.split(","))
    try:
        answer = admin.delete_records({kafka.TopicPartition(topic, 0): 70}, timeout_ms=30_000)
    finally:
        admin.close()
    assert answer[kafka.TopicPartition(topic, 0)]["low_watermark"] == 70
    assert every_replica_starts_at(cluster, 70), replica_starts(cluster)
    assert earliest(cluster) == 70
    assert consumed_offsets(cluster) == list(range(70, 100))


def test_the_log_start_survives_every_broker_killed_and_restarted(cluster, topic):
    wait_for(lambda: every_replica_starts_at(cluster, 70), "every replica's log start at 70")
    time.sleep(2)  # the followers' periodic checkpoint (log.flush.offset.checkpoint.interval.ms)
    data_dir = str(cluster.data_dir)
    for broker in ("1", "2", "3"):
        assert run_tide("cluster", "kill", broker, "--signal", "KILL",
                        "--data-dir", data_dir).returncode == 0
    for broker in ("1", "2", "3"):
        assert run_tide("cluster", "start", broker, "--data-dir", data_dir,
                        timeout_s=120).returncode == 0
    wait_for(lambda: fully_replicated(cluster, TOPIC), "the topic fully replicated again")
    wait_for(lambda: every_replica_starts_at(cluster, 70), "every replica's log start at 70")
    assert earliest(cluster) == 70
    assert consumed_offsets(cluster) == list(range(70, 100))


def test_minus_one_deletes_up_to_the_high_watermark(cluster, topic):
    admin = AdminClient({"bootstrap.servers": cluster.kafka})
    [future] = admin.delete_records([TopicPartition(topic, 0, -1)]).values()
    assert future.result(30).low_watermark == 100
    assert every_replica_starts_at(cluster, 100), replica_starts(cluster)
    assert earliest(cluster) == 100
    assert consumed_offsets(cluster) == []
