"""Offset checkpoint files, the atomic write and the clean-shutdown marker."""

from __future__ import annotations

import os

import pytest

from tidewater.broker.storage import checkpoints
from tidewater.broker.storage.checkpoints import (
    CLEAN_SHUTDOWN_FILE,
    OffsetCheckpointFile,
    TopicPartition,
    has_clean_shutdown_marker,
    remove_clean_shutdown_marker,
    write_clean_shutdown_marker,
    write_file_atomically,
)
from tidewater.proto.errors import CorruptFileError, KafkaStorageError


def test_round_trip_in_kafka_text_format(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    offsets = {
        TopicPartition("payments", 3): 17,
        TopicPartition("orders", 0): 1234,
        TopicPartition("orders", 10): 0,
    }
    OffsetCheckpointFile(path).write(offsets)
    assert path.read_text() == "0\n3\norders 0 1234\norders 10 0\npayments 3 17\n"
    assert OffsetCheckpointFile(path).read() == offsets
    assert all(isinstance(tp, TopicPartition) for tp in OffsetCheckpointFile(path).read())


def test_plain_tuple_keys_are_accepted(tmp_path):
    path = tmp_path / "log-start-offset-checkpoint"
    OffsetCheckpointFile(path).write({("t", 0): 5})
    assert OffsetCheckpointFile(path).read() == {TopicPartition("t", 0): 5}


def test_rewrite_replaces_contents(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    file.write({("a", 0): 1, ("b", 0): 2})
    file.write({("a", 0): 3})
    assert file.read() == {("a", 0): 3}
    file.write({})
    assert path.read_bytes() == b"0\n0\n"
    assert file.read() == {}


def test_missing_and_empty_files_read_as_empty(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    assert OffsetCheckpointFile(path).read() == {}
    path.write_bytes(b"")
    assert OffsetCheckpointFile(path).read() == {}


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"1\n0\n", 1),
        (b"0 \n0\n", 1),
        (b"\n", 1),
        (b"0\n", 2),
        (b"0\nthree\n", 2),
        (b"0\n1\n", 2),                        # count says 1, no entries
        (b"0\n1\nt 0 5\nt 1 6\n", 2),          # more entries than the count
        (b"0\n1\nt 0\n", 3),                   # missing offset
        (b"0\n1\nt 0 5 9\n", 3),               # extra field
        (b"0\n1\nt x 5\n", 3),
        (b"0\n1\nt 0 5.5\n", 3),
        (b"0\n1\nt -1 5\n", 3),                # negative partition
        (b"0\n1\nt  0 5\n", 3),                # two spaces
        (b"0\n1\n 0 5\n", 3),                  # empty topic
        (b"0\n2\nt 0 5\nt 0 6\n", 4),          # listed twice
        (b"0\n2\nt 0 5\n\n", 4),
        (b"0\x00\n", 1),
        (b"0\n1\nt 0 5", 3),                  # no final newline
        (b"\xc3\x28\n", None),                 # invalid UTF-8
    ],
)
def test_corrupt_files(tmp_path, content, line):
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError) as info:
        OffsetCheckpointFile(path).read()
    assert info.value.path == str(path)
    assert info.value.line == line


def test_torn_file_at_every_cut_is_corrupt(tmp_path):
    # A file cut short (e.g. copied while written) never reads as other data:
    # a cut inside the last offset ("b 0 1" of "b 0 12") lacks the final newline.
    path = tmp_path / "replication-offset-checkpoint"
    OffsetCheckpointFile(path).write({("a", 0): 10, ("a", 1): 11, ("b", 0): 12})
    data = path.read_bytes()
    for cut in range(1, len(data)):
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptFileError):
            OffsetCheckpointFile(path).read()


def test_write_rejects_unwritable_topic_names(tmp_path):
    file = OffsetCheckpointFile(tmp_path / "x")
    for bad in ({("a b", 0): 1}, {("", 0): 1}, {("a", -1): 1}, {("a\n", 0): 1}):
        with pytest.raises(ValueError):
            file.write(bad)
    assert not (tmp_path / "x").exists()


def test_atomic_write_leaves_no_tmp_file(tmp_path):
    path = tmp_path / "f"
    write_file_atomically(path, b"hello")
    write_file_atomically(path, b"bye")
    assert path.read_bytes() == b"bye"
    assert os.listdir(tmp_path) == ["f"]


def test_failed_rename_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "replication-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    file.write({("t", 0): 1})

    def failing_replace(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoints.os, "replace", failing_replace)
    with pytest.raises(KafkaStorageError) as info:
        file.write({("t", 0): 2})
    assert info.value.path == str(path)
    assert "Input/output error" in str(info.value)
    monkeypatch.undo()
    assert file.read() == {("t", 0): 1}
    assert not (tmp_path / "replication-offset-checkpoint.tmp").exists()


def test_failed_fsync_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "replication-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    file.write({("t", 0): 1})

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError):
        file.write({("t", 0): 2})
    monkeypatch.undo()
    assert file.read() == {("t", 0): 1}


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_dir_is_a_storage_error_and_keeps_old_file(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    file.write({("t", 0): 1})
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(KafkaStorageError) as info:
            file.write({("t", 0): 2})
        assert info.value.path == str(path)
    finally:
        tmp_path.chmod(0o700)
    assert file.read() == {("t", 0): 1}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file_is_a_storage_error(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    OffsetCheckpointFile(path).write({("t", 0): 1})
    path.chmod(0)
    try:
        with pytest.raises(KafkaStorageError):
            OffsetCheckpointFile(path).read()
    finally:
        path.chmod(0o600)


def test_missing_directory_is_a_storage_error(tmp_path):
    with pytest.raises(KafkaStorageError):
        OffsetCheckpointFile(tmp_path / "gone" / "f").write({("t", 0): 1})


def test_clean_shutdown_marker(tmp_path):
    assert not has_clean_shutdown_marker(tmp_path)
    write_clean_shutdown_marker(tmp_path)
    assert has_clean_shutdown_marker(tmp_path)
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).read_bytes() == b""
    remove_clean_shutdown_marker(tmp_path)
    assert not has_clean_shutdown_marker(tmp_path)
    remove_clean_shutdown_marker(tmp_path)  # already gone: fine
