"""`tide console` and `tide cluster up --console` as commands: what they print, the
login, the read-only default, a taken port, and the console stopped by `cluster down`.
No browser here (tests/console/test_console_browser.py has it)."""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cli.cluster_fixtures import assert_one_line_error, run_tide, start_cluster, stop_cluster
from tests.console.conftest import ConsoleProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cluster_up_console_serves_and_cluster_down_stops_it(tmp_path):
    data_dir = tmp_path / "cluster"
    result = run_tide("cluster", "up", "--brokers", "1", "--data-dir", str(data_dir),
                      "--base-port", "0", "--ready-timeout-s", "60", "--controllers", "1",
                      "--console", "127.0.0.1:0",
                      timeout_s=150)
    try:
        assert result.returncode == 0, result.stderr
        [line] = [x for x in result.stderr_lines if x.startswith("# web console: ")]
        url = line.split(": ", 1)[1].rstrip("/")
        assert result.stdout.strip().startswith("127.0.0.1:")  # stdout: the bootstrap only
        status, page = _get(url + "/")
        assert status == 200 and 'id="broker-1" data-status="alive"' in page
        assert "read-only" in page
        pid = json.loads((data_dir / "console.json").read_text())["pid"]
        assert _alive(pid)
    finally:
        down = run_tide("cluster", "down", "--data-dir", str(data_dir), "--timeout-s", "10",
                        timeout_s=60)
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert not (data_dir / "console.json").exists()


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("console-cli"), 1)
    yield c
    stop_cluster(c)


def test_login_asks_every_page_for_the_password(small_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TIDE_CONSOLE_PASSWORD", "s3cret")
    console = ConsoleProcess(["--bootstrap-server", small_cluster.bootstrap, "--login", "ops"],
                             tmp_path / "console.log")
    try:
        status, _ = _get(console.url + "/")
        assert status == 401
        wrong = base64.b64encode(b"ops:nope").decode()
        assert _get(console.url + "/", {"Authorization": f"Basic {wrong}"})[0] == 401
        right = base64.b64encode(b"ops:s3cret").decode()
        status, page = _get(console.url + "/topics", {"Authorization": f"Basic {right}"})
        assert status == 200 and "<h1>Topics</h1>" in page
        assert _get(console.url + "/healthz")[0] == 200  # for a container's health check
    finally:
        console.stop()


def test_a_taken_port_is_one_line(small_cluster):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_tide("console", "--listen", f"127.0.0.1:{port}",
                          bootstrap=small_cluster.bootstrap, timeout_s=60)
    assert_one_line_error(result, "cannot listen on", str(port))


def test_login_without_a_password_is_a_usage_error(small_cluster):
    result = run_tide("console", "--login", "ops", bootstrap=small_cluster.bootstrap,
                      env={"TIDE_CONSOLE_PASSWORD": ""})
    assert result.returncode == 2
    assert_one_line_error(result, "TIDE_CONSOLE_PASSWORD")


def test_unreachable_cluster_is_a_page_not_a_trace(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    console = ConsoleProcess(["--bootstrap-server", dead], tmp_path / "console.log")
    try:
        status, page = _get(console.url + "/")
        assert status == 503 and 'id="error"' in page and "Traceback" not in page
    finally:
        console.stop()


def test_https_with_the_given_certificate(small_cluster, tmp_path):
    import ssl

    certs = tmp_path / "certs"
    for args in (("init", "--dir", str(certs)),
                 ("issue", "--dir", str(certs), "--name", "console", "--role", "broker")):
        made = run_tide("certs", *args)
        assert made.returncode == 0, made.stderr
    console = ConsoleProcess(["--bootstrap-server", small_cluster.bootstrap,
                              "--tls-cert", str(certs / "console.pem"),
                              "--tls-key", str(certs / "console.key")], tmp_path / "console.log")
    try:
        assert console.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with urllib.request.urlopen(console.url + "/", timeout=20, context=context) as response:
            assert response.status == 200 and b'id="broker-1"' in response.read()
    finally:
        console.stop()


def test_overview_shows_the_latest_audit_verdict_and_links_the_report(small_cluster, tmp_path):
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "report.json").write_text(json.dumps({"version": 1, "passed": False, "rules": [
        {"name": "hw_never_decreases", "passed": True, "skipped": None},
        {"name": "acked_records_present", "passed": False, "skipped": None},
        {"name": "metrics_consistent", "passed": False, "skipped": "no metrics given"}]}))
    (audit / "report.html").write_text("<html><body>the audit report</body></html>")
    console = ConsoleProcess(["--bootstrap-server", small_cluster.bootstrap,
                              "--audit-dir", str(audit)], tmp_path / "console.log")
    try:
        status, page = _get(console.url + "/")
        assert status == 200
        verdict = page[page.index('id="audit-verdict"'):].split("</p>")[0]
        assert "FAIL: 1 rule(s) violated: acked_records_present" in verdict
        assert '<a href="/audit/report.html">' in verdict
        assert _get(console.url + "/audit/report.html") == (
            200, "<html><body>the audit report</body></html>")
    finally:
        console.stop()


def test_console_of_a_tls_cluster_connects_with_its_client_certificate(tmp_path):
    """`cluster up --tls --console`: the console takes the cluster's client settings
    (cluster.json) and reads it over TLS."""
    data_dir = tmp_path / "tls-cluster"
    result = run_tide("cluster", "up", "--brokers", "1", "--data-dir", str(data_dir),
                      "--base-port", "0", "--ready-timeout-s", "60", "--tls", "--controllers", "1",
                      "--console", "127.0.0.1:0", timeout_s=150)
    try:
        assert result.returncode == 0, result.stderr
        [line] = [x for x in result.stderr_lines if x.startswith("# web console: ")]
        status, page = _get(line.split(": ", 1)[1].rstrip("/") + "/")
        assert status == 200 and 'id="broker-1" data-status="alive"' in page
    finally:
        run_tide("cluster", "down", "--data-dir", str(data_dir), "--timeout-s", "10",
                 timeout_s=60)
