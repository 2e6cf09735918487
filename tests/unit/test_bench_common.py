"""Pure helpers of the cluster benchmark: percentiles, summaries, table, pacing, payloads."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_common import (
    Row,
    Throughput,
    format_table,
    format_value,
    latency_summary,
    median,
    percentile,
    ratio,
    results_table,
)
from bench.peer_nats import server_config
from bench.probes.latency_probe import (
    STAMP_BYTES,
    due_count,
    read_stamp,
    run_paced,
    stamped_payload,
)


def test_percentile_matches_linear_interpolation():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 10
    assert percentile(values, 50) == 5.5
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile([7.0], 99.9) == 7.0


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200),
       st.floats(min_value=0, max_value=100))
def test_percentile_within_bounds_and_monotonic(values, q):
    values = sorted(values)
    p = percentile(values, q)
    assert values[0] - 1e-6 <= p <= values[-1] + 1e-6
    assert percentile(values, min(100, q + 1)) >= p - 1e-6


def test_latency_summary_of_a_known_distribution():
    samples = list(range(1, 1001))  # 1..1000 ms, unsorted input is fine
    samples.reverse()
    s = latency_summary(samples)
    assert s.count == 1000
    assert s.p50_ms == pytest.approx(500.5)
    assert s.p99_ms == pytest.approx(990.01)
    assert s.p999_ms == pytest.approx(999.001)
    assert s.max_ms == 1000
    assert s.mean_ms == pytest.approx(500.5)
    with pytest.raises(ValueError):
        latency_summary([])
    assert median([3, 1, 2]) == 2


def test_throughput_and_ratio():
    t = Throughput(records=16_300, payload_bytes=16_300 * 1024, elapsed_s=1.0)
    assert t.records_per_s == 16_300
    assert t.mb_per_s == pytest.approx(16.69, abs=0.01)
    assert Throughput(1, 1, 0).records_per_s == 0
    assert ratio(30, 10) == 3
    assert ratio(None, 10) is None and ratio(1, None) is None and ratio(1, 0) is None


def test_format_value():
    assert format_value(None) == "-"
    assert format_value(126565.4) == "126,565"
    assert format_value(120.4) == "120"
    assert format_value(12.24) == "12.2"
    assert format_value(5.281) == "5.28"
    assert format_value(0.5981) == "0.598"
    assert format_value(0) == "0"
    assert format_value(math.nan) == "nan"


def test_format_table_aligns_columns():
    text = format_table(("name", "value"), [("a", "1"), ("longer", "1,000")],
                        align_right=(False, True))
    lines = text.splitlines()
    assert lines[0] == "name    value"
    assert lines[1] == "------  -----"
    assert lines[2] == "a           1"
    assert lines[3] == "longer  1,000"
    with pytest.raises(ValueError):
        format_table(("a", "b"), [("only one",)])


def test_results_table_has_ratio_and_missing_values():
    rows = [Row("produce", "acks=all 1 KiB", "MB/s", 50.0, 16.7, "note"),
            Row("failover", "median", "s", 2.5, None, "", better="lower")]
    text = results_table(rows)
    assert "2.99x" in text
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[3].split()[:2] == ["failover", "median"]
    assert rows[0].to_json()["ratio_tidewater_over_peer"] == pytest.approx(50 / 16.7)
    assert rows[1].to_json()["ratio_tidewater_over_peer"] is None


def test_results_table_prints_the_earlier_figures_beside_their_rows():
    rows = [Row("latency", "e2e @1,000/s p50", "ms", 1.9, 1.2, "paced", better="lower"),
            Row("latency", "e2e @1,000/s p99", "ms", 3.5, 1.8, "", better="lower")]
    lines = results_table(rows, {("latency", "e2e @1,000/s p50", "ms"): "2.53 (2.15x)"}
                          ).splitlines()
    assert lines[0].split()[-2:] == ["earlier", "note"]
    assert lines[2].split()[-2:] == ["(2.15x)", "paced"]
    assert lines[3].rstrip().endswith("1.94x")  # no earlier figure, no note: nothing after
    assert "earlier" not in results_table(rows)


def test_every_earlier_figure_names_a_row_the_cluster_bench_prints(tmp_path):
    """A renamed row would lose its earlier figure without a word: the names must match
    what ``cluster_bench`` builds (here with no measurement: every row is still named)."""
    from bench.bench_common import GIB
    from bench.cluster_bench import QUICK, TLS_WORKLOADS, Bench
    from bench.earlier_figures import EARLIER, EARLIER_LIMITS, EARLIER_TLS

    bench = Bench(QUICK, tmp_path, run_peer=False, run_tidewater=False)
    bench.tw[("produce_plain", "all", 1024)] = None  # rows printed once measured or failed
    bench.tw["restart"] = {"log_bytes": GIB}
    bench.build_rows()
    named = {(r.section, r.metric, r.unit) for r in bench.rows}
    assert [key for key in EARLIER if key not in named] == []
    workloads = {label for label, _client, _kind in TLS_WORKLOADS}
    assert [key for key in EARLIER_TLS if key[0] not in workloads] == []
    assert set(EARLIER_LIMITS) <= {"python start + import broker.process"}
    from bench.earlier_figures import EARLIER_IDEMPOTENCE
    from bench.idempotence_bench import SETTINGS
    assert set(EARLIER_IDEMPOTENCE) <= set(SETTINGS)


def test_stamped_payload_round_trip():
    filler = bytes(range(256)) * 8
    payload = stamped_payload(1024, 1_795_296_072_767_000_123, filler)
    assert len(payload) == 1024
    assert read_stamp(payload) == 1_795_296_072_767_000_123
    assert payload[STAMP_BYTES:] == filler[: 1024 - STAMP_BYTES]
    with pytest.raises(ValueError):
        stamped_payload(4, 0, filler)


def test_due_count_and_run_paced():
    assert due_count(0, 1000) == 0
    assert due_count(0.0001, 1000) == 1
    assert due_count(0.0015, 1000) == 2
    assert due_count(1.0, 1000) == 1001
    due: list[int] = []
    achieved = run_paced(50, 5000, lambda i, ns: due.append(ns))
    assert len(due) == 50
    steps = {b - a for a, b in zip(due, due[1:], strict=False)}
    assert steps <= {199_999, 200_000, 200_001}  # 1/5000 s apart, as scheduled
    assert achieved > 0


def test_run_paced_sends_no_record_before_it_is_due():
    start = time.time_ns()
    late_ns: list[int] = []
    run_paced(40, 2000, lambda i, due_ns: late_ns.append(time.time_ns() - due_ns))
    assert len(late_ns) == 40
    assert min(late_ns) >= 0  # it sleeps until a record is due, never sends early
    assert time.time_ns() - start >= 39 * 500_000  # 40 records 1/2000 s apart


def test_nats_server_config_lists_the_other_routes(tmp_path):
    text = server_config("n1", 4222, 6222, [6223, 6224], tmp_path / "n1")
    assert 'listen: "127.0.0.1:4222"' in text
    assert f'store_dir: "{tmp_path / "n1"}"' in text
    assert '"nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"' in text
    assert "0.0.0.0" not in text


def test_machine_limits_move_every_byte_and_leave_nothing(tmp_path):
    from bench.machine_limits import disk_write, loopback_tcp

    for mode in ("none", "end", "each"):
        t = disk_write(tmp_path, 1024 * 1024 + 100, chunk_bytes=64 * 1024, fsync=mode)
        assert t.payload_bytes == 1024 * 1024 + 100
        assert t.elapsed_s > 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        disk_write(tmp_path, 1, fsync="sometimes")
    t = loopback_tcp(4 * 1024 * 1024 + 7, chunk_bytes=64 * 1024)
    assert t.payload_bytes == 4 * 1024 * 1024 + 7


def test_last_log_load_reads_the_brokers_last_line():
    from bench.tidewater_side import last_log_load

    text = ("2026-11-21 21:54:24,234 broker-3 INFO tidewater.broker: loaded 1 logs in 0.01s "
            "(clean shutdown before: True)\n"
            "2026-11-21 21:58:00,000 broker-3 INFO tidewater.broker: loaded 14 logs in 2.35s "
            "(clean shutdown before: False)\n")
    assert last_log_load(text) == (14, 2.35, False)
    assert last_log_load("nothing here") is None


def test_cpu_meter_counts_this_process_and_children():
    import os
    import subprocess
    import time

    from bench.bench_common import CpuMeter, process_cpu_s, with_cpu

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while process_cpu_s(child.pid) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_cpu_s(child.pid) >= 0.25
        with CpuMeter([os.getpid(), child.pid]) as meter:
            sum(i * i for i in range(300_000))
        assert 0 < meter.cpu_s < 5
        t = with_cpu([os.getpid()], lambda: Throughput(10, 10_000_000, 1.0))
        assert t.cpu_s is not None and t.cpu_s >= 0
    finally:
        child.kill()
        child.wait()
    assert process_cpu_s(child.pid) == 0.0
    assert Throughput(1, 2_000_000, 1.0, cpu_s=0.5).mb_per_cpu_s == 4.0
    assert Throughput(1, 1, 1.0).mb_per_cpu_s is None


def test_settle_page_cache_writes_back_and_reports_seconds(tmp_path):
    from bench.bench_common import dirty_page_cache_bytes, settle_page_cache

    (tmp_path / "dirty").write_bytes(b"x" * (1 << 20))
    before = dirty_page_cache_bytes()
    assert before is None or before >= 0
    assert 0 <= settle_page_cache(timeout_s=30) < 30 or dirty_page_cache_bytes() >= 64 << 20


# ---------------------------------------------------------------- context switches


def test_parse_context_switches_adds_voluntary_and_involuntary():
    from bench.bench_common import parse_context_switches

    status = ("Name:\tpython\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t120\n"
              "nonvoluntary_ctxt_switches:\t7\n")
    assert parse_context_switches(status) == 127
    assert parse_context_switches("Name:\tx\n") == 0


def test_switch_counter_counts_threads_born_and_ended_during_the_run():
    from bench.bench_common import SwitchCounter

    counter = SwitchCounter()
    counter.record("leader", {10: 500, 11: 40})         # before the run: a baseline
    counter.record("leader", {10: 530, 11: 45, 12: 3})  # thread 12 born during the run
    counter.record("leader", {10: 560, 12: 9})          # thread 11 ended after 45
    counter.record("receiver", {20: 1000})              # first seen mid-run: its baseline
    counter.record("receiver", {20: 1016})
    assert counter.totals() == {"leader": 60 + 5 + 9, "receiver": 16}
    assert counter.by_thread() == {("leader", 10): 60, ("leader", 11): 5, ("leader", 12): 9,
                                   ("receiver", 20): 16}


def test_thread_context_switches_reads_this_process():
    import os
    import threading

    from bench.bench_common import thread_context_switches, thread_names

    woken = threading.Event()
    worker = threading.Thread(target=woken.wait, args=(5,))
    worker.start()
    try:
        counts = thread_context_switches(os.getpid())
        assert os.getpid() in counts and worker.native_id in counts
        assert set(thread_names(os.getpid())) >= {os.getpid(), worker.native_id}
    finally:
        woken.set()
        worker.join()
    assert thread_context_switches(2 ** 22 + 12345) == {}  # no such process


# ---------------------------------------------------------------- stall probe


def test_slow_windows_group_acks_due_close_together():
    from bench.probes.stall_probe import slow_windows

    slow = [(100.00, 9.0), (100.05, 30.0), (100.20, 12.0), (101.00, 8.5)]
    windows = slow_windows(slow, gap_s=0.2)
    assert [(w.start_s, w.end_s, w.worst_ms, w.records) for w in windows] == [
        (100.00, 100.20, 30.0, 3), (101.00, 101.00, 8.5, 1)]


def test_canary_late_inside_a_window_names_the_paused_cpu():
    from bench.bench_common import parse_canary
    from bench.probes.stall_probe import attach_canary, slow_windows

    windows = slow_windows([(100.00, 60.0), (100.01, 55.0), (200.00, 20.0)])
    # CPU 1's canary woke 63 ms late just after the first window's records were due: it
    # stood still inside it. CPU 0's late wake-up is far from any window; no canary was
    # late in the window at 200 s.
    canary = parse_canary("100.0700 63.00 1\n150.0000 6.00 0\n")
    outside = attach_canary(windows, canary)
    assert windows[0].paused_cpus == [1] and windows[0].canary == [(100.07, 63.0, 1)]
    assert windows[1].paused_cpus == []
    assert outside == [(150.0, 6.0, 0)]


def test_machine_pause_watch_reports_a_stopped_canary_as_a_pause():
    # SIGSTOP of one canary for 60 ms is what a host not running that vCPU looks like.
    import os
    import signal

    from bench.bench_common import MachinePauseWatch

    with MachinePauseWatch(sleep_ms=1.0, late_ms=5.0) as watch:
        time.sleep(0.3)  # the canaries start up and sleep on time
        canary = watch._canaries[0]
        os.kill(canary.pid, signal.SIGSTOP)
        time.sleep(0.06)
        os.kill(canary.pid, signal.SIGCONT)
        time.sleep(0.1)
    pauses = watch.pauses(pause_ms=40.0)
    stopped_cpu = sorted(os.sched_getaffinity(0))[0]
    # (A real pause of the machine may add the other CPU's canary: not asserted against.)
    assert any(cpu == stopped_cpu and ms >= 50 for _, ms, cpu in pauses.late)
    assert "worst" in pauses.describe()
    assert canary.poll() is not None  # the canaries are stopped with the block


def test_fill_page_cache_reads_a_sparse_file_into_the_cache(tmp_path, monkeypatch):
    from bench import bench_common

    size = bench_common.fill_page_cache(tmp_path, size_bytes=(24 << 20) + 5, chunk_bytes=8 << 20)
    path = tmp_path / bench_common.PAGE_CACHE_FILL_NAME
    assert size == 24 << 20 and path.stat().st_size == size  # whole chunks only
    assert path.stat().st_blocks == 0  # sparse: nothing written to the disk
    # The default size is MemAvailable less the reserve; too little memory: no file.
    monkeypatch.setattr(bench_common, "mem_available_bytes", lambda: (1 << 30) + (4 << 20))
    path.unlink()
    assert bench_common.fill_page_cache(tmp_path) == 0 and not path.exists()
    monkeypatch.setattr(bench_common, "mem_available_bytes", lambda: (1 << 30) + (16 << 20))
    assert bench_common.fill_page_cache(tmp_path, chunk_bytes=8 << 20) == 16 << 20


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="no /proc/meminfo")
def test_mem_available_reads_proc_meminfo():
    from bench import bench_common

    total_kib = next(int(line.split()[1]) for line in open("/proc/meminfo")
                     if line.startswith("MemTotal:"))
    assert 0 < bench_common.mem_available_bytes() <= total_kib * 1024


def test_page_cache_growth_times_only_the_bytes_past_the_skip_and_leaves_no_file(tmp_path):
    from bench.bench_common import KIB
    from bench.machine_limits import page_cache_growth

    t, system_s = page_cache_growth(tmp_path, 8 * 256 * KIB, 2 * 256 * KIB)
    assert t.payload_bytes == 6 * 256 * KIB and t.elapsed_s > 0
    assert system_s >= 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        page_cache_growth(tmp_path, 256 * KIB, 256 * KIB)


def test_summed_adds_samples_up_and_leaves_failed_ones_out():
    from bench.bench_common import Throughput, summed

    a = Throughput(1000, 1_000_000, 1.0, cpu_s=3.0)  # 1.0 MB/s
    b = Throughput(3000, 3_000_000, 1.5, cpu_s=5.0)  # 2.0 MB/s
    both = summed([a, b])
    assert (both.records, both.payload_bytes, both.elapsed_s, both.cpu_s) == (4000, 4_000_000,
                                                                            2.5, 8.0)
    assert both.mb_per_s == pytest.approx(1.6)  # bytes over time, not the mean 1.5 of rates
    assert summed([a, None]) == a
    assert summed([None, None]) is None
    assert summed([a, Throughput(1, 1, 1.0)]).cpu_s is None  # a sample without CPU: none
