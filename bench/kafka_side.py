"""Workloads over the brokers' Kafka listeners with confluent-kafka (librdkafka) as client.

A C client leaves the brokers more of the machine than the Python client does,
so these rows show what the brokers themselves can do through Kafka's
protocol: the same produce and fetch paths as the gRPC rows
(bench/tidewater_side.py), the same topics' settings (RF=3, one partition,
acks as named). Producer settings follow Kafka's perf tool for throughput:
batches of 256 KiB, linger 5 ms, 5 requests in flight, no compression.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

from bench.bench_common import (
    KIB,
    Throughput,
    paced_latency_result,
    receiver_latencies,
    stop_child,
)
from bench.probes.latency_probe import read_stamp, run_paced, stamped_payload


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """Keep Python's cyclic GC off the bench process's own objects while the read row
    runs. The consumer allocates a Message per record, so full collections come
    often, and each walked every object the bench held (clusters, results, modules):
    with a million objects of ballast a read ran 20-30% slower (434-519 against
    569-643 MB/s), which measured the harness, not the brokers."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _producer(kafka_bootstrap: str, acks: int | str, **extra):
    from confluent_kafka import Producer

    config = {"bootstrap.servers": kafka_bootstrap, "acks": str(acks),
              "batch.size": 256 * KIB, "linger.ms": 5,
              "max.in.flight.requests.per.connection": 5, "queue.buffering.max.kbytes": 262_144,
              "queue.buffering.max.messages": 1_000_000, "compression.type": "none"}
    config.update(extra)
    return Producer(config)


def producer_throughput(kafka_bootstrap: str, topic: str, record_bytes: int, acks: int | str,
                        duration_s: float, **extra) -> Throughput:
    """``extra``: more librdkafka settings (TLS)."""
    value = os.urandom(record_bytes)
    producer = _producer(kafka_bootstrap, acks, **extra)
    failures: list = []

    def on_delivery(error, _message) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value, partition=0, on_delivery=on_delivery)
    producer.flush(30)  # metadata and connections warm
    count = 0
    produce, poll = producer.produce, producer.poll
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        for _ in range(1000):
            while True:
                try:
                    produce(topic, value, partition=0, on_delivery=on_delivery)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    poll(0.005)
        count += 1000
        poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if failures or left:
        raise RuntimeError(f"{len(failures)} of {count} sends failed ({left} unsent), "
                           f"first: {failures[0] if failures else None}")
    return Throughput(count, count * record_bytes, elapsed)


def consume_throughput(kafka_bootstrap: str, topic: str, *, timeout_s: float = 300,
                       **extra) -> Throughput:
    """Read ``topic``-0 from the beginning up to its high watermark; ``extra``: more
    librdkafka settings (TLS)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-assign-only",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024 * 1024,
                         "max.partition.fetch.bytes": 16 * 1024 * 1024,
                         "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 1_048_576,
                         **extra})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        # librdkafka looks up the group's coordinator even in assign mode, and on a new
        # cluster that creates __consumer_offsets (50 partitions, RF=3): not reading, so
        # done before the clock starts (OffsetFetch waits for the coordinator).
        consumer.committed([TopicPartition(topic, 0)], timeout=60)
        consumer.assign([TopicPartition(topic, 0, 0)])
        count = payload = 0
        with _heap_frozen():
            start = time.perf_counter()
            while count < high:
                if time.perf_counter() - start > timeout_s:
                    raise TimeoutError(f"consumed {count} of {high} records in {timeout_s} s")
                for message in consumer.consume(num_messages=10_000, timeout=1.0):
                    if message.error() is not None:
                        raise RuntimeError(f"consume: {message.error()}")
                    count += 1
                    payload += len(message.value() or b"")
            elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return Throughput(count, payload, elapsed)


def transactional_throughput(kafka_bootstrap: str, topic: str, record_bytes: int,
                             records_per_transaction: int, duration_s: float,
                             **extra) -> Throughput:
    """Transactions of ``records_per_transaction`` records each, one after another, each
    committed before the next begins (a stream processor's commit interval in records);
    acks=all and idempotence come with ``transactional.id``. Counted: committed records."""
    import uuid

    value = os.urandom(record_bytes)
    producer = _producer(kafka_bootstrap, "all", **{
        "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", **extra})
    producer.init_transactions(60)
    # One transaction before the clock: coordinator lookup, partition added, markers path warm.
    producer.begin_transaction()
    producer.produce(topic, value, partition=0)
    producer.commit_transaction(60)
    count = 0
    produce, poll = producer.produce, producer.poll
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        producer.begin_transaction()
        for _ in range(records_per_transaction):
            while True:
                try:
                    produce(topic, value, partition=0)
                    break
                except BufferError:
                    poll(0.005)
        producer.commit_transaction(120)  # flushes; a failure raises
        count += records_per_transaction
    elapsed = time.perf_counter() - start
    return Throughput(count, count * record_bytes, elapsed)


def read_to_end_throughput(kafka_bootstrap: str, topic: str, isolation_level: str, *,
                           timeout_s: float = 300, **extra) -> Throughput:
    """Read ``topic``-0 from the beginning to the end the consumer sees at its start
    (partition EOF: the LSO for read_committed), with ``isolation_level``
    (read_committed skips control records, so the count of records cannot say when
    the end is reached, as it does in consume_throughput)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-assign-only",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024 * 1024,
                         "max.partition.fetch.bytes": 16 * 1024 * 1024,
                         "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 1_048_576,
                         "isolation.level": isolation_level, "enable.partition.eof": True,
                         **extra})
    try:
        consumer.committed([TopicPartition(topic, 0)], timeout=60)  # as consume_throughput
        consumer.assign([TopicPartition(topic, 0, 0)])
        count = payload = 0
        with _heap_frozen():
            start = time.perf_counter()
            at_end = False
            while not at_end:
                if time.perf_counter() - start > timeout_s:
                    raise TimeoutError(f"consumed {count} records in {timeout_s} s, no end")
                for message in consumer.consume(num_messages=10_000, timeout=1.0):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end = True
                            break
                        raise RuntimeError(f"consume: {error}")
                    count += 1
                    payload += len(message.value() or b"")
            elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return Throughput(count, payload, elapsed)


def latency_receiver_main(kafka_bootstrap: str, topic: str, expected: int, timeout_s: float,
                          conn, extra_config: dict | None = None,
                          groups: bool = True) -> None:
    """Receiver process: a consumer at the end of ``topic``-0; sends back latencies (ms).
    ``groups``: the server has group coordinators (not the design floor's listener)."""
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-latency",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                         "fetch.min.bytes": 1, **(extra_config or {})})
    latencies: list[float] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        consumer.poll(0.5)  # the first fetch resolves OFFSET_END before stamps arrive
        if groups:
            # Its group's coordinator found and loaded: on a new cluster that first use
            # creates __consumer_offsets (50 partitions), which is set-up, not the steady
            # state measured.
            consumer.committed([TopicPartition(topic, 0)], timeout=60)
        conn.send("ready")
        deadline = time.monotonic() + timeout_s
        while len(latencies) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                latencies.append((time.time_ns() - read_stamp(message.value())) / 1e6)
    finally:
        consumer.close()
        conn.send(latencies)
        conn.close()


def latency_producer(kafka_bootstrap: str, in_flight: int = 1, extra_config: dict | None = None):
    """The latency rows' producer: acks=all, sends at once (linger 0), ``in_flight``
    requests in flight (1: as the gRPC row)."""
    return _producer(kafka_bootstrap, "all", **{"linger.ms": 0,
                                                "max.in.flight.requests.per.connection": in_flight,
                                                **(extra_config or {})})


def start_latency_receiver(kafka_bootstrap: str, topic: str, count: int,
                           timeout_s: float, extra_config: dict | None = None,
                           groups: bool = True) -> tuple[Any, Any]:
    """The receiver process (``latency_receiver_main``) and this end of its pipe, once it
    is ready at the end of ``topic``-0; stopped again if it is not."""
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    receiver = ctx.Process(target=latency_receiver_main,
                           args=(kafka_bootstrap, topic, count, timeout_s, child_end, extra_config,
                                 groups),
                           daemon=True)
    receiver.start()
    if not parent_end.poll(60) or parent_end.recv() != "ready":
        stop_child(receiver)
        raise RuntimeError("latency receiver did not start")
    return receiver, parent_end


def paced_sends(kafka_bootstrap: str, topic: str, record_bytes: int, count: int,
                rate_per_s: float, ack_ms: list[float], failures: list,
                producer_config: dict | None = None) -> float:
    """The latency rows' producer (``latency_producer``): one warm-up record, then
    ``count`` stamped records at ``rate_per_s`` into partition 0, each delivery's ack
    latency into ``ack_ms`` (its error into ``failures``); the achieved rate."""
    producer = latency_producer(kafka_bootstrap, extra_config=producer_config)
    filler = os.urandom(record_bytes)
    producer.produce(topic, stamped_payload(record_bytes, time.time_ns(), filler), partition=0)
    producer.flush(30)

    def send_one(_index: int, due_ns: int) -> None:
        def on_delivery(error, _message, due_ns=due_ns) -> None:
            if error is None:
                ack_ms.append((time.time_ns() - due_ns) / 1e6)
            else:
                failures.append(error)
        producer.produce(topic, stamped_payload(record_bytes, due_ns, filler), partition=0,
                         on_delivery=on_delivery)
        producer.poll(0)

    achieved = run_paced(count, rate_per_s, send_one)
    producer.flush(120)
    return achieved


def paced_latency(kafka_bootstrap: str, topic: str, record_bytes: int, count: int,
                  rate_per_s: float, *, producer_config: dict | None = None,
                  consumer_config: dict | None = None, groups: bool = True) -> dict:
    """``count`` stamped records at ``rate_per_s``, acks=all; ack and end-to-end latency.
    ``*_config``: librdkafka settings added to (or replacing) the rows' own; ``groups``:
    the server has group coordinators (the receiver waits for its own before it starts)."""
    timeout_s = count / rate_per_s + 60
    # One record more: paced_sends' warm-up, as the gRPC rows send one (the peer connects
    # to its stream's leader first), so the paced records do not wait for the
    # producer's metadata and its connection to the leader.
    receiver, parent_end = start_latency_receiver(kafka_bootstrap, topic, count + 1, timeout_s,
                                                  consumer_config, groups)
    ack_ms: list[float] = []
    failures: list = []
    try:
        achieved = paced_sends(kafka_bootstrap, topic, record_bytes, count, rate_per_s, ack_ms,
                               failures, producer_config)
        e2e_ms = receiver_latencies(parent_end, timeout_s)[-count:]  # not the warm-up's
    finally:
        stop_child(receiver)
    return paced_latency_result(ack_ms, e2e_ms, achieved, failures)
