"""DescribeConfigs of BROKER resources (``broker/kafka/broker_configs.py``) with fakes:
authorization, resource names, key filters. Real clients: tests/cli/test_kafka_configs.py."""

from __future__ import annotations

from types import SimpleNamespace

from tidewater.broker.kafka import apis
from tidewater.broker.kafka.broker_configs import DEFAULT_CONFIG, BrokerConfigEntry
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, DESCRIBE_CONFIGS

ENTRIES = [BrokerConfigEntry("a.b", "1", DEFAULT_CONFIG, 3, "1"),
           BrokerConfigEntry("c.d", "x", 4, 2, "y")]


class Acls:
    def __init__(self, *grants):
        self.grants = set(grants)

    def allows(self, operation, resource_type, name):
        return (operation, resource_type, name) in self.grants


def services(connection=None):
    cache = SimpleNamespace(topics=lambda: [], topic_configs=lambda name: {})
    return apis.Services(replica_manager=SimpleNamespace(broker_id=7), metadata_cache=cache,
                         controller=None, listener_name="KAFKA", connection=connection,
                         broker_configs=lambda: ENTRIES)


async def describe(s, *resources, synonyms=False):
    body = SimpleNamespace(include_synonyms=synonyms, resources=[
        SimpleNamespace(resource_type=t, resource_name=n, configuration_keys=keys)
        for t, n, keys in resources])
    answer = await (await apis.on_describe_configs(s, SimpleNamespace(api_version=4), body))
    return [(r["error_code"], [c["name"] for c in r["configs"]]) for r in answer["results"]]


async def test_this_broker_the_cluster_default_and_others():
    assert await describe(services(), (4, "7", None), (4, "7", ("c.d", "z")), (4, "", None),
                          (4, "8", None), (4, "x", None), (8, "7", None)) == [
        (pb.NONE, ["a.b", "c.d"]), (pb.NONE, ["c.d"]), (pb.NONE, []),
        (pb.INVALID_REQUEST, []), (pb.INVALID_REQUEST, []), (pb.NONE, [])]


async def test_synonyms_list_the_default_a_static_value_overrides():
    body = SimpleNamespace(include_synonyms=True, resources=[
        SimpleNamespace(resource_type=4, resource_name="7", configuration_keys=None)])
    answer = await (await apis.on_describe_configs(services(), SimpleNamespace(api_version=4),
                                                   body))
    by_name = {c["name"]: c for c in answer["results"][0]["configs"]}
    assert [(s["value"], s["source"]) for s in by_name["c.d"]["synonyms"]] == [
        ("x", 4), ("y", DEFAULT_CONFIG)]
    assert [(s["value"], s["source"]) for s in by_name["a.b"]["synonyms"]] == [
        ("1", DEFAULT_CONFIG)]
    assert all(c["read_only"] for c in by_name.values())


async def test_describing_a_broker_needs_describe_configs_on_the_cluster():
    assert await describe(services(Acls()), (4, "7", None)) == [
        (pb.CLUSTER_AUTHORIZATION_FAILED, [])]
    allowed = Acls((DESCRIBE_CONFIGS, CLUSTER, "kafka-cluster"))
    assert await describe(services(allowed), (4, "7", None)) == [(pb.NONE, ["a.b", "c.d"])]
