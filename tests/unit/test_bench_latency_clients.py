"""The latency rows' client shapes: the FetchStream receiver's decoding, and a paced run
of each producer and receiver kind against a local 3-broker cluster (stopped by pid)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import tidewater_side
from bench.fetch_stream_receiver import records_after
from tidewater.client.metadata import TopicPartition
from tidewater.proto.records import encode_batch

TP = TopicPartition("t", 0)


def test_records_after_skips_what_was_returned_and_moves_past_batches():
    data = (encode_batch([(None, b"a"), (None, b"b")], base_offset=10)
            + encode_batch([(None, b"c")], base_offset=12))
    records, position = records_after(data, TP, 11)
    assert [(r.offset, r.value) for r in records] == [(11, b"b"), (12, b"c")]
    assert position == 13
    # A partial batch at the end (the fetch size limit) is left for the next fetch.
    records, position = records_after(data[:-3], TP, 10)
    assert [r.offset for r in records] == [10, 11] and position == 12


def test_paced_latency_rejects_an_unknown_client_shape():
    with pytest.raises(ValueError):
        tidewater_side.paced_latency("127.0.0.1:1", "t", 100, 1, 1000, producer_kind="kafka")


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("producer_kind", "receiver_kind"),
                         [("asyncio", "stream"), ("threaded", "aio_consumer"),
                          ("threaded", "consumer")])
def test_paced_latency_each_client_shape_receives_every_record(tmp_path, producer_kind,
                                                               receiver_kind):
    cluster = tidewater_side.TidewaterCluster(tmp_path / "cluster")
    try:
        bootstrap = cluster.start()
        cluster.create_topic("paced")
        result = tidewater_side.paced_latency(bootstrap, "paced", 100, 300, 1000,
                                              producer_kind=producer_kind,
                                              receiver_kind=receiver_kind)
    finally:
        cluster.stop()
    assert result["received"] == 300
    assert result["ack"].count == 300 and result["e2e"].count == 300
    assert (result["producer"], result["receiver"]) == (producer_kind, receiver_kind)
