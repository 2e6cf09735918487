"""`tide cluster describe|up|down|status|kill|start`.

``describe`` asks a running cluster (through --bootstrap-server); the others
manage a local cluster of processes recorded in ``DIR/cluster.json``
(see client/local_cluster.py for the layout and port plan).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tidewater.client.admin import AdminClient, cluster_to_json
from tidewater.tools.cli import CliError
from tidewater.tools.commands._common import (
    add_bootstrap_argument,
    bootstrap_of,
    cli_errors,
    parse_configs,
    security_of,
)
from tidewater.tools.local_cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_CONTROLLERS,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    LocalCluster,
    LocalClusterError,
)

if TYPE_CHECKING:
    from tidewater.tools.cli import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("cluster", help="describe a cluster; run a local one")
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True

    describe = sub.add_parser("describe", help="controller, brokers, partition health")
    describe.add_argument("--json", action="store_true")
    describe.add_argument("--timeout-ms", type=int, default=30000)
    add_bootstrap_argument(describe)
    describe.set_defaults(func=cmd_describe)

    up = sub.add_parser("up", help="start a controller and N brokers on 127.0.0.1")
    up.add_argument("--brokers", type=int, default=3)
    up.add_argument("--controllers", type=int, default=None,
                    help="a quorum of N controllers (controller.quorum.voters; processes "
                         "controller-1..N, node ids 1..N, their directories formatted first "
                         "with random directory ids), the brokers given all of them; "
                         f"default {DEFAULT_CONTROLLERS}; with --tls, SASL or ACLs default 1 "
                         "(one process named `controller`): say --controllers 3 --tls for a "
                         "secured quorum (SASL or ACLs with a quorum need --tls)")
    up.add_argument("--data-dir", required=True)
    up.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                    help="broker i listens on BASE+i-1, the controller on BASE-1; 0 picks free ports")
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="setting for the controller and/or brokers (routed by name)")
    up.add_argument("--rack", default="", metavar="RACK[,RACK...]",
                    help="broker.rack of each broker in turn: broker i gets the i-th name, "
                         "cycling when there are fewer names than brokers (e.g. a,b,c)")
    up.add_argument("--foreground", action="store_true",
                    help="stay attached, stream the logs, stop everything on Ctrl-C/SIGTERM")
    up.add_argument("--ready-timeout-s", type=float, default=READY_TIMEOUT_S)
    up.add_argument("--sasl-mechanisms", default="",
                    help="SASL on the Kafka listeners, e.g. SCRAM-SHA-512,PLAIN (SASL_SSL with "
                         "--tls, else SASL_PLAINTEXT); an admin super user is made, its client "
                         "settings in DATA_DIR/sasl/admin.properties")
    up.add_argument("--authorizer", choices=["none", "acl"], default=None,
                    help="acl: every request checked against ACLs (default: acl with "
                         "--sasl-mechanisms, else none)")
    up.add_argument("--super-users", default="",
                    help="more principals allowed everything, ';'-separated (User:admin is one)")
    up.add_argument("--tls", action="store_true",
                    help="TLS on every port: a CA and certificates under DATA_DIR/tls, mutual "
                         "TLS between cluster members; clients use DATA_DIR/tls/client.properties")
    up.add_argument("--console", nargs="?", const="127.0.0.1:9800", default=None,
                    metavar="HOST:PORT",
                    help="also start the web console (`tide console`; default "
                         "127.0.0.1:9800, port 0 picks one); `cluster down` stops it")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop every process of a local cluster")
    down.add_argument("--data-dir", required=True)
    down.add_argument("--timeout-s", type=float, default=STOP_TIMEOUT_S,
                      help="SIGKILL what is still running after this long")
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="pid, alive, serving and ports of each process")
    status.add_argument("--data-dir", required=True)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    kill = sub.add_parser("kill", help="signal one process (controller or a broker id); KILL and TERM wait until it is gone")
    kill.add_argument("id", metavar="ID")
    kill.add_argument("--data-dir", required=True)
    kill.add_argument("--signal", default="KILL", type=str.upper, choices=["KILL", "TERM", "STOP", "CONT"])
    kill.set_defaults(func=cmd_kill)

    start = sub.add_parser("start", help="re-launch one process; returns once it serves")
    start.add_argument("id", metavar="ID")
    start.add_argument("--data-dir", required=True)
    start.add_argument("--ready-timeout-s", type=float, default=READY_TIMEOUT_S)
    start.set_defaults(func=cmd_start)


def cmd_describe(args: argparse.Namespace) -> int:
    with AdminClient(bootstrap_of(args), request_timeout_ms=args.timeout_ms,
                     **security_of(args)) as admin, \
            cli_errors("cannot describe cluster"):
        cluster = admin.describe_cluster()
    if args.json:
        print(json.dumps(cluster_to_json(cluster), indent=2))
        return 0
    print(f"Cluster: {cluster.cluster_id}\tController: {cluster.controller_id} "
          f"(epoch {cluster.controller_epoch})")
    for b in cluster.brokers:
        addresses = ",".join(f"{name}={addr}" for name, addr in sorted(b.listeners.items()))
        flags = ("fenced" if b.fenced else "active") + (", shutting down" if b.in_controlled_shutdown else "")
        rack = f"\track {b.rack}" if b.rack else ""
        print(f"Broker {b.broker_id}\tepoch {b.broker_epoch}\t{addresses}\t{flags}{rack}")
    offline = cluster.offline_partitions()
    under = cluster.under_replicated_partitions()
    print(f"Topics: {len(cluster.topics)}\tPartitions: {cluster.partition_count}\t"
          f"Offline: {len(offline)}\tUnder-replicated: {len(under)}")
    for label, items in (("Offline", offline), ("Under-replicated", under)):
        if items:
            print(f"{label} partitions: " + " ".join(f"{t}-{p}" for t, p in items))
    return 0


def _cluster(args: argparse.Namespace) -> LocalCluster:
    try:
        return LocalCluster(args.data_dir)
    except LocalClusterError as e:
        raise CliError(str(e)) from None


def _one_line(e: Exception) -> str:
    """LocalClusterError messages may carry a log tail after the first line: it goes to
    stdout, so stderr keeps exactly one line, the reason."""
    first, _, rest = str(e).partition("\n")
    if rest:
        sys.stdout.write(rest + "\n")
        sys.stdout.flush()
    return first


def cmd_up(args: argparse.Namespace) -> int:
    settings = parse_configs(args.set)
    cluster = _cluster(args)
    # Stream this run's output only: logs are appended to across runs.
    log_sizes = {p.name: p.stat().st_size for p in Path(cluster.data_dir).glob("*.log")}
    restarting = cluster.manifest is not None
    try:
        mechanisms = tuple(m.strip() for m in args.sasl_mechanisms.split(",") if m.strip())
        authorizer = args.authorizer or ("acl" if mechanisms else "none")
        controllers = args.controllers
        if controllers is None and cluster.manifest is not None:
            # Up again in a cluster's folder: as many controllers as it had (a default of
            # 3 would start a new quorum beside the old controller's metadata).
            controllers = len(cluster.manifest.get("controllers") or ["controller"])
        if controllers is None:
            secured = args.tls or bool(mechanisms) or authorizer != "none"
            controllers = 1 if secured else DEFAULT_CONTROLLERS
            if secured:
                print("cluster up: one controller (secured; --controllers 3 --tls starts a "
                      "secured quorum)", file=sys.stderr)
        bootstrap = cluster.up(args.brokers, base_port=args.base_port, settings=settings,
                               ready_timeout_s=args.ready_timeout_s, tls=args.tls,
                               sasl_mechanisms=mechanisms, authorizer=authorizer,
                               super_users=args.super_users,
                               racks=[r.strip() for r in args.rack.split(",")] if args.rack else [],
                               controllers=controllers)
    except LocalClusterError as e:
        raise CliError(f"cluster up failed: {_one_line(e)}") from None
    if cluster.migrated_metadata_log is not None:
        print(f"cluster up: migrated {cluster.migrated_metadata_log} into the quorum (renamed "
              f"{cluster.migrated_metadata_log.name}.migrated)", file=sys.stderr)
    # The hints go to stderr: stdout is exactly the bootstrap address, which scripts
    # and tests read (its last line, and with --foreground its first).
    manifest = cluster.manifest
    assert manifest is not None  # up wrote it
    tls = manifest.get("tls")
    sasl = manifest.get("sasl")
    client_entry = sasl or tls
    sys.stderr.write(up_hints(cluster.data_dir, bootstrap, manifest.get("kafka_bootstrap"),
                              restarted=restarting,
                              command_config=client_entry.get("command_config") if client_entry else None,
                              ca=tls["ca"] if tls else None))
    if args.console is not None:
        from tidewater.tools.console import local as local_console

        try:
            url = local_console.start(Path(cluster.data_dir), args.console)
        except local_console.LocalConsoleError as e:
            raise CliError(f"cluster up: {e}") from None
        sys.stderr.write(f"# web console: {url}\n")
    sys.stderr.flush()
    print(bootstrap, flush=True)
    if args.foreground:
        _stay_attached(cluster, log_sizes)
    return 0


def up_hints(data_dir: Path, bootstrap: str, kafka_bootstrap: str | None, *, restarted: bool,
             command_config: str | None = None, ca: str | None = None) -> str:
    """What ``cluster up`` tells a person: the ports change with --base-port 0, so the
    lines to paste into a shell; and whether old data came back."""
    lines = []
    if restarted:
        lines.append(f"# restarted the cluster in {data_dir}: its topics and records are kept")
    lines.append(f"export TIDE_BOOTSTRAP_SERVER={bootstrap}")
    if kafka_bootstrap:
        lines.append(f"export TIDE_KAFKA_BOOTSTRAP={kafka_bootstrap}  # Kafka clients: kcat -b $TIDE_KAFKA_BOOTSTRAP")
    if command_config:
        what = "the admin user's SASL settings" if "sasl" in command_config else "TLS"
        lines.append(f"export TIDE_COMMAND_CONFIG={command_config}  # {what} for tide")
        if "sasl" in command_config and kafka_bootstrap:
            lines.append(f"# Kafka clients take the same file: kcat -F {command_config} "
                         "-b $TIDE_KAFKA_BOOTSTRAP")
        if kafka_bootstrap and ca:
            lines.append(f"# Kafka clients over TLS: kcat -X security.protocol=SSL "
                         f"-X ssl.ca.location={ca} -b $TIDE_KAFKA_BOOTSTRAP")
    return "".join(line + "\n" for line in lines)


def _stay_attached(cluster: LocalCluster, log_sizes: dict[str, int]) -> None:
    """Stream every process log with a name prefix until SIGINT/SIGTERM, then stop all."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    manifest = cluster.manifest
    assert manifest is not None  # up wrote it
    offsets = {name: log_sizes.get(Path(p["log"]).name, 0)
               for name, p in manifest["processes"].items()}
    try:
        while not stop.is_set():
            for name, proc in manifest["processes"].items():
                path = Path(proc["log"])
                try:
                    with path.open("rb") as f:
                        f.seek(offsets[name])
                        data = f.read()
                except OSError:
                    continue
                cut = data.rfind(b"\n") + 1
                if cut:
                    offsets[name] += cut
                    for line in data[:cut].decode(errors="replace").splitlines():
                        sys.stdout.write(f"[{name}] {line}\n")
                    sys.stdout.flush()
            stop.wait(0.2)
    finally:
        print("stopping cluster", flush=True)
        _stop_console(Path(cluster.data_dir))
        killed = cluster.down()
        print("cluster stopped" + (f" (SIGKILL: {', '.join(killed)})" if killed else ""), flush=True)


def _stop_console(data_dir: Path) -> None:
    """The console `cluster up --console` started, if any (by its recorded pid)."""
    from tidewater.tools.console import local as local_console

    local_console.stop(data_dir)


def cmd_down(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    _stop_console(Path(cluster.data_dir))
    try:
        killed = cluster.down(timeout_s=args.timeout_s)
    except LocalClusterError as e:
        raise CliError(f"cluster down failed: {_one_line(e)}") from None
    note = f" (SIGKILL after {args.timeout_s:g} s: {', '.join(killed)})" if killed else ""
    print(f"cluster in {cluster.data_dir} stopped{note}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    try:
        statuses = cluster.status()
    except LocalClusterError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps({"bootstrap": cluster.bootstrap, "controller": cluster.controller_address,
                          "processes": [s.to_json() for s in statuses]}, indent=2))
        return 0
    print(f"bootstrap {cluster.bootstrap}")
    print(f"{'NAME':<12}{'PID':>8}  {'ALIVE':<9}{'SERVING':<9}{'LISTEN':<22}METRICS")
    for s in statuses:
        alive = ("stopped" if s.stopped else "yes") if s.alive else "no"
        print(f"{s.name:<12}{s.pid:>8}  {alive:<9}{'yes' if s.serving else 'no':<9}{s.listen:<22}{s.metrics_port}")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    try:
        proc = cluster.kill(args.id, args.signal)
    except LocalClusterError as e:
        raise CliError(f"cannot kill {args.id}: {e}") from None
    print(f"sent SIG{args.signal} to {proc['name']} (pid {proc['pid']})")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    started = time.monotonic()
    try:
        proc = cluster.start(args.id, ready_timeout_s=args.ready_timeout_s)
    except LocalClusterError as e:
        raise CliError(f"cannot start {args.id}: {_one_line(e)}") from None
    print(f"started {proc['name']} (pid {proc['pid']}), serving after {time.monotonic() - started:.1f} s")
    return 0
