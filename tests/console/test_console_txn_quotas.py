"""The transactions and quotas pages, and a topic's last stable offset, over HTTP against a
real one-broker cluster with a transaction left open and a client quota set."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from tests.cli.cluster_fixtures import start_cluster, stop_cluster
from tests.console.conftest import WAIT_SCALE, ConsoleProcess
from tidewater.client.admin import AdminClient
from tidewater.client.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _row(page: str, row_id: str) -> str:
    found = re.search(rf'<tr id="{re.escape(row_id)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row {row_id}"
    return found.group(1)


def test_open_transaction_quota_and_last_stable_offset_show(tmp_path):
    cluster = start_cluster(tmp_path / "cluster", 1, "transaction.state.log.replication.factor=1",
                            "transaction.state.log.num.partitions=3",
                            "offsets.topic.replication.factor=1")
    console = producer = None
    try:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic("paid", 2, 1)
            admin.alter_client_quotas(None, "slow-app", {"producer_byte_rate": 1024.0})
            admin.alter_client_quotas("", None, {"consumer_byte_rate": 2048.0})
        plain = Producer(cluster.bootstrap)
        plain.send("paid", b"committed", partition=0)
        plain.flush(30)
        plain.close()
        producer = Producer(cluster.bootstrap, transactional_id="order-writer", linger_ms=0,
                            max_block_ms=30000)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("paid", b"pending", partition=0)
        producer.flush(30)  # written, not committed: the transaction stays open

        console = ConsoleProcess(["--data-dir", str(cluster.data_dir)], tmp_path / "console.log")
        page = _get(console.url + "/transactions")
        row = _row(page, "txn-order-writer")
        assert 'class="state">Ongoing' in row and "paid-0" in row and "paid-1" not in row
        assert re.search(r'class="producer">\d+ / 0<', row)
        assert "1 open" in page

        deadline = time.monotonic() + 10 * WAIT_SCALE
        while True:  # past the console's 1 s snapshot cache, the leader's state
            topic = _get(console.url + "/topics/paid")
            stable = re.search(r'<tr id="p-0".*?class="hw">(\d+)</td>\s*'
                               r'<td class="stable([^"]*)">(\d+)</td>', topic, re.S)
            if stable or time.monotonic() > deadline:
                break
            time.sleep(1.2)
        assert stable, "no high watermark / last stable offset cells"
        assert (stable.group(1), stable.group(2).strip(), stable.group(3)) == (
            "2", "open-txn", "1")  # the open transaction's record holds the LSO at 1

        quotas = _get(console.url + "/quotas")
        assert 'class="producer_byte_rate">1024<' in _row(quotas, "quota--slow-app")
        assert 'class="consumer_byte_rate">2048<' in _row(quotas, "quota-&lt;default&gt;-")
    finally:
        if producer is not None:
            producer.close()
        if console is not None:
            console.stop()
        stop_cluster(cluster)
