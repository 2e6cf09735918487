"""Replica comparison below the HW from segment files (client/chaos/replicas.py)."""

from __future__ import annotations

from pathlib import Path

from tidewater.proto.records import encode_batch
from tidewater.tools.chaos.replicas import compare_partition, read_batches_below

TOPIC = "t"


def batches(spec):
    """[(base_offset, epoch, [values])] -> bytes of consecutive batches."""
    return b"".join(encode_batch([(None, v.encode()) for v in values], base_offset=base,
                                 partition_leader_epoch=epoch, base_timestamp_ms=1000)
                    for base, epoch, values in spec)


def write_replica(root: Path, broker: int, segments: dict[int, bytes]) -> Path:
    data_dir = root / f"broker-{broker}"
    log_dir = data_dir / f"{TOPIC}-0"
    log_dir.mkdir(parents=True)
    for base, data in segments.items():
        (log_dir / f"{base:020d}.log").write_bytes(data)
    return data_dir


LEADER = [(0, 0, ["a", "b"]), (2, 0, ["c"]), (3, 1, ["d", "e", "f"])]


def test_identical_replicas_across_segments(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER)})
    two = write_replica(tmp_path, 2, {0: batches(LEADER[:2]), 3: batches(LEADER[2:])})
    result = compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=6)
    assert result.identical, result.detail
    assert [b.base_offset for b in read_batches_below(two / "t-0", 6)] == [0, 2, 3]


def test_data_above_the_hw_may_differ(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER + [(6, 1, ["g"])])})
    torn = batches(LEADER + [(6, 1, ["h", "i"])])[:-7]  # a tail being written
    two = write_replica(tmp_path, 2, {0: torn})
    assert compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=6).identical


def test_diverged_epoch_below_hw_is_found(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER)})
    two = write_replica(tmp_path, 2, {0: batches(LEADER[:2] + [(3, 2, ["d", "e", "f"])])})
    result = compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=6)
    assert not result.identical and "differ at batch 2" in result.detail


def test_short_replica_and_gap_are_found(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER)})
    two = write_replica(tmp_path, 2, {0: batches(LEADER[:2])})
    result = compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=6)
    assert not result.identical and "broker 2: log ends at 3, below HW 6" in result.detail
    gap = write_replica(tmp_path, 3, {0: batches([LEADER[0], LEADER[2]])})
    result = compare_partition({1: one, 3: gap}, TOPIC, 0, high_watermark=6)
    assert "gap or overlap at offset 2" in result.detail


def test_flipped_byte_below_hw_is_found(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER)})
    data = bytearray(batches(LEADER))
    data[len(data) // 2] ^= 0xFF
    two = write_replica(tmp_path, 2, {0: bytes(data)})
    result = compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=6)
    assert not result.identical and result.detail.startswith("broker 2:") and "t-0" in result.detail


def test_missing_partition_folder(tmp_path):
    one = write_replica(tmp_path, 1, {0: batches(LEADER)})
    result = compare_partition({1: one, 2: tmp_path / "nothing"}, TOPIC, 0, high_watermark=6)
    assert not result.identical and "broker 2: no folder" in result.detail


def keyed(spec):
    """[(base_offset, [(key, value)])] -> bytes of batches (epoch 0)."""
    return b"".join(encode_batch([(k.encode(), v.encode()) for k, v in records], base_offset=base,
                                 partition_leader_epoch=0, base_timestamp_ms=1000)
                    for base, records in spec)


def test_compacted_replicas_agree_where_both_hold_an_offset(tmp_path):
    whole = [(0, [("k0", "a"), ("k1", "b")]), (2, [("k0", "c")]), (3, [("k1", "d")])]
    one = write_replica(tmp_path, 1, {0: keyed(whole)})
    two = write_replica(tmp_path, 2, {2: keyed(whole[1:])})  # cleaned: offsets 0-1 gone
    result = compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=4, compacted=True)
    assert result.identical, result.detail
    # the batch comparison, for a plain topic, calls the same logs different
    assert not compare_partition({1: one, 2: two}, TOPIC, 0, high_watermark=4).identical
    wrong = write_replica(tmp_path, 3, {2: keyed([(2, [("k0", "X")]), (3, [("k1", "d")])])})
    result = compare_partition({1: one, 3: wrong}, TOPIC, 0, high_watermark=4, compacted=True)
    assert not result.identical and "differ at offset 2" in result.detail
