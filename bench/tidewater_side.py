"""Tidewater's side of the cluster benchmark: a local 3-broker cluster
(``tools.local_cluster.LocalCluster``, stopped by pid) driven by the project's
own client.

Workloads (each on its own topic, 1 partition, replication factor 3 — one
replicated log, like one JetStream stream):
- ``producer_throughput``: ``client.producer.Producer`` tuned for throughput
  (256 KiB batches, linger 5 ms, 64 MiB buffer, 5 requests in flight per
  partition where the client supports ``max_in_flight_per_partition``), one
  thread calling ``send`` for ``duration_s``, then ``flush``.
- ``pipelined_throughput``: the broker's capacity without the client's
  per-record work: one RecordBatch v2 of ``batch_bytes`` is encoded once
  (``proto.records.encode_batch``; the broker assigns offsets, which sit
  outside the CRC) and sent as ``ProduceRequest``s with ``in_flight`` requests
  outstanding on the gRPC channel the client uses.
- ``paced_latency``: the Producer (acks=all, linger 0) sends stamped records
  (bench/probes/latency_probe.py) at a fixed rate; a receiver *process* with a
  ``client.consumer.Consumer`` records receipt time; the producer side
  records each record's ack time.
- ``consume_throughput``: a Consumer reading a topic from the beginning.
- ``failover``: a prober writes acks=all records one at a time; the
  partition leader gets SIGKILL; the time to the first acknowledged write sent
  after the kill is measured; the broker is restarted and the full ISR awaited
  before the next kill.
- ``restart``: the broker's data directory is filled to ``fill_bytes`` of log;
  then SIGKILL + start (recovery scan) and SIGTERM + start (clean shutdown),
  timed from launch to serving (answers Metadata, registered and unfenced), and
  to back in the ISR of every partition.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.bench_common import (
    KIB,
    MIB,
    LatencySummary,
    Throughput,
    latency_summary,
    median,
    paced_latency_result,
    receiver_latencies,
    stop_child,
)
from bench.probes.latency_probe import read_stamp, run_paced, stamped_payload

READY_TIMEOUT_S = 60.0


def directory_bytes(path: str | Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name.endswith(".log") and not name.startswith("broker"):
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass
    return total


@contextlib.contextmanager
def paced_cluster(prefix: str, settings: dict | None = None
                  ) -> Iterator[tuple[TidewaterCluster, Path]]:
    """A started local 3-broker cluster in a new temporary folder (``prefix``), with the
    topic the latency probes write to ("paced": one partition, RF 3), and the folder;
    stopped (its processes by pid) and removed at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        cluster = TidewaterCluster(directory, settings=settings)
        try:
            cluster.start()
            cluster.create_topic("paced")
            yield cluster, Path(directory)
        finally:
            cluster.stop()


class TidewaterCluster:
    """A LocalCluster of ``brokers`` brokers plus the admin client the workloads need."""

    def __init__(self, directory: str | Path, brokers: int = 3, settings: dict | None = None,
                 *, tls: bool = False, controllers: int = 1):
        from tidewater.tools.local_cluster import LocalCluster

        self.directory = Path(directory)
        self.brokers = brokers
        self.settings = dict(settings or {})
        self.tls = tls  # `tide cluster up --tls`: TLS on every port, clients use client_security
        self.controllers = controllers  # `tide cluster up --controllers N`
        self.local = LocalCluster(self.directory)
        self.bootstrap = ""
        self._admin = None

    def start(self) -> str:
        from tidewater.client.admin import AdminClient

        self.bootstrap = self.local.up(self.brokers, base_port=0, settings=self.settings,
                                       ready_timeout_s=READY_TIMEOUT_S, tls=self.tls,
                                       controllers=self.controllers)
        self._admin = AdminClient(self.bootstrap, **self.client_security)
        return self.bootstrap

    @property
    def client_security(self) -> dict[str, str]:
        """The Python clients' TLS options ({} for plaintext)."""
        tls = (self.local.manifest or {}).get("tls")
        if not tls:
            return {}
        return {"security_protocol": "SSL", "ssl_cafile": tls["ca"], "ssl_certfile": tls["cert"],
                "ssl_keyfile": tls["key"]}

    @property
    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka's TLS settings for the Kafka listeners ({} for plaintext)."""
        tls = (self.local.manifest or {}).get("tls")
        if not tls:
            return {}
        return {"security.protocol": "SSL", "ssl.ca.location": tls["ca"],
                "ssl.certificate.location": tls["cert"], "ssl.key.location": tls["key"]}

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.local.manifest is not None:
            self.local.down(timeout_s=10)

    @property
    def admin(self):
        if self._admin is None:
            raise RuntimeError("cluster not started")
        return self._admin

    def create_topic(self, name: str, *, partitions: int = 1, replication_factor: int = 3,
                     configs: dict | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Create a topic and wait for its full ISR; while a broker is briefly fenced the
        controller refuses RF=3 ("must be 1..2 (the live brokers)"): retried until timeout."""
        from tidewater.proto.errors import TidewaterError

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.admin.create_topic(name, partitions, replication_factor, configs)
                break
            except TidewaterError as e:
                if "live brokers" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for p in range(partitions):
            self.wait_full_isr(name, p)

    def partition(self, topic: str, partition: int = 0):
        for t in self.admin.describe_topics([topic], with_replica_state=False):
            for p in t.partitions:
                if p.partition == partition:
                    return p
        return None

    def leader_of(self, topic: str, partition: int = 0) -> int:
        p = self.partition(topic, partition)
        return -1 if p is None else p.leader

    def wait_full_isr(self, topic: str, partition: int = 0, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait until the partition has a leader and every replica in its ISR; return seconds."""
        start = time.monotonic()
        last = None
        while time.monotonic() - start < timeout_s:
            try:
                last = self.partition(topic, partition)
            except Exception as e:  # brokers restarting: ask again
                last = e
            if (last is not None and not isinstance(last, Exception) and last.leader >= 0
                    and set(last.isr) == set(last.replicas)):
                return time.monotonic() - start
            time.sleep(0.05)
        raise TimeoutError(f"{topic}-{partition} not fully in sync after {timeout_s} s: {last}")

    def start_broker(self, broker_id: int, ready_timeout_s: float = READY_TIMEOUT_S) -> int:
        """(Re)start one stopped broker and wait until it serves. Returns the number of extra
        tries needed. LocalCluster can report a broker that is starting as "exited during
        start-up" (its /proc cmdline can read empty right after the fork on a loaded machine):
        then the broker, if alive, is simply waited for; if it is really gone, started again."""
        from tidewater.tools.local_cluster import LocalClusterError

        deadline = time.monotonic() + ready_timeout_s
        try:
            self.local.start(broker_id, ready_timeout_s=ready_timeout_s)
            return 0
        except LocalClusterError as e:
            print(f"[bench]   broker {broker_id} start reported: {str(e).splitlines()[0]}",
                  file=sys.stderr, flush=True)
        name = f"broker-{broker_id}"
        while time.monotonic() < deadline:
            status = next(s for s in self.local.status() if s.name == name)
            if status.serving:
                return 1
            if not status.alive:
                time.sleep(1)
                self.local.start(broker_id, ready_timeout_s=max(1.0, deadline - time.monotonic()))
                return 1
            time.sleep(0.1)
        raise TimeoutError(f"{name} not serving {ready_timeout_s} s after its start")

    def ensure_all_running(self, timeout_s: float = READY_TIMEOUT_S) -> list[int]:
        """Start every broker that is not running (after a failed step) and wait until every
        broker serves (registered and unfenced); returns the ids started."""
        started = []
        deadline = time.monotonic() + timeout_s
        while True:
            brokers = [s for s in self.local.status() if s.name.startswith("broker-")]
            for status in brokers:
                if not status.alive:
                    broker_id = int(status.name.split("-", 1)[1])
                    self.start_broker(broker_id)
                    started.append(broker_id)
            if all(s.serving for s in brokers):
                return started
            if time.monotonic() > deadline:
                raise TimeoutError("brokers not serving: "
                                   + ", ".join(s.name for s in brokers if not s.serving))
            time.sleep(0.2)

    def broker_data_dir(self, broker_id: int) -> Path:
        return Path(self.local.process(broker_id)["data_dir"])


# ---------------------------------------------------------------------- throughput


def producer_in_flight_supported() -> bool:
    """The Producer can keep several requests per partition in flight (newer clients)."""
    import inspect

    from tidewater.client.producer import Producer

    return "max_in_flight_per_partition" in inspect.signature(Producer).parameters


def idempotence_supported() -> bool:
    """The Producer is idempotent by default with acks=all (issue 17's clients)."""
    import inspect

    from tidewater.client.producer import Producer

    return "enable_idempotence" in inspect.signature(Producer).parameters


def producer_throughput(bootstrap: str, topic: str, record_bytes: int, acks: int | str,
                        duration_s: float, *, batch_size_bytes: int = 256 * KIB,
                        linger_ms: int = 5, in_flight: int = 5,
                        producer_options: dict | None = None) -> Throughput:
    from tidewater.client.producer import Producer

    value = os.urandom(record_bytes)
    options = {"max_in_flight_per_partition": in_flight} if producer_in_flight_supported() else {}
    options.update(producer_options or {})
    producer = Producer(bootstrap, acks=acks, batch_size_bytes=batch_size_bytes, linger_ms=linger_ms,
                        buffer_memory_bytes=64 * MIB, request_timeout_ms=30000, **options)
    failures: list[BaseException] = []
    count = 0

    def check(fut) -> None:
        # A callback instead of keeping every future: like Kafka's perf tool, and it keeps the
        # number of live objects (and so the garbage collector's work) bounded.
        error = fut.exception()
        if error is not None:
            failures.append(error)

    try:
        producer.send(topic, value, partition=0).result(timeout=30)  # metadata and connection warm
        start = time.perf_counter()
        send = producer.send
        while time.perf_counter() - start < duration_s:
            for _ in range(500):
                send(topic, value, partition=0).add_done_callback(check)
            count += 500
        producer.flush(timeout_s=120)
        elapsed = time.perf_counter() - start
    finally:
        producer.close(timeout_s=30)
    if failures:
        raise RuntimeError(f"{len(failures)} of {count} sends failed, first: {failures[0]!r}")
    return Throughput(count, count * record_bytes, elapsed)


def pipelined_throughput(bootstrap: str, topic: str, record_bytes: int, acks: int,
                         duration_s: float, *, batch_bytes: int = 256 * KIB,
                         in_flight: int = 8, max_bytes: int | None = None) -> Throughput:
    """Pre-encoded batches, ``in_flight`` ProduceRequests outstanding, for ``duration_s``
    (or until ``max_bytes`` of payload went out, whichever comes first)."""
    from tidewater.client.metadata import MetadataClient, TopicPartition
    from tidewater.proto import tidewater_pb2 as pb
    from tidewater.proto.records import encode_batch

    records_per_batch = max(1, batch_bytes // (record_bytes + 10))
    value = os.urandom(record_bytes)
    batch = encode_batch([(None, value)] * records_per_batch)
    metadata = MetadataClient(bootstrap)
    leader = metadata.leader_for(TopicPartition(topic, 0))
    if leader is None:
        raise RuntimeError(f"{topic}-0 has no leader")
    stub = metadata.pool.broker(leader.address)
    request = pb.ProduceRequest(acks=acks, timeout_ms=30000, partitions=[
        pb.ProducePartitionData(topic=topic, partition=0, records=batch)])
    slots = threading.Semaphore(in_flight)
    lock = threading.Lock()
    errors: list[str] = []
    acknowledged = [0]
    outstanding = [0]
    all_done = threading.Condition(lock)

    def on_done(call) -> None:
        try:
            response = call.result()
            codes = [p.error_code for p in response.partitions]
            if acks != 0 and (not codes or any(c != pb.NONE for c in codes)):
                with lock:
                    errors.append(",".join(pb.ErrorCode.Name(c) for c in codes) or "no answer")
        except Exception as e:  # counted and reported
            with lock:
                errors.append(repr(e))
        with lock:
            acknowledged[0] += 1
            outstanding[0] -= 1
            all_done.notify_all()
        slots.release()

    try:
        stub.Produce(request, timeout=30)  # warm the channel
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration_s:
            if max_bytes is not None and sent * records_per_batch * record_bytes >= max_bytes:
                break
            slots.acquire()
            with lock:
                if errors:
                    break
                outstanding[0] += 1
            stub.Produce.future(request, timeout=60).add_done_callback(on_done)
            sent += 1
        with lock:
            if not all_done.wait_for(lambda: outstanding[0] == 0, timeout=120):
                raise TimeoutError("produce requests still outstanding after 120 s")
        elapsed = time.perf_counter() - start
    finally:
        metadata.close()
    if errors:
        raise RuntimeError(f"{len(errors)} produce requests failed, first: {errors[0]}")
    records = sent * records_per_batch
    return Throughput(records, records * record_bytes, elapsed)


def consume_throughput(bootstrap: str, topic: str, *, timeout_s: float = 300,
                       consumer_options: dict | None = None) -> Throughput:
    """Read ``topic``-0 from the beginning up to its high watermark."""
    from tidewater.client.consumer import Consumer

    consumer = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_bytes=64 * MIB,
                        max_partition_fetch_bytes=16 * MIB, fetch_max_wait_ms=100,
                        **(consumer_options or {}))
    try:
        tp = (topic, 0)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])
        target = next(iter(end.values()))
        consumer.seek_to_beginning()
        consumer.position(tp)
        count = 0
        payload = 0
        start = time.perf_counter()
        while count < target:
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError(f"consumed {count} of {target} records in {timeout_s} s")
            for record in consumer.poll(1000):
                count += 1
                payload += len(record.value) if record.value else 0
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return Throughput(count, payload, elapsed)


# ---------------------------------------------------------------------- latency


def _receiver_main(bootstrap: str, topic: str, expected: int, timeout_s: float, conn) -> None:
    """Receiver process: a Consumer at the end of ``topic``-0; sends back latencies (ms)."""
    from tidewater.client.consumer import Consumer

    consumer = Consumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=100)
    latencies: list[float] = []
    try:
        consumer.assign([(topic, 0)])
        consumer.position((topic, 0))
        conn.send("ready")
        deadline = time.monotonic() + timeout_s
        while len(latencies) < expected and time.monotonic() < deadline:
            for record in consumer.poll(200):
                latencies.append((time.time_ns() - read_stamp(record.value)) / 1e6)
    finally:
        consumer.close()
        conn.send(latencies)
        conn.close()


def _stream_receiver_main(bootstrap: str, topic: str, expected: int, timeout_s: float,
                          conn) -> None:
    """Receiver process without the Consumer's thread hand-off
    (``bench.fetch_stream_receiver``: the FetchStream read on one loop)."""
    from bench.fetch_stream_receiver import receive, start_position
    from tidewater.client.metadata import TopicPartition

    latencies: list[float] = []
    try:
        position = start_position(bootstrap, TopicPartition(topic, 0))
        conn.send("ready")
        run_on_uvloop(receive(bootstrap, topic, position, expected, timeout_s, lambda record:
                              latencies.append((time.time_ns() - read_stamp(record.value)) / 1e6)))
    finally:
        conn.send(latencies)
        conn.close()


def run_on_uvloop(coro):
    """``asyncio.run`` on a uvloop loop: the loop kind the threaded clients' I/O thread
    runs (client.streams), so the asyncio rows differ from theirs in shape only."""
    import asyncio

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _aio_consumer_receiver_main(bootstrap: str, topic: str, expected: int, timeout_s: float,
                                conn) -> None:
    """Receiver process: ``client.aio_consumer.AsyncConsumer`` polled on its own loop."""
    from tidewater.client.aio_consumer import AsyncConsumer

    latencies: list[float] = []

    async def receive() -> None:
        async with AsyncConsumer(bootstrap, auto_offset_reset="latest",
                                 fetch_max_wait_ms=100) as consumer:
            consumer.assign([(topic, 0)])
            await consumer.position((topic, 0))
            conn.send("ready")
            deadline = time.monotonic() + timeout_s
            while len(latencies) < expected and time.monotonic() < deadline:
                for record in await consumer.poll(200):
                    latencies.append((time.time_ns() - read_stamp(record.value)) / 1e6)

    try:
        run_on_uvloop(receive())
    finally:
        conn.send(latencies)
        conn.close()


RECEIVERS = {"consumer": _receiver_main, "aio_consumer": _aio_consumer_receiver_main,
             "stream": _stream_receiver_main}
PRODUCERS = ("threaded", "asyncio")


def _ack_recorder(ack_ms: list[float], failures: list[BaseException]
                  ) -> Callable[[Any, int], None]:
    """A done callback's body for a record due at ``due_ns``: its ack latency, or its
    failure."""
    def on_ack(fut: Any, due_ns: int) -> None:
        if fut.exception() is None:
            ack_ms.append((time.time_ns() - due_ns) / 1e6)
        else:
            failures.append(fut.exception())
    return on_ack


async def _paced_async_sends(bootstrap: str, topic: str, record_bytes: int, count: int,
                             rate_per_s: float, in_flight: int,
                             ack_ms: list[float], failures: list[BaseException]) -> float:
    """``client.aio_producer.AsyncProducer`` paced on its own (uvloop) loop, as
    ``peer_nats.paced_latency`` paces ``publish_async``; returns the achieved rate."""
    from bench.probes.latency_probe import run_paced_async
    from tidewater.client.aio_producer import AsyncProducer

    async with AsyncProducer(bootstrap, acks=-1, batch_size_bytes=256 * KIB, linger_ms=0,
                             buffer_memory_bytes=64 * MIB,
                             max_in_flight_per_partition=in_flight) as producer:
        await (await producer.send(topic, stamped_payload(record_bytes, time.time_ns(),
                                                          bytes(record_bytes)), partition=0))
        filler = os.urandom(record_bytes)
        on_ack = _ack_recorder(ack_ms, failures)

        async def send_one(_index: int, due_ns: int) -> None:
            fut = await producer.send(topic, stamped_payload(record_bytes, due_ns, filler),
                                      partition=0)
            fut.add_done_callback(lambda f, due_ns=due_ns: on_ack(f, due_ns))

        achieved = await run_paced_async(count, rate_per_s, send_one, whole_ms_sleeps=True)
        await producer.flush(timeout_s=120)
    return achieved


def paced_latency(bootstrap: str, topic: str, record_bytes: int, count: int,
                  rate_per_s: float, *, in_flight: int = 1, producer_kind: str = "threaded",
                  receiver_kind: str = "consumer") -> dict:
    """Produce ``count`` stamped records with acks=all at ``rate_per_s``; ack and end-to-end
    LatencySummary plus the achieved rate. ``producer_kind``: "threaded" (``Producer``
    from a pacer thread) or "asyncio" (``AsyncProducer`` paced on its loop, the peer's
    shape); ``receiver_kind``: "consumer" (``Consumer.poll``), "aio_consumer"
    (``AsyncConsumer.poll`` on its loop) or "stream" (the FetchStream read on one loop
    by the bench itself: ``bench.fetch_stream_receiver``)."""
    if producer_kind not in PRODUCERS or receiver_kind not in RECEIVERS:
        raise ValueError(f"producer_kind {producer_kind!r}, receiver_kind {receiver_kind!r}")

    ctx = multiprocessing.get_context("spawn")  # never fork a process holding gRPC threads
    parent_end, child_end = ctx.Pipe()
    timeout_s = count / rate_per_s + 60
    receiver = ctx.Process(target=RECEIVERS[receiver_kind],
                           args=(bootstrap, topic, count, timeout_s, child_end), daemon=True)
    receiver.start()
    ack_ms: list[float] = []
    failures: list[BaseException] = []
    try:
        if not parent_end.poll(60) or parent_end.recv() != "ready":
            raise RuntimeError("latency receiver did not start")
        # The Producer's default of one request in flight: records due meanwhile wait and
        # go together in the next request. More in flight sends one request per record
        # at 1,000/s, and the extra messages cost more CPU (hence queueing) than the
        # waiting saves: measured p99 12 ms with 5 in flight against 6 ms with 1.
        if producer_kind == "asyncio":
            achieved = run_on_uvloop(_paced_async_sends(bootstrap, topic, record_bytes, count,
                                                      rate_per_s, in_flight, ack_ms, failures))
        else:
            achieved = _paced_threaded_sends(bootstrap, topic, record_bytes, count, rate_per_s,
                                             in_flight, ack_ms, failures)
        e2e_ms = receiver_latencies(parent_end, timeout_s)
    finally:
        stop_child(receiver)
    # The warm-up record may be received too: it is stamped before the paced ones.
    e2e_ms = e2e_ms[-count:] if len(e2e_ms) > count else e2e_ms
    return {**paced_latency_result(ack_ms, e2e_ms, achieved, failures),
            "producer": producer_kind, "receiver": receiver_kind}


def _paced_threaded_sends(bootstrap: str, topic: str, record_bytes: int, count: int,
                          rate_per_s: float, in_flight: int,
                          ack_ms: list[float], failures: list[BaseException]) -> float:
    """The threaded ``Producer`` from this (pacer) thread; returns the achieved rate."""
    from tidewater.client.producer import Producer

    producer = None
    try:
        options = ({"max_in_flight_per_partition": in_flight}
                   if producer_in_flight_supported() else {})
        producer = Producer(bootstrap, acks=-1, batch_size_bytes=256 * KIB, linger_ms=0,
                            buffer_memory_bytes=64 * MIB, **options)
        producer.send(topic, stamped_payload(record_bytes, time.time_ns(), bytes(record_bytes)),
                      partition=0).result(timeout=30)
        filler = os.urandom(record_bytes)
        on_ack = _ack_recorder(ack_ms, failures)

        def send_one(_index: int, due_ns: int) -> None:
            fut = producer.send(topic, stamped_payload(record_bytes, due_ns, filler), partition=0)
            fut.add_done_callback(lambda f, due_ns=due_ns: on_ack(f, due_ns))

        achieved = run_paced(count, rate_per_s, send_one)
        producer.flush(timeout_s=120)
    finally:
        if producer is not None:
            producer.close(timeout_s=30)
    return achieved


def ack_latency_serial(bootstrap: str, topic: str, record_bytes: int, count: int,
                       acks: int = -1) -> LatencySummary:
    """Sends one at a time, each waiting for its answer (JetStream's ``publish``)."""
    from tidewater.client.producer import Producer

    value = os.urandom(record_bytes)
    samples = []
    with Producer(bootstrap, acks=acks, linger_ms=0) as producer:
        producer.send(topic, value, partition=0).result(timeout=30)
        for _ in range(count):
            t0 = time.perf_counter()
            producer.send(topic, value, partition=0).result(timeout=30)
            samples.append((time.perf_counter() - t0) * 1000)
    return latency_summary(samples)


# ---------------------------------------------------------------------- failover and restart


class _Prober:
    """Writes acks=all records one at a time, each waiting for its answer; remembers
    (send time, ack time) pairs on the monotonic clock."""

    def __init__(self, bootstrap: str, topic: str):
        from tidewater.client.producer import Producer

        self.topic = topic
        self.producer = Producer(bootstrap, acks=-1, linger_ms=0, retry_backoff_ms=50,
                                 request_timeout_ms=10000, delivery_timeout_ms=60000)
        self.acks: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="failover-prober", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        value = b"p" * 100
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                self.producer.send(self.topic, value, partition=0).result(timeout=60)
            except Exception as e:  # counted; the next write tries again
                self.errors.append(e)
                continue
            with self._lock:
                self.acks.append((sent, time.monotonic()))

    def wait_acking(self, timeout_s: float = 30) -> None:
        """Return once a write sent in the last 0.5 s was acknowledged (before a kill)."""
        deadline = time.monotonic() + timeout_s
        while self.first_ack_sent_after(time.monotonic() - 0.5) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the prober gets no acknowledgements before the kill")
            time.sleep(0.05)

    def first_ack_sent_after(self, t: float) -> float | None:
        with self._lock:
            for sent, acked in self.acks:
                if sent >= t:
                    return acked
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=70)
        self.producer.close(timeout_s=10)


def failover(cluster: TidewaterCluster, topic: str, kills: int, *, timeout_s: float = 60) -> dict:
    """Median time from SIGKILL of the leader to the next acknowledged acks=all write."""
    times_s: list[float] = []
    start_retries = 0
    cluster.ensure_all_running()
    prober = _Prober(cluster.bootstrap, topic)
    prober.start()
    try:
        for _ in range(kills):
            cluster.wait_full_isr(topic)
            prober.wait_acking()
            leader = cluster.leader_of(topic)
            killed_at = time.monotonic()
            cluster.local.kill(leader, "KILL")
            deadline = killed_at + timeout_s
            while (acked := prober.first_ack_sent_after(killed_at)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no acknowledged write {timeout_s} s after killing broker {leader}")
                time.sleep(0.01)
            times_s.append(acked - killed_at)
            start_retries += cluster.start_broker(leader)
        cluster.wait_full_isr(topic)
    finally:
        prober.stop()
    return {"median_s": median(times_s), "samples_s": times_s, "write_errors": len(prober.errors),
            "start_retries": start_retries}


def _pid_running(pid: int) -> bool:
    """The process exists and is not a zombie (LocalCluster reaps its children on poll)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


_LOADED_LINE = re.compile(r"loaded (\d+) logs in ([\d.]+)s \(clean shutdown before: (\w+)\)")


def last_log_load(log_text: str) -> tuple[int, float, bool] | None:
    """(logs, seconds, clean shutdown before) from the broker's last "loaded N logs" line."""
    matches = _LOADED_LINE.findall(log_text)
    if not matches:
        return None
    count, seconds, clean = matches[-1]
    return int(count), float(seconds), clean == "True"


def _broker_log_load(cluster: TidewaterCluster, broker_id: int) -> dict:
    try:
        text = Path(cluster.local.process(broker_id)["log"]).read_text(errors="replace")
    except OSError:
        return {}
    found = last_log_load(text)
    if found is None:
        return {}
    return {"logs": found[0], "load_s": found[1], "clean_before": found[2]}


def _time_start(cluster: TidewaterCluster, broker_id: int, topics: list[str]) -> tuple[float, float]:
    """Launch a stopped broker; seconds to serving, and to back in every topic's ISR."""
    start = time.monotonic()
    if cluster.start_broker(broker_id, ready_timeout_s=600):
        raise RuntimeError(f"broker {broker_id} needed a second start: restart time not measured")
    serving = time.monotonic() - start
    for topic in topics:
        cluster.wait_full_isr(topic, timeout_s=600)
    return serving, time.monotonic() - start


def delete_topics_and_wait(cluster: TidewaterCluster, topics: list[str], timeout_s: float = 120) -> None:
    """Delete ``topics`` and wait until no broker's data directory holds their logs."""
    if not topics:
        return
    failed = {name: error for name, error in cluster.admin.delete_topics(topics).items() if error}
    if failed:
        raise RuntimeError(f"cannot delete topics: {failed}")
    names = {f"{t}-0" for t in topics}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [entry.name for b in range(1, cluster.brokers + 1)
                for entry in os.scandir(cluster.broker_data_dir(b))
                if entry.name in names or entry.name.split(".", 1)[0] in names]
        if not left:
            return
        time.sleep(0.2)
    raise TimeoutError(f"logs of deleted topics still on disk after {timeout_s} s: {left[:5]}")


def restart(cluster: TidewaterCluster, fill_topic: str, fill_bytes: int, topics: list[str],
            *, broker_id: int | None = None, drop_topics: list[str] = ()) -> dict:
    """Fill one broker's log to ``fill_bytes`` (after deleting ``drop_topics``, so the size is
    what was asked for, not whatever earlier runs left), then time restarts after SIGKILL
    and SIGTERM."""
    cluster.ensure_all_running()
    delete_topics_and_wait(cluster, list(drop_topics))
    topics = [t for t in topics if t not in set(drop_topics)]
    fenced = [b.broker_id for b in cluster.admin.describe_cluster().brokers if b.fenced]
    if fenced:
        # Seen once: deleting GiBs of logs kept a broker from heartbeating in time.
        print(f"[bench]   broker(s) {fenced} fenced after deleting {len(drop_topics)} topics; "
              "waiting until they are back", file=sys.stderr, flush=True)
    cluster.ensure_all_running()
    cluster.create_topic(fill_topic)
    if broker_id is None:
        # A follower of the fill topic: the restarted broker is not the one clients write to.
        p = cluster.partition(fill_topic)
        broker_id = next(r for r in p.replicas if r != p.leader)
    data_dir = cluster.broker_data_dir(broker_id)
    all_topics = [*topics, fill_topic]
    fill_start = time.perf_counter()
    for _ in range(10):
        # acks=all does not wait for a replica that fell out of the ISR under load: fill, wait
        # until every replica is back in sync, and top up until this broker holds enough.
        for topic in all_topics:
            cluster.wait_full_isr(topic, timeout_s=600)
        have = directory_bytes(data_dir)
        if have >= fill_bytes * 0.98:
            break
        pipelined_throughput(cluster.bootstrap, fill_topic, 1024, -1, duration_s=3600,
                             batch_bytes=1 * MIB, in_flight=4, max_bytes=fill_bytes - have)
    fill_s = time.perf_counter() - fill_start
    log_bytes = directory_bytes(data_dir)

    cluster.local.kill(broker_id, "KILL")
    after_kill_serving_s, after_kill_isr_s = _time_start(cluster, broker_id, all_topics)
    after_kill_load = _broker_log_load(cluster, broker_id)

    stop_start = time.monotonic()
    pid = cluster.local.process(broker_id)["pid"]
    cluster.local.kill(broker_id, "TERM")
    while _pid_running(pid):
        if time.monotonic() - stop_start > 120:
            raise TimeoutError(f"broker {broker_id} did not stop within 120 s of SIGTERM")
        time.sleep(0.02)
    shutdown_s = time.monotonic() - stop_start
    after_term_serving_s, after_term_isr_s = _time_start(cluster, broker_id, all_topics)
    after_term_load = _broker_log_load(cluster, broker_id)
    return {"broker_id": broker_id, "log_bytes": log_bytes, "fill_s": fill_s,
            "after_kill_serving_s": after_kill_serving_s, "after_kill_isr_s": after_kill_isr_s,
            "clean_shutdown_s": shutdown_s,
            "after_term_serving_s": after_term_serving_s, "after_term_isr_s": after_term_isr_s,
            "after_kill_log_load": after_kill_load, "after_term_log_load": after_term_load}
