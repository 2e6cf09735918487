"""The transactional producer's side of a transaction (Kafka's TransactionManager), over
gRPC to the transactional id's coordinator (broker/txn: the one Kafka clients use too).

Theory of operation. ``init`` finds the coordinator (FindCoordinator, key type
TRANSACTION) and gets the producer id and epoch from InitProducerId with the
transactional id: the coordinator bumps the epoch, so an older producer with the same id
is fenced and its open transaction aborted. Each transaction then goes:

====================  =====================================================================
step                  what happens
====================  =====================================================================
begin                 local only: READY -> IN_TRANSACTION
a send's partition,   AddPartitionsToTxn, before the record is queued (so before its first
first in the txn      batch goes out: a batch of a partition the coordinator does not
                      know gets no marker, and its open transaction would hold the
                      partition's LSO until the coordinator's timeout); batches carry the
                      transactional bit and the producer's id, epoch and sequences
send_offsets          AddOffsetsToTxn (the group's __consumer_offsets partition joins),
                      then TxnOffsetCommit on the group's coordinator (held until the
                      marker)
commit / abort        the producer flushes (every record answered), then EndTxn; answered
                      once PrepareCommit/PrepareAbort is durable: the markers follow
====================  =====================================================================

Errors, as Kafka's producer treats them:

=============================================  ============================================
error                                          reaction
=============================================  ============================================
CONCURRENT_TRANSACTIONS,                       retried after ``retry_backoff_ms`` (the
COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, coordinator found again where it moved)
COORDINATOR_NOT_AVAILABLE, a transport error   until ``max_block_ms``
PRODUCER_FENCED, INVALID_PRODUCER_EPOCH,       fatal: raised (``ProducerFencedError`` for a
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ...     fence) now and by every later call; the
                                               producer can only be closed
a failed send, a refused partition or offset   abortable: the transaction can only be
commit                                         aborted (``TransactionAbortRequiredError``
                                               until then)
=============================================  ============================================

A batch that failed held sequence numbers the broker may or may not have: after the
abort the producer asks InitProducerId with its current id and epoch for a new epoch
(KIP-360), which starts every partition's sequences again. A transactional producer never
bumps its epoch locally (the idempotent producer's recovery): the coordinator owns it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from tidewater.client.group import CoordinatorClient, _CoordinatorGone
from tidewater.client.idempotence import IdempotentState
from tidewater.client.metadata import BrokerConnectionError, MetadataClient, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    ProducerFencedError,
    RequestTimedOutError,
    TidewaterError,
    error_for_code,
)

# Answers retried after a back-off (a state change in flight, a coordinator loading or
# moving); the coordinator is looked up again for the last two.
RETRIED_CODES = frozenset({pb.CONCURRENT_TRANSACTIONS, pb.COORDINATOR_LOAD_IN_PROGRESS,
                           pb.NOT_COORDINATOR, pb.COORDINATOR_NOT_AVAILABLE,
                           pb.UNKNOWN_TOPIC_OR_PARTITION})
_MOVED_CODES = frozenset({pb.NOT_COORDINATOR, pb.COORDINATOR_NOT_AVAILABLE})
# A newer producer with the same transactional id has the epoch (Kafka's KIP-588 maps
# INVALID_PRODUCER_EPOCH from the transaction APIs to a fence too).
FENCED_CODES = frozenset({pb.PRODUCER_FENCED, pb.INVALID_PRODUCER_EPOCH})
# Errors after which the transaction can still be aborted (the others are fatal).
ABORTABLE_CODES = frozenset({pb.TOPIC_AUTHORIZATION_FAILED, pb.GROUP_AUTHORIZATION_FAILED,
                             pb.OPERATION_NOT_ATTEMPTED, pb.UNKNOWN_MEMBER_ID,
                             pb.ILLEGAL_GENERATION, pb.FENCED_INSTANCE_ID})


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


class TransactionStateError(RuntimeError):
    """A transactional call in the wrong state (Kafka's IllegalStateException): a bug in
    the caller, e.g. ``send`` before ``begin_transaction``."""


class TransactionAbortRequiredError(Exception):
    """The open transaction failed (``cause``: a send, a refused partition...): only
    ``abort_transaction`` may follow."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What ``send_offsets_to_transaction`` checks the offsets' group with (Kafka's
    KIP-447): -1 and "" for no membership check."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


def fenced_error(code: int, message: str) -> TidewaterError:
    """The typed fatal error for a fencing code: always ``ProducerFencedError``."""
    return ProducerFencedError(message) if code in FENCED_CODES else error_for_code(code, message)


class TransactionManager:
    """One transactional producer's transaction state and coordinator calls (see the
    module docstring). Calls come from the application's thread; ``on_batch_failed``
    from the producer's I/O threads (under ``_lock`` only: no RPC there)."""

    def __init__(self, metadata: MetadataClient, idempotence: IdempotentState, *,
                 transactional_id: str, transaction_timeout_ms: int, request_timeout_ms: int,
                 retry_backoff_ms: int, max_block_ms: int) -> None:
        if not transactional_id:
            raise ValueError("transactional_id must not be empty")
        self.metadata = metadata
        self.idempotence = idempotence  # the producer's: the id and epoch the batches carry
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_block_ms = max_block_ms
        self.request_timeout_s = request_timeout_ms / 1000
        self.coordinator = CoordinatorClient(
            metadata, transactional_id, request_timeout_s=self.request_timeout_s,
            retry_backoff_s=retry_backoff_ms / 1000, key_type=pb.KEY_TYPE_TRANSACTION)
        self._lock = threading.Lock()
        self.state = TxnState.UNINITIALIZED
        # In the open transaction: (topic, partition), and ("group <id>", -1) per group
        # whose offsets joined (AddOffsetsToTxn).
        self.partitions: set[tuple[str, int]] = set()
        self._error: BaseException | None = None  # why ABORTABLE_ERROR or FATAL_ERROR
        self._epoch_bump_needed = False  # a batch failed: sequences unresolved

    # ------------------------------------------------------------ state

    def _check(self, *allowed: TxnState) -> None:
        """Raise unless in one of ``allowed`` (the fatal error itself when fatal)."""
        with self._lock:
            state, error = self.state, self._error
        if state in allowed:
            return
        if state is TxnState.FATAL_ERROR:
            assert error is not None
            raise error
        if state is TxnState.ABORTABLE_ERROR:
            raise TransactionAbortRequiredError(
                f"transaction of {self.transactional_id!r} failed ({error!r}): abort it",
                error)
        raise TransactionStateError(
            f"transactional id {self.transactional_id!r} is {state.value}; this call needs "
            + " or ".join(s.value for s in allowed))

    def _fail(self, error: BaseException, *, fatal: bool) -> BaseException:
        with self._lock:
            if self.state is not TxnState.FATAL_ERROR:
                self.state = TxnState.FATAL_ERROR if fatal else TxnState.ABORTABLE_ERROR
                self._error = error
        return error

    def _fail_code(self, code: int, what: str) -> BaseException:
        message = f"{what} of transactional id {self.transactional_id!r}: {pb.ErrorCode.Name(code)}"
        if code in ABORTABLE_CODES:
            return self._fail(TransactionAbortRequiredError(message, error_for_code(code, message)),
                              fatal=False)
        return self._fail(fenced_error(code, message), fatal=True)

    def on_batch_failed(self, error: BaseException) -> None:
        """A batch of the open transaction failed for good (the producer's lock may be
        held): the transaction must be aborted; a fence is fatal."""
        code = getattr(error, "error_code", None)
        with self._lock:
            self._epoch_bump_needed = True
        if code in FENCED_CODES:
            self._fail(fenced_error(code, f"transactional id {self.transactional_id!r} "
                                          f"fenced: {error}"), fatal=True)
        else:
            self._fail(TransactionAbortRequiredError(
                f"a send of transactional id {self.transactional_id!r} failed: {error!r}",
                error), fatal=False)

    # ------------------------------------------------------------ calls

    def _coordinator_call(self, client: CoordinatorClient, method: str, request: Message,
                          code_of: Callable[[Any], int]) -> Any:
        """``method`` on ``client``'s coordinator, retried (RETRIED_CODES, transport errors)
        with back-off until ``max_block_ms``; the answer whose code is anything else."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        while True:
            try:
                answer = client.call(method, request)
                code = code_of(answer)
                if code not in RETRIED_CODES:
                    return answer
                if code in _MOVED_CODES:
                    client._forget()
                why: object = pb.ErrorCode.Name(code)
            except (_CoordinatorGone, BrokerConnectionError) as e:
                why = e
            except TidewaterError as e:  # FindCoordinator refused (an ACL): not retried
                raise self._fail_code(e.error_code, f"FindCoordinator for {method}") from e
            if time.monotonic() + self.retry_backoff_ms / 1000 >= deadline:
                timed_out = RequestTimedOutError(
                    f"{method} of transactional id {self.transactional_id!r} not done within "
                    f"{self.max_block_ms} ms: {why}")
                if self.state is TxnState.UNINITIALIZED:
                    raise timed_out  # init_transactions may be called again
                raise self._fail(timed_out, fatal=False)  # the transaction is in doubt
            time.sleep(self.retry_backoff_ms / 1000)

    def _init_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        request = pb.InitProducerIdRequest(
            transactional_id=self.transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, transaction_timeout_ms=self.transaction_timeout_ms)
        answer = self._coordinator_call(self.coordinator, "InitProducerId", request,
                                        lambda a: a.error_code)
        if answer.error_code != pb.NONE:
            raise self._fail(fenced_error(answer.error_code, (
                f"InitProducerId of transactional id {self.transactional_id!r}: "
                f"{pb.ErrorCode.Name(answer.error_code)} {answer.error_message}")), fatal=True)
        with self._lock:
            self.idempotence.set_producer_id(answer.producer_id, answer.producer_epoch)
            self._epoch_bump_needed = False

    def init(self) -> None:
        """InitProducerId with the transactional id: fences older producers with the id."""
        self._check(TxnState.UNINITIALIZED)
        self._init_producer_id(-1, -1)
        with self._lock:
            self.state = TxnState.READY

    def begin(self) -> None:
        self._check(TxnState.READY)
        with self._lock:
            self.state = TxnState.IN_TRANSACTION
            self.partitions.clear()

    def has_partition(self, tp: TopicPartition) -> bool:
        """``tp`` is in the open transaction (no call needed before its records)."""
        with self._lock:
            return (self.state is TxnState.IN_TRANSACTION
                    and (tp.topic, tp.partition) in self.partitions)

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """Before a record of ``tp`` is queued: ``tp`` joins the transaction (once)."""
        key = (tp.topic, tp.partition)
        with self._lock:
            if self.state is TxnState.IN_TRANSACTION and key in self.partitions:
                return
        self._check(TxnState.IN_TRANSACTION)
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.idempotence.producer_id,
            producer_epoch=self.idempotence.producer_epoch,
            partitions=[pb.TxnPartition(topic=tp.topic, partition=tp.partition)])
        answer = self._coordinator_call(self.coordinator, "AddPartitionsToTxn", request,
                                        _first_partition_code)
        code = _first_partition_code(answer)
        if code != pb.NONE:
            raise self._fail_code(code, f"AddPartitionsToTxn {tp.topic}-{tp.partition}")
        with self._lock:
            self.partitions.add(key)

    def send_offsets(self, offsets: Mapping[Any, int],
                     group: ConsumerGroupMetadata) -> None:
        """The group's offsets (``offsets``: (topic, partition) -> the next offset to
        consume) commit with the transaction: AddOffsetsToTxn, then TxnOffsetCommit."""
        self._check(TxnState.IN_TRANSACTION)
        pid, epoch = self.idempotence.producer_id, self.idempotence.producer_epoch
        answer = self._coordinator_call(
            self.coordinator, "AddOffsetsToTxn",
            pb.AddOffsetsToTxnRequest(transactional_id=self.transactional_id, producer_id=pid,
                                      producer_epoch=epoch, group_id=group.group_id),
            lambda a: a.error_code)
        if answer.error_code != pb.NONE:
            raise self._fail_code(answer.error_code, f"AddOffsetsToTxn of group {group.group_id!r}")
        with self._lock:  # the group's offsets partition is in the transaction now
            self.partitions.add((f"group {group.group_id}", -1))
        group_coordinator = CoordinatorClient(
            self.metadata, group.group_id, request_timeout_s=self.request_timeout_s,
            retry_backoff_s=self.retry_backoff_ms / 1000)
        request = pb.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group.group_id, producer_id=pid,
            producer_epoch=epoch, generation_id=group.generation_id, member_id=group.member_id,
            group_instance_id=group.group_instance_id or "",
            offsets=[pb.GroupOffset(topic=_topic(tp), partition=_partition(tp), offset=offset,
                                    leader_epoch=-1) for tp, offset in offsets.items()])
        answer = self._coordinator_call(group_coordinator, "TxnOffsetCommit", request,
                                        _worst_offset_code)
        code = _worst_offset_code(answer)
        if code != pb.NONE:
            raise self._fail_code(code, f"TxnOffsetCommit of group {group.group_id!r}")

    def check_commit(self) -> None:
        self._check(TxnState.IN_TRANSACTION)

    def check_abort(self) -> None:
        self._check(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)

    def end(self, committed: bool) -> None:
        """EndTxn (after the producer's flush). Abort after a failed batch also takes a new
        epoch (the failed batch's sequences are unresolved)."""
        self._check(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)
        with self._lock:
            if committed and self.state is TxnState.ABORTABLE_ERROR:
                raise TransactionAbortRequiredError(
                    f"transaction of {self.transactional_id!r} failed: abort it", self._error)
            self.state = TxnState.COMMITTING if committed else TxnState.ABORTING
        if self.partitions:  # else the coordinator holds nothing of it (Kafka sends none)
            answer = self._coordinator_call(
                self.coordinator, "EndTxn",
                pb.EndTxnRequest(transactional_id=self.transactional_id,
                                 producer_id=self.idempotence.producer_id,
                                 producer_epoch=self.idempotence.producer_epoch,
                                 committed=committed),
                lambda a: a.error_code)
            code = answer.error_code
            if code != pb.NONE:
                raise self._fail(fenced_error(code, (
                    f"EndTxn of transactional id {self.transactional_id!r}: "
                    f"{pb.ErrorCode.Name(code)}")), fatal=True)
        if self._epoch_bump_needed:
            self._init_producer_id(self.idempotence.producer_id, self.idempotence.producer_epoch)
        with self._lock:
            self.state = TxnState.READY
            self._error = None
            self.partitions.clear()


def _first_partition_code(answer: pb.AddPartitionsToTxnResponse) -> int:
    return answer.partitions[0].error_code if answer.partitions else pb.UNKNOWN_SERVER_ERROR


def _worst_offset_code(answer: pb.TxnOffsetCommitResponse) -> int:
    """The first non-NONE partition code (retried codes first: the commit is redone)."""
    codes = [o.error_code for o in answer.offsets if o.error_code != pb.NONE]
    retried = [c for c in codes if c in RETRIED_CODES]
    return (retried or codes or [pb.NONE])[0]


def _topic(tp: Any) -> str:
    return str(tp.topic if isinstance(tp, TopicPartition) else tp[0])


def _partition(tp: Any) -> int:
    return int(tp.partition if isinstance(tp, TopicPartition) else tp[1])
