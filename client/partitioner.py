"""Which partition a produced record goes to.

Keyed records: Kafka's default partitioner, ``toPositive(murmur2(key)) % n``,
so a key lands on the same partition as it would with a Kafka client.
Keyless records: "sticky" partitioning (KIP-480): stay on one partition until
about a batch worth of bytes went there, then move to the next available one,
so batches fill up instead of spreading one record per partition.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidewater.proto.errors import UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from tidewater.client.metadata import PartitionInfo

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2 as a signed int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    end4 = length - (length & 3)
    for i in range(0, end4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end4 + 2] << 16
    if rest >= 2:
        h ^= data[end4 + 1] << 8
    if rest >= 1:
        h ^= data[end4]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's keyed choice: ``(murmur2(key) & 0x7fffffff) % num_partitions``."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Keyed: murmur2. Keyless: one partition per ~``batch_size_bytes`` of records."""

    def __init__(self, batch_size_bytes: int, rng: random.Random | None = None):
        self.batch_size_bytes = batch_size_bytes
        self._rng = rng or random.Random()
        # topic -> [partition, bytes sent there since it was chosen]
        self._sticky: dict[str, list[int]] = {}

    def partition(self, topic: str, key: bytes | None, size_bytes: int, num_partitions: int,
                  available: list[int] | Callable[[], list[int]] | None = None) -> int:
        """Pick a partition; ``available`` are those with a leader (preferred for keyless records),
        or a function giving them, called only when the sticky partition changes."""
        if key is not None:
            return partition_for_key(key, num_partitions)
        state = self._sticky.get(topic)
        if state is None or state[0] >= num_partitions or state[1] >= self.batch_size_bytes:
            state = [self._next(state[0] if state else None, num_partitions, available), 0]
            self._sticky[topic] = state
        state[1] += size_bytes
        return state[0]

    def _next(self, previous: int | None, num_partitions: int,
              available: list[int] | Callable[[], list[int]] | None) -> int:
        if callable(available):
            available = available()
        choices = [p for p in (available or range(num_partitions)) if p < num_partitions]
        if not choices:
            choices = list(range(num_partitions))
        if len(choices) > 1 and previous in choices:
            choices.remove(previous)
        return self._rng.choice(choices)


def choose_partition(topic: str, parts: dict[int, PartitionInfo], partition: int | None, key: bytes | None,
                     value: bytes | None, sticky: StickyPartitioner) -> int:
    """The partition a record goes to: the one asked for, else by key hash, else sticky.

    ``parts`` maps partition number to its metadata (with ``.leader``); an
    asked-for partition the topic lacks is UnknownTopicOrPartitionError.
    """
    if partition is not None:
        if partition not in parts:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} ({len(parts)} partitions)")
        return partition
    if key is not None:
        return partition_for_key(key, len(parts))
    return sticky.partition(
        topic, None, len(value) if value else 0, len(parts),
        lambda: [p for p, info in parts.items() if info.leader >= 0])
