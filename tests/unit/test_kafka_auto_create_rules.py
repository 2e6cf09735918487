"""Auto-creation's rules in the Kafka APIs (``broker/kafka/auto_create.py``), with fakes:
who may create (Kafka's CREATE on the cluster or the topic), what is never created, and
that one name is sent once while in flight. Real clients: tests/cli/test_kafka_auto_create.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tidewater.broker.kafka import apis
from tidewater.broker.kafka.auto_create import IN_FLIGHT_MAX, AutoTopicCreator
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import CLUSTER, CREATE, DESCRIBE, TOPIC
from tidewater.proto.supervisor import TaskSupervisor

pytestmark = pytest.mark.timeout(30)


class FakeCache:
    def __init__(self, known=()):
        self.known = set(known)

    def topics(self):
        return sorted(self.known)

    def metadata_response(self, names, listener):
        answer = pb.MetadataResponse(cluster_id="c")
        for name in names or sorted(self.known):
            answer.topics.add(name=name, error_code=pb.NONE if name in self.known
                              else pb.UNKNOWN_TOPIC_OR_PARTITION)
        return answer


class FakeController:
    def __init__(self):
        self.requests: list[pb.CreateTopicsRequest] = []
        self.release = asyncio.Event()

    async def CreateTopics(self, request, context):
        self.requests.append(request)
        await self.release.wait()
        return pb.CreateTopicsResponse(topics=[
            pb.TopicResult(name=t.name, error_code=pb.NONE, num_partitions=3,
                           replication_factor=3) for t in request.topics])

    def sent(self):
        return [t.name for r in self.requests for t in r.topics]


class Acls:
    """allows(op, type, name) from a set of (op, type, name) grants."""

    def __init__(self, *grants):
        self.grants = set(grants)

    def allows(self, operation, resource_type, name):
        return (operation, resource_type, name) in self.grants


def services(known=(), enabled=True, connection=None):
    controller = FakeController()
    creator = AutoTopicCreator(controller, TaskSupervisor(on_fatal=pytest.fail),
                               enabled=enabled)
    s = apis.Services(replica_manager=SimpleNamespace(broker_id=1),
                      metadata_cache=FakeCache(known), controller=controller,
                      listener_name="KAFKA", auto_create=creator, connection=connection)
    return s, controller


def metadata_body(*names, allow=True):
    return SimpleNamespace(topics=[SimpleNamespace(name=n) for n in names],
                           allow_auto_topic_creation=allow)


async def errors(s, *names, allow=True, version=12):
    head = SimpleNamespace(api_version=version)
    answer = await (await apis.on_metadata(s, head, metadata_body(*names, allow=allow)))
    await asyncio.sleep(0)  # the creation task starts
    return {t["name"]: t["error_code"] for t in answer["topics"]}


async def test_an_unknown_topic_is_created_once_with_the_controllers_defaults():
    s, controller = services(known=["old"])
    assert await errors(s, "old", "new") == {"old": pb.NONE,
                                             "new": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert await errors(s, "new") == {"new": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == ["new"]  # in flight: not sent again
    [t] = controller.requests[0].topics
    assert (t.num_partitions, t.replication_factor, dict(t.configs)) == (-1, -1, {})
    controller.release.set()
    await asyncio.sleep(0.01)
    assert s.auto_create.in_flight() == frozenset()


async def test_not_created_when_the_client_or_the_broker_says_no():
    s, controller = services()
    assert await errors(s, "t", allow=False) == {"t": pb.UNKNOWN_TOPIC_OR_PARTITION}
    off, off_controller = services(enabled=False)
    assert await errors(off, "t") == {"t": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == off_controller.sent() == []
    # Metadata v0-3 have no field: always allowed.
    head = SimpleNamespace(api_version=3)
    await (await apis.on_metadata(s, head, SimpleNamespace(topics=[SimpleNamespace(name="t")])))
    await asyncio.sleep(0)
    assert controller.sent() == ["t"]


async def test_invalid_and_internal_names_are_never_created():
    s, controller = services()
    assert await errors(s, "a b", "..", "__transaction_state", "__consumer_offsets") == {
        "a b": pb.INVALID_TOPIC_EXCEPTION, "..": pb.INVALID_TOPIC_EXCEPTION,
        "__transaction_state": pb.UNKNOWN_TOPIC_OR_PARTITION,
        "__consumer_offsets": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == []


async def test_creating_needs_create_on_the_cluster_or_the_topic():
    # DESCRIBE without CREATE: TOPIC_AUTHORIZATION_FAILED (Kafka); no DESCRIBE: unknown.
    describe_only = Acls((DESCRIBE, TOPIC, "a"), (DESCRIBE, TOPIC, "b"),
                         (CREATE, TOPIC, "b"))
    s, controller = services(connection=describe_only)
    assert await errors(s, "a", "b", "hidden") == {
        "a": pb.TOPIC_AUTHORIZATION_FAILED, "b": pb.UNKNOWN_TOPIC_OR_PARTITION,
        "hidden": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == ["b"]
    cluster_wide = Acls((DESCRIBE, TOPIC, "a"), (CREATE, CLUSTER, "kafka-cluster"))
    s, controller = services(connection=cluster_wide)
    assert await errors(s, "a") == {"a": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == ["a"]


async def test_a_produce_to_an_unknown_topic_starts_its_creation():
    s, controller = services(known=["old"])

    async def produce_append(request):
        return pb.ProduceResponse(partitions=[pb.ProducePartitionResponse(
            topic=p.topic, partition=p.partition, error_code=pb.UNKNOWN_TOPIC_OR_PARTITION
            if p.topic != "old" else pb.NONE) for p in request.partitions]), []
    s.replica_manager.produce_append = produce_append
    body = SimpleNamespace(acks=1, timeout=1000, transactional_id=None, topic_data=[
        SimpleNamespace(name=name, partition_data=[SimpleNamespace(index=0, records=b"")])
        for name in ("old", "new")])
    answer = await (await apis.on_produce(s, SimpleNamespace(api_version=9), body))
    await asyncio.sleep(0)
    codes = {t["name"]: t["partition_responses"][0]["error_code"] for t in answer["responses"]}
    assert codes == {"old": pb.NONE, "new": pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert controller.sent() == ["new"]


async def test_at_most_in_flight_max_names_wait():
    s, controller = services()
    names = [f"t{i}" for i in range(IN_FLIGHT_MAX + 5)]
    s.auto_create.maybe_create(names)
    assert len(s.auto_create.in_flight()) == IN_FLIGHT_MAX


async def test_a_failed_creation_is_logged_and_asked_again(caplog):
    s, controller = services()

    async def broken(request, context):
        controller.requests.append(request)
        raise RuntimeError("channel closed")
    controller.CreateTopics = broken
    await errors(s, "t")
    await asyncio.sleep(0.01)
    assert "channel closed" in caplog.text and s.auto_create.in_flight() == frozenset()
    await errors(s, "t")  # the client's next Metadata sends it again
    assert controller.sent() == ["t", "t"]
