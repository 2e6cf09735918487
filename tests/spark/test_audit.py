"""The audit through its real interfaces: the data sources, `tide audit`, and spark-submit.

One SparkSession for all of these (conftest.py); each audit run is shared.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.spark.fixtures import DAMAGE, GAP_BATCH, HISTORY, REBORN, SEQ_DUP_BATCH, topic_id_of

# A session start, a shared audit run or a spark-submit takes seconds on an idle
# machine but minutes on a loaded 2-core one: generous per-test limits.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ALL_RULES = {
    "batch_crc_and_framing", "offsets_contiguous", "epochs_monotonic",
    "epoch_checkpoint_matches_log", "offset_checkpoints_within_log", "replicas_agree_below_hw",
    "epoch_histories_agree", "hw_monotonic_per_leader_epoch", "hw_not_above_leo",
    "acked_writes_present", "producer_sequences_contiguous",
    "transactions_end_with_markers", "transaction_markers_agree",
    "read_committed_excludes_aborted",
}
# The fixture dumps hold no transaction: these rules check nothing there (they pass with
# checked 0); test_audit_txn_rules.py gives them logs with transactions.
TRANSACTION_RULES = {"transactions_end_with_markers", "transaction_markers_agree",
                     "read_committed_excludes_aborted"}


def test_log_source_one_row_per_batch_and_one_partition_per_segment(spark, clean_dump):
    df = spark.read.format("tidewater-log").load(str(clean_dump.root))
    segments = list(clean_dump.root.glob("broker-*/*/*.log"))
    assert df.rdd.getNumPartitions() == len(segments)
    rows = df.where("topic = 'orders' AND partition = 0 AND broker_id = 1") \
        .orderBy("base_offset").collect()
    assert [(r.base_offset, r.partition_leader_epoch, r.status, r.crc_valid) for r in rows][:3] \
        == [(0, 0, "ok", True), (3, 0, "ok", True), (5, 0, "ok", True)]
    assert len(rows) == len(HISTORY)


def test_log_source_record_level_and_torn_segment(spark, clean_dump, tmp_path):
    records = (spark.read.format("tidewater-log").option("level", "record")
               .option("payload", "both")
               .load(str(clean_dump.partition_dir(2, "orders", 1))))
    offsets = sorted(r.offset for r in records.collect())
    assert offsets == list(range(23))  # 22 committed + broker 2's uncommitted record
    one = records.where("offset = 5").first()
    assert one.key == b"orders-1-k5" and one.value_hash is not None
    torn_dir = tmp_path / "broker-9" / "t-0"
    torn_dir.mkdir(parents=True)
    data = clean_dump.replica_bytes(1, "orders", 0)
    (torn_dir / f"{0:020d}.log").write_bytes(data[:-10])
    statuses = [r.status for r in spark.read.format("tidewater-log")
                .load(str(torn_dir)).orderBy("position").collect()]
    assert statuses == ["ok"] * (len(HISTORY) - 1) + ["torn"]


def test_log_and_checkpoint_sources_carry_the_topic_id(spark, damaged_dump):
    from tidewater.proto.topic_id import topic_id_to_text

    log = spark.read.format("tidewater-log").option("level", "segment").load(
        str(damaged_dump.root))
    ids = {(r.broker_id, r.topic): r.topic_id for r in log.where(
        "topic IN ('reborn', 'reborn-noid')").select("broker_id", "topic", "topic_id")
        .distinct().collect()}
    new, old = topic_id_to_text(topic_id_of(REBORN)), topic_id_to_text(topic_id_of(REBORN, 0))
    assert ids == {(1, REBORN): new, (2, REBORN): new, (3, REBORN): old,
                   **{(b, "reborn-noid"): "" for b in (1, 2, 3)}}
    cp = spark.read.format("tidewater-checkpoints").load(str(damaged_dump.data_dirs[3]))
    hw = cp.where(f"kind = 'high-watermark' AND topic = '{REBORN}'").first()
    assert hw.topic_id == old


def test_checkpoint_and_metrics_sources(spark, clean_dump):
    cp = spark.read.format("tidewater-checkpoints").load(str(clean_dump.data_dirs[1]))
    epochs = [(r.epoch, r.offset) for r in cp.where(
        "kind = 'leader-epoch' AND topic = 'orders' AND partition = 0").orderBy("entry_index")
        .collect()]
    assert epochs == [(0, 0), (1, 9), (3, 15)]
    hw = cp.where("kind = 'high-watermark' AND topic = 'orders' AND partition = 0").first()
    assert hw.offset == 22
    metrics = spark.read.format("tidewater-metrics").load(str(clean_dump.metrics_dir))
    names = {r.name for r in metrics.select("name").distinct().collect()}
    assert {"up", "tidewater_broker_replica_high_watermark"} <= names
    row = metrics.where("name = 'tidewater_broker_replica_is_leader'").first()
    assert set(row.labels) == {"topic", "partition", "broker"}


def test_undamaged_dump_passes_every_rule(clean_audit):
    code, report, out = clean_audit
    assert code == 0, json.dumps(report, indent=1)[:3000]
    assert report["passed"]
    assert {r["name"] for r in report["rules"]} == ALL_RULES
    for rule in report["rules"]:
        assert rule["passed"] and rule["skipped"] is None, rule
        assert rule["checked"] > 0 or rule["name"] in TRANSACTION_RULES, rule
    positions = next(r for r in report["rules"] if r["name"] == "replicas_agree_below_hw")["info"]
    assert [(x["broker_id"], x["topic"], x["partition"]) for x in
            positions["lagging_replicas"]] == [(3, "orders", 0)]
    assert [(x["broker_id"], x["partition"]) for x in
            positions["uncommitted_suffixes"]] == [(2, 1)]
    for name in ("report.json", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 4 and not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)
    assert "Timeline (from metrics)" in html and "Chaos timeline" not in html
    assert "PASS" in (out / "report.md").read_text()


def _rules_by_topic(report: dict) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for rule in report["rules"]:
        for v in rule["sample"]:
            found[v["topic"]].add(rule["name"])
    return found


def test_each_damage_is_caught_by_exactly_its_rule(damaged_audit):
    code, report, _out = damaged_audit
    assert code == 1
    found = _rules_by_topic(report)
    assert "orders" not in found  # the healthy topic stays clean beside the damage
    # Broker 3's older incarnation of `reborn` differs below the HW, but it has its own
    # topic ID: another partition for the audit, not a divergence.
    assert REBORN not in found
    assert {topic: found.get(topic, set()) for topic in DAMAGE} == \
        {topic: {rule} for topic, rule in DAMAGE.items()}
    failed = {r["name"] for r in report["rules"] if not r["passed"]}
    assert failed == set(DAMAGE.values())
    assert {r["name"] for r in report["rules"] if r["passed"]} == ALL_RULES - failed


def test_violations_name_the_broker_and_offset(damaged_audit):
    _code, report, _out = damaged_audit
    by_rule = {r["name"]: r for r in report["rules"]}

    def where(rule):
        return {(v["broker_id"], v["topic"], v["offset"]) for v in by_rule[rule]["sample"]}

    assert where("batch_crc_and_framing") == {(3, "flipped", 5)}
    assert where("epochs_monotonic") == {(b, "epoch-back", 17) for b in (1, 2, 3)}
    assert where("epoch_checkpoint_matches_log") == {(2, "epoch-cp", 15)}
    assert where("offset_checkpoints_within_log") == {(3, "hw-cp", 27)}
    assert where("hw_monotonic_per_leader_epoch") == {(1, "hw-drop", 15)}
    gap_base = sum(count for _e, count in HISTORY[:GAP_BATCH + 1])
    assert where("offsets_contiguous") == {(b, "gap", gap_base) for b in (1, 2, 3)}
    # broker 2 lacks brokers 1 and 3's batch at 3, and they lack broker 2's; the same for
    # broker 3's older incarnation of reborn-noid, which has no topic ID to tell it apart
    assert where("replicas_agree_below_hw") == {(b, t, 3) for b in (1, 2, 3)
                                                for t in ("diverged", "reborn-noid")}
    assert where("acked_writes_present") == {(None, "ack-lost", 4)}
    # The repeated batch, and the one after it (its sequences now skip the repeat's range).
    dup_base = sum(count for _e, count in HISTORY[:SEQ_DUP_BATCH])
    after = dup_base + HISTORY[SEQ_DUP_BATCH][1]
    assert where("producer_sequences_contiguous") == {(b, "seq-dup", o) for b in (1, 2, 3)
                                                      for o in (dup_base, after)}
    details = {v["detail"] for v in by_rule["producer_sequences_contiguous"]["sample"]}
    assert any("repeats" in d for d in details) and any("skips" in d for d in details)
    acks = by_rule["acked_writes_present"]["info"]
    assert acks["acks_all_lost"] == 1 and acks["acks_1_lost"] == 1  # acks=1 counted, not failed


def test_violation_tables_are_parquet(damaged_audit):
    import pyarrow.parquet as pq

    _code, report, out = damaged_audit
    for rule in report["rules"]:
        if rule["passed"]:
            assert rule["parquet"] is None
            continue
        table = pq.read_table(out / rule["parquet"])
        assert table.num_rows == rule["violations"]
        assert {"broker_id", "topic", "partition", "offset", "detail"} <= set(table.column_names)


def test_unreadable_input_exits_2(spark, clean_dump, tmp_path):
    from tidewater.tools.cli import main

    assert main(["audit", str(tmp_path / "missing"), "--out", str(tmp_path / "o1")]) == 2
    bad = tmp_path / "acks.jsonl"
    bad.write_text("{not json\n")
    assert main(["audit", str(clean_dump.root), "--ack-log", str(bad),
                 "--out", str(tmp_path / "o2")]) == 2
    bad_metrics = tmp_path / "m"
    bad_metrics.mkdir()
    (bad_metrics / "broker-1.prom").write_text("this is not prometheus text\n")
    assert main(["audit", str(clean_dump.root), "--metrics", str(bad_metrics),
                 "--out", str(tmp_path / "o4")]) == 2


def _audit_zip(tmp_path: Path) -> Path:
    from tidewater.audit.pyfiles import build_zip

    return build_zip(tmp_path / "audit.zip")


def test_spark_submit_runs_the_job(damaged_dump, damaged_audit, tmp_path):
    """The README's recipe: the venv's tide-spark-submit, no SPARK_HOME set by hand."""
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                        "PYSPARK_SUBMIT_ARGS")}
    # --py-files ships the package to the driver and executors as a cluster needs it.
    cmd = [str(Path(sys.executable).with_name("tide-spark-submit")), "--master", "local[2]",
           "--conf", "spark.sql.shuffle.partitions=2",
           "--py-files", str(_audit_zip(tmp_path)),
           str(REPO / "audit" / "job.py"), str(damaged_dump.root),
           "--metrics", str(damaged_dump.metrics_dir), "--ack-log", str(damaged_dump.ack_log),
           "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    in_process = damaged_audit[1]
    assert [(r["name"], r["violations"]) for r in report["rules"]] == \
        [(r["name"], r["violations"]) for r in in_process["rules"]]
    # The console: the rule table and the verdict, no Spark INFO lines; those are in the file.
    console = proc.stdout + proc.stderr
    assert re.search(r"^replicas_agree_below_hw +FAIL +violations=\d+", console, re.M), console
    assert "audit: FAIL in " in console
    assert " INFO " not in console, console[:3000]
    assert len(console.splitlines()) < 30, console
    spark_log = tmp_path / "audit-spark.log"
    assert f"Spark's log lines are in {spark_log}" in console
    assert " INFO SparkContext: " in spark_log.read_text()


def test_log_source_segment_level_summarizes_each_segment(spark, damaged_dump):
    segments = spark.read.format("tidewater-log").option("level", "segment") \
        .load(str(damaged_dump.root))
    rows = segments.collect()
    assert len(rows) == len(list(damaged_dump.root.glob("broker-*/*/*.log")))
    batches = spark.read.format("tidewater-log").load(str(damaged_dump.root))
    assert sum(r.row_count for r in rows) == batches.count()
    assert sum(r.batch_count for r in rows) == batches.where("status != 'torn'").count()
    # Within segments only: the gap sits at a segment boundary (checked by the driver).
    found = {(r.broker_id, r.topic, v.rule, v.offset) for r in rows for v in r.violations}
    assert found == {(3, "flipped", "batch_crc_and_framing", 5)} | \
        {(b, "epoch-back", "epochs_monotonic", 17) for b in (1, 2, 3)}
    orders = sorted((r for r in rows if (r.broker_id, r.topic, r.partition) == (1, "orders", 0)),
                    key=lambda r: r.segment_base_offset)
    changes = [(c.partition_leader_epoch, c.base_offset) for r in orders for c in r.epoch_changes]
    assert [c for i, c in enumerate(changes) if i == 0 or c[0] != changes[i - 1][0]] == \
        [(0, 0), (1, 9), (3, 15)]
    assert (orders[0].log_start_offset, orders[-1].log_end_offset) == (0, 22)


def test_a_batch_held_twice_is_reported_once_per_copy(spark, damaged_dump, tmp_path):
    """replicas_agree_below_hw pairs every copy of a batch with every peer that lacks it."""
    import shutil

    from tidewater.audit import rules
    from tidewater.audit.job import load_inputs

    root = tmp_path / "dump"
    shutil.copytree(damaged_dump.root, root, ignore=shutil.ignore_patterns("metrics"))
    (segment,) = sorted((root / "broker-1" / "diverged-0").glob("*.log"))
    data = segment.read_bytes()
    second = struct.unpack_from(">i", data, 8)[0] + 12  # the batch at offsets 3..4
    size = struct.unpack_from(">i", data, second + 8)[0] + 12
    segment.write_bytes(data + data[second:second + size])  # an identical copy at the end
    inputs, _inventory = load_inputs(spark, [str(root)], [], [])
    found = rules.run_rules(inputs, (rules.replicas_agree_below_hw,))
    rows = found.violations.where("topic = 'diverged'").collect()
    pairs = sorted(re.fullmatch(r"broker (\d) holds batch 3\.\.4 \(epoch 0, crc \d+\) below HW 22; "
                                r"broker (\d) does not", r.detail).groups() + (r.broker_id,)
                   for r in rows)
    # Brokers 1 and 3 hold the original batch, broker 2 a different one; broker 1 twice.
    assert pairs == [("1", "2", 2), ("1", "2", 2), ("2", "1", 1), ("2", "3", 3), ("3", "2", 2)]


def test_log_source_groups_segments_into_max_partitions(spark, clean_dump):
    def read(**options):
        return spark.read.format("tidewater-log").options(**options).load(str(clean_dump.root))

    grouped = read(max_partitions="3")
    assert grouped.rdd.getNumPartitions() == 3
    assert sorted(grouped.collect()) == sorted(read().collect())
    summaries = read(level="segment", max_partitions="2")
    assert summaries.rdd.getNumPartitions() == 2
    assert summaries.count() == len(list(clean_dump.root.glob("broker-*/*/*.log")))
    with pytest.raises(Exception, match="max_partitions must be at least 1"):
        read(max_partitions="0").collect()
