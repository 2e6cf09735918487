"""The group page of a group over more than 100 partitions, over HTTP against a real
one-broker cluster: the lag table paged as the topic page is (100 rows, the rest on
page 2, the live fragment asked for the same page; its members paged apart), and the total, each topic's sum
and the largest lags those of the whole group as its coordinator describes it."""

from __future__ import annotations

import re
import threading
import urllib.request

import pytest

from tests.cli.cluster_fixtures import start_cluster, stop_cluster, wait_for
from tests.console.conftest import ConsoleProcess
from tidewater.client.admin import AdminClient
from tidewater.client.consumer import Consumer
from tidewater.client.group_admin import GroupAdmin
from tidewater.client.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GROUP = "paged"
CROWD = "crowd"  # a group of three live consumers, its members paged two at a time
WIDE, NARROW = "wide", "narrow"  # 130 and 3 partitions: 133 rows, "narrow" first
RECORDS = {**{(WIDE, p): 1 if p < 118 else 10 + p for p in range(130)},
           (NARROW, 0): 200, (NARROW, 1): 0, (NARROW, 2): 5}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _lag_rows(page: str) -> dict[tuple[str, int], int | None]:
    """Each row of the lag table: (topic, partition) -> lag, in the page's order."""
    rows = re.findall(r'<tr id="lag-([^"]+)-(\d+)">.*?<td class="lag">([^<]*)</td>', page)
    return {(t, int(p)): None if lag == "-" else int(lag) for t, p, lag in rows}


def _members(page: str) -> str:
    found = re.search(r'<table id="members">(.*?)</table>', page, re.S)
    assert found is not None, "no members table"
    return found.group(1)


class Crowd:
    """``count`` consumers of ``group`` on ``topic``, each polling in its own thread until
    the block ends."""

    def __init__(self, bootstrap: str, group: str, topic: str, count: int) -> None:
        self.bootstrap, self.group, self.topic, self.count = bootstrap, group, topic, count
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._consume, args=(i,), daemon=True)
                        for i in range(count)]

    def _consume(self, i: int) -> None:
        with Consumer(self.bootstrap, group_id=self.group, client_id=f"crowd-{i}",
                      auto_offset_reset="earliest", session_timeout_ms=10000) as c:
            c.subscribe([self.topic])
            while not self.stop.is_set():
                c.poll(200, max_records=10)

    def joined(self, groups: GroupAdmin) -> bool:
        d = groups.describe_group(self.group)
        return d.state == "Stable" and len(d.members) == self.count

    def __enter__(self) -> Crowd:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_group_page_pages_its_partitions_and_sums_the_whole_group(tmp_path):
    cluster = start_cluster(tmp_path / "cluster", 1, "offsets.topic.replication.factor=1",
                            "offsets.topic.num.partitions=3")
    console = None
    try:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic(WIDE, 130, 1)
            admin.create_topic(NARROW, 3, 1)
        with Producer(cluster.bootstrap, acks="all") as producer:
            for (topic, partition), count in RECORDS.items():
                for i in range(count):
                    producer.send(topic, b"r%d" % i, partition=partition)
            producer.flush(60)
        with GroupAdmin(cluster.bootstrap) as groups:
            for topic in (WIDE, NARROW):
                groups.reset_offsets(GROUP, topic, to="earliest")
            described = groups.describe_group(GROUP)
        lags = {(p.topic, p.partition): p.lag for p in described.partitions}
        assert lags == RECORDS  # committed 0 everywhere: the lag is every record
        listed = [(p.topic, p.partition) for p in described.partitions]

        console = ConsoleProcess(["--data-dir", str(cluster.data_dir)], tmp_path / "console.log")
        first = _get(console.url + f"/groups/{GROUP}")
        second = _get(console.url + f"/groups/{GROUP}?page=1")
        assert list(_lag_rows(first)) == listed[:100]
        assert list(_lag_rows(second)) == listed[100:]
        assert {**_lag_rows(first), **_lag_rows(second)} == lags
        assert "page 1 of 2" in first and 'href="?page=1"' in first
        assert f'href="?per_page={len(listed)}"' in first

        # Over the whole group, on either page.
        for page in (first, second):
            assert re.search(r'id="total-lag">(\d+)<', page).group(1) == str(sum(lags.values()))
            for topic in (WIDE, NARROW):
                row = re.search(rf'<tr id="topic-lag-{topic}">.*?class="partitions">(\d+)<.*?'
                                r'class="lag">(\d+)<', page)
                assert (int(row.group(1)), int(row.group(2))) == (
                    sum(1 for t, _ in lags if t == topic),
                    sum(lag for (t, _), lag in lags.items() if t == topic))
            largest = re.findall(r'<a class="lagging" data-lag="(\d+)" href="\?page=(\d+)'
                                 r'#lag-([^"]+)-(\d+)">', page)
            assert [(t, int(p), int(lag), int(index)) for lag, index, t, p in largest] == [
                (NARROW, 0, 200, 0)] + [(WIDE, p, 10 + p, 1) for p in range(129, 120, -1)]

        # The live fragment is asked for the page shown, and shows the same rows.
        assert f'data-live="/groups/{GROUP}/lag?page=1"' in second
        assert list(_lag_rows(_get(console.url + f"/groups/{GROUP}/lag?page=1"))) == listed[100:]
        # All on one page, without a pager; its fragment keeps the page size.
        whole = _get(console.url + f"/groups/{GROUP}?per_page={len(listed)}")
        assert list(_lag_rows(whole)) == listed and 'class="pager"' not in whole
        assert f'data-live="/groups/{GROUP}/lag?per_page={len(listed)}&amp;page=0"' in whole

        # Members are paged too, apart from the partitions: three live consumers, two a page.
        with Crowd(cluster.bootstrap, CROWD, NARROW, 3) as crowd:
            with GroupAdmin(cluster.bootstrap) as groups:
                assert wait_for(lambda: crowd.joined(groups), "three members in the group")
                members = {m.member_id: m.client_id
                           for m in groups.describe_group(CROWD).members}
            pages = [_get(console.url + f"/groups/{CROWD}?members_per_page=2&mpage={i}")
                     for i in (0, 1)]
        shown = [dict(re.findall(r'<tr><td>([^<]+)</td><td>([^<]+)</td>', _members(page)))
                 for page in pages]
        assert [len(rows) for rows in shown] == [2, 1]
        assert {**shown[0], **shown[1]} == members
        assert "3 member(s)" in pages[0] and "members 1-2 of 3 (page 1 of 2)" in pages[0]
        assert 'href="?members_per_page=2&amp;mpage=1"' in pages[0]
        assert "members 3-3 of 3 (page 2 of 2)" in pages[1]
        # The live fragment is asked for the members' page shown, once.
        assert (f'data-live="/groups/{CROWD}/lag?members_per_page=2&amp;page=0&amp;mpage=1"'
                in pages[1])
    finally:
        if console is not None:
            console.stop()
        stop_cluster(cluster)
