"""`tide console` in a real browser against a real 3-broker cluster with traffic.

One cluster (``tide cluster up``), one read-only console (``--data-dir``: bootstrap
and metrics endpoints from cluster.json) and one headless Chromium serve the module.
Topic ``fixed`` gets known records and then no more, so what the pages show can be
checked exactly against the cluster's own answers (DescribeReplicas, a consumer's
reads, the group coordinator's lag); topic ``live`` gets records and a consumer group
all along, for the charts. The last test SIGKILLs a broker.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.cli.cluster_fixtures import (
    RunningCluster,
    fully_replicated,
    run_tide,
    start_cluster,
    stop_cluster,
)
from tests.console.conftest import WAIT_SCALE, ConsoleProcess, screenshot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FIXED, LIVE = "fixed", "live"
BIG_VALUE = b"B" * 3000 + b"END"
HTML_KEY = b'<b id="injected">big</b>'  # shown as text, never as markup
SETTLED_AT = 10  # group "settled" committed this offset on every partition of FIXED
RACKS = {1: "rack-a", 2: "rack-b", 3: "rack-c"}  # `cluster up --rack`: broker.rack of each


def _value(partition: int, i: int) -> bytes:
    if partition == 0:
        return json.dumps({"n": i, "part": 0}).encode()
    if partition == 1:
        return f"text-{i}".encode()
    return bytes(range(i, i + 8))


def _poll(condition, what: str, timeout_s: float = 20.0, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s * WAIT_SCALE
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # a page mid-swap; try again
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last: {last!r})" if last else ""))


class Traffic:
    """Records into LIVE and a consumer group reading them, until stopped (bounded)."""

    def __init__(self, bootstrap: str, duration_s: float = 600):
        self.bootstrap = bootstrap
        self.stop_event = threading.Event()
        self.deadline = time.monotonic() + duration_s
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        self.produced = 0

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _running(self) -> bool:
        return not self.stop_event.is_set() and time.monotonic() < self.deadline

    def _produce(self) -> None:
        from tidewater.client.producer import Producer

        with Producer(self.bootstrap, acks="all") as p:
            while self._running():
                for _ in range(20):
                    p.send(LIVE, b"x" * 200, key=str(self.produced % 11).encode())
                    self.produced += 1
                try:
                    p.flush(5)
                except Exception:  # a broker killed by the last test
                    pass
                self.stop_event.wait(0.1)

    def _consume(self) -> None:
        from tidewater.client.consumer import Consumer

        with Consumer(self.bootstrap, group_id="readers", client_id="reader-1",
                      auto_offset_reset="earliest", session_timeout_ms=10000) as c:
            c.subscribe([LIVE])
            while self._running():
                try:
                    c.poll(300, max_records=100)
                except Exception:  # a broker killed by the last test
                    time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[RunningCluster]:
    c = start_cluster(tmp_path_factory.mktemp("console-cluster"), 3,
                      up_flags=("--rack", ",".join(RACKS.values()), "--controllers", "3"))
    try:
        _seed(c)
        traffic = Traffic(c.bootstrap)
        traffic.start()
        try:
            yield c
        finally:
            traffic.stop()
    finally:
        stop_cluster(c)


def _seed(c: RunningCluster) -> None:
    from tidewater.client.admin import AdminClient
    from tidewater.client.group_admin import GroupAdmin
    from tidewater.client.producer import Producer

    with AdminClient(c.bootstrap) as admin:
        admin.create_topic(FIXED, 3, 3)
        admin.create_topic(LIVE, 3, 3)
    _poll(lambda: fully_replicated(c, FIXED) and fully_replicated(c, LIVE), "topics replicated",
          timeout_s=30)
    with Producer(c.bootstrap, acks="all") as p:
        for partition in range(3):
            for i in range(30):
                p.send(FIXED, _value(partition, i), key=f"k-{i % 5}".encode(),
                       partition=partition, headers=[("trace", f"id-{i}".encode())])
        p.send(FIXED, BIG_VALUE, key=HTML_KEY, partition=1)  # offset 30 of partition 1
        p.flush(30)
    with GroupAdmin(c.bootstrap) as groups:
        groups.reset_offsets("settled", FIXED, to="offset", offset=SETTLED_AT)


@pytest.fixture(scope="module")
def console(cluster: RunningCluster, tmp_path_factory) -> Iterator[ConsoleProcess]:
    log = tmp_path_factory.mktemp("console") / "console.log"
    proc = ConsoleProcess(["--data-dir", str(cluster.data_dir), "--metrics-interval-ms", "500"],
                          log)
    try:
        yield proc
    finally:
        proc.stop()


def _text(driver, css: str) -> str:
    """The element's shown text, read by script: the live fragments swap their elements
    every few seconds, so a found element may be gone by the next call. Waits a little
    for the element (a page that a click is still loading)."""
    found = _poll(lambda: driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? [e.innerText] : null", css),
        f"an element {css}", timeout_s=5)
    return str(found[0]).strip()


def _attr(driver, css: str, name: str) -> str | None:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); "
        "return e ? e.getAttribute(arguments[1]) : null", css, name)


def _replica_states(bootstrap: str, topic: str):
    from tidewater.client.admin import AdminClient

    with AdminClient(bootstrap) as admin:
        [t] = admin.describe_topics([topic])
    return t


def _local_resources_only(driver) -> None:
    """Everything the page loaded came from the console itself."""
    urls = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith("http://127.0.0.1:") for u in urls), urls


# ---------------------------------------------------------------------------- pages


def test_overview_shows_brokers_controller_and_charts(browser, console, cluster):
    from tidewater.client.admin import AdminClient

    browser.get(console.url + "/")
    with AdminClient(cluster.bootstrap) as admin:
        described = admin.describe_cluster()
    assert _text(browser, "#controller") == str(described.controller_id)
    assert _text(browser, "#cluster-id") == described.cluster_id
    assert _text(browser, "#partition-count") == str(described.partition_count)
    for b in (1, 2, 3):
        row = f"#broker-{b}"
        assert _attr(browser, row, "data-status") == "alive"
        assert "alive" in _text(browser, row + " .status")
    # Each broker's broker.rack, as it registered it with the controller.
    assert {b.broker_id: b.rack for b in described.brokers} == RACKS
    for b, rack in RACKS.items():
        assert _text(browser, f"#broker-{b} .rack") == rack
    led = sum(int(_text(browser, f"#broker-{b} .led")) for b in (1, 2, 3))
    assert led == described.partition_count
    assert _text(browser, "#urp-count") == "0"
    # The charts' fragment arrives by itself and fills with the brokers' metrics.
    _poll(lambda: int(_attr(browser, "#chart-produce_bytes", "data-points")) >= 6, "charts on the overview")
    _local_resources_only(browser)
    screenshot(browser, "overview")


def test_overview_shows_the_controller_quorum_as_its_leader_describes_it(browser, console,
                                                                         cluster):
    """The quorum section: leader, epoch, high watermark and each voter's log end and lag,
    as DescribeQuorum (through a broker, as ``tide quorum describe``) answers them."""
    from tidewater.client.admin import AdminClient

    with AdminClient(cluster.bootstrap) as admin:
        before = admin.describe_metadata_quorum()
        browser.get(console.url + "/")
        leader = int(_text(browser, "#quorum-leader"))
        epoch = int(_text(browser, "#quorum-epoch"))
        hw = int(_text(browser, "#quorum-hw"))
        rows = {}
        for node_id in (1, 2, 3):
            row = f"#quorum-{node_id}"
            rows[node_id] = (_attr(browser, row, "data-role"), int(_text(browser, row + " .leo")),
                             int(_text(browser, row + " .lag")))
        after = admin.describe_metadata_quorum()
    assert before.leader_id == after.leader_id == leader  # no failover meanwhile
    assert before.epoch == after.epoch == epoch
    assert before.high_watermark <= hw <= after.high_watermark
    assert _text(browser, "#quorum-voter-count") == "3"
    assert {v.id for v in after.voters} == set(rows)
    assert rows[leader][0] == "leader"
    assert sorted(role for role, _, _ in rows.values()) == ["follower", "follower", "leader"]
    low = {r.replica.id: r.log_end_offset for r in before.replicas}
    high = {r.replica.id: r.log_end_offset for r in after.replicas}
    for node_id, (_role, leo, _lag) in rows.items():
        assert low[node_id] <= leo <= high[node_id], (node_id, leo)
    # Every lag is against the leader's log end of one and the same answer.
    assert len({leo + lag for _, leo, lag in rows.values()}) == 1, rows
    assert hw <= rows[leader][1] + rows[leader][2]


def test_topics_list_counts_records_from_the_high_watermarks(browser, console, cluster):
    browser.get(console.url + "/topics")
    assert _text(browser, f"#topic-{FIXED} .partitions") == "3"
    t = _replica_states(cluster.bootstrap, FIXED)
    hws = [next(r.high_watermark for r in p.replicas_state if r.broker == p.leader)
           for p in t.partitions]
    assert hws == [30, 31, 30]
    assert _text(browser, f"#topic-{FIXED} .records") == str(sum(hws))
    # The live topic's produce and fetch rates come from the brokers' per-topic counters;
    # the fixed topic, written once before, produces nothing now.
    browser.get(console.url + "/topics")
    _poll(lambda: (browser.refresh() or
                   (_text(browser, f"#topic-{LIVE} .rate") not in ("-", "0")
                    and _text(browser, f"#topic-{LIVE} .bytes-in") not in ("-", "0 B/s")
                    and _text(browser, f"#topic-{LIVE} .bytes-out") not in ("-", "0 B/s")
                    and _text(browser, f"#topic-{FIXED} .rate") == "0")),
          "produce and fetch rates for the live topic, none for the fixed one")
    screenshot(browser, "topics")


def test_topic_page_shows_the_produce_and_fetch_rates_while_traffic_flows(browser, console,
                                                                          cluster):
    browser.get(console.url + f"/topics/{LIVE}")
    _poll(lambda: (browser.refresh() or
                   (_text(browser, "#produce-rate") not in ("-", "0")
                    and _text(browser, "#produce-bytes") not in ("-", "0 B/s")
                    and _text(browser, "#fetch-bytes") not in ("-", "0 B/s"))),
          "the live topic's produce and fetch rates on its page")
    # The rate is the brokers' own per-topic counter's: it grows on every leader.
    from tidewater.tools.scrape import parse_samples

    total = 0.0
    for proc in cluster.manifest()["processes"].values():
        if proc["kind"] == "broker":
            text = urllib.request.urlopen(
                f"http://127.0.0.1:{proc['metrics_port']}/metrics", timeout=10).read().decode()
            total += sum(v for labels, v in parse_samples(text).get(
                "tidewater_broker_topic_messages_in_total", []) if labels["topic"] == LIVE)
    assert total > 0


def test_topic_page_shows_each_replica_as_the_brokers_describe_it(browser, console, cluster):
    browser.get(console.url + f"/topics/{FIXED}")
    t = _replica_states(cluster.bootstrap, FIXED)
    for p in t.partitions:
        row = f"#p-{p.partition}"
        leader = next(r for r in p.replicas_state if r.broker == p.leader)
        assert _text(browser, row + " .leader") == str(p.leader)
        assert _text(browser, row + " .isr") == ",".join(map(str, p.isr))
        assert _text(browser, row + " .hw") == str(leader.high_watermark)
        assert _text(browser, row + " .leo") == str(leader.log_end_offset)
        assert _text(browser, row + " .lso") == str(leader.log_start_offset)
        for r in p.replicas_state:
            shown = _text(browser, f"{row} .replica[data-broker='{r.broker}']")
            assert shown.startswith(f"{r.broker}: {r.log_start_offset} / {r.high_watermark} / "
                                    f"{r.log_end_offset}"), shown
    assert _text(browser, "#config-min\\.insync\\.replicas .value")  # every config listed
    screenshot(browser, "topic")


def test_record_browser_shows_what_a_consumer_reads(browser, console, cluster):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tidewater.client.consumer import Consumer

    browser.get(console.url + f"/topics/{FIXED}")
    form = browser.find_element(By.ID, "browser")
    Select(form.find_element(By.NAME, "partition")).select_by_value("0")
    Select(form.find_element(By.NAME, "mode")).select_by_value("newest")
    limit = form.find_element(By.NAME, "limit")
    limit.clear()
    limit.send_keys("5")
    Select(form.find_element(By.NAME, "format")).select_by_value("json")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _poll(lambda: browser.find_elements(By.CSS_SELECTOR, "#records tr.record"), "records shown")
    rows = browser.find_elements(By.CSS_SELECTOR, "#records tr.record")
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(FIXED, 0)])
        c.seek((FIXED, 0), 25)
        read = []
        while len(read) < 5:
            read += [r for r in c.poll(2000) if r.offset < 30]
    assert [int(r.get_attribute("data-offset")) for r in rows] == [r.offset for r in read]
    for row, record in zip(rows, read, strict=True):
        shown = row.find_element(By.CSS_SELECTOR, ".value pre").text
        assert shown == json.dumps(json.loads(record.value), indent=2)
        assert row.find_element(By.CSS_SELECTOR, ".key pre").text == record.key.decode()
        assert f"id-{record.offset}" in row.find_element(By.CSS_SELECTOR, ".headers").text
    screenshot(browser, "records")

    # Hex, from an offset.
    browser.get(console.url + f"/topics/{FIXED}?partition=2&mode=offset&offset=7&limit=1"
                              "&format=hex")
    [row] = browser.find_elements(By.CSS_SELECTOR, "#records tr.record")
    assert row.get_attribute("data-offset") == "7"
    assert row.find_element(By.CSS_SELECTOR, ".value pre").text == _value(2, 7).hex(" ")

    # Filtered by key: k-3 is at offsets 3, 8, ..., 28.
    browser.get(console.url + f"/topics/{FIXED}?partition=0&mode=offset&offset=0&limit=50"
                              "&key=k-3&format=text")
    offsets = [int(r.get_attribute("data-offset"))
               for r in browser.find_elements(By.CSS_SELECTOR, "#records tr.record")]
    assert offsets == list(range(3, 30, 5))

    # From a timestamp: 0 is before everything, so the log's start.
    browser.get(console.url + f"/topics/{FIXED}?partition=1&mode=timestamp&timestamp=0&limit=2")
    offsets = [int(r.get_attribute("data-offset"))
               for r in browser.find_elements(By.CSS_SELECTOR, "#records tr.record")]
    assert offsets == [0, 1]

    # A large value is cut, with a link to all of it.
    browser.get(console.url + f"/topics/{FIXED}?partition=1&mode=offset&offset=30&limit=1")
    [row] = browser.find_elements(By.CSS_SELECTOR, "#records tr.record")
    assert len(row.find_element(By.CSS_SELECTOR, ".value pre").text) == 1024
    assert row.find_element(By.CSS_SELECTOR, ".key pre").text == HTML_KEY.decode()
    assert not browser.find_elements(By.ID, "injected")
    more = row.find_element(By.CSS_SELECTOR, ".value a.more")
    assert f"all {len(BIG_VALUE)} bytes" in more.text
    more.click()
    _poll(lambda: browser.find_elements(By.CSS_SELECTOR, "#record .value pre"), "record page")
    assert _text(browser, "#record .value pre") == BIG_VALUE.decode()
    screenshot(browser, "record")


def test_groups_show_state_members_and_lag_the_coordinator_reports(browser, console, cluster):
    from tidewater.client.group_admin import GroupAdmin

    browser.get(console.url + "/groups")
    assert _text(browser, "#group-settled .state") == "Empty"
    _poll(lambda: browser.refresh() or
          _text(browser, "#group-readers .state") == "Stable", "the live group Stable")
    screenshot(browser, "groups")

    with GroupAdmin(cluster.bootstrap) as admin:
        described = admin.describe_group("settled")
    browser.get(console.url + "/groups/settled")
    expected_total = sum(p.lag for p in described.partitions)
    assert expected_total == (30 + 31 + 30) - 3 * SETTLED_AT
    assert _text(browser, "#total-lag") == str(expected_total)
    for p in described.partitions:
        assert _text(browser, f"#lag-{p.topic}-{p.partition} .lag") == str(p.lag)
        assert _text(browser, f"#lag-{p.topic}-{p.partition} .committed") == str(SETTLED_AT)
    assert _text(browser, f"#topic-lag-{FIXED} .lag") == str(expected_total)

    # Paged as the topic page is (2 rows a page here; 100 by default): the totals and
    # the largest lags stay the whole group's, each lag linked to the page showing it,
    # and the live fragment keeps to the page shown.
    def rows() -> list[str]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#lag tbody tr')].map(r => r.id)")

    def href(css: str) -> str:
        return browser.execute_script("return document.querySelector(arguments[0]).href", css)

    browser.get(console.url + "/groups/settled?per_page=2")
    assert rows() == [f"lag-{FIXED}-0", f"lag-{FIXED}-1"]
    assert _text(browser, "#total-lag") == str(expected_total)
    assert _text(browser, "#largest-lag") == (f"Largest lag: {FIXED}-1 (21), {FIXED}-0 (20), "
                                              f"{FIXED}-2 (20)")
    browser.get(href(".pager a[rel=next]"))
    _poll(lambda: rows() == [f"lag-{FIXED}-2"], "the group's second page")
    refreshed = _attr(browser, ".live", "data-updated")
    _poll(lambda: _attr(browser, ".live", "data-updated") != refreshed, "the lag refreshed")
    assert rows() == [f"lag-{FIXED}-2"] and "page 2 of 2" in _text(browser, ".pager")
    browser.get(href(f"#largest-lag a[href$='#lag-{FIXED}-0']"))
    _poll(lambda: rows() == [f"lag-{FIXED}-0", f"lag-{FIXED}-1"], "the page of fixed-0")
    assert browser.current_url.endswith(f"/groups/settled?per_page=2&page=0#lag-{FIXED}-0")

    # The live group: its member and assignment, and a lag chart that grows by itself.
    browser.get(console.url + "/groups/readers")
    assert "reader-1" in _text(browser, "#members")
    _poll(lambda: int(_attr(browser, "#lag-chart", "data-points")) >= 3, "lag chart points")
    screenshot(browser, "group")


def test_transactions_and_quotas_pages_show_what_the_cluster_holds(browser, console,
                                                                    cluster):
    from tidewater.client.admin import AdminClient
    from tidewater.client.producer import Producer

    with AdminClient(cluster.bootstrap) as admin:
        admin.alter_client_quotas(None, "batch-loader", {"producer_byte_rate": 1048576.0})
    producer = Producer(cluster.bootstrap, transactional_id="invoice-writer", linger_ms=0,
                        max_block_ms=30000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(LIVE, b"pending invoice", partition=0)
        producer.flush(30)  # left open while the page is looked at
        browser.get(console.url + "/transactions")
        assert _text(browser, "#txn-invoice-writer .state") == "Ongoing"
        assert f"{LIVE}-0" in _text(browser, "#txn-invoice-writer .partitions")
        screenshot(browser, "transactions")
        producer.abort_transaction()
    finally:
        producer.close()
    browser.get(console.url + "/quotas")
    assert _text(browser, "#quota--batch-loader .producer_byte_rate") == "1048576"
    screenshot(browser, "quotas")


def test_charts_update_live_without_a_reload(browser, console, cluster):
    browser.get(console.url + "/charts")
    browser.execute_script("window.__notReloaded = true")

    def points() -> int:
        return int(_attr(browser, "#chart-produce_bytes", "data-points"))

    first = _poll(points, "produce chart points")
    _poll(lambda: points() >= first + 3, "the produce chart to grow")
    assert browser.execute_script("return window.__notReloaded") is True
    legend = browser.execute_script(
        "return [...document.querySelectorAll('#chart-produce_bytes .legend')]"
        ".map(e => e.textContent).join(' ')")
    assert "broker-1" in legend and "broker-3" in legend
    for chart in ("fetch_bytes", "requests", "isr_shrinks", "p99_produce_ms", "throttle_ms"):
        assert browser.find_elements("css selector", f"#chart-{chart}")
    _local_resources_only(browser)
    screenshot(browser, "charts")


def test_read_only_console_refuses_actions(browser, console, cluster):
    browser.get(console.url + "/topics")
    assert not browser.find_elements("css selector", "form.action")
    request = urllib.request.Request(console.url + "/actions/delete-topic",
                                     data=f"name={FIXED}&confirm=yes".encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert fully_replicated(cluster, FIXED) is not None


def test_admin_actions_ask_to_confirm(browser, cluster, tmp_path):
    from selenium.webdriver.common.by import By

    from tidewater.client.admin import AdminClient
    from tidewater.client.group_admin import GroupAdmin

    writer = ConsoleProcess(["--data-dir", str(cluster.data_dir), "--allow-writes"],
                            tmp_path / "console-writes.log")
    try:
        browser.get(writer.url + "/topics")
        form = browser.find_element(By.ID, "create-topic")
        form.find_element(By.NAME, "name").send_keys("made-here")
        for name, value in (("partitions", "2"), ("replication_factor", "3")):
            field = form.find_element(By.NAME, name)
            field.clear()
            field.send_keys(value)
        form.find_element(By.NAME, "configs").send_keys("retention.ms=3600000")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        assert "Create topic 'made-here' with 2 partition(s)" in _text(browser, "#confirm-what")
        with AdminClient(cluster.bootstrap) as admin:
            assert "made-here" not in admin.list_topics()  # nothing before the confirmation
        screenshot(browser, "confirm")
        browser.find_element(By.ID, "confirm-yes").click()
        _poll(lambda: browser.find_elements(By.CSS_SELECTOR, "#p-1"), "the new topic's page")
        with AdminClient(cluster.bootstrap) as admin:
            [made] = admin.describe_topics(["made-here"], with_replica_state=False)
        assert len(made.partitions) == 2 and made.configs["retention.ms"] == "3600000"
        assert _text(browser, "#config-retention\\.ms .value") == "3600000"

        browser.find_element(By.CSS_SELECTOR, "#delete-topic button").click()
        assert "Delete topic 'made-here'" in _text(browser, "#confirm-what")
        browser.find_element(By.ID, "confirm-yes").click()
        _poll(lambda: browser.current_url.endswith("/topics"), "back on the topics list")
        with AdminClient(cluster.bootstrap) as admin:
            _poll(lambda: "made-here" not in admin.list_topics(), "the topic deleted")

        browser.get(writer.url + "/groups/settled")
        form = browser.find_element(By.ID, "reset-offsets")
        from selenium.webdriver.support.ui import Select

        Select(form.find_element(By.NAME, "to")).select_by_value("earliest")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        assert "to earliest" in _text(browser, "#confirm-what")
        browser.find_element(By.ID, "confirm-yes").click()
        _poll(lambda: _text(browser, "#total-lag") == "91", "the lag after the reset")
        with GroupAdmin(cluster.bootstrap) as admin:
            assert {p.committed for p in admin.describe_group("settled").partitions} == {0}
    finally:
        writer.stop()


def test_killed_broker_shows_down_and_its_partitions_under_replicated(browser, console,
                                                                       cluster):
    """Runs last: broker 2 is SIGKILLed (by its recorded pid) with the overview open."""
    browser.get(console.url + "/")
    browser.execute_script("window.__notReloaded = true")
    assert _text(browser, "#urp-count") == "0"
    killed = run_tide("cluster", "kill", "2", "--data-dir", str(cluster.data_dir))
    assert killed.returncode == 0, killed.stderr
    started = time.monotonic()

    def shown_down() -> bool:
        return (_attr(browser, "#broker-2", "data-status") == "down"
                and int(_text(browser, "#urp-count")) > 0)

    _poll(shown_down, "broker 2 down and partitions under-replicated", timeout_s=10)
    elapsed_s = time.monotonic() - started
    assert browser.execute_script("return window.__notReloaded") is True
    # Every partition of both topics has broker 2 among its replicas (RF 3 of 3).
    _poll(lambda: _text(browser, f"#under-replicated-{FIXED} .count") == "3 of 3",
          f"all of {FIXED} under-replicated")
    assert _text(browser, f"#under-replicated-{FIXED} .which") == "0, 1, 2"
    assert _text(browser, f"#under-replicated-{FIXED} .missing") == "brokers 2"
    assert _text(browser, f"#under-replicated-{LIVE} .count") == "3 of 3"
    screenshot(browser, "overview-broker-down")
    print(f"broker 2 shown down and its partitions under-replicated {elapsed_s:.1f} s after "
          "SIGKILL")
    assert elapsed_s < 10 * WAIT_SCALE
