"""The topic page's configs come from the brokers' DescribeTopicConfigs: a broker's
``--set`` and a cluster-wide dynamic default show with their values and sources. HTTP
only (no browser), against a real one-broker cluster."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from tests.cli.cluster_fixtures import start_cluster, stop_cluster
from tests.console.conftest import WAIT_SCALE, ConsoleProcess
from tidewater.client.admin import BROKER_RESOURCE, AdminClient, ConfigOp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _config_row(page: str, name: str) -> tuple[str, str]:
    """(value, source label) of the config's row on the topic page."""
    row = re.search(rf'<tr id="config-{re.escape(name)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {name}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    return cells[1].strip(), cells[2].strip()


def test_topic_configs_show_the_broker_setting_and_dynamic_default_they_come_from(tmp_path):
    cluster = start_cluster(tmp_path / "cluster", 1, "log.retention.ms=7200000")
    console = None
    try:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic("cfg", 1, 1, {"retention.bytes": "1048576"})
            admin.alter_configs(BROKER_RESOURCE, "", [ConfigOp("log.roll.ms", "SET", "3600000")])
            deadline = time.monotonic() + 30 * WAIT_SCALE
            while True:  # the broker learns the dynamic default from the controller
                by_name = {c.name: c for c in admin.describe_topic_configs("cfg")}
                if by_name["segment.ms"].source != "default" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert (by_name["retention.ms"].value, by_name["retention.ms"].source) == (
            "7200000", "static broker")
        assert (by_name["retention.bytes"].value, by_name["retention.bytes"].source) == (
            "1048576", "topic")
        assert (by_name["segment.ms"].value, by_name["segment.ms"].source) == (
            "3600000", "dynamic default")
        assert by_name["cleanup.policy"].source == "default"

        console = ConsoleProcess(["--data-dir", str(cluster.data_dir)], tmp_path / "console.log")
        with urllib.request.urlopen(console.url + "/topics/cfg", timeout=30) as response:
            page = response.read().decode()
        assert _config_row(page, "retention.ms") == ("7200000", "broker setting (--set)")
        assert _config_row(page, "retention.bytes") == ("1048576", "set on the topic")
        assert _config_row(page, "segment.ms")[1] == "every broker&#39;s dynamic default"
        assert _config_row(page, "cleanup.policy") == ("delete", "default")
    finally:
        if console is not None:
            console.stop()
        stop_cluster(cluster)
