"""The aborted-transaction index: ``<base>.txnindex`` beside each segment (Kafka's
TransactionIndex).

Every ABORT marker appended to a partition adds one entry to the index file of
the segment that holds the marker. A read_committed fetch asks which aborted
transactions overlap what it returns (``aborted_between``) and sends them to the
consumer, which drops those producers' records from each transaction's first
offset until its ABORT marker.

File format (Kafka's, version 0): no header, a sequence of fixed 34-byte
entries, all big-endian::

    version            int16  0
    producer_id        int64
    first_offset       int64  the transaction's first offset in this partition
    last_offset        int64  the offset of its ABORT marker
    last_stable_offset int64  the partition's last stable offset once it ended

Entries are in marker order (``last_offset`` ascending). A torn tail (a size
that is not a multiple of 34) is cut off on load; an entry of another version
ends the file's readable part there (the rest is rebuilt, below).

Durability: entries are written without fsync; a roll's background flush
fsyncs the rolled segment's file with the roll's producer snapshot (before the
recovery point moves), and close fsyncs them all. The producer-state rebuild on
open re-reads the markers after the latest producer snapshot and re-adds any
entry lost in a crash (``add`` ignores an entry at or below the last one known,
so the replay is idempotent). Known gap: a crash that keeps a roll's snapshot
file but loses the rolled segment's newest entries (both were unsynced) is not
repaired (Kafka rebuilds the index of every segment it recovers).

Truncation drops entries whose marker is cut; a segment's file goes with the
segment (``segment.py`` deletes and renames it with its files); the cleaner
moves a cleaned group's entries to the cleaned segment and drops those whose
ABORT marker it removed (an entry without its marker would make a consumer skip
the producer's later batches).

Memory: the entries are kept in memory per segment (aborted transactions are
rare next to records: 34 bytes each).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from tidewater.broker.storage.segment import TXN_INDEX_SUFFIX, segment_file_name, storage_error

TXN_INDEX_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = 34
assert _ENTRY.size == ENTRY_SIZE


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(entry: AbortedTxn) -> bytes:
    return _ENTRY.pack(TXN_INDEX_VERSION, *entry)


def decode_entries(data: bytes) -> tuple[list[AbortedTxn], int]:
    """The readable entries of a file's bytes and how many bytes they take (the rest is a
    torn tail or an entry of an unknown version)."""
    entries = []
    position = 0
    while position + ENTRY_SIZE <= len(data):
        version, *fields = _ENTRY.unpack_from(data, position)
        if version != TXN_INDEX_VERSION:
            break
        entries.append(AbortedTxn(*fields))
        position += ENTRY_SIZE
    return entries, position


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return directory / segment_file_name(base_offset, TXN_INDEX_SUFFIX)


class TxnIndexes:
    """The ``.txnindex`` files of one log directory, by segment base offset."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._by_segment: dict[int, list[AbortedTxn]] = {}

    def load(self, segment_bases: Iterable[int]) -> None:
        """Read each segment's file (cutting a torn or unreadable tail)."""
        self._by_segment = {}
        for base in segment_bases:
            path = txn_index_path(self.directory, base)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as e:
                raise storage_error("cannot read transaction index", path, e) from e
            entries, used = decode_entries(data)
            if used != len(data):
                try:
                    os.truncate(path, used)
                except OSError as e:
                    raise storage_error("cannot cut transaction index", path, e) from e
            if entries:
                self._by_segment[base] = entries

    @property
    def last_offset(self) -> int:
        """The marker offset of the newest entry, -1 when there is none."""
        for base in sorted(self._by_segment, reverse=True):
            if self._by_segment[base]:
                return self._by_segment[base][-1].last_offset
        return -1

    def add(self, segment_base: int, entry: AbortedTxn) -> None:
        """Append ``entry`` to the segment's file unless an entry at or after its marker is
        known already (a replay after a restart)."""
        if entry.last_offset <= self.last_offset:
            return
        path = txn_index_path(self.directory, segment_base)
        try:
            with open(path, "ab") as f:
                f.write(encode_entry(entry))
        except OSError as e:
            raise storage_error("cannot write transaction index", path, e) from e
        self._by_segment.setdefault(segment_base, []).append(entry)

    def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions a read of [start_offset, end_offset) overlaps: marker at or
        after the start, first offset before the end; oldest first."""
        found = []
        for base in sorted(self._by_segment):
            for entry in self._by_segment[base]:
                if entry.last_offset >= start_offset and entry.first_offset < end_offset:
                    found.append(entry)
        return found

    def entries(self) -> list[tuple[int, AbortedTxn]]:
        return [(base, e) for base in sorted(self._by_segment) for e in self._by_segment[base]]

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or above ``offset`` (the log was cut there)."""
        for base in sorted(self._by_segment):
            entries = self._by_segment[base]
            kept = [e for e in entries if e.last_offset < offset]
            if len(kept) != len(entries):
                self._rewrite(base, kept)

    def forget_segments(self, bases: Iterable[int]) -> None:
        """The segments are gone (their files went with them, ``segment.py``)."""
        for base in bases:
            self._by_segment.pop(base, None)

    def forget_below(self, base_offset: int) -> None:
        for base in [b for b in self._by_segment if b < base_offset]:
            del self._by_segment[base]

    def clear(self) -> None:
        self._by_segment = {}

    def merge_into(self, base_offset: int, old_bases: Iterable[int], *,
                   dropped: set[int] | frozenset[int] = frozenset()) -> None:
        """The cleaner replaced the segments ``old_bases`` with one at ``base_offset``:
        their entries go to its file, except those whose ABORT marker it removed (marker
        offsets in ``dropped``)."""
        merged: list[AbortedTxn] = []
        for base in sorted(old_bases):
            merged += self._by_segment.pop(base, [])
        self._rewrite(base_offset, [e for e in merged if e.last_offset not in dropped])

    def _rewrite(self, base: int, entries: list[AbortedTxn]) -> None:
        path = txn_index_path(self.directory, base)
        try:
            if entries:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(b"".join(map(encode_entry, entries)))
                os.replace(tmp, path)
            else:
                path.unlink(missing_ok=True)
        except OSError as e:
            raise storage_error("cannot rewrite transaction index", path, e) from e
        if entries:
            self._by_segment[base] = entries
        else:
            self._by_segment.pop(base, None)

    def sync(self) -> None:
        """fsync every file (a flush or close)."""
        for base in list(self._by_segment):
            path = txn_index_path(self.directory, base)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise storage_error("cannot open transaction index", path, e) from e
            try:
                os.fsync(fd)
            except OSError as e:
                raise storage_error("cannot fsync transaction index", path, e) from e
            finally:
                os.close(fd)
