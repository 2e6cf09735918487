"""What librdkafka's test-runner says about each test, read from every place it says it.

The runner prints its closing summary table with ``printf`` to stdout, which is block
buffered into a pipe; when the runner then aborts (``<MAIN>`` fails in
``test_wait_exit()`` because a failed test left its client's threads running, or a test
times out and the runner SIGKILLs itself), whatever was still buffered is lost and the
table stops halfway. So the outcome is read, in order of trust, from:

1. the JSON report the runner writes (and closes) before that point (``TEST_REPORT``);
2. the summary table on stdout, as far as it got;
3. the lines it writes unbuffered to stderr while tests run: the
   ``=== Test NAME PASSED ===`` banner and ``### Test "NAME" failed at FILE:LINE ###``
   followed by the failure's message (a timeout is such a failure, "timed out").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY_ROW = re.compile(r"^\|\s*(\d{4}_\S*)\s*\|\s*(\w+)\s*\|\s*([0-9.]+)s")
# Every line a test prints starts with its name and its time so far: `[0081_admin  / 12.3s]`.
ELAPSED = re.compile(r"^\[(\d{4}_\S+)\s*/\s*([0-9.]+)s\]")
PASSED_BANNER = re.compile(r"=+ Test (\d{4}_\S+) PASSED =+")
# `### Test "0086_purge_remote (remote:272)" failed at 0086-purge.c:135:dr_msg_cb() at ...`
FAILED_AT = re.compile(r'### Test "(\d{4}_[^" ]+)(?: \(([^"]*)\))?" failed at (\S+?)\(\)')
TIMED_OUT = "timed out"


@dataclass
class TestOutcome:
    state: str = "DNS"  # the runner's: PASSED, FAILED, SKIPPED, RUNNING, DNS (did not start)
    duration_s: float = 0.0
    failures: list[str] = field(default_factory=list)  # "FILE:LINE:func: message"

    @property
    def timed_out(self) -> bool:
        return any(TIMED_OUT in f for f in self.failures)


def read_outcomes(output: str, report: Path | None = None) -> dict[str, TestOutcome]:
    """Test name (``0081_admin``) -> its outcome, from the runner's report file (when it
    exists and parses), its stdout summary table and its stderr lines."""
    text = ANSI.sub("", output)
    outcomes: dict[str, TestOutcome] = {}
    for name, (state, duration) in _summary_rows(text).items():
        outcomes[name] = TestOutcome(state, duration)
    for name, (state, duration) in _report(report).items():
        outcomes[name] = TestOutcome(state, duration)  # the report is complete: it wins
    lines = text.splitlines()
    elapsed: dict[str, float] = {}
    for i, line in enumerate(lines):
        if (prefix := ELAPSED.match(line)) is not None:
            elapsed[prefix.group(1)] = max(elapsed.get(prefix.group(1), 0.0),
                                           float(prefix.group(2)))
        if (banner := PASSED_BANNER.search(line)) is not None:
            outcome = outcomes.setdefault(banner.group(1), TestOutcome())
            if outcome.state in ("DNS", "RUNNING"):
                outcome.state = "PASSED"
        elif (failed := FAILED_AT.search(line)) is not None:
            name, subtest, where = failed.groups()
            message = lines[i + 1].strip() if i + 1 < len(lines) else ""
            outcome = outcomes.setdefault(name, TestOutcome())
            outcome.state = "FAILED"  # a failure is final, even after a PASSED banner
            outcome.failures.append(f"{where}{f' [{subtest}]' if subtest else ''}: {message}")
    for name, seconds in elapsed.items():
        # A test that printed but has no verdict was still running when the runner stopped.
        outcome = outcomes.setdefault(name, TestOutcome("RUNNING"))
        if not outcome.duration_s:  # neither the report nor the table said how long
            outcome.duration_s = seconds
    return outcomes


def problems(outcomes: dict[str, TestOutcome], numbers: tuple[str, ...]) -> list[str]:
    """One line per test of ``numbers`` that did not pass: failed (first failure and how
    many more), timed out, unfinished, or never run (not even reported)."""
    found: list[str] = []
    for number in numbers:
        mine = {name: o for name, o in outcomes.items()
                if name[:4] == number and o.state != "SKIPPED"}
        if not mine:
            found.append(f"{number}: not run (nothing reported)")
        for name, o in sorted(mine.items()):
            if o.state == "PASSED":
                continue
            if o.timed_out:
                what = "timed out"
            elif o.state == "FAILED":
                what = "failed"
            elif o.state == "RUNNING":
                what = "still running when the runner stopped"
            else:
                what = "not started"
            detail = ""
            if o.failures:
                more = len(o.failures) - 1
                detail = f": {o.failures[0]}" + (f" (+{more} more)" if more else "")
            after = f" after {o.duration_s:.1f}s" if o.duration_s else ""
            found.append(f"{name} {what}{after}{detail}")
    return found


def slowest(outcomes: dict[str, TestOutcome], n: int = 8) -> str:
    """The ``n`` longest tests as ``name 12.3s`` (where the suite's time goes)."""
    ranked = sorted(((o.duration_s, name) for name, o in outcomes.items()
                     if name[:1].isdigit()), reverse=True)[:n]
    return ", ".join(f"{name} {d:.1f}s" for d, name in ranked)


def _summary_rows(text: str) -> dict[str, tuple[str, float]]:
    rows: dict[str, tuple[str, float]] = {}
    for line in text.splitlines():
        if (row := SUMMARY_ROW.match(line)) is not None:
            name, state, duration = row.groups()
            rows[name] = (state, float(duration))
    return rows


def _report(path: Path | None) -> dict[str, tuple[str, float]]:
    """``TEST_REPORT``'s tests; empty when there is no report or it does not parse (the
    runner writes fields such as a test's ``extra`` without JSON escaping)."""
    if path is None or not path.is_file():
        return {}
    try:
        tests = json.loads(path.read_text(errors="replace"))["tests"]
        return {name: (str(t["state"]), float(t["duration"])) for name, t in tests.items()
                if name[:1].isdigit()}
    except (ValueError, KeyError, TypeError):
        return {}
