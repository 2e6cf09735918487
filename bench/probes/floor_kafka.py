"""The design floor's Kafka listener: the few requests a paced librdkafka producer and
consumer send, answered from ``design_floor``'s leader state, nothing else.

Used by ``design_floor.py --kafka``. One asyncio server on the floor leader's loop: each
connection's requests are answered in order, as Kafka answers them. Only fixed,
non-flexible versions are offered (ApiVersions 0, Metadata 1, Produce 3, Fetch 4,
ListOffsets 1, FindCoordinator 0), so every request and answer is a few ``struct``
calls, with no schema library: what the broker's Kafka listener does beyond this
(``kio``'s codec, fetch sessions, quotas, ACLs, the checks) is not in the floor.

Wire format: Kafka's protocol guide. A frame is an int32 size and that many bytes; a
request header is api_key int16, api_version int16, correlation_id int32, client_id
(int16-length string); an answer is the correlation_id and the body. An ApiVersions
request of a version other than 0 is answered in v0 with UNSUPPORTED_VERSION and the
list, as Kafka does, and librdkafka asks again in v0.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Protocol

API_VERSIONS, METADATA, PRODUCE, FETCH, LIST_OFFSETS, FIND_COORDINATOR = 18, 3, 0, 1, 2, 10
OFFERED = {API_VERSIONS: 0, METADATA: 1, PRODUCE: 3, FETCH: 4, LIST_OFFSETS: 1,
           FIND_COORDINATOR: 0}
UNSUPPORTED_VERSION, COORDINATOR_NOT_AVAILABLE = 35, 15
NODE_ID = 1
FETCH_WAIT_MAX_S = 0.5

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_HEAD = struct.Struct(">hhi")


class Watermark(Protocol):
    value: int

    async def wait_past(self, offset: int, timeout_s: float | None) -> None: ...


class FloorLog(Protocol):
    """What the listener needs of the leader's state (``design_floor.StoredLeaderState``)."""

    end: Watermark
    high_watermark: Watermark

    def append(self, records: bytes) -> int: ...
    def read(self, start: int, end: int) -> bytes: ...


class Reader:
    """Reads a request body field by field."""

    def __init__(self, buf: bytes, position: int) -> None:
        self.buf, self.position = buf, position

    def _take(self, fmt: struct.Struct) -> int:
        (value,) = fmt.unpack_from(self.buf, self.position)
        self.position += fmt.size
        return value

    def i8(self) -> int:
        self.position += 1
        return self.buf[self.position - 1]

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def string(self) -> str:
        length = self.i16()
        if length < 0:
            return ""
        self.position += length
        return self.buf[self.position - length:self.position].decode()

    def bytes_(self) -> bytes:
        length = self.i32()
        if length < 0:
            return b""
        self.position += length
        return self.buf[self.position - length:self.position]


def string(value: str) -> bytes:
    data = value.encode()
    return _I16.pack(len(data)) + data


def api_versions_answer(version: int) -> bytes:
    apis = b"".join(struct.pack(">hhh", key, max_version, max_version)
                    for key, max_version in OFFERED.items())
    error = 0 if version == 0 else UNSUPPORTED_VERSION
    return _I16.pack(error) + _I32.pack(len(OFFERED)) + apis


def metadata_answer(host: str, port: int, topic: str) -> bytes:
    broker = _I32.pack(NODE_ID) + string(host) + _I32.pack(port) + _I16.pack(-1)
    partition = (_I16.pack(0) + _I32.pack(0) + _I32.pack(NODE_ID)
                 + _I32.pack(1) + _I32.pack(NODE_ID) + _I32.pack(1) + _I32.pack(NODE_ID))
    topic_entry = _I16.pack(0) + string(topic) + b"\x00" + _I32.pack(1) + partition
    return _I32.pack(1) + broker + _I32.pack(NODE_ID) + _I32.pack(1) + topic_entry


class FloorKafkaServer:
    """The listener on the leader's ``state``."""

    def __init__(self, state: FloorLog, topic: str, on_produce: Any = None,
                 answer_delay_ms: float = 0.0) -> None:
        """``on_produce``: a ``multiprocessing.Value`` counting the Produce requests.
        ``answer_delay_ms``: each acks=all Produce answer waits that much more after the HW
        passes its records (a longer round, the records' visibility unchanged)."""
        self.state = state
        self.topic = topic
        self.host, self.port = "127.0.0.1", 0
        self._produced = on_produce
        self._answer_delay_s = answer_delay_ms / 1000

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self), self.host, 0)
        self.port = server.sockets[0].getsockname()[1]
        return self.port

    async def answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = _HEAD.unpack_from(frame, 0)
        reader = Reader(frame, _HEAD.size)
        reader.string()  # client_id
        if api_key == API_VERSIONS:
            body = api_versions_answer(version)  # read no further: v3 has a flexible header
        elif OFFERED.get(api_key) != version:
            raise ValueError(f"api {api_key} v{version} was not offered")
        elif api_key == METADATA:
            body = metadata_answer(self.host, self.port, self.topic)
        elif api_key == PRODUCE:
            body = await self._produce(reader)
            if body is None:
                return None
        elif api_key == FETCH:
            body = await self._fetch(reader)
        elif api_key == LIST_OFFSETS:
            body = self._list_offsets(reader)
        else:  # FindCoordinator: the receiver assigns its partition, it needs none
            body = (_I16.pack(COORDINATOR_NOT_AVAILABLE) + _I32.pack(-1) + string("")
                    + _I32.pack(-1))
        return _I32.pack(correlation_id) + body

    async def _produce(self, reader: Reader) -> bytes | None:
        reader.string()  # transactional_id
        acks = reader.i16()
        reader.i32()  # timeout
        if reader.i32() != 1:
            raise ValueError("one topic per produce request here")
        topic = reader.string()
        if reader.i32() != 1:
            raise ValueError("one partition per produce request here")
        partition = reader.i32()
        if self._produced is not None:
            self._produced.value += 1
        base = self.state.append(reader.bytes_())
        end = self.state.end.value
        if acks == 0:
            return None
        if acks == -1:
            await self.state.high_watermark.wait_past(end - 1, None)
            if self._answer_delay_s:
                await asyncio.sleep(self._answer_delay_s)
        return (_I32.pack(1) + string(topic) + _I32.pack(1) + _I32.pack(partition)
                + _I16.pack(0) + _I64.pack(base) + _I64.pack(-1) + _I32.pack(0))

    async def _fetch(self, reader: Reader) -> bytes:
        reader.i32()  # replica_id
        max_wait_ms = reader.i32()
        reader.i32()  # min_bytes
        reader.i32()  # max_bytes
        reader.i8()  # isolation_level: the floor has no transactions, LSO = HW
        answers = []
        for _ in range(reader.i32()):
            topic = reader.string()
            for _ in range(reader.i32()):
                partition, offset = reader.i32(), reader.i64()
                reader.i32()  # partition_max_bytes
                answers.append((topic, partition, offset))
        if len(answers) == 1:
            wait_s = min(max_wait_ms / 1000, FETCH_WAIT_MAX_S)
            await self.state.high_watermark.wait_past(answers[0][2], wait_s)
        high_watermark = self.state.high_watermark.value
        body = [_I32.pack(0), _I32.pack(len(answers))]
        for topic, partition, offset in answers:
            records = self.state.read(offset, high_watermark) if offset < high_watermark else b""
            body += [string(topic), _I32.pack(1), _I32.pack(partition), _I16.pack(0),
                     _I64.pack(high_watermark), _I64.pack(high_watermark), _I32.pack(0),
                     _I32.pack(len(records)), records]
        return b"".join(body)

    def _list_offsets(self, reader: Reader) -> bytes:
        reader.i32()  # replica_id
        out = []
        for _ in range(reader.i32()):
            topic = reader.string()
            for _ in range(reader.i32()):
                partition, timestamp = reader.i32(), reader.i64()
                offset = 0 if timestamp == -2 else self.state.high_watermark.value
                out.append(string(topic) + _I32.pack(1) + _I32.pack(partition) + _I16.pack(0)
                           + _I64.pack(-1) + _I64.pack(offset))
        return _I32.pack(len(out)) + b"".join(out)


class _Connection(asyncio.Protocol):
    """Frames in, answers out in request order (one task per connection)."""

    def __init__(self, server: FloorKafkaServer) -> None:
        self.server = server
        self.buffer = bytearray()
        self.requests: asyncio.Queue[bytes] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.task = asyncio.ensure_future(self._serve())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            (size,) = _I32.unpack_from(self.buffer, 0)
            if len(self.buffer) < 4 + size:
                break
            self.requests.put_nowait(bytes(self.buffer[4:4 + size]))
            del self.buffer[:4 + size]

    def connection_lost(self, exc) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _serve(self) -> None:
        assert self.transport is not None
        while True:
            answer = await self.server.answer(await self.requests.get())
            if answer is not None:
                self.transport.write(_I32.pack(len(answer)) + answer)
