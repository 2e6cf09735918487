"""Line charts drawn on the server as SVG: no script library, nothing from elsewhere.

``line_chart`` takes named series of ``(unix_ms, value or None)`` points (None breaks
the line: a broker that did not answer) and draws them over the last ``window_s``
seconds ending ``now_ms``, the y axis from 0 to a rounded maximum. The result is one
``<svg>`` element, escaped, to put into a page as it is.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf")
WIDTH, HEIGHT = 520, 170
LEFT, RIGHT, TOP, BOTTOM = 56, 10, 24, 34


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1 for 0)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


def human(value: float) -> str:
    """1234567 -> '1.2M'; small values keep a decimal."""
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.1f}{suffix}".replace(".0" + suffix, suffix)
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def span_label(seconds: int) -> str:
    """How far back the chart's left edge is: '-45 s', '-3 min'."""
    return f"-{seconds} s" if seconds < 120 else f"-{seconds // 60} min"


def window_for(series: dict[str, list[tuple[int, float | None]]], now_ms: int, *,
               least_s: int = 60, most_s: int = 300) -> int:
    """The chart's span: back to its oldest point, at least ``least_s`` and at most
    ``most_s``, so a console that started a minute ago does not draw a thin strip."""
    oldest = min((t for points in series.values() for t, _v in points[:1]), default=now_ms)
    return max(least_s, min(most_s, -(-(now_ms - oldest) // 1000)))


def line_chart(title: str, series: dict[str, list[tuple[int, float | None]]], *, now_ms: int,
               window_s: int = 300, chart_id: str = "") -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    start_ms = now_ms - window_s * 1000
    values = [v for points in series.values() for t, v in points if v is not None and t >= start_ms]
    top = nice_max(max(values, default=0.0))
    # The legend gives each line's last value; a source whose last scrape failed is down.
    latest = {name: (points[-1][1] if points else None) for name, points in series.items()}

    def x(t: int) -> float:
        return LEFT + plot_w * (t - start_ms) / (window_s * 1000)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
             f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" data-points="{len(values)}">',
             f'<text x="{LEFT}" y="15" class="chart-title">{escape(title)}</text>']
    for fraction in (0.0, 0.5, 1.0):
        gy = TOP + plot_h * (1 - fraction)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}" '
                     'class="grid"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end" class="tick">'
                     f'{escape(human(top * fraction))}</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - BOTTOM + 14}" class="tick">'
                 f'{escape(span_label(window_s))}</text>')
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - BOTTOM + 14}" text-anchor="end" '
                 'class="tick">now</text>')
    legend_x = LEFT
    for index, (name, points) in enumerate(sorted(series.items())):
        color = PALETTE[index % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for t, v in points:
            if t < start_ms:
                continue
            if v is None:
                runs.append([])
                continue
            runs[-1].append(f"{x(t):.1f},{y(min(v, top)):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="1.8" fill="{color}"/>')
            elif run:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
                             f'points="{" ".join(run)}"/>')
        now_value = latest[name]
        shown = human(now_value) if now_value is not None else ("down" if points else "-")
        label = f"{name}: {shown}"
        parts.append(f'<rect x="{legend_x}" y="{HEIGHT - 12}" width="9" height="9" '
                     f'fill="{color}"/><text x="{legend_x + 12}" y="{HEIGHT - 4}" '
                     f'class="legend">{escape(label)}</text>')
        legend_x += 14 + 7 * len(label)
    if not values:
        parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
                     'text-anchor="middle" class="empty">no data yet</text>')
    parts.append("</svg>")
    return "".join(parts)
