"""The broker's DescribeTopicConfigs and ListTransactions (the console's calls): what each
answers, and what an authorizer leaves out."""

import asyncio
from types import SimpleNamespace

from tidewater.broker.coordinators import Coordinators
from tidewater.broker.servicers.grpc_server import BrokerServicer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import DESCRIBE, DESCRIBE_CONFIGS, TOPIC, TRANSACTIONAL_ID


class Security:
    """Secured; allows only the (operation, resource type, name) triples it is given."""

    secured = True

    def __init__(self, allowed: set[tuple[int, int, str]]):
        self.allowed = allowed

    async def authenticate_grpc(self, context):
        return "alice"

    def allows(self, session, operation, resource_type, name):
        return (operation, resource_type, name) in self.allowed


def txn(producer_id: int, state: str, partitions, producer_epoch: int = 0):
    return SimpleNamespace(state=SimpleNamespace(kafka_name=state), current=SimpleNamespace(
        producer_id=producer_id, producer_epoch=producer_epoch, timeout_ms=60000,
        start_ms=1000, partitions=frozenset(partitions)))


def servicer(security=None, txns=None) -> BrokerServicer:
    metrics = SimpleNamespace(request_latency=SimpleNamespace(
        labels=lambda name: SimpleNamespace(observe=lambda seconds: None)))
    cache = SimpleNamespace(topics=lambda: ["a", "b"])
    coordinator = SimpleNamespace(loading=lambda: False,
                                  loaded_states=lambda: [SimpleNamespace(txns=txns or {})])
    s = BrokerServicer(SimpleNamespace(broker_id=7), cache, metrics, "EXTERNAL",
                       security=security, coordinators=Coordinators.of(None, coordinator),
                       topic_configs=lambda topic: [("retention.ms", "7200000", 4),
                                                    ("cleanup.policy", "delete", 5)])
    return s


def describe(s: BrokerServicer, *topics: str) -> pb.DescribeTopicConfigsResponse:
    return asyncio.run(s.DescribeTopicConfigs(
        pb.DescribeTopicConfigsRequest(topics=list(topics)), None))


def test_topic_configs_with_their_sources_and_an_unknown_topic():
    answer = describe(servicer(), "a", "gone")
    a, gone = answer.topics
    assert [(c.name, c.value, c.source) for c in a.configs] == [
        ("retention.ms", "7200000", 4), ("cleanup.policy", "delete", 5)]
    assert gone.error_code == pb.UNKNOWN_TOPIC_OR_PARTITION and not gone.configs


def test_topic_configs_need_describe_configs_on_the_topic():
    answer = describe(servicer(Security({(DESCRIBE_CONFIGS, TOPIC, "a")})), "a", "b")
    a, b = answer.topics
    assert a.error_code == pb.NONE and a.configs
    assert b.error_code == pb.TOPIC_AUTHORIZATION_FAILED and not b.configs


def test_transactions_listed_with_their_partitions_and_only_those_described():
    txns = {"open": txn(5, "Ongoing", [("a", 1), ("a", 0)]),
            "hidden": txn(6, "Ongoing", [("b", 0)]),
            "fresh": txn(8, "Empty", [], producer_epoch=-1)}  # not durable yet: left out
    s = servicer(Security({(DESCRIBE, TRANSACTIONAL_ID, "open"),
                           (DESCRIBE, TRANSACTIONAL_ID, "fresh")}), txns)
    answer = asyncio.run(s.ListTransactions(pb.ListTransactionsRequest(), None))
    assert answer.broker_id == 7 and answer.error_code == pb.NONE
    [t] = answer.transactions
    assert (t.transactional_id, t.state, t.producer_id, t.timeout_ms, t.start_timestamp_ms) == (
        "open", "Ongoing", 5, 60000, 1000)
    assert [(p.topic, p.partition) for p in t.partitions] == [("a", 0), ("a", 1)]
