"""What the leader does to a producer's batches before appending them (Kafka's LogValidator).

Two topic configs make the leader look into the records of a produce request; with
neither set (``LogConfig.leader_rewrite`` False, the default) the batches go to the
log as they came and nothing here runs:

- KIP-937 (``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms``):
  with ``message.timestamp.type=CreateTime``, a record whose timestamp is more than
  before.max.ms older, or more than after.max.ms newer, than the broker's clock
  refuses the whole request's batches for the partition (INVALID_TIMESTAMP, nothing
  appended), as Kafka 3.6+'s ``LogValidator.validateTimestamp``; records without a
  timestamp (-1) pass. Control batches are not checked.
- ``compression.type`` other than ``producer``: a producer's batch in another codec is
  decoded and re-encoded in the topic's (``uncompressed`` is code 0) with the batch
  builder, keeping its offset deltas, producer id, epoch and base sequence,
  attributes (transactional bit, timestamp type), base and max timestamps; the CRC is
  the new bytes'. A batch already in the topic's codec is kept byte for byte (as
  Kafka's in-place validation). Control batches are never rewritten. The log then
  assigns offsets and checks ``max.message.bytes`` on the rewritten batch, and
  followers copy the leader's bytes, so every replica holds the rewritten batch.
"""

from __future__ import annotations

from tidewater.proto.batch import iter_batches
from tidewater.proto.batch_builder import BatchBuilder
from tidewater.proto.compression import (
    COMPRESSION_BY_NAME,
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
)
from tidewater.proto.errors import InvalidTimestampError
from tidewater.proto.records import Record, decode_batch_records
from tidewater.proto.topic_config import INT64_MAX, LogConfig

NO_TIMESTAMP = -1


def topic_codec(compression_type: str) -> int | None:
    """The codec ``compression.type`` rewrites batches into; None for ``producer``."""
    if compression_type == "producer":
        return None
    if compression_type == "uncompressed":
        return COMPRESSION_NONE
    return COMPRESSION_BY_NAME[compression_type]


def check_timestamps(records: list[Record], now_ms: int, before_max_ms: int,
                     after_max_ms: int) -> None:
    """InvalidTimestampError for the first record outside [now - before, now + after]
    (Kafka's message, offsets as the producer sent them)."""
    for record in records:
        timestamp = record.timestamp
        if timestamp == NO_TIMESTAMP:
            continue
        diff = now_ms - timestamp
        if diff > before_max_ms or -diff > after_max_ms:
            raise InvalidTimestampError(
                f"Timestamp {timestamp} of message with offset {record.offset} is out of "
                f"range. The timestamp should be within [{now_ms - before_max_ms}, "
                f"{now_ms + after_max_ms}]")


def leader_batches(records: bytes, config: LogConfig, now_ms: int) -> bytes:
    """``records`` as the leader appends them under ``config`` at broker time ``now_ms``:
    the same object when nothing is rewritten. Raises InvalidTimestampError (KIP-937),
    CorruptRecordError for a damaged batch."""
    codec = topic_codec(config.compression_type)
    before, after = config.timestamp_before_bound_ms, config.timestamp_after_bound_ms
    check = not config.log_append_time and (before != INT64_MAX or after != INT64_MAX)
    if codec is None and not check:
        return records
    level = (config.compression_gzip_level if codec == COMPRESSION_GZIP
             else config.compression_zstd_level if codec == COMPRESSION_ZSTD else None)
    out: list[bytes] = []
    rewritten = False
    for position, header in iter_batches(records):
        original = records[position:position + header.size]
        if header.is_control:
            out.append(original)
            continue
        recode = codec is not None and header.compression != codec
        if not check and not recode:
            out.append(original)
            continue
        rows = decode_batch_records(records, position, header)
        if check:
            check_timestamps(rows, now_ms, before, after)
        if not recode:
            out.append(original)
            continue
        assert codec is not None  # recode implies a codec
        builder = BatchBuilder(header.base_timestamp)
        for row in rows:
            builder.append(row.key, row.value, row.headers, row.timestamp,
                           offset_delta=row.offset - header.base_offset)
        out.append(builder.build(
            codec, base_offset=header.base_offset,
            partition_leader_epoch=header.partition_leader_epoch,
            producer_id=header.producer_id, producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence, attributes=header.attributes,
            last_offset_delta=header.last_offset_delta, max_timestamp_ms=header.max_timestamp,
            allow_empty=True, level=level))
        rewritten = True
    return b"".join(out) if rewritten else records
