"""What a replica's decision asks its shell to do: ``Ready``, as etcd's raft hands out.

A ``ReplicaState`` event returns one ``Ready``. The shell (the broker's asyncio
code, or the simulation's fake broker) carries it out in this order:

1. ``persist``, in order: ``AssignEpoch`` (the epoch cache entry, fsynced),
   ``Truncate`` / ``TruncateFully`` (the log), ``AppendFetched`` (append the
   records of the fetch answer being handled, from the log end offset),
   ``IncrementLogStartOffset`` (a follower takes the leader's log start). Nothing
   below may be seen by anyone before these are done. When one fails the shell
   persists no further, carries out the rest of this Ready (it answers an old
   leadership's waits), and then the Ready of ``ReplicaState.on_persist_failure(op)``
   (etcd raft's Advance, for a failure): the core decides what the failure means
   and carries on from the log as it really is.
2. ``fetch``: start following a leader in an epoch (``Follow``) or stop
   (``STOP_FETCHING``).
3. ``alter_partition``: send this AlterPartition to the controller; its
   answer comes back as ``on_alter_partition_answer`` (or ``..._unsure``).
   ``report_corrupt``: tell the controller this replica holds a corrupt batch
   (ReportCorruptReplica); the answer comes back as ``on_corrupt_report_answer``
   (or ``..._unsure``).
4. ``completed``: answer these acks=all waits with these ErrorCodes.
5. wake long-polls: consumers' on ``high_watermark_moved``, followers' on
   ``appended``, both on ``leadership_changed``.
6. ``counters`` (metric names to increment), ``notes`` (INFO log lines),
   ``alarms`` (ERROR log lines: a refused impossible state).

``error``/``error_message`` answer the request that caused the event (a
LeaderAndIsr partition state), ``NONE`` otherwise. ``Ready`` is immutable; the
common outcomes are shared constants, so the hot paths allocate nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

NONE = 0  # ErrorCode NONE (proto.tidewater_pb2.NONE), spelled here to keep this module plain


@dataclass(frozen=True, slots=True)
class AssignEpoch:
    """``leader_epoch_cache.assign(epoch, start_offset)``, fsynced (a new leader's epoch)."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """``log.truncate_to(offset)`` (drops offsets >= ``offset``; epoch cache too).
    ``below_corrupt_batch``: the cut that drops a corrupt batch (the core asks for it again
    if it fails)."""

    offset: int
    below_corrupt_batch: bool = False


@dataclass(frozen=True, slots=True)
class TruncateFully:
    """``log.truncate_fully_and_start_at(start_offset)`` (the leader's log starts past ours)."""

    start_offset: int


@dataclass(frozen=True, slots=True)
class IncrementLogStartOffset:
    """``log.maybe_increment_log_start_offset(offset)``: a follower takes its leader's log
    start (DeleteRecords), which is at most its own HW."""

    offset: int


@dataclass(frozen=True, slots=True)
class AppendFetched:
    """Append the fetched records (from the log end offset on) as a follower."""


APPEND_FETCHED = AppendFetched()
Persist = AssignEpoch | Truncate | TruncateFully | AppendFetched | IncrementLogStartOffset


def describe_persist(op: Persist) -> str:
    """``op`` in words, for log lines."""
    if isinstance(op, AssignEpoch):
        return f"assigning epoch {op.epoch} at {op.start_offset}"
    if isinstance(op, Truncate):
        return f"truncating to {op.offset}" + (
            " (below the corrupt batch)" if op.below_corrupt_batch else "")
    if isinstance(op, TruncateFully):
        return f"truncating fully to start at {op.start_offset}"
    if isinstance(op, IncrementLogStartOffset):
        return f"moving the log start offset to {op.offset}"
    return "appending the fetched records"


@dataclass(frozen=True, slots=True)
class Follow:
    """Fetch from ``leader_id`` in ``leader_epoch`` (a new assignment: truncate first)."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class StopFetching:
    """This replica fetches from nobody now."""


STOP_FETCHING = StopFetching()


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """An ISR change to propose; ``alter_id`` names the proposal in its answer."""

    alter_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    broker_epochs: tuple[int, ...] = ()  # KIP-903, in new_isr's order (-1 not known)


@dataclass(frozen=True, slots=True)
class CorruptReport:
    """This replica holds a batch failing its CRC at ``corrupt_offset``: take it out of the
    ISR (and its leadership). ``report_id`` names the report in its answer."""

    report_id: int
    leader_epoch: int
    partition_epoch: int
    corrupt_offset: int


@dataclass(frozen=True, slots=True)
class Ready:
    persist: tuple[Persist, ...] = ()
    fetch: Follow | StopFetching | None = None
    alter_partition: AlterPartitionRequest | None = None
    completed: tuple[tuple[int, int], ...] = ()  # (waiter id, ErrorCode)
    high_watermark_moved: bool = False
    appended: bool = False
    leadership_changed: bool = False
    counters: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    alarms: tuple[str, ...] = ()
    error: int = NONE
    error_message: str = ""
    report_corrupt: CorruptReport | None = None


EMPTY = Ready()
APPENDED = Ready(appended=True)
APPENDED_HIGH_WATERMARK_MOVED = Ready(appended=True, high_watermark_moved=True)
HIGH_WATERMARK_MOVED = Ready(high_watermark_moved=True)


class ReadyBuilder:
    """Collects one event's outcome; ``build()`` returns a shared constant when it can."""

    __slots__ = ("persist", "fetch", "alter_partition", "completed", "high_watermark_moved",
                 "appended", "leadership_changed", "counters", "notes", "alarms", "error",
                 "error_message", "report_corrupt")

    def __init__(self) -> None:
        self.persist: list[Persist] = []
        self.fetch: Follow | StopFetching | None = None
        self.alter_partition: AlterPartitionRequest | None = None
        self.completed: list[tuple[int, int]] = []
        self.high_watermark_moved = False
        self.appended = False
        self.leadership_changed = False
        self.counters: list[str] = []
        self.notes: list[str] = []
        self.alarms: list[str] = []
        self.error = NONE
        self.error_message = ""
        self.report_corrupt: CorruptReport | None = None

    def refuse(self, error: int, message: str) -> ReadyBuilder:
        self.error, self.error_message = error, message
        return self

    def build(self) -> Ready:
        if not (self.persist or self.fetch or self.alter_partition or self.completed
                or self.leadership_changed or self.counters or self.notes or self.alarms
                or self.error != NONE or self.report_corrupt):
            if self.appended:
                return APPENDED_HIGH_WATERMARK_MOVED if self.high_watermark_moved else APPENDED
            return HIGH_WATERMARK_MOVED if self.high_watermark_moved else EMPTY
        return Ready(tuple(self.persist), self.fetch, self.alter_partition, tuple(self.completed),
                     self.high_watermark_moved, self.appended, self.leadership_changed,
                     tuple(self.counters), tuple(self.notes), tuple(self.alarms), self.error,
                     self.error_message, self.report_corrupt)
