"""FrameConnection under TLS: get_buffer's size hint (what the SSL protocol holds) sizes a
large frame's buffer; on a plaintext socket the hint is a fixed guess and is not trusted.
And ``write_parts``: one writelines on a socket; under TLS the answer goes out in writelines
of at most TLS_WRITE_PIECE_BYTES (large parts cut), in order, nothing lost."""

import asyncio

import pytest

from tidewater.broker.kafka.framing import TLS_WRITE_PIECE_BYTES, FrameConnection

pytestmark = pytest.mark.timeout(30)


class Transport:
    def __init__(self, tls: bool):
        self.tls = tls
        self.calls: list[list[bytes]] = []  # what was written, a list per writelines

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def get_extra_info(self, name, default=None):
        return object() if name == "sslcontext" and self.tls else default

    def writelines(self, parts):
        self.calls.append([bytes(p) for p in parts])

    def write(self, data):
        self.calls.append([bytes(data)])


def opened(tls: bool, frame_bytes_max: int = 100 << 20) -> FrameConnection:
    conn = FrameConnection(lambda c: None, frame_bytes_max=frame_bytes_max, scratch_bytes=4096,
                           scratch_initial_bytes=4096, frame_buffer_initial_bytes=1024)
    conn.connection_made(Transport(tls))  # type: ignore[arg-type]
    return conn


def feed_as_ssl_protocol(conn: FrameConnection, data: bytes, held: int) -> list[int]:
    """As uvloop's SSL protocol: ``held`` bytes arrive at a time; each get_buffer is told
    how many are held (plus its 256 of slack); returns the buffer sizes offered."""
    offered = []
    position = 0
    while position < len(data):
        arrived = min(held, len(data) - position)
        while arrived:
            buffer = conn.get_buffer(arrived + 256)
            offered.append(len(buffer))
            n = min(len(buffer), arrived)
            buffer[:n] = data[position:position + n]
            conn.buffer_updated(n)
            position += n
            arrived -= n
    return offered


async def test_under_tls_a_large_frame_takes_all_that_arrived_in_one_read():
    conn = opened(tls=True)
    big = bytes(range(256)) * 1024  # 256 KiB
    data = len(big).to_bytes(4, "big") + big + (5).to_bytes(4, "big") + b"after"
    offered = feed_as_ssl_protocol(conn, data, held=len(data))
    assert bytes(await conn.read_frame()) == big
    assert await conn.read_frame() == b"after"
    # The scratch buffer's read, then one buffer for the rest of the frame (not doubling
    # from 1 KiB), then the small frame's.
    assert len(offered) <= 4, offered
    assert len(big) + 4 - 4096 in offered


async def test_under_tls_the_hint_grows_a_frame_no_further_than_its_size():
    conn = opened(tls=True)
    big = bytes(20_000)
    conn.get_buffer(8)[:8] = len(big).to_bytes(4, "big") + big[:4]
    conn.buffer_updated(8)
    buffer = conn.get_buffer(10 << 20)  # holds far more than this frame
    assert len(buffer) == len(big) - 4


def test_on_a_plaintext_socket_the_hint_allocates_nothing_more():
    """A socket's hint is not bytes that arrived: a claimed size plus a large hint must
    not cost the frame's memory."""
    conn = opened(tls=False)
    conn.get_buffer(-1)[:14] = (50 << 20).to_bytes(4, "big") + b"0123456789"
    conn.buffer_updated(14)
    assert len(conn.get_buffer(64 << 20)) <= 1024


def test_under_tls_a_claimed_size_alone_allocates_only_what_arrived():
    conn = opened(tls=True)
    conn.get_buffer(14)[:14] = (50 << 20).to_bytes(4, "big") + b"0123456789"
    conn.buffer_updated(14)
    assert len(conn.get_buffer(300)) <= 1024  # room for the 300 held, not 50 MiB


def test_frames_come_out_whole_in_any_held_size():
    async def run():
        conn = opened(tls=True)
        frames = [bytes([i]) * size for i, size in enumerate((10, 70_000, 3, 9000, 200_000))]
        data = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
        feed_as_ssl_protocol(conn, data, held=17_000)
        assert [bytes(await conn.read_frame()) for _ in frames] == frames
    asyncio.run(run())


def written(tls: bool, parts: list[bytes]) -> list[list[bytes]]:
    conn = FrameConnection(lambda c: None, frame_bytes_max=100 << 20)
    transport = Transport(tls)
    conn.connection_made(transport)  # type: ignore[arg-type]
    asyncio.run(conn.write_parts(parts))
    return transport.calls


def answer() -> list[bytes]:
    big = bytes(range(256)) * (5 * TLS_WRITE_PIECE_BYTES // 256 + 3)
    return [b"head-bytes", big, b"x" * 100, big[:TLS_WRITE_PIECE_BYTES - 7], b"tail"]


def test_socket_answer_in_one_writelines():
    parts = answer()
    assert written(False, parts) == [parts]


def test_tls_answer_in_pieces_in_order():
    parts = answer()
    calls = written(True, parts)
    assert len(calls) > 5
    assert all(sum(map(len, call)) <= TLS_WRITE_PIECE_BYTES for call in calls)
    assert all(sum(map(len, call)) == TLS_WRITE_PIECE_BYTES for call in calls[:-1])
    assert b"".join(b"".join(call) for call in calls) == b"".join(parts)


def test_tls_small_answer_in_one_writelines():
    parts = [b"size", b"header", b"body"]
    assert written(True, parts) == [parts]
