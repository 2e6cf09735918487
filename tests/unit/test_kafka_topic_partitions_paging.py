"""DescribeTopicPartitions' paging (``broker/kafka/topic_apis.py``) over a metadata cache."""


import pytest

from tidewater.broker.kafka import codec, topic_apis
from tidewater.broker.kafka.apis import SUPPORTED
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)


class Services:
    listener_name = "KAFKA"

    def __init__(self, hidden=()):
        self.metadata_cache = MetadataCache()
        self.metadata_cache.update(pb.UpdateMetadataRequest(
            controller_epoch=1, brokers=[pb.BrokerRegistration(
                broker_id=1, listeners=[pb.Listener(name="KAFKA", host="h", port=1)])],
            partitions=[pb.PartitionState(topic=t, partition=n, leader=1, replicas=[1],
                                          isr=[1], topic_id=bytes([i + 1]) * 16)
                        for i, (t, count) in enumerate([("a", 3), ("b", 2), ("c", 1)])
                        for n in range(count)]))
        self.hidden = set(hidden)

    def allowed(self, operation, resource_type, name):
        return name not in self.hidden


def request(topics, limit=2000, cursor=None):
    frame = codec.encode_request(75, 0, 1, {"topics": [{"name": t} for t in topics],
                                            "response_partition_limit": limit,
                                            "cursor": cursor})
    _head, body = codec.decode_request(frame[4:], SUPPORTED)
    return body


def pages(s, topics, limit):
    cursor, seen = None, []
    while True:
        answer = topic_apis.describe_topic_partitions(s, request(topics, limit, cursor))
        seen.append([(t["name"], [p["partition_index"] for p in t["partitions"]])
                     for t in answer["topics"]])
        cursor = answer["next_cursor"]
        if cursor is None:
            return seen


def test_every_topic_paged_two_partitions_at_a_time():
    assert pages(Services(), [], 2) == [[("a", [0, 1])], [("a", [2]), ("b", [0])],
                                        [("b", [1]), ("c", [0])]]


def test_named_unknown_and_hidden_topics_and_a_bad_cursor():
    answer = topic_apis.describe_topic_partitions(Services(hidden={"b"}),
                                                  request(["c", "zz", "b"]))
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [
        ("b", pb.TOPIC_AUTHORIZATION_FAILED), ("c", pb.NONE),
        ("zz", pb.UNKNOWN_TOPIC_OR_PARTITION)]
    answer = topic_apis.describe_topic_partitions(
        Services(), request(["a"], cursor={"topic_name": "b", "partition_index": 0}))
    assert [t["error_code"] for t in answer["topics"]] == [pb.INVALID_REQUEST]
    # listing all: a hidden topic is left out, not refused
    all_topics = topic_apis.describe_topic_partitions(Services(hidden={"b"}), request([]))
    assert [t["name"] for t in all_topics["topics"]] == ["a", "c"]
