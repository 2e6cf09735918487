"""report.html: the audit's report for a person, as one self-contained page (pure Python).

Order: the verdict and the failing rules with sample violations first, then every
rule, then the timeline (from metrics): processes up/down with the chaos run's
faults (``--faults``: tide chaos's faults.jsonl) when given, under-replicated
partitions, and HW/LEO and ISR charts only for partitions where something
happened (a fault on one of its replicas' brokers, an offline or
under-replicated period, or a violation); every other partition is one row of
a table. Charts are inline SVG with ticked axes (wall-clock UTC times on x) and
one x range for the whole page. Lines that coincide (HW = LEO, replicas in
sync) are drawn one inside the other, widest first, so each stays visible.
No script, and a Content-Security-Policy that lets the page load nothing.

faults.jsonl (tools/chaos/runner.py): one JSON object a line with ``unix_ms``,
``action`` (kill, pause, isolate start a fault on ``node``; start, unpause,
heal end it; heal-all ends every fault) and ``ok``.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidewater.audit.health import ReplicaSample

CHART_PARTITIONS_MAX = 24
CHART_POINTS_MAX = 600
FAULT_STARTS = ("kill", "pause", "isolate")
FAULT_ENDS = ("start", "unpause", "heal")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf")
_TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200,
                 86400)
LABEL_CHARS_MAX = 18


class FaultLogError(ValueError):
    """A faults.jsonl line that is not the documented JSON object."""


@dataclass(frozen=True, slots=True)
class Fault:
    node: str
    action: str
    start_ms: int
    end_ms: int

    @property
    def broker_id(self) -> int | None:
        name = self.node.rsplit("-", 1)
        return int(name[1]) if len(name) == 2 and name[0] == "broker" and name[1].isdigit() \
            else None


def read_fault_log(path: str | Path) -> list[dict]:
    """The entries of a faults.jsonl; raises FaultLogError (a torn last line is skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise FaultLogError(f"cannot read fault log {path}: {e}") from e
    lines = text.split("\n")
    tail = lines.pop()
    entries = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            entries.append(_fault_entry(line, f"{path}:{number}"))
    if tail.strip():
        try:
            entries.append(_fault_entry(tail, f"{path}:{len(lines) + 1}"))
        except FaultLogError:
            pass  # torn: the writer died mid-line
    return entries


def _fault_entry(line: str, where: str) -> dict:
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise TypeError("not an object")
        return {"unix_ms": int(obj["unix_ms"]), "action": str(obj["action"]),
                "node": str(obj.get("node", "")), "ok": bool(obj.get("ok", True))}
    except (ValueError, KeyError, TypeError) as e:
        raise FaultLogError(f"{where}: not a fault log entry: {e}") from None


def fault_intervals(entries: Iterable[dict], end_ms: int) -> list[Fault]:
    """Each fault from its start to its undo (or ``end_ms`` when never undone)."""
    open_faults: dict[str, tuple[str, int]] = {}
    out: list[Fault] = []
    for e in sorted(entries, key=lambda e: e["unix_ms"]):
        if not e["ok"]:
            continue
        action, node, t = e["action"], e["node"], e["unix_ms"]
        if action in FAULT_STARTS and node not in open_faults:
            open_faults[node] = (action, t)
        elif action in FAULT_ENDS and node in open_faults:
            started_action, started = open_faults.pop(node)
            out.append(Fault(node, started_action, started, t))
        elif action == "heal-all":
            for n, (a, started) in sorted(open_faults.items()):
                out.append(Fault(n, a, started, t))
            open_faults.clear()
    for n, (a, started) in sorted(open_faults.items()):
        out.append(Fault(n, a, started, max(end_ms, started)))
    return sorted(out, key=lambda f: (f.start_ms, f.node))


def eventful_partitions(health: list[dict], samples: Iterable[ReplicaSample],
                        faults: list[Fault], violated: set[tuple[str, int]]
                        ) -> dict[tuple[str, int], list[str]]:
    """Partition -> why it gets charts: faults on its brokers, offline/under-replicated
    time, violations. Partitions with nothing to show are left out."""
    replicas: dict[tuple[str, int], set[int]] = defaultdict(set)
    for s in samples:
        replicas[(s.topic, s.partition)].add(s.broker_id)
    reasons: dict[tuple[str, int], list[str]] = defaultdict(list)
    for key in sorted(violated):
        reasons[key].append("violation")
    for h in health:
        key = (h["topic"], h["partition"])
        if h["offline_ms"]:
            reasons[key].append(f"offline {h['offline_ms'] / 1000:.1f} s")
        if h["under_replicated_ms"]:
            reasons[key].append(f"under-replicated {h['under_replicated_ms'] / 1000:.1f} s")
    faulted_brokers = {f.broker_id for f in faults if f.broker_id is not None}
    for key, brokers in replicas.items():
        hit = sorted(brokers & faulted_brokers)
        if hit:
            reasons[key].append("fault on broker " + ", ".join(map(str, hit)))
    return dict(sorted(reasons.items()))


# ---------------------------------------------------------------- axes


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round values covering [lo, hi] (1, 2 or 5 times a power of ten).

    The range is at least 1 wide: the charts plot offsets and counts, whole numbers.
    """
    hi = max(hi, lo + 1)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step)
    # lo / step can underflow to -0.0 (lo = -5e-324) and the rounding below can lift a
    # tick past lo: step down until the first tick covers lo.
    while round(first * step, 10) > lo:
        first -= 1
    ticks = [round(first * step, 10)]
    while ticks[-1] < hi:
        ticks.append(round((first + len(ticks)) * step, 10))
    return ticks


def time_ticks(t0_ms: float, t1_ms: float, count: int = 8) -> list[float]:
    """Tick times (ms) at a round step (1 s ... 1 day) inside [t0, t1]."""
    span_s = max((t1_ms - t0_ms) / 1000, 1e-3)
    step = next((s for s in _TIME_STEPS_S if span_s / s <= count), _TIME_STEPS_S[-1])
    first = math.ceil(t0_ms / 1000 / step) * step
    return [t * 1000 for t in range(int(first), int(t1_ms / 1000) + 1, step)]


def time_label(t_ms: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t_ms / 1000))


def short_label(text: str) -> str:
    return text if len(text) <= LABEL_CHARS_MAX else text[:LABEL_CHARS_MAX - 1] + "…"


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


# ---------------------------------------------------------------- charts


@dataclass(frozen=True, slots=True)
class TimeRange:
    start_ms: float
    end_ms: float

    @property
    def span_ms(self) -> float:
        return max(self.end_ms - self.start_ms, 1.0)


def _downsample(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= CHART_POINTS_MAX:
        return points
    step = len(points) / CHART_POINTS_MAX
    return [points[int(i * step)] for i in range(CHART_POINTS_MAX)] + [points[-1]]


def _x_axis(out: list[str], span: TimeRange, left: float, width: float, y: float,
            grid_top: float | None) -> None:
    out.append(f'<line x1="{left}" y1="{y}" x2="{left + width}" y2="{y}" stroke="#666"/>')
    for t in time_ticks(span.start_ms, span.end_ms):
        x = left + (t - span.start_ms) / span.span_ms * width
        if grid_top is not None:
            out.append(f'<line x1="{x:.1f}" y1="{grid_top}" x2="{x:.1f}" y2="{y}" '
                       'stroke="#eee"/>')
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#666"/>'
                   f'<text x="{x:.1f}" y="{y + 15}" font-size="10" text-anchor="middle">'
                   f'{time_label(t)}</text>')


def _fault_bands(out: list[str], faults: list[Fault], span: TimeRange, left: float,
                 width: float, top: float, height: float) -> None:
    for f in faults:
        x0 = left + max(f.start_ms - span.start_ms, 0) / span.span_ms * width
        x1 = left + min(f.end_ms - span.start_ms, span.span_ms) / span.span_ms * width
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{height}" fill="#f5b7b1" fill-opacity="0.35">'
                   f'<title>{html.escape(f.action)} {html.escape(f.node)}</title></rect>')


def svg_line_chart(title: str, series: dict[str, list[tuple[float, float]]], span: TimeRange,
                   *, y_label: str = "", faults: list[Fault] = (), width: int = 760,
                   height: int = 230) -> str:
    """A step chart over ``span``; coinciding series drawn one inside the other."""
    pad_l, pad_r, pad_t, pad_b = 64, 170, 26, 34
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: no samples.</p>"
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b
    ticks = nice_ticks(min(0.0, min(v for _, v in pts)), max(v for _, v in pts))
    y_lo, y_hi = ticks[0], ticks[-1]

    def xy(t: float, v: float) -> tuple[float, float]:
        return (pad_l + (t - span.start_ms) / span.span_ms * plot_w,
                pad_t + plot_h - (v - y_lo) / (y_hi - y_lo) * plot_h)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{pad_l}" y="16" font-size="13" font-weight="bold">'
           f'{html.escape(title)}</text>']
    _fault_bands(out, list(faults), span, pad_l, plot_w, pad_t, plot_h)
    for v in ticks:
        _x, y = xy(span.start_ms, v)
        out.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + plot_w}" y2="{y:.1f}" '
                   f'stroke="#eee"/><line x1="{pad_l - 4}" y1="{y:.1f}" x2="{pad_l}" '
                   f'y2="{y:.1f}" stroke="#666"/><text x="{pad_l - 7}" y="{y + 3:.1f}" '
                   f'font-size="10" text-anchor="end">{_fmt(v)}</text>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" '
               'stroke="#666"/>')
    if y_label:
        out.append(f'<text x="12" y="{pad_t + plot_h / 2:.0f}" font-size="10" '
                   f'text-anchor="middle" transform="rotate(-90 12 {pad_t + plot_h / 2:.0f})">'
                   f'{html.escape(y_label)}</text>')
    _x_axis(out, span, pad_l, plot_w, pad_t + plot_h, None)
    # Widest first: a series equal to a later one shows as a border around it.
    ordered = sorted(series.items())
    n = len(ordered)
    for i, (label, points) in enumerate(ordered):
        color = _COLORS[i % len(_COLORS)]
        coords: list[str] = []
        prev_y = None
        for t, v in _downsample(sorted(points)):
            x, y = xy(t, v)
            if prev_y is not None:
                coords.append(f"{x:.1f},{prev_y:.1f}")
            coords.append(f"{x:.1f},{y:.1f}")
            prev_y = y
        stroke_w = 1.5 + 2.0 * (n - 1 - i)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{stroke_w:.1f}" '
                   f'stroke-linejoin="round" points="{" ".join(coords)}">'
                   f'<title>{html.escape(label)}</title></polyline>')
        ly = pad_t + 8 + i * 15
        out.append(f'<line x1="{pad_l + plot_w + 10}" y1="{ly}" x2="{pad_l + plot_w + 30}" '
                   f'y2="{ly}" stroke="{color}" stroke-width="{min(stroke_w, 6):.1f}"/>'
                   f'<text x="{pad_l + plot_w + 35}" y="{ly + 4}" font-size="11">'
                   f'{html.escape(short_label(label))}<title>{html.escape(label)}</title></text>')
    out.append("</svg>")
    return "".join(out)


def svg_lanes(title: str, up: dict[str, list[tuple[int, float]]], faults: list[Fault],
              span: TimeRange, *, width: int = 760) -> str:
    """One lane per process: green while it answered scrapes, red while not; faults on top."""
    pad_l, pad_r, lane_h = 110, 170, 18
    names = sorted(set(up) | {f.node for f in faults})
    height = 30 + lane_h * len(names) + 26
    plot_w = width - pad_l - pad_r
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="{html.escape(title)}">',
           f'<text x="{pad_l}" y="16" font-size="13" font-weight="bold">'
           f'{html.escape(title)}</text>']

    def x_of(t: float) -> float:
        return pad_l + (t - span.start_ms) / span.span_ms * plot_w

    for i, name in enumerate(names):
        y = 26 + i * lane_h
        out.append(f'<text x="{pad_l - 6}" y="{y + 12}" font-size="11" text-anchor="end">'
                   f'{html.escape(short_label(name))}<title>{html.escape(name)}</title></text>')
        points = sorted(up.get(name, []))
        for j, (t, value) in enumerate(points):
            t_next = points[j + 1][0] if j + 1 < len(points) else span.end_ms
            w = max(x_of(t_next) - x_of(t), 1.0)
            color = "#2a7" if value >= 1 else "#c33"
            out.append(f'<rect x="{x_of(t):.1f}" y="{y}" width="{w:.1f}" '
                       f'height="{lane_h - 4}" fill="{color}"/>')
        for f in faults:
            if f.node != name:
                continue
            w = max(x_of(f.end_ms) - x_of(f.start_ms), 2.0)
            out.append(f'<rect x="{x_of(f.start_ms):.1f}" y="{y + 4}" width="{w:.1f}" '
                       f'height="{lane_h - 12}" fill="#000" fill-opacity="0.55">'
                       f'<title>{html.escape(f.action)} {html.escape(name)}</title></rect>')
    legend_x = pad_l + plot_w + 10
    out.append(f'<rect x="{legend_x}" y="22" width="10" height="10" fill="#2a7"/>'
               f'<text x="{legend_x + 14}" y="31" font-size="11">answering</text>'
               f'<rect x="{legend_x}" y="38" width="10" height="10" fill="#c33"/>'
               f'<text x="{legend_x + 14}" y="47" font-size="11">not answering</text>')
    if faults:
        out.append(f'<rect x="{legend_x}" y="56" width="10" height="4" fill="#000" '
                   f'fill-opacity="0.55"/><text x="{legend_x + 14}" y="62" font-size="11">'
                   'fault injected</text>')
    _x_axis(out, span, pad_l, plot_w, 26 + lane_h * len(names), 22)
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------- the page

_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1000px;color:#222}"
    "h1,h2,h3,p,td.name{overflow-wrap:anywhere}td{overflow-wrap:break-word}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;vertical-align:top}"
    "td.name{max-width:22em}td.nowrap{white-space:nowrap}"
    ".fail{color:#c33;font-weight:bold}.pass{color:#2a7}.skip{color:#888}"
    ".verdict{font-size:1.1em;padding:.6em 1em;border-radius:4px}"
    ".verdict.bad{background:#fdecea}.verdict.good{background:#e8f6ee}"
    "svg{display:block;margin:.4em 0 1em}")


def _td(value, cls: str = "") -> str:
    attr = f" class='{cls}'" if cls else ""
    return f"<td{attr}>{html.escape(str(value))}</td>"


def render_html(report: dict, samples: list[ReplicaSample],
                under_replicated: list[tuple[int, int]],
                up: dict[str, list[tuple[int, float]]], *,
                faults: list[Fault] | None = None,
                violated: set[tuple[str, int]] = frozenset()) -> str:
    """The page; ``faults`` None: not a chaos run (no fault log given)."""
    failing = [r for r in report["rules"] if not r["passed"]]
    checked = [r for r in report["rules"] if not r["skipped"]]
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">",
             "<title>Tidewater audit</title>", f"<style>{_STYLE}</style></head><body>"]
    if report["passed"]:
        parts.append("<h1>Tidewater audit: <span class='pass'>PASS</span></h1>"
                     f"<p class='verdict good'>All {len(checked)} rules that ran hold.</p>")
    else:
        parts.append("<h1>Tidewater audit: <span class='fail'>FAIL</span></h1>"
                     f"<p class='verdict bad'>{len(failing)} of {len(checked)} rules fail: "
                     + ", ".join(f"<a href='#rule-{html.escape(r['name'])}'>"
                                 f"{html.escape(r['name'])}</a>" for r in failing) + "</p>")
    for r in failing:
        parts.append(f"<h2 id='rule-{html.escape(r['name'])}'>{html.escape(r['name'])}: "
                     f"<span class='fail'>{r['violations']} violation(s)</span></h2>"
                     f"<p>{html.escape(r['description'])}</p>")
        if r["sample"]:
            parts.append("<table><tr><th>broker</th><th>topic</th><th>partition</th>"
                         "<th>offset</th><th>detail</th></tr>")
            for v in r["sample"]:
                parts.append("<tr>" + _td(v["broker_id"]) + _td(v["topic"], "name")
                             + _td(v["partition"]) + _td(v["offset"]) + _td(v["detail"])
                             + "</tr>")
            parts.append("</table>")
            if r["violations"] > len(r["sample"]):
                parts.append(f"<p>First {len(r['sample'])} shown; all of them in "
                             f"<code>{html.escape(str(r['parquet']))}</code> (Parquet).</p>")
    parts.append("<h2>Every rule</h2><table><tr><th>rule</th><th>result</th>"
                 "<th>violations</th><th>checked</th><th>what it checks</th></tr>")
    for r in report["rules"]:
        result = ("<span class='skip'>skipped</span>" if r["skipped"] else
                  "<span class='pass'>pass</span>" if r["passed"] else
                  "<span class='fail'>FAIL</span>")
        parts.append(f"<tr>{_td(r['name'], 'nowrap')}<td>{result}</td>{_td(r['violations'])}"
                     f"{_td(r['checked'])}{_td(r['skipped'] or r['description'])}</tr>")
    parts.append("</table>")
    parts.extend(_timeline(report, samples, under_replicated, up, faults, violated))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _timeline(report: dict, samples: list[ReplicaSample], under_replicated, up, faults,
              violated) -> list[str]:
    if not samples and not up:
        return ["<h2>Timeline</h2><p>No metrics given: no timeline charts.</p>"]
    chaos = faults is not None
    faults = faults or []
    times = ([s.timestamp_ms for s in samples] + [t for pts in up.values() for t, _ in pts]
             + [t for f in faults for t in (f.start_ms, f.end_ms)])
    span = TimeRange(min(times), max(times))
    parts = ["<h2>Chaos timeline (faults injected and metrics)</h2>" if chaos
             else "<h2>Timeline (from metrics)</h2>",
             f"<p>Times are UTC; from {time_label(span.start_ms)} to "
             f"{time_label(span.end_ms)} ({span.span_ms / 1000:.1f} s)."
             + (f" {len(faults)} fault(s) injected, shaded on the charts." if chaos else "")
             + "</p>"]
    if up or faults:
        parts.append(svg_lanes("Processes answering metrics scrapes", up, faults, span))
    if under_replicated:
        parts.append(svg_line_chart(
            "Under-replicated partitions",
            {"partitions": [(t, float(c)) for t, c in under_replicated]}, span,
            y_label="partitions", faults=faults))
    health = report.get("partition_health", [])
    eventful = eventful_partitions(health, samples, faults, set(violated))
    by_partition: dict[tuple[str, int], list[ReplicaSample]] = defaultdict(list)
    for s in samples:
        by_partition[(s.topic, s.partition)].append(s)
    charted = [k for k in eventful if k in by_partition][:CHART_PARTITIONS_MAX]
    if charted:
        parts.append("<h2>Partitions where something happened</h2>"
                     "<p>Each line is drawn thinner than the one listed before it, so lines "
                     "that coincide (HW = LEO, replicas in sync) show as nested bands.</p>")
    for key in charted:
        topic, partition = key
        offsets: dict[str, list[tuple[float, float]]] = defaultdict(list)
        isr: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in by_partition[key]:
            if s.log_end_offset is not None:
                offsets[f"LEO broker {s.broker_id}"].append((s.timestamp_ms, s.log_end_offset))
            if s.high_watermark is not None:
                offsets[f"HW broker {s.broker_id}"].append((s.timestamp_ms, s.high_watermark))
            if s.is_leader == 1 and s.isr_size is not None:
                isr[f"leader broker {s.broker_id}"].append((s.timestamp_ms, s.isr_size))
        parts.append(f"<h3>{html.escape(topic)}-{partition}</h3>"
                     f"<p>{html.escape('; '.join(eventful[key]))}</p>")
        parts.append(svg_line_chart("HW and LEO per replica", dict(offsets), span,
                                    y_label="offset", faults=faults))
        parts.append(svg_line_chart("ISR size, as its leader reports it", dict(isr), span,
                                    y_label="replicas", faults=faults))
    rest = [h for h in health if (h["topic"], h["partition"]) not in set(charted)]
    if rest:
        more = len([k for k in eventful if k in by_partition]) - len(charted)
        title = "Other partitions" + (f" ({more} more with events, not charted)" if more else
                                      ": nothing happened")
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr><th>topic</th><th>partition"
                     "</th><th>replicas</th><th>observed s</th><th>offline s</th>"
                     "<th>under-replicated s</th><th>leader epochs</th></tr>")
        for h in rest:
            parts.append("<tr>" + _td(h["topic"], "name") + _td(h["partition"])
                         + _td(h["replicas_seen"]) + _td(f"{h['observed_ms'] / 1000:.1f}")
                         + _td(f"{h['offline_ms'] / 1000:.1f}")
                         + _td(f"{h['under_replicated_ms'] / 1000:.1f}")
                         + _td(", ".join(map(str, h["leader_epochs_seen"]))) + "</tr>")
        parts.append("</table>")
    return parts
