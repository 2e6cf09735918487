"""Fixtures for the Docker tests: the image, and one compose cluster per session.

Everything here is skipped, with the reason, when no Docker engine answers or
docker-compose is missing. The cluster runs under a project name unique to the
test run (``tidewater-test-<hex>``) on the network compose creates for that
project, with free host ports (gRPC, Kafka, metrics) and its own data folder,
so it never touches a user's `make up` cluster; it is removed with ``down -v``
at the end. The image is ``$TIDE_IMAGE`` (default ``tidewater:latest``, as for
`make up`), built by `make image IMAGE=...`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_TLS_FILE = ROOT / "deploy" / "compose-tls.yml"
COMPOSE_SASL_FILE = ROOT / "deploy" / "compose-sasl.yml"
IMAGE = os.environ.get("TIDE_IMAGE") or "tidewater:latest"
IMAGE_BUILD_TIMEOUT_S = 900
UP_TIMEOUT_S = 240
EPHEMERAL_BELOW = 32768  # the kernel's default ip_local_port_range starts here
QUORUM_STANDBY_SERVICES = ("controller-2", "controller-3")  # with `controller`: the quorum
BROKER_SERVICES = ("broker-1", "broker-2", "broker-3")
CONTROLLER_SERVICES = ("controller",) + QUORUM_STANDBY_SERVICES


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "docker info did not answer within 30 s"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"no Docker engine answers (docker info: {last})"
    if shutil.which("docker-compose") is None:
        return "docker-compose (v1) is not installed"
    return None


DOCKER_PROBLEM = _docker_problem()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.docker)
            if DOCKER_PROBLEM:
                item.add_marker(pytest.mark.skip(reason=f"Docker tests skipped: {DOCKER_PROBLEM}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every probe socket stays bound until all are
    chosen (one at a time, the kernel may hand a port out twice, and two services
    publishing one host port fail to start).
    Below the kernel's ephemeral range (``ip_local_port_range``, 32768.. by default):
    a port the kernel hands out may be some client connection's local port by the time
    Docker's proxy binds it (seen on a loaded host)."""
    sockets: list[socket.socket] = []
    rng = random.Random()
    try:
        for _ in range(count * 50):
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(EPHEMERAL_BELOW - 10_000, EPHEMERAL_BELOW)))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise RuntimeError(f"only {len(sockets)} of {count} free ports found")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run(cmd, *, env=None, timeout_s=120, check=True, input=None) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                       input=input)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@dataclass
class ComposeTestCluster:
    project: str
    env: dict
    data_dir: Path
    broker_ports: dict[int, int]
    kafka_ports: dict[int, int]
    metrics_ports: dict[str, int]
    image: str = IMAGE
    up_output: str = ""  # what deploy/up.py printed
    containers: dict[str, str] = field(default_factory=dict)
    compose_files: list[Path] = field(default_factory=lambda: [COMPOSE_FILE])

    @property
    def command_config(self) -> str | None:
        """sasl/admin.properties of a SASL cluster, client.properties of a TLS one (None:
        plaintext)."""
        if self.env.get("TIDE_SASL_DIR"):
            return str(Path(self.env["TIDE_SASL_DIR"]) / "admin.properties")
        tls_dir = self.env.get("TIDE_TLS_DIR")
        return str(Path(tls_dir) / "client.properties") if tls_dir else None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for _, port in sorted(self.broker_ports.items()))

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' Kafka listeners published on the host (KAFKA_EXTERNAL)."""
        return ",".join(f"127.0.0.1:{port}" for _, port in sorted(self.kafka_ports.items()))

    def compose(self, *args, timeout_s=180, check=True):
        files = [arg for path in self.compose_files for arg in ("-f", str(path))]
        return run(["docker-compose", "-p", self.project, *files, *args],
                   env=self.env, timeout_s=timeout_s, check=check)

    def tide(self, *args, bootstrap=None, timeout_s=120, check=False, input=None):
        cmd = [sys.executable, "-m", "tidewater.tools", "--bootstrap-server", bootstrap or self.bootstrap,
               *(["--command-config", self.command_config] if self.command_config else []), *args]
        return run(cmd, timeout_s=timeout_s, check=check, input=input)

    def container(self, service: str) -> str:
        r = run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                 "--filter", f"label=com.docker.compose.service={service}"])
        return r.stdout.split()[0]

    def state(self, service: str) -> dict:
        return json.loads(run(["docker", "inspect", self.container(service)]).stdout)[0]["State"]

    def wait_healthy(self, service: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (self.state(service).get("Health") or {}).get("Status") == "healthy":
                return
            time.sleep(0.5)
        pytest.fail(f"{service} not healthy after {timeout_s} s")

    def describe(self, topic: str) -> dict:
        r = self.tide("topics", "describe", topic, "--json", check=True)
        return {p["partition"]: p for p in json.loads(r.stdout)["topics"][0]["partitions"]}


@pytest.fixture(scope="session")
def image():
    """`make image`: the wheelhouse and the image (debootstrap base when nothing can be pulled)."""
    started = time.monotonic()
    run(["make", "image", f"IMAGE={IMAGE}"], timeout_s=IMAGE_BUILD_TIMEOUT_S)
    return {"build_s": time.monotonic() - started}


@pytest.fixture(scope="session")
def chaos_run_dir(tmp_path_factory) -> Path:
    """Where test_compose's chaos run writes; the Spark audit test reads it (or runs its own)."""
    return tmp_path_factory.mktemp("chaos-run") / "chaos"


@pytest.fixture(scope="session")
def compose_cluster(image, tmp_path_factory):
    yield from _compose_cluster(tmp_path_factory, tls=False)


@pytest.fixture(scope="module")
def compose_tls_cluster(image, tmp_path_factory):
    """The cluster as `make up TLS=1` runs it: deploy/compose-tls.yml on top, certificates
    from `tide certs cluster --names-as-hosts` in the cluster's own folder."""
    yield from _compose_cluster(tmp_path_factory, tls=True)


@pytest.fixture(scope="module")
def compose_sasl_cluster(image, tmp_path_factory):
    """The cluster as `make up TLS=1 SASL=1` runs it: compose-tls.yml and compose-sasl.yml
    on top, the users from deploy/sasl_users.py beside the certificates."""
    yield from _compose_cluster(tmp_path_factory, tls=True, sasl=True)


def _compose_cluster(tmp_path_factory, *, tls: bool, sasl: bool = False):
    project = f"tidewater-test-{uuid.uuid4().hex[:8]}"
    data_dir = tmp_path_factory.mktemp("compose-data")
    members = ("controller",) + QUORUM_STANDBY_SERVICES + BROKER_SERVICES
    for service in members:
        (data_dir / service).mkdir()
    ports = free_ports(6 + len(members) + 3)
    broker_ports = {i: ports.pop() for i in (1, 2, 3)}
    kafka_ports = {i: ports.pop() for i in (1, 2, 3)}
    metrics_ports = {s: ports.pop() for s in members}
    env = dict(os.environ, TIDE_IMAGE=IMAGE, TIDE_DATA_DIR=str(data_dir),
               TIDE_CONTROLLER_METRICS_PORT=str(metrics_ports["controller"]),
               TIDE_CONSOLE_PORT=str(ports.pop()))
    for n in (2, 3):  # published even where the service is left out: an unused free port
        env[f"TIDE_CONTROLLER_{n}_METRICS_PORT"] = str(metrics_ports.get(f"controller-{n}")
                                                       or ports.pop())
    for i in (1, 2, 3):
        env[f"TIDE_BROKER_{i}_PORT"] = str(broker_ports[i])
        env[f"TIDE_BROKER_{i}_KAFKA_PORT"] = str(kafka_ports[i])
        env[f"TIDE_BROKER_{i}_METRICS_PORT"] = str(metrics_ports[f"broker-{i}"])
    compose_files = [COMPOSE_FILE]
    if tls:
        tls_dir = data_dir / "tls"
        run([sys.executable, "-m", "tidewater.tools", "certs", "cluster", "--dir", str(tls_dir),
             "--brokers", "3", "--controllers", "3", "--names-as-hosts"])
        env["TIDE_TLS_DIR"] = str(tls_dir)
        compose_files.append(COMPOSE_TLS_FILE)
    if sasl:
        run([sys.executable, str(ROOT / "deploy" / "sasl_users.py"), "--dir", str(tls_dir)])
        env["TIDE_SASL_DIR"] = str(tls_dir / "sasl")
        compose_files.append(COMPOSE_SASL_FILE)
    cluster = ComposeTestCluster(project, env, data_dir, broker_ports, kafka_ports, metrics_ports,
                                 compose_files=compose_files)
    try:
        cluster.compose("up", "-d", timeout_s=UP_TIMEOUT_S)
        up = run([sys.executable, str(ROOT / "deploy" / "up.py"), "--compose-project", project,
                  "--topic", "demo"], timeout_s=UP_TIMEOUT_S)
        cluster.up_output = up.stdout
        yield cluster
    finally:
        logs = cluster.compose("logs", "--no-color", "--tail", "40", check=False, timeout_s=60)
        (Path(str(data_dir)).parent / f"{project}.log").write_text(logs.stdout + logs.stderr)
        cluster.compose("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout_s=180)
        shutil.rmtree(data_dir, ignore_errors=True)
