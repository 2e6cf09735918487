"""Microbenchmark of the threaded Consumer's fetch round without the network: CPU
microseconds per ``Consumer._fetch_once``.

``consumer_micro`` times ``Consumer._decode`` alone; this times the rest of a poll's
round around it: the fetch plan, reading the answer (the per-partition answer table),
the prefetch's arguments and the decode of what came back. The network is replaced:
``_send_fetches`` returns an answered call holding one prebuilt FetchResponse, and
``_prefetch`` does nothing (its arguments are still built by ``_fetch_once``). The
answer carries ``--partitions`` partitions of one RecordBatch of ``--records`` 1 KiB
records each, so the small-answer rows (1 record, the latency receiver's shape) show
the round's fixed cost and the large ones its share of a bulk read.

Runs on any checkout whose Consumer has ``_fetch_once``/``_send_fetches``/``_prefetch``
(an A/B: run it with each checkout's interpreter, alternated):

    .venv/bin/python bench/probes/fetch_round_micro.py [--rounds 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import LeaderInfo, TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.records import SimpleRecord, encode_batch

ADDRESS = ("127.0.0.1", 9092)


class AnsweredCall:
    """A fetch already answered: what ``_send_fetches`` hands back, minus the stream."""

    def __init__(self, response: pb.FetchResponse) -> None:
        self.response = response

    def result(self, timeout: float | None = None) -> pb.FetchResponse:
        return self.response


class SnapshotMetadata:
    """Every partition led by one broker at ``ADDRESS``."""

    def leader_for(self, tp: TopicPartition) -> LeaderInfo:
        return LeaderInfo(1, ADDRESS, 3)

    def __init__(self, real) -> None:
        self.real = real  # the Consumer's own client, closed with it

    def invalidate(self) -> None:
        raise AssertionError("the probe's leaders are always known")

    def close(self) -> None:
        self.real.close()


def fetch_answer(partitions: int, records: int) -> pb.FetchResponse:
    batch = encode_batch([SimpleRecord(None, os.urandom(1024), (), 1_700_000_000_000)
                          for _ in range(records)], base_offset=0, partition_leader_epoch=3)
    return pb.FetchResponse(partitions=[
        pb.FetchPartitionResponse(topic="bench", partition=p, high_watermark=records,
                                       records=batch)
        for p in range(partitions)])


def consumer_round(partitions: int, records: int):
    """A Consumer reduced to what ``_fetch_once`` reads, and a function running one round."""
    consumer = Consumer("127.0.0.1:1", fetch_max_wait_ms=100)  # never connects: no poll runs
    tps = [TopicPartition("bench", p) for p in range(partitions)]
    answer = fetch_answer(partitions, records)
    consumer.metadata = SnapshotMetadata(consumer.metadata)  # type: ignore[assignment]
    consumer._send_fetches = lambda wanted, wait_ms: [  # type: ignore[method-assign]
        (address, items, AnsweredCall(answer)) for address, items in wanted.items()]
    consumer._prefetch = lambda wanted, chunks, high_watermarks: None  # type: ignore[method-assign]
    deadline = time.monotonic() + 3600

    def run() -> int:
        consumer._positions = dict.fromkeys(tps, 0)  # every round reads offset 0 again
        return len(consumer._fetch_once(deadline, None))
    return consumer, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20000, help="rounds per case (fewer for big answers)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; best of {args.repeat}; CPU µs per round")
    for partitions, records in [(1, 1), (8, 1), (1, 1000)]:
        consumer, run = consumer_round(partitions, records)
        try:
            assert run() == partitions * records
            rounds = max(10, args.rounds // records)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.process_time()
                for _ in range(rounds):
                    run()
                best = min(best, time.process_time() - start)
        finally:
            consumer.close()
        print(f"{partitions} partition(s) x {records} record(s): {best / rounds * 1e6:9.2f} µs/round")


if __name__ == "__main__":
    main()
