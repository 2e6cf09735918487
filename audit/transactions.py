"""Transactions in the log, recomputed by the audit (plain Python: the driver runs it
over the transactional batches Spark collected; rules.py wires it in).

Kafka's formats (KIP-98), read here without the broker's code:

- batch attributes bit 4 (0x10): the batch is transactional; bit 5 (0x20): it is a
  control batch;
- a control batch holds one record whose key is ``version int16, type int16``
  (big-endian; version 0; type 0 ABORT, 1 COMMIT); its producer id is the
  transaction's, its epoch the coordinator's (>= the data's: an abort after an
  epoch bump carries the new epoch);
- ``<base>.txnindex`` beside a segment: fixed 34-byte entries ``version int16 (0),
  producer_id int64, first_offset int64, last_offset int64 (the ABORT marker),
  last_stable_offset int64``: what a broker tells a read_committed consumer to skip.

A transaction in one replica is the run of a producer id's transactional data
batches from the first one after its previous marker to its next marker. The
checks:

- ``replica_transactions``: each transaction ends with a marker, unless it is still
  open at the log end (reported as open, not a violation); a data batch of a higher
  epoch while a transaction of a lower one is open (no marker between) is a
  transaction left without its end; a marker whose epoch is below its
  transaction's data is a zombie's marker;
- ``markers_disagree``: replicas of one partition hold the same markers (offset,
  producer id, type) over the offsets every one of them holds;
- ``read_committed_leaks``: the read_committed view a broker serves (its log minus
  control batches minus what its ``.txnindex`` entries skip) holds no data batch of
  a transaction the log's markers abort.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.audit.reader import RecordDecodeError, decode_batch_records

ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_NAMES = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}
_CONTROL_KEY = struct.Struct(">hh")
TXN_INDEX_SUFFIX = ".txnindex"
_TXN_INDEX_ENTRY = struct.Struct(">hqqqq")
assert _TXN_INDEX_ENTRY.size == 34


@dataclass(frozen=True, slots=True)
class TxnBatch:
    """A transactional batch of one replica; ``control`` None for data, else the
    marker's type (CONTROL_ABORT, CONTROL_COMMIT, or another number: unknown)."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    control: int | None = None


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    producer_id: int
    producer_epoch: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    marker_offset: int


@dataclass(slots=True)
class ReplicaTransactions:
    committed: int = 0
    aborted: list[AbortedTransaction] = field(default_factory=list)
    open: list[OpenTransaction] = field(default_factory=list)  # at the log end
    markers: dict[int, tuple[int, int]] = field(default_factory=dict)  # offset -> (pid, type)
    violations: list[tuple[int, str]] = field(default_factory=list)  # (offset, detail)


class ControlKeyError(ValueError):
    pass


def control_type(key: bytes | None) -> int:
    """The type of a control record's key (version int16, type int16)."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise ControlKeyError(f"control record key {key!r} is not version int16 + type int16")
    version, kind = _CONTROL_KEY.unpack_from(key)
    if version != 0:
        raise ControlKeyError(f"control record key version {version} (only 0 is known)")
    return kind


def read_control_type(segment_path: str, position: int, size_bytes: int) -> int:
    """The marker type of the control batch at ``position`` in a segment file."""
    with open(segment_path, "rb") as f:
        f.seek(position)
        buf = f.read(size_bytes)
    try:
        records = decode_batch_records(buf, 0, len(buf))
    except (RecordDecodeError, struct.error) as e:
        raise ControlKeyError(f"control batch at {position}: {e}") from None
    if len(records) != 1:
        raise ControlKeyError(f"control batch at {position} holds {len(records)} records, not 1")
    return control_type(records[0].key)


def replica_transactions(batches: Iterable[TxnBatch]) -> ReplicaTransactions:
    """Replay one replica's transactional batches in offset order (module docstring)."""
    out = ReplicaTransactions()
    open_by_producer: dict[int, OpenTransaction] = {}
    for b in sorted(batches, key=lambda b: b.base_offset):
        current = open_by_producer.get(b.producer_id)
        if b.control is None:
            if current is None:
                open_by_producer[b.producer_id] = OpenTransaction(
                    b.producer_id, b.producer_epoch, b.base_offset)
            elif b.producer_epoch > current.producer_epoch:
                out.violations.append((current.first_offset, (
                    f"producer {b.producer_id} epoch {current.producer_epoch}: transaction "
                    f"from offset {current.first_offset} has no COMMIT or ABORT before "
                    f"epoch {b.producer_epoch} writes at offset {b.base_offset}")))
                open_by_producer[b.producer_id] = OpenTransaction(
                    b.producer_id, b.producer_epoch, b.base_offset)
            continue
        out.markers[b.base_offset] = (b.producer_id, b.control)
        if b.control not in CONTROL_NAMES:
            out.violations.append((b.base_offset, (
                f"producer {b.producer_id}: control batch of unknown type {b.control}")))
            continue
        if current is None:
            continue  # a marker for a partition the transaction wrote nothing to: allowed
        del open_by_producer[b.producer_id]
        if b.producer_epoch < current.producer_epoch:
            out.violations.append((b.base_offset, (
                f"producer {b.producer_id}: {CONTROL_NAMES[b.control]} marker of epoch "
                f"{b.producer_epoch} ends a transaction of epoch {current.producer_epoch} "
                f"(from offset {current.first_offset})")))
        if b.control == CONTROL_ABORT:
            out.aborted.append(AbortedTransaction(b.producer_id, current.first_offset,
                                                  b.base_offset))
        else:
            out.committed += 1
    out.open = sorted(open_by_producer.values(), key=lambda t: t.first_offset)
    return out


def markers_disagree(replicas: dict[int, tuple[int, int, dict[int, tuple[int, int]]]]
                     ) -> list[tuple[int, int, str]]:
    """``replicas``: broker id -> (first offset, log end offset, markers as in
    ReplicaTransactions) of one partition; (broker, offset, detail) for every marker
    one replica holds and another does not (or holds otherwise), over the offsets
    every replica holds."""
    if len(replicas) < 2:
        return []
    low = max(first for first, _end, _m in replicas.values())
    high = min(end for _first, end, _m in replicas.values())  # exclusive
    out: list[tuple[int, int, str]] = []
    reference_broker = min(replicas)
    reference = {o: m for o, m in replicas[reference_broker][2].items() if low <= o < high}
    for broker, (_first, _end, markers) in sorted(replicas.items()):
        if broker == reference_broker:
            continue
        mine = {o: m for o, m in markers.items() if low <= o < high}
        for offset in sorted(set(reference) | set(mine)):
            theirs, ours = reference.get(offset), mine.get(offset)
            if theirs != ours:
                out.append((broker, offset, (
                    f"marker at offset {offset}: broker {broker} holds {_marker_text(ours)}, "
                    f"broker {reference_broker} {_marker_text(theirs)}")))
    return out


def _marker_text(marker: tuple[int, int] | None) -> str:
    if marker is None:
        return "none"
    pid, kind = marker
    return f"{CONTROL_NAMES.get(kind, f'type {kind}')} of producer {pid}"


def read_txn_index(path: str | Path) -> list[AbortedTransaction]:
    """A ``.txnindex`` file's entries (a torn tail is ignored, as the broker does)."""
    data = Path(path).read_bytes()
    out = []
    for start in range(0, len(data) - len(data) % _TXN_INDEX_ENTRY.size, _TXN_INDEX_ENTRY.size):
        version, pid, first, last, _lso = _TXN_INDEX_ENTRY.unpack_from(data, start)
        if version != 0:
            break
        out.append(AbortedTransaction(pid, first, last))
    return out


def read_committed_leaks(batches: Iterable[TxnBatch], aborted: list[AbortedTransaction],
                         index: list[AbortedTransaction]) -> list[tuple[int, str]]:
    """Data batches a read_committed consumer of this replica would be given although
    the log's markers abort them: the view skips control batches and, per ``index``
    entry (the broker's ``.txnindex``), the producer's batches from the entry's first
    offset to its marker. ``aborted``: what the markers say (replica_transactions)."""
    def skipped(b: TxnBatch) -> bool:
        return any(e.producer_id == b.producer_id and e.first_offset <= b.base_offset
                   <= e.marker_offset for e in index)

    out = []
    for b in sorted(batches, key=lambda b: b.base_offset):
        if b.control is not None:
            continue
        for t in aborted:
            if (t.producer_id == b.producer_id and t.first_offset <= b.base_offset
                    < t.marker_offset and not skipped(b)):
                out.append((b.base_offset, (
                    f"producer {b.producer_id}: batch {b.base_offset}-{b.last_offset} of the "
                    f"transaction aborted at {t.marker_offset} is in the read_committed view "
                    f"(no .txnindex entry covers it)")))
                break
    return out
