"""Fuzz targets: the parsers that read bytes someone else wrote.

Each target takes arbitrary bytes and may end in one of the parser's documented,
typed errors (``ALLOWED``); anything else escaping (an IndexError, a
struct.error, a MemoryError from a length taken on trust, a hang) is a bug.
``make fuzz`` runs them under atheris (tests/fuzz/run.py); every input saved in
``tests/fuzz/corpus/<target>/`` (seeds and past crashes) is replayed by
tests/unit/test_fuzz_regressions.py on every ``make test``.

- ``record_batch``: a RecordBatch v2 as it arrives in a produce request or is read
  from disk, through framing and CRC validation (``validate_batch``) and, with the
  CRC check bypassed (a producer computes the CRC over whatever it sends), the
  record decoder with decompression (``decode_batch_records``).
- ``offset_checkpoint`` / ``epoch_checkpoint``: Kafka's text checkpoints
  (``replication-offset-checkpoint``, ``leader-epoch-checkpoint``).
- ``partition_metadata`` / ``meta_properties``: the per-partition and per-data-dir
  identity files.
- ``kafka_frame``: a byte stream through the listener's transport
  (``broker/kafka/framing.FrameConnection``), delivered in chunks whose sizes the first
  bytes choose, against an independent reading of the size-prefixed framing: the same
  frames, then the same end (``FrameSizeError`` for a refused size, else the end of the
  stream).
- ``kafka_request``: one Kafka request frame body through the listener's decoder
  (``codec.decode_request``) and, when it decodes, the translation of a Produce or
  Fetch into the broker's own request. The first four bytes (api_key, api_version)
  are mapped onto a pair the listener advertises (``apis.SUPPORTED``: every API at
  every version), so every input exercises a schema the broker accepts; a valid frame
  keeps its own pair. Seeds: one valid request per (key, version)
  (``fuzz/seeds.py``).
- ``sasl``: a SASL exchange on one Kafka connection (first byte: the mechanism,
  second: where the bytes split into two tokens), then the same bytes as gRPC's
  ``authorization`` metadata (``broker/security/grpc_auth.py``).
- ``group_records`` / ``txn_records``: a ``__consumer_offsets`` / ``__transaction_state``
  record (key and value; the first two bytes say where the key ends and whether the
  value is a tombstone) through ``broker/group/records.decode`` /
  ``broker/txn/records.decode``; what decodes must encode and decode back to itself.
- ``metadata_log``: the controller's ``metadata.log`` bytes through its recovery
  reader (``controller/metadata_log._decode_all``); with the first byte odd the rest
  is payloads (split at ``\\0\\n``) framed with correct CRCs, so the JSON inside is
  reached.
- ``raft_files``: the controller quorum's files (``controller/raft``): the first byte
  picks ``raft.log`` (``storage.read_log``; its VOTERS entries through
  ``decode_voters``, as the node applies them), ``quorum-state``
  (``storage.decode_quorum_state``) or a snapshot (``snapshot_file.decode``); with
  its bit 2 set the CRCs are made right first, so the parser gets past them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import crc32c

from tidewater.broker.group import records as group_records_module
from tidewater.broker.kafka import apis, fetch_session_apis
from tidewater.broker.kafka.codec import decode_request
from tidewater.broker.kafka.framing import FrameConnection, FrameSizeError
from tidewater.broker.kafka.sasl import ConnectionSecurity
from tidewater.broker.security.grpc_auth import GrpcLogins, PasswordChecker, grpc_session
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings
from tidewater.broker.storage.checkpoints import _parse_offset_entry, parse_checkpoint
from tidewater.broker.storage.epoch_cache import read_epoch_checkpoint
from tidewater.broker.storage.meta_properties import decode_meta_properties
from tidewater.broker.storage.partition_metadata import (
    PARTITION_METADATA_FILE,
    read_partition_metadata,
)
from tidewater.broker.txn import records as txn_records_module
from tidewater.controller import metadata_log as metadata_log_module
from tidewater.controller.raft import snapshot_file
from tidewater.controller.raft import storage as raft_storage
from tidewater.controller.raft.messages import EntryKind, decode_voters
from tidewater.proto.batch import iter_batches, read_header
from tidewater.proto.errors import (
    CorruptFileError,
    CorruptRecordError,
    InvalidRequestError,
    UnsupportedCompressionError,
    UnsupportedVersionError,
)
from tidewater.proto.records import decode_batch_records
from tidewater.proto.scram import SaslAuthenticationError, make_credential

ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "record_batch": (CorruptRecordError, UnsupportedCompressionError),
    "offset_checkpoint": (CorruptFileError,),
    "epoch_checkpoint": (CorruptFileError,),
    "partition_metadata": (CorruptFileError,),
    "meta_properties": (CorruptFileError,),
    "kafka_frame": (),  # its own check says what is wrong
    "kafka_request": (InvalidRequestError, UnsupportedVersionError),
    "sasl": (SaslAuthenticationError,),
    "group_records": (group_records_module.GroupRecordError,),
    "txn_records": (txn_records_module.TxnRecordError,),
    "metadata_log": (CorruptFileError,),
    "raft_files": (CorruptFileError, CorruptRecordError),
}

_SCRATCH = Path(tempfile.mkdtemp(prefix="tw-fuzz-"))


def record_batch(data: bytes) -> None:
    for _position, _header in iter_batches(data, validate=True):
        pass
    header = read_header(data)  # as if the CRC matched: the rows are the producer's
    if header.batch_length >= 0 and 12 + header.batch_length <= len(data):
        decode_batch_records(data, 0, header, max_decompressed_bytes=1 << 20)


def offset_checkpoint(data: bytes) -> None:
    parse_checkpoint(data, "fuzz", _parse_offset_entry)


def epoch_checkpoint(data: bytes) -> None:
    path = _SCRATCH / "leader-epoch-checkpoint"
    path.write_bytes(data)
    read_epoch_checkpoint(path)


def partition_metadata(data: bytes) -> None:
    (_SCRATCH / PARTITION_METADATA_FILE).write_bytes(data)
    read_partition_metadata(_SCRATCH)


def meta_properties(data: bytes) -> None:
    decode_meta_properties(data)


class _Transport:
    """What FrameConnection asks of its transport, recorded."""

    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None:
        pass


_LOOP = asyncio.new_event_loop()


def _frames_expected(stream: bytes, frame_bytes_max: int) -> tuple[list[bytes], int | None]:
    """The frames in ``stream`` read the plain way, and the refused size (None: the stream
    ends, torn or not)."""
    frames, position = [], 0
    while len(stream) - position >= 4:
        size = int.from_bytes(stream[position:position + 4], "big", signed=True)
        if not 0 < size <= frame_bytes_max:
            return frames, size
        if len(stream) - position - 4 < size:
            break
        frames.append(stream[position + 4:position + 4 + size])
        position += 4 + size
    return frames, None


def kafka_frame(data: bytes) -> None:
    if len(data) < 2:
        return
    # Small buffers, so that short inputs reach the large-frame path and the growth of
    # the scratch and frame buffers.
    frame_bytes_max = 1 + data[0] % 64 * 4
    chunk_seed, stream = data[1], data[2:]
    connection = FrameConnection(lambda _c: None, frame_bytes_max=frame_bytes_max,
                                 scratch_bytes=32, scratch_initial_bytes=8,
                                 frame_buffer_initial_bytes=4, queued_bytes_max=1 << 30)
    transport = _Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    position, step = 0, 0
    while position < len(stream) and not transport.paused:
        buffer = connection.get_buffer(-1)
        size = min(len(buffer), len(stream) - position, 1 + (chunk_seed * (step + 1)) % 23)
        if size <= 0:
            raise AssertionError(f"get_buffer offered {len(buffer)} bytes")
        buffer[:size] = stream[position:position + size]
        connection.buffer_updated(size)
        position += size
        step += 1
    connection.eof_received()
    frames, refused = _frames_expected(stream, frame_bytes_max)

    async def read_all() -> tuple[list[bytes], BaseException]:
        got = []
        while True:
            try:
                got.append(bytes(await connection.read_frame()))
            except (FrameSizeError, asyncio.IncompleteReadError) as end:
                return got, end

    got, end = _LOOP.run_until_complete(read_all())
    if got != frames:
        raise AssertionError(f"frames {got!r}, expected {frames!r}")
    if refused is None:
        if not isinstance(end, asyncio.IncompleteReadError):
            raise AssertionError(f"ended in {end!r}, expected the end of the stream")
    elif not (isinstance(end, FrameSizeError) and end.size == refused):
        raise AssertionError(f"ended in {end!r}, expected size {refused} refused")


_HEAD = struct.Struct(">hh")
_API_KEYS = sorted(apis.SUPPORTED)


def supported_head(api_key: int, api_version: int) -> tuple[int, int]:
    """(api_key, api_version) mapped onto a pair the listener advertises; a supported pair
    maps to itself."""
    if api_key not in apis.SUPPORTED:
        api_key = _API_KEYS[api_key % len(_API_KEYS)]
    low, high = apis.SUPPORTED[api_key]
    if not low <= api_version <= high:
        api_version = low + api_version % (high - low + 1)
    return api_key, api_version


def kafka_request(data: bytes) -> None:
    if len(data) >= _HEAD.size:
        data = _HEAD.pack(*supported_head(*_HEAD.unpack_from(data))) + data[_HEAD.size:]
    head, body = decode_request(data, apis.SUPPORTED)
    if head.api_key == apis.PRODUCE and head.api_version >= apis.DECODED_FROM[apis.PRODUCE]:
        apis.produce_request(body)
    elif head.api_key == apis.FETCH:
        # What on_fetch does with a request: its own fields, then its session keys.
        apis.fetch_request_head(body)
        fetch_session_apis.replica_id_of(body)
        fetch_session_apis.session_request(body, head.api_version)


class _Users:
    """One user ``alice`` whose password is random (no input can know it: any input that
    authenticates is a bug), for every SCRAM mechanism."""

    credentials = {m: make_credential(m, secrets.token_hex(16))
                   for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}

    def scram_credential(self, user: str, mechanism: str):
        return self.credentials.get(mechanism) if user == "alice" else None

    def user_credentials(self, user: str) -> list:
        return list(self.credentials.values()) if user == "alice" else []

    def acls(self) -> tuple:
        return ()

    def scram_iterations(self, mechanism: str) -> list[int]:
        return [c.iterations for m, c in self.credentials.items() if m == mechanism]


_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SECURITY = BrokerSecurity(SecuritySettings(sasl_mechanisms=_MECHANISMS), _Users())


def sasl(data: bytes) -> None:
    if len(data) < 2:
        return
    connection = ConnectionSecurity(_SECURITY, host="fuzz")
    mechanism = _MECHANISMS[data[0] % len(_MECHANISMS)]
    split = 2 + data[1] % max(len(data) - 1, 1)
    assert connection.handshake(mechanism, 1)[0] == 0
    try:
        for token in (data[2:split], data[split:]):
            asyncio.run(connection.authenticate(token, 0))
            if connection.authenticated:
                raise AssertionError(f"random bytes authenticated as {connection.session}")
    finally:
        text = data[2:].decode("utf-8", errors="replace")
        try:
            grpc_session([("authorization", text)], {}, "ipv4:1.2.3.4:5",
                         logins=GrpcLogins(PasswordChecker(_Users().user_credentials)),
                         sasl_required=True)
        except SaslAuthenticationError:
            pass


def _key_and_value(data: bytes) -> tuple[bytes, bytes | None] | None:
    """A record's key and value from ``data``: its first two bytes are the key's length
    (the top bit: the value is null), the rest the key then the value."""
    if len(data) < 2:
        return None
    split = int.from_bytes(data[:2], "big")
    rest = data[2:]
    key_length = split & 0x7FFF
    return rest[:key_length], None if split & 0x8000 else rest[key_length:]


def group_records(data: bytes) -> None:
    pair = _key_and_value(data)
    if pair is None:
        return
    record = group_records_module.decode(*pair)
    again = group_records_module.decode(group_records_module.encode_key(record),
                                        group_records_module.encode_value(record))
    if again != record:
        raise AssertionError(f"{record} encodes as {again}")


def txn_records(data: bytes) -> None:
    pair = _key_and_value(data)
    if pair is None:
        return
    record = txn_records_module.decode(*pair)
    again = txn_records_module.decode(txn_records_module.encode_key(record),
                                      txn_records_module.encode_value(record))
    # v0 (what is written) has no previous_producer_id: a v1 value's is not kept.
    if record.value is not None:
        record = dataclasses.replace(
            record, value=dataclasses.replace(record.value, previous_producer_id=-1))
    if again != record:
        raise AssertionError(f"{record} encodes as {again}")


def _metadata_frames(payloads: list[bytes]) -> bytes:
    header = metadata_log_module.FRAME_HEADER
    return b"".join(header.pack(len(p), crc32c.crc32c(p)) + p for p in payloads)


def metadata_log(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] & 1:
        body = _metadata_frames(body.split(b"\0\n"))
    records, end = metadata_log_module._decode_all(body, "fuzz/metadata.log")
    if not 0 <= end <= len(body):
        raise AssertionError(f"valid bytes end at {end} of {len(body)}")
    for record in records:
        if not isinstance(record, dict) or "type" not in record:
            raise AssertionError(f"record without a type: {record!r}")


def _fix_log_crcs(data: bytes) -> bytes:
    """``raft.log`` bytes with every whole frame's two CRCs made right."""
    out = bytearray(data)
    frame = raft_storage.FRAME_HEADER
    position = raft_storage.LOG_HEADER.size
    while len(out) - position >= frame.size:
        length = int.from_bytes(out[position:position + 4], "big")
        end = position + frame.size + length
        if end > len(out):
            break
        crc_at = raft_storage.FRAME_HEADER_CRC_AT
        struct.pack_into(">I", out, crc_at - 4 + position,
                         crc32c.crc32c(bytes(out[position + frame.size:end])))
        struct.pack_into(">I", out, position + crc_at,
                         crc32c.crc32c(bytes(out[position:position + crc_at])))
        position = end
    return bytes(out)


_RAFT_PATH = Path("fuzz/raft")


def raft_files(data: bytes) -> None:
    if not data:
        return
    kind, body = data[0], data[1:]
    fix = bool(kind & 4)
    if kind % 3 == 0:
        recovered = raft_storage.read_log(_fix_log_crcs(body) if fix else body, _RAFT_PATH)
        for entry in recovered.entries:
            if entry.kind is EntryKind.VOTERS:
                decode_voters(entry.data)
    elif kind % 3 == 1:
        if fix and len(body) >= 10:
            body = body[:6] + struct.pack(">I", crc32c.crc32c(body[10:])) + body[10:]
        raft_storage.decode_quorum_state(body, _RAFT_PATH)
    else:
        if fix and len(body) >= 10:
            body = body[:6] + struct.pack(">I", crc32c.crc32c(body[10:])) + body[10:]
        snapshot_file.decode(body, _RAFT_PATH)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "record_batch": record_batch,
    "offset_checkpoint": offset_checkpoint,
    "epoch_checkpoint": epoch_checkpoint,
    "partition_metadata": partition_metadata,
    "meta_properties": meta_properties,
    "kafka_frame": kafka_frame,
    "kafka_request": kafka_request,
    "sasl": sasl,
    "group_records": group_records,
    "txn_records": txn_records,
    "metadata_log": metadata_log,
    "raft_files": raft_files,
}
assert set(TARGETS) == set(ALLOWED)


def run_one(name: str, data: bytes) -> None:
    """The target on ``data``; its allowed errors are the parser saying no."""
    try:
        TARGETS[name](data)
    except ALLOWED[name]:
        pass
