"""Where an acks=all round's milliseconds go, hop by hop, in the real cluster.

    .venv/bin/python bench/probes/round_timeline.py [--rate 1000] [--seconds 4] [--runs 1]
        [--producer threaded|asyncio] [--receiver consumer|aio_consumer|stream]

Starts a local 3-broker cluster (stopped by pid at the end) with
``bench/probes/round_trace`` on every process's ``PYTHONPATH``: its ``sitecustomize``
stamps, with the one monotonic clock all processes share, the producer's send and
answer (``ClientStream``), the leader's read of each request, its append, the
follower-answer encodes, the produce answer's write, and each follower's answer
received, applied and next fetch sent. Then it runs ``tidewater_side.paced_latency``
(as ``latency_breakdown.py`` does) and matches each produce round by its offsets
across the processes:

    producer send -> leader reads it -> appended -> follower f receives the records ->
    applied -> f's next fetch built -> the leader reads it (both followers) ->
    the answer's write starts -> written -> the producer has it

and prints the median and p90 of each hop in µs. A round's total here starts at the
producer's ``ClientStream.send`` (the pacer's hand-off to the I/O loop comes before it:
ack p50 minus this total).
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
TRACE_DIR = Path(__file__).resolve().parent / "round_trace"
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))


def _trace_into(folder: str) -> None:
    """Every process started from now on (and this one) stamps its hops into ``folder``."""
    os.environ["TIDEWATER_ROUND_TRACE"] = folder
    os.environ["PYTHONPATH"] = str(TRACE_DIR) + (
        os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    sys.path.insert(0, str(TRACE_DIR))
    import sitecustomize  # this process: the producer's stamps
    if getattr(sitecustomize, "_FOLDER", None) != folder:  # another sitecustomize came first
        raise RuntimeError(f"{sitecustomize.__file__} is not the round tracer")


def read_traces(folder: str) -> dict[int, dict[str, list[tuple[int, int]]]]:
    """pid -> event name -> [(ns, value)] in time order."""
    traces: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for path in Path(folder).glob("*.trace"):
        events: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for line in path.read_text().splitlines():
            t, name, value = line.split(" ")
            events[name].append((int(t), int(value)))
        for series in events.values():
            series.sort()
        traces[int(path.stem)] = events
    return traces


def _first_after(series: list[tuple[int, int]], after_ns: int, past_offset: int | None = None
                 ) -> int | None:
    """The time of the first event after ``after_ns`` (whose value is > ``past_offset``)."""
    i = bisect.bisect_right(series, (after_ns, sys.maxsize))
    for t, value in series[i:]:
        if past_offset is None or value > past_offset:
            return t
    return None


def _last_before(series: list[tuple[int, int]], before_ns: int) -> int | None:
    i = bisect.bisect_left(series, (before_ns, -sys.maxsize))
    return series[i - 1][0] if i else None


HOPS = (
    ("producer send -> leader read", "send", "p_in"),
    ("leader read -> appended", "p_in", "p_app"),
    ("appended -> 1st follower answer encoded", "p_app", "enc"),
    ("appended -> follower has records (first)", "p_app", "fa_first"),
    ("appended -> follower has records (second)", "p_app", "fa_second"),
    ("follower received -> next fetch built (each)", None, None),  # per follower
    ("next fetch built -> leader reads it (each)", None, None),
    ("appended -> both followers' fetches read", "p_app", "fin_last"),
    ("last fetch read -> answer write starts", "fin_last", "wr0"),
    ("answer write (await)", "wr0", "wr1"),
    ("answer written -> producer has it", "wr1", "ans"),
    ("round: producer send -> answer", "send", "ans"),
    ("producer: answer -> next request sent", None, None),
)
TURNAROUND = HOPS[-1][0]


def _broker_id(events: dict[str, list[tuple[int, int]]]) -> int | None:
    """The broker id in a process's ``argv:`` event (``-m --broker-id N``), if any."""
    for name in events:
        if name.startswith("argv:") and "--broker-id_" in name:
            return int(name.split("--broker-id_")[1].split("_")[0])
    return None


def rounds(traces: dict[int, dict[str, list[tuple[int, int]]]], skip: int
           ) -> tuple[list[dict[str, int]], dict[str, list[int]]]:
    """Each produce round's stamps (see HOPS for the names), and the hops that are not
    one per round (each follower's; the producer's turnaround) by label."""
    leader = next(pid for pid, ev in traces.items() if ev.get("P_in"))
    producer = next(pid for pid, ev in traces.items()
                    if ev.get("S_req") and not ev.get("C_ans") and pid != leader)
    lev, pev = traces[leader], traces[producer]
    # follower process events, and the leader's reads of that follower's fetches
    followers = [(ev, lev.get(f"F_in{_broker_id(ev)}", []))
                 for pid, ev in sorted(traces.items(), key=lambda item: _broker_id(item[1]) or 0)
                 if ev.get("F_out") and pid != leader]
    if not followers or any(not fetches for _, fetches in followers):
        raise RuntimeError("a follower's fetches were not seen at the leader")
    sends, answers = pev["S_req"], pev["S_ans"]
    apps, lasts, p_ins = lev["P_app"], lev["P_last"], lev["P_in"]
    writes0 = {base: t for t, base in lev.get("P_wr0", [])}
    writes1 = {base: t for t, base in lev.get("P_wr1", [])}
    # The producer's ClientStream carries only produce requests to the leader here (one
    # partition, one request in flight): its k-th send is the leader's k-th read and its
    # k-th answer that request's, counted from the end (the warm-up came first).
    n = min(len(sends), len(answers), len(p_ins), len(apps))
    out: list[dict[str, int]] = []
    other_hops: dict[str, list[int]] = defaultdict(list)
    for k in range(skip, n):
        t_app, base = apps[len(apps) - n + k]
        last = lasts[len(lasts) - n + k][1]
        row = {"send": sends[len(sends) - n + k][0], "ans": answers[len(answers) - n + k][0],
               "p_in": p_ins[len(p_ins) - n + k][0], "p_app": t_app}
        enc = _first_after(lev.get("RF_enc", []), t_app)
        if enc is not None:
            row["enc"] = enc
        received, read_at_leader = [], []
        for events, fetches in followers:
            # the first fetch built for an offset past the round's last record, the answer
            # received before it, and the leader's read of that fetch
            f_out = _first_after(events["F_out"], t_app, past_offset=last)
            fa_in = _last_before(events["FA_in"], f_out) if f_out is not None else None
            f_in = _first_after(fetches, f_out, past_offset=last) if f_out is not None else None
            if fa_in is None or f_in is None:
                break
            received.append(fa_in)
            read_at_leader.append(f_in)
            other_hops["follower received -> next fetch built (each)"].append(f_out - fa_in)
            other_hops["next fetch built -> leader reads it (each)"].append(f_in - f_out)
        else:
            row["fa_first"], row["fa_second"] = min(received), max(received)
            row["fin_last"] = max(read_at_leader)
        if base in writes0 and base in writes1:
            row["wr0"], row["wr1"] = writes0[base], writes1[base]
        if k + 1 < n:
            # Records due meanwhile went in the next request, sent from the answer's path
            # (a next send more than 2 ms on had nothing queued: not a turnaround).
            turnaround = sends[len(sends) - n + k + 1][0] - row["ans"]
            if 0 <= turnaround < 2_000_000:
                other_hops[TURNAROUND].append(turnaround)
        out.append(row)
    if out and not any("fa_first" in row for row in out):
        # Seen when a tracer wrapper no longer fitted the broker (every fetch failed):
        # the ISR shrank to the leader and the rounds timed were not replicated.
        raise RuntimeError("no round's records reached both followers: the rounds were "
                           "not replicated (see the brokers' logs)")
    return out, other_hops


def hop_table(rows: list[dict[str, int]], other_hops: dict[str, list[int]]) -> list[tuple[str, str, str, str]]:
    table = []
    for label, start, end in HOPS:
        if start is None:
            values = other_hops.get(label, [])
        else:
            values = [r[end] - r[start] for r in rows if start in r and end in r]
        if not values:
            table.append((label, "-", "-", "0"))
            continue
        values.sort()
        table.append((label, f"{statistics.median(values) / 1000:,.0f}",
                      f"{values[int(len(values) * 0.9)] / 1000:,.0f}", f"{len(values):,}"))
    return table


def analyse(folder: str, skip: int) -> list[tuple[str, str, str, str]]:
    rows, other_hops = rounds(read_traces(folder), skip)
    return hop_table(rows, other_hops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--skip", type=int, default=100, help="rounds left out at the start")
    parser.add_argument("--producer", default="threaded")
    parser.add_argument("--receiver", default="consumer")
    args = parser.parse_args(argv)
    trace_folder = tempfile.mkdtemp(prefix="tw-round-trace-")
    _trace_into(trace_folder)
    from bench import tidewater_side
    from bench.bench_common import format_table

    with tidewater_side.paced_cluster("tw-round-timeline-") as (cluster, _directory):
        bootstrap = cluster.bootstrap
        result = tidewater_side.paced_latency(bootstrap, "paced", args.record_bytes,
                                              int(args.rate * args.seconds), args.rate,
                                              producer_kind=args.producer,
                                              receiver_kind=args.receiver)
    import sitecustomize
    sitecustomize._flush()
    rows, other_hops = rounds(read_traces(trace_folder), args.skip)
    ack, e2e = result["ack"], result["e2e"]
    print(f"{args.rate:,.0f}/s of {args.record_bytes} B for {args.seconds} s, producer {args.producer}, "
          f"receiver {args.receiver}; load {os.getloadavg()[0]:.2f}; ack p50 {ack.p50_ms:.2f} ms, "
          f"e2e p50 {e2e.p50_ms:.2f} ms; {len(rows):,} rounds matched; traces in {trace_folder}")
    print(format_table(("hop", "p50 µs", "p90 µs", "rounds"), hop_table(rows, other_hops),
                       align_right=(False, True, True, True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
