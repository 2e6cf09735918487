"""The clusters chaos acts on, behind one interface.

Node names are the controllers' (``controller`` alone, or the quorum's: compose's
``controller``, ``controller-2``, ``controller-3``; a local cluster's
``controller-1``..``N``) and ``broker-<id>``, in both kinds. ``controller_names()``
lists the controllers, ``controller_node(node_id)`` names the one with a quorum
node id (the active controller's, as DescribeCluster reports it).

| fault      | docker-compose (``ComposeCluster``)     | local (``LocalChaosCluster``)  |
|------------|-----------------------------------------|--------------------------------|
| kill       | ``docker kill -s KILL`` (no restart:     | SIGKILL by pid                 |
|            | a killed container counts as stopped by |                                |
|            | hand, so ``unless-stopped`` leaves it)  |                                |
| start      | ``docker start``, wait for healthy      | relaunch, wait until serving   |
| pause      | ``docker pause`` (cgroup freezer)       | SIGSTOP                        |
| unpause    | ``docker unpause``                      | SIGCONT                        |
| isolate    | ``docker network disconnect``           | SIGSTOP (no network to cut:    |
|            |                                         | a stopped process is silent)   |
| heal       | ``docker network connect --alias <svc>``| SIGCONT                        |

A compose cluster is found by its project name through the labels
docker-compose puts on containers; ports and data folders come from
``docker inspect`` (so overrides such as ``TIDE_BROKER_1_PORT`` need no
repeating here), and so do the Kafka listeners: the host side from the port
published for ``29092`` (KAFKA_EXTERNAL), the network side from each broker's
``--kafka-advertise`` (KAFKA).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tidewater.client.security import (
    SecurityConfigError,
    SecurityOptions,
    parse_properties,
    security_kwargs,
)
from tidewater.tools.scrape import ScrapeCredentials, ScrapeTarget, target_for

if TYPE_CHECKING:
    from tidewater.tools.local_cluster import ProcessEntry

BROKER_NAME = re.compile(r"^broker-(\d+)$")
CONTROLLER_NAME = re.compile(r"^controller(?:-(\d+))?$")
DOCKER_TIMEOUT_S = 60
COMPOSE_LABEL_PROJECT = "com.docker.compose.project"
COMPOSE_LABEL_SERVICE = "com.docker.compose.service"
EXTERNAL_PORT = "19092/tcp"
KAFKA_EXTERNAL_PORT = "29092/tcp"
KAFKA_ADVERTISE_FLAG = "--kafka-advertise"
METRICS_PORT = "9100/tcp"
SASL_ADMIN_MOUNT = "/sasl/admin.properties"  # deploy/compose-sasl.yml, the controller's
TLS_MOUNT = "/tls"  # where deploy/compose-tls.yml mounts each container's TLS files
DATA_MOUNT = "/data"
START_CHECK_TIMEOUT_S = 30


class ChaosTargetError(RuntimeError):
    """The cluster cannot be found or a fault cannot be applied; one-line message."""


def broker_id_of(node: str) -> int | None:
    m = BROKER_NAME.match(node)
    return int(m.group(1)) if m else None


def controller_node_id_of(node: str) -> int | None:
    """A controller's quorum node id by its name: ``controller-N`` is N, ``controller``
    is 1 (compose's node 1; a lone controller's id is 1 too); None for a broker."""
    m = CONTROLLER_NAME.match(node)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 1


def controller_node(names: list[str], node_id: int) -> str | None:
    """The name among ``names`` of the controller with quorum node id ``node_id``."""
    for name in names:
        if controller_node_id_of(name) == node_id:
            return name
    return None


class ChaosCluster(Protocol):
    kind: str

    def node_names(self) -> list[str]: ...
    def controller_names(self) -> list[str]: ...
    def broker_ids(self) -> list[int]: ...
    def bootstrap(self) -> str: ...
    def kafka_bootstrap(self) -> str: ...  # the Kafka listeners (--transactional's clients)
    def client_security(self) -> SecurityOptions: ...
    def metrics_targets(self) -> list[ScrapeTarget]: ...
    def data_dirs(self) -> dict[str, Path]: ...
    def kill(self, node: str) -> None: ...
    def start(self, node: str) -> None: ...
    def pause(self, node: str) -> None: ...
    def unpause(self, node: str) -> None: ...
    def isolate(self, node: str) -> None: ...
    def heal(self, node: str) -> None: ...
    def is_running(self, node: str) -> bool: ...
    def heal_everything(self) -> list[str]: ...  # "unpause broker-2", "start controller", ...


def _run(cmd: list[str], *, check: bool = True, timeout_s: float = DOCKER_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise ChaosTargetError(f"{cmd[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise ChaosTargetError(f"{' '.join(cmd)}: no answer within {timeout_s:.0f} s") from None
    if check and done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ChaosTargetError(f"{' '.join(cmd)}: {reason[-1] if reason else f'exit {done.returncode}'}")
    return done.stdout


class ComposeCluster:
    """A docker-compose project: ``controller`` (and ``controller-N``) and ``broker-N``
    services."""

    kind = "compose"

    def __init__(self, project: str = "tidewater", compose_file: Path | None = None,
                 docker: str = "docker") -> None:
        self.project = project
        self.compose_file = compose_file
        self.docker = docker
        self._containers = self._find_containers()
        if "controller" not in self._containers or not self.broker_ids():
            raise ChaosTargetError(
                f"compose project {project!r} has no controller and brokers "
                f"(found: {', '.join(sorted(self._containers)) or 'nothing'}); run `make up` first")
        self._inspect_cache: dict[str, dict[str, Any]] = {}
        self.network = self._network_name()

    def _find_containers(self) -> dict[str, str]:
        out = _run([self.docker, "ps", "-a", "--filter", f"label={COMPOSE_LABEL_PROJECT}={self.project}",
                    "--format", "{{.ID}}\t{{.Label \"" + COMPOSE_LABEL_SERVICE + "\"}}"])
        containers: dict[str, str] = {}
        for line in out.splitlines():
            cid, _, service = line.partition("\t")
            if service:
                containers[service] = cid
        return containers

    def container(self, node: str) -> str:
        try:
            return self._containers[node]
        except KeyError:
            raise ChaosTargetError(f"no service {node!r} in compose project {self.project!r}") from None

    def inspect(self, node: str, *, fresh: bool = False) -> dict[str, Any]:
        """``docker inspect``'s JSON of the node's container (cached unless ``fresh``)."""
        if fresh or node not in self._inspect_cache:
            self._inspect_cache[node] = json.loads(_run([self.docker, "inspect", self.container(node)]))[0]
        return self._inspect_cache[node]

    def _network_name(self) -> str:
        # Configured networks survive a disconnect; NetworkSettings would not.
        nets: list[str] = list(self.inspect("controller")["NetworkSettings"]["Networks"])
        if not nets:
            raise ChaosTargetError("controller container is on no network")
        return nets[0]

    def _published(self, node: str, container_port: str) -> str:
        bindings = self.inspect(node)["HostConfig"].get("PortBindings") or {}
        entries = bindings.get(container_port) or []
        if not entries or not entries[0].get("HostPort"):
            raise ChaosTargetError(f"{node}: container port {container_port} is not published")
        host = entries[0].get("HostIp") or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        port: str = entries[0]["HostPort"]
        return f"{host}:{port}"

    def node_names(self) -> list[str]:
        return self.controller_names() + [f"broker-{i}" for i in self.broker_ids()]

    def controller_names(self) -> list[str]:
        """The controller services that run (a service left out by a profile has no
        container), node 1 (``controller``) first."""
        return sorted((n for n in self._containers if controller_node_id_of(n) is not None),
                      key=lambda n: controller_node_id_of(n) or 0)

    def broker_ids(self) -> list[int]:
        return sorted(i for i in map(broker_id_of, self._containers) if i is not None)

    def bootstrap(self) -> str:
        return ",".join(self._published(f"broker-{i}", EXTERNAL_PORT) for i in self.broker_ids())

    def kafka_bootstrap(self) -> str:
        """Kafka clients on the host: every broker's KAFKA_EXTERNAL listener, as published."""
        return ",".join(self._published(f"broker-{i}", KAFKA_EXTERNAL_PORT) for i in self.broker_ids())

    def kafka_network_bootstrap(self) -> str:
        """Kafka clients on the compose network: every broker's advertised KAFKA listener."""
        return ",".join(self._flag(f"broker-{i}", KAFKA_ADVERTISE_FLAG) for i in self.broker_ids())

    def client_security(self) -> SecurityOptions:
        """The clients' TLS options when the brokers run with TLS (deploy/compose-tls.yml
        sets TIDE_TLS_CA): the CA and the ``client`` certificate of the host's TLS folder,
        the one the containers' ``/tls/ca.pem`` comes from (each container mounts only
        the CA certificate and its own files); {} (plaintext) otherwise."""
        info = self.inspect(f"broker-{self.broker_ids()[0]}")
        env = dict(e.split("=", 1) for e in info["Config"].get("Env") or [] if "=" in e)
        if not env.get("TIDE_TLS_CA"):
            return {}
        tls_dir: Path | None = None
        for mount in info.get("Mounts") or []:
            source, destination = mount.get("Source"), mount.get("Destination")
            if source and destination == f"{TLS_MOUNT}/ca.pem":
                tls_dir = Path(source).parent
            elif source and destination == TLS_MOUNT:  # a whole folder (older compose files)
                tls_dir = Path(source)
        if tls_dir is None:
            raise ChaosTargetError(f"the brokers run with TLS but mount no {TLS_MOUNT}/ca.pem")
        security: SecurityOptions = {
            "security_protocol": "SSL", "ssl_cafile": str(tls_dir / "ca.pem"),
            "ssl_certfile": str(tls_dir / "client.pem"), "ssl_keyfile": str(tls_dir / "client.key")}
        admin = self._sasl_admin_properties()
        if admin is not None:  # deploy/compose-sasl.yml: as its super user, over SASL_SSL
            try:
                properties = parse_properties(admin.read_text())
            except (OSError, SecurityConfigError) as e:
                raise ChaosTargetError(f"cannot read the SASL admin's {admin}: {e}") from None
            security["security_protocol"] = "SASL_SSL"
            security["sasl_mechanism"] = properties.get("sasl.mechanism")
            security["sasl_plain_username"] = properties.get("sasl.username")
            security["sasl_plain_password"] = properties.get("sasl.password")
        return security

    def _sasl_admin_properties(self) -> Path | None:
        """The host's admin.properties the controller mounts at /sasl (compose-sasl.yml)."""
        for mount in self.inspect("controller").get("Mounts") or []:
            if mount.get("Destination") == SASL_ADMIN_MOUNT and mount.get("Source"):
                return Path(mount["Source"])
        return None

    def _flag(self, node: str, flag: str) -> str:
        command: list[str] = self.inspect(node)["Config"].get("Cmd") or []
        for i, arg in enumerate(command):
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
            if arg == flag and i + 1 < len(command):
                return command[i + 1]
        raise ChaosTargetError(f"{node}: its command has no {flag}")

    def metrics_targets(self) -> list[ScrapeTarget]:
        # With TLS every /metrics (brokers' and controller's) is HTTPS with the
        # process's own certificate.
        # In secure mode it answers only a client certificate of the CA or a user's
        # password: the clients' own (ScrapeCredentials).
        security = self.client_security()
        cafile = security.get("ssl_cafile")
        credentials = ScrapeCredentials.from_security(security)
        return [target_for(node, self._published(node, METRICS_PORT), https=bool(cafile),
                           cafile=cafile, credentials=credentials)
                for node in self.node_names()]

    def data_dirs(self) -> dict[str, Path]:
        dirs = {}
        for node in self.node_names():
            for mount in self.inspect(node).get("Mounts", []):
                if mount.get("Destination") == DATA_MOUNT and mount.get("Type") == "bind":
                    dirs[node] = Path(mount["Source"])
        return dirs

    def is_running(self, node: str) -> bool:
        state = self.inspect(node, fresh=True)["State"]
        return bool(state.get("Running")) and not state.get("Paused")

    def health(self, node: str) -> str:
        state = self.inspect(node, fresh=True)["State"]
        if not state.get("Running"):
            return "exited"
        status: str = (state.get("Health") or {}).get("Status", "none")
        return status

    def wait_healthy(self, nodes: list[str] | None = None, timeout_s: float = 120) -> None:
        pending = list(nodes or self.node_names())
        deadline = time.monotonic() + timeout_s
        while pending:
            pending = [n for n in pending if self.health(n) != "healthy"]
            if not pending:
                return
            if time.monotonic() > deadline:
                states = ", ".join(f"{n}={self.health(n)}" for n in pending)
                raise ChaosTargetError(f"not healthy after {timeout_s:.0f} s: {states} "
                                       f"(see `docker logs {self.container(pending[0])}`)")
            time.sleep(0.5)

    def kill(self, node: str) -> None:
        _run([self.docker, "kill", "-s", "KILL", self.container(node)])

    def start(self, node: str) -> None:
        _run([self.docker, "start", self.container(node)])
        self.wait_healthy([node], timeout_s=90)

    def pause(self, node: str) -> None:
        _run([self.docker, "pause", self.container(node)])

    def unpause(self, node: str) -> None:
        _run([self.docker, "unpause", self.container(node)])

    def isolate(self, node: str) -> None:
        _run([self.docker, "network", "disconnect", self.network, self.container(node)])

    def heal(self, node: str) -> None:
        _run([self.docker, "network", "connect", "--alias", node, self.network, self.container(node)])

    def is_isolated(self, node: str) -> bool:
        nets = self.inspect(node, fresh=True)["NetworkSettings"]["Networks"] or {}
        return self.network not in nets

    def is_paused(self, node: str) -> bool:
        return bool(self.inspect(node, fresh=True)["State"].get("Paused"))

    def heal_everything(self) -> list[str]:
        """Undo every fault found (not only those chaos recorded); returns what it did."""
        done = []
        for node in self.node_names():
            state = self.inspect(node, fresh=True)["State"]
            if state.get("Paused"):
                self.unpause(node)
                done.append(f"unpause {node}")
            if self.is_isolated(node):
                self.heal(node)
                done.append(f"heal {node}")
            if not state.get("Running"):
                _run([self.docker, "start", self.container(node)])
                done.append(f"start {node}")
        self.wait_healthy(timeout_s=120)
        return done


class LocalChaosCluster:
    """A ``tide cluster up`` cluster, through ``tools.local_cluster.LocalCluster``."""

    kind = "local"

    def __init__(self, data_dir: Path) -> None:
        from tidewater.tools.local_cluster import LocalCluster, LocalClusterError

        self._error = LocalClusterError
        self.cluster = LocalCluster(data_dir)
        if self.cluster.manifest is None:
            raise ChaosTargetError(f"no cluster in {data_dir} (no cluster.json); run `tide cluster up` first")

    def _proc(self, node: str) -> ProcessEntry:
        try:
            return self.cluster.process(node)
        except self._error as e:
            raise ChaosTargetError(str(e)) from None

    def node_names(self) -> list[str]:
        return list(self.cluster.process_names())

    def controller_names(self) -> list[str]:
        return [n for n in self.node_names() if controller_node_id_of(n) is not None]

    def broker_ids(self) -> list[int]:
        return sorted(i for i in map(broker_id_of, self.node_names()) if i is not None)

    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def kafka_bootstrap(self) -> str:
        manifest = self.cluster.manifest
        bootstrap = manifest.get("kafka_bootstrap") if manifest is not None else None
        if not bootstrap:
            raise ChaosTargetError("the cluster's manifest names no Kafka listeners")
        return bootstrap

    def client_security(self) -> SecurityOptions:
        """The manifest's client certificate of a ``tide cluster up --tls`` cluster, and
        its admin user's SASL settings with ``--sasl-mechanisms`` (the cluster's
        ``security``); {} (plaintext) otherwise."""
        manifest = self.cluster.manifest
        if manifest is None or not (manifest.get("tls") or manifest.get("sasl")):
            return {}
        return security_kwargs(self.cluster.security)

    def metrics_targets(self) -> list[ScrapeTarget]:
        targets = []
        security = self.client_security()
        cafile = security.get("ssl_cafile")
        credentials = ScrapeCredentials.from_security(security)
        for node in self.node_names():
            port = int(self._proc(node).get("metrics_port") or 0)
            if port > 0:
                # With TLS every /metrics is HTTPS (the process's own certificate); in
                # secure mode it wants the client certificate or the admin's password.
                targets.append(target_for(node, f"127.0.0.1:{port}", cafile=cafile,
                                          https=bool(cafile), credentials=credentials))
        return targets

    def data_dirs(self) -> dict[str, Path]:
        return {node: Path(self._proc(node)["data_dir"]) for node in self.node_names()}

    def _signal(self, node: str, sig: str) -> None:
        try:
            self.cluster.kill(node, sig)
        except self._error as e:
            raise ChaosTargetError(str(e)) from None

    def is_running(self, node: str) -> bool:
        return any(s.name == node and s.alive and not s.stopped for s in self.cluster.status())

    def kill(self, node: str) -> None:
        self._signal(node, "KILL")

    def start(self, node: str) -> None:
        try:
            self.cluster.start(node)
        except self._error as e:
            # LocalCluster can report a child "exited" while it is still between fork and
            # exec (its /proc cmdline is not the recorded one yet): believe only a process
            # that does not serve within the timeout.
            if not self._serving_within(node, START_CHECK_TIMEOUT_S):
                raise ChaosTargetError(str(e)) from None

    def _serving_within(self, node: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(s.name == node and s.serving for s in self.cluster.status()):
                return True
            time.sleep(0.5)
        return False

    def pause(self, node: str) -> None:
        self._signal(node, "STOP")

    def unpause(self, node: str) -> None:
        self._signal(node, "CONT")

    # No network of its own: a stopped process stands in for a cut-off one.
    isolate = pause
    heal = unpause

    def heal_everything(self) -> list[str]:
        done = []
        for s in self.cluster.status():
            if s.alive and s.stopped:
                self._signal(s.name, "CONT")
                done.append(f"unpause {s.name}")
            elif not s.alive:
                self.start(s.name)
                done.append(f"start {s.name}")
        return done
