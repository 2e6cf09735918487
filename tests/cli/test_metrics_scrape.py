"""`tide metrics scrape` through the CLI against real HTTP /metrics endpoints."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tidewater.tools.scrape import Snapshot, format_block, parse_samples, read_snapshots

ROOT = Path(__file__).resolve().parents[2]


class MetricsEndpoint:
    """A /metrics server whose counter goes up by one on every scrape."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.scrapes = Counter("test_scrapes", "scrapes served", registry=self.registry)
        self.hw = Gauge("tidewater_broker_high_watermark", "HW", ["topic", "partition", "broker"],
                        registry=self.registry)
        self.hw.labels("t", "0", "1").set(42)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server API
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                endpoint.scrapes.inc()
                body = generate_latest(endpoint.registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = MetricsEndpoint()
    yield e
    e.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tide(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidewater.tools", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_scrape_writes_timestamped_snapshots_per_source(endpoint, tmp_path):
    dead = free_port()  # nothing listens: every scrape of it is an error block
    out = tmp_path / "metrics"
    before_ms = int(time.time() * 1000)
    r = tide("metrics", "scrape", "--interval-ms", "200", "--duration-s", "1.5", "--out", str(out),
             "--targets", f"broker-1=127.0.0.1:{endpoint.port},127.0.0.1:{dead}")
    assert r.returncode == 0, r.stderr
    after_ms = int(time.time() * 1000)

    snaps = list(read_snapshots(out / "broker-1.prom"))
    assert len(snaps) >= 5, snaps
    assert all(s.ok and s.source == "broker-1" for s in snaps)
    times = [s.unix_ms for s in snaps]
    assert times == sorted(times) and before_ms <= times[0] and times[-1] <= after_ms
    # Rounds follow the interval (not bunched): successive scrapes >= ~150 ms apart.
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 150
    counts = [parse_samples(s.text)["test_scrapes_total"][0][1] for s in snaps]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    hw = parse_samples(snaps[0].text)["tidewater_broker_high_watermark"]
    assert hw == [({"topic": "t", "partition": "0", "broker": "1"}, 42.0)]

    dead_snaps = list(read_snapshots(out / f"127.0.0.1_{dead}.prom"))
    assert len(dead_snaps) == len(snaps)
    assert all(not s.ok and "refused" in s.text.lower() for s in dead_snaps)

    sources = json.loads((out / "sources.json").read_text())
    assert sources["broker-1"]["url"] == f"http://127.0.0.1:{endpoint.port}/metrics"
    assert f"127.0.0.1_{dead}" in sources

    # The raw file: marker lines as documented in client/scrape.py.
    lines = (out / "broker-1.prom").read_text().splitlines()
    assert lines[0].startswith("# SCRAPE ") and lines[0].endswith(" broker-1 ok")
    assert lines[-1] == "# EOF"


def test_scrape_appends_to_existing_files(endpoint, tmp_path):
    out = tmp_path / "m"
    for _ in range(2):
        r = tide("metrics", "scrape", "--interval-ms", "100", "--duration-s", "0.25", "--out", str(out),
                 "--targets", f"c=127.0.0.1:{endpoint.port}")
        assert r.returncode == 0, r.stderr
    snaps = list(read_snapshots(out / "c.prom"))
    assert len(snaps) >= 4
    assert [s.unix_ms for s in snaps] == sorted(s.unix_ms for s in snaps)


def test_sigterm_stops_on_a_whole_block(endpoint, tmp_path):
    out = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-m", "tidewater.tools", "metrics", "scrape", "--interval-ms", "50",
                             "--out", str(out), "--targets", f"c=127.0.0.1:{endpoint.port}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            path = out / "c.prom"
            if path.exists() and path.read_text().count("# EOF") >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    text = (out / "c.prom").read_text()
    assert text.endswith("# EOF\n")
    assert len(list(read_snapshots(out / "c.prom"))) == text.count("# SCRAPE ")


def test_targets_from_a_local_cluster_manifest(endpoint, tmp_path):
    # The manifest `tide cluster up` writes (client/local_cluster.py); no processes needed
    # to test discovery: metrics_port points at the test endpoint.
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    procs = {}
    for name, kind in (("controller", "controller"), ("broker-1", "broker")):
        procs[name] = {"name": name, "kind": kind, "pid": 0, "listen": "127.0.0.1:1",
                       "metrics_port": endpoint.port, "data_dir": str(cluster / name),
                       "log": str(cluster / f"{name}.log"), "command": ["x"]}
    (cluster / "cluster.json").write_text(json.dumps(
        {"version": 1, "data_dir": str(cluster), "bootstrap": "127.0.0.1:1",
         "controller": "127.0.0.1:1", "processes": procs}))
    out = tmp_path / "m"
    r = tide("metrics", "scrape", "--interval-ms", "100", "--duration-s", "0.3", "--out", str(out),
             "--data-dir", str(cluster))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.glob("*.prom")) == ["broker-1.prom", "controller.prom"]
    assert all(s.ok for s in read_snapshots(out / "controller.prom"))


@pytest.mark.parametrize("args, message", [
    (["--targets", "nohost"], "bad metrics target 'nohost'"),
    (["--targets", "a=127.0.0.1:1,a=127.0.0.1:2"], "two metrics targets named 'a'"),
    (["--targets", "127.0.0.1:1", "--interval-ms", "0"], "--interval-ms must be positive"),
    # An empty list is still --targets (it once fell through to the cluster lookup and crashed).
    (["--targets", ""], "no metrics targets given"),
])
def test_bad_arguments_fail_with_one_line(tmp_path, args, message):
    r = tide("metrics", "scrape", "--out", str(tmp_path / "m"), "--duration-s", "0.1", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tide: ") and message in lines[0], r.stderr


def test_missing_cluster_is_a_clear_error(tmp_path):
    r = tide("metrics", "scrape", "--out", str(tmp_path / "m"), "--data-dir", str(tmp_path / "none"))
    assert r.returncode == 1
    assert "no cluster in" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_torn_last_block_is_skipped(tmp_path):
    path = tmp_path / "b.prom"
    whole = format_block(Snapshot(1000, "b", True, "x 1\n"))
    error = format_block(Snapshot(1500, "b", False, "ConnectionRefusedError: refused\n  now"))
    torn = format_block(Snapshot(2000, "b", True, "x 2\n")).removesuffix("# EOF\n")
    path.write_text(whole + error + torn)
    snaps = list(read_snapshots(path))
    assert snaps == [Snapshot(1000, "b", True, "x 1\n"),
                     Snapshot(1500, "b", False, "ConnectionRefusedError: refused now")]

