"""The console's group page at 1,000 partitions, without a cluster: one page of the lag
table at a time (tools/console/group_lag.py), the totals, each topic's sum, the largest
lags and the members' assignments over the whole group."""

from __future__ import annotations

import re

import pytest

from tidewater.client.group_admin import GroupDescription, MemberDescription, PartitionLag
from tidewater.tools.console.app import Console, ConsoleConfig
from tidewater.tools.console.cluster_data import ClusterData
from tidewater.tools.console.group_lag import MEMBERS_PER_PAGE, group_page, ranges

pytestmark = pytest.mark.timeout(60)


def _described() -> GroupDescription:
    """Topic "a" of 3 partitions (no offset committed on a-2), topic "wide" of 1,000 with
    lag p % 7, but 50 + p on partitions 990-999; two members sharing "wide"."""
    partitions = [PartitionLag("a", 0, 5, 8, "m1"), PartitionLag("a", 1, 0, 0, "m1"),
                  PartitionLag("a", 2, -1, 4, "")]
    partitions += [PartitionLag("wide", p, 0, 50 + p if p >= 990 else p % 7, "m1" if p < 500
                                else "m2") for p in range(1000)]
    members = [MemberDescription("m1", "c1", "/h1", [("a", 0), ("a", 1)]
                                 + [("wide", p) for p in range(500)]),
               MemberDescription("m2", "c2", "/h2", [("wide", p) for p in range(500, 1000)
                                                     if p != 700])]
    return GroupDescription("g", "Stable", "consumer", "range", members, partitions)


def test_ranges_join_consecutive_partitions():
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert ranges([]) == ""


def test_group_page_holds_one_page_and_the_whole_groups_totals():
    d = _described()
    g = group_page(d, page=1)
    assert [(p.topic, p.partition) for p in g.partitions] == [("wide", p) for p in range(97, 197)]
    wide = sum(50 + p if p >= 990 else p % 7 for p in range(1000))
    assert g.total_lag == 3 + 0 + wide
    assert [(t.topic, t.partitions, t.lag) for t in g.topics] == [("a", 3, 3), ("wide", 1000, wide)]
    # Partitions 999 down to 990, each linked to its page (the 1,003 rows' 11th).
    assert [(p.partition, p.lag, p.page) for p in g.largest_lag] == [
        (p, 50 + p, 9) if p < 997 else (p, 50 + p, 10) for p in range(999, 989, -1)]
    assert [(m.assigned, m.assignment) for m in g.members] == [
        (502, "a 0-1; wide 0-499"), (499, "wide 500-699, 701-999")]
    assert group_page(d, page=99).shown.index == 10 and len(group_page(d, page=99).partitions) == 3
    assert len(group_page(d, per_page=2000).partitions) == 1003


def test_group_page_of_1000_partitions_renders_one_page_and_links_the_rest():
    data = ClusterData("127.0.0.1:1")
    try:
        console = Console(data, None, None, ConsoleConfig())  # type: ignore[arg-type]
        html = console.templates.env.get_template("_group_lag.html").render(
            g=group_page(_described(), page=1), keep_q="", keep_members_q="page=1&",
            lag_chart="")
    finally:
        data.close()
    rows = re.findall(r'<tr id="lag-([^"]+)"', html)
    assert rows == [f"wide-{p}" for p in range(97, 197)]
    assert "partitions wide-97-wide-196 of 1003 (page 2 of 11)" in html
    assert 'href="?page=0"' in html and 'href="?page=10"' in html
    assert 'href="?per_page=1003"' in html
    assert 'href="?page=10#lag-wide-999">wide-999</a> (1049)' in html
    assert re.search(r'<tr id="topic-lag-a">.*?class="lag">3<', html)
    # Two members fit one page: no members' pager.
    assert "mpage=" not in html and ">2</span> member(s)" not in html


def _crowd(members: int) -> GroupDescription:
    """``members`` consumers, member i assigned partition i of topic "t"."""
    return GroupDescription("g", "Stable", "consumer", "range",
                            [MemberDescription(f"m{i}", f"c{i}", "/h", [("t", i)])
                             for i in range(members)],
                            [PartitionLag("t", i, 0, i, f"m{i}") for i in range(members)])


def test_members_are_paged_apart_from_the_partitions():
    d = _crowd(250)
    g = group_page(d, page=1, member_page=2)
    assert g.members_shown.total == 250 and g.members_shown.count == 3
    assert [m.member_id for m in g.members] == [f"m{i}" for i in range(200, 250)]
    assert g.shown.index == 1  # the partitions' page is its own
    assert [m.member_id for m in group_page(d).members] == [f"m{i}" for i in range(100)]
    assert len(group_page(d, member_page=99).members) == 50  # clamped to the last page
    assert len(group_page(d, members_per_page=1000).members) == 250
    assert MEMBERS_PER_PAGE == 100


def test_members_pager_keeps_the_partitions_page_and_counts_every_member():
    data = ClusterData("127.0.0.1:1")
    try:
        console = Console(data, None, None, ConsoleConfig())  # type: ignore[arg-type]
        html = console.templates.env.get_template("_group_lag.html").render(
            g=group_page(_crowd(250), page=1, member_page=1), keep_q="mpage=1&",
            keep_members_q="page=1&", lag_chart="")
    finally:
        data.close()
    members = re.search(r'<table id="members">(.*?)</table>', html, re.S)
    assert members is not None
    assert re.findall(r"<tr><td>(m\d+)</td>", members.group(1)) == [
        f"m{i}" for i in range(100, 200)]
    assert "250 member(s)" in html
    assert "members 101-200 of 250 (page 2 of 3)" in html
    assert 'href="?page=1&amp;mpage=0"' in html and 'href="?page=1&amp;mpage=2"' in html
    assert 'href="?members_per_page=250"' in html
    # The partitions' pager keeps the members' page.
    assert 'href="?mpage=1&amp;page=2"' in html
