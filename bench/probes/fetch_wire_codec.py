"""CPU per ReplicaFetch answer: ``fetch_wire``'s encoder and decoder against protobuf's.

    .venv/bin/python bench/probes/fetch_wire_codec.py [--records-bytes 262144] [--partitions 1]
                                                      [--rounds 2000]

Leader side: the answer's wire bytes from ``FetchedPartition`` tuples, through a
protobuf message (``fetch_response(...).SerializeToString()``, what ReplicaFetch did)
and by ``encode_by_hand``. Follower side: from those bytes to what the fetcher reads of
each partition (every field, the records as a buffer), through
``pb.FetchResponse.FromString`` and ``.records`` and by ``decode_by_hand``. (ReplicaFetch
takes the hand-written way only for partitions of ``BY_HAND_RECORDS_BYTES`` and more.)
Prints CPU microseconds per answer (``time.process_time``: robust to other load on
the machine) and per MB of records. gRPC's own copy on each side is in neither.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from tidewater.broker.serving.fetch import FetchedPartition, fetch_response  # noqa: E402
from tidewater.broker.serving.replica_fetch_wire import decode_by_hand, encode_by_hand  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402
from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers  # noqa: E402


def per_answer_us(work, rounds: int) -> float:
    """Best of three runs of ``rounds`` calls: CPU microseconds per call."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(rounds):
            work()
        best = min(best, (time.process_time() - started) / rounds * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-bytes", type=int, default=256 * 1024,
                        help="records per partition in one answer")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args(argv)
    tune_malloc_for_large_buffers()  # as the broker's servers do
    results = [FetchedPartition(f"topic-{i % 3}", i, pb.NONE, "", 1_000_000 + i, 0,
                                1_000_500 + i, 7, os.urandom(args.records_bytes), None)
               for i in range(args.partitions)]
    wire = encode_by_hand(results)
    assert wire == fetch_response(results).SerializeToString()

    def pb_decode() -> None:
        for p in pb.FetchResponse.FromString(wire).partitions:
            _ = (p.topic, p.partition, p.error_code, p.high_watermark, p.log_start_offset,
                 p.HasField("diverging_epoch"), p.records)

    def wire_decode() -> None:
        for p in decode_by_hand(wire)[1]:
            _ = (p.topic, p.partition, p.error_code, p.high_watermark, p.log_start_offset,
                 p.diverging, p.records)

    mb = args.records_bytes * args.partitions / 1e6
    rows = [("encode", "protobuf", per_answer_us(
                lambda: fetch_response(results).SerializeToString(), args.rounds)),
            ("encode", "fetch_wire", per_answer_us(lambda: encode_by_hand(results), args.rounds)),
            ("decode", "protobuf", per_answer_us(pb_decode, args.rounds)),
            ("decode", "fetch_wire", per_answer_us(wire_decode, args.rounds))]
    print(f"{args.partitions} partition(s) x {args.records_bytes} B of records per answer, "
          f"{args.rounds} rounds, best of 3")
    for side, how, us in rows:
        print(f"  {side}  {how:10}  {us:8.1f} us/answer  {us / mb / 1000:6.3f} CPU-ms/MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
