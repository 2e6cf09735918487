"""The follower replication throttle's rules (``broker/following/throttle.py``)."""

import pytest

from tidewater.broker.following.throttle import ReplicationQuota, follower_rate, is_throttled

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("listed, partition, broker, expected", [
    ("*", 3, 7, True),
    ("0:4, 1:5", 0, 4, True),
    ("0:4,1:5", 1, 5, True),
    ("0:4,1:5", 0, 5, False),
    ("10:4", 1, 4, False),
    ("", 0, 4, False),
])
def test_which_replicas_are_throttled(listed, partition, broker, expected):
    assert is_throttled(listed, partition, broker) is expected


def test_the_brokers_own_rate_wins_over_the_cluster_default_and_unset_is_none():
    assert follower_rate({}, 1) is None
    assert follower_rate({"": {"follower.replication.throttled.rate": "1000"}}, 1) == 1000
    assert follower_rate({"": {"follower.replication.throttled.rate": "1000"},
                          "1": {"follower.replication.throttled.rate": "50"}}, 1) == 50
    assert follower_rate({"2": {"follower.replication.throttled.rate": "50"}}, 1) is None
    assert follower_rate({"1": {"follower.replication.throttled.rate": "0"}}, 1) is None


def test_an_unlimited_quota_never_delays():
    quota = ReplicationQuota()
    quota.record(10**9, 0)
    assert quota.delay_ms(0) == 0


def test_the_bucket_holds_the_long_term_rate():
    """Fetch whenever allowed, 40 KB an answer, for 10 s at 100 KB/s: at most the rate
    times the time plus one second's burst and one answer."""
    quota = ReplicationQuota(100_000)
    fetched, now = 0, 0
    while now < 10_000:
        delay = quota.delay_ms(now)
        if delay:
            now += delay
            continue
        quota.record(40_000, now)
        fetched += 40_000
        now += 5
    assert 10 * 100_000 <= fetched <= 11 * 100_000 + 40_000, fetched


def test_overdrawing_waits_for_the_credit_to_come_back():
    quota = ReplicationQuota(1000)
    quota.record(3000, 0)  # one second's credit, then 2000 bytes over
    assert quota.delay_ms(0) == 2001
    assert quota.delay_ms(1000) == 1001
    assert quota.delay_ms(2001) == 0
    quota.set_rate(None)
    assert quota.delay_ms(0) == 0
