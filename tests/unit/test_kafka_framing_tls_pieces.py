"""FrameConnection.write_parts: one writelines on a socket; under TLS the answer goes out in
writelines of at most TLS_WRITE_PIECE_BYTES (large parts cut), in order, nothing lost."""

import asyncio

import pytest

from tidewater.broker.kafka.framing import TLS_WRITE_PIECE_BYTES, FrameConnection

pytestmark = pytest.mark.timeout(30)


class Transport:
    def __init__(self, tls: bool):
        self.tls = tls
        self.calls: list[list[bytes]] = []

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
