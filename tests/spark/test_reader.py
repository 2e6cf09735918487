"""The audit's own reader, without Spark: segments, records, checkpoints, metrics, ack logs."""

from __future__ import annotations

import json
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.spark.fixtures import DAMAGE, HISTORY, REBORN, build_dump, topic_id_of
from tidewater.audit import health, metrics_reader, reader
from tidewater.audit.epochs import assign_epoch, compare_epoch_checkpoint, diverging_epochs
from tidewater.audit.job import AckLogError, parse_ack_log
from tidewater.proto.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    decode_batch,
    encode_batch,
)


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    return build_dump(tmp_path_factory.mktemp("reader"), damaged=True)


def test_discover_finds_every_replica_with_its_broker_id(dump):
    inventory = reader.discover([dump.root])
    assert sorted(set(inventory.data_dirs.values())) == [1, 2, 3]
    topics = {(s.topic, s.partition, s.broker_id) for s in inventory.segments}
    assert ("orders", 1, 2) in topics and ("gap", 0, 3) in topics
    assert len(topics) == (3 + len(DAMAGE)) * 3  # orders-0, orders-1, reborn, the damage


def test_discover_reads_topic_ids_and_skips_logs_moved_aside(dump, tmp_path):
    import shutil

    from tidewater.proto.topic_id import topic_id_to_text

    inventory = reader.discover([dump.root])
    ids = {(d.broker_id, d.topic): d.topic_id for d in inventory.partition_dirs}
    assert ids[(1, "orders")] == topic_id_to_text(topic_id_of("orders"))
    assert ids[(3, REBORN)] == topic_id_to_text(topic_id_of(REBORN, 0))
    assert ids[(1, "reborn-noid")] == ""
    assert {s.topic_id for s in inventory.segments if s.topic == "orders"} == {
        topic_id_to_text(topic_id_of("orders"))}
    # A log moved aside for deletion is no replica, whatever it holds.
    data_dir = tmp_path / "broker-1"
    shutil.copytree(dump.partition_dir(1, "orders", 0), data_dir / "orders-0")
    shutil.copytree(dump.partition_dir(1, "orders", 0),
                    data_dir / f"orders-0.{'ab' * 16}-delete")
    assert {d.path for d in reader.discover([data_dir]).partition_dirs} == {
        str((data_dir / "orders-0").resolve())}


@pytest.mark.parametrize("text", ["version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n",
                                  "version: 0\ntopic_id: short\n", "garbage", ""])
def test_a_malformed_partition_metadata_is_an_input_error(tmp_path, text):
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / f"{0:020d}.log").write_bytes(encode_batch([(b"k", b"v")]))
    (tmp_path / "t-0" / "partition.metadata").write_text(text)
    with pytest.raises(reader.AuditInputError, match="partition.metadata"):
        reader.discover([tmp_path])


def test_broker_id_from_meta_properties_wins_over_folder_name(tmp_path):
    data_dir = tmp_path / "broker-7"
    (data_dir / "t-0").mkdir(parents=True)
    (data_dir / "t-0" / f"{0:020d}.log").write_bytes(encode_batch([(b"k", b"v")]))
    assert reader.discover([data_dir]).segments[0].broker_id == 7
    (data_dir / "meta.properties").write_text("version=0\nbroker.id=42\n")
    assert reader.discover([data_dir]).segments[0].broker_id == 42


def test_discover_rejects_missing_and_empty_inputs(tmp_path):
    with pytest.raises(reader.AuditInputError, match="no such"):
        reader.discover([tmp_path / "nope"])
    with pytest.raises(reader.AuditInputError, match="no Tidewater partition"):
        reader.discover([tmp_path])


def test_scan_matches_the_log_the_broker_wrote(dump):
    rows = list(reader.scan_batches(dump.replica_bytes(1, "orders", 0)))
    fields = reader.BATCH_FIELDS
    got = [(r[fields.index("base_offset")], r[fields.index("last_offset")],
            r[fields.index("partition_leader_epoch")], r[fields.index("status")]) for r in rows]
    expected, offset = [], 0
    for epoch, count in HISTORY:
        expected.append((offset, offset + count - 1, epoch, "ok"))
        offset += count
    assert got == expected


def test_flipped_byte_is_a_crc_mismatch_and_the_scan_goes_on(dump):
    rows = list(reader.scan_batches(dump.replica_bytes(3, "flipped")))
    statuses = [r[reader.BATCH_FIELDS.index("status")] for r in rows]
    assert statuses == ["ok", "ok", "crc_mismatch"] + ["ok"] * (len(HISTORY) - 3)


def test_torn_tail_is_a_row_not_a_crash(dump):
    data = dump.replica_bytes(1, "orders", 0)
    for cut in (len(data) - 1, len(data) - 30, len(data) - 70):
        rows = list(reader.scan_batches(data[:cut]))
        assert rows[-1][reader.BATCH_FIELDS.index("status")] == "torn"
        assert all(r[reader.BATCH_FIELDS.index("status")] == "ok" for r in rows[:-1])


def test_broken_framing_is_a_corrupt_row_and_stops_the_segment():
    batch = bytearray(encode_batch([(b"k", b"v")], base_offset=0))
    second = bytearray(encode_batch([(b"k", b"v")], base_offset=1))
    second[16] = 9  # magic
    rows = list(reader.scan_batches(bytes(batch + second + batch)))
    assert [r[reader.BATCH_FIELDS.index("status")] for r in rows] == ["ok", "corrupt"]
    assert "magic" in rows[1][reader.BATCH_FIELDS.index("error")]


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4,
                                   COMPRESSION_ZSTD])
def test_records_decode_like_the_project_codec(codec):
    records = [(b"key-%d" % i, b"value-" * i) for i in range(20)] + [(None, b"v"), (b"k", None)]
    data = encode_batch(records, base_offset=100, partition_leader_epoch=4, compression=codec,
                        base_timestamp_ms=1_000)
    mine = reader.decode_batch_records(data, 0, len(data))
    _header, theirs = decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in mine] == \
        [(r.offset, r.timestamp, r.key, r.value) for r in theirs]


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_scan_never_raises_on_garbage(garbage):
    good = encode_batch([(b"k", b"v")], base_offset=0)
    rows = list(reader.scan_batches(good + garbage))
    assert rows[0][reader.BATCH_FIELDS.index("status")] == "ok"
    for r in rows[1:]:
        position, size = r[0], r[reader.BATCH_FIELDS.index("size_bytes")]
        assert 0 <= position and position + size <= len(good) + len(garbage)


def test_checkpoint_parsers_accept_the_format_and_reject_damage():
    assert reader.parse_offset_checkpoint("0\n2\na 0 5\nb-c 3 7\n") == [("a", 0, 5), ("b-c", 3, 7)]
    assert reader.parse_epoch_checkpoint("0\n2\n0 0\n3 15\n") == [(0, 0), (3, 15)]
    assert reader.parse_epoch_checkpoint("") == []
    for bad in ("1\n0\n", "0\n2\n0 0\n", "0\n1\nx 1\n", "0\nz\n"):
        with pytest.raises(reader.CheckpointFormatError):
            reader.parse_epoch_checkpoint(bad)


def test_epoch_replay_follows_the_reference_examples():
    cache = [(5, 11), (6, 12), (7, 13)]
    assign_epoch(cache, 7, 12)
    assert cache == [(5, 11), (7, 12)]
    cache = [(1, 5), (2, 6)]
    assign_epoch(cache, 1, 7)
    assert cache == [(1, 7)]
    cache = [(2, 6)]
    assign_epoch(cache, 3, 5)
    assert cache == [(3, 5)]


def test_epoch_checkpoint_comparison():
    log = [(0, 0), (1, 9), (3, 15)]
    assert compare_epoch_checkpoint(log, log, 22) == []
    assert compare_epoch_checkpoint(log, log + [(4, 22)], 22) == []  # new leader, no write yet
    assert compare_epoch_checkpoint(log, [(0, 0), (1, 9), (3, 16)], 22)
    assert compare_epoch_checkpoint(log, [(0, 0), (3, 15)], 22)
    assert compare_epoch_checkpoint(log, log + [(4, 20)], 22)


def test_epoch_histories_allow_a_later_log_start():
    a = {"cache": [(0, 0), (2, 10)], "log_start_offset": 0}
    b = {"cache": [(0, 4), (2, 10)], "log_start_offset": 4}
    assert diverging_epochs(a, b) == []
    c = {"cache": [(0, 0), (2, 11)], "log_start_offset": 0}
    assert diverging_epochs(a, c) == [(2, 10, 11)]


def test_scrape_files_parse_with_error_and_torn_blocks(dump):
    samples = list(metrics_reader.read_metric_file(str(dump.metrics_dir / "broker-3.prom")))
    up = [(s.timestamp_ms, s.value) for s in samples if s.name == "up"]
    assert len(up) == 10 and sum(v for _t, v in up) == 9  # one error block, torn block skipped
    hw = [s for s in samples if s.name == "tidewater_broker_replica_high_watermark"]
    assert hw and all(s.labels["broker"] == "3" and s.source == "broker-3" for s in hw)


def test_plain_prometheus_text_and_bad_lines(tmp_path):
    f = tmp_path / "x.prom"
    f.write_text('# HELP a b\nfoo{topic="t",partition="0"} 3 1700\nbar 1.5\n')
    samples = list(metrics_reader.read_metric_file(str(f)))
    assert (samples[0].name, samples[0].labels, samples[0].value, samples[0].timestamp_ms) == \
        ("foo", {"topic": "t", "partition": "0"}, 3.0, 1700)
    f.write_text("foo{bad 3\n")
    with pytest.raises(metrics_reader.MetricsFormatError):
        list(metrics_reader.read_metric_file(str(f)))


def test_ack_log_parses_both_acks_spellings_and_skips_a_torn_tail(tmp_path):
    f = tmp_path / "acks.jsonl"
    lines = [{"topic": "t", "partition": 0, "offset": 1, "key": None, "value": "v", "acks": -1},
             {"topic": "t", "partition": 0, "offset": 2, "key": "k", "value": "\udcff",
              "acks": "1"}]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"topic": "t", "part')
    rows = parse_ack_log(str(f))
    assert rows == [("t", 0, 1, None, b"v", "all"), ("t", 0, 2, b"k", b"\xff", "1")]
    f.write_text("not json\n")
    with pytest.raises(AckLogError):
        parse_ack_log(str(f))


def test_partition_health_counts_offline_and_under_replicated_time():
    def s(t, b, leader, isr):
        return health.ReplicaSample(t, b, "t", 0, 10, 10, 1, isr, leader)
    samples = [s(0, 1, 1, 2), s(0, 2, 0, 0), s(1000, 1, 1, 1), s(1000, 2, 0, 0),
               s(2000, 1, 0, 0), s(2000, 2, 0, 0), s(3000, 1, 1, 2), s(3000, 2, 0, 0)]
    (h,) = health.partition_health(samples)
    assert h["offline_ms"] == 1000 and h["under_replicated_ms"] == 1000
    assert h["isr_shrinks"] == 1 and h["isr_expands"] == 0


def test_batch_header_layout_matches_the_spec():
    data = encode_batch([(b"k", b"v")], base_offset=5, partition_leader_epoch=3)
    base, length, epoch, magic = struct.unpack_from(">qiib", data)
    assert (base, length + 12, epoch, magic) == (5, len(data), 3, 2)


def test_rows_carry_the_previous_batch_and_replicas_span_segments(dump):
    segments = dump.segments(1, "orders", 0)
    assert len(segments) >= 3  # cross-segment checks get exercised by the Spark tests
    f = reader.BATCH_FIELDS
    rows = list(reader.scan_batches(segments[1].read_bytes()))
    assert rows[0][f.index("prev_last_offset")] is None
    for prev, row in zip(rows, rows[1:], strict=False):
        assert row[f.index("prev_last_offset")] == prev[f.index("last_offset")]
        assert row[f.index("prev_epoch")] == prev[f.index("partition_leader_epoch")]


def _summary_from_rows(rows: list[tuple], segment_base_offset: int) -> dict:
    """The batch-level rules as their definitions say, row by row (the reference)."""
    f = {name: i for i, name in enumerate(reader.BATCH_FIELDS)}
    whole = [r for r in rows if r[f["status"]] in reader.FRAMED_STATUSES]
    violations = [(reader.RULE_BATCH_CRC, r[f["base_offset"]],
                   f"{r[f['status']]} in segment {segment_base_offset:020d}.log at byte "
                   f"{r[f['position']]}: {r[f['error']] or ''}")
                  for r in rows if r[f["status"]] != "ok"]
    for prev, r in zip(whole, whole[1:], strict=False):
        if r[f["base_offset"]] != prev[f["last_offset"]] + 1:
            violations.append((reader.RULE_OFFSETS, r[f["base_offset"]], reader.offset_order_problem(
                r[f["base_offset"]], prev[f["last_offset"]])))
        if r[f["partition_leader_epoch"]] < prev[f["partition_leader_epoch"]]:
            violations.append((reader.RULE_EPOCHS, r[f["base_offset"]],
                               f"batch epoch {r[f['partition_leader_epoch']]} after epoch "
                               f"{prev[f['partition_leader_epoch']]}"))
    epochs = [r[f["partition_leader_epoch"]] for r in whole]
    return {
        "batch_count": len(whole), "row_count": len(rows),
        "first_base_offset": whole[0][f["base_offset"]] if whole else None,
        "first_epoch": epochs[0] if whole else None,
        "last_offset": whole[-1][f["last_offset"]] if whole else None,
        "last_epoch": epochs[-1] if whole else None,
        "log_start_offset": min((r[f["base_offset"]] for r in whole), default=None),
        "log_end_offset": max((r[f["last_offset"]] + 1 for r in whole), default=None),
        "bad_batches": sum(r[f["status"]] != "ok" for r in rows),
        "offset_order_breaks": sum(v[0] == reader.RULE_OFFSETS for v in violations),
        "epoch_drops": sum(v[0] == reader.RULE_EPOCHS for v in violations),
        "violations": sorted(violations, key=repr),
        "epoch_changes": [(r[f["position"]], r[f["partition_leader_epoch"]], r[f["base_offset"]])
                          for i, r in enumerate(whole)
                          if i == 0 or epochs[i] != epochs[i - 1]],
        "last_base_offset": whole[-1][f["base_offset"]] if whole else None,
        "base_order_breaks": sum(r[f["base_offset"]] <= prev[f["base_offset"]]
                                 for prev, r in zip(whole, whole[1:], strict=False)),
        "idempotent_batches": sum(r[f["producer_id"]] >= 0 and r[f["base_sequence"]] >= 0
                                  for r in whole),
    }


# (offset step from the previous batch's end, epoch step, record count): mostly in
# order, with gaps, overlaps, epoch bumps and drops mixed in.
_batch_spec = st.tuples(st.sampled_from([0, 0, 0, 0, 1, 3, -1, -4]),
                        st.sampled_from([0, 0, 0, 1, 2, -1]), st.integers(1, 3))


def _damaged_segment(specs, segment_base: int, damage: str, at: int, value) -> bytearray:
    """Batches per ``specs`` (offset step, epoch step, records), then one kind of damage."""
    batches, offset, epoch = [], segment_base * 10, 0
    for offset_step, epoch_step, count in specs:
        offset, epoch = max(0, offset + offset_step), epoch + epoch_step
        idempotent = count != 2  # some batches of an idempotent producer, some not
        batches.append(encode_batch([(b"k%d" % i, value(i)) for i in range(count)],
                                    base_offset=offset, partition_leader_epoch=epoch,
                                    producer_id=7 if idempotent else -1,
                                    producer_epoch=0 if idempotent else -1,
                                    base_sequence=offset if idempotent else -1))
        offset += count
    data = bytearray(b"".join(batches))
    if data and damage == "flip":
        data[max(at % len(data), reader.CRC_START)] ^= 0x40
    elif damage == "cut":
        data = data[: at % (len(data) + 1)]
    elif data and damage == "magic":
        data[16] = 7
    elif damage == "garbage":
        data += bytes(range(at % 90))
    elif data and damage == "huge-length":  # a length field claiming past the end of the file
        struct.pack_into(">i", data, 8, 1 << 30)
    return data


@settings(max_examples=200, deadline=None)
@given(st.lists(_batch_spec, min_size=0, max_size=10), st.integers(0, 7),
       st.sampled_from(["none", "flip", "cut", "magic", "garbage"]), st.integers(0, 10_000))
def test_segment_summary_equals_the_rules_applied_row_by_row(specs, segment_base, damage, at):
    """Offsets and epochs in any order, any damage: the summary says what the rows say."""
    data = _damaged_segment(specs, segment_base, damage, at, lambda i: b"v")
    rows = list(reader.scan_batches(bytes(data)))
    from_rows = reader.summarize_segment([rows[:3], rows[3:]], segment_base)
    from_buffer = reader.summarize_buffer(bytes(data), segment_base)  # the fast path
    if not rows:
        assert from_rows is None and from_buffer is None
        return
    for summary in (from_rows, from_buffer):
        got = dict(zip(reader.SEGMENT_FIELDS, summary, strict=True))
        got["violations"] = sorted(got["violations"], key=repr)
        assert got == _summary_from_rows(rows, segment_base)


def test_segment_summary_of_the_damaged_replicas(dump):
    def summary(broker, topic):
        (path,) = dump.segments(broker, topic)
        found = reader.summarize_segment_file(reader.SegmentFile(
            broker, str(dump.data_dirs[broker]), topic, 0, str(path), 0, path.stat().st_size))
        return dict(zip(reader.SEGMENT_FIELDS, found, strict=True))

    flipped = summary(3, "flipped")
    assert (flipped["bad_batches"], flipped["batch_count"]) == (1, len(HISTORY))
    assert [v[:2] for v in flipped["violations"]] == [(reader.RULE_BATCH_CRC, 5)]
    assert flipped["violations"][0][2].startswith(
        "crc_mismatch in segment 00000000000000000000.log at byte ")
    back = summary(1, "epoch-back")
    assert back["violations"] == [(reader.RULE_EPOCHS, 17, "batch epoch 1 after epoch 3")]
    assert [(epoch, base) for _pos, epoch, base in back["epoch_changes"]] == \
        [(0, 0), (1, 9), (3, 15), (1, 17), (3, 19)]
    assert (back["log_start_offset"], back["log_end_offset"]) == (0, 22)


@settings(max_examples=150, deadline=None)
@given(st.lists(_batch_spec, min_size=0, max_size=8), st.integers(0, 3),
       st.sampled_from(["none", "flip", "cut", "magic", "garbage", "huge-length"]),
       st.integers(0, 10_000), st.integers(reader.HEADER_SIZE, 700))
def test_windowed_reads_equal_whole_file_reads(tmp_path_factory, specs, segment_base, damage,
                                               at, window_bytes):
    """Segments read in small windows give the rows and summary of the whole file at once."""
    data = _damaged_segment(specs, segment_base, damage, at, lambda i: b"v" * (i * 40))
    path = tmp_path_factory.mktemp("windows") / f"{segment_base:020d}.log"
    path.write_bytes(bytes(data))
    whole = list(reader.scan_batches(bytes(data)))
    windowed = [row for rows in reader.scan_segment_file(str(path), chunk_rows=3,
                                                         window_bytes=window_bytes)
                for row in rows]
    assert windowed == whole
    segment = reader.SegmentFile(1, str(path.parent), "t", 0, str(path), segment_base,
                                 len(data))
    assert (reader.summarize_segment_file(segment, window_bytes)
            == reader.summarize_buffer(bytes(data), segment_base))
    # Never more than one window (or one batch) in memory.
    sizes = [len(w.buf) for w in reader.segment_windows(str(path), window_bytes)]
    largest_batch = max((row[12] for row in whole), default=0)
    assert all(size <= max(window_bytes, largest_batch) for size in sizes)


# ---------------------------------------------------------------- replica comparison

# One replica's difference from the common history: none, a batch missing, a batch
# with another epoch (another batch at the same offsets), a byte flipped (CRC
# mismatch, still a whole batch), the file cut short (torn tail), extra batches, or
# a batch's lastOffsetDelta made negative with its CRC left stale (a whole batch with
# a CRC mismatch) or fixed (a corrupt batch, not a whole one).
_replica_change = st.sampled_from(["none", "none", "missing", "epoch", "flip", "cut", "extra",
                                   "negative", "negative-crc"])


def _replica_log(history, change: str, at: int) -> bytearray:
    """The common history (offset gap, epoch, records) with one change, as one log."""
    batches, offset = [], 0
    target = at % max(1, len(history))
    for i, (gap, epoch, count) in enumerate(history):
        offset += gap
        if not (change == "missing" and i == target):
            batches.append(encode_batch(
                [(b"k%d" % j, b"v%d" % (offset + j)) for j in range(count)], base_offset=offset,
                partition_leader_epoch=epoch + (change == "epoch" and i == target)))
        offset += count
    if change == "extra":
        batches.append(encode_batch([(b"x", b"y")], base_offset=offset + 1))
    data = bytearray(b"".join(batches))
    if data and change == "flip":
        data[max(at % len(data), reader.CRC_START)] ^= 0x01
    elif change == "cut":
        data = data[: at % (len(data) + 1)]
    elif batches and change in ("negative", "negative-crc"):
        start = sum(len(b) for b in batches[:target % len(batches)])
        struct.pack_into(">i", data, start + 23, -1)  # lastOffsetDelta
        if change == "negative-crc":
            size = struct.unpack_from(">i", data, start + 8)[0] + 12
            struct.pack_into(">I", data, start + 17,
                             crc32c(bytes(data[start + reader.CRC_START:start + size])))
    return data


def _write_segments(folder, data: bytes, cuts: int) -> list[str]:
    """``data`` split at batch boundaries into up to ``cuts + 1`` segment files."""
    folder.mkdir(parents=True)
    rows = list(reader.scan_batches(bytes(data)))
    starts = [r[0] for r in rows if r[1] is not None][1:][::max(1, len(rows) // (cuts + 1))]
    bounds = [0, *sorted(set(starts))[:cuts], len(data)]
    paths = []
    for begin, end in zip(bounds, bounds[1:], strict=False):
        base = next((r[1] for r in rows if r[0] == begin and r[1] is not None), begin)
        path = folder / f"{base:020d}.log"
        path.write_bytes(bytes(data[begin:end]))
        paths.append(str(path))
    return paths


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 0, 0, 2]), st.integers(0, 2), st.integers(1, 3)),
                min_size=0, max_size=8),
       st.lists(st.tuples(st.sampled_from([1, 2, 3]), _replica_change, st.integers(0, 10_000),
                          st.integers(0, 3)), min_size=1, max_size=4))
def test_replica_merge_equals_grouping_every_copy(tmp_path_factory, history, replicas):
    """replica_disagreements gives what grouping every whole batch copy by (offsets, epoch,
    CRC) gives, for the batches not every broker holds (a broker may have two logs)."""
    root = tmp_path_factory.mktemp("merge")
    history = sorted(history, key=lambda h: h[1])  # epochs never go back
    logs = []
    for n, (broker, change, at, cuts) in enumerate(replicas):
        logs.append((broker, _write_segments(root / f"log-{n}", _replica_log(history, change, at),
                                             cuts)))
    copies: dict[tuple, list[int]] = {}
    for broker, paths in logs:
        for path in paths:
            for rows in reader.scan_segment_file(path):
                for r in rows:
                    if r[13] in reader.FRAMED_STATUSES:
                        copies.setdefault((r[1], r[2], r[4], r[7]), []).append(broker)
    brokers = {broker for broker, _paths in logs}
    expected = sorted((*key, sorted(held)) for key, held in copies.items()
                      if set(held) != brokers)
    if not all(_in_offset_order(paths) for _broker, paths in logs):
        # A flipped byte in a baseOffset (outside the CRC) can put a log out of order:
        # the segment summaries say so, and the merge refuses it.
        with pytest.raises(reader.ReplicaOrderError):
            list(reader.replica_disagreements(logs))
        return
    got = sorted((*row[:4], sorted(row[4])) for row in reader.replica_disagreements(logs))
    assert got == expected


def _in_offset_order(paths: list[str]) -> bool:
    """What rules.Derived.ordered_incarnations decides for one log, from its summaries."""
    last_base = None
    for path in paths:
        summary = reader.summarize_segment_file(reader.SegmentFile(
            1, "", "t", 0, path, reader.segment_base_offset(path), 0))
        got = dict(zip(reader.SEGMENT_FIELDS, summary or (), strict=False))
        if not got.get("batch_count"):
            continue
        if got["base_order_breaks"] or (last_base is not None
                                        and got["first_base_offset"] <= last_base):
            return False
        last_base = got["last_base_offset"]
    return True


def test_replica_merge_refuses_logs_out_of_offset_order(tmp_path):
    batch = encode_batch([(b"k", b"v")], base_offset=3)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(batch + encode_batch([(b"k", b"v")], base_offset=4) + batch)
    with pytest.raises(reader.ReplicaOrderError, match="base offset 3 follows one at 4"):
        list(reader.replica_disagreements([(1, [str(path)]), (2, [str(path)])]))
