"""`tide produce --acks all` fed from a pipe (issue 30): the console producer as a user runs
it, idempotent (the default with acks=all) and not, on a 3-broker cluster (RF 3, 3
partitions, min.insync.replicas 2) that the same checkout's `tide cluster up` started.

    .venv/bin/python bench/cli_produce_bench.py [--mb 300] [--rounds 2] \\
        [--tide LABEL=PATH/TO/tide ...] [--fresh-memory]

Each run pipes the same file of 1 KiB lines (1,023 printable bytes and a newline) into
`tide produce TOPIC --acks all` on a new topic and times the process from launch to exit
(interpreter start, metadata and the final flush included: what a user waits for). The
topic's high watermarks must add up to the lines sent, else the run fails. ``--tide`` names
other checkouts' `tide` scripts (each starts its own cluster, so broker and client are that
checkout's code) for an A/B in one sitting; the order of checkouts and settings alternates
between rounds. A checkout whose `tide produce` has no `enable.idempotence` property gets
only its default row. Beside MB/s: the client's CPU per MB, the cluster's (controllers and
brokers, from the manifest's pids) per MB meanwhile, and the MB/s two cores could carry if
that CPU were all the work (2,000 / their sum): the floor this machine sets. Every process
started is stopped by `tide cluster down` (by pid). The page cache is filled first
(``fill_page_cache``, as ``cluster_bench.py`` and ``idempotence_bench.py`` do: log pages
taken from free memory fault in the host on first touch, and the servers' CPU per MB
doubles once the first ~2 GB are written); ``--fresh-memory`` skips it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
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
)
from bench.earlier_figures import EARLIER_CLI
from bench.earlier_figures import SOURCE as EARLIER_SOURCE

LINE_BYTES = 1024
SETTINGS = {
    "default": [],  # idempotent with acks=all since issue 17; ebe4908 had no idempotence
    "enable.idempotence=false": ["--producer-property", "enable.idempotence=false"],
}


def write_lines(path: Path, megabytes: int) -> int:
    """``megabytes`` x 1,000,000 bytes of distinct 1 KiB lines; returns the line count."""
    rng = random.Random(30)
    lines = megabytes * 1_000_000 // LINE_BYTES
    with path.open("wb") as out:
        for _ in range(0, lines, 1024):
            chunk = [base64.b64encode(rng.randbytes(768))[:LINE_BYTES - 1] + b"\n"
                     for _ in range(1024)]
            out.write(b"".join(chunk))
    # the last chunk may overshoot; cut to whole lines
    with path.open("r+b") as out:
        out.truncate(lines * LINE_BYTES)
    return lines


class Checkout:
    """One checkout's `tide`: its cluster, its topics, its runs."""

    def __init__(self, label: str, tide: Path, directory: Path):
        self.label = label
        self.tide = tide
        self.data_dir = directory / f"cluster-{label}"
        self.bootstrap = ""
        self.topics = 0
        help_text = self._run(["produce", "--help"]).stdout
        self.has_idempotence_switch = "enable.idempotence" in help_text

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.tide), *argv], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{self.label}: tide {' '.join(argv)} exited {done.returncode}: "
                               f"{done.stderr[-2000:]}")
        return done

    def up(self) -> None:
        # free ports: two checkouts' clusters run side by side
        out = self._run(["cluster", "up", "--brokers", "3", "--base-port", "0",
                         "--data-dir", str(self.data_dir)])
        # the bootstrap address is the first HOST:PORT list the command prints
        for word in out.stdout.split():
            if word.count(":") >= 1 and word.split(",")[0].rsplit(":", 1)[-1].isdigit():
                self.bootstrap = word.strip("'\"()")
                break
        if not self.bootstrap:
            raise RuntimeError(f"{self.label}: no bootstrap address in {out.stdout!r}")

    def down(self) -> None:
        subprocess.run([str(self.tide), "cluster", "down", "--data-dir", str(self.data_dir)],
                       capture_output=True, timeout=120)

    def new_topic(self) -> str:
        self.topics += 1
        topic = f"cli-bench-{self.topics}"
        self._run(["--bootstrap-server", self.bootstrap, "topics", "create", topic,
                   "--partitions", "3", "--replication-factor", "3",
                   "--config", "min.insync.replicas=2"])
        return topic

    def delete_topic(self, topic: str) -> None:
        subprocess.run([str(self.tide), "--bootstrap-server", self.bootstrap, "topics",
                        "delete", topic], capture_output=True, timeout=120)

    def high_watermarks(self, topic: str) -> int:
        described = json.loads(self._run(["--bootstrap-server", self.bootstrap, "topics",
                                          "describe", topic, "--json"]).stdout)
        return committed_records(described)

    def server_pids(self) -> list[int]:
        """The controller(s)' and brokers' pids, from the cluster's manifest."""
        manifest = json.loads((self.data_dir / "cluster.json").read_text())
        return [proc["pid"] for proc in manifest["processes"].values() if proc.get("pid")]

    def produce(self, topic: str, lines_file: Path, extra: list[str]) -> tuple[float, float, float]:
        """Wall seconds from launch to exit, the process's CPU seconds, and the cluster's
        CPU seconds meanwhile."""
        pids = self.server_pids()
        servers_before = cpu_seconds(pids)
        with lines_file.open("rb") as stdin:
            start = time.perf_counter()
            # the global --bootstrap-server: older checkouts know only that form
            proc = subprocess.Popen([str(self.tide), "--bootstrap-server", self.bootstrap,
                                     "produce", topic, "--acks", "all", *extra],
                                    stdin=stdin, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            _, status, usage = os.wait4(proc.pid, 0)
            elapsed = time.perf_counter() - start
        servers_cpu_s = cpu_seconds(pids) - servers_before
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode != 0:
            raise RuntimeError(f"{self.label}: tide produce exited {proc.returncode}: "
                               f"{stderr[-2000:]}")
        return elapsed, usage.ru_utime + usage.ru_stime, servers_cpu_s


def committed_records(described: dict) -> int:
    """Records below the high watermark, summed over partitions: the highest HW any
    replica reports is the leader's (followers learn it a fetch later)."""
    return sum(max(r["high_watermark"] for r in partition["replicas_state"])
               for topic in described["topics"] for partition in topic["partitions"])


def parse_tide(spec: str) -> tuple[str, Path]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {spec!r}")
    return label, Path(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="MB piped per run (default 300)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tide", type=parse_tide, action="append", default=[],
                        metavar="LABEL=PATH", help="a checkout's tide script (default: this "
                        "interpreter's, labelled 'this')")
    parser.add_argument("--fresh-memory", action="store_true",
                        help="do not fill the page cache first (new log pages from free memory)")
    args = parser.parse_args()
    tides = args.tide or [("this", Path(sys.executable).parent / "tide")]
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp:
        directory = Path(tmp)
        lines_file = directory / "lines.txt"
        lines = write_lines(lines_file, args.mb)
        fill_bytes = 0 if args.fresh_memory else fill_page_cache(directory)
        size_bytes = lines * LINE_BYTES
        checkouts = [Checkout(label, tide, directory) for label, tide in tides]
        try:
            for checkout in checkouts:
                checkout.up()
            for round_index in range(args.rounds):
                # alternate orders so drift over the sitting falls on every row alike
                ordered = checkouts if round_index % 2 == 0 else checkouts[::-1]
                names = list(SETTINGS) if round_index % 2 == 0 else list(SETTINGS)[::-1]
                for checkout in ordered:
                    for name in names:
                        if SETTINGS[name] and not checkout.has_idempotence_switch:
                            continue
                        topic = checkout.new_topic()
                        elapsed, cpu_s, servers_cpu_s = checkout.produce(topic, lines_file,
                                                                         SETTINGS[name])
                        stored = checkout.high_watermarks(topic)
                        if stored != lines:
                            raise RuntimeError(f"{checkout.label} {name}: {stored} records "
                                               f"stored of {lines} sent")
                        checkout.delete_topic(topic)
                        runs.setdefault((checkout.label, name), []).append(
                            (elapsed, cpu_s, servers_cpu_s))
                        print(f"round {round_index + 1} {checkout.label} {name}: "
                              f"{size_bytes / elapsed / 1e6:.1f} MB/s, {elapsed:.2f} s, "
                              f"client CPU {cpu_s:.2f} s, servers {servers_cpu_s:.2f} s "
                              f"(load {os.getloadavg()[0]:.1f})",
                              flush=True)
        finally:
            for checkout in checkouts:
                checkout.down()
    rows = []
    for (label, name), measured in runs.items():
        rates = [size_bytes / elapsed / 1e6 for elapsed, _, _ in measured]
        megabytes = size_bytes / 1e6
        client_ms = median([cpu for _, cpu, _ in measured]) / megabytes * 1e3
        servers_ms = median([cpu for _, _, cpu in measured]) / megabytes * 1e3
        rows.append([label, name, " / ".join(f"{r:.1f}" for r in rates),
                     f"{median(rates):.1f}", f"{client_ms:.1f}", f"{servers_ms:.1f}",
                     # what 2 cores could carry if the CPU above were all of it
                     f"{2000 / (client_ms + servers_ms):.0f}"])
    print(f"\nmachine: {machine_description()}")
    print(f"tide produce --acks all, {size_bytes / 1e6:.0f} MB piped ({lines} lines of 1 KiB), "
          f"RF 3, 3 partitions, min.insync.replicas 2, {args.rounds} rounds alternated; page "
          + (f"cache filled first ({fill_bytes / 2**30:.1f} GiB)" if fill_bytes else
             "cache not filled first"))
    print(format_table(["checkout", "settings", "MB/s per round", "median MB/s",
                        "client CPU ms/MB", "servers CPU ms/MB", "2-core bound MB/s"], rows))
    print(f"earlier: {EARLIER_CLI} ({EARLIER_SOURCE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
