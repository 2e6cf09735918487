"""Topic name rules, partition directory names, and LogConfig parsing."""

import pytest

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import (
    TopicPartition,
    log_dir_name,
    parse_log_dir_name,
    validate_topic_name,
)
from tidewater.proto.errors import InvalidConfigError, InvalidTopicError


@pytest.mark.parametrize("name", ["a", "orders", "my.topic_v2-x", "A" * 249, "...", "-", "_-."])
def test_legal_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "A" * 250, "a/b", "../etc", "a b", "tópico",
                                  "a\x00b", "a\\b", "a:b", "a\nb"])
def test_illegal_topic_names_raise_invalid_topic(name):
    with pytest.raises(InvalidTopicError) as info:
        validate_topic_name(name)
    assert info.value.error_name == "INVALID_TOPIC_EXCEPTION"


def test_log_dir_name_validates_before_building_a_path():
    assert log_dir_name(TopicPartition("orders", 3)) == "orders-3"
    with pytest.raises(InvalidTopicError):
        log_dir_name(TopicPartition("..", 0))
    with pytest.raises(InvalidTopicError):
        log_dir_name(TopicPartition("../x", 0))
    with pytest.raises(InvalidTopicError):
        log_dir_name(TopicPartition("ok", -1))


@pytest.mark.parametrize("tp", [TopicPartition("orders", 0), TopicPartition("my-topic", 12),
                                TopicPartition("a-1-2", 7), TopicPartition("x-", 1),
                                TopicPartition("-", 0)])
def test_dir_name_round_trip_splits_on_last_dash(tp):
    assert parse_log_dir_name(log_dir_name(tp)) == tp


@pytest.mark.parametrize("name", ["orders", "orders-", "-3", "orders-x", "orders-01", "orders-+1",
                                  "orders- 1", "orders-1_0", "..-1", "a/b-1", "orders-1.abc-delete",
                                  "orders-٣"])
def test_parse_rejects_what_is_not_a_partition_dir(name):
    with pytest.raises(ValueError):
        parse_log_dir_name(name)


def test_log_config_defaults_are_kafkas():
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.segment_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.index_interval_bytes == 4096
    assert config.flush_messages is None and config.flush_ms is None
    assert config.max_message_bytes == 1048588


def test_log_config_from_kafka_names_overlays_base():
    base = LogConfig(segment_bytes=1000)
    config = LogConfig.from_configs({"retention.bytes": "5000", "flush.messages": "1",
                                     "message.timestamp.type": "LogAppendTime",
                                     "min.insync.replicas": "2"}, base)
    assert config.segment_bytes == 1000
    assert config.retention_bytes == 5000
    assert config.flush_messages == 1
    assert config.log_append_time
    assert LogConfig.from_configs(config.to_configs()) == config
    never = LogConfig.from_configs({"flush.ms": str((1 << 63) - 1)})
    assert never.flush_ms is None


@pytest.mark.parametrize("configs", [{"segment.bytes": "ten"}, {"segment.bytes": "0"},
                                     {"retention.ms": "-2"}, {"flush.messages": "0"},
                                     {"message.timestamp.type": "Whenever"},
                                     {"segment.bytes": "1e6"}, {"no.such.config": "1"},
                                     {"segment.bytes": str(1 << 40)}])
def test_log_config_rejects_bad_values_with_invalid_config(configs):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_configs(configs)
    assert info.value.error_name == "INVALID_CONFIG"
