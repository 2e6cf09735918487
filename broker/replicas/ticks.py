"""Replication ticks: time passing, handed to every replica core that needs it.

``tick_replicas`` is what the broker's replication-tick loop
(``background.py``) and the simulation's brokers both run: each replica that
needs time (a leader: the HW a gone joiner held back, ISR shrinks,
AlterPartition resends, acks=all deadlines; a replica with a corrupt batch:
its handover) gets ``ReplicaState.tick`` and the Ready is carried out. A
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
        replica = partition.replica
        if replica.leader is None and replica.corrupt_from is None:
            continue
        try:
            carrier.apply(partition, replica.tick(now_ms))
        except TidewaterError as e:
            log.warning("%s: replication tick failed: %s", partition.tp, e)
