"""The high watermarks a broker reads at start-up and the ones it checkpoints.

``replication-offset-checkpoint`` (``LogManager``) holds one HW per log. Both hosts
of the replicas, the broker (``replica_manager.py``) and the simulation's broker,
use these two rules, so the simulation checks the product's:

* On load, a log's checkpointed HW (0 when the file has none for it) is clamped to
  ``[log start, LEO]``: the checkpoint is written on a timer, apart from the log, so
  after a crash it may name an offset past a log that lost its unflushed tail, or
  before a start that retention or DeleteRecords moved since.
* A checkpoint holds every log's HW, claimed by a partition or not: a log loaded at
  start-up that no LeaderAndIsr has claimed yet keeps its loaded HW (dropping it
  would make the next start-up of that log begin at HW 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

TP = TypeVar("TP")


class LogBounds(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...


def loaded_high_watermarks(checkpointed: Mapping[TP, int],
                           logs: Mapping[TP, LogBounds]) -> dict[TP, int]:
    """Each log's HW to start from: its checkpointed HW clamped to [log start, LEO]."""
    return {tp: max(log_.log_start_offset, min(checkpointed.get(tp, 0), log_.log_end_offset))
            for tp, log_ in logs.items()}


def high_watermarks_to_checkpoint(loaded: Mapping[TP, int],
                                  partitions: Mapping[TP, int]) -> dict[TP, int]:
    """What to write: the partitions' HWs, and the loaded HWs of logs not claimed yet."""
    return {**loaded, **partitions}
