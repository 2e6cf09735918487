"""The console's pure parts (tools/console): metric parsing and rates, the SVG charts,
how records are shown, the config table. The pages themselves are tested in a real
browser (tests/console)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tidewater.proto.records import ConsumerRecord
from tidewater.tools.console import charts
from tidewater.tools.console.cluster_data import config_rows
from tidewater.tools.console.metrics import LagHistory, LagSampler, parse_sample, rate_point
from tidewater.tools.console.records import PREVIEW_BYTES_MAX, RecordQuery, show, shown_record

EXPOSITION = """\
# HELP tidewater_broker_bytes_in_total Batch bytes appended by produce
tidewater_broker_bytes_in_total 1000.0
tidewater_broker_bytes_out_total{kind="replica"} 5000.0
tidewater_broker_bytes_out_total{kind="consumer"} 300.0
tidewater_broker_isr_shrinks_total 2.0
tidewater_broker_request_latency_seconds_bucket{rpc="ProduceStream",le="0.001"} 90.0
tidewater_broker_request_latency_seconds_bucket{rpc="ProduceStream",le="0.01"} 99.0
tidewater_broker_request_latency_seconds_bucket{rpc="ProduceStream",le="+Inf"} 100.0
tidewater_broker_request_latency_seconds_count{rpc="ProduceStream"} 100.0
tidewater_broker_request_latency_seconds_count{rpc="FetchStream"} 50.0
tidewater_broker_replica_high_watermark{topic="a",partition="0",broker="1"} 10.0
tidewater_broker_replica_high_watermark{topic="a",partition="1",broker="1"} 7.0
tidewater_broker_replica_is_leader{topic="a",partition="0",broker="1"} 1.0
tidewater_broker_replica_is_leader{topic="a",partition="1",broker="1"} 0.0
tidewater_broker_topic_messages_in_total{topic="a"} 40.0
tidewater_broker_topic_bytes_in_total{topic="a"} 4000.0
tidewater_broker_topic_bytes_out_total{topic="a",kind="consumer"} 800.0
tidewater_broker_topic_bytes_out_total{topic="a",kind="replica"} 8000.0
tidewater_broker_topic_bytes_out_total{topic="b",kind="consumer"} 10.0
tidewater_broker_client_quota_throttle_time_ms_total{quota_type="Produce",user="",client_id="a"} 120.0
tidewater_broker_client_quota_throttle_time_ms_total{quota_type="Fetch",user="u",client_id=""} 30.0
"""


def test_parse_sample_reads_the_counters_the_charts_need():
    s = parse_sample(EXPOSITION, 1000)
    assert s.counters == {"produce_bytes": 1000.0, "fetch_bytes": 300.0, "requests": 150.0,
                          "isr_shrinks": 2.0, "throttle_ms": 150.0}
    assert s.produce_buckets == {"0.001": 90.0, "0.01": 99.0, "+Inf": 100.0}
    # Per topic: records in, bytes in, consumers' bytes out (followers' left out).
    assert s.topics == {"a": [40.0, 4000.0, 800.0], "b": [0.0, 0.0, 10.0]}


def test_topic_rates_sum_the_brokers_and_skip_a_restarted_one():
    from tidewater.tools.console.metrics import MetricsHistory, TopicRate
    from tidewater.tools.scrape import ScrapeTarget

    history = MetricsHistory([ScrapeTarget("broker-1", "http://127.0.0.1:1/metrics"),
                              ScrapeTarget("broker-2", "http://127.0.0.1:2/metrics"),
                              ScrapeTarget("broker-3", "http://127.0.0.1:3/metrics")])
    try:
        grown = (EXPOSITION.replace("} 40.0", "} 60.0").replace("} 4000.0", "} 6000.0")
                 .replace("} 800.0", "} 1000.0"))
        samples = history._samples
        samples["broker-1"].extend([parse_sample(EXPOSITION, 1000), parse_sample(grown, 3000)])
        # broker-2 first has topic a's series now: counted from zero.
        samples["broker-2"].extend([parse_sample("", 1000),
                                    parse_sample(EXPOSITION.replace('topic="b"', 'topic="c"'),
                                                 3000)])
        # broker-3 restarted: its counters went down, no rate from it this time.
        samples["broker-3"].extend([parse_sample(grown, 1000), parse_sample(EXPOSITION, 3000)])
        rates = history.topic_rates()
        assert rates["a"] == TopicRate(records_in=10 + 20, bytes_in=1000 + 2000,
                                       bytes_out=100 + 400)
        assert rates["b"] == TopicRate() and rates["c"] == TopicRate(bytes_out=5)
    finally:
        history.stop()


def test_rates_between_scrapes_and_a_restarted_counter():
    before = parse_sample(EXPOSITION, 1000)
    after = parse_sample(EXPOSITION.replace("1000.0", "3000.0")
                         .replace('le="0.01"} 99.0', 'le="0.01"} 199.0')
                         .replace('le="+Inf"} 100.0', 'le="+Inf"} 200.0')
                         .replace('le="0.001"} 90.0', 'le="0.001"} 90.0'), 3000)
    assert rate_point(before, after, "produce_bytes") == 1000.0  # 2000 bytes in 2 s
    # 100 new produce requests, 0 under 1 ms, all under 10 ms: p99 within (1, 10] ms.
    p99 = rate_point(before, after, "p99_produce_ms")
    assert p99 is not None and 1 < p99 <= 10
    assert rate_point(after, before, "produce_bytes") is None  # went down: restarted


def test_line_chart_is_one_svg_with_a_gap_for_a_down_broker():
    svg = charts.line_chart("Produce <bytes>/s", {
        "broker-1": [(1000, 1.0), (2000, 5.0), (3000, None), (4000, 2.0), (5000, 3.0)],
        "broker-2": [(4000, 1.0), (5000, None)], "broker-3": []}, now_ms=5000, window_s=60,
        chart_id="c")
    root = ET.fromstring(svg)  # well-formed, title escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert root.get("data-points") == "5"
    assert len(root.findall(f"{ns}polyline")) == 2  # the None split broker-1's line
    assert len(root.findall(f"{ns}circle")) == 1  # broker-2's one point before it went down
    legends = [t.text for t in root.findall(f"{ns}text") if t.get("class") == "legend"]
    assert legends == ["broker-1: 3", "broker-2: down", "broker-3: -"]
    assert charts.nice_max(0) == 1 and charts.nice_max(7.1) == 10 and charts.nice_max(120) == 200


def test_show_as_text_json_and_hex_and_cut_long_values():
    assert show(None, "text").is_null
    pretty = show(b'{"a": [1, 2]}', "json")
    assert pretty.as_json and json.loads(pretty.text) == {"a": [1, 2]} and "\n" in pretty.text
    assert show(b"not json", "json").text == "not json"
    assert show(bytes(range(18)), "hex").text.splitlines() == [
        bytes(range(16)).hex(" "), bytes([16, 17]).hex(" ")]
    long = show(b"x" * (PREVIEW_BYTES_MAX + 5), "text")
    assert long.cut and len(long.text) == PREVIEW_BYTES_MAX and long.length == PREVIEW_BYTES_MAX + 5
    full = shown_record(ConsumerRecord("t", 0, 7, b"k", b"x" * 5000, 1, 0, (("h", b"v"),)),
                        "text", None)
    assert not full.value.cut and len(full.value.text) == 5000 and full.headers[0][0] == "h"


def test_record_query_refuses_what_it_cannot_do():
    for bad in ({"mode": "oldest"}, {"fmt": "yaml"}, {"limit": 0}, {"limit": 10_000},
                {"offset": -1}):
        try:
            RecordQuery(**bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_config_rows_without_a_broker_say_where_each_value_comes_from():
    # The fallback when no broker answers DescribeTopicConfigs: "default?", since a
    # broker's own setting may differ from Kafka's default shown.
    rows = {r.name: r for r in config_rows({"retention.ms": "1000", "x.custom": "1"})}
    assert (rows["retention.ms"].value, rows["retention.ms"].source) == ("1000", "topic")
    assert (rows["segment.bytes"].value, rows["segment.bytes"].source) == ("1073741824",
                                                                           "default?")
    assert rows["x.custom"].source == "topic"


def test_lag_history_is_bounded():
    h = LagHistory(groups_max=2, points_max=3)
    for i in range(5):
        h.add("g1", i, i)
    h.add("g2", 0, None)
    h.add("g3", 0, 1)
    assert [v for _t, v in h.series("g1")] == []  # the oldest group made room
    assert h.series("g3") == [(0, 1.0)]
    h2 = LagHistory(points_max=3)
    for i in range(5):
        h2.add("g", i, i)
    assert [t for t, _v in h2.series("g")] == [2, 3, 4]


def test_chart_window_spans_back_to_the_oldest_point():
    series = {"b": [(100_000, 1.0), (130_000, 2.0)]}
    assert charts.window_for(series, 130_000) == 60  # at least a minute
    assert charts.window_for(series, 100_000 + 150_000) == 150
    assert charts.window_for(series, 100_000 + 900_000) == 300  # at most the history
    assert charts.window_for({}, 5) == 60
    assert charts.span_label(90) == "-90 s" and charts.span_label(300) == "-5 min"


def test_lag_sampler_records_every_group_and_a_gap_for_one_that_fails():
    from tidewater.proto.errors import TidewaterError

    def lag_of(group_id: str) -> int | None:
        if group_id == "broken":
            raise TidewaterError("coordinator not available")
        return {"a": 5, "b": None}[group_id]

    history = LagHistory()
    sampler = LagSampler(history, lambda: ["b", "broken", "a"], lag_of, groups_max=3)
    sampler.sample_once()
    assert [v for _t, v in history.series("a")] == [5.0]
    assert [v for _t, v in history.series("b")] == [None]
    assert [v for _t, v in history.series("broken")] == [None]

    def no_cluster() -> list[str]:
        raise TidewaterError("no broker reachable")

    LagSampler(history, no_cluster, lag_of).sample_once()  # nothing raised, nothing added
    assert len(history.series("a")) == 1
