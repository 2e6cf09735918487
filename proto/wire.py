"""Kafka's classic (non-flexible) big-endian encoding of small structures, for the
formats written outside request frames: ``__consumer_offsets`` records
(``broker/group/records.py``) and the ConsumerProtocol bytes (``client/assignors.py``).

int16/int32/int64 big-endian; a string is an int16 length (-1: null) and UTF-8; bytes
an int32 length (-1: null) and the bytes. ``WireReader`` checks every length against
what is there and raises the caller's error type for anything that does not fit.
"""

from __future__ import annotations

import struct

I16, I32, I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


def string(value: str | None) -> bytes:
    if value is None:
        return I16.pack(-1)
    raw = value.encode()
    return I16.pack(len(raw)) + raw


def bytes_field(value: bytes | None) -> bytes:
    if value is None:
        return I32.pack(-1)
    return I32.pack(len(value)) + value


class WireReader:
    def __init__(self, buf: bytes, error: type[Exception]):
        self.buf, self.pos, self.error = buf, 0, error

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.buf):
            raise self.error(f"field of {size} bytes past the end at {self.pos}")
        out = self.buf[self.pos:self.pos + size]
        self.pos += size
        return out

    def i16(self) -> int:
        return int(I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(I32.unpack(self.take(4))[0])

    def i64(self) -> int:
        return int(I64.unpack(self.take(8))[0])

    def nullable_string(self) -> str | None:
        size = self.i16()
        if size == -1:
            return None
        try:
            return self.take(size).decode()
        except UnicodeDecodeError as e:
            raise self.error(f"string is not UTF-8: {e}") from None

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise self.error("null where a string is required")
        return value

    def bytes_(self) -> bytes:
        return self.take(self.i32())

    def count(self) -> int:
        """An array's length: not negative, and not more than the bytes left."""
        n = self.i32()
        if n < 0 or n > len(self.buf) - self.pos:
            raise self.error(f"array of {n} elements in {len(self.buf) - self.pos} bytes")
        return n

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise self.error(f"{len(self.buf) - self.pos} bytes after the structure")
