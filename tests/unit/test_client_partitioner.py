"""Keyed partitioning matches Kafka's murmur2; keyless records stick to a partition per batch."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.client.partitioner import StickyPartitioner, murmur2, partition_for_key

# Values from Kafka's UtilsTest.testMurmur2.
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key,expected", sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key) == expected


def test_partition_for_key_uses_positive_hash():
    # murmur2(b"21") is negative: Kafka masks the sign bit, it does not take abs().
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7


def test_partition_for_key_rejects_zero_partitions():
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)


@settings(max_examples=50, deadline=None)
@given(key=st.binary(max_size=64), n=st.integers(min_value=1, max_value=64))
def test_keyed_choice_is_stable_and_in_range(key, n):
    p = StickyPartitioner(100)
    first = p.partition("t", key, 10, n)
    assert 0 <= first < n
    assert p.partition("t", key, 10, n) == first


def test_keyless_records_stick_until_a_batch_worth_went_there():
    p = StickyPartitioner(batch_size_bytes=100, rng=random.Random(1))
    chosen = [p.partition("t", None, 30, 4) for _ in range(4)]
    # 30+30+30 < 100 stays; the 4th record is added after 90 bytes: still the same partition.
    assert len(set(chosen)) == 1
    nxt = p.partition("t", None, 30, 4)  # 120 bytes went there: move on
    assert nxt != chosen[0]


def test_keyless_prefers_available_partitions():
    p = StickyPartitioner(batch_size_bytes=1, rng=random.Random(2))
    seen = {p.partition("t", None, 5, 6, available=[2, 4]) for _ in range(50)}
    assert seen == {2, 4}


def test_keyless_spreads_over_partitions_over_time():
    p = StickyPartitioner(batch_size_bytes=10, rng=random.Random(3))
    seen = {p.partition("t", None, 10, 3) for _ in range(100)}
    assert seen == {0, 1, 2}
