"""The leader's rewrite of a producer's batches: compression.type and KIP-937 bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.proto.batch import TRANSACTIONAL_MASK, iter_batches
from tidewater.proto.compression import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)
from tidewater.proto.control_records import encode_marker_batch
from tidewater.proto.errors import InvalidTimestampError
from tidewater.proto.leader_batches import leader_batches, topic_codec
from tidewater.proto.records import SimpleRecord, decode_records, encode_batch
from tidewater.proto.topic_config import INT64_MAX, LogConfig

pytestmark = pytest.mark.timeout(120)

NOW = 1_800_000_000_000
HOUR = 3_600_000
CODECS = {"uncompressed": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP,
          "snappy": COMPRESSION_SNAPPY, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}

records_st = st.lists(st.builds(
    SimpleRecord,
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=200),
    headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)),
                     max_size=2).map(tuple),
    timestamp_ms=st.integers(NOW - 10 * HOUR, NOW + 10 * HOUR)), min_size=1, max_size=20)


def _headers(buf: bytes) -> list:
    return [header for _, header in iter_batches(buf)]


@settings(max_examples=60, deadline=None)
@given(records=records_st, source=st.sampled_from(sorted(CODECS)),
       target=st.sampled_from(sorted(CODECS)), transactional=st.booleans())
def test_rewrite_keeps_everything_but_the_codec(records, source, target, transactional):
    sent = encode_batch(records, base_offset=7, compression=CODECS[source], producer_id=42,
                        producer_epoch=3, base_sequence=11,
                        attributes=TRANSACTIONAL_MASK if transactional else 0)
    written = leader_batches(sent, LogConfig(compression_type=target), NOW)
    (before,), (after,) = _headers(sent), _headers(written)  # CRC-checked
    assert after.compression == CODECS[target]
    if source == target:
        assert written is sent  # already in the topic's codec: kept byte for byte
    for field in ("base_offset", "last_offset_delta", "base_timestamp", "max_timestamp",
                  "producer_id", "producer_epoch", "base_sequence", "record_count"):
        assert getattr(after, field) == getattr(before, field), field
    assert after.attributes & ~0x07 == before.attributes & ~0x07  # txn bit, timestamp type
    assert list(decode_records(written)) == list(decode_records(sent))


@pytest.mark.parametrize("level", [1, 19, -5])
def test_zstd_level_is_used(level):
    values = [SimpleRecord(b"k", bytes(range(256)) * 40, timestamp_ms=NOW)] * 5
    sent = encode_batch(values, compression=COMPRESSION_GZIP)
    written = leader_batches(sent, LogConfig(compression_type="zstd",
                                             compression_zstd_level=level), NOW)
    assert _headers(written)[0].compression == COMPRESSION_ZSTD
    assert list(decode_records(written)) == list(decode_records(sent))


def test_producer_default_leaves_batches_alone():
    sent = encode_batch([(b"k", b"v")], compression=COMPRESSION_LZ4)
    config = LogConfig()
    assert not config.leader_rewrite
    assert leader_batches(sent, config, NOW) is sent
    assert LogConfig(compression_type="zstd").leader_rewrite
    assert LogConfig(message_timestamp_before_max_ms=HOUR).leader_rewrite
    assert topic_codec("producer") is None and topic_codec("uncompressed") == COMPRESSION_NONE


def test_control_batches_are_neither_rewritten_nor_checked():
    marker = encode_marker_batch(5, 0, committed=True, coordinator_epoch=1,
                                 timestamp_ms=NOW - 10 * 24 * HOUR)
    data = encode_batch([SimpleRecord(b"k", b"v", timestamp_ms=NOW)], compression=COMPRESSION_LZ4)
    sent = marker + data
    config = LogConfig(compression_type="zstd", message_timestamp_before_max_ms=HOUR)
    written = leader_batches(sent, config, NOW)  # the marker is 10 days old
    assert written[:len(marker)] == marker
    with pytest.raises(InvalidTimestampError):  # the data batch is checked
        leader_batches(sent, config, NOW + 2 * HOUR)
    written = leader_batches(sent, LogConfig(compression_type="zstd"), NOW)
    assert written[:len(marker)] == marker
    assert [h.compression for h in _headers(written)] == [COMPRESSION_NONE, COMPRESSION_ZSTD]


@pytest.mark.parametrize(("offset_ms", "refused"), [
    (-HOUR, False), (-HOUR - 1, True), (-2 * HOUR, True), (0, False),
    (2 * HOUR, False), (2 * HOUR + 1, True)])
def test_kip_937_bounds(offset_ms, refused):
    config = LogConfig(message_timestamp_before_max_ms=HOUR,
                       message_timestamp_after_max_ms=2 * HOUR)
    # The out-of-range record is not the first (nor the header's base timestamp).
    sent = encode_batch([SimpleRecord(b"a", b"1", timestamp_ms=NOW),
                         SimpleRecord(b"b", b"2", timestamp_ms=NOW + offset_ms)],
                        base_offset=100)
    if not refused:
        assert leader_batches(sent, config, NOW) is sent
        return
    with pytest.raises(InvalidTimestampError) as e:
        leader_batches(sent, config, NOW)
    assert str(e.value) == (
        f"Timestamp {NOW + offset_ms} of message with offset 101 is out of range. The "
        f"timestamp should be within [{NOW - HOUR}, {NOW + 2 * HOUR}]")


def test_the_deprecated_difference_config_bounds_both_sides():
    config = LogConfig.from_configs({"message.timestamp.difference.max.ms": str(HOUR)})
    sent = encode_batch([SimpleRecord(b"a", b"1", timestamp_ms=NOW - HOUR)])
    assert leader_batches(sent, config, NOW) is sent  # within the bound: as sent
    for offset_ms in (-2 * HOUR, 2 * HOUR):
        late = encode_batch([SimpleRecord(b"a", b"1", timestamp_ms=NOW + offset_ms)])
        with pytest.raises(InvalidTimestampError):
            leader_batches(late, config, NOW)


def test_bounds_do_not_apply_under_log_append_time():
    config = LogConfig(message_timestamp_type="LogAppendTime",
                       message_timestamp_before_max_ms=0, message_timestamp_after_max_ms=0)
    sent = encode_batch([SimpleRecord(b"a", b"1", timestamp_ms=NOW - HOUR)])
    assert leader_batches(sent, config, NOW) is sent


def test_configs_parse_into_the_log_config():
    config = LogConfig.from_configs({
        "compression.type": "gzip", "compression.gzip.level": "9",
        "compression.zstd.level": "-7", "message.timestamp.before.max.ms": "3600000",
        "message.timestamp.after.max.ms": "60000"})
    assert (config.compression_type, config.compression_gzip_level,
            config.compression_zstd_level) == ("gzip", 9, -7)
    assert (config.message_timestamp_before_max_ms,
            config.message_timestamp_after_max_ms) == (HOUR, 60000)
    assert LogConfig.from_configs({"compression.gzip.level": "-1"}).compression_gzip_level == -1
    assert LogConfig().to_configs()["message.timestamp.before.max.ms"] == str(INT64_MAX)


def test_broker_level_names_set_the_topic_defaults():
    from pathlib import Path

    from tidewater.broker.config import BrokerConfig
    from tidewater.broker.kafka.broker_configs import STATIC_BROKER_CONFIG, broker_config_entries
    config = BrokerConfig(broker_id=2, listen=("127.0.0.1", 1), controller=("127.0.0.1", 2),
                          data_dir=Path("x"))
    config.apply_settings({"log.message.timestamp.before.max.ms": "3600000",
                           "log.message.timestamp.after.max.ms": "1000",
                           "compression.type": "zstd", "compression.zstd.level": "9"})
    log_config = LogConfig.from_configs(config.log_config_overrides(
        {"message.timestamp.after.max.ms": "2000"}))  # the topic's own wins
    assert (log_config.message_timestamp_before_max_ms, log_config.message_timestamp_after_max_ms,
            log_config.compression_type, log_config.compression_zstd_level) == (
        HOUR, 2000, "zstd", 9)
    entries = {e.name: e for e in broker_config_entries(
        config, LogConfig.from_configs(config.log_config_overrides()))}
    assert (entries["compression.type"].value, entries["compression.type"].source,
            entries["compression.type"].default) == ("zstd", STATIC_BROKER_CONFIG, "producer")
    assert entries["log.message.timestamp.before.max.ms"].value == "3600000"
    assert entries["log.message.timestamp.difference.max.ms"].value == str(INT64_MAX)
    config.apply_settings({"log.message.timestamp.difference.max.ms": "60000"})
    log_config = LogConfig.from_configs(config.log_config_overrides())
    assert (log_config.timestamp_before_bound_ms, log_config.timestamp_after_bound_ms) == (
        HOUR, 1000)  # both set at the broker: the old name changes neither
    assert LogConfig.from_configs(config.log_config_overrides(
        {"message.timestamp.before.max.ms": str(INT64_MAX)})).timestamp_before_bound_ms == 60000


async def test_dynamic_broker_defaults_reach_hosted_logs(tmp_path):
    from tests.unit.test_broker_replica_manager import CLUSTER_ID, TOPIC_ID, TP, lai, make_manager
    from tidewater.proto import tidewater_pb2 as pb

    rm, _ = make_manager(tmp_path)
    try:
        await rm.leader_and_isr(lai(isr=(1,), configs={}))
        assert not rm.partitions[TP].log.config.leader_rewrite
        await rm.update_metadata(pb.UpdateMetadataRequest(
            controller_epoch=1, cluster_id=CLUSTER_ID, metadata_offset=10,
            partitions=[pb.PartitionState(topic=TP.topic, partition=TP.partition, leader=1,
                                          replicas=[1, 2], isr=[1], topic_id=TOPIC_ID)],
            topics=[pb.TopicConfig(name=TP.topic, configs={})],
            broker_configs=[pb.BrokerConfigOverride(resource_name="", configs={
                "log.message.timestamp.after.max.ms": "5000", "compression.type": "lz4"})]))
        config = rm.partitions[TP].log.config
        assert (config.message_timestamp_after_max_ms, config.compression_type) == (5000, "lz4")
        assert config.leader_rewrite
    finally:
        await rm.stop()
