"""Kafka listener connection limits (``broker.kafka.connection_quotas``) and what a size
prefix alone costs (``framing``)."""

from __future__ import annotations

import pytest

from tests.unit.test_kafka_listener import Listening, fetch_values
from tidewater.broker.clock import mono_ms
from tidewater.broker.config import BrokerConfig, ConfigError
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.connection_quotas import (
    REFUSED_PER_IP,
    REFUSED_RATE,
    REFUSED_TOTAL,
    ConnectionLimits,
    ConnectionQuotas,
    parse_per_ip_overrides,
)
from tidewater.broker.kafka.framing import SCRATCH_BYTES, FrameConnection
from tidewater.proto.errors import InvariantViolation

pytestmark = pytest.mark.timeout(30)


def test_per_ip_limit_and_its_overrides():
    quotas = ConnectionQuotas(ConnectionLimits(
        connections_per_ip_max=2, connections_per_ip_overrides={"10.0.0.9": 0,
                                                                "::1": 3}), now_ms=0)
    assert [quotas.admit("10.0.0.1", 0) for _ in range(3)] == [None, None, REFUSED_PER_IP]
    assert quotas.admit("10.0.0.9", 0) == REFUSED_PER_IP
    assert [quotas.admit("::1", 0) for _ in range(4)] == [None, None, None, REFUSED_PER_IP]
    quotas.release("10.0.0.1")
    assert quotas.admit("10.0.0.1", 0) is None
    assert quotas.total == 5 and quotas.by_host == {"10.0.0.1": 2, "::1": 3}


def test_total_limit_counts_every_address():
    quotas = ConnectionQuotas(ConnectionLimits(connections_max=2), now_ms=0)
    assert [quotas.admit(h, 0) for h in ("a", "b", "c")] == [None, None, REFUSED_TOTAL]
    quotas.release("a")
    assert quotas.admit("c", 0) is None


def test_creation_rate_is_a_bucket_of_one_seconds_worth():
    quotas = ConnectionQuotas(ConnectionLimits(connection_creation_rate_max=4), now_ms=0)
    assert [quotas.admit("a", 0) for _ in range(5)] == [None] * 4 + [REFUSED_RATE]
    assert quotas.admit("a", 100) == REFUSED_RATE  # 0.4 of a token back
    assert quotas.admit("a", 250) is None  # one token after 250 ms
    assert quotas.admit("a", 10_000) is None  # the bucket never holds more than 4
    assert [quotas.admit("a", 10_000) for _ in range(4)] == [None] * 3 + [REFUSED_RATE]


def test_refused_connections_are_not_counted_and_a_double_release_is_a_bug():
    quotas = ConnectionQuotas(ConnectionLimits(connections_per_ip_max=1), now_ms=0)
    assert quotas.admit("a", 0) is None
    assert quotas.admit("a", 0) == REFUSED_PER_IP
    quotas.release("a")
    with pytest.raises(InvariantViolation):
        quotas.release("a")


def test_settings_use_kafkas_names_and_defaults(tmp_path):
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("x", 1),
                          data_dir=tmp_path)
    limits = config.connection_limits
    assert (limits.connections_max, limits.connections_per_ip_max, limits.idle_ms,
            limits.connection_creation_rate_max) == (2**31 - 1, 2**31 - 1, 600_000, 2**31 - 1)
    assert config.security.failed_authentication_delay_ms == 100
    config.apply_settings({"max.connections": "10", "max.connections.per.ip": "3",
                           "max.connections.per.ip.overrides": "127.0.0.2:1, [::1]:7",
                           "max.connection.creation.rate": "5",
                           "connections.max.idle.ms": "1500"})
    limits = config.connection_limits
    assert limits.per_ip_max("127.0.0.2") == 1 and limits.per_ip_max("::1") == 7
    assert limits.per_ip_max("127.0.0.1") == 3 and limits.idle_ms == 1500
    with pytest.raises(ConfigError, match="host:count"):
        config.apply_settings({"max.connections.per.ip.overrides": "127.0.0.2"})
    with pytest.raises(ConfigError, match="connections.max.idle.ms"):
        config.apply_settings({"max.connections.per.ip.overrides": "",
                               "connections.max.idle.ms": "0"})
    assert parse_per_ip_overrides("") == {}


class _Transport:
    def get_extra_info(self, name, default=None):
        return default

    def pause_reading(self):
        pass


def test_a_size_prefix_alone_costs_the_scratch_buffer_not_the_frame():
    conn = FrameConnection(lambda c: None, frame_bytes_max=100 << 20)
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    prefix = (100 << 20).to_bytes(4, "big") + b"x"
    buffer = conn.get_buffer(-1)
    buffer[:len(prefix)] = prefix
    conn.buffer_updated(len(prefix))
    assert len(conn.get_buffer(-1)) <= SCRATCH_BYTES  # not 100 MiB, not 1 MiB


async def test_a_long_poll_is_not_idle_but_silence_is(tmp_path):
    """connections.max.idle.ms counts time without a complete request or an answer; a
    request in flight (a fetch long-polling an empty log past the limit) is not idle."""
    listening = Listening(tmp_path)
    listening.quotas = ConnectionQuotas(ConnectionLimits(idle_ms=300), mono_ms())
    async with listening:
        polling = await listening.connect()
        silent = await listening.connect()
        answer = await polling.call(apis.FETCH, 12, fetch_values(0, max_wait_ms=1500))
        assert answer.error_code == 0  # answered after 1.5 s, not closed at 0.3 s
        assert await silent.closed_by_server()
        assert await polling.closed_by_server()  # idle itself once answered
        assert listening.quotas.total == 0  # both released
