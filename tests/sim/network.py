"""An in-memory network: seeded loss, delay (hence reordering) and partitions.

Nodes are ints (brokers 1..n, the controller ``CONTROLLER``, the admin client 99,
producers 100+).
A message sent at ``now`` is delivered at ``now + delay`` unless it is lost,
or a partition separates the two nodes at send time or at delivery time.
Delivery order is (time, send sequence), so a run is a pure function of the
seed.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

CONTROLLER = 0


@dataclass(order=True)
class Envelope:
    deliver_ms: int
    sequence: int
    src: int = field(compare=False)
    dst: int = field(compare=False)
    message: Any = field(compare=False)


class Network:
    def __init__(self, rng: random.Random, *, loss_probability: float, delay_ms_min: int,
                 delay_ms_max: int):
        self.rng = rng
        self.loss_probability = loss_probability
        self.delay_ms_min = delay_ms_min
        self.delay_ms_max = delay_ms_max
        self._queue: list[Envelope] = []
        self._sequence = 0
        # (a, b) pairs that cannot talk, both directions, until the given time.
        self._cut_until_ms: dict[tuple[int, int], int] = {}
        # (src, dst) links that drop what src sends dst (an asymmetric partition).
        self._one_way_until_ms: dict[tuple[int, int], int] = {}
        self.sent = self.dropped = 0

    def send(self, src: int, dst: int, message: Any, now_ms: int) -> None:
        self.sent += 1
        if self.is_cut(src, dst, now_ms) or self.rng.random() < self.loss_probability:
            self.dropped += 1
            return
        delay = self.rng.randint(self.delay_ms_min, self.delay_ms_max)
        self._sequence += 1
        heapq.heappush(self._queue, Envelope(now_ms + delay, self._sequence, src, dst, message))

    def deliverable(self, now_ms: int) -> list[Envelope]:
        """Messages due by ``now_ms`` in delivery order (cut links drop them)."""
        due = []
        while self._queue and self._queue[0].deliver_ms <= now_ms:
            envelope = heapq.heappop(self._queue)
            if self.is_cut(envelope.src, envelope.dst, now_ms):
                self.dropped += 1
                continue
            due.append(envelope)
        return due

    def cut(self, a: int, b: int, until_ms: int) -> None:
        key = (min(a, b), max(a, b))
        self._cut_until_ms[key] = max(self._cut_until_ms.get(key, 0), until_ms)

    def cut_one_way(self, src: int, dst: int, until_ms: int) -> None:
        """What ``src`` sends ``dst`` is lost until ``until_ms``; the other way works."""
        key = (src, dst)
        self._one_way_until_ms[key] = max(self._one_way_until_ms.get(key, 0), until_ms)

    def isolate(self, node: int, others: list[int], until_ms: int) -> None:
        for other in others:
            if other != node:
                self.cut(node, other, until_ms)

    def is_cut(self, src: int, dst: int, now_ms: int) -> bool:
        return (self._cut_until_ms.get((min(src, dst), max(src, dst)), 0) > now_ms
                or (bool(self._one_way_until_ms)
                    and self._one_way_until_ms.get((src, dst), 0) > now_ms))

    def heal_all(self) -> None:
        self._cut_until_ms.clear()
        self._one_way_until_ms.clear()
