"""Authorization of DeleteRecords, DescribeLogDirs, OffsetDelete, (Incremental)AlterConfigs,
ElectLeaders, the partition reassignment APIs and the client quota APIs on the Kafka listener
(Kafka's rules, README's ACL table), with fakes: a refused request reaches nothing.
Real clients: tests/cli/test_kafka_delete_records.py, test_kafka_log_dirs.py,
test_kafka_offset_delete.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidewater.broker.coordinators import Coordinators
from tidewater.broker.group.state import OffsetDeleteAnswer
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.config_apis import (
    on_alter_configs,
    on_elect_leaders,
    on_incremental_alter_configs,
)
from tidewater.broker.kafka.group_apis import on_offset_delete
from tidewater.broker.kafka.log_apis import on_delete_records, on_describe_log_dirs
from tidewater.broker.kafka.quota_apis import on_alter_client_quotas, on_describe_client_quotas
from tidewater.broker.kafka.reassign_apis import (
    on_alter_partition_reassignments,
    on_list_partition_reassignments,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_NAME,
    DELETE,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
)

pytestmark = pytest.mark.timeout(30)


class Acls:
    def __init__(self, *grants):
        self.grants = set(grants)

    def allows(self, operation, resource_type, name):
        return (operation, resource_type, name) in self.grants


class Unreachable:
    def __getattr__(self, name):
        raise AssertionError(f"a refused request reached {name}")


class Cache:
    def topics(self):
        return ["t", "u"]

    def partition_state(self, topic, partition):
        return None


def services(*grants):
    return apis.Services(replica_manager=Unreachable(), metadata_cache=Cache(),
                         controller=Unreachable(), listener_name="KAFKA",
                         coordinators=Coordinators.of(Unreachable(), Unreachable()),
                         connection=Acls(*grants))


HEAD = SimpleNamespace(api_version=0)


async def test_delete_records_needs_delete_on_the_topic():
    body = SimpleNamespace(timeout=1000, topics=[SimpleNamespace(
        name="t", partitions=[SimpleNamespace(partition_index=0, offset=5)])])
    answer = await (await on_delete_records(services((DESCRIBE, TOPIC, "t")), HEAD, body))
    assert answer["topics"] == [{"name": "t", "partitions": [
        {"partition_index": 0, "low_watermark": -1,
         "error_code": pb.TOPIC_AUTHORIZATION_FAILED}]}]


async def test_describe_log_dirs_needs_describe_on_the_cluster():
    answer = await (await on_describe_log_dirs(services(), HEAD, SimpleNamespace(topics=None)))
    assert (answer["error_code"], answer["results"]) == (pb.CLUSTER_AUTHORIZATION_FAILED, [])


async def test_offset_delete_needs_delete_on_the_group_and_read_on_each_topic():
    body = SimpleNamespace(group_id="g", topics=[SimpleNamespace(
        name="t", partitions=[SimpleNamespace(partition_index=0)])])
    answer = await (await on_offset_delete(services((READ, TOPIC, "t")), HEAD, body))
    assert (answer["error_code"], answer["topics"]) == (pb.GROUP_AUTHORIZATION_FAILED, [])
    # DELETE on the group, READ on "t" only: "u" is refused per partition and never
    # reaches the coordinator (which still checks the group, as Kafka's).
    body.topics.append(SimpleNamespace(name="u", partitions=[SimpleNamespace(partition_index=1)]))
    coordinator = Coordinator()
    s = services((DELETE, GROUP, "g"), (READ, TOPIC, "t"))
    s.coordinators = Coordinators.of(coordinator, Unreachable())
    answer = await (await on_offset_delete(s, HEAD, body))
    assert coordinator.asked == [("t", 0)]
    assert answer["error_code"] == pb.NONE
    assert {(t["name"], p["partition_index"]): p["error_code"]
            for t in answer["topics"] for p in t["partitions"]} == {
        ("t", 0): pb.NONE, ("u", 1): pb.TOPIC_AUTHORIZATION_FAILED}


class Coordinator:
    """The group coordinator's ``request``: records what reached the group state."""

    asked: list | None = None

    def request(self, group_id, call):
        state = SimpleNamespace(delete_offsets=lambda token, now_ms, group, parts: parts)
        self.asked = call(state, None, 0)

        async def answer():
            return OffsetDeleteAnswer(pb.NONE, {tp: pb.NONE for tp in self.asked})
        return answer()


class Forwarder:
    """The controller forwarder: records the AlterConfigs request that reached it."""

    def __init__(self):
        self.requests = []

    async def AlterConfigs(self, request, context):
        self.requests.append(request)
        return pb.AlterConfigsResponse(results=[pb.ConfigResourceResult(
            resource_type=r.resource_type, resource_name=r.resource_name, error_code=pb.NONE)
            for r in request.resources])


def alterable(resource_type, name, *configs):
    return SimpleNamespace(resource_type=resource_type, resource_name=name, configs=[
        SimpleNamespace(name=n, value=v, config_operation=op) for n, op, v in configs])


async def test_alter_configs_needs_alter_configs_on_the_topic_or_the_cluster():
    forwarder = Forwarder()
    s = services((ALTER_CONFIGS, TOPIC, "t"))
    s.controller = forwarder
    body = SimpleNamespace(validate_only=False, resources=[
        alterable(2, "t", ("retention.ms", 0, "5")), alterable(2, "u", ("retention.ms", 0, "5")),
        alterable(4, "", ("log.retention.ms", 1, None))])
    answer = await (await on_incremental_alter_configs(s, HEAD, body))
    assert [(r["resource_name"], r["error_code"]) for r in answer["responses"]] == [
        ("t", pb.NONE), ("u", pb.TOPIC_AUTHORIZATION_FAILED),
        ("", pb.CLUSTER_AUTHORIZATION_FAILED)]
    [forwarded] = forwarder.requests
    assert forwarded.incremental and [r.resource_name for r in forwarded.resources] == ["t"]
    [alteration] = forwarded.resources[0].alterations
    assert (alteration.name, alteration.operation, alteration.value) == ("retention.ms", 0, "5")
    # the legacy API: a replace, its null values marked as such
    s = services((ALTER_CONFIGS, CLUSTER, CLUSTER_NAME))
    s.controller = forwarder
    body = SimpleNamespace(validate_only=True, resources=[
        SimpleNamespace(resource_type=4, resource_name="1", configs=[
            SimpleNamespace(name="message.max.bytes", value=None)])])
    answer = await (await on_alter_configs(s, HEAD, body))
    assert [r["error_code"] for r in answer["responses"]] == [pb.NONE]
    forwarded = forwarder.requests[-1]
    assert not forwarded.incremental and forwarded.validate_only
    assert forwarded.resources[0].alterations[0].value_null


async def test_elect_leaders_needs_alter_on_the_cluster():
    body = SimpleNamespace(election_type=0, timeout=1000, topic_partitions=[
        SimpleNamespace(topic="t", partitions=[0, 1])])
    answer = await (await on_elect_leaders(services((ALTER_CONFIGS, TOPIC, "t")), HEAD, body))
    assert answer["error_code"] == pb.CLUSTER_AUTHORIZATION_FAILED
    assert [(p["partition_id"], p["error_code"])
            for t in answer["replica_election_results"] for p in t["partition_result"]] == [
        (0, pb.CLUSTER_AUTHORIZATION_FAILED), (1, pb.CLUSTER_AUTHORIZATION_FAILED)]


async def test_client_quota_apis_need_alter_configs_and_describe_configs_on_the_cluster():
    entity = [SimpleNamespace(entity_type="user", entity_name="alice")]
    body = SimpleNamespace(validate_only=False, entries=[SimpleNamespace(
        entity=entity, ops=[SimpleNamespace(key="producer_byte_rate", value=5.0,
                                            remove=False)])])
    # ALTER on the cluster is not ALTER_CONFIGS (Kafka's rule for quotas).
    answer = await (await on_alter_client_quotas(services((ALTER, CLUSTER, CLUSTER_NAME)),
                                                 HEAD, body))
    assert [e["error_code"] for e in answer["entries"]] == [pb.CLUSTER_AUTHORIZATION_FAILED]
    answer = await (await on_describe_client_quotas(
        services((ALTER_CONFIGS, CLUSTER, CLUSTER_NAME)), HEAD,
        SimpleNamespace(strict=False, components=[])))
    assert (answer["error_code"], answer["entries"]) == (pb.CLUSTER_AUTHORIZATION_FAILED, None)


async def test_partition_reassignments_need_alter_and_describe_on_the_cluster():
    """Kafka's rules: AlterPartitionReassignments ALTER on the cluster, the list DESCRIBE;
    refused at the top level, and nothing reaches the controller."""
    alter = SimpleNamespace(timeout=1000, topics=[SimpleNamespace(
        name="t", partitions=[SimpleNamespace(partition_index=0, replicas=(1, 2))])])
    answer = await (await on_alter_partition_reassignments(
        services((DESCRIBE, CLUSTER, CLUSTER_NAME), (ALTER, TOPIC, "t")), HEAD, alter))
    assert (answer["error_code"], answer["responses"]) == (pb.CLUSTER_AUTHORIZATION_FAILED, [])
    listed = await (await on_list_partition_reassignments(
        services((ALTER, CLUSTER, CLUSTER_NAME)), HEAD, SimpleNamespace(timeout=1000,
                                                                         topics=None)))
    assert (listed["error_code"], listed["topics"]) == (pb.CLUSTER_AUTHORIZATION_FAILED, [])
