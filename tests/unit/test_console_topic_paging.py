"""The console's topic page at 1,000 partitions, without a cluster: a page of partitions
at a time (tools/console/paging.py), the whole topic's problems listed with links to
their pages, and what the snapshot asks of the cluster (a fake admin client)."""

from __future__ import annotations

import re
import threading
from typing import Any

from tidewater.client.admin import (
    BrokerDescription,
    ClusterDescription,
    DescribedConfig,
    PartitionDescription,
    ReplicaState,
    TopicDescriptionInfo,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.tools.console.app import MOST_PARTITION_OPTIONS, Console, ConsoleConfig
from tidewater.tools.console.cluster_data import ClusterData
from tidewater.tools.console.paging import PARTITIONS_PER_PAGE, PartitionPage

PARTITIONS = 1000


def test_partition_page_clamps_and_finds_the_page_of_a_partition():
    page = PartitionPage.of(PARTITIONS)
    assert (page.index, page.first, page.stop, page.count) == (0, 0, 100, 10)
    assert not page.has_previous and page.has_next
    last = PartitionPage.of(PARTITIONS, index=99)
    assert (last.index, last.first, last.stop, last.has_next) == (9, 900, 1000, False)
    assert PartitionPage.of(PARTITIONS, showing=517).index == 5
    assert PartitionPage.of(PARTITIONS, index=2, showing=517).index == 2  # asked wins
    assert PartitionPage.of(PARTITIONS, index=-3).index == 0
    assert PartitionPage.of(0).count == 0 and PartitionPage.of(0).stop == 0
    assert PartitionPage.of(250, per_page=0).per_page == 1  # at least one a page
    whole = PartitionPage.of(PARTITIONS, per_page=PARTITIONS)
    assert (whole.count, whole.stop, whole.has_next) == (1, PARTITIONS, False)


class FakeAdmin:
    """DescribeCluster of one 1,000-partition topic over brokers 1-3 (partition 7 out of
    sync, partition 9 leaderless); every call counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.fenced: set[int] = set()

    def _called(self, name: str, arg: Any = None) -> None:
        with self.lock:
            self.calls.append((name, arg))

    def describe_cluster(self) -> ClusterDescription:
        self._called("DescribeCluster")
        partitions = tuple(
            PartitionDescription(p, -1 if p == 9 else p % 3 + 1, 0, 0, (1, 2, 3),
                                 (1, 2) if p == 7 else (1, 2, 3), p == 9)
            for p in range(PARTITIONS))
        brokers = tuple(BrokerDescription(b, 1, {"PLAINTEXT": f"h:{b}"}, b in self.fenced,
                                          False) for b in (1, 2, 3))
        return ClusterDescription("c", 1, 1, brokers,
                                  (TopicDescriptionInfo("wide", {}, partitions, "id"),))

    def describe_replicas(self, topics: list[str], broker_ids: Any = None
                          ) -> dict[tuple[str, int, int], ReplicaState]:
        self._called("DescribeReplicas", None if broker_ids is None else sorted(broker_ids))
        return {("wide", p, b): ReplicaState(b, 5, 5, 0, b == p % 3 + 1, 100)
                for p in range(PARTITIONS) for b in (1, 2, 3)}

    def describe_metadata_quorum(self) -> pb.DescribeQuorumResponse:
        self._called("DescribeQuorum")
        return pb.DescribeQuorumResponse(leader_id=100, epoch=1, high_watermark=10)

    def describe_topic_configs(self, topic: str) -> list[DescribedConfig]:
        self._called("DescribeTopicConfigs", topic)
        return [DescribedConfig("retention.ms", "1000", "topic")]

    def close(self) -> None:
        pass


def _data() -> tuple[ClusterData, FakeAdmin]:
    data = ClusterData("127.0.0.1:1", snapshot_max_age_ms=0)
    data.admin.close()
    fake = FakeAdmin()
    data.admin = fake  # type: ignore[assignment]
    return data, fake


def test_topic_detail_holds_one_page_of_rows_and_the_whole_topics_problems():
    data, fake = _data()
    try:
        t = data.topic("wide", page=None, showing=517)
        assert t.shown.index == 5 and [p.partition for p in t.partitions] == list(range(500, 600))
        assert t.partition_ids == tuple(range(PARTITIONS))
        assert t.under_replicated == ((7, 0),) and t.offline == ((9, 0),)
        assert [c.name for c in t.configs] == ["retention.ms"]
        # No Metadata request: the unfenced brokers of DescribeCluster are asked for
        # their replicas, DescribeQuorum and DescribeTopicConfigs beside.
        names = sorted(name for name, _ in fake.calls)
        assert names == ["DescribeCluster", "DescribeQuorum", "DescribeReplicas",
                         "DescribeTopicConfigs"]
        assert ("DescribeReplicas", [1, 2, 3]) in fake.calls
        # Next time the replicas are asked of the brokers up last time, while
        # DescribeCluster runs; a broker fenced since is simply not among the "up" ones.
        fake.calls.clear()
        fake.fenced.add(2)
        data.topic("wide", page=0)
        assert [c for c in fake.calls if c[0] == "DescribeReplicas"] == [
            ("DescribeReplicas", [1, 2, 3])]
        # A broker up again that was not asked last time: asked again, with it.
        fake.calls.clear()
        fake.fenced.clear()
        data.topic("wide", page=0)
        asked = [arg for name, arg in fake.calls if name == "DescribeReplicas"]
        assert asked[-1] == [1, 2, 3] and asked[:-1] in ([], [[1, 3]])  # [1, 3]: cancelled late
    finally:
        data.close()


def test_topic_page_of_1000_partitions_renders_one_page_and_links_the_rest():
    data, _fake = _data()
    try:
        console = Console(data, None, None, ConsoleConfig())  # type: ignore[arg-type]
        t = data.topic("wide", page=2)
        html = console.templates.env.get_template("topic.html").render(
            title="Topic wide", t=t, rate=None, page=None, browse_error="", modes=(),
            formats=(), form={"partition": "0", "mode": "newest", "limit": "20", "offset": "0",
                              "timestamp": "", "key": "", "format": "text"},
            keep_q="", default_per_page=PARTITIONS_PER_PAGE,
            most_partition_options=MOST_PARTITION_OPTIONS)
    finally:
        data.close()
    rows = re.findall(r'<tr id="p-(\d+)"', html)
    assert rows == [str(p) for p in range(200, 300)]
    assert html.count('<span class="replica') == 300  # each replica's offsets, on this page
    assert 'href="?page=1"' in html and 'href="?page=3"' in html and "page 3 of 10" in html
    assert f'href="?per_page={PARTITIONS}"' in html  # the whole table still reachable
    # Problems anywhere in the topic link to the page that shows them.
    assert 'href="?page=0#p-7">7</a>' in html and 'href="?page=0#p-9">9</a>' in html
    # No list of 1,000 options: a number to type.
    assert "<option value=\"999\"" not in html
    assert re.search(r'<input name="partition" type="number" min="0" max="999"', html)
