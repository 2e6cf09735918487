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
storage works) with columns broker_id, topic, partition, offset, detail. report.html draws its charts as inline SVG: no script, no
network.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from tidewater.audit.health import ReplicaSample
from tidewater.audit.rules import RuleResult

REPORT_VERSION = 1
SAMPLE_VIOLATIONS_MAX = 20
CHART_PARTITIONS_MAX = 12
CHART_POINTS_MAX = 600


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


# ---------------------------------------------------------------- HTML + SVG

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf")


def _downsample(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= CHART_POINTS_MAX:
        return points
    step = len(points) / CHART_POINTS_MAX
    return [points[int(i * step)] for i in range(CHART_POINTS_MAX)] + [points[-1]]


def svg_line_chart(title: str, series: dict[str, list[tuple[float, float]]], *,
                   t0_ms: float, width: int = 720, height: int = 220, step: bool = True) -> str:
    """A line chart as an SVG string; x is seconds since ``t0_ms``."""
    pad_l, pad_r, pad_t, pad_b = 60, 150, 24, 30
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    x_max = max(max((t - t0_ms) / 1000 for t, _ in pts), 1e-9)
    y_min = min(0.0, min(v for _, v in pts))
    y_max = max(max(v for _, v in pts), y_min + 1)
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def xy(t, v):
        return (pad_l + (t - t0_ms) / 1000 / x_max * plot_w,
                pad_t + plot_h - (v - y_min) / (y_max - y_min) * plot_h)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{pad_l}" y="15" font-size="13" font-weight="bold">{html.escape(title)}</text>',
           f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{pad_l + plot_w}" y2="{pad_t + plot_h}" '
           'stroke="#888"/>',
           f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" stroke="#888"/>',
           f'<text x="{pad_l - 4}" y="{pad_t + 10}" font-size="10" text-anchor="end">'
           f'{y_max:g}</text>',
           f'<text x="{pad_l - 4}" y="{pad_t + plot_h}" font-size="10" text-anchor="end">'
           f'{y_min:g}</text>',
           f'<text x="{pad_l + plot_w}" y="{height - 8}" font-size="10" text-anchor="end">'
           f'{x_max:.1f} s</text>',
           f'<text x="{pad_l}" y="{height - 8}" font-size="10">0 s</text>']
    for i, (label, points) in enumerate(sorted(series.items())):
        color = _COLORS[i % len(_COLORS)]
        coords = []
        prev_y = None
        for t, v in _downsample(sorted(points)):
            x, y = xy(t, v)
            if step and prev_y is not None:
                coords.append(f"{x:.1f},{prev_y:.1f}")
            coords.append(f"{x:.1f},{y:.1f}")
            prev_y = y
        # HW dashed over a solid LEO: equal values stay visible as two lines.
        dash = ' stroke-dasharray="5,3"' if label.startswith("HW") else ""
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} '
                   f'points="{" ".join(coords)}"/>')
        ly = pad_t + 12 + i * 14
        out.append(f'<rect x="{pad_l + plot_w + 10}" y="{ly - 8}" width="10" height="10" '
                   f'fill="{color}"/><text x="{pad_l + plot_w + 24}" y="{ly}" font-size="11">'
                   f'{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_lanes(title: str, lanes: dict[str, list[tuple[int, float]]], *, t0_ms: float,
              t_end_ms: float, width: int = 720) -> str:
    """One lane per source: green while it answered scrapes, red while it did not."""
    pad_l, pad_r, lane_h = 90, 20, 16
    height = 30 + lane_h * len(lanes) + 20
    span = max(t_end_ms - t0_ms, 1)
    plot_w = width - pad_l - pad_r
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{pad_l}" y="15" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    for i, (name, points) in enumerate(sorted(lanes.items())):
        y = 26 + i * lane_h
        out.append(f'<text x="{pad_l - 6}" y="{y + 11}" font-size="11" text-anchor="end">'
                   f'{html.escape(name)}</text>')
        points = sorted(points)
        for j, (t, up) in enumerate(points):
            t_next = points[j + 1][0] if j + 1 < len(points) else t_end_ms
            x = pad_l + (t - t0_ms) / span * plot_w
            w = max((t_next - t) / span * plot_w, 1.0)
            color = "#2a7" if up >= 1 else "#c33"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 3}" '
                       f'fill="{color}"/>')
    out.append(f'<text x="{pad_l}" y="{height - 4}" font-size="10">0 s</text>'
               f'<text x="{pad_l + plot_w}" y="{height - 4}" font-size="10" text-anchor="end">'
               f'{span / 1000:.1f} s</text></svg>')
    return "".join(out)


def render_html(report: dict, samples: list[ReplicaSample],
                under_replicated: list[tuple[int, int]],
                up: dict[str, list[tuple[int, float]]]) -> str:
    verdict = "PASS" if report["passed"] else "FAIL"
    color = "#2a7" if report["passed"] else "#c33"
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Tidewater audit</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
             "font-size:13px}.fail{color:#c33;font-weight:bold}.pass{color:#2a7}</style>",
             "</head><body>",
             f"<h1>Tidewater audit: <span style='color:{color}'>{verdict}</span></h1>",
             "<table><tr><th>rule</th><th>result</th><th>violations</th><th>checked</th>"
             "<th>what it checks</th></tr>"]
    for r in report["rules"]:
        result = ("<span>skipped</span>" if r["skipped"] else
                  "<span class='pass'>pass</span>" if r["passed"] else
                  "<span class='fail'>FAIL</span>")
        parts.append(f"<tr><td>{html.escape(r['name'])}</td><td>{result}</td>"
                     f"<td>{r['violations']}</td><td>{r['checked']}</td>"
                     f"<td>{html.escape(r['description'])}</td></tr>")
    parts.append("</table>")
    for r in report["rules"]:
        if r["passed"]:
            continue
        parts.append(f"<h2>{html.escape(r['name'])}</h2><table><tr><th>broker</th><th>topic</th>"
                     "<th>partition</th><th>offset</th><th>detail</th></tr>")
        for v in r["sample"]:
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(v[k]))}</td>" for k in
                                          ("broker_id", "topic", "partition", "offset", "detail"))
                         + "</tr>")
        parts.append("</table>")
    if samples:
        t0 = min(s.timestamp_ms for s in samples)
        parts.append("<h2>Chaos timeline (from metrics)</h2>")
        if up:
            t_end = max(t for pts in up.values() for t, _v in pts)
            parts.append(svg_lanes("Processes answering scrapes (green up, red down)", up,
                                   t0_ms=min(t0, min(t for pts in up.values() for t, _ in pts)),
                                   t_end_ms=t_end))
        parts.append(svg_line_chart("Under-replicated partitions",
                                    {"partitions": [(t, float(c)) for t, c in under_replicated]},
                                    t0_ms=t0))
        by_partition: dict[tuple[str, int], list[ReplicaSample]] = defaultdict(list)
        for s in samples:
            by_partition[(s.topic, s.partition)].append(s)
        for (topic, partition), rows in sorted(by_partition.items())[:CHART_PARTITIONS_MAX]:
            offsets: dict[str, list[tuple[float, float]]] = defaultdict(list)
            isr: dict[str, list[tuple[float, float]]] = defaultdict(list)
            for s in rows:
                if s.high_watermark is not None:
                    offsets[f"HW b{s.broker_id}"].append((s.timestamp_ms, s.high_watermark))
                if s.log_end_offset is not None:
                    offsets[f"LEO b{s.broker_id}"].append((s.timestamp_ms, s.log_end_offset))
                if s.is_leader == 1 and s.isr_size is not None:
                    isr[f"leader b{s.broker_id}"].append((s.timestamp_ms, s.isr_size))
            parts.append(f"<h3>{html.escape(topic)}-{partition}</h3>")
            parts.append(svg_line_chart("HW and LEO per replica", dict(offsets), t0_ms=t0))
            parts.append(svg_line_chart("ISR size (as its leader reports it)", dict(isr),
                                        t0_ms=t0))
    else:
        parts.append("<p>No metrics given: no timeline charts.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
