"""The console beside a ``tide cluster up`` cluster: ``cluster up --console`` starts it,
``cluster down`` stops it.

It runs as its own process (``tide console --data-dir DIR``, so it takes the cluster's
bootstrap, security and metrics ports from ``cluster.json``), in its own session so a
Ctrl-C in the shell that ran ``cluster up`` does not reach it, with its output in
``DIR/console.log``. ``DIR/console.json`` records it::

    {"pid": 12345, "url": "http://127.0.0.1:9800/", "argv": [...]}

and it is stopped only by that pid, and only when that pid's command line is still
this console of this folder (a pid the kernel has given to another process since is
left alone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE_FILE = "console.json"
LOG_FILE = "console.log"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class LocalConsoleError(RuntimeError):
    pass


def start(data_dir: Path, listen: str, *, allow_writes: bool = False) -> str:
    """Start the console of the cluster in ``data_dir``; its URL once it serves."""
    data_dir = data_dir.resolve()
    stop(data_dir)  # a console of an earlier `cluster up` of this folder
    log_path = data_dir / LOG_FILE
    offset = log_path.stat().st_size if log_path.exists() else 0
    argv = [sys.executable, "-m", "tidewater.tools", "console", "--data-dir", str(data_dir),
            "--listen", listen] + (["--allow-writes"] if allow_writes else [])
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("console: "):
                url = line.split(" ", 1)[1]
                (data_dir / STATE_FILE).write_text(json.dumps(
                    {"pid": proc.pid, "url": url, "argv": argv}) + "\n")
                return url
        if proc.poll() is not None:
            reason = text.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            raise LocalConsoleError(f"the console did not start: {reason[0]}")
        time.sleep(0.1)
    proc.kill()
    proc.wait(5)
    raise LocalConsoleError(f"the console did not serve within {START_TIMEOUT_S:g} s "
                            f"(see {log_path})")


def _ours(pid: int, data_dir: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"console" in argv and str(data_dir).encode() in argv


def stop(data_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the recorded console (SIGTERM, SIGKILL after ``timeout_s``); True if one ran."""
    data_dir = data_dir.resolve()
    state_path = data_dir / STATE_FILE
    try:
        pid = int(json.loads(state_path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    ran = _ours(pid, data_dir)
    if ran:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _ours(pid, data_dir) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _ours(pid, data_dir):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
    state_path.unlink(missing_ok=True)
    return ran


def _reap(pid: int) -> None:
    """Collect the exit status when the console is our child (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
