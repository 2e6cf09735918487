"""``python -m tidewater.controller.quorum run --tls-*``: three stand-alone quorum nodes
elect a leader and replicate over mTLS (the controller's TLS options); the admin
commands reach them with a controller certificate, a client certificate is refused
proposals, and a plaintext caller gets no answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tidewater.tools.local_cluster import make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def quorum(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidewater.controller.quorum", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def tls_args(tls_dir: Path, name: str) -> list[str]:
    return ["--tls-ca", str(tls_dir / "ca.pem"), "--tls-cert", str(tls_dir / f"{name}.pem"),
            "--tls-key", str(tls_dir / f"{name}.key")]


def test_quorum_nodes_run_and_answer_over_mutual_tls(tmp_path):
    from test_quorum_processes import free_port

    tls_dir = tmp_path / "tls"
    make_tls_files(tls_dir, [1], controllers=3)
    ports = {i: free_port() for i in (1, 2, 3)}
    initial = ",".join(f"{i}@127.0.0.1:{p}:{uuid.uuid4().hex}" for i, p in ports.items())
    voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in ports.items())
    processes = []
    try:
        for i in ports:
            formatted = quorum("format", "--node-id", str(i), "--data-dir",
                               str(tmp_path / f"node-{i}"), "--initial-controllers", initial)
            assert formatted.returncode == 0, formatted.stderr
            log = open(tmp_path / f"node-{i}.log", "ab")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tidewater.controller.quorum", "run", "--node-id", str(i),
                 "--data-dir", str(tmp_path / f"node-{i}"), "--voters", voters,
                 "--election-timeout-ms", "300", *tls_args(tls_dir, f"controller-{i}")],
                cwd=REPO, stdout=log, stderr=log))
            log.close()
        everyone = [f"127.0.0.1:{p}" for p in ports.values()]

        def leader() -> str | None:
            for address in everyone:
                answer = quorum("describe", "--bootstrap", address,
                                *tls_args(tls_dir, "controller-1"))
                if answer.returncode == 0 and json.loads(answer.stdout)["role"] == "leader":
                    return address
            return None

        deadline = time.monotonic() + 90
        while (address := leader()) is None:
            assert time.monotonic() < deadline, "no leader elected over mTLS"
            time.sleep(0.2)
        proposed = quorum("propose", "--bootstrap", address, "--timeout-ms", "20000",
                          "over-tls", *tls_args(tls_dir, "controller-2"))
        assert proposed.returncode == 0, proposed.stderr
        # Committed means a majority fetched it from the leader: Raft traffic over mTLS.
        for other in everyone:
            deadline = time.monotonic() + 60
            while "over-tls" not in quorum("read", "--bootstrap", other,
                                           *tls_args(tls_dir, "controller-3")).stdout:
                assert time.monotonic() < deadline, f"{other} never had the record"
                time.sleep(0.2)

        refused = quorum("propose", "--bootstrap", address, "x",
                         *tls_args(tls_dir, "tide-client"))
        assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
        plaintext = quorum("describe", "--bootstrap", address)
        assert plaintext.returncode == 1
        partial = quorum("describe", "--bootstrap", address, "--tls-ca",
                         str(tls_dir / "ca.pem"), "--tls-cert", str(tls_dir / "tide-client.pem"))
        assert partial.returncode == 2 and "--tls-key" in partial.stderr
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
