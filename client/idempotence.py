"""The idempotent producer's sequence numbers (Kafka's TransactionManager without
transactions): pure bookkeeping, shared by ``Producer`` and ``AsyncProducer``.

Theory of operation. ``InitProducerId`` gives the producer an id and epoch 0. Each
batch gets, when it is first sent, its partition's epoch and the next sequence
(sequences count records, per partition, wrapping to 0 after 2^31 - 1); a retry
resends it with the same numbers, so a broker that already appended it answers
the original offsets instead of writing it twice. Order with several requests in
flight: the broker refuses a batch whose sequence does not follow the last one it
wrote (OUT_OF_ORDER_SEQUENCE_NUMBER), so when a batch fails, the batches sent
after it fail too and all are retried, in creation order; a partition with a
batch to retry sends nothing until its requests in flight are answered
(``Producer`` mutes it).

What an answer to a sequenced batch means (``decide``):

================================  =====================================================
answer                            decision
================================  =====================================================
NONE                              acked: the partition's last acked sequence moves
retriable error                   RETRY with the same numbers
OUT_OF_ORDER_SEQUENCE_NUMBER,     RETRY when an earlier batch is still unresolved (it
UNKNOWN_PRODUCER_ID               caused the gap); BUMP when this batch is the next one
                                  the broker should take: the sequence is unresolved
                                  (the broker lost the producer's state or a batch
                                  failed for good), so the partition starts a new epoch
                                  at sequence 0 and every unacked batch is renumbered
a batch of an older epoch         RETRY: it is renumbered in the current epoch
anything else                     FAIL (and BUMP: the sequence it held is unresolved)
================================  =====================================================

Every unacked batch of a partition must stay among the five the broker
remembers, so at most ``BATCHES_IN_FLIGHT_MAX`` (5) batches are sent from the oldest
unacked one on (its *window*; acked batches after it count, since the broker appended
them after it), and a batch to retry goes alone in its request (the broker refuses a
repeat that comes with new batches). Counting batches in flight instead is not enough:
answers may come out of order (one stream, answers by correlation id), so batches
after a lost answer can be acked and replaced while its retry waits, and the retry
would then be older than anything the broker remembers.

The epoch is bumped per partition (the broker keeps a producer's epoch per
partition), locally, as Kafka's idempotent producer does since KIP-360. An epoch
past 32767 asks for a new producer id. A transactional producer (``transactional``)
never bumps locally: its epoch is the coordinator's, so where the table says BUMP its
batch fails (the transaction must be aborted; client/transactions.py then asks the
coordinator for a new epoch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from tidewater.proto import tidewater_pb2 as pb

SEQUENCE_MAX = 2**31 - 1
EPOCH_MAX = 2**15 - 1
MAX_IN_FLIGHT_IDEMPOTENT = 5  # Kafka's limit: the broker remembers the last five batches
# Batches of one partition on the way at once: a retry whose first answer was lost is
# then still among the five the broker remembers, however the requests were filled.
BATCHES_IN_FLIGHT_MAX = 5

Decision = Literal["retry", "bump", "fail"]
_SEQUENCE_ERRORS = (pb.OUT_OF_ORDER_SEQUENCE_NUMBER, pb.UNKNOWN_PRODUCER_ID)


def drain_count_max(state: IdempotentState | None, first_is_retry: bool,
                    window_batches: int) -> int | None:
    """How many batches of a partition may go in its next request (None: any number);
    ``window_batches``: its batches sent from the oldest unacked one on."""
    if state is None:
        return None
    if first_is_retry:
        return 1
    return max(0, BATCHES_IN_FLIGHT_MAX - window_batches)


def next_sequence(sequence: int, record_count: int) -> int:
    """The sequence after ``record_count`` records from ``sequence`` (wrapping)."""
    following = sequence + record_count
    return following - SEQUENCE_MAX - 1 if following > SEQUENCE_MAX else following


@dataclass
class PartitionSequences:
    epoch: int
    next_sequence: int = 0
    last_acked_sequence: int = -1  # of the last record acked in this epoch
    # [base sequence, acked] of the batches numbered in this epoch from the oldest unacked
    window: deque[list[Any]] = field(default_factory=deque)


class IdempotentState:
    """Producer id, and per partition its epoch and sequences (see the module docstring)."""

    def __init__(self, *, transactional: bool = False) -> None:
        self.transactional = transactional  # the epoch is the coordinator's: never bumped here
        self.producer_id = -1
        self.producer_epoch = -1
        self.partitions: dict[Any, PartitionSequences] = {}

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, epoch
        self.partitions.clear()  # a new id numbers every partition from 0

    def _partition(self, tp: Any) -> PartitionSequences:
        state = self.partitions.get(tp)
        if state is None:
            state = self.partitions[tp] = PartitionSequences(self.producer_epoch)
        return state

    def assign(self, batch: Any) -> tuple[int, int, int]:
        """The (producer id, epoch, base sequence) to send ``batch`` with: its own on a retry
        in the same epoch, else the partition's next sequence (the batch keeps them)."""
        state = self._partition(batch.tp)
        if (batch.base_sequence < 0 or batch.producer_epoch != state.epoch
                or batch.producer_id != self.producer_id):
            batch.producer_id = self.producer_id
            batch.producer_epoch = state.epoch
            batch.base_sequence = state.next_sequence
            state.next_sequence = next_sequence(state.next_sequence, batch.record_count)
            state.window.append([batch.base_sequence, False])
        return self.producer_id, batch.producer_epoch, batch.base_sequence

    def on_acked(self, batch: Any) -> None:
        state = self.partitions.get(batch.tp)
        if (state is not None and batch.producer_epoch == state.epoch
                and batch.producer_id == self.producer_id and batch.base_sequence >= 0):
            last = next_sequence(batch.base_sequence, batch.record_count - 1)
            if state.last_acked_sequence < 0 or _after(last, state.last_acked_sequence):
                state.last_acked_sequence = last
            for entry in state.window:
                if entry[0] == batch.base_sequence:
                    entry[1] = True
                    break
            while state.window and state.window[0][1]:
                state.window.popleft()

    def window_batches(self, tp: Any) -> int:
        """Batches of ``tp`` sent in its epoch from the oldest unacked one on."""
        state = self.partitions.get(tp)
        return 0 if state is None else len(state.window)

    def decide(self, batch: Any, error: BaseException) -> Decision:
        """What to do with a sequenced batch that failed with ``error`` (the table above)."""
        state = self.partitions.get(batch.tp)
        if (state is None or batch.base_sequence < 0 or batch.producer_epoch != state.epoch
                or batch.producer_id != self.producer_id):
            return "retry"  # never numbered, or numbered in an older epoch: renumbered
        code = getattr(error, "error_code", None)
        if code in _SEQUENCE_ERRORS:
            expected = next_sequence(state.last_acked_sequence, 1)
            if batch.base_sequence != expected:
                return "retry"
            return "fail" if self.transactional else "bump"
        if getattr(error, "retriable", False):
            return "retry"
        return "fail"

    def bump(self, tp: Any) -> None:
        """Start a new epoch on ``tp`` at sequence 0: unacked batches get renumbered. An epoch
        past EPOCH_MAX drops the producer id: the next send asks for a new one."""
        if self.transactional:
            return  # the abort that must follow takes a new epoch from the coordinator
        state = self._partition(tp)
        if state.epoch >= EPOCH_MAX:
            self.producer_id = self.producer_epoch = -1
            self.partitions.clear()
            return
        self.partitions[tp] = PartitionSequences(state.epoch + 1)


def _after(a: int, b: int) -> bool:
    """Sequence ``a`` comes after ``b`` (allowing for one wrap)."""
    return 0 < (a - b) % (SEQUENCE_MAX + 1) < (SEQUENCE_MAX + 1) // 2
