"""Microbenchmark of the consumer's decode path: CPU microseconds per record.

Builds one fetch answer (uncompressed RecordBatch v2 batches of ``--batch-kib``
KiB, the shape the Producer writes: null keys, no headers, millisecond
timestamps) and decodes it the two ways the client does:

- ``decode_records``: ``proto.records.decode_records`` (every record of every
  batch as ``Record``), what tests and the broker's timestamp lookup use;
- ``consumer``: ``Consumer._decode`` (CRC check, decode, ``ConsumerRecord``s),
  the work ``Consumer.poll`` does per fetched chunk, without the network.

CPU time is ``time.process_time`` (best of ``--repeat``), so a loaded machine
distorts it less than wall clock; the load average is printed alongside.

    .venv/bin/python bench/probes/consumer_micro.py [--mib 16] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import TopicPartition
from tidewater.proto.records import SimpleRecord, decode_records, encode_batch

MIB = 1024 * 1024


def fetch_answer(record_bytes: int, total_bytes: int, batch_bytes: int, *,
                 with_headers: bool = False) -> tuple[bytes, int]:
    """Concatenated batches holding about ``total_bytes`` of values; (data, record count)."""
    per_batch = max(1, batch_bytes // (record_bytes + 8))
    batches = []
    offset = 0
    base_ts = 1_700_000_000_000
    headers = (("trace", b"abc123"),) if with_headers else ()
    while offset * record_bytes < total_bytes:
        # Timestamps a few ms apart, as a producer's linger gives them.
        records = [SimpleRecord(None, os.urandom(record_bytes), headers, base_ts + (offset + i) // 64)
                   for i in range(per_batch)]
        batches.append(encode_batch(records, base_offset=offset, partition_leader_epoch=3))
        offset += per_batch
    return b"".join(batches), offset


def cpu_us_per_record(fn, count: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best / count * 1e6


def consumer_decoder(data: bytes):
    consumer = Consumer.__new__(Consumer)  # no metadata client: only the decode path runs
    tp = TopicPartition("bench", 0)

    def run():
        consumer._positions = {tp: 0}
        records = consumer._decode(tp, data)
        for _ in records:  # callers iterate what poll returns
            pass
        return records
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=16, help="MiB of values per case")
    parser.add_argument("--batch-kib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; best of {args.repeat}; CPU time per record")
    print(f"{'case':<28} {'records':>9} {'decode_records':>15} {'consumer':>10} {'consumer MB/CPU-s':>18}")
    for label, size, with_headers in [("1 KiB values", 1024, False), ("100 B values", 100, False),
                                      ("1 KiB values + 1 header", 1024, True)]:
        data, count = fetch_answer(size, int(args.mib * MIB), args.batch_kib * 1024,
                                   with_headers=with_headers)
        decoder = consumer_decoder(data)
        assert len(decoder()) == count
        plain = cpu_us_per_record(lambda data=data: list(decode_records(data)), count, args.repeat)
        consumer = cpu_us_per_record(decoder, count, args.repeat)
        rate = size / consumer  # bytes per µs = MB per s
        print(f"{label:<28} {count:>9,} {plain:>12.2f} µs {consumer:>7.2f} µs {rate:>18.0f}")


if __name__ == "__main__":
    main()
