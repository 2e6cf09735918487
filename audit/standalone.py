"""A Spark standalone cluster from this venv's pyspark: one master and N workers as processes.

    python -m tidewater.audit.standalone up   [--state-dir build/spark] [--port 7177]
                                              [--workers 2] [--worker-cores 1]
                                              [--worker-memory 2g]
    python -m tidewater.audit.standalone down [--state-dir build/spark]
    python -m tidewater.audit.standalone url  [--state-dir build/spark]

(``make spark-up`` / ``make spark-down``.) Every process listens on 127.0.0.1
only. ``up`` prints the master URL once every worker has registered; the
audit runs on it with ``tide audit --master URL`` or ``make audit
SPARK_MASTER=URL``. Executors start the same Python (this venv's, through
PYSPARK_PYTHON) so they import the audit's data sources.

Pitfall this avoids: pip's pyspark scripts find SPARK_HOME with the system's
``python3``, which has no pyspark, and fail with "/bin/spark-class: No such file
or directory". spark_environment() sets SPARK_HOME to the pyspark package and
PYSPARK_PYTHON to this interpreter.

State dir (a cluster is stopped by the pids written here, never by name)::

    state.json          {"master_url", "pids": {"master": N, "worker-1": N, ...},
                         "web_ui_ports": {...}}
    master.log, worker-N.log    each process's output (Spark INFO lines)
    work-N/             each worker's work dir (executor stdout/stderr)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = Path("build/spark")
DEFAULT_PORT = 7177
STATE_FILE = "state.json"
REGISTERED_LINE = "Successfully registered with master"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class StandaloneError(RuntimeError):
    """The cluster cannot be started, found or stopped; the message says why."""


def pyspark_home() -> Path:
    """The pyspark package folder: SPARK_HOME of a pip-installed Spark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_environment(base: Mapping[str, str] | None = None,
                      python: str | None = None) -> dict[str, str]:
    """``base`` (default os.environ) with SPARK_HOME and PYSPARK_PYTHON pointing into the venv."""
    env = dict(os.environ if base is None else base)
    python = python or sys.executable
    env["SPARK_HOME"] = str(pyspark_home())
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The venv's bin first: spark-class and the executors' Python come from there.
    env["PATH"] = str(Path(python).parent) + os.pathsep + env.get("PATH", "")
    return env


@dataclass(frozen=True)
class ClusterPlan:
    """What to start: pure, so the commands can be checked without starting anything."""

    spark_home: Path
    state_dir: Path
    port: int
    web_ui_ports: dict[str, int]
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "2g"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def commands(self) -> dict[str, list[str]]:
        """Process name -> argv (spark-class execs the JVM, so the pid is the JVM's)."""
        spark_class = str(self.spark_home / "bin" / "spark-class")
        out = {"master": [spark_class, "org.apache.spark.deploy.master.Master",
                          "--host", "127.0.0.1", "--port", str(self.port),
                          "--webui-port", str(self.web_ui_ports["master"])]}
        for n in range(1, self.workers + 1):
            name = f"worker-{n}"
            out[name] = [spark_class, "org.apache.spark.deploy.worker.Worker",
                         "--host", "127.0.0.1", "--cores", str(self.worker_cores),
                         "--memory", self.worker_memory,
                         "--webui-port", str(self.web_ui_ports[name]),
                         "--work-dir", str(self.state_dir / f"work-{n}"), self.master_url]
        return out


@dataclass
class ClusterState:
    master_url: str
    pids: dict[str, int] = field(default_factory=dict)
    web_ui_ports: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"master_url": self.master_url, "pids": self.pids,
                           "web_ui_ports": self.web_ui_ports}, indent=2)

    @classmethod
    def from_json(cls, text: str, where: str = STATE_FILE) -> ClusterState:
        try:
            obj = json.loads(text)
            pids = {str(k): int(v) for k, v in obj["pids"].items()}
            return cls(str(obj["master_url"]), pids,
                       {str(k): int(v) for k, v in obj.get("web_ui_ports", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StandaloneError(f"{where}: not a cluster state file: {e}") from None


def read_state(state_dir: Path) -> ClusterState | None:
    path = state_dir / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return ClusterState.from_json(text, str(path))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped) is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def up(state_dir: Path, port: int = DEFAULT_PORT, workers: int = 2, worker_cores: int = 1,
       worker_memory: str = "2g", timeout_s: float = START_TIMEOUT_S) -> ClusterState:
    """Start master and workers; return once every worker registered (or raise, stopping all)."""
    state_dir = state_dir.resolve()
    existing = read_state(state_dir)
    if existing and any(pid_alive(p) for p in existing.pids.values()):
        raise StandaloneError(f"a cluster from {state_dir} is running ({existing.master_url}); "
                              "stop it first (make spark-down)")
    if port_in_use(port):
        raise StandaloneError(f"port {port} on 127.0.0.1 is in use (choose another --port)")
    state_dir.mkdir(parents=True, exist_ok=True)
    names = ["master"] + [f"worker-{n}" for n in range(1, workers + 1)]
    plan = ClusterPlan(pyspark_home(), state_dir, port, {n: free_port() for n in names},
                       workers, worker_cores, worker_memory)
    env = spark_environment()
    state = ClusterState(plan.master_url, {}, plan.web_ui_ports)
    try:
        for name, argv in plan.commands().items():
            log = open(state_dir / f"{name}.log", "wb")
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            state.pids[name] = process.pid
            (state_dir / STATE_FILE).write_text(state.to_json())  # stoppable from here on
            if name == "master":
                _wait_for(lambda: port_in_use(port), timeout_s, "the master to listen",
                          state_dir / "master.log", state.pids["master"])
        for n in range(1, workers + 1):
            log_path = state_dir / f"worker-{n}.log"
            _wait_for(lambda p=log_path: REGISTERED_LINE in _read_text(p), timeout_s,
                      f"worker-{n} to register", log_path, state.pids[f"worker-{n}"])
    except BaseException:
        down(state_dir)
        raise
    return state


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _wait_for(ready, timeout_s: float, what: str, log_path: Path, pid: int) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not pid_alive(pid):
            tail = "\n".join(_read_text(log_path).splitlines()[-15:])
            raise StandaloneError(f"the process waited on for {what} exited:\n{tail}")
        if time.monotonic() > deadline:
            raise StandaloneError(f"timed out after {timeout_s:.0f} s waiting for {what} "
                                  f"(log: {log_path})")
        time.sleep(0.2)


def down(state_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop the recorded processes by pid (workers first): SIGTERM, then SIGKILL."""
    state_dir = state_dir.resolve()
    state = read_state(state_dir)
    if state is None:
        return []
    order = sorted(state.pids, key=lambda n: n == "master")  # workers, then the master
    stopped = []
    for name in order:
        pid = state.pids[name]
        if not pid_alive(pid):
            continue
        # Each process leads its own session (start_new_session): its group is its
        # own, so executors the worker started go with it.
        _signal_group(pid, signal.SIGTERM)
        stopped.append(name)
    deadline = time.monotonic() + timeout_s
    for name in order:
        pid = state.pids[name]
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            _signal_group(pid, signal.SIGKILL)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tidewater.audit.standalone",
                                 description="A Spark standalone cluster from this venv.")
    ap.add_argument("action", choices=["up", "down", "url"])
    ap.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-cores", type=int, default=1)
    ap.add_argument("--worker-memory", default="2g")
    ap.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    args = ap.parse_args(argv)
    try:
        if args.action == "up":
            state = up(args.state_dir, args.port, args.workers, args.worker_cores,
                       args.worker_memory, args.timeout)
            print(f"spark: master and {args.workers} workers up; logs in {args.state_dir}",
                  file=sys.stderr)
            print(state.master_url)
        elif args.action == "down":
            stopped = down(args.state_dir)
            print(f"spark: stopped {', '.join(stopped) or 'nothing (none running)'}",
                  file=sys.stderr)
        else:
            state = read_state(args.state_dir)
            if state is None or not any(pid_alive(p) for p in state.pids.values()):
                print(f"spark: no cluster running from {args.state_dir}", file=sys.stderr)
                return 1
            print(state.master_url)
    except StandaloneError as e:
        print(f"spark: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
