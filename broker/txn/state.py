"""Kafka's transaction coordinator (TransactionCoordinator, TransactionMetadata) as a pure
state machine: requests and ticks in, a ``Ready`` out. No sockets, no log, no clock.

Theory of operation
-------------------
``TransactionCoordinatorState`` holds every transactional id of one
``__transaction_state`` partition, led by this broker at ``coordinator_epoch`` (the
partition's leader epoch, which every marker carries so a partition leader can refuse
a deposed coordinator's markers). Each call takes ``now_ms`` and an opaque ``token``
(the shell's handle on the request being answered) and returns a ``Ready``:

* ``replies``: ``(token, Answer)`` pairs the shell sends now;
* ``writes``: ``Write``s the shell appends to the partition with acks=all and reports
  with ``on_write_done(write_id, error_code, now_ms)``. A state change is applied in
  memory only once its record is durable; until then the id has a *pending* state and
  every other request for it is answered CONCURRENT_TRANSACTIONS (Kafka's
  ``pendingState``). The answers that waited for a write come in the Ready of
  ``on_write_done``;
* ``markers``: ``MarkerJob``s: COMMIT or ABORT control batches for every partition of
  a transaction in PrepareCommit/PrepareAbort. The shell sends them through the
  ``TxnMarkerSender`` port (``markers.py``), retrying until every partition has its
  marker, then reports ``on_markers_written``; the state then writes
  CompleteCommit/CompleteAbort.

Producer ids: the state allocates none itself. A call that may need a new id
(InitProducerId) is given ``fresh_producer_id``, which the shell took from the
broker's id blocks (``ProducerIdManager``) beforehand; an unused one is simply skipped,
as Kafka skips the rest of a block.

States and transitions (Kafka's; "write" = the record is durable before the change):

================== ==================================== ===================== =========
from               event                                to                    answer
================== ==================================== ===================== =========
(unknown)          InitProducerId                       Empty, new id,        after
                                                        epoch 0 (write)       write
Empty, Complete*   InitProducerId                       Empty, epoch+1 (new   after
                                                        id at exhaustion)     write
Ongoing            InitProducerId (zombie fenced)       PrepareEpochFence     CONCURRENT_
                                                        (pending) then        TRANSACTIONS
                                                        PrepareAbort epoch+1  (client
                                                        (write), markers      retries)
Prepare*           InitProducerId                       (none)                CONCURRENT_
                                                                              TRANSACTIONS
Empty, Complete*,  AddPartitionsToTxn/AddOffsetsToTxn   Ongoing, partitions   after
Ongoing            (new partitions)                     added (write)         write
Ongoing            EndTxn commit / abort                PrepareCommit /       after
                                                        PrepareAbort (write), write
                                                        markers
Ongoing            timeout (tick)                       PrepareAbort epoch+1  (none)
                                                        (write), markers
PrepareCommit/     all markers written                  CompleteCommit/       (none)
PrepareAbort                                            CompleteAbort (write)
Empty, Complete*   idle for transactional.id.expiration Dead: a tombstone     (none)
                   (tick)                               (write), forgotten
any                AddPartitionsToTxn verify_only       (none: nothing        at once
                   (KIP-890, a partition leader asks)   written)
================== ==================================== ===================== =========

Refusals (Kafka's): an unknown id or a different producer id is
INVALID_PRODUCER_ID_MAPPING; an older epoch is PRODUCER_FENCED (the API layer answers
INVALID_PRODUCER_EPOCH to request versions that predate PRODUCER_FENCED); EndTxn on an
Empty id or with the other outcome than the one in progress is INVALID_TXN_STATE; a
retried EndTxn of a completed transaction with the same outcome is answered NONE; a
Prepare* id answers CONCURRENT_TRANSACTIONS until its markers are written.

KIP-360 (InitProducerId v3+ naming the producer's current id and epoch): allowed when
they are the id's current ones (the epoch is bumped), or the epoch the last bump
replaced or the producer id the last rotation replaced (a retried bump: answered with
the current id and epoch, no write); anything else is PRODUCER_FENCED.

Timeouts: ``tick`` aborts each Ongoing transaction older than its own
``transaction.timeout.ms`` (bounded by ``transaction.max.timeout.ms`` when it was
set), bumping the epoch as Kafka does so the timed-out producer is fenced.

Loading: a new leader ``replay``s every record of the partition, then ``end_load``
returns the markers of every transaction left in PrepareCommit/PrepareAbort, so what a
dead coordinator had decided is finished; Ongoing transactions keep their start time
and time out as before.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tidewater.broker.group.state import coordinator_error_for_write
from tidewater.broker.txn import records, verification
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import InvariantViolation

# Kafka's ``isEpochExhausted``: the last epochs are kept for the fence bump.
PRODUCER_EPOCH_EXHAUSTED = (1 << 15) - 2
NO_PRODUCER_ID = -1
TopicPartition = tuple[str, int]


class TxnState(enum.IntEnum):
    """Kafka's transaction states, numbered as ``transaction_status`` is on disk."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit")."""
        return "".join(part.capitalize() for part in self.name.split("_"))


COMPLETE = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True)
class TxnSettings:
    transaction_max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms


@dataclass(frozen=True)
class TxnSnapshot:
    """What a transactional id's record holds (the value of its last durable write)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int  # -1 when no transaction is open
    last_update_ms: int
    previous_producer_id: int = NO_PRODUCER_ID  # the id an epoch exhaustion replaced
    last_producer_epoch: int = -1  # the epoch the last bump replaced (memory only)


@dataclass
class TxnMetadata:
    transactional_id: str
    current: TxnSnapshot
    pending: TxnState | None = None  # a write in flight for this id
    # Prepare*: markers written but the Complete* write failed; tick writes it again.
    complete_due: bool = False

    @property
    def state(self) -> TxnState:
        return self.current.state


@dataclass(frozen=True)
class CodeAnswer:
    error_code: pb.ErrorCode


@dataclass(frozen=True)
class InitPidAnswer:
    error_code: pb.ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1


Answer = CodeAnswer | InitPidAnswer


@dataclass(frozen=True)
class Write:
    """One record to append to the partition before the answers it carries."""

    write_id: int
    record: records.TxnLogRecord


@dataclass(frozen=True)
class MarkerJob:
    """Control batches to write: one marker per partition of a finished transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]


@dataclass
class Ready:
    replies: list[tuple[Any, Answer]] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    markers: list[MarkerJob] = field(default_factory=list)

    def extend(self, other: Ready) -> Ready:
        self.replies += other.replies
        self.writes += other.writes
        self.markers += other.markers
        return self


def _record(transactional_id: str, s: TxnSnapshot) -> records.TxnLogRecord:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(s.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return records.TxnLogRecord(transactional_id, records.TxnLogValue(
        producer_id=s.producer_id, producer_epoch=s.producer_epoch,
        transaction_timeout_ms=s.timeout_ms, status=int(s.state),
        partitions=tuple((t, tuple(p)) for t, p in by_topic.items()),
        last_update_timestamp_ms=s.last_update_ms, start_timestamp_ms=s.start_ms,
        previous_producer_id=s.previous_producer_id))


def snapshot_of(value: records.TxnLogValue) -> TxnSnapshot:
    return TxnSnapshot(
        producer_id=value.producer_id, producer_epoch=value.producer_epoch,
        timeout_ms=value.transaction_timeout_ms, state=TxnState(value.status),
        partitions=frozenset((t, p) for t, ids in value.partitions for p in ids),
        start_ms=value.start_timestamp_ms, last_update_ms=value.last_update_timestamp_ms,
        previous_producer_id=value.previous_producer_id)


@dataclass
class _PendingWrite:
    transactional_id: str
    target: TxnSnapshot
    on_done: Callable[[pb.ErrorCode, int], Ready]


class TransactionCoordinatorState:
    """Every transactional id of one ``__transaction_state`` partition; see the module
    docstring."""

    def __init__(self, coordinator_epoch: int, settings: TxnSettings | None = None):
        self.coordinator_epoch = coordinator_epoch
        self.settings = settings or TxnSettings()
        self.txns: dict[str, TxnMetadata] = {}
        self._write_ids = itertools.count(1)
        self._pending_writes: dict[int, _PendingWrite] = {}

    # ------------------------------------------------------------ loading

    def replay(self, record: records.TxnLogRecord) -> None:
        """A record read from the partition (start-up or a new leader), in log order."""
        if self._pending_writes:
            raise InvariantViolation("replaying into a state with writes in flight")
        if record.value is None:
            self.txns.pop(record.transactional_id, None)
            return
        self.txns[record.transactional_id] = TxnMetadata(
            record.transactional_id, snapshot_of(record.value))

    def end_load(self, now_ms: int) -> Ready:
        """The partition is read: finish what a previous coordinator prepared."""
        ready = Ready()
        for md in self.txns.values():
            if md.state in PREPARE:
                ready.markers.append(self._marker_job(md))
        return ready

    # ------------------------------------------------------------ requests

    def init_producer_id(self, token: Any, now_ms: int, *, transactional_id: str,
                         transaction_timeout_ms: int, producer_id: int, producer_epoch: int,
                         fresh_producer_id: int) -> Ready:
        """InitProducerId with a transactional id (Kafka's handleInitProducerId)."""
        if not 0 < transaction_timeout_ms <= self.settings.transaction_max_timeout_ms:
            return _reply(token, InitPidAnswer(pb.INVALID_TRANSACTION_TIMEOUT))
        if (producer_id < 0) != (producer_epoch < 0):
            return _reply(token, InitPidAnswer(pb.INVALID_REQUEST))
        md = self.txns.get(transactional_id)
        if md is None:
            target = TxnSnapshot(fresh_producer_id, 0, transaction_timeout_ms, TxnState.EMPTY,
                                 frozenset(), -1, now_ms)
            md = self.txns[transactional_id] = TxnMetadata(
                transactional_id, replace(target, producer_epoch=-1))

            def created(code: pb.ErrorCode, _now_ms: int) -> Ready:
                if code != pb.NONE:
                    if md.current.producer_epoch < 0 and self.txns.get(transactional_id) is md:
                        del self.txns[transactional_id]  # never durable: never existed
                    return _reply(token, InitPidAnswer(coordinator_error_for_write(code)))
                return _reply(token, InitPidAnswer(pb.NONE, target.producer_id,
                                                   target.producer_epoch))
            return self._write(md, target, created)
        if md.pending is not None or md.state in PREPARE or md.state in (
                TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
            return _reply(token, InitPidAnswer(pb.CONCURRENT_TRANSACTIONS))
        cur = md.current
        if producer_id >= 0:
            if producer_id == cur.producer_id and producer_epoch == cur.producer_epoch:
                pass  # the producer's own id: bump below
            elif md.state in COMPLETE and (
                    (producer_id == cur.producer_id and producer_epoch == cur.last_producer_epoch)
                    or (producer_id == cur.previous_producer_id and cur.producer_epoch == 0)):
                # A retry of a bump that was written but whose answer was lost.
                return _reply(token, InitPidAnswer(pb.NONE, cur.producer_id,
                                                   cur.producer_epoch))
            else:
                return _reply(token, InitPidAnswer(pb.PRODUCER_FENCED))
        if md.state == TxnState.ONGOING:
            # A new producer with this transactional id fences the old one and aborts
            # its transaction; it retries until the abort is complete.
            return self._abort_fencing(md, now_ms, token)
        if cur.producer_epoch >= PRODUCER_EPOCH_EXHAUSTED:
            target = replace(cur, producer_id=fresh_producer_id, producer_epoch=0,
                             previous_producer_id=cur.producer_id, last_producer_epoch=-1)
        else:
            target = replace(cur, producer_epoch=cur.producer_epoch + 1,
                             last_producer_epoch=cur.producer_epoch)
        target = replace(target, timeout_ms=transaction_timeout_ms, state=TxnState.EMPTY,
                         partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)

        def bumped(code: pb.ErrorCode, _now_ms: int) -> Ready:
            if code != pb.NONE:
                return _reply(token, InitPidAnswer(coordinator_error_for_write(code)))
            return _reply(token, InitPidAnswer(pb.NONE, target.producer_id, target.producer_epoch))
        return self._write(md, target, bumped)

    def add_partitions(self, token: Any, now_ms: int, *, transactional_id: str,
                       producer_id: int, producer_epoch: int,
                       partitions: list[TopicPartition]) -> Ready:
        """AddPartitionsToTxn, and AddOffsetsToTxn with the group's offsets partition.
        The answer is one code for every partition, as Kafka's."""
        md, refusal = self._checked(transactional_id, producer_id, producer_epoch)
        if md is None:
            return _reply(token, CodeAnswer(refusal))
        if md.pending is not None or md.state in PREPARE:
            return _reply(token, CodeAnswer(pb.CONCURRENT_TRANSACTIONS))
        if md.state not in COMPLETE and md.state != TxnState.ONGOING:
            return _reply(token, CodeAnswer(pb.INVALID_TXN_STATE))
        cur = md.current
        wanted = frozenset(partitions)
        if md.state == TxnState.ONGOING and wanted <= cur.partitions:
            return _reply(token, CodeAnswer(pb.NONE))
        target = replace(
            cur, state=TxnState.ONGOING, partitions=cur.partitions | wanted,
            start_ms=cur.start_ms if md.state == TxnState.ONGOING else now_ms,
            last_update_ms=now_ms)

        def added(code: pb.ErrorCode, _now_ms: int) -> Ready:
            return _reply(token, CodeAnswer(coordinator_error_for_write(code)))
        return self._write(md, target, added)

    def end_txn(self, token: Any, now_ms: int, *, transactional_id: str, producer_id: int,
                producer_epoch: int, committed: bool) -> Ready:
        """EndTxn (Kafka's endTransaction from a client)."""
        md, refusal = self._checked(transactional_id, producer_id, producer_epoch)
        if md is None:
            return _reply(token, CodeAnswer(refusal))
        if md.pending is not None:
            return _reply(token, CodeAnswer(pb.CONCURRENT_TRANSACTIONS))
        state = md.state
        same = (TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT) if committed else (
            TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT)
        if state == same[0]:
            return _reply(token, CodeAnswer(pb.NONE))  # a retry of a finished EndTxn
        if state == same[1]:
            return _reply(token, CodeAnswer(pb.CONCURRENT_TRANSACTIONS))
        if state != TxnState.ONGOING:
            return _reply(token, CodeAnswer(pb.INVALID_TXN_STATE))
        return self._prepare(md, now_ms, committed, token, pb.NONE)

    def verify_partitions(self, *, transactional_id: str, producer_id: int,
                          producer_epoch: int, partitions: list[TopicPartition]
                          ) -> dict[TopicPartition, pb.ErrorCode]:
        """AddPartitionsToTxn with verify_only (KIP-890, a partition leader asking): is
        each partition in the producer's ongoing transaction? Nothing is written; a
        pending write is not waited for (partitions count once durable)."""
        md = self.txns.get(transactional_id)
        known = md is not None and md.current.producer_epoch >= 0
        cur = md.current if md is not None else None
        return verification.verify_partitions(
            partitions, known=known, producer_id=producer_id, producer_epoch=producer_epoch,
            current_producer_id=cur.producer_id if cur else NO_PRODUCER_ID,
            current_producer_epoch=cur.producer_epoch if cur else -1,
            preparing=md is not None and md.state in PREPARE,
            in_transaction=(cur.partitions if cur and md is not None
                            and md.state == TxnState.ONGOING else frozenset()))

    def on_markers_written(self, job: MarkerJob, now_ms: int) -> Ready:
        """Every partition of ``job`` has its marker: write Complete*."""
        md = self.txns.get(job.transactional_id)
        if (md is None or md.pending is not None or md.state not in PREPARE
                or md.current.producer_id != job.producer_id
                or md.current.producer_epoch != job.producer_epoch):
            return Ready()  # superseded (a reload sends its own markers)
        return self._complete(md, now_ms)

    def tick(self, now_ms: int) -> Ready:
        """Abort timed-out transactions; write again a Complete* that failed; expire ids
        idle for ``transactional_id_expiration_ms`` (a tombstone, then forgotten)."""
        ready = Ready()
        for md in list(self.txns.values()):
            if md.pending is not None:
                continue
            cur = md.current
            if md.state == TxnState.ONGOING and now_ms >= cur.start_ms + cur.timeout_ms:
                ready.extend(self._abort_fencing(md, now_ms, None))
            elif md.complete_due and md.state in PREPARE:
                ready.extend(self._complete(md, now_ms))
            elif (md.state in COMPLETE and now_ms - cur.last_update_ms
                  >= self.settings.transactional_id_expiration_ms):
                ready.extend(self._expire(md))
        return ready

    def on_write_done(self, write_id: int, error_code: pb.ErrorCode, now_ms: int) -> Ready:
        pending = self._pending_writes.pop(write_id, None)
        if pending is None:
            raise InvariantViolation(f"write {write_id} reported twice or never made")
        md = self.txns.get(pending.transactional_id)
        if md is not None:
            md.pending = None
            if error_code == pb.NONE:
                md.current = pending.target
        return pending.on_done(error_code, now_ms)

    def abandon(self) -> Ready:
        """This broker no longer leads the partition: every waiting request is answered
        NOT_COORDINATOR (the client finds the new coordinator)."""
        ready = Ready()
        for write_id in list(self._pending_writes):
            ready.extend(self.on_write_done(write_id, pb.NOT_LEADER_OR_FOLLOWER, 0))
        ready.markers.clear()
        ready.writes.clear()
        return ready

    # ------------------------------------------------------------ views

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.txns.get(transactional_id)

    # ------------------------------------------------------------ transitions

    def _checked(self, transactional_id: str, producer_id: int, producer_epoch: int
                 ) -> tuple[TxnMetadata | None, pb.ErrorCode]:
        md = self.txns.get(transactional_id)
        if md is None or md.current.producer_epoch < 0:
            return None, pb.INVALID_PRODUCER_ID_MAPPING
        if md.current.producer_id != producer_id:
            return None, pb.INVALID_PRODUCER_ID_MAPPING
        if md.current.producer_epoch != producer_epoch:
            return None, pb.PRODUCER_FENCED
        return md, pb.NONE

    def _abort_fencing(self, md: TxnMetadata, now_ms: int, token: Any) -> Ready:
        """Bump the epoch of an Ongoing transaction and abort it (a new producer or
        the timeout): the old producer's next request is PRODUCER_FENCED."""
        cur = md.current
        epoch = cur.producer_epoch + (1 if cur.producer_epoch < (1 << 15) - 1 else 0)
        fenced = replace(cur, producer_epoch=epoch, last_producer_epoch=cur.producer_epoch)
        md.pending = TxnState.PREPARE_EPOCH_FENCE
        return self._prepare(md, now_ms, False, token, pb.CONCURRENT_TRANSACTIONS, fenced,
                             InitPidAnswer)

    def _prepare(self, md: TxnMetadata, now_ms: int, committed: bool, token: Any,
                 success: pb.ErrorCode, base: TxnSnapshot | None = None,
                 answer: Callable[[pb.ErrorCode], Answer] = CodeAnswer) -> Ready:
        target = replace(base or md.current,
                         state=TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT,
                         last_update_ms=now_ms)

        def prepared(code: pb.ErrorCode, _now_ms: int) -> Ready:
            ready = Ready()
            if token is not None:
                ready.replies.append((token, answer(
                    success if code == pb.NONE else coordinator_error_for_write(code))))
            if code == pb.NONE:
                ready.markers.append(self._marker_job(md))
            return ready
        return self._write(md, target, prepared)

    def _complete(self, md: TxnMetadata, now_ms: int) -> Ready:
        committed = md.state == TxnState.PREPARE_COMMIT
        target = replace(md.current, partitions=frozenset(), last_update_ms=now_ms,
                         state=TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT)
        md.complete_due = False

        def completed(code: pb.ErrorCode, _now_ms: int) -> Ready:
            if code != pb.NONE:
                md.complete_due = True  # the markers are written: only the record is due
            return Ready()
        return self._write(md, target, completed)

    def _expire(self, md: TxnMetadata) -> Ready:
        transactional_id = md.transactional_id

        def expired(code: pb.ErrorCode, _now_ms: int) -> Ready:
            if code == pb.NONE and self.txns.get(transactional_id) is md:
                del self.txns[transactional_id]
            return Ready()  # a failed tombstone: the id stays, a later tick tries again
        ready = self._write(md, replace(md.current, state=TxnState.DEAD), expired)
        ready.writes[0] = replace(ready.writes[0],
                                  record=records.TxnLogRecord(transactional_id, None))
        return ready

    def _marker_job(self, md: TxnMetadata) -> MarkerJob:
        cur = md.current
        return MarkerJob(md.transactional_id, cur.producer_id, cur.producer_epoch,
                         md.state == TxnState.PREPARE_COMMIT, self.coordinator_epoch,
                         cur.partitions)

    def _write(self, md: TxnMetadata, target: TxnSnapshot,
               on_done: Callable[[pb.ErrorCode, int], Ready]) -> Ready:
        if md.pending is None:
            md.pending = target.state
        write_id = next(self._write_ids)
        self._pending_writes[write_id] = _PendingWrite(md.transactional_id, target, on_done)
        return Ready(writes=[Write(write_id, _record(md.transactional_id, target))])


def _reply(token: Any, answer: Answer) -> Ready:
    return Ready(replies=[(token, answer)])
