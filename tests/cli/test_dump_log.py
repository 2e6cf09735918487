"""`tide dump-log`: run the real CLI on files written by the real Log and by hand."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.broker.storage.checkpoints import OffsetCheckpointFile, write_clean_shutdown_marker
from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    SimpleRecord,
    encode_batch,
)
from tidewater.tools.cli import main as tide_main

REPO = Path(__file__).resolve().parents[2]
BATCH_KEYS = {"type", "file", "position", "base_offset", "last_offset", "count",
              "partition_leader_epoch", "size", "crc", "crc_valid", "compression",
              "max_timestamp", "producer_id", "producer_epoch", "base_sequence",
              "is_transactional", "is_control"}
RECORD_KEYS = {"type", "offset", "timestamp", "key", "value", "headers"}


def tide_process(*args: str | Path) -> subprocess.CompletedProcess:
    """The real command in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "tidewater.tools", "dump-log", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


def tide(*args: str | Path) -> subprocess.CompletedProcess:
    """The same entry point (tools.cli.main) in this process: most tests, to stay fast."""
    argv = ["dump-log", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = tide_main(argv)
        except SystemExit as e:   # argparse usage errors
            code = e.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def json_lines(result: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def problems(events: list[dict]) -> list[tuple[str, int | None]]:
    return [(e["problem"], e["position"]) for e in of_type(events, "problem")]


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def write_segment(directory: Path, base_offset: int, batches: list[bytes]) -> Path:
    """Our own tiny writer: batches back to back in <base>.log."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / segment_name(base_offset, ".log")
    path.write_bytes(b"".join(batches))
    return path


def batch(base_offset: int, count: int = 2, epoch: int = 0, *, ts: int = 1000,
          compression: int = COMPRESSION_NONE) -> bytes:
    records = [SimpleRecord(b"k%d" % (base_offset + i), b"v%d" % (base_offset + i), (), ts + i)
               for i in range(count)]
    return encode_batch(records, base_offset=base_offset, partition_leader_epoch=epoch,
                        compression=compression)


@pytest.fixture(scope="module")
def real_log_dir(tmp_path_factory) -> tuple[Path, list[tuple[int, int]], int]:
    """A partition written by broker.storage.log.Log: 3 segments, 3 epochs, all codecs."""
    directory = tmp_path_factory.mktemp("data") / "orders-0"
    config = LogConfig(segment_bytes=700, index_interval_bytes=1)
    log = Log.open(directory, config, now_ms=1_000)
    codecs = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD]
    for i in range(12):
        records = [
            SimpleRecord(b"key-%d" % i, b"value-%d-\xff" % i, (("trace", b"t%d" % i),
                                                              ("none", None)), 5_000 + i),
            SimpleRecord(None, b"", (), 4_000 + i),
        ]
        log.append_as_leader(encode_batch(records, compression=codecs[i % 4]),
                             leader_epoch=i // 5, now_ms=2_000)
    epochs = log.leader_epoch_cache.entries()
    leo = log.log_end_offset
    log.close()
    return directory, epochs, leo


# -- a real log -----------------------------------------------------------------------

def test_real_log_dumps_and_verifies(real_log_dir):
    directory, epochs, leo = real_log_dir
    assert len(list(directory.glob("*.log"))) >= 3
    result = tide_process(directory, "--json", "--print-data", "--verify")
    assert result.returncode == 0, result.stdout + result.stderr
    events = json_lines(result)
    assert problems(events) == []

    batches = of_type(events, "batch")
    assert all(set(b) == BATCH_KEYS for b in batches)
    assert [b["base_offset"] for b in batches] == list(range(0, leo, 2))
    assert all(b["last_offset"] == b["base_offset"] + 1 and b["count"] == 2 for b in batches)
    assert [b["partition_leader_epoch"] for b in batches] == [i // 5 for i in range(12)]
    assert [b["compression"] for b in batches] == ["none", "gzip", "lz4", "zstd"] * 3
    assert all(b["crc_valid"] for b in batches)
    assert [b["max_timestamp"] for b in batches] == [5_000 + i for i in range(12)]
    for b in batches:
        assert Path(b["file"]).name == segment_name(int(Path(b["file"]).stem), ".log")

    records = of_type(events, "record")
    assert all(set(r) == RECORD_KEYS for r in records)
    assert [r["offset"] for r in records] == list(range(leo))
    assert records[0] == {"type": "record", "offset": 0, "timestamp": 5_000, "key": "key-0",
                          "value": "value-0-\\xff", "headers": [["trace", "t0"], ["none", None]]}
    assert records[1] == {"type": "record", "offset": 1, "timestamp": 4_000, "key": None,
                          "value": "", "headers": []}

    assert [(e["epoch"], e["start_offset"]) for e in of_type(events, "epoch_entry")] == epochs
    index_entries = of_type(events, "index_entry")
    assert index_entries, "index.interval.bytes=1 indexes every batch"
    by_position = {(b["file"], b["position"]): b for b in batches}
    for entry in index_entries:
        log_file = entry["file"].replace(".index", ".log")
        assert by_position[(log_file, entry["position"])]["last_offset"] == entry["offset"]
    assert of_type(events, "time_index_entry")


def test_text_output_is_kafka_dump_log_like(real_log_dir):
    directory, _, _ = real_log_dir
    first = directory / segment_name(0, ".log")
    result = tide_process(first)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {first}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 1 count: 2 partitionLeaderEpoch: 0 "
                               "position: 0 ")
    assert "compresscodec: none" in lines[2] and "isValid: true" in lines[2]
    assert not any(line.startswith("|") for line in lines)
    with_data = tide(first, "--print-data").stdout.splitlines()
    assert with_data[3] == ("| offset: 0 timestamp: 5000 key: key-0 value: value-0-\\xff "
                            "headers: [trace: t0, none: null]")
    assert with_data[4] == "| offset: 1 timestamp: 4000 key: null value:  headers: []"


# -- damage -------------------------------------------------------------------------------

@pytest.mark.parametrize("cut_into", ["header", "records"])
def test_torn_tail_is_reported_not_a_crash(tmp_path, cut_into):
    batches = [batch(0), batch(2), batch(4)]
    last_position = len(batches[0]) + len(batches[1])
    path = write_segment(tmp_path / "t-0", 0, batches)
    data = path.read_bytes()
    cut = last_position + (30 if cut_into == "header" else len(batches[2]) - 5)
    path.write_bytes(data[:cut])

    result = tide(path, "--json")
    assert result.returncode == 0, result.stderr   # reported; not a failure without --verify
    events = json_lines(result)
    assert [b["base_offset"] for b in of_type(events, "batch")] == [0, 2]
    assert problems(events) == [("torn_tail", last_position)]
    assert "torn tail" in of_type(events, "problem")[0]["message"]

    verified = tide_process(path, "--verify")
    assert verified.returncode == 1
    assert f"PROBLEM {path}:{last_position}: torn_tail" in verified.stdout
    assert "1 problem(s) found" in verified.stderr


def test_crc_mismatch(tmp_path):
    batches = [batch(0), batch(2, compression=COMPRESSION_GZIP), batch(4)]
    path = write_segment(tmp_path / "t-0", 0, batches)
    data = bytearray(path.read_bytes())
    bad_position = len(batches[0])
    data[bad_position + len(batches[1]) - 2] ^= 0x40   # inside the gzip data
    path.write_bytes(bytes(data))

    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    events = json_lines(result)
    assert [b["crc_valid"] for b in of_type(events, "batch")] == [True, False, True]
    assert ("crc_mismatch", bad_position) in problems(events)
    # Without --verify the batch line says it; the exit code does not.
    plain = tide(path, "--json")
    assert plain.returncode == 0
    assert [b["crc_valid"] for b in of_type(json_lines(plain), "batch")] == [True, False, True]


@pytest.mark.parametrize(
    ("bases_and_epochs", "expected"),
    [
        ([(0, 0), (2, 0), (5, 0)], "offset_discontinuity"),     # gap: 4 missing
        ([(0, 0), (2, 0), (3, 0)], "offset_discontinuity"),     # overlap: 3 twice
        ([(0, 0), (0, 0)], "offset_discontinuity"),             # repeated batch
        ([(0, 2), (2, 1)], "epoch_decrease"),
    ],
)
def test_verify_names_continuity_and_epoch_problems(tmp_path, bases_and_epochs, expected):
    batches = [batch(base, epoch=epoch) for base, epoch in bases_and_epochs]
    path = write_segment(tmp_path / "t-0", 0, batches)
    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    found = problems(json_lines(result))
    assert found == [(expected, sum(len(b) for b in batches[:-1]))]


def test_first_batch_must_start_at_segment_base(tmp_path):
    path = write_segment(tmp_path / "t-0", 10, [batch(12)])
    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    assert problems(json_lines(result)) == [("offset_discontinuity", 0)]


def test_segments_must_follow_each_other(tmp_path):
    directory = tmp_path / "t-0"
    write_segment(directory, 0, [batch(0), batch(2)])
    write_segment(directory, 5, [batch(5)])
    result = tide(directory, "--json", "--verify")
    assert result.returncode == 1
    events = json_lines(result)
    assert problems(events) == [("offset_discontinuity", None)]
    assert of_type(events, "problem")[0]["file"].endswith(segment_name(5, ".log"))
    # Contiguous segments pass.
    (directory / segment_name(5, ".log")).rename(directory / segment_name(4, ".log"))
    (directory / segment_name(4, ".log")).write_bytes(batch(4))
    assert tide(directory, "--verify").returncode == 0


# -- indexes ------------------------------------------------------------------------------

def write_index(directory: Path, base: int, entries: list[tuple[int, int]], padding: int = 0):
    data = b"".join(struct.pack(">ii", rel, pos) for rel, pos in entries) + bytes(8 * padding)
    (directory / segment_name(base, ".index")).write_bytes(data)
    return directory / segment_name(base, ".index")


def write_time_index(directory: Path, base: int, entries: list[tuple[int, int]]):
    data = b"".join(struct.pack(">qi", ts, rel) for ts, rel in entries)
    (directory / segment_name(base, ".timeindex")).write_bytes(data)
    return directory / segment_name(base, ".timeindex")


@pytest.fixture
def segment_100(tmp_path) -> tuple[Path, list[int]]:
    """Segment 100 with batches 100-101, 102-103, 104-105 (timestamps 1000.., 1010.., 1020..)."""
    batches = [batch(100, ts=1000), batch(102, ts=1010), batch(104, ts=1020)]
    directory = tmp_path / "t-0"
    write_segment(directory, 100, batches)
    positions = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    return directory, positions


def test_index_entries_are_absolute_and_padding_is_ignored(segment_100):
    directory, positions = segment_100
    path = write_index(directory, 100, [(3, positions[1]), (5, positions[2])], padding=6)
    result = tide(path, "--json", "--verify")
    assert result.returncode == 0, result.stdout
    entries = of_type(json_lines(result), "index_entry")
    assert [(e["offset"], e["position"]) for e in entries] == [(103, positions[1]),
                                                               (105, positions[2])]
    # A wholly preallocated (all zero) index has no entries.
    write_index(directory, 100, [], padding=10)
    result = tide(path, "--json", "--verify")
    assert result.returncode == 0
    assert of_type(json_lines(result), "index_entry") == []


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (lambda p: [(3, p[1] + 1)], [("index_mismatch", 0)]),        # not a batch start
        (lambda p: [(2, p[1])], [("index_mismatch", 0)]),            # batch ends at 103
        (lambda p: [(3, 10_000)], [("index_mismatch", 0)]),          # past the end
        (lambda p: [(5, p[2]), (3, p[1])], [("index_out_of_order", 8)]),
    ],
)
def test_index_problems(segment_100, entries, expected):
    directory, positions = segment_100
    path = write_index(directory, 100, entries(positions))
    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    assert problems(json_lines(result)) == expected


def test_torn_index_and_missing_log(segment_100, tmp_path):
    directory, positions = segment_100
    path = write_index(directory, 100, [(3, positions[1])])
    path.write_bytes(path.read_bytes() + b"\x00\x01\x02")
    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    assert problems(json_lines(result)) == [("torn_tail", 8)]
    orphan = write_index(tmp_path, 7, [(0, 0)])
    result = tide(orphan, "--json", "--verify")
    assert result.returncode == 1
    assert problems(json_lines(result)) == [("missing_log", None)]
    assert tide(orphan, "--json").returncode == 0   # dumping needs no .log


def test_time_index(segment_100):
    directory, _ = segment_100
    path = write_time_index(directory, 100, [(1011, 3), (1021, 5)])
    result = tide(path, "--json", "--verify")
    assert result.returncode == 0, result.stdout
    assert [(e["timestamp"], e["offset"]) for e in of_type(json_lines(result),
                                                            "time_index_entry")] == [
        (1011, 103), (1021, 105)]
    write_time_index(directory, 100, [(1011, 3), (1011, 5), (1020, 4)])
    result = tide(path, "--json", "--verify")
    assert result.returncode == 1
    assert problems(json_lines(result)) == [
        ("index_out_of_order", 12),   # 1011 is not above 1011
        ("index_mismatch", 12),       # the batch ending at 105 has max timestamp 1021
        ("index_mismatch", 24),       # no batch ends at 104
    ]


# -- checkpoints ----------------------------------------------------------------------------

def test_checkpoint_files(tmp_path):
    OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").write(
        {TopicPartition("orders", 0): 12, TopicPartition("orders", 1): 7})
    OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").write({})
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    cache.assign(0, 0)
    cache.assign(3, 40)
    write_clean_shutdown_marker(tmp_path)
    result = tide(tmp_path / "replication-offset-checkpoint", tmp_path / "leader-epoch-checkpoint",
                  tmp_path / "log-start-offset-checkpoint", tmp_path / ".kafka_cleanshutdown",
                  "--json", "--verify")
    assert result.returncode == 0, result.stdout
    events = json_lines(result)
    assert [(e["topic"], e["partition"], e["offset"])
            for e in of_type(events, "checkpoint_entry")] == [("orders", 0, 12), ("orders", 1, 7)]
    assert [(e["epoch"], e["start_offset"]) for e in of_type(events, "epoch_entry")] == [
        (0, 0), (3, 40)]
    assert [e["kind"] for e in of_type(events, "file")] == [
        "offset-checkpoint", "leader-epoch-checkpoint", "offset-checkpoint", "marker"]
    text = tide(tmp_path / "replication-offset-checkpoint").stdout.splitlines()
    assert text[1:] == ["topic: orders partition: 0 offset: 12",
                        "topic: orders partition: 1 offset: 7"]


def test_corrupt_checkpoints_are_problems(tmp_path):
    (tmp_path / "recovery-point-offset-checkpoint").write_text("0\n2\norders 0 5\n")
    (tmp_path / "leader-epoch-checkpoint").write_text("1\n0\n")
    result = tide(tmp_path / "recovery-point-offset-checkpoint",
                  tmp_path / "leader-epoch-checkpoint", "--json", "--verify")
    assert result.returncode == 1
    events = of_type(json_lines(result), "problem")
    assert [e["problem"] for e in events] == ["corrupt_file", "corrupt_file"]
    assert "count says 2 entries" in events[0]["message"]
    assert "unsupported version" in events[1]["message"]


def test_partition_metadata(tmp_path):
    from tidewater.broker.storage.partition_metadata import write_partition_metadata
    from tidewater.proto.topic_id import topic_id_to_text

    directory = tmp_path / "orders-0"
    write_segment(directory, 0, [batch(0)])
    topic_id = bytes(range(1, 17))
    write_partition_metadata(directory, topic_id)
    result = tide_process(directory, "--json", "--verify")  # the real command, a directory
    assert result.returncode == 0, result.stdout + result.stderr
    [event] = of_type(json_lines(result), "partition_metadata")
    assert event == {"type": "partition_metadata", "file": str(directory / "partition.metadata"),
                     "version": 0, "topic_id": topic_id_to_text(topic_id)}
    text = tide(directory / "partition.metadata").stdout.splitlines()
    assert text == [f"Dumping {directory / 'partition.metadata'}",
                    f"version: 0 topicId: {topic_id_to_text(topic_id)}"]
    (directory / "partition.metadata").write_text("version: 0\ntopic_id: nonsense\n")
    result = tide(directory / "partition.metadata", "--json")
    assert [e["problem"] for e in of_type(json_lines(result), "problem")] == ["corrupt_file"]
    assert "partition.metadata:2" in of_type(json_lines(result), "problem")[0]["message"]


def test_producer_snapshots_written_by_the_real_log(tmp_path):
    from tidewater.broker.storage.log import Log
    from tidewater.broker.storage.log_config import LogConfig
    from tidewater.broker.storage.producer_state import snapshot_file_name
    from tidewater.proto.records import encode_batch

    directory = tmp_path / "orders-0"
    log = Log.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(encode_batch([(None, b"a")] * 3, producer_id=42, producer_epoch=1,
                                      base_sequence=0, base_timestamp_ms=777), 0, now_ms=1)
    log.close()  # a clean shutdown writes the snapshot at the log end
    snapshot = directory / snapshot_file_name(3)
    result = tide_process(directory, "--json", "--verify")  # the real command, a directory
    assert result.returncode == 0, result.stdout + result.stderr
    [entry] = of_type(json_lines(result), "producer_snapshot_entry")
    assert entry == {"type": "producer_snapshot_entry", "file": str(snapshot),
                     "producer_id": 42, "producer_epoch": 1, "first_sequence": 0,
                     "last_sequence": 2, "last_offset": 2, "offset_delta": 2, "timestamp": 777,
                     "coordinator_epoch": -1, "current_txn_first_offset": -1}
    [batch_line] = of_type(json_lines(result), "batch")
    assert (batch_line["producer_id"], batch_line["base_sequence"]) == (42, 0)
    assert tide(snapshot).stdout.splitlines()[1] == (
        "producerId: 42 producerEpoch: 1 firstSequence: 0 lastSequence: 2 lastOffset: 2 "
        "offsetDelta: 2 timestamp: 777 coordinatorEpoch: -1 currentTxnFirstOffset: -1")
    snapshot.write_bytes(snapshot.read_bytes()[:-1])
    result = tide(snapshot, "--json")
    assert [e["problem"] for e in of_type(json_lines(result), "problem")] == ["corrupt_file"]


def test_unknown_and_missing_files_fail(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    result = tide(tmp_path / "notes.txt", tmp_path / segment_name(0, ".log"), "--json")
    assert result.returncode == 1
    assert [p for p, _ in problems(json_lines(result))] == ["unknown_file", "unreadable"]


def test_no_arguments_is_a_usage_error():
    result = tide_process()
    assert result.returncode == 2
    assert "FILE" in result.stderr


# -- robustness (in process: many runs) -------------------------------------------------

def test_every_cut_of_a_segment_dumps_without_crashing(tmp_path, capsys):
    batches = [batch(0, compression=COMPRESSION_LZ4), batch(2), batch(4, compression=COMPRESSION_ZSTD)]
    full = b"".join(batches)
    path = tmp_path / segment_name(0, ".log")
    for cut in range(0, len(full) + 1, 7):
        path.write_bytes(full[:cut])
        code = tide_main(["dump-log", str(path), "--json", "--print-data", "--verify"])
        events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        whole = sum(1 for end in (len(batches[0]), len(batches[0]) + len(batches[1]), len(full))
                    if end <= cut)
        assert len(of_type(events, "batch")) == whole
        assert code == (0 if cut in (0, len(batches[0]), len(full)) else 1)


def test_verify_takes_a_compacted_log_for_what_it_is(tmp_path):
    from tidewater.broker.storage.cleaner import CLEANER_OFFSET_CHECKPOINT, LogCleaner
    from tidewater.broker.storage.topics import TopicPartition

    config = LogConfig.from_configs({"cleanup.policy": "compact", "segment.bytes": "600",
                                     "min.cleanable.dirty.ratio": "0"})
    log = Log.open(tmp_path / "users-0", config, now_ms=0)
    for i in range(120):
        log.append_as_leader(encode_batch([(b"k%d" % (i % 3), b"v%d" % i),
                                           (b"k%d" % (i % 5), b"w%d" % i)],
                                          base_timestamp_ms=1000), 0, now_ms=1000)
    log.flush()
    tp = TopicPartition("users", 0)
    assert LogCleaner(tmp_path).clean_logs({tp: log}, {tp: log.log_end_offset}, 10_000)
    log.close()
    assert tide(tmp_path / "users-0", "--verify").returncode == 0  # marked and listed
    (tmp_path / CLEANER_OFFSET_CHECKPOINT).unlink()
    assert tide(tmp_path / "users-0", "--verify").returncode == 0  # the marker alone
    (tmp_path / "users-0" / ".compacted").unlink()
    unlisted = tide(tmp_path / "users-0", "--verify")
    assert unlisted.returncode == 1 and "gap" in unlisted.stdout
    assert tide(tmp_path / "users-0", "--verify", "--compacted").returncode == 0
