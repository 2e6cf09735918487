"""The records of ``__consumer_offsets``, byte for byte as Kafka writes them.

Each change a group coordinator makes is one record (key, value) in the group's
partition, in an ordinary RecordBatch v2 (``proto.records.encode_batch``). Kafka's
classic formats (group-coordinator/src/main/resources/common/message/*.json),
big-endian, strings as int16 length + UTF-8 (nullable: length -1), bytes as int32
length + bytes:

Keys start with an int16 version that names the record type:

================  =======  ==========================================================
key               version  fields
================  =======  ==========================================================
OffsetCommitKey   0 or 1   group string, topic string, partition int32
GroupMetadataKey  2        group string
================  =======  ==========================================================

Values start with their own int16 version. A null value is a tombstone: the offset,
or the whole group, is deleted (compaction then drops what came before).

``OffsetCommitValue`` (written as v3; v0-3 read):
  v0: offset int64, metadata string, commit_timestamp int64
  v1: offset int64, metadata string, commit_timestamp int64, expire_timestamp int64
  v2: as v0
  v3: offset int64, leader_epoch int32, metadata string, commit_timestamp int64

``GroupMetadataValue`` (written as v3; v0-3 read):
  protocol_type string, generation int32, protocol nullable string,
  leader nullable string, current_state_timestamp int64 (v2+),
  members: int32 count, then per member: member_id string,
  group_instance_id nullable string (v3+), client_id string, client_host string,
  rebalance_timeout int32 (v1+), session_timeout int32, subscription bytes,
  assignment bytes

The flexible versions (OffsetCommitValue v4, GroupMetadataValue v4, KIP-915) and the
KIP-848 record types (keys 3+) are refused with ``GroupRecordError``; a loader skips
them and says so. Reading checks every length against the bytes there.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidewater.proto import wire
from tidewater.proto.errors import CorruptRecordError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3



class GroupRecordError(CorruptRecordError):
    """A ``__consumer_offsets`` record this reader cannot parse."""


@dataclass(frozen=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberMetadata, ...]


@dataclass(frozen=True)
class OffsetCommitRecord:
    group_id: str
    topic: str
    partition: int
    value: OffsetCommitValue | None  # None: tombstone


@dataclass(frozen=True)
class GroupMetadataRecord:
    group_id: str
    value: GroupMetadataValue | None  # None: tombstone


GroupRecord = OffsetCommitRecord | GroupMetadataRecord


# ---------------------------------------------------------------- writing

def encode_key(record: GroupRecord) -> bytes:
    if isinstance(record, OffsetCommitRecord):
        return (wire.I16.pack(OFFSET_COMMIT_KEY_VERSION) + wire.string(record.group_id)
                + wire.string(record.topic) + wire.I32.pack(record.partition))
    return wire.I16.pack(GROUP_METADATA_KEY_VERSION) + wire.string(record.group_id)


def encode_value(record: GroupRecord) -> bytes | None:
    if record.value is None:
        return None
    if isinstance(record, OffsetCommitRecord):
        v = record.value
        return (wire.I16.pack(OFFSET_COMMIT_VALUE_VERSION) + wire.I64.pack(v.offset)
                + wire.I32.pack(v.leader_epoch) + wire.string(v.metadata)
                + wire.I64.pack(v.commit_timestamp_ms))
    g = record.value
    parts = [wire.I16.pack(GROUP_METADATA_VALUE_VERSION), wire.string(g.protocol_type),
             wire.I32.pack(g.generation), wire.string(g.protocol), wire.string(g.leader),
             wire.I64.pack(g.current_state_timestamp_ms), wire.I32.pack(len(g.members))]
    for m in g.members:
        parts += [wire.string(m.member_id), wire.string(m.group_instance_id), wire.string(m.client_id),
                  wire.string(m.client_host), wire.I32.pack(m.rebalance_timeout_ms),
                  wire.I32.pack(m.session_timeout_ms), wire.bytes_field(m.subscription),
                  wire.bytes_field(m.assignment)]
    return b"".join(parts)


# ---------------------------------------------------------------- reading

def decode(key: bytes | None, value: bytes | None) -> GroupRecord:
    """The record a key and value hold; GroupRecordError for what is not one of ours."""
    if key is None:
        raise GroupRecordError("record without a key")
    k = wire.WireReader(key, GroupRecordError)
    version = k.i16()
    if version in (0, 1):
        group, topic, partition = k.string(), k.string(), k.i32()
        k.end()
        return OffsetCommitRecord(group, topic, partition,
                                  None if value is None else _offset_value(value))
    if version == GROUP_METADATA_KEY_VERSION:
        group = k.string()
        k.end()
        return GroupMetadataRecord(group, None if value is None else _group_value(value))
    raise GroupRecordError(f"key version {version} is not a classic group record")


def _offset_value(raw: bytes) -> OffsetCommitValue:
    r = wire.WireReader(raw, GroupRecordError)
    version = r.i16()
    if version not in (0, 1, 2, 3):
        raise GroupRecordError(f"OffsetCommitValue version {version} is not read")
    offset = r.i64()
    leader_epoch = r.i32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.i64()
    if version == 1:
        r.i64()  # expire_timestamp: offsets expire by the group's state instead
    r.end()
    return OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp)


def _group_value(raw: bytes) -> GroupMetadataValue:
    r = wire.WireReader(raw, GroupRecordError)
    version = r.i16()
    if version not in (0, 1, 2, 3):
        raise GroupRecordError(f"GroupMetadataValue version {version} is not read")
    protocol_type, generation = r.string(), r.i32()
    protocol, leader = r.nullable_string(), r.nullable_string()
    timestamp = r.i64() if version >= 2 else -1
    count = r.count()
    members = []
    for _ in range(count):
        member_id = r.string()
        instance = r.nullable_string() if version >= 3 else None
        client_id, client_host = r.string(), r.string()
        rebalance_timeout = r.i32() if version >= 1 else -1
        session_timeout = r.i32()
        subscription, assignment = r.bytes_(), r.bytes_()
        members.append(MemberMetadata(member_id, instance, client_id, client_host,
                                      rebalance_timeout if version >= 1 else session_timeout,
                                      session_timeout, subscription, assignment))
    r.end()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, timestamp,
                              tuple(members))
