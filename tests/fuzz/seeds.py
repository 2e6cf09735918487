"""Seeds for the fuzz targets, made with the project's own encoders.

    cd tests && python -m fuzz.seeds

writes ``tests/fuzz/corpus/<target>/seed-*`` for the targets whose inputs are
generated here (a file of that name is overwritten; others are left alone):

- ``kafka_request``: one valid request frame body for every (api_key, api_version)
  the listener advertises (``apis.SUPPORTED``), encoded by ``codec.encode_request``
  from a sample of the version's kio schema (``sample``: every field set, every array
  one element long, Produce's records a real RecordBatch).
- ``kafka_frame``: streams of such frames.
- ``group_records``, ``txn_records``: every record type, from ``records.encode_*``.
- ``metadata_log``: a ``metadata.log`` from ``metadata_log.encode_frame``, both raw and
  as payloads (the target's CRC-fixing form).
- ``raft_files``: a ``raft.log``, a ``quorum-state`` and a snapshot from
  ``controller/raft``'s encoders.

The files are committed: the generator is how they were made, and remakes them when a
schema grows (tests/unit/test_fuzz_seeds.py checks that every advertised pair has one).
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from tidewater.broker.group import records as group_records
from tidewater.broker.kafka import apis
from tidewater.broker.kafka.codec import _hints, encode_request, request_type
from tidewater.broker.txn import records as txn_records
from tidewater.controller import metadata_log
from tidewater.controller.raft import snapshot_file
from tidewater.controller.raft import storage as raft_storage
from tidewater.controller.raft.messages import (
    Entry,
    EntryKind,
    Snapshot,
    SnapshotId,
    VoterKey,
    encode_voters,
)
from tidewater.controller.raft.node import QuorumState
from tidewater.proto.records import encode_batch

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
_RECORDS = encode_batch([(b"k", b"v")], base_timestamp_ms=1_700_000_000_000)


def _sample_value(hint: Any, kafka_type: str | None) -> Any:
    args = typing.get_args(hint)
    if type(None) in args:  # nullable: a value all the same (the null case is the fuzzer's)
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return (_sample_value(typing.get_args(hint)[0], kafka_type),)
    if dataclasses.is_dataclass(hint):
        return sample(typing.cast(type, hint))
    if kafka_type == "string":
        return "t"
    if kafka_type == "bytes":
        return b"b"
    if kafka_type == "records":
        return _RECORDS
    if kafka_type == "bool":
        return True
    if kafka_type == "uuid":
        return uuid.UUID(int=1)
    if kafka_type == "error_code":
        return ErrorCode(0)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=100)
    if kafka_type == "datetime_i64":
        return datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    if kafka_type == "float64":
        return 1.0
    return 1  # every integer type


def sample(entity_type: type) -> Any:
    """An instance of a kio schema class with every field set."""
    hints = _hints(entity_type)
    return entity_type(**{f.name: _sample_value(hints[f.name], f.metadata.get("kafka_type"))
                          for f in dataclasses.fields(entity_type)})


def request_frame(api_key: int, api_version: int) -> bytes:
    """A valid request frame body (no size prefix) of this API version."""
    body = sample(request_type(api_key, api_version))
    return encode_request(api_key, api_version, 7, _fields(body), client_id="fuzz")[4:]


def _fields(entity: Any) -> dict[str, Any]:
    return {f.name: getattr(entity, f.name) for f in dataclasses.fields(entity)}


def advertised() -> Iterator[tuple[int, int]]:
    """Every pair the listener advertises and decodes (Produce v0-2 are advertised for
    librdkafka's sake and refused: kio has no schema for them)."""
    for api_key, (low, high) in sorted(apis.SUPPORTED.items()):
        for api_version in range(max(low, apis.DECODED_FROM.get(api_key, 0)), high + 1):
            yield api_key, api_version


def kafka_request_seeds() -> dict[str, bytes]:
    return {f"seed-key{k}-v{v}": request_frame(k, v) for k, v in advertised()}


def kafka_frame_seeds() -> dict[str, bytes]:
    frames = [request_frame(18, 3), request_frame(3, 12), request_frame(0, 9)]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    # First byte: frame_bytes_max 1 + 63 * 4 = 253; second: the chunk-size seed.
    return {"seed-three-requests": bytes([63, 5]) + stream,
            "seed-one-small-frame": bytes([63, 1]) + (3).to_bytes(4, "big") + b"abc",
            "seed-refused-size": bytes([0, 2]) + (9).to_bytes(4, "big") + b"123456789"}


def _key_and_value(key: bytes, value: bytes | None) -> bytes:
    return (len(key) | (0x8000 if value is None else 0)).to_bytes(2, "big") + key + (value or b"")


def group_record_seeds() -> dict[str, bytes]:
    member = group_records.MemberMetadata("m-1", "instance-1", "client", "/10.0.0.1", 60000,
                                          45000, b"sub", b"assign")
    records: dict[str, group_records.GroupRecord] = {
        "offset-commit": group_records.OffsetCommitRecord(
            "g", "t", 3, group_records.OffsetCommitValue(42, 5, "meta", 1_700_000_000_000)),
        "offset-tombstone": group_records.OffsetCommitRecord("g", "t", 3, None),
        "group-metadata": group_records.GroupMetadataRecord("g", group_records.GroupMetadataValue(
            "consumer", 4, "range", "m-1", 1_700_000_000_000, (member,))),
        "group-tombstone": group_records.GroupMetadataRecord("g", None),
    }
    return {f"seed-{name}": _key_and_value(group_records.encode_key(r),
                                           group_records.encode_value(r))
            for name, r in records.items()}


def txn_record_seeds() -> dict[str, bytes]:
    value = txn_records.TxnLogValue(1000, 3, 60000, 1, (("t", (0, 1)), ("u", (2,))),
                                    1_700_000_000_000, 1_699_999_999_000)
    records = {"ongoing": txn_records.TxnLogRecord("tx-1", value),
               "tombstone": txn_records.TxnLogRecord("tx-1", None)}
    return {f"seed-{name}": _key_and_value(txn_records.encode_key(r),
                                           txn_records.encode_value(r))
            for name, r in records.items()}


def metadata_log_seeds() -> dict[str, bytes]:
    records = [{"type": "log_start", "next_offset": 10},
               {"type": "register_broker", "broker_id": 1, "host": "127.0.0.1", "port": 9092},
               {"type": "create_topic", "name": "t", "partitions": [[1, 2, 3]]}]
    raw = b"".join(metadata_log.encode_frame(r) for r in records)
    payloads = [metadata_log.encode_frame(r)[metadata_log.FRAME_HEADER.size:] for r in records]
    return {"seed-raw": b"\0" + raw, "seed-payloads": b"\1" + b"\0\n".join(payloads)}


def raft_file_seeds() -> dict[str, bytes]:
    voters = frozenset({VoterKey(1, "11" * 16), VoterKey(2, "22" * 16)})
    entries = [Entry(5, 1, EntryKind.LEADER_CHANGE, b""),
               Entry(6, 1, EntryKind.VOTERS, encode_voters(voters)),
               Entry(7, 2, EntryKind.DATA, b'{"type": "x"}')]
    log = raft_storage.LOG_HEADER.pack(raft_storage.LOG_MAGIC, raft_storage.LOG_VERSION, 5)
    log += b"".join(raft_storage.encode_frame(e) for e in entries)
    quorum = raft_storage.encode_quorum_state(raft_storage.QuorumStateFile(
        "33" * 16, QuorumState(epoch=2, voted_for=VoterKey(1, "11" * 16), leader_id=1),
        voters))
    snapshot = snapshot_file.encode(Snapshot(SnapshotId(5, 1), voters, b"image"))
    # First byte: % 3 picks the file, bit 2 fixes the CRCs.
    return {"seed-raft-log": bytes([0]) + log, "seed-quorum-state": bytes([1]) + quorum,
            "seed-snapshot": bytes([2]) + snapshot, "seed-raft-log-fixing": bytes([6]) + log}


SEEDS = {"kafka_request": kafka_request_seeds, "kafka_frame": kafka_frame_seeds,
         "group_records": group_record_seeds, "txn_records": txn_record_seeds,
         "metadata_log": metadata_log_seeds, "raft_files": raft_file_seeds}


def main() -> None:
    for target, make in SEEDS.items():
        directory = CORPUS_DIR / target
        directory.mkdir(parents=True, exist_ok=True)
        seeds = make()
        for name, data in seeds.items():
            (directory / name).write_bytes(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
