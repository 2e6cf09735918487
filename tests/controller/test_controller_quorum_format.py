"""A quorum controller on a Raft directory never formatted: refused with one line and exit
1; with ``--format-if-empty`` (containers) formatted for ``--initial-controllers``, taking
the directory id listed for it, and not formatted again on the next start. A directory
holding a single controller's metadata.log that was never migrated is refused too."""

from __future__ import annotations

import select
import subprocess
import sys
import time

import pytest
from controller_process import PROJECT_DIR, free_port

from tidewater.controller.metadata import cluster_record, controller_epoch_record
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.raft.storage import QUORUM_STATE_FILE, decode_quorum_state

pytestmark = pytest.mark.timeout(120)

DIRECTORY_ID = "0123456789abcdef" * 2


def controller_command(data_dir, raft_port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tidewater.controller", "--listen",
            f"127.0.0.1:{free_port()}", "--data-dir", str(data_dir),
            "--set", "node.id=1", "--set", f"controller.quorum.voters=1@127.0.0.1:{raft_port}",
            *extra]


def epoch_of(data_dir) -> int:
    path = data_dir / "raft" / QUORUM_STATE_FILE
    return decode_quorum_state(path.read_bytes(), path).state.epoch


def start_and_stop(cmd: list[str], data_dir, epoch_above: int) -> None:
    """Start the controller, wait until its one-voter quorum is in a later epoch than
    ``epoch_above`` (it elected itself), SIGKILL it."""
    proc = subprocess.Popen(cmd, cwd=PROJECT_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode() if ready else ""
        assert "listening" in line, proc.stderr.read().decode() if proc.poll() is not None else line
        deadline = time.monotonic() + 60
        while epoch_of(data_dir) <= epoch_above:
            assert time.monotonic() < deadline, "no election"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(10)


def test_unformatted_is_refused_and_format_if_empty_formats_once(tmp_path):
    raft_port = free_port()
    data_dir = tmp_path / "c1"
    refused = subprocess.run(controller_command(data_dir, raft_port), cwd=PROJECT_DIR,
                             capture_output=True, timeout=60)
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and "is not formatted" in lines[0], lines
    assert not (data_dir / "raft" / QUORUM_STATE_FILE).exists()

    initial = f"1@127.0.0.1:{raft_port}:{DIRECTORY_ID}"
    bad = subprocess.run(controller_command(data_dir, raft_port, "--format-if-empty"),
                         cwd=PROJECT_DIR, capture_output=True, timeout=60)
    assert bad.returncode == 2 and b"needs --initial-controllers" in bad.stderr

    cmd = controller_command(data_dir, raft_port, "--format-if-empty",
                             "--initial-controllers", initial)
    start_and_stop(cmd, data_dir, 0)
    path = data_dir / "raft" / QUORUM_STATE_FILE
    first = decode_quorum_state(path.read_bytes(), path)
    assert first.directory_id == DIRECTORY_ID and {v.id for v in first.bootstrap_voters} == {1}
    # Started again: the same files (a new format would start from epoch 0 and
    # elect itself in epoch 1, not after the first run's epoch).
    start_and_stop(cmd, data_dir, first.state.epoch)
    again = decode_quorum_state(path.read_bytes(), path)
    assert again.directory_id == DIRECTORY_ID and again.state.epoch > first.state.epoch


def test_unmigrated_metadata_log_is_refused_until_migrated(tmp_path):
    """A single controller's metadata.log in a quorum controller's directory: refused with
    one line naming the migration (also with --format-if-empty, which must not format);
    migrated, the controller starts and the log is renamed."""
    raft_port = free_port()
    data_dir = tmp_path / "c1"
    metadata_log = MetadataLog.open(data_dir)
    metadata_log.append([cluster_record("migrated-cluster"), controller_epoch_record(3)])
    metadata_log.close()
    initial = f"1@127.0.0.1:{raft_port}:{DIRECTORY_ID}"
    for extra in ((), ("--format-if-empty", "--initial-controllers", initial)):
        refused = subprocess.run(controller_command(data_dir, raft_port, *extra),
                                 cwd=PROJECT_DIR, capture_output=True, timeout=60)
        assert refused.returncode == 1
        lines = [line for line in refused.stderr.decode().splitlines() if line.strip()]
        assert len(lines) == 1 and "CRITICAL" in lines[0], lines
        assert "--migrate-metadata-log" in lines[0] and "tide quorum format" in lines[0]
        assert not (data_dir / "raft" / QUORUM_STATE_FILE).exists()

    migrated = subprocess.run(
        [sys.executable, "-m", "tidewater.tools", "quorum", "format", "--data-dir",
         str(data_dir), "--node-id", "1", "--initial-controllers", initial,
         "--migrate-metadata-log", str(data_dir / "metadata.log")],
        cwd=PROJECT_DIR, capture_output=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr.decode()
    assert not (data_dir / "metadata.log").exists()
    assert (data_dir / "metadata.log.migrated").exists()
    start_and_stop(controller_command(data_dir, raft_port), data_dir, 1)
