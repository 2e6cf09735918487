"""Idempotent producers against real broker processes (issue 17): a retry after a
SIGKILL and restart is deduplicated from the producer state the log rebuilt, and
the Python producer with 5 requests in flight writes every record once, in order,
across a leader SIGKILL."""

from __future__ import annotations

import threading

import pytest

from tests.integration.conftest import consume_all, fetch, wait_for
from tidewater.client.producer import Producer
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def produce_batch(broker, topic, producer_id, sequence, values, epoch=0):
    batch = encode_batch([(None, v) for v in values], producer_id=producer_id,
                         producer_epoch=epoch, base_sequence=sequence)
    response = broker.stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
        pb.ProducePartitionData(topic=topic, partition=0, records=batch)]), timeout=15)
    return response.partitions[0]


def test_a_retry_after_a_sigkill_and_restart_is_deduplicated(cluster):
    c = cluster(1)
    # Small segments: rolls write producer snapshots, and batches follow the last one.
    c.create_topic("idem", replication_factor=1, configs={"segment.bytes": "600"})
    broker = c.wait_leader_ready("idem")
    answer = broker.stub.InitProducerId(pb.InitProducerIdRequest(producer_id=-1,
                                                                 producer_epoch=-1), timeout=10)
    assert answer.error_code == pb.NONE and answer.producer_epoch == 0
    pid = answer.producer_id
    offsets = []
    for i in range(12):
        result = produce_batch(broker, "idem", pid, i * 2, [b"r%d" % (i * 2), b"r%d" % (i * 2 + 1)])
        assert result.error_code == pb.NONE, result
        offsets.append(result.base_offset)
    partition_dir = broker.data_dir / "idem-0"
    assert list(partition_dir.glob("*.snapshot")), "rolls wrote no producer snapshot"
    broker.proc.kill()  # SIGKILL: no shutdown snapshot; the last batches are after the last one
    broker.reset_channel()
    broker.proc.start()
    c.wait_registered([1])
    broker = c.wait_leader_ready("idem")
    retry = produce_batch(broker, "idem", pid, 22, [b"r22", b"r23"])
    assert (retry.error_code, retry.base_offset) == (pb.NONE, offsets[-1])
    older = produce_batch(broker, "idem", pid, 20, [b"r20", b"r21"])
    assert (older.error_code, older.base_offset) == (pb.NONE, offsets[-2])
    gap = produce_batch(broker, "idem", pid, 30, [b"x"])
    assert gap.error_code == pb.OUT_OF_ORDER_SEQUENCE_NUMBER
    following = produce_batch(broker, "idem", pid, 24, [b"r24"])
    assert (following.error_code, following.base_offset) == (pb.NONE, 24)
    values = [v for _, v in consume_all(broker, "idem")]
    assert values == [b"r%d" % i for i in range(25)]
    # A new producer id after the restart never repeats one handed out before it.
    again = broker.stub.InitProducerId(pb.InitProducerIdRequest(producer_id=-1,
                                                                producer_epoch=-1), timeout=10)
    assert again.producer_id > pid


def test_a_new_leader_deduplicates_a_retry_first_sent_to_the_old_one(cluster):
    """The answer to an acks=all produce is lost with its leader (SIGKILL after the append
    reached the follower): the retry to the new leader is told the same offset and the
    record is in the log once. The follower built the producer's state from what it copied."""
    c = cluster(2)
    c.create_topic("fail", replication_factor=2)
    old = c.wait_leader_ready("fail", isr_size=2)
    pid = old.stub.InitProducerId(pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1),
                                  timeout=10).producer_id
    for seq in range(3):
        assert produce_batch(old, "fail", pid, seq, [b"v%d" % seq]).error_code == pb.NONE
    first = produce_batch(old, "fail", pid, 3, [b"v3"])  # the answer the client "lost"
    assert first.error_code == pb.NONE
    old.proc.kill()
    old.reset_channel()
    new = c.brokers[3 - old.broker_id]
    wait_for(lambda: c.partition_state("fail").leader == new.broker_id, 30, message="failover")
    new = c.wait_leader_ready("fail")
    retry = produce_batch(new, "fail", pid, 3, [b"v3"])
    assert (retry.error_code, retry.base_offset) == (pb.NONE, first.base_offset)
    assert produce_batch(new, "fail", pid, 4, [b"v4"]).base_offset == first.base_offset + 1
    old.proc.start()
    wait_for(lambda: len(c.partition_state("fail").isr) == 2, 60, message="ISR of 2")
    leader = c.wait_leader_ready("fail")
    assert [v for _, v in consume_all(leader, "fail")] == [b"v%d" % i for i in range(5)]


RECORDS = 3000


def test_python_producer_with_five_in_flight_writes_once_in_order_across_a_leader_sigkill(
        cluster):
    c = cluster(3, broker_settings={"min.insync.replicas": "2"})
    c.create_topic("idem5", replication_factor=3)
    c.wait_leader_ready("idem5", isr_size=3)
    bootstrap = ",".join(b.address for b in c.brokers.values())
    producer = Producer(bootstrap, max_in_flight_per_partition=5, linger_ms=2,
                        batch_size_bytes=2048, request_timeout_ms=5000)
    assert producer.enable_idempotence and producer.acks == -1
    acked: list[int] = []
    failed: list[BaseException] = []
    lock = threading.Lock()

    def on_done(i, future):
        with lock:
            if future.exception() is None:
                acked.append(i)
            else:
                failed.append(future.exception())

    def send_all():
        for i in range(RECORDS):
            future = producer.send("idem5", b"%d" % i, partition=0)
            future.add_done_callback(lambda f, i=i: on_done(i, f))
            if i % 100 == 0:
                threading.Event().wait(0.02)
        producer.flush(120)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    wait_for(lambda: len(acked) >= RECORDS // 4, 60, message="a quarter acknowledged")
    old = c.leader("idem5")
    old.proc.kill()
    old.reset_channel()
    at_kill = len(acked)
    wait_for(lambda: len(acked) >= min(RECORDS, at_kill + RECORDS // 4), 90,
             message="acknowledged by the new leader")
    old.proc.start()
    sender.join(150)
    producer.close(30)
    assert not sender.is_alive()
    assert not failed, failed[:3]
    assert sorted(acked) == list(range(RECORDS))
    wait_for(lambda: len(c.partition_state("idem5").isr) == 3, 60, message="ISR of 3")
    leader = c.wait_leader_ready("idem5")
    values = [int(v) for _, v in consume_all(leader, "idem5")]
    assert len(values) == len(set(values)), "a record was written twice"
    assert values == list(range(RECORDS)), "records out of send order or missing"


def test_backlogged_idempotent_batches_grow_to_what_the_leader_takes(cluster):
    """Issue 30: an idempotent producer's partition with its five batches out lets its
    queued batch grow past batch_size_bytes up to the largest batch the leader said it
    takes (the topic's max.message.bytes here), so nothing is refused as too large."""
    c = cluster(1)
    c.create_topic("grow", replication_factor=1, configs={"max.message.bytes": "40000"})
    broker = c.wait_leader_ready("grow")
    told = produce_batch(broker, "grow", -1, -1, [b"plain"])
    assert (told.error_code, told.batch_bytes_max) == (pb.NONE, 40000)
    with Producer(broker.address, linger_ms=5, batch_size_bytes=16384) as producer:
        assert producer.enable_idempotence
        producer.send("grow", b"first", partition=0).result(30)  # the leader's bound is known
        futures = [producer.send("grow", b"%06d" % i + b"x" * 1000, partition=0)
                   for i in range(3000)]
        producer.flush(120)
        assert all(f.exception() is None for f in futures), [
            f.exception() for f in futures if f.exception() is not None][:3]
    values = [v for _, v in consume_all(broker, "grow")]
    assert values[2:] == [b"%06d" % i + b"x" * 1000 for i in range(3000)]
    sizes, offset = [], 0
    while offset < len(values):
        records = fetch(broker, "grow", offset).records
        for _, header in iter_batches(records):
            if header.base_offset >= offset:
                sizes.append(header.size)
                offset = header.base_offset + header.last_offset_delta + 1
    assert max(sizes) <= 40000, sizes
    assert max(sizes) > 16384 + 1024, sizes  # some batch grew past batch_size_bytes
