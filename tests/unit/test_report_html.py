"""report.html's pure parts: axes, fault intervals, which partitions get charts, the page."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from tidewater.audit.health import ReplicaSample
from tidewater.audit.report_html import (
    Fault,
    TimeRange,
    eventful_partitions,
    fault_intervals,
    nice_ticks,
    render_html,
    svg_line_chart,
    time_label,
    time_ticks,
)

T0 = 1_700_000_000_000


@given(st.floats(-1e6, 1e6), st.floats(0, 1e6))
@example(lo=-5e-324, extent=6.0)  # lo / step underflowed to -0.0: the first tick was 0
def test_nice_ticks_cover_the_range_in_round_steps(lo, extent):
    ticks = nice_ticks(lo, lo + extent)
    assert ticks[0] <= lo and ticks[-1] >= lo + extent
    assert 2 <= len(ticks) <= 12
    steps = {round(b - a, 6) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(steps) == 1


def test_time_ticks_are_round_wall_clock_times_inside_the_range():
    ticks = time_ticks(T0 + 300, T0 + 95_000)  # 22:13:20.3 to 22:14:55 UTC
    assert [time_label(t) for t in ticks] == ["22:13:30", "22:13:45", "22:14:00", "22:14:15",
                                             "22:14:30", "22:14:45"]
    assert [time_label(t) for t in time_ticks(T0, T0 + 3_600_000)][:2] == ["22:20:00",
                                                                          "22:30:00"]


def test_fault_intervals_pair_each_fault_with_its_undo():
    entries = [
        {"unix_ms": T0, "action": "kill", "node": "broker-2", "ok": True},
        {"unix_ms": T0 + 100, "action": "pause", "node": "controller", "ok": True},
        {"unix_ms": T0 + 200, "action": "isolate", "node": "broker-3", "ok": False},
        {"unix_ms": T0 + 3000, "action": "start", "node": "broker-2", "ok": True},
        {"unix_ms": T0 + 4000, "action": "isolate", "node": "broker-1", "ok": True},
    ]
    assert fault_intervals(entries, T0 + 9000) == [
        Fault("broker-2", "kill", T0, T0 + 3000),
        Fault("controller", "pause", T0 + 100, T0 + 9000),
        Fault("broker-1", "isolate", T0 + 4000, T0 + 9000),
    ]
    healed = fault_intervals(entries + [{"unix_ms": T0 + 5000, "action": "heal-all",
                                         "node": "", "ok": True}], T0 + 9000)
    assert [f.end_ms for f in healed] == [T0 + 3000, T0 + 5000, T0 + 5000]
    assert Fault("broker-12", "kill", 0, 1).broker_id == 12
    assert Fault("controller", "kill", 0, 1).broker_id is None


def _samples(topic: str, brokers=(1, 2, 3), isr=3) -> list[ReplicaSample]:
    return [ReplicaSample(T0 + i * 1000, b, topic, 0, float(i), float(i), 1.0, float(isr),
                          1.0 if b == brokers[0] else 0.0)
            for i in range(5) for b in brokers]


def _health(topic: str, under_ms: int = 0) -> dict:
    return {"topic": topic, "partition": 0, "replicas_seen": 3, "observed_ms": 4000,
            "offline_ms": 0, "under_replicated_ms": under_ms, "isr_shrinks": 0,
            "isr_expands": 0, "leader_epochs_seen": [1]}


def test_only_partitions_where_something_happened_get_charts():
    samples = (_samples("quiet") + _samples("shrunk") + _samples("on-faulted", (4, 5, 6))
               + _samples("violated"))
    health = [_health("quiet"), _health("shrunk", 2000), _health("on-faulted"),
              _health("violated")]
    faults = [Fault("broker-5", "kill", T0 + 1000, T0 + 2000)]
    eventful = eventful_partitions(health, samples, faults, {("violated", 0)})
    assert eventful == {("on-faulted", 0): ["fault on broker 5"],
                        ("shrunk", 0): ["under-replicated 2.0 s"],
                        ("violated", 0): ["violation"]}
    report = {"passed": True, "rules": [], "partition_health": health}
    page = render_html(report, samples, [(T0, 0)], {}, faults=faults,
                       violated={("violated", 0)})
    charted = re.findall(r"<h3>([^<]+)</h3>", page)
    assert charted == ["on-faulted-0", "shrunk-0", "violated-0"]
    assert "<td class='name'>quiet</td>" in page  # the rest: one table row each


def test_chaos_heading_only_for_chaos_runs_and_nothing_loads_from_the_network():
    report = {"passed": False, "partition_health": [_health("t" * 200)], "rules": [
        {"name": "offsets_contiguous", "description": "d", "passed": False, "skipped": None,
         "checked": 3, "violations": 1, "parquet": "violations/rule=offsets_contiguous",
         "sample": [{"broker_id": 1, "topic": "t" * 200, "partition": 0, "offset": 4,
                     "detail": "gap"}]},
        {"name": "epochs_monotonic", "description": "e", "passed": True, "skipped": None,
         "checked": 3, "violations": 0, "parquet": None, "sample": []}]}
    plain = render_html(report, _samples("t" * 200), [], {"broker-1": [(T0, 1.0)]})
    assert "Chaos timeline" not in plain and "Timeline (from metrics)" in plain
    chaos = render_html(report, _samples("t" * 200), [], {}, faults=[])
    assert "Chaos timeline" in chaos
    for page in (plain, chaos):
        assert "<script" not in page.lower()
        assert "Content-Security-Policy" in page and "default-src 'none'" in page
        assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
        # The verdict and the failing rule come before the table of every rule.
        assert page.index("FAIL") < page.index("offsets_contiguous: ") < page.index("Every rule")
        assert "overflow-wrap:anywhere" in page and "<td class='name'>" + "t" * 200 in page


def test_coinciding_lines_are_drawn_widest_first_and_axes_have_ticks():
    span = TimeRange(T0, T0 + 60_000)
    same = [(T0 + i * 10_000, float(i * 10)) for i in range(7)]
    svg = svg_line_chart("HW and LEO", {"HW broker 1": same, "LEO broker 1": same}, span)
    widths = [float(w) for w in re.findall(r'<polyline[^>]*stroke-width="([\d.]+)"', svg)]
    assert len(widths) == 2 and widths[0] > widths[1]
    y_labels = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert y_labels == ["0", "20", "40", "60"]
    assert re.findall(r">(\d\d:\d\d:\d\d)</text>", svg)[:2] == ["22:13:20", "22:13:30"]


def test_fault_log_garbage_is_a_typed_error_and_a_torn_last_line_is_skipped(tmp_path):
    import pytest

    from tidewater.audit.report_html import FaultLogError, read_fault_log

    path = tmp_path / "faults.jsonl"
    good = '{"unix_ms": 5, "action": "kill", "node": "broker-1", "ok": true}\n'
    path.write_text(good + '{"unix_ms": 9, "act')  # the writer died mid-line
    assert read_fault_log(path) == [{"unix_ms": 5, "action": "kill", "node": "broker-1",
                                     "ok": True}]
    for text in ("[1]\n", '{"action": "kill"}\n', "not json\n" + good):
        path.write_text(text)
        with pytest.raises(FaultLogError):
            read_fault_log(path)
    with pytest.raises(FaultLogError):
        read_fault_log(tmp_path / "missing.jsonl")
