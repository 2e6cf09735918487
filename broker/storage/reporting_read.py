"""A read of a ``Log`` that reports the damaged batch it meets (``corruption.py``).

Its own module because it needs ``Log``, and ``log.py`` (through ``segment.py``) needs
``corruption.py``: kept in ``corruption.py`` it closed an import cycle.
"""

from __future__ import annotations

from tidewater.broker.storage.corruption import CorruptBatchError, CorruptionReporter
from tidewater.broker.storage.log import Log, ReadResult


def read_reporting(log_: Log, reporter: CorruptionReporter, how: str, start_offset: int,
                   max_bytes: int, *, max_offset: int | None = None,
                   min_one_batch: bool = True) -> ReadResult:
    """``log_.read(...)`` that reports a damaged batch it meets to ``reporter`` (``how``:
    CONSUMER_READ or FOLLOWER_READ). The result (with ``corrupt``) or the
    CorruptBatchError still reaches the caller, who decides what to do about it."""
    try:
        result = log_.read(start_offset, max_bytes, max_offset=max_offset,
                           min_one_batch=min_one_batch)
    except CorruptBatchError as e:
        reporter.report(e.batch, how)
        raise
    if result.corrupt is not None:
        reporter.report(result.corrupt, how)
    return result
