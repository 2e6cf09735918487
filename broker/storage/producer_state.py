"""Each idempotent and transactional producer's state in one partition replica
(Kafka's ProducerStateManager).

Theory of operation. A batch whose header carries a producer id (>= 0) belongs to
an idempotent producer: ``producerEpoch`` and ``baseSequence`` number its batches
per partition, the records of a batch taking the sequences ``baseSequence ..
baseSequence + lastOffsetDelta`` (wrapping after 2^31 - 1 to 0). Per producer the
state keeps its epoch, the sequence ranges and offsets of its last
``BATCHES_KEPT`` (5) batches and the timestamp of its last batch. It is a pure
class: the log feeds it batches and time; it reads and writes no file itself.

Leader appends (``check_leader_append``), per batch with a producer id, in
Kafka's order (ProducerAppendInfo: duplicate first, then epoch, then sequence).
One difference from Kafka 3.x: since KIP-360 Kafka takes any first sequence from
a producer it has no state for; here that is UNKNOWN_PRODUCER_ID unless the
sequence is 0 (Kafka 2.4's rule), so a producer whose state expired or was
truncated away starts a new epoch instead of silently continuing a gap (every
client in use handles the error by bumping its epoch):

=========================================== ===========================================
batch                                       answer
=========================================== ===========================================
same epoch, same first and last sequence as ``Duplicate``: the original offsets, nothing
one of the last five batches                appended (a retry whose answer was lost)
epoch below the producer's                  INVALID_PRODUCER_EPOCH
no state for the producer, sequence != 0    UNKNOWN_PRODUCER_ID (its batches expired or
                                            were deleted; the producer starts again)
epoch above the producer's, sequence != 0   OUT_OF_ORDER_SEQUENCE_NUMBER
same epoch, first sequence != last + 1      OUT_OF_ORDER_SEQUENCE_NUMBER (a gap, or a
                                            repeat older than the last five)
anything else                               appended; ``on_batch`` records it
=========================================== ===========================================

An append that holds a duplicate and anything else (a new batch) is refused with
INVALID_REQUEST, nothing written: answering the duplicate's offsets would
acknowledge batches never written (Kafka allows one batch per partition in a
request; ours may carry more, and retries go alone).

Followers and recovery do not validate (the leader did): ``on_batch`` with the
batches they copy or read builds the same state, so a new leader deduplicates a
retry first sent to the old one. A higher epoch replaces the producer's batches.
``map_end_offset``: the state covers every batch below it.

Snapshot file ``<offset>.snapshot`` (20-digit zero-padded map end offset, in the
partition directory), Kafka's ProducerSnapshot version 1, all big-endian::

    version                    int16   1
    crc                        uint32  CRC-32C of every byte after this field
    entry count                int32
    per producer:
      producer_id              int64
      producer_epoch           int16
      last_sequence            int32   -1: no batch remembered
      last_offset              int64   of its last batch, -1: none
      offset_delta             int32   last_offset - first offset of that batch
      timestamp                int64   its last batch's max timestamp (ms)
      coordinator_epoch        int32   of its last marker, -1: none
      current_txn_first_offset int64   first offset of its open transaction, -1: none

As in Kafka a snapshot keeps only each producer's last batch: after a restart
the batches read back after the snapshot refill the last five. A file that is
short, of another version or fails its CRC is ``CorruptFileError``; the log then
ignores it and rebuilds from an older snapshot or the log start.

Expiry: a producer whose last batch is ``producer.id.expiration.ms`` old or more
is forgotten (``remove_expired``); its next batch must start at sequence 0. A
producer with a transaction open is never forgotten (Kafka's rule): its first
offset holds the last stable offset back until a marker ends it.

Transactions (KIP-98). A batch with the transactional attribute bit opens the
producer's transaction at its base offset unless one is open
(``current_txn_first_offset``); a control batch (marker, ``proto/control_records.py``)
ends it: ``on_marker`` returns the ``CompletedTxn`` (first offset, the marker's
offset, aborted or not) and the last stable offset as it stands once the
transaction is gone (``last_stable_offset_after``: the first offset of the
oldest transaction still open, else the marker's offset + 1), which is what an
ABORT's ``.txnindex`` entry records. ``first_unstable_offset`` is the first
offset of the oldest open transaction (None: none open); the log's last
stable offset is ``min(first_unstable_offset, high watermark)``.

Leader checks of transactions (Kafka's ProducerAppendInfo):

=========================================== ===========================================
batch                                       answer
=========================================== ===========================================
non-transactional batch, same epoch, while  INVALID_TXN_STATE
the producer has a transaction open
marker, coordinator epoch below the one     TRANSACTION_COORDINATOR_FENCED (a stale
the producer's last marker carried          coordinator)
marker, producer epoch below the producer's INVALID_PRODUCER_EPOCH
=========================================== ===========================================

A marker for a producer with no open transaction is written all the same (the
coordinator retries markers whose answers were lost; Kafka does the same).
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from tidewater.proto.crc import crc32c
from tidewater.proto.errors import (
    CorruptFileError,
    InvalidProducerEpochError,
    InvalidRequestError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)

BATCHES_KEPT = 5
SEQUENCE_MAX = 2**31 - 1
NO_PRODUCER_ID = -1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000  # Kafka's producer.id.expiration.ms

_SNAPSHOT_HEAD = struct.Struct(">hIi")  # version, crc, entry count
_CRC_FROM = 6  # the CRC covers everything after version and crc
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
assert _SNAPSHOT_HEAD.size == 10 and _SNAPSHOT_ENTRY.size == 46


def last_sequence_of(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (sequences wrap to 0 after 2^31 - 1)."""
    if base_sequence > SEQUENCE_MAX - last_offset_delta:
        return last_offset_delta - (SEQUENCE_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def first_sequence_of(last_sequence: int, offset_delta: int) -> int:
    if last_sequence < offset_delta:
        return SEQUENCE_MAX - (offset_delta - last_sequence) + 1
    return last_sequence - offset_delta


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (next_sequence == 0
                                                  and last_sequence == SEQUENCE_MAX)


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> int | None:
    stem, suffix = name[:-len(SNAPSHOT_SUFFIX)], name[-len(SNAPSHOT_SUFFIX):]
    if suffix != SNAPSHOT_SUFFIX or len(stem) != 20 or not stem.isascii() or not stem.isdigit():
        return None
    return int(stem)


class BatchMetadata(NamedTuple):
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp_ms: int


class ProducerBatch(NamedTuple):
    """What a leader append checks of one batch (its header's fields)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int
    is_transactional: bool = False


class CompletedTxn(NamedTuple):
    """A transaction a marker ended: its first offset and the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class Duplicate(NamedTuple):
    """A retried batch already in the log: answer its original offsets."""

    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    producer_epoch: int
    last_timestamp_ms: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1  # -1: no transaction open
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_sequence: int,
                       last_sequence: int) -> BatchMetadata | None:
        if epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                return batch
        return None


class ProducerStateManager:
    """Producers' state of one partition replica (see the module docstring)."""

    def __init__(self, *, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT):
        self.expiration_ms = expiration_ms
        self.entries: dict[int, ProducerEntry] = {}
        self.map_end_offset = 0
        # Producer id -> first offset of its open transaction: the entries' open
        # transactions, kept apart so the last stable offset costs O(open ones), not
        # O(producers), on every fetch.
        self._ongoing: dict[int, int] = {}

    # -- leader checks -------------------------------------------------------

    def check_leader_append(self, batches: Iterable[ProducerBatch], *,
                            coordinator_origin: bool = False) -> Duplicate | None:
        """Check a leader append's batches in order (the table in the module docstring).

        Returns the duplicate when the append repeats batches already written (the append
        must then write nothing and answer their offsets), None if every batch may be
        appended; raises the typed error of the first batch refused (nothing may be
        appended then). An append holding a duplicate and anything else is refused
        (INVALID_REQUEST): answering the duplicate's offsets for batches never written
        would lose them (Kafka has one batch per partition in a request).

        ``coordinator_origin``: the group coordinator's own append (Kafka's
        ``AppendOrigin.COORDINATOR``): a transactional batch without a sequence (its
        TxnOffsetCommit offsets) is taken with the epoch check only, as Kafka skips the
        sequence checks of a coordinator's batches; a client's such batch is refused."""
        batches = [ProducerBatch(*b) for b in batches]
        duplicates = [self._find_duplicate(*b[:4]) for b in batches]
        if any(duplicates):
            return _whole_duplicate(duplicates)
        # (epoch, last sequence) of producers as the earlier batches of this append leave them
        pending: dict[int, tuple[int, int]] = {}
        for producer_id, epoch, base_sequence, last_offset_delta, transactional in batches:
            if producer_id < 0:
                continue
            if coordinator_origin and transactional and epoch >= 0 and base_sequence < 0:
                current = self.entries.get(producer_id)
                if current is not None and epoch < current.producer_epoch:
                    raise InvalidProducerEpochError(
                        f"producer {producer_id}: epoch {epoch} is older than its epoch "
                        f"{current.producer_epoch}")
                continue
            if epoch < 0 or base_sequence < 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id}: batch without epoch or sequence "
                    f"(epoch {epoch}, base sequence {base_sequence})")
            last_sequence = last_sequence_of(base_sequence, last_offset_delta)
            entry = self.entries.get(producer_id)
            known = pending.get(producer_id)
            if known is None and entry is not None:
                known = (entry.producer_epoch, entry.last_sequence)
            self._check_sequence(producer_id, known, epoch, base_sequence)
            if (not transactional and entry is not None and entry.producer_epoch == epoch
                    and entry.current_txn_first_offset >= 0):
                raise InvalidTxnStateError(
                    f"producer {producer_id}: a non-transactional batch while its "
                    f"transaction from offset {entry.current_txn_first_offset} is open")
            pending[producer_id] = (epoch, last_sequence)
        return None

    def check_marker(self, producer_id: int, producer_epoch: int,
                     coordinator_epoch: int) -> None:
        """May the coordinator end this producer's transaction here (the table above)?"""
        entry = self.entries.get(producer_id)
        if entry is None:
            return
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"producer {producer_id}: marker from coordinator epoch {coordinator_epoch}, "
                f"its last marker came from epoch {entry.coordinator_epoch}")
        if producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id}: marker with epoch {producer_epoch} is older than "
                f"its epoch {entry.producer_epoch}")

    def _find_duplicate(self, producer_id: int, epoch: int, base_sequence: int,
                        last_offset_delta: int) -> BatchMetadata | None:
        entry = self.entries.get(producer_id) if producer_id >= 0 else None
        if entry is None or base_sequence < 0:
            return None
        return entry.find_duplicate(epoch, base_sequence,
                                    last_sequence_of(base_sequence, last_offset_delta))

    @staticmethod
    def _check_sequence(producer_id: int, known: tuple[int, int] | None, epoch: int,
                        first_sequence: int) -> None:
        if known is None:
            if first_sequence != 0:
                raise UnknownProducerIdError(
                    f"no state for producer {producer_id} in this partition and its batch "
                    f"starts at sequence {first_sequence}: its earlier batches expired or "
                    "were deleted")
            return
        known_epoch, known_last = known
        if epoch < known_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id}: epoch {epoch} is older than its epoch {known_epoch}")
        if epoch > known_epoch:
            if first_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id}: new epoch {epoch} starts at sequence "
                    f"{first_sequence}, not 0")
            return
        if not in_sequence(known_last, first_sequence):
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch}: sequence {first_sequence} after "
                f"{known_last}")

    # -- updates -------------------------------------------------------------

    def on_batch(self, producer_id: int, epoch: int, base_sequence: int, first_offset: int,
                 last_offset: int, timestamp_ms: int, *, is_transactional: bool = False
                 ) -> None:
        """Record a batch now in the log (leader after its append, follower, recovery).
        Markers go to ``on_marker`` instead."""
        if producer_id < 0:
            return
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch != entry.producer_epoch:
            # A new epoch numbers from 0 again: the old epoch's batches can no longer recur.
            # (A follower copies what the leader wrote, an older epoch included.)
            entry.producer_epoch = epoch
            entry.batches.clear()
        if base_sequence >= 0:
            last_sequence = last_sequence_of(base_sequence, last_offset - first_offset)
            entry.batches.append(BatchMetadata(base_sequence, last_sequence, first_offset,
                                               last_offset, timestamp_ms))
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        if is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            self._ongoing[producer_id] = first_offset

    def on_marker(self, producer_id: int, epoch: int, offset: int, timestamp_ms: int, *,
                  committed: bool, coordinator_epoch: int) -> CompletedTxn | None:
        """Record a marker now in the log at ``offset``; the transaction it ended (None
        when none was open: a retried marker)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch != entry.producer_epoch:
            # The coordinator ends a fenced producer's transaction with the bumped epoch.
            entry.producer_epoch = epoch
            entry.batches.clear()
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        first_offset = entry.current_txn_first_offset
        entry.current_txn_first_offset = -1
        self._ongoing.pop(producer_id, None)
        if first_offset < 0:
            return None
        return CompletedTxn(producer_id, first_offset, offset, not committed)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction; None when none is open."""
        return min(self._ongoing.values(), default=None)

    def last_stable_offset_after(self, completed: CompletedTxn) -> int:
        """The last stable offset once ``completed`` is gone (Kafka's
        ``lastStableOffset(completedTxn)``): the oldest transaction still open, else the
        offset after the marker."""
        first = self.first_unstable_offset
        return first if first is not None else completed.last_offset + 1

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Has the producer, at this epoch, a transaction open here (Kafka's
        ``hasOngoingTransaction``): its next batch needs no verification (KIP-890)."""
        if producer_id not in self._ongoing:
            return False
        entry = self.entries.get(producer_id)
        return entry is not None and entry.producer_epoch == producer_epoch

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of each open transaction."""
        return dict(self._ongoing)

    def on_batches_end(self, next_offset: int) -> None:
        """The state now covers every batch below ``next_offset``."""
        self.map_end_offset = max(self.map_end_offset, next_offset)

    def clear(self, map_end_offset: int = 0) -> None:
        self.entries.clear()
        self._ongoing.clear()
        self.map_end_offset = map_end_offset

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for ``expiration_ms``; returns their ids."""
        expired = [pid for pid, entry in self.entries.items()
                   if now_ms - entry.last_timestamp_ms >= self.expiration_ms
                   and entry.current_txn_first_offset < 0]
        for pid in expired:
            del self.entries[pid]
        return expired

    # -- snapshots -------------------------------------------------------------

    def snapshot_bytes(self) -> bytes:
        body = bytearray(struct.pack(">i", len(self.entries)))
        for entry in sorted(self.entries.values(), key=lambda e: e.producer_id):
            if entry.batches:
                last = entry.batches[-1]
                sequence, offset = last.last_sequence, last.last_offset
                delta = last.last_offset - last.first_offset
            else:
                sequence, offset, delta = -1, -1, 0
            body += _SNAPSHOT_ENTRY.pack(entry.producer_id, entry.producer_epoch, sequence,
                                         offset, delta, entry.last_timestamp_ms,
                                         entry.coordinator_epoch,
                                         entry.current_txn_first_offset)
        return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(bytes(body))) + bytes(body)

    def load_snapshot(self, data: bytes, map_end_offset: int, *, path: str = "",
                      now_ms: int | None = None) -> None:
        """Replace the state with a snapshot's (CorruptFileError if it is damaged; the
        state is then unchanged). Producers already expired at ``now_ms`` are dropped."""
        entries = {e.producer_id: e for e in decode_snapshot(data, path=path)}
        self.entries = entries
        self._ongoing = {pid: e.current_txn_first_offset for pid, e in entries.items()
                         if e.current_txn_first_offset >= 0}
        self.map_end_offset = map_end_offset
        if now_ms is not None:
            self.remove_expired(now_ms)


def _whole_duplicate(duplicates: list[BatchMetadata | None]) -> Duplicate:
    """The offsets of an append that repeats, in order, batches written one after another;
    anything else is an InvalidRequestError."""
    found = [d for d in duplicates if d is not None]
    contiguous = all(b.first_offset == a.last_offset + 1 for a, b in itertools.pairwise(found))
    if len(found) != len(duplicates) or not contiguous:
        raise InvalidRequestError("an idempotent batch already written comes with other "
                                  "batches: retry it alone")
    return Duplicate(found[0].first_offset, found[-1].last_offset)


def decode_snapshot(data: bytes, *, path: str = "") -> list[ProducerEntry]:
    """The entries of a snapshot file's bytes; CorruptFileError if damaged."""
    if len(data) < _SNAPSHOT_HEAD.size:
        raise CorruptFileError(f"producer snapshot of {len(data)} bytes is too short", path=path)
    version, crc, count = _SNAPSHOT_HEAD.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptFileError(f"producer snapshot version {version}, not 1", path=path)
    if crc32c(data[_CRC_FROM:]) != crc:
        raise CorruptFileError("producer snapshot fails its CRC", path=path)
    if count < 0 or len(data) != _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size:
        raise CorruptFileError(f"producer snapshot of {len(data)} bytes cannot hold "
                               f"{count} entries", path=path)
    entries = []
    for i in range(count):
        (producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp_ms,
         coordinator_epoch, txn_first_offset) = _SNAPSHOT_ENTRY.unpack_from(
            data, _SNAPSHOT_HEAD.size + i * _SNAPSHOT_ENTRY.size)
        entry = ProducerEntry(producer_id, epoch, timestamp_ms, coordinator_epoch,
                              max(txn_first_offset, -1))
        if last_sequence >= 0 and last_offset >= 0:
            entry.batches.append(BatchMetadata(
                first_sequence_of(last_sequence, offset_delta), last_sequence,
                last_offset - offset_delta, last_offset, timestamp_ms))
        entries.append(entry)
    return entries
