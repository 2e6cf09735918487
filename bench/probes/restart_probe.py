"""How long does a broker take from launch to serving, after SIGKILL and after SIGTERM?

    .venv/bin/python bench/probes/restart_probe.py --dir /tmp/restart-probe \\
        [--fill-gib 4] [--logs 60] [--rounds 2] [--python NAME=PATH ...]

Starts a local cluster of one controller and one broker (stopped by pid at the end)
unless ``--dir`` already holds one this probe made, creates ``--logs`` topics of one
partition (RF 1: one broker holds every log), a little data in each and
``--fill-gib`` of 1 KiB records in 1 MiB batches in the first (``fill``), so the
broker's data dir holds what the issue asks for.

Then, ``--rounds`` times and for each ``--python`` in turn (each a venv python whose
editable install is one checkout: base and head alternate in one sitting), the
broker is restarted twice: SIGKILL then launch (recovery: the segment holding each
log's recovery point and every later one is re-validated) and SIGTERM (clean
shutdown, waited for) then launch. "Serving" is the local cluster's own test
(``LocalCluster._serves``: the broker's Metadata names it and the controller lists
it registered and unfenced), polled every 10 ms on fresh gRPC channels, so the
figure is not a reconnect backoff of the poller. Printed per restart: launch ->
serving, and the broker's own "loaded N logs in X s" line.

The same data dir serves every python: the on-disk format is the same in both.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import MIB, median, process_cpu_s  # noqa: E402

GIB = 1024 * MIB
POLL_S = 0.01
FAST_CHANNEL = [("grpc.initial_reconnect_backoff_ms", 10), ("grpc.min_reconnect_backoff_ms", 10),
                ("grpc.max_reconnect_backoff_ms", 10)]
_LOADED = re.compile(r"^(\S+ \S+) broker-\d+ INFO tidewater.broker: loaded (\d+) logs in ([\d.]+)s",
                     re.MULTILINE)


@dataclass
class Start:
    serving_s: float  # launch -> serving
    cpu_s: float  # the broker's user + system CPU seconds at that moment
    before_load_s: float | None  # launch -> log loading begins (Python start and imports)
    load_s: float | None  # the broker's "loaded N logs in X s"


def setup(cluster: tidewater_side.TidewaterCluster, logs: int, fill_bytes: int) -> None:
    cluster.start()
    for i in range(logs):
        name = "fill" if i == 0 else f"small-{i}"
        cluster.create_topic(name, replication_factor=1)
        if i:
            tidewater_side.pipelined_throughput(cluster.bootstrap, name, 1024, -1, 60,
                                                batch_bytes=64 * 1024, in_flight=1,
                                                max_bytes=256 * 1024)
    data_dir = cluster.broker_data_dir(1)
    while (have := tidewater_side.directory_bytes(data_dir)) < fill_bytes * 0.98:
        tidewater_side.pipelined_throughput(cluster.bootstrap, "fill", 1024, -1, 3600,
                                            batch_bytes=1 * MIB, in_flight=4,
                                            max_bytes=fill_bytes - have)
    print(f"[probe] filled: {tidewater_side.directory_bytes(data_dir) / GIB:.2f} GiB in "
          f"{logs} logs", flush=True)


def serving(proc: dict, controller: str) -> bool:
    import grpc

    from tidewater.client.metadata import parse_address
    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto import tidewater_pb2_grpc as pb_grpc

    def channel(address: str) -> grpc.Channel:
        host, port = parse_address(address)
        return grpc.insecure_channel(f"{host}:{port}", options=FAST_CHANNEL)

    with channel(proc["listen"]) as b, channel(controller) as c:
        try:
            own = pb_grpc.BrokerStub(b).Metadata(pb.MetadataRequest(), timeout=1.0)
            cluster = pb_grpc.ControllerStub(c).DescribeCluster(pb.DescribeClusterRequest(),
                                                                timeout=1.0)
        except grpc.RpcError:
            return False
    me = proc["broker_id"]
    return (any(x.broker_id == me for x in own.brokers)
            and any(x.broker_id == me and not x.fenced for x in cluster.brokers))


def _free_port() -> int:
    for _ in range(1000):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


def launch(cluster: tidewater_side.TidewaterCluster, python: str) -> Start:
    """Start broker 1 with ``python`` and time it."""
    local = cluster.local
    proc = local.process("broker-1")
    command = [python, *proc["command"][1:]]
    # Ports free now, below the ephemeral range: on a shared machine the ports of `up`
    # were seen taken by other programs' outgoing connections between two restarts.
    for flag in ("--listen", "--external-listen", "--kafka-listen", "--metrics-port"):
        if flag in command:
            i = command.index(flag) + 1
            port = str(_free_port())
            command[i] = port if flag == "--metrics-port" else f"127.0.0.1:{port}"
            if flag == "--listen":
                proc["listen"] = command[i]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("PYTHONUNBUFFERED", "1")
    log_path = Path(proc["log"])
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        start, start_wall = time.monotonic(), time.time()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=Path(python).parents[2], env=env,
                                 start_new_session=True)
    local._children[child.pid] = child  # LocalCluster stops it by pid with the others
    # What the process runs: LocalCluster checks a pid's command line against it before
    # it signals the pid (a later run of this probe kills this broker through it).
    proc["pid"], proc["command"] = child.pid, command
    local._write_manifest()
    manifest = local.manifest
    assert manifest is not None
    while not serving(proc, manifest["controller"]):
        if child.poll() is not None:
            raise RuntimeError(f"broker exited with {child.returncode}; see {log_path}")
        if time.monotonic() - start > 600:
            raise TimeoutError("broker not serving after 600 s")
        time.sleep(POLL_S)
    took = time.monotonic() - start
    cpu = process_cpu_s(child.pid)
    with open(log_path, "rb") as f:
        f.seek(offset)
        found = _LOADED.findall(f.read().decode(errors="replace"))
    if not found:
        return Start(took, cpu, None, None)
    stamp, _count, load = found[-1]
    loaded_at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return Start(took, cpu, loaded_at - float(load) - start_wall, float(load))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--fill-gib", type=float, default=4.0)
    parser.add_argument("--logs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--python", action="append", default=[],
                        help="NAME=PATH of a venv python (default: this one as 'head')")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    pythons = [tuple(p.split("=", 1)) for p in args.python] or [("head", sys.executable)]
    cluster = tidewater_side.TidewaterCluster(args.dir, brokers=1)
    if cluster.local.manifest is None:
        setup(cluster, args.logs, int(args.fill_gib * GIB))
    else:
        cluster.bootstrap = cluster.local.bootstrap  # made by an earlier run (--keep)
    data_dir = cluster.broker_data_dir(1)
    print(f"[probe] {tidewater_side.directory_bytes(data_dir) / GIB:.2f} GiB of log in "
          f"{data_dir}; load average {os.getloadavg()}", flush=True)
    results: dict[tuple[str, str], list[Start]] = {}
    try:
        for r in range(args.rounds):
            for name, python in pythons:
                for sig in ("KILL", "TERM"):
                    if cluster.local._is_alive(cluster.local.process("broker-1")):
                        cluster.local.kill("broker-1", sig, term_timeout_s=120)
                    elif sig == "KILL":
                        (data_dir / ".kafka_cleanshutdown").unlink(missing_ok=True)  # as killed
                    got = launch(cluster, python)
                    results.setdefault((name, sig), []).append(got)
                    print(f"[probe] round {r + 1} {name} after SIG{sig}: {got}; load average "
                          f"{os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if not args.keep:
            cluster.local.down(timeout_s=30)

    def med(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        return f"{median(known):.2f}" if known else "?"

    print("\n| checkout | restart after | launch -> serving s (median; all) | broker CPU s "
          "at serving | launch -> log loading starts s | log loading s |")
    print("|---|---|---|---|---|---|")
    for (name, sig), runs in results.items():
        print(f"| {name} | SIG{sig} | {med([x.serving_s for x in runs])} "
              f"({', '.join(f'{x.serving_s:.2f}' for x in runs)}) | "
              f"{med([x.cpu_s for x in runs])} | {med([x.before_load_s for x in runs])} | "
              f"{med([x.load_s for x in runs])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
