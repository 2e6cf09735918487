"""The metadata log: durable append, replay, torn-tail cut, corruption refused."""

import random

import pytest

from tidewater.controller.metadata_log import FILE_NAME, FRAME_HEADER, MetadataLog, encode_frame
from tidewater.proto.errors import CorruptFileError


def records(n):
    return [{"type": "t", "i": i, "pad": "x" * (i % 7)} for i in range(n)]


def test_append_then_reopen_replays_in_order_with_offsets(tmp_path):
    log = MetadataLog.open(tmp_path)
    assert log.append(records(3)) == 0
    assert log.append(records(2)) == 3
    assert log.append([]) == 5
    log.close()
    log = MetadataLog.open(tmp_path)
    got = list(log.recovered_records())
    assert [o for o, _ in got] == [0, 1, 2, 3, 4]
    assert [r["i"] for _, r in got] == [0, 1, 2, 0, 1]
    assert log.next_offset == 5
    assert log.append(records(1)) == 5
    log.close()


@pytest.mark.parametrize("seed", range(12))
def test_torn_tail_is_cut_at_the_last_whole_record(tmp_path, seed):
    rng = random.Random(seed)
    log = MetadataLog.open(tmp_path)
    log.append(records(6))
    log.close()
    path = tmp_path / FILE_NAME
    data = path.read_bytes()
    frame_ends = []
    pos = 0
    while pos < len(data):
        length, _ = FRAME_HEADER.unpack_from(data, pos)
        pos += FRAME_HEADER.size + length
        frame_ends.append(pos)
    cut = rng.randrange(0, len(data))
    path.write_bytes(data[:cut])
    whole = sum(1 for end in frame_ends if end <= cut)
    log = MetadataLog.open(tmp_path)
    assert [r["i"] for _, r in log.recovered_records()] == list(range(whole))
    # the torn bytes are gone from disk, and appends continue cleanly
    assert path.stat().st_size == (frame_ends[whole - 1] if whole else 0)
    assert log.append([{"type": "t", "i": 99}]) == whole
    log.close()
    log = MetadataLog.open(tmp_path)
    assert [r["i"] for _, r in log.recovered_records()][-1] == 99
    log.close()


def test_bad_crc_on_last_record_is_a_torn_write(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append(records(3))
    log.close()
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    log = MetadataLog.open(tmp_path)
    assert len(list(log.recovered_records())) == 2
    log.close()


def test_zero_filled_tail_is_cut(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append(records(2))
    log.close()
    path = tmp_path / FILE_NAME
    path.write_bytes(path.read_bytes() + bytes(100))
    log = MetadataLog.open(tmp_path)
    assert len(list(log.recovered_records())) == 2
    log.close()


def test_corruption_in_the_middle_is_refused_and_file_untouched(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append(records(3))
    log.close()
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    data[FRAME_HEADER.size + 2] ^= 0xFF  # inside the first payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError) as info:
        MetadataLog.open(tmp_path)
    assert "position 0" in str(info.value) and str(path) in str(info.value)
    assert path.read_bytes() == bytes(data)


def test_record_without_type_is_corruption(tmp_path):
    path = tmp_path / FILE_NAME
    good = encode_frame({"type": "t"})
    import crc32c
    payload = b"[1,2]"
    bad = FRAME_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload
    path.write_bytes(good + bad + good)
    with pytest.raises(CorruptFileError):
        MetadataLog.open(tmp_path)


def test_second_open_of_a_locked_log_is_refused(tmp_path):
    from tidewater.proto.errors import KafkaStorageError

    log = MetadataLog.open(tmp_path)
    with pytest.raises(KafkaStorageError, match="locked"):
        MetadataLog.open(tmp_path)
    log.close()
    MetadataLog.open(tmp_path).close()


def test_rewrite_keeps_offsets_growing_and_survives_reopen(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append(records(10))
    assert log.rewrite([{"type": "t", "i": "snap"}]) == 10
    assert (log.start_offset, log.next_offset, log.record_count) == (10, 11, 1)
    assert log.append([{"type": "t", "i": "after"}]) == 11
    log.close()
    log = MetadataLog.open(tmp_path)
    assert list(log.recovered_records()) == [(10, {"type": "t", "i": "snap"}),
                                             (11, {"type": "t", "i": "after"})]
    assert log.next_offset == 12
    log.close()


def test_unfinished_compaction_is_discarded(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append(records(3))
    log.close()
    (tmp_path / (FILE_NAME + ".tmp")).write_bytes(encode_frame({"type": "half"}))
    log = MetadataLog.open(tmp_path)
    assert [r["i"] for _, r in log.recovered_records()] == [0, 1, 2]
    assert not (tmp_path / (FILE_NAME + ".tmp")).exists()
    log.close()


def test_log_start_anywhere_but_first_is_corruption(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_bytes(encode_frame({"type": "t"}) + encode_frame({"type": "log_start",
                                                                  "next_offset": 5})
                     + encode_frame({"type": "t"}))
    with pytest.raises(CorruptFileError):
        MetadataLog.open(tmp_path)


def test_the_log_directory_and_files_are_private(tmp_path):
    """Control tokens and SCRAM keys are in the log: 0700 directory, 0600 files, also
    when they were made before (with a loose umask) and after a compaction."""
    import os
    import stat

    def mode(path):
        return stat.S_IMODE(os.stat(path).st_mode)

    data_dir = tmp_path / "ctl"
    old_umask = os.umask(0o022)
    try:
        data_dir.mkdir(mode=0o755)
        (data_dir / "metadata.log").touch(mode=0o644)
        log = MetadataLog.open(data_dir)
        try:
            assert mode(data_dir) == 0o700
            assert mode(data_dir / "metadata.log") == 0o600
            assert mode(data_dir / "metadata.lock") == 0o600
            log.append([{"type": "cluster", "cluster_id": "c"}])
            log.rewrite([{"type": "cluster", "cluster_id": "c"}])
            assert mode(data_dir / "metadata.log") == 0o600
        finally:
            log.close()
        fresh = tmp_path / "new" / "ctl"
        MetadataLog.open(fresh).close()
        assert mode(fresh) == 0o700 and mode(fresh / "metadata.log") == 0o600
    finally:
        os.umask(old_umask)
