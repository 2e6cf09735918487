"""Client-side CPU cost of ``client.producer.Producer.send``, with the wire stubbed out.

No broker: a fake ``MetadataClient`` knows one topic with ``--partitions``
partitions led by one fake broker, whose ProduceStream (a fake ``StreamPool``; the
real streams' cost is measured by ``bench/probes/client_stream_micro.py``) hands
each request to a "wire" thread (standing in for the ``tide-client-io`` thread that
reads a stream's answers) that answers it at once with contiguous offsets. So the
numbers are the producer's own cost per record: ``send``, batching, encoding, settling and the done-callbacks, as the
cluster benchmark's Producer rows use them (one ``send`` + ``add_done_callback``
per record; ``--bulk`` measures ``send_many`` instead when the producer has it).

    .venv/bin/python bench/probes/producer_micro.py                 # 1 KiB and 100 B records
    .venv/bin/python bench/probes/producer_micro.py --records 200000 --sizes 100

Prints CPU µs per record (``time.process_time`` of the whole process: caller,
sender and wire threads) and the records/s that CPU cost allows on one core.
Also ``--latency``: p50/p99 of ``send(...).result()`` one at a time (linger 0),
the producer's own added latency without a network.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import threading
import time

from tidewater.client.metadata import LeaderInfo, PartitionInfo, TopicPartition
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches

ADDRESS = ("127.0.0.1", 1)


class FakeWire:
    """One thread answering ProduceRequests in order, like a broker that never fails."""

    def __init__(self, validate: bool):
        self.validate = validate
        self.next_offset: dict[tuple[str, int], int] = {}
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="fake-wire", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            request, callback = item
            answers = []
            for part in request.partitions:
                count = sum(h.record_count for _, h in iter_batches(part.records, validate=self.validate))
                key = (part.topic, part.partition)
                base = self.next_offset.get(key, 0)
                self.next_offset[key] = base + count
                answer = pb.ProducePartitionResponse(
                    topic=part.topic, partition=part.partition, error_code=pb.NONE, base_offset=base)
                if BATCH_BYTES_MAX_TOLD:  # a leader's bound, as brokers tell it since issue 30
                    answer.batch_bytes_max = 1048588
                answers.append(answer)
            callback(pb.ProduceResponse(partitions=answers), None)

    def stop(self) -> None:
        self.requests.put(None)
        self.thread.join(timeout=5)


# Answers carry the leader's largest batch where this checkout's protocol has the field.
BATCH_BYTES_MAX_TOLD = "batch_bytes_max" in pb.ProducePartitionResponse.DESCRIPTOR.fields_by_name


class FakeStream:
    """The producer's ProduceStream: ``send`` puts the request on the wire, whose thread
    calls the callback with the answer, as the I/O loop's reader task would."""

    broken = False

    def __init__(self, wire: FakeWire):
        self.wire = wire

    def send(self, request, callback, timeout_s: float, *, answered: bool = True) -> bool:
        if answered:
            self.wire.requests.put((request, callback))
        else:  # acks=0: nothing comes back
            callback(None, None)
        return True


class FakeStreamPool:
    def __init__(self, wire: FakeWire):
        self._stream = FakeStream(wire)

    def stream(self, address) -> FakeStream:  # what producers before StreamPool.send ask
        return self._stream

    def send(self, address, request, callback, timeout_s: float, *,
             answered: bool = True) -> FakeStream | None:
        return self._stream if self._stream.send(request, callback, timeout_s,
                                                 answered=answered) else None

    def close(self, timeout_s: float = 5.0) -> None:
        pass


def fake_producer(wire: FakeWire, partitions: int, **options) -> Producer:
    """A Producer whose metadata and ProduceStream are the fakes above."""
    producer = Producer("unused:1", metadata=FakeMetadata("t", partitions), **options)
    producer._streams = FakeStreamPool(wire)  # before any send: the real pool opened nothing
    return producer


class FakeMetadata:
    """The parts of MetadataClient the producer uses, for one always-led topic."""

    def __init__(self, topic: str, partitions: int):
        self.topic = topic
        self.parts = {p: PartitionInfo(partition=p, leader=1, leader_epoch=0, replicas=(1,), isr=(1,))
                      for p in range(partitions)}
        self.snapshot = object()

    def cached_partitions(self, topic: str):
        return self.parts if topic == self.topic else None

    def partitions_for(self, topic: str):
        return self.parts

    def leader_for(self, tp: TopicPartition):
        return LeaderInfo(1, ADDRESS, 0)

    def cached_leader_for(self, tp: TopicPartition):
        return LeaderInfo(1, ADDRESS, 0)

    def invalidate(self) -> None:
        pass

    def any_broker_call(self, call):
        """InitProducerId for the (default) idempotent producer: a fixed id."""
        return pb.InitProducerIdResponse(error_code=pb.NONE, producer_id=1, producer_epoch=0)

    def refresh(self, topics=None):
        return self.snapshot

    def close(self) -> None:
        pass


def throughput(record_bytes: int, records: int, partitions: int, bulk: bool, validate: bool) -> tuple[float, float]:
    """(CPU µs per record, wall s) for ``records`` sends of ``record_bytes`` records."""
    wire = FakeWire(validate)
    producer = fake_producer(wire, partitions, acks=-1, batch_size_bytes=256 * 1024, linger_ms=5,
                             buffer_memory_bytes=64 * 1024 * 1024, max_in_flight_per_partition=5)
    value = os.urandom(record_bytes)
    failures: list[BaseException] = []

    def check(fut) -> None:
        error = fut.exception()
        if error is not None:
            failures.append(error)

    try:
        producer.send("t", value, partition=0).result(timeout=30)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if bulk:
            for _ in range(records // 500):
                for fut in producer.send_many("t", [value] * 500, partition=0):
                    fut.add_done_callback(check)
        else:
            send = producer.send
            for _ in range(records // 500):
                for _ in range(500):
                    send("t", value, partition=0).add_done_callback(check)
        producer.flush(timeout_s=120)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        producer.close(timeout_s=30)
        wire.stop()
    if failures:
        raise RuntimeError(f"{len(failures)} sends failed, first: {failures[0]!r}")
    return cpu / records * 1e6, wall


def latency(samples: int) -> tuple[float, float]:
    """p50 and p99 (ms) of one ``send(...).result()`` at a time, linger 0."""
    wire = FakeWire(True)
    producer = fake_producer(wire, 1, acks=1, linger_ms=0)
    value = os.urandom(1024)
    times = []
    try:
        producer.send("t", value, partition=0).result(timeout=30)
        for _ in range(samples):
            t0 = time.perf_counter()
            producer.send("t", value, partition=0).result(timeout=30)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        producer.close(timeout_s=30)
        wire.stop()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 100])
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per size")
    parser.add_argument("--bulk", action="store_true", help="send_many (500 records a call)")
    parser.add_argument("--no-validate", action="store_true", help="wire skips the CRC check")
    parser.add_argument("--latency", type=int, default=2000, metavar="N",
                        help="samples of one-at-a-time send().result() (0: skip)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.records} records per run, best of {args.repeat}")
    print(f"{'record':>8}  {'CPU us/rec':>10}  {'rec/CPU-s':>10}  {'MB/CPU-s':>9}  {'wall s':>7}")
    for size in args.sizes:
        runs = [throughput(size, args.records, args.partitions, args.bulk, not args.no_validate)
                for _ in range(args.repeat)]
        us, wall = min(runs)
        print(f"{size:>6} B  {us:>10.2f}  {1e6 / us:>10,.0f}  {size / us:>9.1f}  {wall:>7.2f}")
    if args.latency:
        p50, p99 = latency(args.latency)
        print(f"send().result() one at a time, linger 0, 1 KiB: p50 {p50:.3f} ms, p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
