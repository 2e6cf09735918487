"""The Kafka listener's frame reader, driven as the event loop drives a BufferedProtocol:
``get_buffer`` then ``buffer_updated`` with however many bytes the socket gave."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.kafka.framing import FrameConnection, FrameSizeError

pytestmark = pytest.mark.timeout(60)

SCRATCH = 64  # small, so that frames of a few hundred bytes take the large-frame path


class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.paused = False
        self.pauses = 0
        self.written: list[bytes] = []
        self.closed = False

    def pause_reading(self):
        self.paused = True
        self.pauses += 1

    def resume_reading(self):
        self.paused = False

    def write(self, data):
        self.written.append(bytes(data))

    def writelines(self, parts):
        self.written.append(b"".join(parts))

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def connection(frame_bytes_max=1 << 20, queued_bytes_max=1 << 20, frame_buffer_initial=128):
    opened = []
    conn = FrameConnection(opened.append, frame_bytes_max=frame_bytes_max,
                           scratch_bytes=SCRATCH, queued_bytes_max=queued_bytes_max,
                           frame_buffer_initial_bytes=frame_buffer_initial)
    transport = FakeTransport()
    conn.connection_made(transport)
    assert opened == [conn]
    return conn, transport


def feed(conn: FrameConnection, data: bytes, chunks: list[int]) -> None:
    """Hand ``data`` to the protocol in reads of at most ``chunks[i]`` bytes (cycled)."""
    position, i = 0, 0
    while position < len(data):
        buffer = conn.get_buffer(-1)
        assert len(buffer) > 0, "the protocol offered an empty buffer"
        n = min(len(buffer), chunks[i % len(chunks)], len(data) - position)
        buffer[:n] = data[position:position + n]
        conn.buffer_updated(n)
        position += n
        i += 1


def framed(frames: list[bytes]) -> bytes:
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)


async def read_all(conn: FrameConnection, count: int) -> list[bytes]:
    return [bytes(await conn.read_frame()) for _ in range(count)]


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(st.binary(min_size=1, max_size=1200), min_size=1, max_size=12),
       chunks=st.lists(st.integers(1, 300), min_size=1, max_size=6))
def test_frames_come_out_whole_however_the_bytes_arrive(frames, chunks):
    async def run():
        conn, _ = connection()
        feed(conn, framed(frames), chunks)
        assert await read_all(conn, len(frames)) == frames
        conn.eof_received()
        with pytest.raises(asyncio.IncompleteReadError):
            await conn.read_frame()
    asyncio.run(run())


async def test_a_large_frame_is_read_into_its_own_buffer():
    conn, _ = connection(frame_buffer_initial=1 << 20)
    big = bytes(range(256)) * 40  # 10 KiB against a 64-byte scratch buffer
    data = framed([b"small", big, b"after"])
    buffers = []
    position = 0
    while position < len(data):
        buffer = conn.get_buffer(-1)
        buffers.append(len(buffer))
        n = min(len(buffer), len(data) - position)
        buffer[:n] = data[position:position + n]
        conn.buffer_updated(n)
        position += n
    assert await read_all(conn, 3) == [b"small", big, b"after"]
    assert max(buffers) >= len(big) - SCRATCH  # the socket read straight into the frame


async def test_a_claimed_size_is_not_allocated_before_its_bytes_arrive():
    """A size prefix alone must not cost the broker the whole frame's memory."""
    conn, _ = connection(frame_bytes_max=100 << 20, frame_buffer_initial=1 << 20)
    feed(conn, (50 << 20).to_bytes(4, "big") + b"0123456789", [1000])
    assert len(conn.get_buffer(-1)) <= 1 << 20  # not 50 MiB
    big = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and a bit: grows 1 -> 2 -> 4 MiB
    conn2, _ = connection(frame_bytes_max=100 << 20, frame_buffer_initial=1 << 20)
    feed(conn2, framed([big]), [300_000])
    assert await conn2.read_frame() == big


async def test_a_size_outside_the_limit_is_refused_before_any_buffer():
    conn, transport = connection(frame_bytes_max=1000)
    data = framed([b"ok"]) + (2**31 - 1).to_bytes(4, "big") + b"garbage that follows"
    feed(conn, data, [7])
    assert await conn.read_frame() == b"ok"
    with pytest.raises(FrameSizeError) as refused:
        await conn.read_frame()
    assert refused.value.size == 2**31 - 1
    assert transport.paused
    with pytest.raises(FrameSizeError):  # and it stays refused
        await conn.read_frame()


@pytest.mark.parametrize("large", [True, False], ids=["own-buffer", "scratch"])
async def test_lowering_the_limit_refuses_a_frame_already_arriving(large):
    """A SASL listener lowers the limit once its connection's task runs; bytes that came
    in before, a size prefix above the new limit, must not be read on under the old one."""
    conn, transport = connection(frame_bytes_max=1 << 20)
    size = 5000 if large else 40  # past or within the 64-byte scratch buffer
    feed(conn, size.to_bytes(4, "big") + b"x" * 10, [100])
    conn.frame_bytes_max = 1000 if large else 20
    with pytest.raises(FrameSizeError) as refused:
        await conn.read_frame()
    assert refused.value.size == size
    assert transport.paused
    # A frame within the lowered limit is read on as usual.
    conn2, _ = connection(frame_bytes_max=1 << 20)
    feed(conn2, framed([b"y" * 300])[:100], [100])
    conn2.frame_bytes_max = 1000
    feed(conn2, framed([b"y" * 300])[100:], [100])
    assert await conn2.read_frame() == b"y" * 300


@pytest.mark.parametrize("size", [0, -1, -(2**31)])
async def test_empty_and_negative_sizes_are_refused(size):
    conn, _ = connection()
    feed(conn, size.to_bytes(4, "big", signed=True), [4])
    with pytest.raises(FrameSizeError):
        await conn.read_frame()


@pytest.mark.parametrize("cut", [2, 4, 6, 4 + 500])
async def test_the_end_inside_a_frame_gives_the_frames_before_then_incomplete(cut):
    conn, _ = connection()
    whole = framed([b"first"])
    partial = framed([b"x" * 600])[:cut]
    feed(conn, whole + partial, [50])
    conn.eof_received()
    assert await conn.read_frame() == b"first"
    with pytest.raises(asyncio.IncompleteReadError):
        await conn.read_frame()


async def test_a_lost_connection_wakes_a_waiting_reader_and_fails_drain():
    conn, _ = connection()
    reading = asyncio.ensure_future(conn.read_frame())
    await asyncio.sleep(0)
    conn.pause_writing()
    draining = asyncio.ensure_future(conn.drain())
    await asyncio.sleep(0)
    conn.connection_lost(ConnectionResetError("peer reset"))
    with pytest.raises(ConnectionResetError):
        await reading
    with pytest.raises(ConnectionResetError):
        await draining
    with pytest.raises(ConnectionResetError):
        await conn.drain()


async def test_reading_pauses_above_the_queue_limit_and_resumes_when_read():
    conn, transport = connection(queued_bytes_max=1000)
    frames = [bytes([i]) * 300 for i in range(6)]  # 1,800 bytes queued
    feed(conn, framed(frames), [10_000])
    assert transport.paused
    got = [await conn.read_frame() for _ in range(4)]
    assert transport.paused  # 600 still queued: above half the limit
    got.append(await conn.read_frame())
    assert not transport.paused  # 300: at most half, reading resumes
    assert got == frames[:5] and transport.pauses == 1


async def test_drain_waits_for_resume_writing():
    conn, transport = connection()
    conn.writelines([b"a", b"b"])
    conn.pause_writing()
    draining = asyncio.ensure_future(conn.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    conn.resume_writing()
    await draining
    assert transport.written == [b"ab"]


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(st.binary(min_size=1, max_size=1200), min_size=1, max_size=12),
       chunks=st.lists(st.integers(1, 300), min_size=1, max_size=6))
def test_frames_come_out_whole_while_the_scratch_buffer_grows(frames, chunks):
    """The scratch buffer starts small (an idle connection holds little) and grows at
    the first read that fills it; frames come out whole across the switch."""
    async def run():
        conn = FrameConnection(lambda c: None, frame_bytes_max=1 << 20, scratch_bytes=SCRATCH,
                               scratch_initial_bytes=8, frame_buffer_initial_bytes=16)
        conn.connection_made(FakeTransport())
        offered = len(conn.get_buffer(-1))
        assert offered == 8
        conn.buffer_updated(0)
        feed(conn, framed(frames), chunks)
        assert await read_all(conn, len(frames)) == frames
    asyncio.run(run())


def test_the_scratch_buffer_grows_only_after_a_read_fills_it():
    conn = FrameConnection(lambda c: None, frame_bytes_max=1 << 20, scratch_bytes=SCRATCH,
                           scratch_initial_bytes=8)
    conn.connection_made(FakeTransport())
    buffer = conn.get_buffer(-1)
    buffer[:3] = b"\0\0\0"  # part of a size prefix: not full
    conn.buffer_updated(3)
    assert len(conn.get_buffer(-1)) == 5
    conn.buffer_updated(0)
    buffer = conn.get_buffer(-1)
    buffer[:5] = b"\x01a\0\0\0"  # fills it (a frame, then 3 bytes of a size prefix)
    conn.buffer_updated(5)
    assert len(conn.get_buffer(-1)) == SCRATCH - 3  # grown, the 3 pending bytes kept
