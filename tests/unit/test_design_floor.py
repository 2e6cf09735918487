"""bench/probes/design_floor.py: the floor's leader answers only what both followers hold,
and the real cluster's figures are read from the right section of latency_breakdown's output."""

from __future__ import annotations

import asyncio

from bench.probes.design_floor import LeaderState, Watermark, parse_breakdown

RECORD_BYTES = 16


def test_high_watermark_is_the_slower_followers_end() -> None:
    state = LeaderState(RECORD_BYTES)
    assert state.append(bytes(2 * RECORD_BYTES)) == 0
    state.follower_at(2, 2)
    state.follower_at(3, 1)
    assert state.high_watermark.value == 1
    state.follower_at(3, 2)
    assert state.high_watermark.value == 2
    assert state.read(1, 2) == bytes(RECORD_BYTES)


def test_a_waiter_is_woken_once_the_mark_passes_its_offset_or_at_its_timeout() -> None:
    async def scenario() -> tuple[bool, bool]:
        mark = Watermark()
        waiting = asyncio.ensure_future(mark.wait_past(1, None))
        mark.advance(1)
        await asyncio.sleep(0)
        still_waiting = not waiting.done()
        mark.advance(2)
        await asyncio.wait_for(waiting, 1)
        await asyncio.wait_for(mark.wait_past(5, 0.01), 1)  # returns at its timeout
        return still_waiting, waiting.done()

    assert asyncio.run(scenario()) == (True, True)


BREAKDOWN = """\
load average 1.50; run 4.2 s; leader broker-1; achieved 1,000/s
ack  p50   2.26 ms  p99   5.59 ms  p99.9   8.00 ms
e2e  p50   2.38 ms  p99   6.32 ms  p99.9   9.00 ms
CPU seconds per second of run (2 cores = 2.0):
  broker-1                        0.60
  broker-2                        0.19
  client (producer + receiver)    0.51
  total                           1.30
context switches per round (2,800 produce requests; all threads):
  broker-1                         17.7
  broker-2                          5.3
"""


def test_the_cpu_figures_come_from_the_cpu_section_only() -> None:
    found = parse_breakdown(BREAKDOWN)
    assert found["cpu_s_per_s"] == {"broker-1": 0.60, "broker-2": 0.19,
                                    "client (producer + receiver)": 0.51}
    assert found["rounds"] == 2800
    assert found["e2e"] == (2.38, 6.32) and found["ack"] == (2.26, 5.59)
    assert (found["load"], found["elapsed_s"]) == (1.5, 4.2)
