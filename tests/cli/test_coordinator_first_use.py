"""A group's first use on a new cluster, through librdkafka's admin client: its offsets
topic is made while the client waits. Answered COORDINATOR_NOT_AVAILABLE at once, the
admin client retries FindCoordinator twice, 100 ms apart, then waits for a broker state
change that never comes; the broker now holds the answer until the coordinator is there."""

from __future__ import annotations

import pytest
from cluster_fixtures import start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def test_librdkafka_admin_commits_offsets_while_the_offsets_topic_is_made(tmp_path):
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka import TopicPartition as Tp
    from confluent_kafka.admin import AdminClient, NewTopic

    # 200 partitions: their logs take the broker well over the admin client's 200 ms.
    c = start_cluster(tmp_path / "cluster", 1, "offsets.topic.num.partitions=200")
    try:
        admin = AdminClient({"bootstrap.servers": c.manifest()["kafka_bootstrap"]})
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(30)
        [altered] = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("first-group", [Tp("orders", 0, 7)])]).values()
        assert [(p.topic, p.offset) for p in altered.result(20).topic_partitions] == \
            [("orders", 7)]
        [listed] = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("first-group")]).values()
        assert [(p.topic, p.partition, p.offset)
                for p in listed.result(20).topic_partitions] == [("orders", 0, 7)]
    finally:
        stop_cluster(c)
