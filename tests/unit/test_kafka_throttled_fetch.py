"""A fetch throttled by consumer_byte_rate is answered with no partitions (KIP-219, as
Kafka's ``getThrottledResponse``), its bytes not charged, and the records come in the
next fetch; an answer larger than the whole bucket is still served (else it could never
be). Raw Fetch v12 frames to a real listener (broker/kafka/server.py)."""

from __future__ import annotations

import pytest

from tests.unit.test_broker_fakes import make_batch
from tests.unit.test_kafka_fetch_session_wire import TOPIC, ManyPartitions, answered, fetch
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.client_quotas import CONSUMER_BYTE_RATE, DEFAULT, QuotaEntity

pytestmark = pytest.mark.timeout(60)

BATCHES = 8
PAYLOAD_BYTES = 600


def produce_one(partition: int = 0) -> dict:
    return {"transactional_id": None, "acks": 1, "timeout": 5000, "topic_data": [
        {"name": TOPIC, "partition_data": [
            {"index": partition, "records": make_batch(1, b"x" * PAYLOAD_BYTES)}]}]}


def one_batch_fetch(offset: int) -> dict:
    """Sessionless (id 0, epoch -1), at most one batch an answer."""
    request = fetch(0, -1, {0: offset})
    request["topics"][0]["partitions"][0]["partition_max_bytes"] = PAYLOAD_BYTES
    return request


async def fetch_all(quota_bytes_per_s: float, tmp_path, batches: int = BATCHES
                    ) -> list[tuple[int, int, int]]:
    """(offset asked, throttle_time ms, record bytes answered) of each fetch until every
    batch came, with ``consumer_byte_rate`` on every client-id."""
    async with ManyPartitions(tmp_path) as listening:
        c = await listening.connect()
        for _ in range(batches):
            await c.call(apis.PRODUCE, 9, produce_one())
        listening.rm.metadata_cache.client_quotas.set_quota(
            QuotaEntity(None, DEFAULT), CONSUMER_BYTE_RATE, quota_bytes_per_s)
        seen: list[tuple[int, int, int]] = []
        offset = 0
        while offset < batches and len(seen) < 4 * batches:
            answer = await c.call(apis.FETCH, 12, one_batch_fetch(offset))
            assert answer.error_code == 0
            throttle_ms = int(answer.throttle_time.total_seconds() * 1000)
            record_bytes = sum(size for _, size in answered(answer).values())
            if record_bytes == 0:
                assert not answer.responses  # no partitions at all, as Kafka's
            seen.append((offset, throttle_ms, record_bytes))
            offset += 1 if record_bytes else 0
        c.close()
        return seen


async def test_a_throttled_fetch_carries_no_records_and_the_next_one_gets_them(tmp_path):
    # A bucket of 2,000 bytes, answers of ~700: two fetches fit, the third is throttled.
    seen = await fetch_all(2_000, tmp_path)
    assert [o for o, _, size in seen if size] == list(range(BATCHES))  # none skipped
    throttled = [(o, size) for o, throttle_ms, size in seen if throttle_ms]
    assert throttled, seen
    assert all(size == 0 for _, size in throttled), seen
    # Each throttled offset is served by a later fetch, unthrottled.
    assert all(size > 0 for _, throttle_ms, size in seen if not throttle_ms), seen


async def test_an_answer_larger_than_the_bucket_is_served(tmp_path):
    # A bucket of 500 bytes, answers of ~700: only ever served from a full bucket, with
    # its throttle; the fetch after it (the bucket not refilled) is throttled, empty.
    seen = await fetch_all(500, tmp_path, batches=3)
    assert [o for o, _, size in seen if size] == list(range(3))
    served = [throttle_ms for _, throttle_ms, size in seen if size]
    assert all(throttle_ms > 0 for throttle_ms in served), seen
    assert any(throttle_ms and not size for _, throttle_ms, size in seen), seen
