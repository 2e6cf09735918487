"""CPU µs the Kafka listener's codec spends on one acks=all round's Produce and Fetch.

    .venv/bin/python bench/probes/kafka_codec_micro.py [--rounds 5000] [--record-bytes 1100] [--records 3]

One process, no sockets: the steps the listener runs for a Produce request of one partition
(``--records`` records of ``--record-bytes`` in one batch's worth of bytes) and for the Fetch
answer that hands those bytes to a consumer, each timed alone with ``time.process_time``
over ``--rounds`` calls (so another process's load moves it little):

- Produce: ``decode_request`` (length checks and kio's reader), ``produce_request`` (kio body
  to the protobuf the replica manager takes), ``produce_values`` (the answer's values),
  ``build`` (values to kio's response entity) and ``encode_response_parts`` (kio's writer);
- Fetch, per version librdkafka may use: ``decode_request`` of a consumer's request of one
  partition, and ``fetch_values``, ``build`` and
  ``encode_response_parts`` of the answer with those records (the records themselves are
  kept by reference, not copied, from ``BY_REFERENCE_BYTES_MIN``).

This is the Kafka path's own cost per round beside the gRPC path's protobuf (in C): what
``kafka_cpu_per_record.py`` shows as the leader's extra µs per record over the Kafka
listener comes partly from here.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

import tidewater.broker.__main__ as broker_main  # noqa: E402

broker_main.import_kafka_types_without_hypothesis()  # as the broker does, before the codec

from bench.bench_common import format_table  # noqa: E402
from tidewater.broker.kafka import apis  # noqa: E402
from tidewater.broker.kafka.codec import (  # noqa: E402
    RequestHead,
    build,
    decode_request,
    encode_request,
    encode_response_parts,
    response_type,
)
from tidewater.broker.serving.fetch import FetchedPartition  # noqa: E402
from tidewater.proto import tidewater_pb2 as pb  # noqa: E402

PRODUCE, FETCH = 0, 1
PRODUCE_VERSION = 9  # flexible (compact fields, tagged sections), no KIP-951 fields
FETCH_VERSIONS = (11, 12, 13)  # 12 made it flexible, 13 names topics by id


def cpu_us(call: Callable[[], object], rounds: int) -> float:
    call()  # caches (the codec's readers, writers and build plans) made before timing
    start = time.process_time()
    for _ in range(rounds):
        call()
    return (time.process_time() - start) / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--record-bytes", type=int, default=1100)
    parser.add_argument("--records", type=int, default=3)
    args = parser.parse_args(argv)
    records = os.urandom(args.records * args.record_bytes)
    rows: list[tuple[str, str]] = []

    def timed(label: str, call: Callable[[], object]) -> None:
        rows.append((label, f"{cpu_us(call, args.rounds):.1f}"))

    frame = encode_request(PRODUCE, PRODUCE_VERSION, 7, {
        "transactional_id": None, "acks": -1, "timeout": datetime.timedelta(seconds=30),
        "topic_data": [{"name": "paced", "partition_data": [{"index": 0, "records": records}]}],
    })[4:]  # without the size prefix, as the listener's frame reader hands it on
    head, body = decode_request(frame, apis.SUPPORTED)
    answer = pb.ProduceResponse()
    answer.partitions.add(topic="paced", partition=0, error_code=pb.NONE, base_offset=100,
                          log_start_offset=0, log_append_time_ms=-1)
    produce_values = apis.produce_values(answer, None)
    produce_type = response_type(PRODUCE, PRODUCE_VERSION)
    produce_built = build(produce_type, produce_values)
    timed(f"Produce v{PRODUCE_VERSION}: decode_request", lambda: decode_request(frame, apis.SUPPORTED))
    timed(f"Produce v{PRODUCE_VERSION}: produce_request (to protobuf)",
          lambda: apis.produce_request(body))
    timed(f"Produce v{PRODUCE_VERSION}: produce_values", lambda: apis.produce_values(answer, None))
    timed(f"Produce v{PRODUCE_VERSION}: build", lambda: build(produce_type, produce_values))
    timed(f"Produce v{PRODUCE_VERSION}: encode_response_parts",
          lambda: encode_response_parts(head, produce_built))

    topic_id = str(uuid.uuid4())
    for version in FETCH_VERSIONS:
        fetch_head = RequestHead(FETCH, version, 9, "rdkafka")
        # From v13 the answers name the topic by its id (``fetch_values`` parses it).
        fetched = [FetchedPartition(topic_id if version >= 13 else "paced", 0, pb.NONE, "", 100,
                                    0, 100, 0, records, None)]
        values = apis.fetch_values(fetched, version)
        fetch_type = response_type(FETCH, version)
        built = build(fetch_type, values)
        # The consumer's request of that round: one partition at the topic's end.
        fetch_frame = encode_request(FETCH, version, 9, {
            "max_wait": datetime.timedelta(milliseconds=100), "min_bytes": 1,
            "max_bytes": 52_428_800, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": "paced", "topic_id": uuid.UUID(topic_id), "partitions": [{
                "partition": 0, "current_leader_epoch": 0, "fetch_offset": 100,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1_048_576}]}]})[4:]
        timed(f"Fetch v{version}: decode_request",
              partial(decode_request, fetch_frame, apis.SUPPORTED))
        timed(f"Fetch v{version}: fetch_values", partial(apis.fetch_values, fetched, version))
        timed(f"Fetch v{version}: build", partial(build, fetch_type, values))
        timed(f"Fetch v{version}: encode_response_parts",
              partial(encode_response_parts, fetch_head, built))

    print(f"{args.records} records of {args.record_bytes} B in one partition; CPU µs per call, "
          f"{args.rounds:,} calls each; load average {os.getloadavg()[0]:.2f}")
    print(format_table(("step", "CPU µs"), rows, align_right=(False, True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
