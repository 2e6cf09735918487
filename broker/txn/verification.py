"""KIP-890 part 1, the partition leader's side: a transactional producer's first batch
in a transaction is appended only once the transaction coordinator confirms the
partition is in the producer's ongoing transaction (Kafka 3.6+'s
``transaction.partition.verification.enable``, ``AddPartitionsToTxnManager`` and
``VerificationStateEntry``). Pure: no sockets, no log, time passed in.

Theory of operation
-------------------
Without verification a hanging transaction is possible: a producer's batch that
arrives after its transaction ended (a retry delayed past the marker), or one sent
to a partition never added with AddPartitionsToTxn, opens a transaction in the
partition that no coordinator knows of and so no marker will ever end; the last
stable offset is stuck there and read_committed consumers stop.

So the leader asks before the first batch of a transaction (the producer has no
transaction open in the partition at that epoch): ``needs_verification`` finds the
(producer id, epoch) of a transactional batch, ``VerificationCache.begin`` makes the
partition's entry for the producer *before* the coordinator is asked, and
``on_answer`` marks it verified only if it is still the same entry. A marker written
to the partition for that producer (``on_marker``) drops the entry, so:

* a verification answered after the transaction ended (the marker came in between)
  verifies nothing: the batch is refused, as Kafka's verification guard does;
* the next transaction of the same producer and epoch (Kafka's transactions before
  KIP-890 part 2 keep the epoch) asks again.

Between a verified entry and the first append the batch is checked against the entry
(``allows``) with no ``await`` in between (the produce path's append is synchronous);
once appended, the producer's transaction is open in the log and later batches of the
transaction need no verification: one round trip per transaction per partition.

An entry also holds the leader epoch it was verified under: after a leadership
change (markers may have been written while another broker led) it is worth nothing.
Entries expire after ``expiration_ms`` (Kafka: ``producer.id.expiration.ms``) and at
most ``entries_max`` are kept (the oldest go first).

Errors, as Kafka's ``AddPartitionsToTxnManager`` and ``ReplicaManager.appendRecords``
(3.6-3.7, clients before transaction version 2) hand them to the producer
(``produce_error``): INVALID_TXN_STATE ("Partition was not added to the
transaction"); PRODUCER_FENCED as INVALID_PRODUCER_EPOCH; a coordinator that cannot
answer now (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS,
CONCURRENT_TRANSACTIONS, NETWORK_EXCEPTION) as NOT_ENOUGH_REPLICAS, which every client
retries without a metadata refresh; a refusal of the leader itself
(CLUSTER_AUTHORIZATION_FAILED) as INVALID_TXN_STATE; anything else as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import CONTROL_MASK, TRANSACTIONAL_MASK, iter_batches
from tidewater.proto.errors import TidewaterError

TopicPartition = tuple[str, int]

VERIFICATION_ENTRIES_MAX = 100_000  # entries kept per broker; the oldest go first

# Coordinator answers that mean "cannot say now": the producer retries its produce.
RETRIABLE_CODES = frozenset({pb.NOT_COORDINATOR, pb.COORDINATOR_NOT_AVAILABLE,
                             pb.COORDINATOR_LOAD_IN_PROGRESS, pb.CONCURRENT_TRANSACTIONS,
                             pb.NETWORK_EXCEPTION})


class TxnVerificationError(TidewaterError):
    """A transactional batch refused because its partition is not verified to be in the
    producer's ongoing transaction; ``error_code`` is what the producer is answered."""

    def __init__(self, error_code: pb.ErrorCode, message: str):
        super().__init__(message)
        self.error_code = error_code
        self.retriable = error_code == pb.NOT_ENOUGH_REPLICAS


def produce_error(coordinator_code: pb.ErrorCode) -> TxnVerificationError:
    """The produce answer for a verification that did not succeed (the module
    docstring's table)."""
    if coordinator_code in (pb.INVALID_TXN_STATE, pb.CLUSTER_AUTHORIZATION_FAILED):
        return TxnVerificationError(pb.INVALID_TXN_STATE,
                                    "Partition was not added to the transaction")
    if coordinator_code in RETRIABLE_CODES:
        return TxnVerificationError(
            pb.NOT_ENOUGH_REPLICAS, "Unable to verify the partition has been added to the "
            f"transaction. Underlying error: {pb.ErrorCode.Name(coordinator_code)}")
    if coordinator_code == pb.PRODUCER_FENCED:
        return TxnVerificationError(pb.INVALID_PRODUCER_EPOCH,
                                    "the producer's epoch is fenced by the coordinator")
    return TxnVerificationError(coordinator_code, "transaction verification failed: "
                                f"{pb.ErrorCode.Name(coordinator_code)}")


def transactional_producer(records: bytes) -> tuple[int, int] | None:
    """(producer id, epoch) of the first transactional data batch in ``records`` (a
    produce request's partition data), None when there is none. Framing only: the log
    checks every batch's CRC on append."""
    for _, header in iter_batches(records, validate=False):
        if header.attributes & TRANSACTIONAL_MASK and not header.attributes & CONTROL_MASK:
            return header.producer_id, header.producer_epoch
    return None


@dataclass(eq=False)
class VerificationEntry:
    """Kafka's VerificationStateEntry: one producer's verification on one partition.
    Compared by identity: an answer counts only for the entry it was asked for."""

    producer_epoch: int
    leader_epoch: int
    started_ms: int
    verified: bool = False


class VerificationCache:
    """Every partition's verification entries on this broker (see the module docstring)."""

    def __init__(self, *, expiration_ms: int, entries_max: int = VERIFICATION_ENTRIES_MAX):
        if expiration_ms <= 0 or entries_max <= 0:
            raise ValueError("expiration_ms and entries_max must be positive")
        self.expiration_ms = expiration_ms
        self.entries_max = entries_max
        # (topic, partition, producer id) -> entry, oldest first (insertion order).
        self._entries: dict[tuple[str, int, int], VerificationEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _current(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                 leader_epoch: int, now_ms: int) -> VerificationEntry | None:
        entry = self._entries.get((tp[0], tp[1], producer_id))
        if (entry is None or entry.producer_epoch != producer_epoch
                or entry.leader_epoch != leader_epoch
                or now_ms - entry.started_ms >= self.expiration_ms):
            return None
        return entry

    def allows(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
               leader_epoch: int, now_ms: int) -> bool:
        """May the producer's batch open a transaction in ``tp`` now?"""
        entry = self._current(tp, producer_id, producer_epoch, leader_epoch, now_ms)
        return entry is not None and entry.verified

    def begin(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
              leader_epoch: int, now_ms: int) -> VerificationEntry:
        """The entry a verification about to be asked answers (an unanswered one of the
        same producer epoch and leader epoch is shared: answered by whichever comes)."""
        entry = self._current(tp, producer_id, producer_epoch, leader_epoch, now_ms)
        if entry is not None:
            return entry
        key = (tp[0], tp[1], producer_id)
        self._entries.pop(key, None)  # re-inserted last: the order stays by age
        if len(self._entries) >= self.entries_max:
            self.expire(now_ms)
            while len(self._entries) >= self.entries_max:
                del self._entries[next(iter(self._entries))]
        entry = self._entries[key] = VerificationEntry(producer_epoch, leader_epoch, now_ms)
        return entry

    def on_answer(self, tp: TopicPartition, producer_id: int, entry: VerificationEntry,
                  code: pb.ErrorCode) -> bool:
        """The coordinator answered ``code`` for ``entry``; True when the partition is now
        verified (NONE, and no marker dropped the entry meanwhile)."""
        key = (tp[0], tp[1], producer_id)
        if self._entries.get(key) is not entry:
            return False
        if code != pb.NONE:
            del self._entries[key]
            return False
        entry.verified = True
        return True

    def on_marker(self, tp: TopicPartition, producer_id: int) -> None:
        """A marker for the producer is being written to ``tp``: its transaction there
        ends, and so does what was verified for it."""
        self._entries.pop((tp[0], tp[1], producer_id), None)

    def expire(self, now_ms: int) -> None:
        self._entries = {k: e for k, e in self._entries.items()
                         if now_ms - e.started_ms < self.expiration_ms}


def verify_partitions(partitions: Iterable[TopicPartition], *, known: bool,
                      producer_id: int, producer_epoch: int, current_producer_id: int,
                      current_producer_epoch: int, preparing: bool,
                      in_transaction: frozenset[TopicPartition]
                      ) -> dict[TopicPartition, pb.ErrorCode]:
    """The coordinator's answer to AddPartitionsToTxn with verify_only (Kafka's
    ``handleVerifyPartitionsInTransaction``): nothing is written. An unknown id or
    another producer id: INVALID_PRODUCER_ID_MAPPING; another epoch: PRODUCER_FENCED;
    PrepareCommit/PrepareAbort: CONCURRENT_TRANSACTIONS; else per partition NONE if it
    is in the ongoing transaction, INVALID_TXN_STATE if not."""
    wanted = list(partitions)
    if not known or current_producer_id != producer_id:
        code = pb.INVALID_PRODUCER_ID_MAPPING
    elif current_producer_epoch != producer_epoch:
        code = pb.PRODUCER_FENCED
    elif preparing:
        code = pb.CONCURRENT_TRANSACTIONS
    else:
        return {tp: pb.NONE if tp in in_transaction else pb.INVALID_TXN_STATE
                for tp in wanted}
    return {tp: code for tp in wanted}
