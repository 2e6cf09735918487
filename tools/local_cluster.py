"""A local Tidewater cluster: one controller or a quorum, and N brokers, as background processes.

Layout of a cluster directory ``DIR``::

    DIR/cluster.json            the manifest (below)
    DIR/controller/             controller data;  DIR/controller.log its output
    DIR/broker-<id>/            broker data;      DIR/broker-<id>.log its output

Ports, all on 127.0.0.1, from the base port P (default 9092):
broker ``i`` (1..N) serves clients on ``P+i-1`` (its EXTERNAL listener, the
``listen`` and ``bootstrap`` addresses below; no control service there) and
cluster members on ``P+200+i-1`` (its INTERNAL listener, ``internal`` below:
the controller's requests and follower fetches) and Kafka clients on
``P+10000+i-1`` (Kafka's binary protocol; ``kafka_bootstrap`` below: 19092.. for
the default P); the controller listens on ``P-1``; metrics (Prometheus) on ``P+100+i-1`` for brokers and ``P+99`` for
the controller. ``base_port=0`` picks free ports instead (what tests use); a
process that finds one taken by then makes ``up`` start over with a new plan.

``controllers=N`` (``tide cluster up --controllers N``, N > 1): a quorum of N
controllers (``controller.quorum.voters``), processes ``controller-1``..``controller-N``
with node ids 1..N, data in ``DIR/controller-<i>/``; controller i listens on
``P-i``, its metrics on ``P+99-(i-1)``, its Raft port is ``P+300+i-1``. ``up`` formats a new quorum's directories first (``format_new_quorum``:
random directory ids, every controller an initial voter); a restart formats none. In a folder
that ran one controller, ``up`` with a quorum formats every controller holding that
controller's ``controller/metadata.log`` and renames it (``quorum.migration``). An ``up``
stopped half-way through (Ctrl-C, power cut) leaves ``DIR/quorum-format.json`` (the
initial voters, ``quorum_format_plan``): the next ``up`` finishes that formatting. Brokers get
``--controller 1@HOST:PORT,...``; the manifest's ``controllers`` lists the
listen addresses (``controller`` is the first). With ``--tls`` each controller has
its own certificate ``controller-<i>`` (role controller) and the Raft port speaks
mTLS that admits only controller certificates; SASL and ACLs work as with one
controller (users and ACLs live in the replicated metadata log; every controller
is given the bootstrap users, and the one that first leads creates them).
A quorum with SASL or ACLs needs ``--tls`` (the Raft port authenticates by
certificate only). ``tide cluster up`` starts 3 by default (1 with TLS, SASL or ACLs
unless ``--controllers`` says otherwise; as many as the folder's manifest had when it
restarts a cluster); ``up()`` itself defaults to 1.

``cluster.json`` (UTF-8 JSON, rewritten atomically on every change)::

    {"version": 1, "data_dir": "/abs/DIR", "bootstrap": "127.0.0.1:9092,...",
     "kafka_bootstrap": "127.0.0.1:19092,...",
     "controller": "127.0.0.1:9091", "cwd": "/abs/project",
     "processes": {
        "controller": {"name": "controller", "kind": "controller", "pid": 123,
                       "listen": "127.0.0.1:9091", "metrics_port": 9191,
                       "data_dir": "...", "log": "DIR/controller.log", "command": [...]},
        "broker-1":   {"name": "broker-1", "kind": "broker", "broker_id": 1,
                       "listen": "127.0.0.1:9092", "internal": "127.0.0.1:9292",
                       "kafka": "127.0.0.1:19092", ...}}}

With ``tls=True`` (``tide cluster up --tls``) the cluster runs TLS on every
port: ``DIR/tls/`` holds a CA (``ca.pem``, ``ca.key``), ``controller``,
``broker-<id>`` and ``tide-client`` (role client) certificates, and
``client.properties`` (Kafka's client format, for ``tide --command-config``);
the manifest's ``tls`` entry records them (``{"ca", "cert", "key",
"command_config"}``: what a client needs). A restart reuses the CA and the
certificates already there.

Processes run in their own session (``start_new_session``) so a terminal's
Ctrl-C does not reach them; they are stopped only by the pid in the manifest,
after checking that the pid still runs the recorded command line (a reused
pid is never signalled).

``--set name=value`` settings are routed: names only the controller knows
(``default.replication.factor``, ``num.partitions``, ``controller.*``, ...)
go to the controller; names both know (``min.insync.replicas``,
``broker.session.timeout.ms``, ``unclean.leader.election.enable``,
``max.connections``, ``connections.max.idle.ms``) go to all;
the rest go to the brokers.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import grpc

from tidewater.client.metadata import ChannelPool, parse_address
from tidewater.client.security import PLAINTEXT, ClientSecurity
from tidewater.controller.metadata_log import FILE_NAME as METADATA_LOG_FILE_NAME
from tidewater.controller.quorum.format_controller import format_controller
from tidewater.controller.quorum.formatting import (
    is_formatted,
    new_directory_id,
    raft_directory,
)
from tidewater.controller.quorum.migration import (
    MIGRATED_SUFFIX,
    has_records,
    retire_metadata_log,
)
from tidewater.controller.raft import VoterKey
from tidewater.controller.raft.files import fsync_dir
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError
from tidewater.tools import certs, cluster_sasl, quorum_format_plan
from tidewater.tools.quorum_format_plan import QuorumFormatPlan

MANIFEST_NAME = "cluster.json"
MANIFEST_VERSION = 1
HOST = "127.0.0.1"
# `tide cluster up`'s quorum size (issue 26: no single process holds the metadata).
DEFAULT_CONTROLLERS = 3
DEFAULT_BASE_PORT = 9092
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 15
# ``base_port=0``: plans tried before ``up`` gives up on ports taken under it.
PORT_PLAN_ATTEMPTS = 3
BIND_FAILURE_MARKERS = ("cannot listen on", "address already in use")
# Kafka's controllers and brokers each read max.connections and connections.max.idle.ms
# from their own properties: here a --set of them limits every process's ports.
SHARED_SETTINGS = frozenset({"min.insync.replicas", "broker.session.timeout.ms",
                             "unclean.leader.election.enable", "max.connections",
                             "connections.max.idle.ms"})
PROJECT_DIR = Path(__file__).resolve().parents[1]
TLS_DIR_NAME = "tls"
CLIENT_CERT_NAME = "tide-client"
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP,
           "CONT": signal.SIGCONT}


class ProcessEntry(TypedDict):
    """One process of the manifest (``processes``); the broker_id, internal and kafka
    entries are a broker's."""

    name: str
    kind: str  # "controller" or "broker"
    pid: int
    listen: str
    metrics_port: int
    data_dir: str
    log: str
    command: list[str]
    broker_id: NotRequired[int]
    internal: NotRequired[str]
    kafka: NotRequired[str]
    started_at: NotRequired[float]  # time.time() of its last launch


class Manifest(TypedDict):
    """``cluster.json`` (the module docstring)."""

    version: int
    data_dir: str
    bootstrap: str
    kafka_bootstrap: NotRequired[str]
    controller: str
    controllers: NotRequired[list[str]]  # a quorum's (``--controllers N``), in node id order
    cwd: NotRequired[str]
    processes: dict[str, ProcessEntry]
    tls: NotRequired[certs.ClientTlsFiles]
    sasl: NotRequired[cluster_sasl.SaslEntry]


class LocalClusterError(Exception):
    """A local cluster operation failed; the message is one line plus an optional log tail."""


def _controller_setting_names() -> frozenset[str]:
    try:
        from tidewater.controller.config import ControllerConfig

        return frozenset(ControllerConfig.SETTABLE)
    except Exception:  # controller package missing or changed: use the known names
        return frozenset({"node.id", "default.replication.factor", "num.partitions",
                          "leader.imbalance.check.interval.seconds"}) | SHARED_SETTINGS


def route_settings(settings: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split ``--set`` settings into (controller settings, broker settings)."""
    controller_names = _controller_setting_names()
    to_controller, to_brokers = {}, {}
    for name, value in settings.items():
        if name in controller_names or name.startswith("controller."):
            to_controller[name] = value
        if name in SHARED_SETTINGS or not (name in controller_names or name.startswith("controller.")):
            to_brokers[name] = value
    return to_controller, to_brokers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def controller_names(controllers: int) -> list[str]:
    """``controller`` alone, or ``controller-1``.. for a quorum (``--controllers N``)."""
    return ["controller"] if controllers == 1 else [f"controller-{i}"
                                                    for i in range(1, controllers + 1)]


def plan_ports(brokers: int, base_port: int, controllers: int = 1) -> dict[str, tuple[int, ...]]:
    """name -> (listen port, metrics port[, Raft port]) for the controller(s), (client listen
    port, metrics port, internal port, Kafka port) for brokers 1..N. With a quorum,
    controller i listens on BASE-i, its metrics on BASE+99-(i-1), its Raft port is
    BASE+300+i-1."""
    if base_port == 0:
        # The kernel may hand out a port again once its probe socket is closed: every
        # port of one plan is distinct (two processes given one port: one fails to bind).
        taken: set[int] = set()

        def distinct_free_port() -> int:
            while (port := free_port()) in taken:
                pass
            taken.add(port)
            return port

        ports: dict[str, tuple[int, ...]] = {}
        for name in controller_names(controllers):
            ports[name] = (distinct_free_port(), distinct_free_port()) + (
                (distinct_free_port(),) if controllers > 1 else ())
        for i in range(1, brokers + 1):
            ports[f"broker-{i}"] = (distinct_free_port(), distinct_free_port(),
                                    distinct_free_port(), distinct_free_port())
        return ports
    ports = {"controller": (base_port - 1, base_port + 99)} if controllers == 1 else {
        f"controller-{i}": (base_port - i, base_port + 99 - (i - 1), base_port + 300 + i - 1)
        for i in range(1, controllers + 1)}
    for i in range(1, brokers + 1):
        ports[f"broker-{i}"] = (base_port + i - 1, base_port + 100 + i - 1,
                                base_port + 200 + i - 1, base_port + 10000 + i - 1)
    if (max(max(planned) for planned in ports.values()) > 65535
            or min(min(ports[name]) for name in controller_names(controllers)) < 1):
        raise LocalClusterError(f"--base-port {base_port} puts ports outside 1..65535 "
                                f"(brokers use up to base+10000+N-1)")
    return ports


def make_tls_files(tls_dir: Path, broker_ids: list[int],
                   controllers: int = 1) -> certs.ClientTlsFiles:
    """A CA and the certificates of a local cluster in ``tls_dir`` (kept when there), and
    ``client.properties``; returns the manifest's ``tls`` entry. A quorum's controllers
    get ``controller-<i>`` certificates (role controller) besides ``controller``."""
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    entry = certs.make_cluster_dir(tls_dir, broker_ids, hosts=(HOST, "localhost"),
                                   client_name=CLIENT_CERT_NAME, now=now)
    if controllers > 1:
        for name in controller_names(controllers):
            if certs.needs_issuing(tls_dir, name, "controller"):
                certs.issue_to_dir(tls_dir, name=name, role="controller",
                                   hosts=(HOST, "localhost"), now=now)
    return entry


class PortTakenError(LocalClusterError):
    """A process could not bind a port planned for it. With ``base_port=0`` another
    program took the port between planning and binding: ``up`` plans again."""


class UnfinishedQuorumFormatError(LocalClusterError):
    """A quorum's formatting stopped half-way and cannot be finished as it was begun."""


def format_new_quorum(data_dirs: dict[int, Path], migrate_from: Path | None = None) -> bool:
    """kafka-storage format for each controller of a new quorum (node id -> its
    --data-dir), with random directory ids and every voter as the initial controllers.
    A restart formats nothing: a controller whose directory is missing (wiped) then
    refuses to start, and comes back with ``tide quorum format --no-initial-controllers``
    and ``tide quorum add-controller`` (``controller.quorum.formatting``).

    ``migrate_from``: the folder's single controller's ``metadata.log``; when it holds
    records every controller is formatted holding it (``quorum.migration``) and it is
    renamed ``metadata.log.migrated``. Returns whether it was migrated.

    Resumable: the initial voters (and the migrated log's hash) are recorded first in
    ``quorum-format.json`` beside the data directories (``quorum_format_plan``), removed
    when all is done. A call that finds the record finishes that formatting: it formats
    the directories not formatted yet with the recorded voters (one formatted already is
    never formatted again, it keeps its directory id) and retires the log if still there.
    So a crash at any point leaves a folder the next ``up`` starts. What it cannot finish
    (another controller count, the log changed or gone meanwhile) raises
    ``UnfinishedQuorumFormatError`` naming the fix."""
    raft_dirs = {node_id: raft_directory(d) for node_id, d in sorted(data_dirs.items())}
    plan_path = Path(os.path.commonpath([Path(d).absolute() for d in data_dirs.values()]),
                     quorum_format_plan.FILE_NAME)
    plan = quorum_format_plan.read_plan(plan_path)
    hashed_now = plan is None  # the log's digest taken just now, not by an earlier up
    if plan is None:
        if any(is_formatted(d) for d in raft_dirs.values()):
            return False
        migrating = migrate_from is not None and has_records(migrate_from)
        plan = QuorumFormatPlan(
            frozenset(VoterKey(node_id, new_directory_id()) for node_id in raft_dirs),
            quorum_format_plan.file_sha256(migrate_from)
            if migrate_from is not None and migrating else None)
        quorum_format_plan.write_plan(plan_path, plan)
    _finish_quorum_format(plan, plan_path, raft_dirs, migrate_from, hashed_now)
    return plan.migrating


def _finish_quorum_format(plan: QuorumFormatPlan, plan_path: Path, raft_dirs: dict[int, Path],
                          migrate_from: Path | None, hashed_now: bool) -> None:
    """Format what ``plan`` has left unformatted, retire the migrated log, remove the plan.
    ``hashed_now``: the plan's digest of the log was taken by this call (the log cannot
    have changed since: it is not read twice)."""
    planned = sorted(v.id for v in plan.voters)
    if planned != sorted(raft_dirs):
        raise UnfinishedQuorumFormatError(
            f"{plan_path}: formatting a quorum of controllers {planned} stopped half-way; "
            f"finish it with `tide cluster up --controllers {len(planned)}`")
    missing = [node_id for node_id, d in raft_dirs.items() if not is_formatted(d)]
    log = migrate_from if plan.migrating else None
    if plan.migrating:
        if migrate_from is None or not migrate_from.exists():
            if missing:
                raise UnfinishedQuorumFormatError(
                    f"{plan_path}: migrating {migrate_from} into the quorum stopped half-way "
                    f"and the file is gone: put it back (from {METADATA_LOG_FILE_NAME}"
                    f"{MIGRATED_SUFFIX} if renamed) and run up again")
            log = None  # retired already: a crash just before removing the plan
        elif (not hashed_now
              and quorum_format_plan.file_sha256(migrate_from) != plan.metadata_log_sha256):
            raise UnfinishedQuorumFormatError(
                f"{migrate_from} changed since `tide cluster up` began migrating it into the "
                f"quorum ({plan_path}); controllers formatted from other bytes would "
                f"disagree. If no quorum controller has run, remove {plan_path} and every "
                f"controller's raft directory and run up again")
    for node_id in missing:
        format_controller(raft_dirs[node_id], node_id, plan.voters, migrate_from=log)
    # Every directory's entry durable before the plan that would redo it is gone.
    for directory in dict.fromkeys(p for d in raft_dirs.values() for p in (d.parent,
                                                                           d.parent.parent)):
        fsync_dir(directory)
    if log is not None:
        retire_metadata_log(log)
    quorum_format_plan.remove_plan(plan_path)


def tls_flags(tls_dir: Path, name: str) -> list[str]:
    return ["--tls-ca", str(tls_dir / certs.CA_CERT_FILE), "--tls-cert",
            str(tls_dir / f"{name}.pem"), "--tls-key", str(tls_dir / f"{name}.key")]


def output_since_start(path: Path, name: str) -> str:
    """What ``name`` wrote to its log since ``_launch`` last started it (the log is
    appended to across restarts)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    marker = f" starting {name}\n"
    return text[text.rfind(marker) + len(marker):] if marker in text else text


def failed_to_bind(output: str) -> bool:
    """Whether a process's output shows it could not bind a port: gRPC's and the
    servers' own ``cannot listen on``, asyncio's and http.server's EADDRINUSE."""
    lowered = output.lower()
    return any(marker in lowered for marker in BIND_FAILURE_MARKERS)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _proc_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class ProcessStatus:
    name: str
    pid: int
    alive: bool
    serving: bool
    listen: str
    metrics_port: int
    stopped: bool = False  # SIGSTOPped

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "alive": self.alive, "serving": self.serving,
                "stopped": self.stopped, "listen": self.listen, "metrics_port": self.metrics_port}


class LocalCluster:
    """Start, stop and inspect the processes recorded in ``DIR/cluster.json``."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.manifest_path = self.data_dir / MANIFEST_NAME
        self.manifest: Manifest | None = None
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # processes this object started
        # The single controller's metadata.log ``up`` moved into a new quorum, if it did.
        self.migrated_metadata_log: Path | None = None
        if self.manifest_path.exists():
            self.manifest = self._read_manifest()

    # ------------------------------------------------------------------ manifest

    def _read_manifest(self) -> Manifest:
        try:
            data: Manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as e:
            raise LocalClusterError(f"cannot read {self.manifest_path}: {e}") from None
        if data.get("version") != MANIFEST_VERSION or "processes" not in data:
            raise LocalClusterError(f"{self.manifest_path}: not a version {MANIFEST_VERSION} cluster manifest")
        return data

    def _write_manifest(self) -> None:
        tmp = self.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2) + "\n")
        os.replace(tmp, self.manifest_path)

    def _require_manifest(self) -> Manifest:
        if self.manifest is None:
            raise LocalClusterError(f"no cluster in {self.data_dir} (no {MANIFEST_NAME}); run `tide cluster up` first")
        return self.manifest

    @property
    def bootstrap(self) -> str:
        return self._require_manifest()["bootstrap"]

    @property
    def security(self) -> ClientSecurity:
        """How a client connects: the manifest's ``tls`` entry (a client certificate, so
        the controller's own port answers too) and ``sasl`` entry (the admin user), else
        plaintext."""
        manifest = self._require_manifest()
        tls, sasl = manifest.get("tls"), manifest.get("sasl")
        sasl_options = {} if not sasl else {
            "sasl_mechanism": sasl["mechanism"], "sasl_plain_username": sasl["username"],
            "sasl_plain_password": cluster_sasl.read_password(sasl["command_config"])}
        if not tls:
            return ClientSecurity.from_options("SASL_PLAINTEXT", **sasl_options) if sasl \
                else PLAINTEXT
        return ClientSecurity.from_options("SASL_SSL" if sasl else "SSL", tls["ca"], tls["cert"],
                                           tls["key"], **sasl_options)

    @property
    def controller_address(self) -> str:
        return self._require_manifest()["controller"]

    def process_names(self) -> list[str]:
        return list(self._require_manifest()["processes"])

    def process(self, ident: str | int) -> ProcessEntry:
        """The manifest entry for ``controller``, a broker id, or ``broker-<id>``."""
        procs = self._require_manifest()["processes"]
        name = str(ident)
        if name.isdigit():
            name = f"broker-{name}"
        if name not in procs:
            raise LocalClusterError(f"no process {ident!r} in this cluster (have: {', '.join(procs)})")
        return procs[name]

    # ------------------------------------------------------------------ up / down

    def up(self, brokers: int, *, base_port: int = DEFAULT_BASE_PORT, settings: dict[str, str] | None = None,
           ready_timeout_s: float = READY_TIMEOUT_S, tls: bool = False,
           sasl_mechanisms: tuple[str, ...] = (), authorizer: str = "none",
           super_users: str = "", racks: Sequence[str] = (), controllers: int = 1) -> str:
        """Start a controller and ``brokers`` brokers; return the bootstrap address once all
        serve. ``tls``: certificates under ``DIR/tls`` and TLS on every port.
        ``sasl_mechanisms`` / ``authorizer``: SASL on the Kafka listeners and ACL checks,
        with an ``admin`` super user (``cluster_sasl``). ``racks``: broker i's
        ``broker.rack`` is ``racks[(i - 1) % len(racks)]`` (so "a,b" alternates).
        ``base_port=0``: a process that finds a planned port taken (``PortTakenError``)
        makes ``up`` stop what it started and try a new plan, ``PORT_PLAN_ATTEMPTS`` in all."""
        if brokers < 1:
            raise LocalClusterError("--brokers must be at least 1")
        if controllers < 1:
            raise LocalClusterError("--controllers must be at least 1")
        if controllers > 1 and not tls and (sasl_mechanisms or authorizer != "none"):
            raise LocalClusterError("a quorum of controllers with SASL or ACLs needs --tls: "
                                    "its Raft port authenticates by certificate only")
        if any(not rack for rack in racks):
            raise LocalClusterError("--rack: a rack name is empty")
        if self.manifest is not None and any(self._is_alive(p) for p in self.manifest["processes"].values()):
            raise LocalClusterError(f"a cluster is already running in {self.data_dir}; `tide cluster down` first")
        # Free ports are probed, then released for the processes to bind: another program
        # may take one meanwhile (seen in CI). With base_port 0 a new plan is as good.
        start = functools.partial(
            self._up_once, brokers, base_port=base_port, settings=settings,
            ready_timeout_s=ready_timeout_s, tls=tls, sasl_mechanisms=sasl_mechanisms,
            authorizer=authorizer, super_users=super_users, racks=racks, controllers=controllers)
        for _ in range(PORT_PLAN_ATTEMPTS - 1 if base_port == 0 else 0):
            try:
                return start()
            except PortTakenError:
                pass  # what it started is stopped: plan again
        return start()

    def _up_once(self, brokers: int, *, base_port: int, settings: dict[str, str] | None,
                 ready_timeout_s: float, tls: bool, sasl_mechanisms: tuple[str, ...],
                 authorizer: str, super_users: str, racks: Sequence[str],
                 controllers: int) -> str:
        ports = plan_ports(brokers, base_port, controllers)
        busy = sorted(p for planned in ports.values() for p in planned if port_in_use(p))
        if busy:
            raise PortTakenError(f"port(s) in use on {HOST}: {', '.join(map(str, busy))} "
                                 "(choose another --base-port)")
        controller_settings, broker_settings = route_settings(dict(settings or {}))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        names = controller_names(controllers)
        controller_listen = f"{HOST}:{ports[names[0]][0]}"
        tls_dir = self.data_dir / TLS_DIR_NAME
        tls_entry = make_tls_files(tls_dir, list(range(1, brokers + 1)),
                                   controllers=controllers) if tls else None
        processes: dict[str, ProcessEntry] = {}
        secured = bool(sasl_mechanisms) or authorizer != "none"
        broker_credentials = cluster_sasl.broker_properties(self.data_dir) if secured else None
        sasl_entry = (cluster_sasl.admin_properties(
            self.data_dir, sasl_mechanisms, ca=tls_entry["ca"] if tls_entry else None)
            if secured else None)
        # A quorum: each controller's node id is its number, its Raft port the third.
        voters = ",".join(f"{i}@{HOST}:{ports[name][2]}" for i, name in enumerate(names, 1)
                          ) if controllers > 1 else ""
        for node_id, name in enumerate(names, 1):
            listen = f"{HOST}:{ports[name][0]}"
            cmd = [sys.executable, "-m", "tidewater.controller", "--listen", listen,
                   "--data-dir", str(self.data_dir / name),
                   "--metrics-port", str(ports[name][1])]
            for key, value in controller_settings.items():
                cmd += ["--set", f"{key}={value}"]
            if voters:
                cmd += ["--set", f"node.id={node_id}", "--set",
                        f"controller.quorum.voters={voters}"]
            if tls:
                # A quorum's controllers each have their own (``controller-<i>``): the Raft
                # port binds a certificate to the node id it may send as.
                cmd += tls_flags(tls_dir, "controller" if controllers == 1 else name)
            if sasl_entry is not None:
                cmd += cluster_sasl.controller_flags(sasl_mechanisms, authorizer, super_users,
                                                     sasl_entry["command_config"],
                                                     str(broker_credentials))
            processes[name] = {
                "name": name, "kind": "controller", "pid": 0, "listen": listen,
                "metrics_port": ports[name][1], "data_dir": str(self.data_dir / name),
                "log": str(self.data_dir / f"{name}.log"), "command": cmd}
        # What brokers are given: every controller, with ids (they follow leader hints).
        broker_controllers = ",".join(
            f"{i}@{processes[name]['listen']}" for i, name in enumerate(names, 1)
        ) if controllers > 1 else controller_listen
        for i in range(1, brokers + 1):
            name = f"broker-{i}"
            listen = f"{HOST}:{ports[name][0]}"
            internal = f"{HOST}:{ports[name][2]}"
            kafka = f"{HOST}:{ports[name][3]}"
            cmd = [sys.executable, "-m", "tidewater.broker", "--broker-id", str(i),
                   "--listen", internal, "--external-listen", listen, "--kafka-listen", kafka,
                   "--controller", broker_controllers, "--data-dir", str(self.data_dir / name),
                   "--metrics-port", str(ports[name][1])]
            for key, value in broker_settings.items():
                cmd += ["--set", f"{key}={value}"]
            if racks:
                cmd += ["--set", f"broker.rack={racks[(i - 1) % len(racks)]}"]
            if tls:
                cmd += tls_flags(tls_dir, name)
            if secured:
                cmd += cluster_sasl.broker_flags(sasl_mechanisms, authorizer, super_users,
                                                 str(broker_credentials))
            processes[name] = {
                "name": name, "kind": "broker", "broker_id": i, "pid": 0, "listen": listen,
                "internal": internal, "kafka": kafka, "metrics_port": ports[name][1], "data_dir": str(self.data_dir / name),
                "log": str(self.data_dir / f"{name}.log"), "command": cmd}
        self.manifest = {
            "version": MANIFEST_VERSION, "data_dir": str(self.data_dir),
            "bootstrap": ",".join(processes[f"broker-{i}"]["listen"] for i in range(1, brokers + 1)),
            "kafka_bootstrap": ",".join(processes[f"broker-{i}"]["kafka"]
                                        for i in range(1, brokers + 1)),
            "controller": controller_listen, "cwd": str(PROJECT_DIR), "processes": processes}
        if controllers > 1:
            self.manifest["controllers"] = [processes[name]["listen"] for name in names]
        if tls_entry is not None:
            self.manifest["tls"] = tls_entry
        if sasl_entry is not None:
            self.manifest["sasl"] = sasl_entry
        self._write_manifest()
        if voters:
            # A folder that ran one controller: its metadata moves into the quorum (else
            # every topic would be gone).
            single = self.data_dir / controller_names(1)[0] / METADATA_LOG_FILE_NAME
            try:
                migrated = format_new_quorum(
                    {i: self.data_dir / name for i, name in enumerate(names, 1)},
                    migrate_from=single)
            except (TidewaterError, OSError) as e:  # a locked or corrupt log, a full disk
                raise LocalClusterError(f"cannot format the controllers' directories: "
                                        f"{e}") from None
            if migrated:
                self.migrated_metadata_log = single
        try:
            for name in names:
                self._launch(name)
            self._wait_ready(names, ready_timeout_s)
            for i in range(1, brokers + 1):
                self._launch(f"broker-{i}")
            self._wait_ready([f"broker-{i}" for i in range(1, brokers + 1)], ready_timeout_s)
        except BaseException:
            self.down(timeout_s=5)
            raise
        return self.bootstrap

    def down(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop every process (brokers first, then the controller): SIGTERM, then SIGKILL after
        ``timeout_s``. Returns the names that needed SIGKILL."""
        manifest = self._require_manifest()
        brokers = [n for n, p in manifest["processes"].items() if p["kind"] == "broker"]
        killed = self._stop(brokers, timeout_s)
        killed += self._stop([n for n, p in manifest["processes"].items()
                              if p["kind"] == "controller"], timeout_s)
        return killed

    def _stop(self, names: list[str], timeout_s: float) -> list[str]:
        procs = [self.process(n) for n in names]
        running = [p for p in procs if self._is_alive(p)]
        for p in running:
            # A stopped process cannot act on SIGTERM until it is continued.
            self._signal(p, signal.SIGCONT)
            self._signal(p, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(self._is_alive(p) for p in running):
            time.sleep(0.05)
        killed = []
        for p in running:
            if self._is_alive(p):
                self._signal(p, signal.SIGKILL)
                killed.append(p["name"])
        for p in running:
            self._wait_dead(p, 5)
        return killed

    # ------------------------------------------------------------------ one process

    def kill(self, ident: str | int, sig: str = "KILL", *,
             term_timeout_s: float = STOP_TIMEOUT_S) -> ProcessEntry:
        """Send KILL, TERM, STOP or CONT to one process. KILL and TERM return once it is gone
        (TERM: a broker's controlled shutdown may take seconds), so ``start`` can follow."""
        sig = sig.upper()
        if sig not in SIGNALS:
            raise LocalClusterError(f"unknown signal {sig!r} (use KILL, TERM, STOP or CONT)")
        proc = self.process(ident)
        if not self._is_alive(proc):
            raise LocalClusterError(f"{proc['name']} (pid {proc['pid']}) is not running")
        if sig == "TERM" and _proc_state(proc["pid"]) == "T":
            self._signal(proc, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        self._signal(proc, SIGNALS[sig])
        if sig == "KILL":
            self._wait_dead(proc, 5)
        elif sig == "TERM" and not self._wait_dead(proc, term_timeout_s):
            raise LocalClusterError(f"{proc['name']} (pid {proc['pid']}) still running "
                                    f"{term_timeout_s:g} s after SIGTERM")
        return proc

    def start(self, ident: str | int, ready_timeout_s: float = READY_TIMEOUT_S) -> ProcessEntry:
        """Re-launch one process with its recorded command; return once it serves again."""
        proc = self.process(ident)
        if self._is_alive(proc):
            raise LocalClusterError(f"{proc['name']} is already running (pid {proc['pid']})")
        self._launch(proc["name"])
        self._wait_ready([proc["name"]], ready_timeout_s)
        return self.process(ident)

    def status(self) -> list[ProcessStatus]:
        out = []
        pool = ChannelPool(self.security)
        try:
            for proc in self._require_manifest()["processes"].values():
                alive = self._is_alive(proc)
                stopped = alive and _proc_state(proc["pid"]) == "T"
                serving = alive and not stopped and self._serves(proc, pool, timeout_s=1.0)
                out.append(ProcessStatus(proc["name"], proc["pid"], alive, serving, proc["listen"],
                                         proc["metrics_port"], stopped))
        finally:
            pool.close()
        return out

    # ------------------------------------------------------------------ internals

    def _launch(self, name: str) -> None:
        proc = self.process(name)
        Path(proc["data_dir"]).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(PROJECT_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(proc["log"], "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}\n".encode())
            log.flush()
            child = subprocess.Popen(proc["command"], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     cwd=self._require_manifest().get("cwd", PROJECT_DIR),
                                     env=env, start_new_session=True)
        self._children[child.pid] = child
        proc["pid"] = child.pid
        proc["started_at"] = time.time()
        self._write_manifest()

    def _wait_ready(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(names)
        pool = ChannelPool(self.security)
        try:
            while pending:
                for name in list(pending):
                    proc = self.process(name)
                    if not self._is_alive(proc):
                        error = (PortTakenError if failed_to_bind(
                            output_since_start(Path(proc["log"]), name)) else LocalClusterError)
                        raise error(
                            f"{name} exited during start-up (log {proc['log']}):\n{tail(Path(proc['log']))}")
                    if self._serves(proc, pool, timeout_s=1.0):
                        pending.remove(name)
                if not pending:
                    return
                if time.monotonic() > deadline:
                    name = pending[0]
                    proc = self.process(name)
                    raise LocalClusterError(
                        f"{name} not serving after {timeout_s:.0f} s (log {proc['log']}):\n"
                        f"{tail(Path(proc['log']))}")
                time.sleep(0.1)
        finally:
            pool.close()

    def _serves(self, proc: ProcessEntry, pool: ChannelPool, timeout_s: float) -> bool:
        """Controller: answers DescribeCluster. Broker: its own Metadata names it (it
        registered and the controller's metadata reached it) and the controller lists it
        registered and unfenced. The first alone is not enough: a restarted controller lists
        the brokers of its log as registered until their sessions lapse, before the new
        processes have registered (a second incarnation waits for that, as Kafka's)."""
        try:
            if proc["kind"] == "controller":
                try:
                    pool.controller(parse_address(proc["listen"])).DescribeCluster(
                        pb.DescribeClusterRequest(), timeout=timeout_s)
                except grpc.RpcError as e:
                    # A quorum's standby serves: it answers NOT_CONTROLLER.
                    return "NOT_CONTROLLER" in (e.details() or "")
                return True
            own = pool.broker(parse_address(proc["listen"])).Metadata(
                pb.MetadataRequest(), timeout=timeout_s)
            resp = self._describe_on_active(pool, timeout_s)
        except grpc.RpcError:
            return False
        return (any(b.broker_id == proc["broker_id"] for b in own.brokers)
                and any(b.broker_id == proc["broker_id"] and not b.fenced
                        for b in resp.brokers))

    def _describe_on_active(self, pool: ChannelPool, timeout_s: float
                            ) -> pb.DescribeClusterResponse:
        """DescribeCluster from the controller, or the first of a quorum's that answers
        (the active one); raises the last ``grpc.RpcError`` when none does."""
        manifest = self._require_manifest()
        error: grpc.RpcError | None = None
        for address in manifest.get("controllers") or [manifest["controller"]]:
            try:
                answer: pb.DescribeClusterResponse = pool.controller(
                    parse_address(address)).DescribeCluster(pb.DescribeClusterRequest(),
                                                            timeout=timeout_s)
                return answer
            except grpc.RpcError as e:
                error = e
        assert error is not None
        raise error

    def _is_alive(self, proc: ProcessEntry) -> bool:
        pid = proc.get("pid") or 0
        if pid <= 0:
            return False
        child = self._children.get(pid)
        if child is not None:
            # Our own child: poll() is exact. Its /proc cmdline is not: between
            # fork and exec it still shows this process's command line.
            return child.poll() is None
        state = _proc_state(pid)
        if state is None or state in ("Z", "X"):
            return False
        return self._is_ours(proc)

    def _is_ours(self, proc: ProcessEntry) -> bool:
        """The pid still runs the recorded command (guards against pid reuse)."""
        cmdline = _proc_cmdline(proc["pid"])
        return cmdline is not None and cmdline[1:] == proc["command"][1:]

    def _signal(self, proc: ProcessEntry, sig: int) -> None:
        if not self._is_alive(proc):
            return
        try:
            os.kill(proc["pid"], sig)
        except ProcessLookupError:
            pass

    def _wait_dead(self, proc: ProcessEntry, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._is_alive(proc):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True
