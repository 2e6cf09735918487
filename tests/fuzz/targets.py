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
- ``kafka_request``: one Kafka request frame body through the listener's decoder
  and, when it decodes, the translation of a Produce or Fetch into the broker's own
  request.
- ``sasl``: a SASL exchange on one Kafka connection (first byte: the mechanism,
  second: where the bytes split into two tokens), then the same bytes as gRPC's
  ``authorization`` metadata (``broker/security/grpc_auth.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from tidewater.broker.kafka import apis, fetch_session_apis
from tidewater.broker.kafka.codec import UnknownApiKeyError, decode_request
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
    "kafka_request": (InvalidRequestError, UnknownApiKeyError, UnsupportedVersionError),
    "sasl": (SaslAuthenticationError,),
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


def kafka_request(data: bytes) -> None:
    head, body = decode_request(data, apis.SUPPORTED)
    if head.api_key == apis.PRODUCE and head.api_version >= apis.DECODED_FROM[apis.PRODUCE]:
        apis.produce_request(body)
    elif head.api_key == apis.FETCH:
        # What on_fetch does with a request: its own fields, then its session keys.
        apis.fetch_request(dataclasses.replace(body, topics=()), head.api_version)
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


TARGETS: dict[str, Callable[[bytes], None]] = {
    "record_batch": record_batch,
    "offset_checkpoint": offset_checkpoint,
    "epoch_checkpoint": epoch_checkpoint,
    "partition_metadata": partition_metadata,
    "meta_properties": meta_properties,
    "kafka_request": kafka_request,
    "sasl": sasl,
}
assert set(TARGETS) == set(ALLOWED)


def run_one(name: str, data: bytes) -> None:
    """The target on ``data``; its allowed errors are the parser saying no."""
    try:
        TARGETS[name](data)
    except ALLOWED[name]:
        pass
