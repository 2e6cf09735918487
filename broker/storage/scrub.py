"""Background scrub: read every closed segment at a bounded rate and check each batch,
so that bit rot is found while other replicas still hold good copies, not when a
consumer finally reads the data.

Theory of operation. A pass walks the closed segments of every log (every segment
but the active one, which appends change and every read checks anyway), log by log
in name order, each from byte 0 to the size it had when the pass began, and checks
every batch: framing, contiguous offsets from the segment's base offset, CRC-32C
(``corruption.check_chunk``). The first damaged batch of a segment is handed to
``on_corrupt`` (topic-partition and a ``CorruptBatch``: path, position, the base
offset it must have) and the rest of that segment is skipped (a replica repairs
itself by truncating below the damaged batch, which removes the rest anyway).
``log.scrub.interval.ms`` after a pass ends the next one begins (and at least
``PASS_PERIOD_MIN_MS`` after it began).

The rate bound is a token bucket (``ScrubSchedule``, pure: sizes in, reads out,
time passed in as ``now_ms``): tokens accrue at ``log.scrub.bytes.per.second`` up
to one chunk (``chunk_bytes``); a read of n bytes is granted once the bucket holds
min(n, chunk) bytes' worth and takes n (the bucket may go into debt for a batch
larger than a chunk, read whole). So over any time t from the start the bytes
granted never exceed ``rate * t + max(chunk, largest read)``.

The shell (``LogScrubber``) does the I/O: it lists the closed segments (each log's
lock held only to copy its segment list), reads them through a descriptor of its
own (a segment deleted or renamed meanwhile stays readable, and its number is
never another file's), and holds no lock while it reads. Before reporting a
damaged batch it checks, under the log's lock, that the segment is still one of
the log's closed segments and was not cut since the pass began (a cut segment is
active again and its bytes may be new): otherwise what it read may be stale, and
nothing is reported. A read error (EIO) is logged and the segment skipped.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tidewater.broker.clock import mono_ms
from tidewater.broker.storage.corruption import (
    FRAME,
    ChunkCheck,
    CorruptBatch,
    check_chunk,
    frame_problem,
    truncated_problem,
)
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.segment import LogSegment
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.batch import ATTRIBUTES_OFFSET, HEADER_SIZE, LOG_OVERHEAD
from tidewater.proto.crc import crc32c

log = logging.getLogger(__name__)

# One read, and the bucket's size (the longest burst). A read ends mid-batch and the
# next one starts at that batch again: 1 MiB (Kafka's default max.message.bytes) keeps
# most batches whole in one read and the bytes read twice few.
SCRUB_CHUNK_BYTES = 1 << 20
# At most one pass a second, however small the data and short the interval: a pass
# lists the segments of every log.
PASS_PERIOD_MIN_MS = 1000
_LAST_OFFSET_DELTA_AT = 23


# -- the schedule (pure) ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Read ``length`` bytes of target ``target`` (an index into the pass's sizes) from
    ``position``, check them, then call ``ScrubSchedule.advance`` or ``skip_target``."""

    target: int
    position: int
    length: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do before ``until_ms``."""

    until_ms: int


@dataclass(frozen=True, slots=True)
class StartPass:
    """List the targets now and call ``ScrubSchedule.start_pass`` with their sizes."""


class ScrubSchedule:
    """What the scrub reads next and when: the token bucket, the pass's cursor (target,
    byte position) and the time between passes. No files, no clock of its own.

    Tokens are kept in thousandths of a byte, so that ``bytes_per_second`` accrue
    exactly per millisecond."""

    def __init__(self, *, bytes_per_second: int, interval_ms: int, chunk_bytes: int,
                 now_ms: int):
        if bytes_per_second <= 0:
            raise ValueError(f"scrub rate must be positive, got {bytes_per_second}")
        if interval_ms < 0 or chunk_bytes <= 0:
            raise ValueError("scrub interval must not be negative, chunk must be positive")
        self.bytes_per_second = bytes_per_second
        self.interval_ms = interval_ms
        self.chunk_bytes = chunk_bytes
        self._capacity = chunk_bytes * 1000
        self._tokens = self._capacity  # a full bucket: the first read goes at once
        self._refilled_ms = now_ms
        self._sizes: list[int] | None = None  # the pass's target sizes; None between passes
        self._target = 0
        self._position = 0
        self._min_length = 0  # the next read must be this long (a batch larger than a chunk)
        self._next_pass_ms = now_ms
        self._pass_started_ms = now_ms
        self.passes_started = 0
        self.passes_done = 0
        self.bytes_granted = 0  # read (what the rate bounds); a batch cut by a read twice
        self.bytes_verified = 0

    def next_action(self, now_ms: int) -> ReadChunk | Wait | StartPass:
        if self._sizes is None:
            if now_ms < self._next_pass_ms:
                return Wait(self._next_pass_ms)
            return StartPass()
        while self._target < len(self._sizes) and self._position >= self._sizes[self._target]:
            self._next_target()
        if self._target >= len(self._sizes):
            self._sizes = None
            self.passes_done += 1
            self._next_pass_ms = max(now_ms + self.interval_ms,
                                     self._pass_started_ms + PASS_PERIOD_MIN_MS)
            return Wait(self._next_pass_ms)
        length = max(min(self.chunk_bytes, self._sizes[self._target] - self._position),
                     self._min_length)
        self._refill(now_ms)
        wanted = min(length, self.chunk_bytes) * 1000
        if self._tokens < wanted:
            missing = wanted - self._tokens
            return Wait(now_ms + -(-missing // self.bytes_per_second))
        self._tokens -= length * 1000
        self.bytes_granted += length
        return ReadChunk(self._target, self._position, length)

    def start_pass(self, sizes: Sequence[int], now_ms: int) -> None:
        """Begin a pass over targets of these sizes (bytes to check in each)."""
        self._refill(now_ms)
        self._sizes = list(sizes)
        self._pass_started_ms = now_ms
        self._target = self._position = self._min_length = 0
        self.passes_started += 1

    def advance(self, verified_bytes: int, need_bytes: int = 0) -> None:
        """After a ReadChunk: ``verified_bytes`` whole sound batches were checked from its
        position; ``need_bytes`` > 0: the next batch is whole only in a read that long.
        Nothing verified and nothing needed (the file ended early) skips the target."""
        if verified_bytes < 0 or need_bytes < 0:
            raise ValueError("negative progress")
        if verified_bytes == 0 and need_bytes == 0:
            self.skip_target()
            return
        self._position += verified_bytes
        self.bytes_verified += verified_bytes
        self._min_length = need_bytes

    def skip_target(self) -> None:
        """Leave the rest of the current target unread (damaged, gone, cut)."""
        self._next_target()

    @property
    def in_pass(self) -> bool:
        return self._sizes is not None

    def _next_target(self) -> None:
        self._target += 1
        self._position = self._min_length = 0

    def _refill(self, now_ms: int) -> None:
        elapsed_ms = now_ms - self._refilled_ms
        if elapsed_ms > 0:  # a clock that goes back earns nothing
            self._tokens = min(self._capacity, self._tokens + elapsed_ms * self.bytes_per_second)
            self._refilled_ms = now_ms


# -- the shell (I/O) -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ScrubTarget:
    """One closed segment as it was when the pass began."""

    tp: TopicPartition
    log: Log
    segment: LogSegment
    size_bytes: int
    truncations: int


class LogScrubber:
    """Runs ``ScrubSchedule`` over the closed segments of ``logs()`` (the LogManager's),
    reporting each damaged batch found to ``on_corrupt(tp, batch)``. ``step`` does at
    most one read (blocking: run it in a worker thread); ``run`` loops forever."""

    def __init__(self, logs: Callable[[], Mapping[TopicPartition, Log]],
                 on_corrupt: Callable[[TopicPartition, CorruptBatch], None], *,
                 bytes_per_second: int, interval_ms: int, now_ms: int,
                 chunk_bytes: int = SCRUB_CHUNK_BYTES):
        self._logs = logs
        self._on_corrupt = on_corrupt
        self.schedule = ScrubSchedule(bytes_per_second=bytes_per_second,
                                      interval_ms=interval_ms, chunk_bytes=chunk_bytes,
                                      now_ms=now_ms)
        self._targets: list[ScrubTarget] = []
        self._buffer = memoryview(bytearray(chunk_bytes))
        self._fd = -1
        self._fd_target = -1  # the target whose file self._fd is
        self._expected_base_offset = 0  # where the next batch of the target must start
        self.corrupt_found = 0

    async def run(self, clock: Callable[[], int] = mono_ms) -> None:
        """Scrub until cancelled; each read and check runs in a worker thread."""
        try:
            while True:
                wait_ms = await asyncio.to_thread(self.step, clock())
                if wait_ms > 0:
                    await asyncio.sleep(wait_ms / 1000)
        finally:
            self.close()

    def step(self, now_ms: int) -> int:
        """Do the schedule's next action; the ms to wait before the next step."""
        action = self.schedule.next_action(now_ms)
        if isinstance(action, Wait):
            if not self.schedule.in_pass:
                self._close_fd()  # hold no file (maybe deleted since) between passes
            return max(0, action.until_ms - now_ms)
        if isinstance(action, StartPass):
            self._targets = self._list_targets()
            self.schedule.start_pass([t.size_bytes for t in self._targets], now_ms)
            return 0
        self._read_and_check(action)
        return 0

    def close(self) -> None:
        self._close_fd()

    def _list_targets(self) -> list[ScrubTarget]:
        targets = []
        for tp, partition_log in sorted(self._logs().items()):
            if partition_log.is_closed or partition_log.is_offline:
                continue
            for segment in partition_log.segments()[:-1]:  # never the active one
                targets.append(ScrubTarget(tp, partition_log, segment, segment.size_bytes,
                                           segment.truncations))
        return targets

    def _read_and_check(self, action: ReadChunk) -> None:
        target = self._targets[action.target]
        if self._fd_target != action.target:
            self._close_fd()
            try:
                self._fd = os.open(target.segment.log_path, os.O_RDONLY)
            except OSError:
                self.schedule.skip_target()  # deleted or renamed since the pass began
                return
            self._fd_target = action.target
        if action.position == 0:
            self._expected_base_offset = target.segment.base_offset
        path = str(target.segment.log_path)
        try:
            if action.length <= len(self._buffer):
                view = self._buffer[:action.length]
                if os.preadv(self._fd, [view], action.position) < action.length:
                    self.schedule.skip_target()  # shorter than when the pass began: it was cut
                    return
                checked = check_chunk(view, action.position, self._expected_base_offset,
                                      target.size_bytes, path,
                                      gaps_allowed=target.segment.config.compact)
            else:  # one batch larger than a chunk
                checked = self._check_large_batch(action.position, target.size_bytes, path)
        except OSError as e:
            log.error("scrub: cannot read %s at position %d: %s; skipping the segment", path,
                      action.position, e)
            self.schedule.skip_target()
            return
        if checked.corrupt is not None:
            self.schedule.skip_target()
            if target.log.holds_closed_segment(target.segment, target.truncations):
                self.corrupt_found += 1
                self._on_corrupt(target.tp, checked.corrupt)
            return
        self._expected_base_offset = checked.next_offset
        self.schedule.advance(checked.verified_bytes, checked.need_bytes)

    def _check_large_batch(self, position: int, file_end: int, path: str) -> ChunkCheck:
        """Check the one batch at ``position``, larger than the buffer: its CRC in pieces."""
        expected = self._expected_base_offset
        room = file_end - position
        head = os.pread(self._fd, min(room, HEADER_SIZE), position)
        if len(head) < HEADER_SIZE:
            return ChunkCheck(0, expected, CorruptBatch(path, position, expected,
                                                        truncated_problem(room)))
        base_offset, batch_length, _epoch, magic, crc = FRAME.unpack_from(head, 0)
        problem = frame_problem(base_offset, batch_length, magic, expected, room,
                                gaps_allowed=self._targets[self._fd_target].segment.config.compact)
        size = LOG_OVERHEAD + batch_length
        if problem is None:
            computed = crc32c(memoryview(head)[ATTRIBUTES_OFFSET:])
            at = position + HEADER_SIZE
            while at < position + size:
                piece = self._buffer[:min(len(self._buffer), position + size - at)]
                read = os.preadv(self._fd, [piece], at)
                if read == 0:
                    problem = truncated_problem(at - position)
                    break
                computed, at = crc32c(piece[:read], computed), at + read
            else:
                if computed != crc:
                    problem = f"CRC mismatch: stored {crc:#010x}, computed {computed:#010x}"
                elif int.from_bytes(head[_LAST_OFFSET_DELTA_AT:_LAST_OFFSET_DELTA_AT + 4],
                                    "big", signed=True) < 0:
                    problem = "negative lastOffsetDelta"
        if problem is not None:
            return ChunkCheck(0, expected, CorruptBatch(path, position, expected, problem))
        last_offset_delta = int.from_bytes(head[_LAST_OFFSET_DELTA_AT:_LAST_OFFSET_DELTA_AT + 4],
                                           "big", signed=True)
        return ChunkCheck(size, base_offset + last_offset_delta + 1)

    def _close_fd(self) -> None:
        if self._fd != -1:
            fd, self._fd, self._fd_target = self._fd, -1, -1
            try:
                os.close(fd)
            except OSError:
                pass  # read-only descriptor: nothing to lose
