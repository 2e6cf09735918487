"""Audit outputs in ``--out``: report.json, report.md, violations/*.parquet, report.html.

report.json (UTF-8)::

    {"version": 1, "passed": bool, "exit_code": 0|1,
     "inputs": {"data": [...], "metrics": [...], "ack_logs": [...]},
     "rules": [{"name", "description", "passed", "skipped": null|reason,
                "checked", "violations", "parquet": "violations/rule=<name>" | null, "sample": [...],
                "info": {...}}],
     "partition_health": [{"topic", "partition", "offline_ms", "under_replicated_ms",
                           "isr_shrinks", "isr_expands", ...}]}

``violations/`` is one Parquet dataset partitioned by rule
(``violations/rule=<name>/``; written by Spark, so any master over shared
storage works) with columns broker_id, topic, partition, offset, detail. report.html: see
report_html.py (inline SVG charts, no script, nothing loaded from the network).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from tidewater.audit.rules import RuleResult

REPORT_VERSION = 1
SAMPLE_VIOLATIONS_MAX = 20


def write_violation_tables(out_dir: Path, violations: DataFrame) -> None:
    """One Parquet dataset, partitioned by rule: ``violations/rule=<name>/part-*.parquet``."""
    (violations.repartition("rule").write.mode("overwrite").partitionBy("rule")
     .parquet(str(out_dir / "violations")))


def violation_samples(violations: DataFrame) -> dict[str, list[dict]]:
    """The first SAMPLE_VIOLATIONS_MAX violations of each rule (by broker, topic, offset)."""
    w = Window.partitionBy("rule").orderBy("topic", "partition", "offset", "broker_id")
    rows = (violations.withColumn("n", F.row_number().over(w))
            .where(F.col("n") <= SAMPLE_VIOLATIONS_MAX).drop("n").collect())
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row.rule, []).append(row.asDict())
    for sample in out.values():
        sample.sort(key=lambda v: (str(v["topic"]), v["partition"] or 0, v["offset"] or 0,
                                   v["broker_id"] or 0))
    return out


def build_report(results: list[RuleResult], samples: dict[str, list[dict]], inputs: dict,
                 health: list[dict]) -> dict:
    rules = []
    for r in results:
        rules.append({
            "name": r.name, "description": r.description, "passed": r.passed,
            "skipped": r.skipped, "checked": r.checked, "violations": r.violation_count,
            "parquet": f"violations/rule={r.name}" if r.violation_count else None,
            "sample": samples.get(r.name, []), "info": r.info})
    passed = all(r.passed for r in results)
    return {"version": REPORT_VERSION, "passed": passed, "exit_code": 0 if passed else 1,
            "inputs": inputs, "rules": rules, "partition_health": health}


def write_json(out_dir: Path, report: dict) -> None:
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict) -> str:
    verdict = "PASS: every rule holds" if report["passed"] else "FAIL: some rules are violated"
    lines = ["# Tidewater audit", "", f"**{verdict}**", "",
             "| rule | result | violations | checked | what it checks |",
             "|---|---|---|---|---|"]
    for r in report["rules"]:
        result = "skipped" if r["skipped"] else ("pass" if r["passed"] else "**FAIL**")
        lines.append(f"| {r['name']} | {result} | {r['violations']} | {r['checked']} | "
                     f"{_md_cell(r['description'])} |")
    for r in report["rules"]:
        if r["skipped"]:
            lines += ["", f"- {r['name']} skipped: {r['skipped']}"]
    for r in report["rules"]:
        if r["passed"]:
            continue
        lines += ["", f"## {r['name']}: {r['violations']} violation(s)", "",
                  f"All of them: `{r['parquet']}` (Parquet).", "",
                  "| broker | topic | partition | offset | detail |", "|---|---|---|---|---|"]
        for v in r["sample"]:
            lines.append(f"| {v['broker_id']} | {v['topic']} | {v['partition']} | "
                         f"{v['offset']} | {_md_cell(v['detail'])} |")
    info = {r["name"]: r["info"] for r in report["rules"] if r["info"]}
    agree = info.get("replicas_agree_below_hw", {})
    if agree.get("lagging_replicas") or agree.get("uncommitted_suffixes"):
        lines += ["", "## Replica positions (information)", "",
                  "| broker | topic | partition | log end | HW | state |", "|---|---|---|---|---|---|"]
        for x in agree.get("lagging_replicas", []):
            lines.append(f"| {x['broker_id']} | {x['topic']} | {x['partition']} | "
                         f"{x['log_end_offset']} | {x['high_watermark']} | lagging |")
        for x in agree.get("uncommitted_suffixes", []):
            lines.append(f"| {x['broker_id']} | {x['topic']} | {x['partition']} | "
                         f"{x['log_end_offset']} | {x['high_watermark']} | "
                         f"{x['uncommitted_offsets']} uncommitted offset(s) |")
    acks = info.get("acked_writes_present")
    if acks:
        lines += ["", "## Acknowledged writes", "",
                  f"- acks=all: {acks['acks_all_checked']} checked, {acks['acks_all_lost']} lost",
                  f"- acks=1: {acks['acks_1_checked']} checked, {acks['acks_1_lost']} lost "
                  "(allowed: a leader may fail before followers copy them)"]
    txns = info.get("transactions_end_with_markers")
    if txns and (txns["committed"] or txns["aborted"] or txns["open"]):
        # Counted per replica: a transaction over 3 replicas counts 3 times.
        lines += ["", "## Transactions (per replica)", "",
                  f"- committed {txns['committed']}, aborted {txns['aborted']}, "
                  f"open at the log end {txns['open']} (information, not a violation)"]
        lines += [f"  - open: {_md_cell(x)}" for x in txns["open_examples"]]
    if report["partition_health"]:
        lines += ["", "## Partition health (from metrics)", "",
                  "| topic | partition | observed s | offline s | under-replicated s | "
                  "ISR shrinks | ISR expands | leader epochs |", "|---|---|---|---|---|---|---|---|"]
        for h in report["partition_health"]:
            lines.append(
                f"| {h['topic']} | {h['partition']} | {h['observed_ms'] / 1000:.1f} | "
                f"{h['offline_ms'] / 1000:.1f} | {h['under_replicated_ms'] / 1000:.1f} | "
                f"{h['isr_shrinks']} | {h['isr_expands']} | "
                f"{', '.join(map(str, h['leader_epochs_seen']))} |")
    return "\n".join(lines) + "\n"
