"""Metrics snapshots for the audit: ``tide metrics scrape`` files and plain Prometheus text.

Scrape files (client/scrape.py, ``OUT/<source>.prom``) are blocks::

    # SCRAPE <unix_ms> <source> ok
    <Prometheus text exposition>
    # EOF
    # SCRAPE <unix_ms> <source> error <reason>

Every sample of an ``ok`` block takes the block's time and source; an ``ok``
block without its ``# EOF`` (the scraper died mid-write) is ignored. Each
block also yields a synthetic sample ``up`` (1 ok, 0 error, label ``source``)
so the report can show when a process did not answer.

A plain Prometheus text file (no ``# SCRAPE`` line) is one snapshot::

    # HELP / # TYPE lines (ignored)
    metric_name{label="value",...} 12 1700000000000    value, optional timestamp (ms)

Its samples without their own timestamp take the file's modification time;
its source is the file's stem.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidewater.audit.reader import AuditInputError

METRIC_FILE_SUFFIXES = (".prom", ".txt", ".metrics")
SCRAPE_MARKER = "# SCRAPE "
END_MARKER = "# EOF"
UP_METRIC = "up"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+"
                     r"(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsFormatError(AuditInputError):
    """A metrics file has a line that is not Prometheus text."""


@dataclass(frozen=True, slots=True)
class Sample:
    timestamp_ms: int
    source: str
    name: str
    labels: dict[str, str]
    value: float


def discover_metric_files(paths: Iterable[str | Path]) -> list[str]:
    """Metric files under ``paths`` (files are taken as given), sorted."""
    found: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise AuditInputError(f"no such metrics file or folder: {raw}")
        if path.is_file():
            found.append(str(path.resolve()))
            continue
        for dirpath, _dirs, files in os.walk(path):
            for name in files:
                if name.endswith(METRIC_FILE_SUFFIXES):
                    found.append(str(Path(dirpath, name).resolve()))
    return sorted(set(found))


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def parse_labels(text: str, where: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise MetricsFormatError(f"{where}: bad labels {{{text}}}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def parse_value(text: str, where: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise MetricsFormatError(f"{where}: bad sample value {text!r}") from None


def parse_prometheus_lines(lines: Iterable[tuple[int, str]], source: str, timestamp_ms: int,
                           where_prefix: str) -> Iterator[Sample]:
    """Samples of numbered exposition lines; raises MetricsFormatError on a malformed line."""
    for number, line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        where = f"{where_prefix}:{number}"
        if m is None:
            raise MetricsFormatError(f"{where}: not a Prometheus sample: {line[:80]!r}")
        labels = parse_labels(m["labels"], where) if m["labels"] else {}
        ts = int(m["ts"]) if m["ts"] else timestamp_ms
        yield Sample(ts, source, m["name"], labels, parse_value(m["value"], where))


def parse_scrape_blocks(lines: list[str], path: str) -> Iterator[Sample]:
    """Samples of a scrape file (``# SCRAPE`` blocks); a torn last block is skipped."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(SCRAPE_MARKER):
            if line.strip():
                raise MetricsFormatError(f"{path}:{i + 1}: text outside a '# SCRAPE' block")
            i += 1
            continue
        parts = line[len(SCRAPE_MARKER):].split(None, 3)
        if len(parts) < 3 or not parts[0].lstrip("-").isdigit() or parts[2] not in ("ok", "error"):
            raise MetricsFormatError(f"{path}:{i + 1}: bad scrape marker {line[:80]!r}")
        unix_ms, source, status = int(parts[0]), parts[1], parts[2]
        start = i + 1
        i = start
        if status == "error":
            yield Sample(unix_ms, source, UP_METRIC, {"source": source}, 0.0)
            continue
        while i < len(lines) and lines[i].strip() != END_MARKER \
                and not lines[i].startswith(SCRAPE_MARKER):
            i += 1
        if i >= len(lines) or lines[i].strip() != END_MARKER:
            continue  # torn or unterminated block: ignored, as the format says
        body = [(n + 1, lines[n]) for n in range(start, i)]
        i += 1
        yield Sample(unix_ms, source, UP_METRIC, {"source": source}, 1.0)
        yield from parse_prometheus_lines(body, source, unix_ms, path)


def read_metric_file(path: str) -> Iterator[Sample]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        mtime_ms = int(p.stat().st_mtime * 1000)
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsFormatError(f"cannot read metrics file {path}: {e}") from e
    lines = text.splitlines()
    if any(line.startswith(SCRAPE_MARKER) for line in lines):
        yield from parse_scrape_blocks(lines, str(p))
    else:
        yield from parse_prometheus_lines(enumerate(lines, start=1), p.stem, mtime_ms, str(p))
