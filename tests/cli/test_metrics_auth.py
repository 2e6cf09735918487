"""Issue 29 item 9: in secure mode the brokers' and the controller's /metrics answer only
a scraper that shows a client certificate of the cluster's CA or a cluster user's
password (HTTP Basic), against `tide cluster up` processes; `tide metrics scrape
--data-dir` (the chaos runner's scraper) gets in with the cluster's own credentials.

Before: anyone who reached a /metrics port read it (HTTPS with TLS, but no client check;
plain HTTP with SASL only)."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cluster_fixtures import run_tide, start_cluster, stop_cluster

from tidewater.tools.cluster_sasl import read_password
from tidewater.tools.scrape import read_snapshots

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _get(url: str, *, ca: str | None = None, cert: tuple[str, str] | None = None,
         basic: tuple[str, str] | None = None) -> tuple[int, str]:
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(*cert)
    request = urllib.request.Request(url)
    if basic is not None:
        token = base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metrics_urls(c, scheme: str) -> dict[str, str]:
    return {name: f"{scheme}://127.0.0.1:{p['metrics_port']}/metrics"
            for name, p in c.manifest()["processes"].items()}


@pytest.fixture(scope="module")
def tls_sasl(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("metrics-tls"), 1, tls=True,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512,PLAIN"))
    yield c
    stop_cluster(c)


@pytest.fixture(scope="module")
def sasl_only(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("metrics-sasl"), 1,
                      up_flags=("--sasl-mechanisms", "SCRAM-SHA-512"))
    yield c
    stop_cluster(c)


def test_tls_metrics_want_a_certificate_of_the_ca_or_a_password(tls_sasl, tmp_path):
    m = tls_sasl.manifest()
    ca, cert = m["tls"]["ca"], (m["tls"]["cert"], m["tls"]["key"])
    admin = (m["sasl"]["username"], read_password(m["sasl"]["command_config"]))
    # A certificate of another CA: the handshake refuses it.
    other = tmp_path / "other"
    assert run_tide("certs", "init", "--dir", str(other)).returncode == 0
    assert run_tide("certs", "issue", "--dir", str(other), "--name", "mallory",
                    "--role", "client").returncode == 0
    urls = _metrics_urls(tls_sasl, "https")
    assert set(urls) == {"controller", "broker-1"}
    for name, url in urls.items():
        status, body = _get(url, ca=ca)
        assert status == 401, (name, status)
        assert "tidewater_" not in body
        assert _get(url, ca=ca, basic=(admin[0], "wrong"))[0] == 401, name
        assert _get(url, ca=ca, basic=("nobody", admin[1]))[0] == 401, name
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(url, ca=ca, cert=(str(other / "mallory.pem"), str(other / "mallory.key")))
        status, body = _get(url, ca=ca, cert=cert)
        assert status == 200 and "tidewater_" in body, (name, status)
        status, body = _get(url, ca=ca, basic=admin)
        assert status == 200 and "tidewater_" in body, (name, status)


def test_sasl_only_metrics_want_a_password(sasl_only):
    m = sasl_only.manifest()
    admin = (m["sasl"]["username"], read_password(m["sasl"]["command_config"]))
    for name, url in _metrics_urls(sasl_only, "http").items():
        status, body = _get(url)
        assert status == 401 and "tidewater_" not in body, (name, status)
        assert _get(url, basic=(admin[0], admin[1] + "x"))[0] == 401, name
        status, body = _get(url, basic=admin)
        assert status == 200 and "tidewater_" in body, (name, status)


@pytest.mark.parametrize("which", ["tls_sasl", "sasl_only"])
def test_tide_metrics_scrape_brings_the_clusters_credentials(which, request, tmp_path):
    c = request.getfixturevalue(which)
    out = tmp_path / "scrape"
    result = run_tide("metrics", "scrape", "--data-dir", str(c.data_dir), "--out", str(out),
                      "--interval-ms", "500", "--duration-s", "1.2")
    assert result.returncode == 0, result.stderr
    for name in ("controller", "broker-1"):
        snapshots = list(read_snapshots(Path(out) / f"{name}.prom"))
        assert snapshots and all(s.ok for s in snapshots), (name, snapshots[:1])
        assert "tidewater_" in snapshots[0].text
