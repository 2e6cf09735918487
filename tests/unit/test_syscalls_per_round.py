"""``syscalls_per_round.read_counts``: perf stat's per-thread CSV read into counts per tid."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.probes.syscalls_per_round import read_counts

# As ``perf stat -x , --per-thread`` writes it: comm-tid, count, unit, event, run time, ...
PERF_CSV = """# started on Sun Nov 29 21:48:15 2026

python-16812,26867,,context-switches,2144983541,100.00,12.526,K/sec
grpc_global_tim-16835,130,,context-switches,2756035,100.00,47.169,K/sec
python-16812,2144.98,msec,task-clock,2144983541,100.00,0.716,CPUs utilized
python-16812,10737,,syscalls:sys_enter_sendmsg,2144983541,100.00,5.006,K/sec
python-16836,<not counted>,,syscalls:sys_enter_sendmsg,0,100.00,,
"""


@pytest.mark.timeout(10)
def test_counts_by_thread_and_event(tmp_path: Path) -> None:
    out = tmp_path / "perf.csv"
    out.write_text(PERF_CSV)
    assert read_counts(out) == {
        16812: {"switches": 26867.0, "CPU ms": 2144.98, "sendmsg": 10737.0},
        16835: {"switches": 130.0},
    }
