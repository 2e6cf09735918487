"""Client quotas' pure core (``broker.kafka.client_quotas``): Kafka's windowed rate
(for metrics), the precedence of quota configs, and the throttle time KIP-219 answers
(from a token bucket, KIP-599's)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.kafka.client_quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotas,
    QuotaConfigError,
    QuotaEntity,
    TokenBucket,
    WindowedRate,
    precedence,
)

pytestmark = pytest.mark.timeout(60)


def test_rate_counts_at_least_window_num_minus_one_windows():
    rate = WindowedRate()
    rate.record(10_000, now_ms=0)
    # One burst at t=0 is measured over 10 windows of 1 s, not over 0 ms.
    assert rate.span_ms(0) == 10_000
    assert rate.per_second(0) == pytest.approx(1_000)
    assert rate.per_second(500) == pytest.approx(10_000 / 10.5)


def test_rate_forgets_samples_older_than_the_windows():
    rate = WindowedRate()
    rate.record(5_000, now_ms=0)
    rate.record(5_000, now_ms=20_000)
    assert rate.total(20_000) == 5_000
    assert rate.is_idle(40_000)


def test_rate_keeps_window_num_samples_at_most():
    rate = WindowedRate(window_num=3, window_ms=100)
    for t in range(0, 1_000, 100):
        rate.record(1, now_ms=t)
    assert rate.total(950) == 3


def test_throttle_time_is_time_until_the_bucket_refills_to_zero():
    bucket = TokenBucket(burst_ms=1_000)
    bucket.record(500, quota=1_000, now_ms=0)     # starts full: 1,000 of credit
    assert bucket.throttle_time_ms() == 0
    bucket.record(2_500, quota=1_000, now_ms=0)   # 2,000 below zero at 1,000 a second
    assert bucket.throttle_time_ms() == 2_000
    bucket.record(0, quota=1_000, now_ms=2_000)   # waited it out: back at zero
    assert bucket.throttle_time_ms() == 0 and bucket.tokens() == pytest.approx(0)
    # The credit fills to one burst at most, however long the client was quiet.
    bucket.record(0, quota=1_000, now_ms=60_000)
    assert bucket.tokens() == pytest.approx(1_000)


def test_a_charge_says_whether_the_bucket_was_full_before():
    bucket = TokenBucket(burst_ms=1_000)
    assert bucket.record(300, quota=1_000, now_ms=0)          # starts full
    assert not bucket.record(300, quota=1_000, now_ms=100)    # 800 of 1,000
    assert bucket.record(5_000, quota=1_000, now_ms=10_000)   # refilled to the top
    assert not bucket.record(0, quota=1_000, now_ms=11_000)   # 4,000 below zero


def test_throttle_time_bound():
    bucket = TokenBucket()
    bucket.record(20_000, quota=1_000, now_ms=0)
    assert bucket.throttle_time_ms(bound_ms=1_000) == 1_000


def test_precedence_is_kafkas():
    assert [e.path() for e in precedence("alice", "app")] == [
        "/users/alice/clients/app", "/users/alice/clients/<default>", "/users/alice",
        "/users/<default>/clients/app", "/users/<default>/clients/<default>",
        "/users/<default>", "/clients/app", "/clients/<default>"]


def test_most_specific_config_wins_and_says_who_shares_the_rate():
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity(None, DEFAULT), PRODUCER_BYTE_RATE, 100)
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "app") == (100, ("", "app"))
    quotas.set_quota(QuotaEntity("alice", None), PRODUCER_BYTE_RATE, 200)
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "app") == (200, ("alice", ""))
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "bob", "app") == (100, ("", "app"))
    quotas.set_quota(QuotaEntity("alice", "app"), PRODUCER_BYTE_RATE, 300)
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "app") == (300, ("alice", "app"))
    assert quotas.quota_for(CONSUMER_BYTE_RATE, "alice", "app") is None
    quotas.set_quota(QuotaEntity("alice", "app"), PRODUCER_BYTE_RATE, None)
    assert quotas.quota_for(PRODUCER_BYTE_RATE, "alice", "app") == (200, ("alice", ""))


def test_clients_of_a_user_quota_share_one_rate():
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity("alice", None), PRODUCER_BYTE_RATE, 1_000)
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "a", 600, 0).throttle_time_ms == 0
    # a's 600 and b's 1,900 bytes take one credit of 1,000 (a second of 1,000 B/s):
    # 1,500 below zero, 1.5 s to refill.
    decision = quotas.record(PRODUCER_BYTE_RATE, "alice", "b", 1_900, 0)
    assert decision.throttle_time_ms == 1_500
    assert decision.sensor == ("alice", "")
    # An unlimited user is measured, never throttled.
    assert quotas.record(PRODUCER_BYTE_RATE, "bob", "a", 10**9, 0).throttle_time_ms == 0
    assert quotas.throttle_time_ms_total == {(PRODUCER_BYTE_RATE, "alice", ""): 1_500}


def test_request_percentage_throttle_is_bounded_by_one_window():
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity(None, "busy"), REQUEST_PERCENTAGE, 10)
    # 5 s of handler time in one go: 500 percent-seconds against 10 of credit (quota
    # 10%, one second's burst): 49 s to refill, answered as one window.
    decision = quotas.record(REQUEST_PERCENTAGE, "", "busy", 500, 0)
    assert decision.throttle_time_ms == 1_000


def test_unrecord_takes_a_charge_back():
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity(None, "c"), CONSUMER_BYTE_RATE, 100)
    decision = quotas.record(CONSUMER_BYTE_RATE, "", "c", 5_000, 0)
    assert decision.throttle_time_ms > 0 and decision.sensor is not None
    quotas.unrecord(CONSUMER_BYTE_RATE, decision.sensor, 5_000, 0)
    assert quotas.record(CONSUMER_BYTE_RATE, "", "c", 0, 0).throttle_time_ms == 0


@pytest.mark.parametrize("key,value", [("producer_byte_rate", 0), ("producer_byte_rate", -1),
                                       ("producer_byte_rate", float("nan")), ("bogus", 5)])
def test_invalid_quota_is_refused(key, value):
    with pytest.raises(QuotaConfigError):
        ClientQuotas().set_quota(QuotaEntity("u", None), key, value)


def test_entity_names_something():
    with pytest.raises(QuotaConfigError):
        QuotaEntity(None, None)


def test_sensor_limit():
    quotas = ClientQuotas(sensors_max=2)
    for client in "abc":
        quotas.record(PRODUCER_BYTE_RATE, "", client, 1, 0)
    assert len(list(quotas.rates_per_second(0))) == 2
    # Once the first two have gone quiet over the whole window, a new client takes room.
    quotas.record(PRODUCER_BYTE_RATE, "", "d", 1, 100_000)
    assert [c for _, _, c, _ in quotas.rates_per_second(100_000)] == ["d"]


@settings(max_examples=100, deadline=None)
@given(quota=st.integers(100, 100_000),
       sends=st.lists(st.tuples(st.integers(1, 50_000), st.integers(0, 2_000)),
                      min_size=1, max_size=60))
def test_a_client_that_obeys_the_throttle_is_held_near_its_quota(quota, sends):
    """A client that waits out each throttle time before sending again (as KIP-219
    clients do) sends no more than its quota over the time it ran, plus one window's
    burst and the one request that went over (KIP-219: served, then throttled)."""
    quotas = ClientQuotas()
    quotas.set_quota(QuotaEntity(None, "c"), PRODUCER_BYTE_RATE, quota)
    now_ms = 0
    sent = 0
    size_max = 0
    for size, gap_ms in sends:
        size_max = max(size_max, size)
        decision = quotas.record(PRODUCER_BYTE_RATE, "", "c", size, now_ms)
        sent += size
        now_ms += max(gap_ms, decision.throttle_time_ms)
        assert sent <= quota * (now_ms / 1000 + 1) + size_max


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)),
                       min_size=1, max_size=40))
def test_rate_total_is_the_sum_recorded_within_the_windows(values):
    rate = WindowedRate()
    now_ms = 0
    log = []
    for value, gap_ms in values:
        now_ms += gap_ms
        rate.record(value, now_ms)
        log.append((now_ms, value))
    total = rate.total(now_ms)
    assert total <= sum(v for _, v in log)
    # Everything recorded in the last 10 windows is still counted.
    assert total >= sum(v for t, v in log if t > now_ms - 10 * 1_000)
