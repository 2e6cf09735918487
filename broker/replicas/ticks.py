"""Replication ticks: time passing, handed to every replica core that needs it.

``tick_replicas`` is what the broker's replication-tick loop
(``background.py``) and the simulation's brokers both run: every replica gets
``ReplicaState.tick`` and its Ready is carried out. Which of them need time is
the core's decision (a leader: the HW a gone joiner held back, ISR shrinks,
AlterPartition resends, acks=all deadlines; a replica with a corrupt batch: its
handover); the others answer ``EMPTY`` at once, which the carrier skips. A
storage failure carrying one replica's Ready out is that replica's (its core
was told, ``ReadyCarrier``); the others still get their tick.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tidewater.broker.replicas.partition import Partition
from tidewater.broker.replicas.ready_carrier import ReadyCarrier
from tidewater.proto.errors import TidewaterError

log = logging.getLogger("tidewater.broker.replicas.ticks")


def tick_replicas(partitions: Iterable[Partition], carrier: ReadyCarrier, now_ms: int) -> None:
    for partition in list(partitions):
        try:
            carrier.apply(partition, partition.replica.tick(now_ms))
        except TidewaterError as e:
            log.warning("%s: replication tick failed: %s", partition.tp, e)
