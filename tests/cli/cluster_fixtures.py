"""Helpers for CLI tests: run `tide` as a subprocess and share one local cluster per module.

Import the fixtures into a test module with
``from tests.cli.cluster_fixtures import cluster, run_tide  # noqa: F401``.
A cluster is started with ``tide cluster up --base-port 0`` (free ports) and
always stopped with ``tide cluster down`` (which kills by the recorded pids).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]


@dataclass
class TideResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_tide(*args: str, bootstrap: str | None = None, input: str | bytes | None = None,
             timeout_s: float = 60, env: dict | None = None) -> TideResult:
    """Run ``python -m client ARGS`` and capture its output."""
    cmd = [sys.executable, "-m", "tidewater.tools"]
    if bootstrap is not None:
        cmd += ["--bootstrap-server", bootstrap]
    cmd += list(args)
    full_env = dict(os.environ)
    full_env.pop("TIDE_BOOTSTRAP_SERVER", None)
    full_env.update(env or {})
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout_s, cwd=PROJECT_DIR,
                          env=full_env)
    return TideResult(proc.returncode, proc.stdout.decode(errors="replace"),
                      proc.stderr.decode(errors="replace"))


def assert_one_line_error(result: TideResult, *fragments: str) -> str:
    """The command failed with exactly one `tide: ...` line on stderr mentioning every fragment."""
    assert result.returncode != 0, result
    assert len(result.stderr_lines) == 1, result.stderr
    line = result.stderr_lines[0]
    assert line.startswith("tide: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


@dataclass
class RunningCluster:
    data_dir: Path
    bootstrap: str

    def manifest(self) -> dict:
        return json.loads((self.data_dir / "cluster.json").read_text())

    def tide(self, *args: str, **kwargs) -> TideResult:
        return run_tide(*args, bootstrap=self.bootstrap, **kwargs)


def wait_for(condition, what: str, timeout_s: float = 60):
    """``condition()``'s first truthy value, polled every 0.2 s; the test fails after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def describe_topic(c: RunningCluster, name: str) -> dict | None:
    """``tide topics describe NAME --json``'s topic, or None when it fails."""
    result = c.tide("topics", "describe", name, "--json")
    if result.returncode != 0:
        return None
    [topic] = json.loads(result.stdout)["topics"]
    return topic


def fully_replicated(c: RunningCluster, name: str, replicas: int = 3) -> dict | None:
    """The topic once every partition has a leader and ``replicas`` replicas in its ISR."""
    topic = describe_topic(c, name)
    if topic is None or any(p["leader"] < 0 or len(p["isr"]) != replicas
                            for p in topic["partitions"]):
        return None
    return topic


def start_cluster(data_dir: Path, brokers: int, *settings: str, tls: bool = False,
                  up_flags: tuple[str, ...] = ()) -> RunningCluster:
    """``tls``: ``cluster up --tls`` (certificates under DIR/tls, TLS on every port);
    ``up_flags``: more ``cluster up`` flags (``--sasl-mechanisms``, ...)."""
    # A generous readiness deadline: the suite may run on a loaded machine.
    args = ["cluster", "up", "--brokers", str(brokers), "--data-dir", str(data_dir), "--base-port", "0",
            "--ready-timeout-s", "60"] + (["--tls"] if tls else []) + list(up_flags)
    if "--controllers" not in up_flags:
        # One controller unless a test asks for a quorum (`cluster up` starts 3 by default):
        # the quorum's own tests cover it, and 2 more processes per cluster would cost the
        # suite time it does not have.
        args += ["--controllers", "1"]
    for s in settings:
        args += ["--set", s]
    result = run_tide(*args, timeout_s=150)
    if result.returncode != 0:
        run_tide("cluster", "down", "--data-dir", str(data_dir), "--timeout-s", "5")
        pytest.fail(f"cluster up failed: {result.stderr}{_logs_named(result.stderr)}")
    return RunningCluster(data_dir, result.stdout.strip().splitlines()[-1])


def _logs_named(stderr: str, lines: int = 40) -> str:
    """The last lines of each process log ``(log PATH)`` that ``tide``'s one-line error
    names: a process that exited during start-up says why there (a CI run once failed with
    only the one line, and pytest had removed the directory by the time it was read)."""
    found = []
    for path in re.findall(r"\(log ([^)]+)\)", stderr):
        try:
            text = Path(path).read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            text = [f"(unreadable: {e})"]
        found.append(f"\n--- last lines of {path}:\n" + "\n".join(text))
    return "".join(found)


def stop_cluster(c: RunningCluster) -> None:
    run_tide("cluster", "down", "--data-dir", str(c.data_dir), "--timeout-s", "10", timeout_s=60)


def kafka_cluster(tmp_path_factory, name: str, up_flags: tuple[str, ...] = ()):
    """3 brokers with min.insync.replicas=2; ``.kafka`` is their Kafka bootstrap list.
    A generator for a module's fixture: ``yield from kafka_cluster(tmp_path_factory, name)``."""
    c = start_cluster(tmp_path_factory.mktemp(name), 3, "min.insync.replicas=2",
                      up_flags=up_flags)
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A controller and 3 brokers shared by one test module."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"), 3)
    yield c
    stop_cluster(c)
