"""Issue 29 item 9, the TLS half: with TLS on (`tide cluster up --tls`), a broker's
/metrics is HTTPS with its own certificate, as its other ports are; plain HTTP gets no
metrics. The cluster's tools scrape it over HTTPS against the cluster's CA; the controller's /metrics is HTTPS with its certificate too."""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request

import pytest
from cluster_fixtures import start_cluster, stop_cluster

from tidewater.tools.chaos.targets import LocalChaosCluster
from tidewater.tools.scrape import ScrapeCredentials, fetch_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_broker_metrics_are_https_with_tls(tmp_path):
    c = start_cluster(tmp_path / "cluster", 1, tls=True)
    try:
        manifest = c.manifest()
        port = manifest["processes"]["broker-1"]["metrics_port"]
        ca = manifest["tls"]["ca"]
        # With TLS a scrape shows a client certificate of the CA (test_metrics_auth.py).
        client = ScrapeCredentials(manifest["tls"]["cert"], manifest["tls"]["key"])
        text = fetch_metrics(f"https://127.0.0.1:{port}/metrics", 10, ca, client)
        assert "tidewater_broker_" in text
        # The TLS server drops the plain request (a reset, or an alert read as a status).
        with pytest.raises((OSError, http.client.HTTPException)):
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            assert b"tidewater_broker_" not in body  # never reached: HTTP is refused
        with pytest.raises((urllib.error.URLError, ssl.SSLError)):  # not our CA: refused
            urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10,
                                   context=ssl.create_default_context())
        targets = {t.source: t for t in LocalChaosCluster(c.data_dir).metrics_targets()}
        assert targets["broker-1"].url.startswith("https://") and targets["broker-1"].cafile
        assert targets["controller"].url.startswith("https://") and targets["controller"].cafile
        for target in targets.values():
            assert target.credentials is not None and target.credentials.certfile
            assert "# HELP" in fetch_metrics(target.url, 10, target.cafile, target.credentials)
    finally:
        stop_cluster(c)
