"""Issue 28: Kafka's admin surface through aiokafka 0.14's ``AIOKafkaAdminClient`` against
a real 3-broker cluster.

Through its public API: ``create_topics`` with topic configs and a manual replica
assignment, ``describe_configs`` of TOPIC and BROKER resources, ``alter_configs`` of a
topic and of one broker (legacy AlterConfigs: the resource's dynamic configs become
exactly the ones sent), ``delete_records`` (the log start offset moves on every replica).

What aiokafka 0.14 has no admin method for (read from its installed
``aiokafka/admin/client.py``; its methods are create/delete_topics, list/describe_topics,
describe_cluster, describe/alter_configs, create_partitions,
describe/list_consumer_groups, find_coordinator, list_consumer_group_offsets and
delete_records):

- partition reassignment (AlterPartitionReassignments 45, ListPartitionReassignments
  46): ``aiokafka.protocol.admin`` has both request classes, so the test below sends
  them by hand through the admin client's connection and moves a partition off its
  leader while an aiokafka acks=all producer keeps writing (0 acknowledged lost);
- the cluster-wide BROKER resource ``""`` (``kafka-configs.sh --entity-default``):
  ``alter_configs``/``describe_configs`` route BROKER resources by ``int(name)`` and
  raise ValueError for ``""``; the test sends AlterConfigs for it by hand;
- IncrementalAlterConfigs (44), OffsetDelete (47, delete a group's committed offsets),
  ElectLeaders (43) and DescribeLogDirs (35): neither a method nor a request class;
- DeleteGroups (42), DescribeClientQuotas (48) and the ACL APIs (29-31): a request
  class, no method.
kafka-python and confluent-kafka cover those (test_kafka_alter_configs,
test_kafka_offset_delete, test_kafka_log_dirs, test_kafka_reassign_partitions).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

aiokafka = pytest.importorskip("aiokafka")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete  # noqa: E402
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType  # noqa: E402
from aiokafka.protocol.admin import (  # noqa: E402
    AlterConfigsRequest,
    AlterPartitionReassignmentsRequest,
    ListPartitionReassignmentsRequest,
)

# Kafka's ConfigSource numbers (DescribeConfigs v1+).
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
DEFAULT_CONFIG = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("aiokafka-admin"), 3, "min.insync.replicas=2")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


class Admin:
    """A started AIOKafkaAdminClient for one ``async with`` block."""

    def __init__(self, bootstrap: str):
        self.client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)

    async def __aenter__(self) -> AIOKafkaAdminClient:
        await self.client.start()
        return self.client

    async def __aexit__(self, *exc) -> None:
        await self.client.close()


def configs_of(responses, resource_name: str) -> dict[str, tuple[str, int]]:
    """{name: (value, config_source)} of one resource in describe_configs' answers."""
    for response in responses:
        for error_code, _message, _type, name, entries in response.resources:
            if name == resource_name:
                assert error_code == 0, (name, error_code, _message)
                # v1+: (name, value, read_only, config_source, is_sensitive, synonyms)
                return {e[0]: (e[1], e[3]) for e in entries}
    raise AssertionError(f"{resource_name!r} not in the answers")


async def broker_configs(admin: AIOKafkaAdminClient, broker_id: str) -> dict:
    return configs_of(await admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, broker_id)]), broker_id)


def alter_errors(responses) -> dict[str, int]:
    return {name: code for response in responses
            for code, _message, _type, name in response.resources}


def topic_state(c, name: str) -> dict | None:
    result = c.tide("topics", "describe", name, "--json")
    if result.returncode != 0:
        return None
    [topic] = json.loads(result.stdout)["topics"]
    return topic


def test_create_describe_alter_topic_and_broker_configs(cluster):
    async def run() -> None:
        async with Admin(cluster.kafka) as admin:
            created = await admin.create_topics([NewTopic(
                "aio-configured", 2, 3, topic_configs={
                    "retention.ms": "3600000", "cleanup.policy": "compact,delete",
                    "message.downconversion.enable": "false"})])
            assert [t[1] for t in created.topic_errors] == [0], created
            refused = await admin.create_topics([NewTopic(
                "aio-refused", 1, 3, topic_configs={"retention.ms": "soon"})])
            assert [t[1] for t in refused.topic_errors] == [40], refused  # INVALID_CONFIG
            wait_for(lambda: (lambda t: t and all(len(p["isr"]) == 3 for p in t["partitions"]))(
                topic_state(cluster, "aio-configured")), "aio-configured fully replicated")

            topic = configs_of(await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "aio-configured")]), "aio-configured")
            assert topic["retention.ms"] == ("3600000", DYNAMIC_TOPIC_CONFIG)
            assert topic["cleanup.policy"] == ("compact,delete", DYNAMIC_TOPIC_CONFIG)
            assert topic["message.downconversion.enable"] == ("false", DYNAMIC_TOPIC_CONFIG)
            assert topic["segment.ms"] == ("604800000", DEFAULT_CONFIG)
            broker = await broker_configs(admin, "2")
            assert broker["broker.id"][0] == "2"
            assert broker["log.retention.ms"][1] == DEFAULT_CONFIG

            # Legacy AlterConfigs replaces the topic's own configs with the ones sent.
            altered = await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, "aio-configured",
                configs={"retention.ms": "7200000", "max.message.bytes": "4000"})])
            assert alter_errors(altered) == {"aio-configured": 0}
            topic = configs_of(await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "aio-configured")]), "aio-configured")
            assert topic["retention.ms"] == ("7200000", DYNAMIC_TOPIC_CONFIG)
            assert topic["max.message.bytes"] == ("4000", DYNAMIC_TOPIC_CONFIG)
            assert topic["cleanup.policy"] == ("delete", DEFAULT_CONFIG)

            # One broker's dynamic config (sent to that broker, as aiokafka routes it).
            altered = await admin.alter_configs([ConfigResource(
                ConfigResourceType.BROKER, "2", configs={"log.retention.ms": "43200000"})])
            assert alter_errors(altered) == {"2": 0}
            two, one = [await broker_configs(admin, b) for b in ("2", "1")]
            assert two["log.retention.ms"] == ("43200000", DYNAMIC_BROKER_CONFIG)
            assert one["log.retention.ms"][1] == DEFAULT_CONFIG
            # A read-only broker config is refused (INVALID_REQUEST, as Kafka's).
            refused_alter = await admin.alter_configs([ConfigResource(
                ConfigResourceType.BROKER, "1", configs={"replica.lag.time.max.ms": "100"})])
            assert alter_errors(refused_alter)["1"] == 42

            # The cluster-wide resource "": aiokafka cannot route it, so by hand.
            with pytest.raises(ValueError):
                await admin.alter_configs([ConfigResource(
                    ConfigResourceType.BROKER, "", configs={"message.max.bytes": "3000"})])
            answer = await admin._client.send(admin._client.get_random_node(),
                                              AlterConfigsRequest(resources=[
                                                  (ConfigResourceType.BROKER, "",
                                                   [("message.max.bytes", "3000")])]))
            assert [r[0] for r in answer.resources] == [0], answer
            one = await broker_configs(admin, "1")
            assert one["message.max.bytes"] == ("3000", DYNAMIC_DEFAULT_BROKER_CONFIG)
            # ... and the legacy AlterConfigs of "" with nothing in it clears it again.
            answer = await admin._client.send(admin._client.get_random_node(),
                                              AlterConfigsRequest(resources=[
                                                  (ConfigResourceType.BROKER, "", [])]))
            assert [r[0] for r in answer.resources] == [0], answer
            one = await broker_configs(admin, "1")
            assert one["message.max.bytes"][1] == DEFAULT_CONFIG
    asyncio.run(run())


def test_delete_records_moves_the_log_start_on_every_replica(cluster):
    topic, tp = "aio-purged", TopicPartition("aio-purged", 0)

    async def run() -> None:
        async with Admin(cluster.kafka) as admin:
            created = await admin.create_topics([NewTopic(topic, 1, 3)])
            assert [t[1] for t in created.topic_errors] == [0], created
            producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka, acks="all")
            await producer.start()
            try:
                for i in range(30):
                    await producer.send_and_wait(topic, f"r{i}".encode(), partition=0)
            finally:
                await producer.stop()
            assert await admin.delete_records({tp: RecordsToDelete(before_offset=20)}) == {tp: 20}
            consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka,
                                        auto_offset_reset="earliest", enable_auto_commit=False)
            await consumer.start()
            try:
                assert await consumer.beginning_offsets([tp]) == {tp: 20}
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                batch = await consumer.getmany(tp, timeout_ms=10000, max_records=100)
                assert [m.value for m in batch[tp]][:1] == [b"r20"]
            finally:
                await consumer.stop()
    asyncio.run(run())

    def starts() -> dict | None:
        state = topic_state(cluster, topic)
        replicas = (state or {"partitions": [{}]})["partitions"][0].get("replicas_state", [])
        found = {s["broker"]: s["log_start_offset"] for s in replicas}
        return found if len(found) == 3 and set(found.values()) == {20} else None
    wait_for(starts, "the log start offset 20 on all 3 replicas")


async def _reassignments(admin: AIOKafkaAdminClient) -> list:
    answer = await admin._client.send(admin._client.get_random_node(),
                                      ListPartitionReassignmentsRequest(30000, None, {}))
    assert answer.error_code == 0, answer
    return list(answer.topics)


async def _produce_until(bootstrap: str, topic: str, stop: asyncio.Event,
                         acked: set[int], failed: list[BaseException]) -> None:
    """Numbered records with acks=all, idempotent, until ``stop``; keeps what was acked."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, request_timeout_ms=30000)
    await producer.start()
    try:
        n = 0
        while not stop.is_set():
            futures = [(n + i, await producer.send(topic, str(n + i).encode(), partition=0))
                       for i in range(20)]
            n += 20
            for number, future in futures:
                try:
                    await future
                    acked.add(number)
                except Exception as e:  # counted, not lost: never acknowledged
                    failed.append(e)
    finally:
        await producer.stop()


def test_reassignment_by_hand_while_an_acks_all_producer_writes(cluster):
    """AlterPartitionReassignments with aiokafka's request class: [1, 2] -> [2, 3] drops
    the leader (broker 1) while the producer writes; every acknowledged record is read
    back afterwards."""
    topic, tp = "aio-moved", TopicPartition("aio-moved", 0)
    acked: set[int] = set()
    failed: list[BaseException] = []

    async def run() -> None:
        async with Admin(cluster.kafka) as admin:
            created = await admin.create_topics([NewTopic(topic, -1, -1,
                                                          replica_assignments={0: [1, 2]})])
            assert [t[1] for t in created.topic_errors] == [0], created
            wait_for(lambda: (lambda t: t and t["partitions"][0]["leader"] == 1
                              and sorted(t["partitions"][0]["isr"]) == [1, 2])(
                topic_state(cluster, topic)), "aio-moved led by 1 with ISR [1, 2]")
            stop = asyncio.Event()
            writer = asyncio.create_task(_produce_until(cluster.kafka, topic, stop, acked,
                                                        failed))
            while len(acked) < 200:
                assert not writer.done(), writer
                await asyncio.sleep(0.1)
            answer = await admin._client.send(
                admin._client.get_random_node(),
                AlterPartitionReassignmentsRequest(30000, [(topic, [(0, [2, 3], {})], {})], {}))
            assert answer.error_code == 0, answer
            assert [(p[0], p[1]) for t in answer.responses for p in t[1]] == [(0, 0)], answer
            for _ in range(600):
                if not await _reassignments(admin):
                    break
                await asyncio.sleep(0.2)
            assert await _reassignments(admin) == []
            moved_at = len(acked)
            while len(acked) < moved_at + 200:
                assert not writer.done(), writer
                await asyncio.sleep(0.1)
            stop.set()
            await writer

            consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka,
                                        auto_offset_reset="earliest", enable_auto_commit=False)
            await consumer.start()
            try:
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                seen: set[int] = set()
                for _ in range(100):
                    batch = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
                    seen.update(int(m.value) for m in batch.get(tp, []))
                    if acked <= seen:
                        break
            finally:
                await consumer.stop()
            lost = acked - seen
            assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
            print(f"{topic}: [1, 2] -> [2, 3] while producing: {len(acked)} acked, "
                  f"{len(failed)} failed, 0 lost")
    asyncio.run(run())

    state = wait_for(lambda: (lambda t: t if t and sorted(t["partitions"][0]["replicas"])
                              == [2, 3] and sorted(t["partitions"][0]["isr"]) == [2, 3]
                              else None)(topic_state(cluster, topic)), "aio-moved on [2, 3]")
    assert state["partitions"][0]["leader"] in (2, 3)
    wait_for(lambda: not list((cluster.data_dir / "broker-1").rglob(f"{topic}-0*")),
             "broker 1's copy removed")
