"""Read-from-the-start throughput of one topic by several consumers, alternated in one run.

Starts a 3-broker cluster (RF=3, this checkout's brokers), writes ``--mib`` MiB of 1 KiB
records to one partition, then reads it from the start ``--rounds`` times with each
reader in turn, each read in a fresh process:

- ``threaded``: ``client.consumer.Consumer`` with ``bench.tidewater_side.consume_throughput``'s
  options (64 MiB fetches, 16 MiB per partition, prefetch on);
- ``aio``: ``client.aio_consumer.AsyncConsumer`` with the same options (no prefetch: each
  poll waits a round trip before the next fetch is sent);
- ``threaded-noprefetch``: the threaded Consumer with ``_prefetch`` and ``_follow``
  made no-ops (probe only), so each poll sends its fetch after decoding the last, as the
  AsyncConsumer does: against ``threaded`` it is what prefetch buys, against ``aio``
  what the thread hand-off costs;
- ``threaded@LABEL``: the threaded Consumer run by another checkout's interpreter
  (``--other LABEL=PYTHON``, e.g. ``base=/work/wt/base-b177/.venv/bin/python``), the A/B
  of a client change on the same topic and brokers.

Each reader reports wall time and its process's CPU time (``time.process_time``, all its
threads), so MB/CPU-s is the client's cost per MB; the load average is printed per read.

    .venv/bin/python bench/probes/consumer_read_ab.py [--mib 256] [--rounds 5] \\
        [--other base=/work/wt/base-b177/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MIB = 1024 * 1024
# The threaded Consumer's options in bench.tidewater_side.consume_throughput.
READ_OPTIONS = {"auto_offset_reset": "earliest", "fetch_max_bytes": 64 * MIB,
                "max_partition_fetch_bytes": 16 * MIB, "fetch_max_wait_ms": 100}


def read_threaded_without_prefetch(bootstrap: str, topic: str, target: int) -> tuple[int, int]:
    from tidewater.client.consumer import Consumer

    # No fetch sent ahead: neither by the poll (_prefetch) nor by the loop thread (_follow).
    Consumer._prefetch = lambda self, wanted, chunks, high_watermarks: None  # type: ignore[method-assign]
    Consumer._follow = lambda self, call, response: None  # type: ignore[method-assign]
    return read_threaded(bootstrap, topic, target)


def read_threaded(bootstrap: str, topic: str, target: int) -> tuple[int, int]:
    from tidewater.client.consumer import Consumer

    consumer = Consumer(bootstrap, **READ_OPTIONS)
    try:
        tp = (topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning()
        consumer.position(tp)
        count = payload = 0
        while count < target:
            for record in consumer.poll(1000):
                count += 1
                payload += len(record.value) if record.value else 0
    finally:
        consumer.close()
    return count, payload


def read_aio(bootstrap: str, topic: str, target: int) -> tuple[int, int]:
    import asyncio

    from tidewater.client.aio_consumer import AsyncConsumer

    async def run() -> tuple[int, int]:
        async with AsyncConsumer(bootstrap, **READ_OPTIONS) as consumer:
            tp = (topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning()
            await consumer.position(tp)
            count = payload = 0
            while count < target:
                for record in await consumer.poll(1000):
                    count += 1
                    payload += len(record.value) if record.value else 0
            return count, payload
    return asyncio.run(run())


def reader_main(kind: str, bootstrap: str, topic: str, target: int) -> None:
    """In the reader process: one read, its figures as JSON on stdout."""
    # Imports before the clock starts: the read, not the interpreter's start, is timed.
    import tidewater.client.consumer
    if kind == "aio":
        import tidewater.client.aio_consumer  # noqa: F401
    reader = {"threaded": read_threaded, "threaded-noprefetch": read_threaded_without_prefetch,
              "aio": read_aio}[kind]
    wall, cpu = time.perf_counter(), time.process_time()
    count, payload = reader(bootstrap, topic, target)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"records": count, "bytes": payload, "wall_s": wall, "cpu_s": cpu}))


def one_read(python: str, kind: str, bootstrap: str, topic: str, target: int) -> dict:
    load = os.getloadavg()[0]
    out = subprocess.run([python, os.path.abspath(__file__), "--reader", kind, bootstrap, topic,
                          str(target)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = load
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB of 1 KiB records to read")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--other", action="append", default=[], metavar="LABEL=PYTHON",
                        help="also read with the threaded Consumer under this interpreter")
    parser.add_argument("--reader", nargs=4, metavar=("KIND", "BOOTSTRAP", "TOPIC", "TARGET"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        kind, bootstrap, topic, target = args.reader
        reader_main(kind, bootstrap, topic, int(target))
        return

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench.tidewater_side import TidewaterCluster, producer_throughput

    readers = [(f"threaded@{label}", python, "threaded")
               for label, python in (o.split("=", 1) for o in args.other)]
    readers += [("threaded", sys.executable, "threaded"), ("aio", sys.executable, "aio"),
                ("threaded-noprefetch", sys.executable, "threaded-noprefetch")]
    with tempfile.TemporaryDirectory(prefix="consumer-read-ab-") as work:
        cluster = TidewaterCluster(work)
        bootstrap = cluster.start()
        try:
            cluster.create_topic("readab")
            # ~130 MB/s produce on this machine: stop on time, then count what was written.
            produced = producer_throughput(bootstrap, "readab", 1024, "all", args.mib / 100)
            target = produced.records + 1  # + producer_throughput's warm-up send
            print(f"wrote {target:,} records of 1 KiB; load {os.getloadavg()[0]:.2f}")
            one_read(sys.executable, "threaded", bootstrap, "readab", target)  # page cache warm
            results: dict[str, list[dict]] = {label: [] for label, _, _ in readers}
            for round_no in range(args.rounds):
                # Rotate the order each round so no reader always follows the same one.
                shift = round_no % len(readers)
                for label, python, kind in readers[shift:] + readers[:shift]:
                    r = one_read(python, kind, bootstrap, "readab", target)
                    assert r["records"] >= target, r
                    results[label].append(r)
                    print(f"round {round_no} {label:<20} {r['bytes'] / r['wall_s'] / 1e6:7.1f} MB/s "
                          f"{r['bytes'] / r['cpu_s'] / 1e6:7.1f} MB/CPU-s load {r['load']:.2f}",
                          flush=True)
        finally:
            cluster.stop()
    print(f"\n{'reader':<20} {'MB/s median':>12} {'(min-max)':>15} {'MB/CPU-s median':>16} "
          f"{'(min-max)':>15} {'load':>10}")
    for label, rs in results.items():
        mbs = [r["bytes"] / r["wall_s"] / 1e6 for r in rs]
        mbcpu = [r["bytes"] / r["cpu_s"] / 1e6 for r in rs]
        loads = [r["load"] for r in rs]
        print(f"{label:<20} {statistics.median(mbs):12.1f} {min(mbs):7.1f}-{max(mbs):<7.1f} "
              f"{statistics.median(mbcpu):16.1f} {min(mbcpu):7.1f}-{max(mbcpu):<7.1f} "
              f"{min(loads):4.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
