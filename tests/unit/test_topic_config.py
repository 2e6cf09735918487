"""The one topic config parser (tidewater.proto.topic_config) and both of its users.

Issue 14, bug 7: the controller accepted ``segment.bytes=3000000000`` (any int
above the int32 or int64 range) that every broker then refused. Both now parse
with this module; the property below checks that whatever the controller
accepts, a broker builds its log settings from.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.config import BrokerConfig
from tidewater.controller.config import ControllerConfig
from tidewater.controller.validation import validate_topic_configs as controller_validates
from tidewater.proto.errors import InvalidConfigError
from tidewater.proto.topic_config import (
    INT32_MAX,
    INT64_MAX,
    LOG_CONFIG_NAMES,
    TOPIC_CONFIGS,
    LogConfig,
    min_insync_replicas,
    parse_topic_config,
    validate_topic_configs,
)


@pytest.mark.parametrize("name,raw,value", [
    ("segment.bytes", "2147483647", INT32_MAX),
    ("segment.bytes", "14", 14),
    ("segment.bytes", " 1048576\t", 1 << 20),  # trimmed, as Kafka's ConfigDef does
    ("segment.bytes", "+4096", 4096),  # Java's parseInt takes a sign
    ("segment.ms", "9223372036854775807", INT64_MAX),
    ("retention.ms", "-1", -1),
    ("retention.ms", "99999999999", 99999999999),  # a long, beyond int32
    ("retention.bytes", "-1", -1),
    ("segment.index.bytes", "12", 12),
    ("flush.messages", "1", 1),
    ("flush.ms", "0", 0),
    ("index.interval.bytes", "0", 0),
    ("max.message.bytes", "0", 0),
    ("min.insync.replicas", "2", 2),
    ("unclean.leader.election.enable", "TRUE", True),
    ("unclean.leader.election.enable", "false", False),
    ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
    ("cleanup.policy", "delete", "delete"),
    ("cleanup.policy", "compact", "compact"),
    ("cleanup.policy", " compact, delete ", "compact,delete"),
    ("cleanup.policy", "delete,compact", "delete,compact"),
    ("delete.retention.ms", "0", 0),
    ("delete.retention.ms", "86400000", 86400000),
    ("min.cleanable.dirty.ratio", "0.5", 0.5),
    ("min.cleanable.dirty.ratio", "1", 1.0),
    ("min.cleanable.dirty.ratio", "1e-2", 0.01),
    ("min.compaction.lag.ms", "60000", 60000),
])
def test_valid_values(name, raw, value):
    assert parse_topic_config(name, raw) == value


@pytest.mark.parametrize("name,raw,why", [
    ("segment.bytes", "3000000000", "int range"),  # the example: above int32
    ("segment.bytes", "2147483648", "int range"),
    ("segment.bytes", "13", "[14, 2147483647]"),
    ("retention.ms", "99999999999999999999", "long range"),  # the other example
    ("retention.ms", "9223372036854775808", "long range"),
    ("retention.ms", "-2", "[-1, "),
    ("retention.bytes", "-2", "[-1, "),
    ("segment.ms", "0", "[1, "),
    ("segment.index.bytes", "11", "[12, "),
    ("flush.messages", "0", "[1, "),
    ("max.message.bytes", "-1", "[0, "),
    ("max.message.bytes", "2147483648", "int range"),
    ("index.interval.bytes", "4096.0", "decimal integer"),
    ("segment.bytes", "1e6", "decimal integer"),
    ("segment.bytes", "1_000_000", "decimal integer"),  # Python's int() would take it
    ("segment.bytes", "0x100000", "decimal integer"),
    ("segment.bytes", "\u0661\u0664\u0664", "decimal integer"),  # Arabic-Indic digits
    ("segment.bytes", "", "decimal integer"),
    ("segment.bytes", "ten", "decimal integer"),
    ("min.insync.replicas", "0", "[1, "),
    ("min.insync.replicas", "2147483648", "int range"),
    ("unclean.leader.election.enable", "yes", "true or false"),
    ("message.timestamp.type", "createtime", "one of"),
    ("cleanup.policy", "compacted", "delete, compact"),
    ("cleanup.policy", "", "delete, compact"),
    ("cleanup.policy", "compact;delete", "delete, compact"),
    ("delete.retention.ms", "-1", "[0, "),
    ("min.cleanable.dirty.ratio", "1.5", "[0, 1]"),
    ("min.cleanable.dirty.ratio", "-0.1", "[0, 1]"),
    ("min.cleanable.dirty.ratio", "NaN", "decimal number"),
    ("min.cleanable.dirty.ratio", "half", "decimal number"),
    ("min.compaction.lag.ms", "-5", "[0, "),
])
def test_invalid_values_name_the_config(name, raw, why):
    with pytest.raises(InvalidConfigError) as refused:
        parse_topic_config(name, raw)
    message = str(refused.value)
    assert name in message and why in message, message
    assert refused.value.error_name == "INVALID_CONFIG"


@pytest.mark.parametrize("name", ["no.such.config", "SEGMENT.BYTES",
                                  "message.timestamp.difference.max.ms.x"])
def test_unknown_names_are_refused(name):
    with pytest.raises(InvalidConfigError, match="unknown topic config"):
        validate_topic_configs({name: "1"})


def test_log_config_fields_are_checked_against_the_same_table():
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        LogConfig(segment_bytes=3_000_000_000)
    with pytest.raises(InvalidConfigError, match="retention.ms"):
        LogConfig(retention_ms=1 << 63)
    with pytest.raises(InvalidConfigError, match="message.timestamp.type"):
        LogConfig(message_timestamp_type="Whenever")
    assert LogConfig(flush_messages=None, flush_ms=None).flush_ms is None
    never = LogConfig.from_configs({"flush.messages": str(INT64_MAX)})
    assert never.flush_messages is None and LogConfig.from_configs(never.to_configs()) == never
    with pytest.raises(InvalidConfigError, match="cleanup.policy"):
        LogConfig(cleanup_policy="shred")
    with pytest.raises(InvalidConfigError, match="min.cleanable.dirty.ratio"):
        LogConfig(min_cleanable_dirty_ratio=2.0)


@pytest.mark.parametrize("policy,compact,delete", [
    ("delete", False, True), ("compact", True, False), ("compact,delete", True, True)])
def test_cleanup_policy_says_who_removes_records(policy, compact, delete):
    config = LogConfig.from_configs({"cleanup.policy": policy})
    assert (config.compact, config.delete) == (compact, delete)
    assert LogConfig.from_configs(config.to_configs()) == config


def test_min_insync_replicas():
    assert min_insync_replicas({}, 3) == 3
    assert min_insync_replicas({"min.insync.replicas": " 2 "}, 3) == 2
    with pytest.raises(InvalidConfigError, match="min.insync.replicas"):
        min_insync_replicas({"min.insync.replicas": "abc"}, 3)


def test_the_controller_reads_unclean_election_as_it_validated_it():
    config = ControllerConfig()
    assert config.unclean_allowed({"unclean.leader.election.enable": " TRUE "}) is True
    assert config.unclean_allowed({"unclean.leader.election.enable": "False"}) is False
    assert config.unclean_allowed({}) is False


def test_the_controller_refuses_a_default_that_no_broker_could_take():
    with pytest.raises(InvalidConfigError, match="min.insync.replicas"):
        ControllerConfig().set("min.insync.replicas", str(INT32_MAX + 1))


def test_the_broker_no_longer_ignores_a_malformed_min_insync_replicas():
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("127.0.0.1", 1),
                          data_dir="/tmp/unused")
    with pytest.raises(InvalidConfigError, match="min.insync.replicas"):
        config.min_insync_replicas_for({"min.insync.replicas": "two"})


# ---------------------------------------------------------------- the property

_INTS = st.one_of(st.integers(-3, 20), st.integers(INT32_MAX - 2, INT32_MAX + 2),
                  st.integers(INT64_MAX - 2, INT64_MAX + 2), st.integers(-(1 << 70), 1 << 70))
_RAW = st.one_of(
    _INTS.map(str),
    _INTS.map(lambda n: f" {n} "),
    _INTS.map(lambda n: f"{n:_}"),
    st.sampled_from(["", "true", "FALSE", "yes", "CreateTime", "LogAppendTime", "delete",
                     "compact", "1e3", "0x10", "+7", "-0", "\u0661", "1.0", "delete,delete"]),
    st.text(max_size=6),
)
_NAMES = st.sampled_from(sorted(TOPIC_CONFIGS) + ["no.such.config"])


@settings(max_examples=500, deadline=None)
@given(configs=st.dictionaries(_NAMES, _RAW, max_size=5),
       defaults=st.dictionaries(st.sampled_from(sorted(LOG_CONFIG_NAMES)), _RAW, max_size=3))
def test_what_the_controller_accepts_every_broker_hosts(configs, defaults):
    broker = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("127.0.0.1", 1),
                          data_dir="/tmp/unused")
    try:
        broker.apply_settings(defaults)  # whatever valid defaults a broker runs with
    except Exception:  # invalid defaults: the broker would not start
        broker = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0),
                              controller=("127.0.0.1", 1), data_dir="/tmp/unused")
    try:
        controller_validates(configs)  # CreateTopics' check
    except InvalidConfigError:
        return  # refused with INVALID_CONFIG: never reaches a broker
    # What a broker does with a LeaderAndIsr's configs (replica_manager): none may raise.
    validate_topic_configs(configs)
    LogConfig.from_configs(broker.log_config_overrides(configs))
    broker.min_insync_replicas_for(configs)


@pytest.mark.parametrize("configs", [
    {"compression.type": "zstd", "compression.zstd.level": "-5", "compression.gzip.level": "-1",
     "compression.lz4.level": "17", "preallocate": "TRUE", "segment.jitter.ms": "10",
     "file.delete.delay.ms": "0", "message.timestamp.before.max.ms": "1000",
     "message.timestamp.after.max.ms": str(INT64_MAX), "remote.storage.enable": "false",
     "leader.replication.throttled.replicas": "0:1, 1:2",
     "follower.replication.throttled.replicas": "*", "local.retention.ms": "-2",
     "local.retention.bytes": "-1", "remote.log.copy.disable": "true",
     "remote.log.delete.on.disable": "false"},
    {"leader.replication.throttled.replicas": ""},
])
def test_every_kafka_topic_config_is_accepted(configs):
    validate_topic_configs(configs)
    LogConfig.from_configs(configs)  # the ones without effect leave the log's settings alone


@pytest.mark.parametrize(("name", "raw", "why"), [
    ("compression.type", "brotli", "must be one of"),
    ("compression.type", "ZSTD", "must be one of"),  # Kafka's ValidString is exact
    ("compression.gzip.level", "0", "or one of -1"),
    ("compression.lz4.level", "18", "[1, 17]"),
    ("compression.zstd.level", "23", "[-131072, 22]"),
    ("leader.replication.throttled.replicas", "0:x", "PARTITION:BROKER"),
    ("follower.replication.throttled.replicas", "*,0:1", "PARTITION:BROKER"),
    ("remote.storage.enable", "true", "not supported"),
    ("local.retention.ms", "-3", "[-2,"),
    ("preallocate", "yes", "true or false"),
])
def test_bad_values_of_the_new_configs_are_refused(name, raw, why):
    with pytest.raises(InvalidConfigError) as refused:
        validate_topic_configs({name: raw})
    assert name in str(refused.value) and why in str(refused.value), refused.value


def test_each_config_without_effect_has_kafkas_default():
    for definition in TOPIC_CONFIGS.values():
        if not definition.effect:
            assert definition.default is not None, definition.name
            definition.parse(definition.default)


@pytest.mark.parametrize("raw", ["0.10.0.0", "0.10.0", "0.8.2", "0.10.1-IV2", "2.8", "2.8.1",
                                 "3.0-IV1", " 3.5 "])
@pytest.mark.timeout(30)
def test_message_format_version_takes_kafka_versions_and_has_no_effect(raw):
    # Kafka 3.x accepts the deprecated config and ignores it (librdkafka's 0092 sets it).
    assert parse_topic_config("message.format.version", raw) == raw.strip()
    assert LogConfig.from_configs({"message.format.version": raw}) == LogConfig()


@pytest.mark.parametrize("raw", ["", "0.10", "4.0", "3.0-IV1.2", "v2", "1.0.x"])
@pytest.mark.timeout(30)
def test_message_format_version_refuses_what_kafka_cannot_parse(raw):
    with pytest.raises(InvalidConfigError, match="message.format.version.*Kafka version"):
        parse_topic_config("message.format.version", raw)


@pytest.mark.parametrize("raw", ["true", "FALSE", " false "])
@pytest.mark.timeout(30)
def test_message_downconversion_enable_is_a_boolean_without_effect(raw):
    # Kafka 3.x's topic config (removed in 4.0): accepted, stored, no effect here.
    assert parse_topic_config("message.downconversion.enable", raw) == (
        raw.strip().lower() == "true")
    assert LogConfig.from_configs({"message.downconversion.enable": raw}) == LogConfig()
    assert TOPIC_CONFIGS["message.downconversion.enable"].default == "true"
    assert not TOPIC_CONFIGS["message.downconversion.enable"].effect


@pytest.mark.parametrize(("name", "raw", "why"), [
    ("message.downconversion.enable", "yes", "true or false"),
    ("message.timestamp.difference.max.ms", "-1", "[0, "),
    ("message.timestamp.difference.max.ms", "1h", "decimal integer"),
])
@pytest.mark.timeout(30)
def test_bad_values_of_the_kafka3_configs_are_refused(name, raw, why):
    with pytest.raises(InvalidConfigError) as refused:
        validate_topic_configs({name: raw})
    assert name in str(refused.value) and why in str(refused.value), refused.value


@pytest.mark.timeout(30)
def test_timestamp_difference_is_the_fallback_of_each_kip937_bound():
    # Kafka 3.6-3.9's LogConfig: a bound left at Long.MAX_VALUE takes the old config's value.
    default = LogConfig()
    assert (default.timestamp_before_bound_ms, default.timestamp_after_bound_ms) == (
        INT64_MAX, INT64_MAX)
    assert not default.leader_rewrite
    old_only = LogConfig.from_configs({"message.timestamp.difference.max.ms": "1000"})
    assert (old_only.timestamp_before_bound_ms, old_only.timestamp_after_bound_ms) == (1000, 1000)
    assert old_only.leader_rewrite
    both = LogConfig.from_configs({"message.timestamp.difference.max.ms": "1000",
                                   "message.timestamp.before.max.ms": "5000"})
    assert (both.timestamp_before_bound_ms, both.timestamp_after_bound_ms) == (5000, 1000)
    assert LogConfig.from_configs(both.to_configs()) == both


def test_from_configs_validates_once_and_keeps_its_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart's LeaderAndIsr reads every partition's configs (issue 30): one LogConfig
    made and validated per call, not a default one besides; the base's values carry over
    and the defaults shared between calls stay the defaults."""
    base = LogConfig.from_configs({"retention.ms": "5", "flush.ms": str(INT64_MAX)})
    validated: list[LogConfig] = []
    real = LogConfig.validate
    monkeypatch.setattr(LogConfig, "validate", lambda self: (validated.append(self), real(self)))
    changed = LogConfig.from_configs({"segment.bytes": "2000000"}, base=base)
    again = LogConfig.from_configs({"retention.ms": "7"})
    plain = LogConfig.from_configs({})
    assert validated == [changed, again, plain]
    monkeypatch.undo()
    assert changed == dataclasses.replace(base, segment_bytes=2000000)
    assert changed.flush_ms is None and changed.retention_ms == 5
    assert again == dataclasses.replace(LogConfig(), retention_ms=7)
    assert plain == LogConfig()
