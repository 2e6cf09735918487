"""Where a paced acks=all record's ack latency goes, threaded Producer against AsyncProducer.

    .venv/bin/python bench/probes/aio_ack_split.py [--rate 1000] [--seconds 3] [--blocks 3]

One local 3-broker cluster; each block runs every variant in turn (each on a fresh
topic, 1 partition, RF=3, no receiver), paced as ``tidewater_side`` paces them:
"threaded" (``Producer``, ``run_paced``), "asyncio" (``AsyncProducer`` on uvloop, the
whole-ms pacer of ``_paced_async_sends``), "asyncio-at-once" (the same with the answer
path before lat37: what queued behind an answer is sent from the answer itself). Per
record: due, ``send`` called, acked; per request (``ClientStream.send`` to the reader's
``_dispatch`` of its answer, by correlation id): the round trip. Prints per run (ms):

- ``late``: ``send`` called minus due (the pacer's lateness);
- ``ack/send``: ack minus ``send`` called (the producer's own part);
- ``rtt``: one request's round trip on its stream;
- ``gap``: an answer's dispatch to the next ``ClientStream.send``; records per request;
- ``wait``: a record's ``send`` called to its request's ``ClientStream.send``;
- ``post``: its request's answer dispatched to its ack callback;
- ``missed``: the share of records whose ``send`` came within 0.25 ms after a request
  left (uniform arrivals: about 0.25 / round; more means they fall due alongside answers
  and wait a whole round).
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.probes.latency_probe import run_paced, run_paced_async  # noqa: E402
from tidewater.client import streams  # noqa: E402

KIB = 1024
VARIANTS = ("threaded", "asyncio", "asyncio-at-once")


class Trace:
    """Stream sends and answer dispatches by correlation id (ProduceStream only)."""

    def __init__(self) -> None:
        self.sent_ns: dict[int, int] = {}
        self.answered_ns: dict[int, int] = {}
        self._send = streams.ClientStream.send
        self._dispatch = streams.ClientStream._dispatch

    def install(self) -> None:
        trace = self

        def send(stream, request, callback, timeout_s, *, answered=True):
            ok = trace._send(stream, request, callback, timeout_s, answered=answered)
            if not stream._ordered:
                trace.sent_ns[request.correlation_id * 1000 + id(stream) % 1000] = time.perf_counter_ns()
            return ok

        def dispatch(stream, response):
            if not stream._ordered:
                trace.answered_ns[response.correlation_id * 1000 + id(stream) % 1000] = time.perf_counter_ns()
            trace._dispatch(stream, response)

        streams.ClientStream.send = send  # type: ignore[method-assign]
        streams.ClientStream._dispatch = dispatch  # type: ignore[method-assign]

    def reset(self) -> None:
        self.sent_ns.clear()
        self.answered_ns.clear()

    def per_record(self, rows: list[tuple[int, int, int]]) -> tuple[list[float], list[float]]:
        """Per record: ``send`` called to its request's ``ClientStream.send`` (the wait
        behind the request out), and its request's answer dispatch to its ack callback."""
        sends = sorted((t, k) for k, t in self.sent_ns.items())
        times = [t for t, _k in sends]
        waits, posts = [], []
        for _d, c, a in rows:
            i = bisect.bisect_left(times, c)
            if i < len(times) and sends[i][1] in self.answered_ns:
                waits.append((times[i] - c) / 1e6)
                posts.append((a - self.answered_ns[sends[i][1]]) / 1e6)
        return waits, posts

    def just_missed(self, rows: list[tuple[int, int, int]], window_ms: float = 0.25) -> float:
        """Share of records whose ``send`` came within ``window_ms`` after a request went
        out: they wait a whole round behind it (phase-locked to the answers)."""
        times = sorted(self.sent_ns.values())
        hits = 0
        for _d, c, _a in rows:
            i = bisect.bisect_left(times, c)
            if i > 0 and (c - times[i - 1]) / 1e6 <= window_ms:
                hits += 1
        return hits / max(1, len(rows))

    def split(self) -> tuple[list[float], list[float]]:
        """Round trips, and answer -> next send gaps (ms)."""
        rtt = [(self.answered_ns[k] - t) / 1e6 for k, t in self.sent_ns.items() if k in self.answered_ns]
        sends = sorted(self.sent_ns.values())
        gaps = []
        for t in sorted(self.answered_ns.values()):
            i = bisect.bisect_left(sends, t)
            if i < len(sends):
                gaps.append((sends[i] - t) / 1e6)
        return rtt, gaps


def run_threaded(bootstrap: str, topic: str, count: int, rate: float) -> list[tuple[int, int, int]]:
    from tidewater.client.producer import Producer

    rows: list[tuple[int, int, int]] = []
    producer = Producer(bootstrap, acks=-1, batch_size_bytes=256 * KIB, linger_ms=0,
                        buffer_memory_bytes=64 * 1024 * KIB)
    try:
        producer.send(topic, b"x" * 1024, partition=0).result(timeout=30)
        value = os.urandom(1024)
        start_ns, start_pc = time.time_ns(), time.perf_counter_ns()

        def send_one(_i: int, due_ns: int) -> None:
            called = time.perf_counter_ns()
            due = start_pc + (due_ns - start_ns)
            fut = producer.send(topic, value, partition=0)
            fut.add_done_callback(lambda f, d=due, c=called: rows.append((d, c, time.perf_counter_ns())))

        run_paced(count, rate, send_one)
        producer.flush(timeout_s=60)
    finally:
        producer.close(timeout_s=30)
    return rows


def at_once_producer() -> type:
    """The AsyncProducer with its answer path before 2026-11-30 (lat37): what queued
    behind an answered request is sent from the answer itself, in the same loop pass."""
    from tidewater.client import aio_producer as ap

    class AtOnce(ap.AsyncProducer):
        def _on_response(self, groups, response, transport_error) -> None:
            for tp, batches in groups:
                ap.release_in_flight(self._in_flight, tp)
                self._records_in_flight -= ap._record_count(batches)
            if ap.settle_produce_answer(self, groups, response, transport_error, ap._now_ms()):
                self.metadata.invalidate()
                self._wake_for_waiting()
            else:
                self._send_behind([tp for tp, _ in groups])  # at once, not a pass later

    return AtOnce


async def run_asyncio(bootstrap: str, topic: str, count: int, rate: float,
                      at_once: bool = False) -> list[tuple[int, int, int]]:
    from tidewater.client.aio_producer import AsyncProducer

    producer_type = at_once_producer() if at_once else AsyncProducer
    rows: list[tuple[int, int, int]] = []
    async with producer_type(bootstrap, acks=-1, batch_size_bytes=256 * KIB, linger_ms=0,
                             buffer_memory_bytes=64 * 1024 * KIB) as producer:
        await (await producer.send(topic, b"x" * 1024, partition=0))
        value = os.urandom(1024)
        start_ns, start_pc = time.time_ns(), time.perf_counter_ns()

        async def send_one(_i: int, due_ns: int) -> None:
            called = time.perf_counter_ns()
            due = start_pc + (due_ns - start_ns)
            fut = await producer.send(topic, value, partition=0)
            fut.add_done_callback(lambda f, d=due, c=called: rows.append((d, c, time.perf_counter_ns())))

        await run_paced_async(count, rate, send_one, whole_ms_sleeps=True)  # as the bench's
        await producer.flush(timeout_s=60)
    return rows


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], choices=VARIANTS)
    args = parser.parse_args(argv)
    count = int(args.rate * args.seconds)
    variants = args.variant or list(VARIANTS)
    trace = Trace()
    trace.install()
    summary: dict[str, list[list[float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="tw-aio-ack-split-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory)
        try:
            bootstrap = cluster.start()
            print(f"{'block':>5s} {'producer':15s} {'ack p50':>8s} {'ack p99':>8s} {'late p50':>8s} "
                  f"{'ack/send p50':>12s} {'rtt p50':>8s} {'gap p50':>8s} {'gap p90':>8s} "
                  f"{'rec/req':>7s} {'wait p50':>8s} {'wait avg':>8s} {'post p50':>8s} {'post avg':>8s} {'missed':>6s}  load", flush=True)
            for block in range(args.blocks):
                for variant in variants:
                    topic = f"split-{block}-{variant}"
                    cluster.create_topic(topic)
                    trace.reset()
                    if variant == "threaded":
                        rows = run_threaded(bootstrap, topic, count, args.rate)
                    else:
                        rows = tidewater_side.run_on_uvloop(run_asyncio(
                            bootstrap, topic, count, args.rate, at_once=variant == "asyncio-at-once"))
                    rtt, gaps = trace.split()
                    waits, posts = trace.per_record(rows)
                    ack = [(a - d) / 1e6 for d, _c, a in rows]
                    late = [(c - d) / 1e6 for d, c, _a in rows]
                    own = [(a - c) / 1e6 for _d, c, a in rows]
                    figures = [pct(ack, 0.5), pct(ack, 0.99), pct(late, 0.5), pct(own, 0.5),
                               pct(rtt, 0.5), pct(gaps, 0.5), pct(gaps, 0.9),
                               len(rows) / max(1, len(rtt)), pct(waits, 0.5), statistics.mean(waits),
                               pct(posts, 0.5), statistics.mean(posts), trace.just_missed(rows)]
                    summary[variant].append(figures)
                    load = os.getloadavg()[0]
                    print(f"{block:5d} {variant:15s} {figures[0]:8.2f} {figures[1]:8.2f} {figures[2]:8.2f} "
                          f"{figures[3]:12.2f} {figures[4]:8.2f} {figures[5]:8.3f} {figures[6]:8.3f} "
                          f"{figures[7]:7.2f} {figures[8]:8.3f} {figures[9]:8.3f} {figures[10]:8.3f} {figures[11]:8.3f} {figures[12]:6.2f}  {load:.2f}", flush=True)
            print("median over blocks:")
            for variant, runs in summary.items():
                med = [statistics.median(col) for col in zip(*runs, strict=True)]
                print(f"{'':5s} {variant:15s} " + " ".join(f"{m:8.3f}" for m in med))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
