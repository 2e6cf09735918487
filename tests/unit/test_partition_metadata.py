"""partition.metadata (Kafka's format), meta.properties, topic ID text, and the LogManager's
use of them: round trips, corrupt files, torn writes, IDs across a reload."""

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.meta_properties import (
    MetaProperties,
    decode_meta_properties,
    read_meta_properties,
    write_meta_properties,
)
from tidewater.broker.storage.partition_metadata import (
    PARTITION_METADATA_FILE,
    decode_partition_metadata,
    encode_partition_metadata,
    read_partition_metadata,
    write_partition_metadata,
)
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.errors import CorruptFileError, InvalidRequestError
from tidewater.proto.topic_id import (
    ZERO_TOPIC_ID,
    check_topic_id,
    new_topic_id,
    topic_id_from_text,
    topic_id_to_text,
)

ID = bytes(range(1, 17))
CONFIG = LogConfig()
A0 = TopicPartition("a", 0)


@given(st.binary(min_size=16, max_size=16))
def test_topic_id_text_round_trip(raw):
    text = topic_id_to_text(raw)
    assert len(text) == 22 and "=" not in text
    assert topic_id_from_text(text) == raw


@pytest.mark.parametrize("text", ["", "x" * 21, "x" * 23, "AAAAAAAAAAAAAAAAAAAAA+", "é" * 22,
                                  "AAAAAAAAAAAAAAAAAAAAAB"])  # last: non-canonical tail bits
def test_bad_topic_id_text(text):
    with pytest.raises(ValueError):
        topic_id_from_text(text)


def test_new_ids_are_valid_and_distinct():
    ids = {new_topic_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 16 and i != ZERO_TOPIC_ID and not topic_id_to_text(i).startswith("-")
               for i in ids)


@pytest.mark.parametrize("raw", [b"", b"x" * 15, b"x" * 17, ZERO_TOPIC_ID, bytes(15) + b"\x01"])
def test_check_topic_id_refuses_wrong_length_and_reserved(raw):
    with pytest.raises(InvalidRequestError):
        check_topic_id(raw)


def test_partition_metadata_is_kafkas_format_and_round_trips(tmp_path):
    write_partition_metadata(tmp_path, ID)
    assert (tmp_path / PARTITION_METADATA_FILE).read_text() == (
        f"version: 0\ntopic_id: {topic_id_to_text(ID)}\n")
    assert read_partition_metadata(tmp_path) == ID
    assert read_partition_metadata(tmp_path / "absent") is None
    assert not (tmp_path / (PARTITION_METADATA_FILE + ".tmp")).exists()


@pytest.mark.parametrize("text,line", [
    ("", None),
    ("version: 0\n", None),
    ("version: 1\ntopic_id: {id}\n", 1),
    ("version 0\ntopic_id: {id}\n", 1),
    ("version: 0\ntopicid: {id}\n", 2),
    ("version: 0\ntopic_id: not-an-id\n", 2),
    ("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n", 2),  # the zero UUID
    ("version: 0\ntopic_id: {id}\nextra: 1\n", None),
    ("version: 0\ntopic_id: {id", 2),  # torn copy
])
def test_corrupt_partition_metadata_names_path_and_line(tmp_path, text, line):
    (tmp_path / PARTITION_METADATA_FILE).write_text(text.replace("{id}", topic_id_to_text(ID)))
    with pytest.raises(CorruptFileError) as info:
        read_partition_metadata(tmp_path)
    assert info.value.path == str(tmp_path / PARTITION_METADATA_FILE)
    assert info.value.line == line


def test_partition_metadata_tolerates_whitespace_and_no_final_newline():
    text = f"version:0\r\ntopic_id:   {topic_id_to_text(ID)}".replace("\r", "")
    assert decode_partition_metadata(text.encode()) == ID
    assert decode_partition_metadata(encode_partition_metadata(ID)) == ID


def test_a_torn_write_leaves_the_old_file_and_the_tmp_is_cleaned_at_open(tmp_path):
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    manager.get_or_create(A0, CONFIG, now_ms=0, topic_id=ID)
    manager.shutdown()
    # A crash while a new file was written: a half-written .tmp, the rename never happened.
    tmp = tmp_path / "a-0" / (PARTITION_METADATA_FILE + ".tmp")
    tmp.write_bytes(b"version: 0\ntopic_")
    reloaded = LogManager(tmp_path, CONFIG)
    reloaded.load(now_ms=0)
    assert reloaded.topic_id(A0) == ID
    assert not tmp.exists()
    reloaded.shutdown()


def test_log_manager_keeps_ids_across_a_reload_and_adopts_once(tmp_path):
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    manager.get_or_create(A0, CONFIG, now_ms=0, topic_id=ID)
    legacy = TopicPartition("old", 0)
    manager.get_or_create(legacy, CONFIG, now_ms=0)  # a log made before topic IDs
    assert not (tmp_path / "old-0" / PARTITION_METADATA_FILE).exists()
    manager.shutdown()
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    assert manager.topic_ids() == {A0: ID, legacy: None}
    other = new_topic_id()
    manager.assign_topic_id(legacy, other)
    with pytest.raises(AssertionError):
        manager.assign_topic_id(legacy, ID)  # an ID is never rewritten
    manager.shutdown()
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    assert manager.topic_ids() == {A0: ID, legacy: other}
    manager.shutdown()


def test_a_corrupt_partition_metadata_fails_the_load_and_changes_nothing(tmp_path):
    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)
    manager.get_or_create(A0, CONFIG, now_ms=0, topic_id=ID)
    manager.shutdown()
    path = tmp_path / "a-0" / PARTITION_METADATA_FILE
    path.write_text("version: 0\ntopic_id: garbage\n")
    before = sorted(os.listdir(tmp_path / "a-0"))
    with pytest.raises(CorruptFileError, match=re.escape(str(path))):
        LogManager(tmp_path, CONFIG).load(now_ms=0)
    assert sorted(os.listdir(tmp_path / "a-0")) == before


def test_a_failed_write_of_a_new_log_s_id_hands_out_no_log(tmp_path, monkeypatch):
    from tidewater.broker.storage import log_manager as module
    from tidewater.proto.errors import KafkaStorageError

    manager = LogManager(tmp_path, CONFIG)
    manager.load(now_ms=0)

    def full_disk(directory, topic_id):
        raise KafkaStorageError("No space left on device", path=str(directory))

    monkeypatch.setattr(module, "write_partition_metadata", full_disk)
    with pytest.raises(KafkaStorageError):
        manager.get_or_create(A0, CONFIG, now_ms=0, topic_id=ID)
    assert manager.get(A0) is None and manager.topic_id(A0) is None


def test_meta_properties_round_trip_and_corruption(tmp_path):
    assert read_meta_properties(tmp_path) is None
    write_meta_properties(tmp_path, MetaProperties(3, "c0ffee"))
    text = (tmp_path / "meta.properties").read_text()
    assert "broker.id=3\n" in text and "cluster.id=c0ffee\n" in text and "version=0\n" in text
    assert read_meta_properties(tmp_path) == MetaProperties(3, "c0ffee")
    for bad in ("version=1\nbroker.id=3\ncluster.id=x\n", "version=0\nbroker.id=x\ncluster.id=y\n",
                "version=0\nbroker.id=3\n", "version=0\nbroker.id=3\ncluster.id\n"):
        with pytest.raises(CorruptFileError):
            decode_meta_properties(bad.encode(), "m")
