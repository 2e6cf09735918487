"""DescribeQuorum (key 55) on the Kafka listener: DESCRIBE on the cluster is checked
before anything is forwarded, and only ``__cluster_metadata``-0 is described."""

from __future__ import annotations

import asyncio

import pytest

from tidewater.broker.kafka import codec, quorum_apis
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)


class Forwarder:
    def __init__(self, answer: pb.DescribeQuorumResponse) -> None:
        self.answer = answer
        self.calls = 0

    async def DescribeQuorum(self, request, context):
        self.calls += 1
        return self.answer


class Services:
    def __init__(self, allowed: bool, answer: pb.DescribeQuorumResponse) -> None:
        self.controller = Forwarder(answer)
        self._allowed = allowed
        self.checked: list[tuple[int, int, str]] = []

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        self.checked.append((operation, resource_type, name))
        return self._allowed


def body(topic: str = "__cluster_metadata", partition: int = 0, version: int = 2):
    frame = codec.encode_request(55, version, 1, {
        "topics": [{"topic_name": topic, "partitions": [{"partition_index": partition}]}]})
    return codec.decode_request(frame[4:], quorum_apis.SUPPORTED)


LEADER = pb.DescribeQuorumResponse(
    role="leader", epoch=4, leader_id=2, high_watermark=10,
    voters=[pb.QuorumVoter(id=i, directory_id=f"{i:032x}") for i in (1, 2)],
    replicas=[pb.QuorumReplicaState(replica=pb.QuorumVoter(id=2, directory_id=f"{2:032x}"),
                                    is_voter=True, log_end_offset=10, last_fetch_age_ms=0,
                                    last_caught_up_age_ms=0)],
    endpoints=[pb.QuorumEndpoint(id=1, host="h1", port=91), pb.QuorumEndpoint(id=2, host="h2",
                                                                             port=92)])


def answer(services: Services, request) -> dict:
    head, decoded = request

    async def run():
        return await (await quorum_apis.on_describe_quorum(services, head, decoded))
    return asyncio.run(run())


def test_refused_without_describe_on_the_cluster_and_nothing_forwarded():
    services = Services(False, LEADER)
    got = answer(services, body())
    assert got["error_code"] == pb.CLUSTER_AUTHORIZATION_FAILED
    assert services.controller.calls == 0
    assert services.checked and services.checked[0][1:] == (quorum_apis.CLUSTER,
                                                             quorum_apis.CLUSTER_NAME)


def test_other_partitions_are_unknown_as_in_kafka():
    services = Services(True, LEADER)
    got = answer(services, body(topic="orders"))
    assert got["error_code"] == pb.NONE
    assert got["topics"][0]["partitions"][0]["error_code"] == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert answer(services, body(partition=1))["topics"][0]["partitions"][0]["error_code"] == (
        pb.UNKNOWN_TOPIC_OR_PARTITION)
    assert services.controller.calls == 0


def test_the_leaders_view_with_a_voter_it_has_not_heard_from():
    services = Services(True, LEADER)
    got = answer(services, body())
    [partition] = got["topics"][0]["partitions"]
    assert (partition["leader_id"], partition["leader_epoch"], partition["high_watermark"]) == (
        2, 4, 10)
    by_id = {v["replica_id"]: v for v in partition["current_voters"]}
    assert by_id[2]["log_end_offset"] == 10 and by_id[2]["last_fetch_timestamp"] > 0
    assert by_id[1]["log_end_offset"] == -1 and by_id[1]["last_caught_up_timestamp"] == -1
    assert [n["node_id"] for n in got["nodes"]] == [1, 2]
    # The values encode as every advertised version's response, and decode back.
    for version in (0, 1, 2):
        head, _ = body(version=version)
        frame = codec.encode_response(head, codec.build(codec.response_type(55, version), got))
        _, decoded = codec.decode_response(55, version, frame[4:])
        assert decoded.topics[0].partitions[0].leader_id == 2


def test_a_forwarding_failure_is_a_top_level_error():
    services = Services(True, pb.DescribeQuorumResponse(error_code=pb.NOT_CONTROLLER))
    got = answer(services, body())
    assert got["error_code"] == pb.NOT_CONTROLLER and got["topics"] == []
