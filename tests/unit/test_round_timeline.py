"""bench/probes/round_timeline.py: a round's stamps are matched across the processes by
their offsets, and the tracer reads a batch's last offset delta."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.probes.round_timeline import hop_table, read_traces, rounds
from tidewater.proto.records import encode_batch

TRACER = Path(__file__).resolve().parents[2] / "bench/probes/round_trace/sitecustomize.py"


def _tracer():
    """The tracer module, loaded by path (inert: TIDEWATER_ROUND_TRACE is not set)."""
    spec = importlib.util.spec_from_file_location("round_trace_sitecustomize", TRACER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_last_offset_delta_is_the_last_batchs() -> None:
    last_offset_delta = _tracer()._last_offset_delta
    one = encode_batch([(None, b"a"), (None, b"b"), (None, b"c")])
    assert last_offset_delta(one) == 2
    assert last_offset_delta(one + encode_batch([(None, b"d")])) == 0
    assert last_offset_delta(b"") == 0


def _write(folder: Path, pid: int, events: list[tuple[int, str, int]]) -> None:
    (folder / f"{pid}.trace").write_text("".join(f"{t} {n} {v}\n" for t, n, v in events))


def test_each_round_is_matched_by_its_offsets(tmp_path: Path) -> None:
    us = 1000  # the stamps are ns
    # Two rounds: offsets 0-1 (two records) from t=0, offset 2 from t=10 ms.
    _write(tmp_path, 10, [(0, "argv:-m_--broker-id_1", 0),
                          (100 * us, "P_in", 1), (150 * us, "P_app", 0), (150 * us, "P_last", 1),
                          (200 * us, "RF_enc", 1),
                          (600 * us, "F_in2", 2), (700 * us, "F_in3", 2),
                          (800 * us, "P_wr0", 0), (850 * us, "P_wr1", 0),
                          (10_100 * us, "P_in", 1), (10_120 * us, "P_app", 2), (10_120 * us, "P_last", 2),
                          (10_500 * us, "F_in2", 3), (10_550 * us, "F_in3", 3),
                          (10_600 * us, "P_wr0", 2), (10_640 * us, "P_wr1", 2)])
    for pid, broker_id, (received, built), (received2, built2) in (
            (20, 2, (300, 500), (10_300, 10_400)), (30, 3, (400, 650), (10_400, 10_450))):
        _write(tmp_path, pid, [(0, f"argv:-m_--broker-id_{broker_id}", 0),
                               (-50 * us, "F_out", 0),  # the long-poll before the round
                               (received * us, "FA_in", 0), (built * us, "F_out", 2),
                               (received2 * us, "FA_in", 0), (built2 * us, "F_out", 3)])
    _write(tmp_path, 40, [(0, "argv:bench", 0), (50 * us, "S_req", 0), (900 * us, "S_ans", 0),
                          (10_050 * us, "S_req", 0), (10_700 * us, "S_ans", 0)])
    # The receiver's own fetch stream must not be taken for the producer.
    _write(tmp_path, 50, [(0, "argv:-c", 0), (5 * us, "S_req", 0), (6 * us, "S_ans", 0),
                          (7 * us, "C_ans", 0)])

    found, other_hops = rounds(read_traces(str(tmp_path)), skip=0)

    assert len(found) == 2
    first = found[0]
    assert (first["send"], first["p_in"], first["p_app"], first["ans"]) == (
        50 * us, 100 * us, 150 * us, 900 * us)
    assert (first["fa_first"], first["fa_second"], first["fin_last"]) == (300 * us, 400 * us, 700 * us)
    assert (first["wr0"], first["wr1"]) == (800 * us, 850 * us)
    assert found[1]["fin_last"] == 10_550 * us
    assert other_hops["follower received -> next fetch built (each)"] == [
        200 * us, 250 * us, 100 * us, 50 * us]
    assert other_hops["next fetch built -> leader reads it (each)"] == [
        100 * us, 50 * us, 100 * us, 100 * us]
    table = {row[0]: row[1] for row in hop_table(found, other_hops)}
    assert table["round: producer send -> answer"] == "750"  # median of 850 and 650 µs
    assert table["leader read -> appended"] == "35"
    # the second request left 9 ms after the first answer: nothing had queued behind it
    assert table["producer: answer -> next request sent"] == "-"
