"""Idempotence's cost (issue 30): the same acks=all 1 KiB workload, idempotent and not,
side by side on one 3-broker cluster (RF 3, 3 partitions, min.insync.replicas 2),
alternated ``--rounds`` times, for the threaded ``Producer`` at its defaults (16 KiB
batches, linger 5 ms, one request in flight per partition) and at the cluster bench's
settings (256 KiB batches, 5 in flight), and the ``AsyncProducer`` at its defaults.

    .venv/bin/python bench/idempotence_bench.py [--records 100000] [--rounds 2] [--fresh-memory]

Prints one table: MB/s per run, the median per row and idempotent / not idempotent;
beside them the CPU per MB of this process (the client) and of the cluster's processes
during each run, medians, and their sum's ratio: the work idempotence adds, which a
loaded or noisy machine does not inflate the way it inflates MB/s.

The page cache is filled first, as ``cluster_bench.py`` does (``fill_page_cache``):
without it the first ~2 GB of log come from memory the host still backs and the rest
from free memory whose first touch faults in the host, and the servers' CPU per MB
doubled part-way through a run (6.5 -> 13-15 ms/MB on 2026-12-02), falling on whichever
rows ran then. ``--fresh-memory`` skips the fill.
The interpreter that runs it decides the code measured (the cluster's processes use it
too), so a before/after comparison runs this file with each checkout's interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_common import (
    cpu_seconds,
    fill_page_cache,
    format_table,
    machine_description,
    median,
    process_cpu_s,
)
from bench.earlier_figures import EARLIER_IDEMPOTENCE
from bench.earlier_figures import SOURCE as EARLIER_SOURCE
from bench.tidewater_side import TidewaterCluster

KIB = 1024
TOPIC = "idem-bench"
SETTINGS = {
    "Producer defaults": ("threaded", {}),
    "Producer 256 KiB, 5 in flight": ("threaded", {"batch_size_bytes": 256 * KIB,
                                                   "max_in_flight_per_partition": 5}),
    "AsyncProducer defaults": ("asyncio", {}),
}


def threaded_mb_s(bootstrap: str, records: int, value: bytes, options: dict) -> float:
    from tidewater.client.producer import Producer

    failures: list[BaseException] = []

    def check(fut) -> None:
        if fut.exception() is not None:
            failures.append(fut.exception())

    with Producer(bootstrap, acks="all", buffer_memory_bytes=64 * KIB * KIB, **options) as p:
        for partition in range(3):  # metadata, connections and (idempotent) the producer id
            p.send(TOPIC, b"warm", partition=partition).result(30)
        start = time.perf_counter()
        for _ in range(records):
            p.send(TOPIC, value).add_done_callback(check)
        p.flush(300)
        elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} sends failed, first: {failures[0]!r}")
    return records * len(value) / elapsed / 1e6


def asyncio_mb_s(bootstrap: str, records: int, value: bytes, options: dict) -> float:
    from tidewater.client.aio_producer import AsyncProducer

    async def run() -> float:
        async with AsyncProducer(bootstrap, acks="all", buffer_memory_bytes=64 * KIB * KIB,
                                 **options) as p:
            for partition in range(3):
                await (await p.send(TOPIC, b"warm", partition=partition))
            start = time.perf_counter()
            futures = [await p.send(TOPIC, value) for _ in range(records)]
            await p.flush(300)
            elapsed = time.perf_counter() - start
            for f in futures:
                f.result()  # raises a failed send's error
        return records * len(value) / elapsed / 1e6

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", action="append", choices=list(SETTINGS), default=[],
                        metavar="SETTINGS", help="only these rows (repeatable; default all): "
                        + ", ".join(repr(name) for name in SETTINGS))
    parser.add_argument("--fresh-memory", action="store_true",
                        help="do not fill the page cache first (new log pages from free memory)")
    args = parser.parse_args()
    settings = {name: SETTINGS[name] for name in (args.only or SETTINGS)}
    value = os.urandom(KIB)
    runs: dict[tuple[str, bool], list[float]] = {}
    # (settings, idempotent) -> [(client CPU ms/MB, servers CPU ms/MB)] per run
    cpu_ms_per_mb: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    megabytes = args.records * len(value) / 1e6
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as directory:
        fill_bytes = 0 if args.fresh_memory else fill_page_cache(directory)
        cluster = TidewaterCluster(Path(directory) / "cluster", 3)
        bootstrap = cluster.start()
        try:
            cluster.admin.create_topic(TOPIC, 3, 3, configs={"min.insync.replicas": "2"})
            time.sleep(2)
            servers = [proc["pid"] for proc in cluster.local.manifest["processes"].values()]
            for round_index in range(args.rounds):
                # Alternate which goes first, so drift over the run falls on both.
                order = (True, False) if round_index % 2 == 0 else (False, True)
                for name, (kind, options) in settings.items():
                    for idempotent in order:
                        measure = threaded_mb_s if kind == "threaded" else asyncio_mb_s
                        client_before = process_cpu_s(os.getpid())
                        servers_before = cpu_seconds(servers)
                        mb_s = measure(bootstrap, args.records, value,
                                       dict(options, enable_idempotence=idempotent))
                        client_ms = (process_cpu_s(os.getpid()) - client_before) / megabytes * 1e3
                        servers_ms = (cpu_seconds(servers) - servers_before) / megabytes * 1e3
                        runs.setdefault((name, idempotent), []).append(mb_s)
                        cpu_ms_per_mb.setdefault((name, idempotent), []).append(
                            (client_ms, servers_ms))
                        print(f"round {round_index + 1} {name} idempotent={idempotent}: "
                              f"{mb_s:.1f} MB/s, CPU ms/MB client {client_ms:.2f} servers "
                              f"{servers_ms:.2f} (load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            cluster.stop()
    rows = []
    for name in settings:
        idem, plain = runs[(name, True)], runs[(name, False)]
        cpu = {idempotent: (median([c for c, _ in cpu_ms_per_mb[(name, idempotent)]]),
                            median([s for _, s in cpu_ms_per_mb[(name, idempotent)]]))
               for idempotent in (True, False)}
        rows.append([name, " / ".join(f"{v:.1f}" for v in idem),
                     " / ".join(f"{v:.1f}" for v in plain),
                     f"{median(idem):.1f}", f"{median(plain):.1f}",
                     f"{median(idem) / median(plain):.2f}",
                     f"{cpu[True][0]:.2f} / {cpu[False][0]:.2f}",
                     f"{cpu[True][1]:.2f} / {cpu[False][1]:.2f}",
                     f"{sum(cpu[True]) / sum(cpu[False]):.2f}",
                     EARLIER_IDEMPOTENCE.get(name, "")])
    print(f"\nmachine: {machine_description()}")
    print(f"{args.records} records of 1 KiB per run, acks=all, RF 3, 3 partitions, "
          f"min.insync.replicas 2, {args.rounds} rounds alternated; page cache "
          + (f"filled first ({fill_bytes / 2**30:.1f} GiB)" if fill_bytes else
             "not filled first"))
    print(format_table(["settings", "idempotent MB/s", "not idempotent MB/s",
                        "median idem", "median not", "idem/not",
                        "client CPU ms/MB idem / not", "servers CPU ms/MB idem / not",
                        "CPU idem/not", "earlier idem/not"], rows))
    print(f"earlier: {EARLIER_SOURCE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
