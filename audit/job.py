"""The audit job: read brokers' data, metrics and ack logs, run every rule, write the report.

Under spark-submit (any master; the package on ``--py-files`` as a zip; the venv's
``tide-spark-submit`` sets SPARK_HOME, PYSPARK_PYTHON and the log4j2 config)::

    tide-spark-submit --master spark://127.0.0.1:7177 --py-files audit.zip audit/job.py \\
        DATA_DIR... [--metrics DIR] [--ack-log FILE...] [--faults FILE] --out DIR

or ``python -m audit.job ...`` / ``tide audit ... [--master URL]``, which start the
driver themselves (Spark's log lines in ``--out``/spark.log).
Exit code: 0 every rule passes, 1 some rule fails, 2 the input cannot be read.

Ack log format (``tide produce --ack-log``): JSON lines
``{"topic", "partition", "offset", "key", "value", "acks"}`` with key and
value as text (undecodable bytes as surrogate escapes, null for null) and
acks ``"all"``/``"1"``/``"0"`` or -1/1/0. A torn last line (no newline) is
skipped: the producer may have been killed while writing it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXIT_PASS, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
ACKS_NAMES = {"all": "all", "-1": "all", "1": "1", "0": "0"}


class AckLogError(Exception):
    """An ack log line that is not the documented JSON object."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="audit", description="Audit Tidewater broker data.")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="+", metavar="DATA_DIR",
                   help="broker data dirs, a folder of them, partition dirs or segment files")
    p.add_argument("--metrics", action="extend", nargs="+", default=[], metavar="DIR",
                   help="metrics snapshots (tide metrics scrape output or Prometheus text)")
    p.add_argument("--ack-log", action="extend", nargs="+", default=[], metavar="FILE",
                   help="ack logs of tide produce --ack-log / tide chaos")
    p.add_argument("--faults", metavar="FILE", default=None,
                   help="a chaos run's faults.jsonl: its faults shown on the report's timeline")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the report")
    p.add_argument("--master", default="local[*]",
                   help="Spark master when no session exists yet: local[N] (default local[*]) "
                        "or a standalone cluster's spark://HOST:PORT (make spark-up)")


def parse_ack_log(path: str) -> list[tuple]:
    """(topic, partition, offset, key, value, acks) rows; raises AckLogError."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise AckLogError(f"cannot read ack log {path}: {e.strerror}") from e
    lines = text.split("\n")
    torn_tail = lines.pop() if lines else ""  # text after the last newline
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        rows.append(_ack_row(line, f"{path}:{number}"))
    if torn_tail.strip():
        try:
            rows.append(_ack_row(torn_tail, f"{path}:{len(lines) + 1}"))
        except AckLogError:
            pass  # a torn last line: the writer died mid-line
    return rows


def _ack_bytes(value, where: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise AckLogError(f"{where}: key and value must be text or null")
    return value.encode("utf-8", errors="surrogateescape")


def _ack_row(line: str, where: str) -> tuple:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise AckLogError(f"{where}: not JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise AckLogError(f"{where}: not a JSON object")
    try:
        topic, partition, offset = obj["topic"], int(obj["partition"]), int(obj["offset"])
        acks = ACKS_NAMES[str(obj.get("acks", "all")).lower()]
    except (KeyError, TypeError, ValueError) as e:
        raise AckLogError(f"{where}: missing or bad field: {e}") from None
    return (str(topic), partition, offset, _ack_bytes(obj.get("key"), where),
            _ack_bytes(obj.get("value"), where), acks)


# The batch columns rules read row by row (producer_sequences_contiguous, the
# transaction rules: attributes, and where a control batch is to read its type;
# replicas_agree_below_hw for logs whose offsets are out of order; the batch-level
# rules work from the reader's per-segment summaries).
BATCH_RULE_COLUMNS = (
    "broker_id", "topic", "partition", "topic_id", "base_offset", "last_offset",
    "partition_leader_epoch", "crc_stored", "status", "producer_id", "producer_epoch",
    "base_sequence", "attributes", "segment", "position", "size_bytes",
)
ACK_DDL = ("ack_id long, topic string, partition int, offset long, key binary, value binary, "
           "acks string")


def load_inputs(spark, data: list[str], metrics: list[str], ack_logs: list[str], *,
                cache_batches: bool = False):
    """AuditInputs over the given paths; raises AuditInputError / AckLogError when unreadable.

    ``cache_batches``: keep the batch rows in Spark's memory. Off by default: the
    rules that read them (producer_sequences_contiguous, replicas_agree_below_hw for
    logs out of offset order) read them once, and building the cache costs more than
    that read (bench/audit_bench.py). They are loaded only when a rule needs them.
    The per-segment summaries are always cached: one small row per segment, read
    by Derived and again for the batch-level rules' violations.
    """
    from tidewater.audit import metrics_reader, reader
    from tidewater.audit.rules import AuditInputs

    # Fail fast, on the driver, before any Spark work: missing paths, bad ack logs.
    inventory = reader.discover(data)
    if metrics:
        metrics_reader.discover_metric_files(metrics)
    ack_rows = [(i, *row) for i, row in
                enumerate(row for path in ack_logs for row in parse_ack_log(path))]
    paths = json.dumps(data)
    # One task per core, segments grouped by bytes: a Python data source task costs
    # ~45 ms of its own on this machine, so one task per segment file cost more than
    # the reading itself on small segments.
    def log(**options):  # a new reader each time: option() changes the reader it is called on
        return (spark.read.format("tidewater-log").options(**options).option("paths", paths)
                .option("max_partitions", str(spark.sparkContext.defaultParallelism)).load())

    # Only the columns the rules use are built: long repeated strings (paths) and
    # unused numbers would cost time for every batch.
    def batches():
        rows = log(columns=",".join(BATCH_RULE_COLUMNS))
        return rows.cache() if cache_batches else rows

    segments = log(level="segment").cache()
    checkpoints = spark.read.format("tidewater-checkpoints").option("paths", paths).load()
    metrics_df = None
    if metrics:
        metrics_df = (spark.read.format("tidewater-metrics").option("paths", json.dumps(metrics))
                      .load().cache())
    acks_df = records = None
    compacted = reader.compacted_partitions(inventory.data_dirs)
    if ack_logs:
        acks_df = spark.createDataFrame(ack_rows, ACK_DDL)
    if ack_logs or compacted:
        # Records of the acknowledged partitions, and of compacted ones (compared per record).
        wanted = sorted({(r[1], r[2]) for r in ack_rows} | compacted)
        records = (spark.read.format("tidewater-log").option("level", "record")
                   .option("topic_partitions", json.dumps(wanted))
                   .option("paths", paths).load())
    def disagreements(incarnations):  # replicas_agree_below_hw: merged in the reader
        return log(level="disagreement", incarnations=json.dumps([list(i) for i in incarnations]))

    inputs = AuditInputs(spark, batches, segments, checkpoints, records, metrics_df, acks_df,
                         compacted, disagreements)
    return inputs, inventory


_INPUT_ERRORS = ("AuditInputError", "MetricsFormatError", "AckLogError", "CheckpointFormatError")


def _input_error_message(e: BaseException) -> str | None:
    """The input error's own line when ``e`` (maybe a wrapped worker error) is one, else None."""
    text = f"{type(e).__name__}: {e}"
    for line in reversed(text.splitlines()):
        for name in _INPUT_ERRORS:
            if name + ":" in line:
                return line[line.index(name + ":") + len(name) + 1:].strip()
    return None


def run_audit(spark, data: list[str], out: str, metrics: list[str] | None = None,
              ack_logs: list[str] | None = None, log=print, faults_log: str | None = None
              ) -> int:
    """Run every rule and write the report; returns the exit code.

    ``faults_log``: a chaos run's faults.jsonl (the report then shows its faults).
    """
    from tidewater.audit import health, report, report_html, rules
    from tidewater.audit.reader import AuditInputError

    metrics = metrics or []
    ack_logs = ack_logs or []
    started = time.monotonic()
    try:
        fault_entries = report_html.read_fault_log(faults_log) if faults_log else None
        inputs, inventory = load_inputs(spark, data, metrics, ack_logs)
        log(f"audit: {len(inventory.segments)} segments of {len(inventory.data_dirs)} data "
            f"dirs; running the rules")
        audit_results = rules.run_rules(inputs)
        rules_s = time.monotonic() - started
    except (AuditInputError, AckLogError, report_html.FaultLogError) as e:
        log(f"audit: input cannot be read: {e}")
        return EXIT_INPUT
    except Exception as e:  # errors raised in Spark's Python workers arrive wrapped
        message = _input_error_message(e)
        if message is not None:
            log(f"audit: input cannot be read: {message}")
            return EXIT_INPUT
        raise
    results = audit_results.rules
    samples = [health.ReplicaSample(r.timestamp_ms, r.broker_id, r.topic, r.partition,
                                    r.log_end_offset, r.high_watermark, r.leader_epoch,
                                    r.isr_size, r.is_leader)
               for r in audit_results.derived.sample_rows]
    up: dict[str, list[tuple[int, float]]] = {}
    if inputs.metrics is not None:
        for r in inputs.metrics.where("name = 'up'").select("timestamp_ms", "source",
                                                             "value").collect():
            up.setdefault(r.source, []).append((r.timestamp_ms, r.value))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs_summary = {"data": data, "metrics": metrics, "ack_logs": ack_logs,
                      "brokers": sorted(set(inventory.data_dirs.values())),
                      "segments": len(inventory.segments),
                      "segment_bytes": sum(s.size_bytes for s in inventory.segments)}
    doc = report.build_report(results, report.violation_samples(audit_results.violations),
                              inputs_summary, health.partition_health(samples))
    report.write_violation_tables(out_dir, audit_results.violations)
    doc["elapsed_s"] = round(time.monotonic() - started, 3)
    doc["rules_s"] = round(rules_s, 3)
    report.write_json(out_dir, doc)
    (out_dir / "report.md").write_text(report.render_markdown(doc))
    faults = None
    if fault_entries is not None:  # a fault never undone lasts to the last sample
        last_ms = max([s.timestamp_ms for s in samples]
                      + [e["unix_ms"] for e in fault_entries], default=0)
        faults = report_html.fault_intervals(fault_entries, last_ms)
    violated = {(r.topic, r.partition) for r in
                audit_results.violations.select("topic", "partition").distinct().collect()}
    (out_dir / "report.html").write_text(report_html.render_html(
        doc, samples, health.under_replicated_timeline(samples), up, faults=faults,
        violated=violated))
    for r in doc["rules"]:
        state = "skipped" if r["skipped"] else ("pass" if r["passed"] else "FAIL")
        log(f"{r['name']:<32} {state:<7} violations={r['violations']} checked={r['checked']}")
    log(f"audit: {'PASS' if doc['passed'] else 'FAIL'} in {doc['elapsed_s']:.1f} s "
        f"(rules {rules_s:.1f} s); report in {out_dir}/report.md")
    spark_log = _spark_log_path(spark)
    if spark_log:
        log(f"audit: Spark's log lines are in {spark_log}")
    return doc["exit_code"]


def _spark_log_path(spark) -> str | None:
    """The file the audit's log4j2 config sends Spark's INFO lines to, if it is in use."""
    try:
        jvm = spark.sparkContext._jvm
        if "log4j2.properties" not in (jvm.System.getProperty("log4j2.configurationFile") or ""):
            return None
        return (jvm.System.getProperty("tidewater.audit.spark_log")
                or str(Path(jvm.System.getProperty("java.io.tmpdir"),
                            "tidewater-audit-spark.log")))
    except Exception:  # no JVM gateway (Spark Connect): nothing to point at
        return None


def session_for(master: str, spark_log: str | Path | None = None):
    """The session spark-submit made (its master wins), else a quiet local one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from tidewater.audit import datasource, session

    active = SparkContext._active_spark_context
    if active is None and "spark.master" not in _submit_conf():
        return session.local_session(master, spark_log=spark_log)
    spark = SparkSession.builder.getOrCreate()
    datasource.register(spark)
    return spark


def _submit_conf() -> dict:
    """spark-submit passes its settings to the Python driver through the JVM; probe lightly."""
    import os

    # Set by spark-submit's PythonRunner for the driver process.
    return {"spark.master": True} if os.environ.get("PYSPARK_GATEWAY_PORT") else {}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tidewater.audit.session import SparkUnavailableError

    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        spark = session_for(args.master, Path(args.out) / "spark.log")
    except SparkUnavailableError as e:
        print(f"audit: {e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        return run_audit(spark, args.data, args.out, args.metrics, args.ack_log,
                         log=lambda m: print(m, file=sys.stderr), faults_log=args.faults)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
