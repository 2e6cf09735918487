"""Batches found damaged on disk after they were written (bit rot): what was found, the
typed error a read raises, and the one place that logs and counts each finding.

A batch is damaged when its framing (batchLength, magic, the batch running past
the segment's end), its CRC-32C (attributes..end, ``proto/batch.py``) or its
offsets (baseOffset not the previous batch's last offset + 1; lastOffsetDelta
negative) are wrong. In a compacted log (``cleanup.policy`` with ``compact``) the
cleaner removes whole batches, so a baseOffset may lie above the previous batch's
last offset + 1 (``gaps_allowed``): only one below it is damage there. baseOffset and partitionLeaderEpoch lie outside the CRC
(Kafka's design): a damaged baseOffset shows as broken contiguity, a damaged
partitionLeaderEpoch cannot be seen at all.

Who finds one: the broker's reads for consumers and followers (``Log.read``
returns the whole batches before it and a ``CorruptBatch`` on the result, or
raises ``CorruptBatchError`` when the first batch it would return is the bad
one; ``reporting_read.py`` reports those), and the background scrub of closed segments (``scrub.py``). Every finder
hands it to ``CorruptionReporter.report`` with how it was found; what to do
about it (leave leadership, truncate below ``base_offset``, fetch again) is the
replication layer's decision, not storage's.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tidewater.proto.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    LOG_OVERHEAD,
    MAGIC_V2,
    BytesLike,
)
from tidewater.proto.crc import crc32c
from tidewater.proto.errors import CorruptRecordError, InvariantViolation

log = logging.getLogger(__name__)

# How a corrupt batch was found: the label values of
# tidewater_broker_corrupt_batches_total{how}.
CONSUMER_READ = "consumer_read"
FOLLOWER_READ = "follower_read"
SCRUB = "scrub"
FOUND_BY = (CONSUMER_READ, FOLLOWER_READ, SCRUB)

REMEMBERED_MAX = 4096  # findings remembered so that each is logged and counted once


@dataclass(frozen=True, slots=True)
class CorruptBatch:
    """One damaged batch in a segment file.

    ``base_offset`` is where the batch must start (the previous batch's last
    offset + 1, or the segment's base offset): the offsets below it are in batches
    that passed every check of the read or scan that found it, so a replica may
    truncate to it and fetch the rest again. ``position`` is the batch's byte
    position in ``path``.
    """

    path: str
    position: int
    base_offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.position} (base offset {self.base_offset}): {self.reason}"


class CorruptBatchError(CorruptRecordError):
    """The first batch a read would return is damaged (CORRUPT_MESSAGE on the wire).

    ``batch.base_offset`` is the offset below which the log is good as far as the
    read went; nothing of the damaged batch is returned."""

    def __init__(self, batch: CorruptBatch):
        super().__init__(f"corrupt batch at base offset {batch.base_offset}: {batch.reason}",
                         position=batch.position, path=batch.path)
        self.batch = batch
        self.base_offset = batch.base_offset


class CorruptionReporter:
    """Logs each damaged batch at ERROR and counts it, once per batch whoever finds it
    (a consumer retrying at the bad offset would otherwise log it on every fetch).

    ``count(how)`` is called once per new finding (the broker passes its metric's
    increment). Thread-safe: the scrub reports from a worker thread, reads from the
    event loop. Remembers the last ``REMEMBERED_MAX`` findings."""

    def __init__(self, count: Callable[[str], None] | None = None):
        self._count = count
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, int, int], None] = OrderedDict()

    def report(self, batch: CorruptBatch, how: str) -> bool:
        """Log and count ``batch`` unless it was reported before; True if it is new."""
        if how not in FOUND_BY:
            raise ValueError(f"unknown way of finding a corrupt batch: {how!r}")
        key = (batch.path, batch.position, batch.base_offset)
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > REMEMBERED_MAX:
                self._seen.popitem(last=False)
        log.error("corrupt batch in %s at position %d, base offset %d, found by %s: %s",
                  batch.path, batch.position, batch.base_offset, how.replace("_", " "),
                  batch.reason)
        if self._count is not None:
            self._count(how)
        return True


# -- the checks (pure: bytes in, a reason out) ---------------------------------

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc: the first 21 bytes
FRAME = struct.Struct(">qiibI")
assert FRAME.size == ATTRIBUTES_OFFSET
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


def frame_problem(base_offset: int, batch_length: int, magic: int, expected_base_offset: int,
                  room_bytes: int, *, gaps_allowed: bool = False) -> str | None:
    """Why a batch's framing is wrong, from its first 21 bytes (``FRAME``); None if it is
    sound. ``room_bytes``: bytes from the batch's start to the end of its segment file
    (a batch never runs past it: appends write whole batches)."""
    if batch_length < BATCH_LENGTH_MIN:
        return f"batch length {batch_length} below minimum"
    if LOG_OVERHEAD + batch_length > room_bytes:
        return (f"batch of {LOG_OVERHEAD + batch_length} bytes runs past the segment end "
                f"({room_bytes} bytes left)")
    if magic != MAGIC_V2:
        return f"unsupported magic {magic}"
    if base_offset != expected_base_offset and not (gaps_allowed
                                                    and base_offset > expected_base_offset):
        return f"baseOffset {base_offset} where {expected_base_offset} was expected"
    return None


def content_problem(view: memoryview, position: int, size: int, crc: int) -> str | None:
    """Why the whole batch at ``position`` of ``view`` fails its CRC-32C or its
    lastOffsetDelta; None if it passes."""
    computed = crc32c(view[position + ATTRIBUTES_OFFSET:position + size])
    if computed != crc:
        return f"CRC mismatch: stored {crc:#010x}, computed {computed:#010x}"
    if _LAST_OFFSET_DELTA.unpack_from(view, position + _LAST_OFFSET_DELTA_AT)[0] < 0:
        return "negative lastOffsetDelta"
    return None


def truncated_problem(room_bytes: int) -> str:
    return f"truncated batch: {room_bytes} bytes at the end of the segment"


@dataclass(frozen=True, slots=True)
class ChunkCheck:
    """What ``check_chunk`` found in one chunk of a segment file."""

    verified_bytes: int  # whole sound batches from the chunk's start
    next_offset: int  # the base offset the batch after them must have
    corrupt: CorruptBatch | None = None
    # > 0: the batch at ``verified_bytes`` is whole only in a read of this many bytes
    # from there (it is larger than what is left of the chunk).
    need_bytes: int = 0


def check_chunk(buf: BytesLike, file_position: int, expected_base_offset: int, file_end: int,
                path: str, *, gaps_allowed: bool = False) -> ChunkCheck:
    """Check the batches in ``buf``, read from ``file_position`` of a segment file of
    ``file_end`` bytes, the first of which must start at ``expected_base_offset``:
    framing, contiguous offsets, CRC-32C. Stops at the first damaged batch, or at a
    batch not whole in ``buf`` (then ``need_bytes`` says how much to read)."""
    view = memoryview(buf)
    length = len(view)
    unpack = FRAME.unpack_from
    p, next_offset = 0, expected_base_offset
    problem: str | None
    while p < length:
        room = file_end - (file_position + p)
        if length - p < ATTRIBUTES_OFFSET:
            if room < ATTRIBUTES_OFFSET:
                problem = truncated_problem(room)
                break
            return ChunkCheck(p, next_offset, None, ATTRIBUTES_OFFSET)
        base_offset, batch_length, _epoch, magic, crc = unpack(view, p)
        problem = frame_problem(base_offset, batch_length, magic, next_offset, room,
                                gaps_allowed=gaps_allowed)
        if problem is not None:
            break
        size = LOG_OVERHEAD + batch_length
        if size > length - p:
            return ChunkCheck(p, next_offset, None, size)
        problem = content_problem(view, p, size, crc)
        if problem is not None:
            break
        next_offset = base_offset + _LAST_OFFSET_DELTA.unpack_from(view, p + _LAST_OFFSET_DELTA_AT)[0] + 1
        p += size
    else:
        return ChunkCheck(p, next_offset)
    if problem is None:
        raise InvariantViolation("a chunk check stopped without naming a problem")
    return ChunkCheck(p, next_offset, CorruptBatch(path, file_position + p, next_offset, problem))
