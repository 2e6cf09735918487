"""A Kafka connection's transport: size-prefixed frames read into their own buffers.

Kafka's wire format is a stream of frames, each a signed 32-bit big-endian size
followed by that many bytes (a request or, the other way, a response).

``FrameConnection`` is the listener's protocol (an ``asyncio.BufferedProtocol``)
and offers the two halves ``KafkaListener`` uses: ``read_frame()`` and the
writer calls (``write``, ``writelines``, ``drain``, ``close``,
``get_extra_info``).

Why not asyncio's streams: a StreamReader copies every byte of a request three
times (the loop's read buffer into a new bytes, that into the reader's
bytearray, out of it again in ``readexactly``) and then moves the rest of its
buffer to the front. For a 256 KiB produce that cost ~250 µs of CPU against
~40 µs here (measured with ``bench/probes/frame_read.py``), on the leader, for
every byte a producer sends. Here the socket reads into a 64 KiB scratch buffer
while frames are small or a size prefix is due; once a frame's size is known
and it does not fit there, the rest of it is read straight into its own
``bytearray`` (only what had already arrived is copied, once), handed to the
reader as a read-only memoryview.

Limits: a size outside ``1..frame_bytes_max`` is reported to the reader as
``FrameSizeError`` before any buffer for it is allocated, and reading stops. A
large frame's buffer starts at twice what has arrived of it, at least
``FRAME_BUFFER_INITIAL_BYTES`` (16 KiB; at most the frame's size), and doubles as
bytes arrive (a copy each time), so memory follows what a client sent (at most
twice it, plus 16 KiB), not what its size prefix claims. (A 256 KiB produce whose
first 64 KiB arrived together is read with one 128 KiB copy.) Under TLS the buffer
grows at once to hold what the SSL protocol says it holds (``get_buffer``'s hint:
bytes that arrived), not one doubling per pass of the loop. The scratch buffer
itself starts at ``SCRATCH_INITIAL_BYTES`` (4 KiB) and becomes ``SCRATCH_BYTES``
at the first read that fills it: a connection that sends nothing, or a byte a
second, holds 4 KiB (20 KiB with a large size prefix), not 64 KiB.

Activity: ``last_active_ms`` is when the connection last completed a frame or was
written to; bytes of a frame still arriving do not count, so a client that sends a
byte a second looks idle to the listener's idle expiry (``connections.max.idle.ms``).
``requests_in_flight`` is the listener's count of requests read and not answered.
Complete frames not yet taken by the reader are bounded: above
``queued_bytes_max`` the transport stops reading until the reader catches up.
At the end of the stream the reader gets the frames that had arrived, then
``asyncio.IncompleteReadError`` (a clean end, or one inside a frame) or the
connection's error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from tidewater.broker.clock import mono_ms
from tidewater.proto.errors import InvariantViolation

SIZE_BYTES = 4
SCRATCH_BYTES = 64 * 1024
SCRATCH_INITIAL_BYTES = 4 * 1024
# A large frame's buffer starts at most this big and doubles as its bytes arrive: a
# size prefix alone (4 bytes) must not make the broker allocate the whole frame.
FRAME_BUFFER_INITIAL_BYTES = 16 * 1024
QUEUED_BYTES_MAX = 4 * 1024 * 1024
# Under TLS an answer goes to the transport in pieces of this size, each drained before
# the next: uvloop's SSL transport encrypts all it is given into one memory BIO before
# the first byte reaches the socket, so a 12 MB fetch answer was encrypted whole (and the
# BIO grown by clean reallocs) while the client, with one fetch in flight, waited idle.
TLS_WRITE_PIECE_BYTES = 256 * 1024


class FrameSizeError(Exception):
    """A size prefix outside 1..frame_bytes_max: the frame is never read."""

    def __init__(self, size: int, frame_bytes_max: int):
        super().__init__(f"frame size {size} outside 1..{frame_bytes_max}")
        self.size = size
        self.frame_bytes_max = frame_bytes_max


class FrameConnection(asyncio.BufferedProtocol):
    """One connection: frames in (``read_frame``), bytes out (``write``/``drain``).

    ``on_open(connection)`` is called when the connection is made; it starts what serves
    the connection, which owns it (and must ``close`` it)."""

    def __init__(self, on_open: Callable[[FrameConnection], Any], *, frame_bytes_max: int,
                 scratch_bytes: int = SCRATCH_BYTES,
                 scratch_initial_bytes: int = SCRATCH_INITIAL_BYTES,
                 queued_bytes_max: int = QUEUED_BYTES_MAX,
                 frame_buffer_initial_bytes: int = FRAME_BUFFER_INITIAL_BYTES):
        self._on_open = on_open
        self._frame_bytes_max = frame_bytes_max
        self._queued_bytes_max = queued_bytes_max
        # Small until a read fills it: an idle or slow connection holds 4 KiB, one that
        # streams requests gets the full scratch buffer at its first full read.
        self._scratch_bytes_max = scratch_bytes
        self._scratch = bytearray(min(scratch_bytes, scratch_initial_bytes))
        self._scratch_view = memoryview(self._scratch)
        self._scratch_offered = 0  # the size of the scratch buffer last given to a read
        self._start = 0  # unparsed bytes are _scratch[_start:_end]
        self._end = 0
        # A large frame being read into its own buffer (a bytearray, viewed).
        self._frame_view: memoryview | None = None
        self._frame_filled = 0
        self._frame_size = 0  # the large frame's size (its buffer may still be smaller)
        self._frame_buffer_initial_bytes = frame_buffer_initial_bytes
        self._frames: deque[bytes | memoryview] = deque()
        self._queued_bytes = 0
        self._error: BaseException | None = None  # given to the reader after the frames
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._is_tls = False  # set by connection_made
        self.last_active_ms = mono_ms()
        self.requests_in_flight = 0  # kept by the listener

    @property
    def frame_bytes_max(self) -> int:
        """The largest frame this connection takes now; a larger size prefix is refused
        before its body is read. Settable: a SASL listener holds it low until the client
        has authenticated (frames already parsed keep the limit they were parsed under;
        a frame still arriving is held to the new one)."""
        return self._frame_bytes_max

    @frame_bytes_max.setter
    def frame_bytes_max(self, value: int) -> None:
        lowered = value < self._frame_bytes_max
        self._frame_bytes_max = value
        if lowered and self._error is None:
            if self._frame_view is not None and self._frame_size > value:
                size = self._frame_size
                self._frame_view.release()
                self._frame_view = None
                self._frame_filled = self._frame_size = 0
                self._refuse(FrameSizeError(size, value))
            else:
                self._parse_scratch()

    # ------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        self._transport = transport  # type: ignore[assignment]
        # Under TLS get_buffer's size hint is what the SSL protocol holds (arrived, not yet
        # decrypted into ours: uvloop's and asyncio's alike); a socket's is a fixed guess.
        self._is_tls = transport.get_extra_info("sslcontext") is not None
        self._on_open(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame_view is not None:
            room = len(self._frame_view) - self._frame_filled
            if room == 0 or (self._is_tls and room < sizehint
                             and len(self._frame_view) < self._frame_size):
                self._grow_frame(sizehint if self._is_tls else 0)
            return self._frame_view[self._frame_filled:]
        if self._scratch_offered > 0 and len(self._scratch) < self._scratch_bytes_max:
            self._grow_scratch()
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._scratch) - self._end < SIZE_BYTES:
            # Full: move the partial frame (or size prefix) to the front (a frame that
            # did not fit at all has its own buffer by now).
            pending = self._end - self._start
            self._scratch[:pending] = self._scratch_view[self._start:self._end]
            self._start, self._end = 0, pending
        buffer = self._scratch_view[self._end:]
        self._scratch_offered = -len(buffer)  # made positive by a read that fills it
        return buffer

    def _grow_scratch(self) -> None:
        """The last read filled the small scratch buffer: the full one, pending bytes
        moved over."""
        pending = self._end - self._start
        grown = bytearray(self._scratch_bytes_max)
        grown[:pending] = self._scratch_view[self._start:self._end]
        self._scratch, self._scratch_view = grown, memoryview(grown)
        self._start, self._end = 0, pending
        self._scratch_offered = 0

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame_view is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                # Read-only, as kio's native reader insists (it refuses a writable buffer).
                frame = self._frame_view.toreadonly()
                self._frame_view = None
                self._push(frame)
            return
        self._end += nbytes
        if nbytes == -self._scratch_offered:
            self._scratch_offered = nbytes  # full: grow at the next get_buffer
        else:
            self._scratch_offered = 0
        if self._error is None:  # else: refused; what still arrives is dropped
            self._parse_scratch()

    def eof_received(self) -> bool:
        self._end_of_stream(None)
        # Keep a plaintext transport open so that the answers to what was read still go
        # out (the connection's task closes it); TLS cannot stay half-open.
        return self._transport is not None and self._transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._end_of_stream(exc)
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(exc or ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # ------------------------------------------------------------ reading

    async def read_frame(self) -> bytes | memoryview:
        """The next whole frame (without its size prefix): bytes, or a read-only memoryview
        of a large frame's own buffer. FrameSizeError for a refused size;
        IncompleteReadError at the end of the stream; the connection's error."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        self._queued_bytes -= len(frame)
        if (self._reading_paused and self._queued_bytes <= self._queued_bytes_max // 2
                and self._error is None and self._transport is not None):
            self._reading_paused = False
            self._transport.resume_reading()
        return frame

    def _parse_scratch(self) -> None:
        view = self._scratch_view
        start, end = self._start, self._end
        while end - start >= SIZE_BYTES:
            size = int.from_bytes(view[start:start + SIZE_BYTES], "big", signed=True)
            if not 0 < size <= self._frame_bytes_max:
                self._start = self._end = 0
                self._refuse(FrameSizeError(size, self._frame_bytes_max))
                return
            body_start = start + SIZE_BYTES
            available = end - body_start
            if available >= size:
                self._push(bytes(view[body_start:body_start + size]))
                start = body_start + size
                continue
            if SIZE_BYTES + size > len(view):
                # Too large for the scratch buffer: its own buffer, the rest read into it.
                frame = bytearray(min(size, max(self._frame_buffer_initial_bytes,
                                                2 * available)))
                frame[:available] = view[body_start:end]
                self._frame_view = memoryview(frame)
                self._frame_filled, self._frame_size = available, size
                start = end = 0
            break
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def _grow_frame(self, arrived_bytes: int = 0) -> None:
        """The large frame's buffer is too small for what has arrived (full, or under TLS
        smaller than the ``arrived_bytes`` its SSL protocol holds): twice the size, or
        room for all that arrived (at most the frame's), what was filled copied over."""
        if self._frame_view is None:
            raise InvariantViolation("growing a large frame that has no buffer")
        grown = bytearray(min(self._frame_size, max(2 * len(self._frame_view),
                                                    self._frame_filled + arrived_bytes)))
        grown[:self._frame_filled] = self._frame_view[:self._frame_filled]
        self._frame_view.release()
        self._frame_view = memoryview(grown)

    def _push(self, frame: bytes | memoryview) -> None:
        self.last_active_ms = mono_ms()
        self._frames.append(frame)
        self._queued_bytes += len(frame)
        if (self._queued_bytes > self._queued_bytes_max and not self._reading_paused
                and self._transport is not None and not self._closed):
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def _refuse(self, error: BaseException) -> None:
        """Stop reading: the reader gets the frames before, then ``error``."""
        if self._error is None:
            self._error = error
        if self._transport is not None and not self._closed and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def _end_of_stream(self, exc: BaseException | None) -> None:
        if self._error is None:
            # The partial frame's bytes are not kept: nobody reads them.
            self._error = exc if exc is not None else asyncio.IncompleteReadError(b"", None)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        if self._transport is None:
            raise InvariantViolation("a write before the connection was made")
        self.last_active_ms = mono_ms()
        self._transport.write(data)

    def writelines(self, parts: Iterable[bytes]) -> None:
        if self._transport is None:
            raise InvariantViolation("a write before the connection was made")
        self.last_active_ms = mono_ms()
        self._transport.writelines(parts)

    async def write_parts(self, parts: Iterable[bytes]) -> None:
        """Write ``parts`` in order and drain: in one ``writelines`` on a socket; under TLS
        in ``writelines`` of about TLS_WRITE_PIECE_BYTES each (large parts cut), each drained."""
        if not self._is_tls:
            self.writelines(parts)
            await self.drain()
            return
        batch: list[bytes | memoryview] = []
        batch_bytes = 0
        for part in parts:
            view = memoryview(part)
            start = 0
            while start < len(view):
                piece = view[start:start + TLS_WRITE_PIECE_BYTES - batch_bytes]
                start += len(piece)
                batch.append(piece)
                batch_bytes += len(piece)
                if batch_bytes >= TLS_WRITE_PIECE_BYTES:
                    self.writelines(batch)  # type: ignore[arg-type]
                    batch, batch_bytes = [], 0
                    await self.drain()
        if batch:
            self.writelines(batch)  # type: ignore[arg-type]
            await self.drain()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._closed:
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default if self._transport is None else self._transport.get_extra_info(
            name, default)
