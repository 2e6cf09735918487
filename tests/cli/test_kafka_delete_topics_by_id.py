"""DeleteTopics v6 (KIP-516, as Kafka 4 advertises it): kafka-python's
``KafkaAdminClient.delete_topics`` given ``uuid.UUID`` topic IDs deletes those topics on a
real cluster; an unknown ID, or the ID of a topic since deleted and created anew under
the same name, is UNKNOWN_TOPIC_ID and deletes nothing."""

from __future__ import annotations

import uuid

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

kafka = pytest.importorskip("kafka")

from kafka.admin import KafkaAdminClient  # noqa: E402

UNKNOWN_TOPIC_ID = 100


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("delete-by-id"), 1)
    client = KafkaAdminClient(bootstrap_servers=c.manifest()["kafka_bootstrap"])
    yield client
    client.close()
    stop_cluster(c)


def created(admin: KafkaAdminClient, name: str) -> uuid.UUID:
    answer = admin.create_topics({name: {"num_partitions": 1, "replication_factor": 1}})
    [topic] = answer["topics"]
    assert topic["error_code"] == 0, topic
    wait_for(lambda: name in admin.list_topics(), f"{name} listed")
    return uuid.UUID(str(topic["topic_id"]))


def results(answer: dict) -> list[tuple]:
    return sorted(((t["name"], str(t["topic_id"]), t["error_code"]) for t in answer["topics"]),
                  key=str)


def test_delete_topics_by_id_and_by_name_in_one_request(admin):
    by_id, by_name = created(admin, "by-id"), created(admin, "by-name")
    answer = admin.delete_topics([by_id, "by-name"])
    assert results(answer) == sorted([("by-id", str(by_id), 0), ("by-name", str(by_name), 0)],
                                     key=str)
    wait_for(lambda: not {"by-id", "by-name"} & set(admin.list_topics()), "both deleted")


def test_an_unknown_or_stale_id_deletes_nothing(admin):
    unknown = uuid.uuid4()
    answer = admin.delete_topics([unknown], raise_errors=False)
    assert results(answer) == [(None, str(unknown), UNKNOWN_TOPIC_ID)]
    first = created(admin, "reborn")
    admin.delete_topics(["reborn"])
    wait_for(lambda: "reborn" not in admin.list_topics(), "reborn deleted")
    second = created(admin, "reborn")
    answer = admin.delete_topics([first], raise_errors=False)
    assert results(answer) == [(None, str(first), UNKNOWN_TOPIC_ID)]
    assert "reborn" in admin.list_topics()
    assert results(admin.delete_topics([second])) == [("reborn", str(second), 0)]
