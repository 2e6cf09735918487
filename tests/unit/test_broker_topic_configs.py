"""A LeaderAndIsr whose topic configs the broker cannot take: INVALID_CONFIG for that partition,
an ERROR line, and nothing hosted (issue 14, bug 7). The controller refuses such configs at
CreateTopics with the same parser (tidewater.proto.topic_config); this is the broker's guard
for a controller that did not."""

from __future__ import annotations

import logging

import pytest

from tests.unit.test_broker_replica_manager import TP, lai, make_manager
from tidewater.proto import tidewater_pb2 as pb


@pytest.mark.parametrize("configs", [
    {"segment.bytes": "3000000000"},
    {"retention.ms": "99999999999999999999"},
    {"min.insync.replicas": "two"},  # was silently replaced by the broker's default
    {"unclean.leader.election.enable": "maybe"},
    {"cleanup.policy": "shred"},
    {"min.cleanable.dirty.ratio": "2"},
])
async def test_leader_and_isr_with_configs_the_broker_refuses(tmp_path, caplog, configs):
    rm, _ = make_manager(tmp_path)
    try:
        with caplog.at_level(logging.ERROR, logger="tidewater.broker.replicas.replica_manager"):
            response = await rm.leader_and_isr(lai(isr=(1,), configs=configs))
        [item] = response.partitions
        [name] = configs
        assert response.error_code == pb.NONE
        assert item.error_code == pb.INVALID_CONFIG and name in item.error_message
        assert TP not in rm.partitions
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert errors and name in errors[0].getMessage() and "orders-0" in errors[0].getMessage()
    finally:
        await rm.stop()


async def test_valid_configs_are_still_hosted(tmp_path):
    rm, _ = make_manager(tmp_path)
    try:
        response = await rm.leader_and_isr(lai(isr=(1,), configs={
            "segment.bytes": "2147483647", "retention.ms": "-1", "min.insync.replicas": "1",
            "unclean.leader.election.enable": "false", "cleanup.policy": "compact,delete",
            "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.1"}))
        assert response.partitions[0].error_code == pb.NONE
        config = rm.partitions[TP].log.config
        assert config.segment_bytes == 2147483647
        assert (config.cleanup_policy, config.delete_retention_ms) == ("compact,delete", 1000)
        assert config.min_cleanable_dirty_ratio == 0.1
    finally:
        await rm.stop()


async def test_a_compacted_topic_refuses_records_without_a_key(tmp_path):
    from tests.unit.test_broker_replica_manager import produce
    from tidewater.proto.records import encode_batch

    rm, _ = make_manager(tmp_path)
    try:
        await rm.leader_and_isr(lai(isr=(1,), configs={"cleanup.policy": "compact"}))
        out = await rm.produce(produce(records=encode_batch([(b"k", b"v"), (None, b"x")])))
        [result] = out.partitions
        assert result.error_code == pb.INVALID_RECORD and "without key" in result.error_message
        # KIP-467: the keyless record named by its index in the batch, Kafka's message.
        assert [(e.batch_index, e.message) for e in result.record_errors] == [
            (1, f"Compacted topic cannot accept message without key in topic partition "
                f"{TP[0]}-{TP[1]}.")]
        assert rm.partitions[TP].log.log_end_offset == 0  # nothing of the batch written
        out = await rm.produce(produce(records=encode_batch([(b"k", b"v"), (b"k", None)])))
        assert out.partitions[0].error_code == pb.NONE  # a tombstone has a key
        assert rm.partitions[TP].log.log_end_offset == 2
    finally:
        await rm.stop()


def test_kafka_broker_level_log_names_set_topic_defaults_and_are_described():
    from pathlib import Path

    from tidewater.broker.config import BrokerConfig
    from tidewater.broker.kafka.broker_configs import (
        DEFAULT_CONFIG,
        STATIC_BROKER_CONFIG,
        broker_config_entries,
    )
    from tidewater.proto.topic_config import LogConfig
    config = BrokerConfig(broker_id=2, listen=("127.0.0.1", 1), controller=("127.0.0.1", 2),
                          data_dir=Path("x"))
    config.apply_settings({"log.retention.ms": "1000", "segment.bytes": "4096",
                           "auto.create.topics.enable": "false"})
    assert config.topic_defaults == {"retention.ms": "1000", "segment.bytes": "4096"}
    assert config.auto_create_topics_enable is False
    entries = {e.name: e for e in broker_config_entries(
        config, LogConfig.from_configs(config.log_config_overrides()))}
    assert (entries["log.retention.ms"].value, entries["log.retention.ms"].source,
            entries["log.retention.ms"].default) == ("1000", STATIC_BROKER_CONFIG,
                                                     str(7 * 86_400_000))
    assert entries["log.segment.bytes"].source == STATIC_BROKER_CONFIG  # the topic name
    assert (entries["auto.create.topics.enable"].value,
            entries["auto.create.topics.enable"].source) == ("false", STATIC_BROKER_CONFIG)
    assert entries["log.roll.ms"].source == DEFAULT_CONFIG
    assert entries["broker.id"].value == "2"


async def test_dynamic_broker_configs_and_removed_topic_configs_reach_hosted_logs(tmp_path):
    """AlterConfigs at run time: a dynamic broker default (UpdateMetadata) re-applies every
    hosted log's config; a topic whose configs were all removed gets the defaults back."""
    from tests.unit.test_broker_replica_manager import CLUSTER_ID, TOPIC_ID

    rm, _ = make_manager(tmp_path)
    try:
        await rm.leader_and_isr(lai(isr=(1,), configs={"retention.ms": "1000"}))
        assert rm.partitions[TP].log.config.retention_ms == 1000

        def snapshot(**broker_configs):
            return pb.UpdateMetadataRequest(
                controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=10,
                partitions=[pb.PartitionState(topic=TP.topic, partition=TP.partition, leader=1,
                                              replicas=[1, 2], isr=[1], topic_id=TOPIC_ID)],
                topics=[pb.TopicConfig(name=TP.topic, configs={"retention.ms": "1000"})],
                broker_configs=[pb.BrokerConfigOverride(resource_name=name, configs=configs)
                                for name, configs in broker_configs.items()])
        await rm.update_metadata(snapshot(**{"": {"message.max.bytes": "3000",
                                                  "log.retention.ms": "5"},
                                             "1": {"log.segment.bytes": "1048576"}}))
        config = rm.partitions[TP].log.config
        # the topic's own retention.ms wins; the dynamic defaults fill the rest
        assert (config.retention_ms, config.max_message_bytes, config.segment_bytes) == (
            1000, 3000, 1048576)
        await rm.update_metadata(snapshot())
        assert rm.partitions[TP].log.config.max_message_bytes == 1048588
        # a LeaderAndIsr without configs after one with them: the defaults apply again
        await rm.leader_and_isr(lai(isr=(1,), configs={}))
        assert rm.partitions[TP].log.config.retention_ms == 7 * 24 * 3600 * 1000
    finally:
        await rm.stop()


@pytest.mark.parametrize("version", [7, 8, 11])
def test_kafka_produce_answer_carries_the_record_errors_from_v8(version):
    from tidewater.broker.kafka import apis, codec
    response = pb.ProduceResponse(partitions=[pb.ProducePartitionResponse(
        topic="t", partition=0, error_code=pb.INVALID_RECORD, error_message="rejected",
        base_offset=-1, record_errors=[pb.RecordError(batch_index=3, message="no key")])])
    body = codec.build(codec.response_type(apis.PRODUCE, version), apis.produce_values(response))
    [[partition]] = [t.partition_responses for t in body.responses]
    errors = [(e.batch_index, e.batch_index_error_message)
              for e in getattr(partition, "record_errors", ())]
    assert errors == ([] if version < 8 else [(3, "no key")])
