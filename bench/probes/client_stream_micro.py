"""CPU per request: unary ``Produce.future()``/``Fetch.future()`` against the streams (``client.streams``, grpc.aio on its loop thread).

    .venv/bin/python bench/probes/client_stream_micro.py [--count 3000] [--rate 1000] [--acks 1]

Starts a local 1-broker cluster (stopped at the end), creates an RF=1 topic and
sends ``count`` requests of one 1 KiB record, paced at ``rate``/s with one in
flight at a time per mode, first unary then stream then unary again (load
drifts). Prints the client process's CPU (all its threads, ``time.process_time``)
and the broker's CPU (/proc) per request, in microseconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from bench import tidewater_side  # noqa: E402
from bench.bench_common import process_cpu_s  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--acks", type=int, default=1)
    parser.add_argument("--modes", default="unary,stream,unary,stream,fetch-unary,fetch-stream,"
                        "fetch-unary,fetch-stream",
                        help="produce over unary/stream; fetch (one 1 KiB record) over "
                             "fetch-unary/fetch-stream")
    args = parser.parse_args(argv)

    from tidewater.client.metadata import ChannelPool, parse_bootstrap
    from tidewater.client.streams import StreamPool, StreamRequest
    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto.records import encode_batch

    with tempfile.TemporaryDirectory(prefix="tw-stream-micro-") as directory:
        cluster = tidewater_side.TidewaterCluster(directory, brokers=1)
        try:
            bootstrap = cluster.start()
            cluster.create_topic("micro", replication_factor=1)
            pid = next(p["pid"] for p in cluster.local.manifest["processes"].values()
                       if p["name"].startswith("broker-"))
            address = parse_bootstrap(bootstrap)[0]
            pool = ChannelPool()
            streams = StreamPool("ProduceStream", ordered=False)
            fetch_streams = StreamPool("FetchStream", ordered=True)
            records = encode_batch([(None, bytes(1024))])

            def request() -> pb.ProduceRequest:
                return pb.ProduceRequest(acks=args.acks, timeout_ms=10_000, partitions=[
                    pb.ProducePartitionData(topic="micro", partition=0, records=records)])

            def fetch_request() -> pb.FetchRequest:
                return pb.FetchRequest(
                    replica_id=-1, replica_broker_epoch=-1, max_wait_ms=0, min_bytes=1,
                    max_bytes=1 << 20, partitions=[pb.FetchPartition(
                        topic="micro", partition=0, current_leader_epoch=-1, fetch_offset=0,
                        partition_max_bytes=1 << 20)])

            def run(mode: str) -> tuple[float, float]:
                done = threading.Event()

                def on_done(*_):
                    done.set()

                def one() -> None:
                    done.clear()
                    if mode == "unary":
                        pool.broker(address).Produce.future(request(), timeout=30) \
                            .add_done_callback(on_done)
                    elif mode == "stream":
                        streams.stream(address).send(request(), on_done, 30)
                    elif mode == "fetch-unary":
                        pool.broker(address).Fetch.future(fetch_request(), timeout=30).result()
                        return
                    else:
                        stream = fetch_streams.stream(address)
                        pending = StreamRequest(stream, fetch_request())
                        stream.send(pending.request, pending.on_answer, 30)
                        pending.result()
                        return
                    if not done.wait(30):
                        raise RuntimeError("no answer")

                for _ in range(200):  # warm up: channel, stream, broker paths
                    one()
                broker_before, client_before = process_cpu_s(pid), time.process_time()
                interval = 1 / args.rate
                next_at = time.perf_counter()
                for _ in range(args.count):
                    next_at += interval
                    one()
                    pause = next_at - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                n = args.count
                return ((time.process_time() - client_before) / n * 1e6,
                        (process_cpu_s(pid) - broker_before) / n * 1e6)

            for mode in args.modes.split(","):
                client_us, broker_us = run(mode)
                print(f"{mode:6s} client {client_us:6.0f} µs/request  broker {broker_us:6.0f} "
                      f"µs/request  sum {client_us + broker_us:6.0f}", flush=True)
            streams.close()
            fetch_streams.close()
            pool.close()
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
