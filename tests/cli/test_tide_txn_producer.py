"""Issue 27 item 4: Tidewater's own transactional ``Producer`` over gRPC, on the same
transaction coordinator as Kafka clients, on a 3-broker cluster (RF 3,
min.insync.replicas 2).

Commits are visible and aborts never, to Tidewater's read_committed ``Consumer`` and to
confluent-kafka's; a second Tidewater producer with the same transactional id fences the
first (``ProducerFencedError``, and it refuses to go on), for ``AsyncProducer`` too; ``send_offsets_to_transaction``
commits the group's offsets only with a commit; a confluent-kafka producer with the same
transactional.id fences Tidewater's, and Tidewater's fences confluent-kafka's.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from cluster_fixtures import describe_topic, start_cluster, stop_cluster, wait_for

from tidewater.client.aio_producer import AsyncProducer
from tidewater.client.consumer import Consumer
from tidewater.client.producer import Producer
from tidewater.client.transactions import ConsumerGroupMetadata, TransactionAbortRequiredError
from tidewater.proto.errors import ProducerFencedError, TidewaterError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("tidetxn"), 3, "min.insync.replicas=2",
                      "transaction.state.log.num.partitions=5")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


def new_topic(c, partitions: int = 3) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    assert c.tide("topics", "create", name, "--partitions", str(partitions),
                  "--replication-factor", "3").returncode == 0
    wait_for(lambda: (t := describe_topic(c, name)) is not None
             and all(p["leader"] >= 0 for p in t["partitions"]), f"{name} led")
    return name


def tide_producer(c, transactional_id: str) -> Producer:
    return Producer(c.bootstrap, transactional_id=transactional_id, linger_ms=0,
                    max_block_ms=30000)


def tide_read_all(c, topic: str, isolation: str, partitions: int = 3) -> list[bytes]:
    """Every value a fresh Tidewater consumer reads from the start up to the end offsets
    (the LSO for read_committed) it sees now."""
    consumer = Consumer(c.bootstrap, isolation_level=isolation, auto_offset_reset="earliest")
    try:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, f"{topic}: end not reached"
            values += [r.value for r in consumer.poll(500)]
        return values
    finally:
        consumer.close()


def kafka_read_all(c, topic: str, isolation: str, partitions: int = 3) -> list[bytes]:
    """As ``tide_read_all`` with confluent-kafka (each partition's first EOF: the LSO)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": c.kafka, "group.id": f"reader-{uuid.uuid4().hex}",
        "isolation.level": isolation, "enable.partition.eof": True,
        "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p,
                                                        confluent_kafka.OFFSET_BEGINNING)
                         for p in range(partitions)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: no end reached ({at_end})"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise confluent_kafka.KafkaException(error)
            values.append(message.value())
        return values
    finally:
        consumer.close()


def test_commits_are_visible_and_aborts_never_to_both_consumers(cluster):
    topic = new_topic(cluster)
    p = tide_producer(cluster, f"tide-tx-{topic}")
    try:
        p.init_transactions()
        for outcome in ("c1", "a1", "c2"):
            p.begin_transaction()
            futures = [p.send(topic, f"{outcome}-{i}".encode(), partition=i % 3)
                       for i in range(10)]
            p.flush(30)  # in the log before the outcome: an abort must hide them
            assert all(f.result().offset >= 0 for f in futures)
            if outcome.startswith("c"):
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close()
    committed = sorted(f"c{t}-{i}".encode() for t in (1, 2) for i in range(10))
    everything = sorted(f"{o}-{i}".encode() for o in ("c1", "a1", "c2") for i in range(10))
    assert sorted(tide_read_all(cluster, topic, "read_committed")) == committed
    assert sorted(kafka_read_all(cluster, topic, "read_committed")) == committed
    assert sorted(tide_read_all(cluster, topic, "read_uncommitted")) == everything
    assert sorted(kafka_read_all(cluster, topic, "read_uncommitted")) == everything


def test_the_async_producer_commits_and_aborts_and_is_fenced(cluster):
    topic = new_topic(cluster, partitions=2)
    transactional_id = f"aio-tx-{topic}"

    async def run() -> None:
        async with AsyncProducer(cluster.bootstrap, transactional_id=transactional_id,
                                 linger_ms=0, max_block_ms=30000) as p:
            await p.init_transactions()
            for outcome in ("c1", "a1", "c2"):
                p.begin_transaction()
                futures = [await p.send(topic, f"{outcome}-{i}".encode(), partition=i % 2)
                           for i in range(4)]
                await asyncio.gather(*futures)  # in the log before the outcome
                if outcome.startswith("c"):
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
            p.begin_transaction()
            await p.send(topic, b"zombie", partition=0)
            successor = tide_producer(cluster, transactional_id)
            try:
                await asyncio.to_thread(successor.init_transactions)
            finally:
                successor.close()
            with pytest.raises(ProducerFencedError):
                await p.commit_transaction()
    asyncio.run(run())
    committed = sorted(f"c{t}-{i}".encode() for t in (1, 2) for i in range(4))
    assert sorted(tide_read_all(cluster, topic, "read_committed", 2)) == committed
    assert sorted(kafka_read_all(cluster, topic, "read_committed", 2)) == committed


def test_a_second_producer_with_the_id_fences_the_first(cluster):
    topic = new_topic(cluster, partitions=1)
    zombie = tide_producer(cluster, f"tide-tx-{topic}")
    successor = tide_producer(cluster, f"tide-tx-{topic}")
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, b"zombie", partition=0).result(30)
        successor.init_transactions()  # bumps the epoch, aborts the zombie's transaction
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        with pytest.raises(ProducerFencedError):  # fatal: it refuses to go on
            zombie.begin_transaction()
        successor.begin_transaction()
        successor.send(topic, b"successor", partition=0)
        successor.commit_transaction()
    finally:
        zombie.close()
        successor.close()
    assert tide_read_all(cluster, topic, "read_committed", 1) == [b"successor"]
    assert kafka_read_all(cluster, topic, "read_committed", 1) == [b"successor"]
    assert b"zombie" in tide_read_all(cluster, topic, "read_uncommitted", 1)


def test_a_send_outside_a_transaction_is_refused(cluster):
    topic = new_topic(cluster, partitions=1)
    p = tide_producer(cluster, f"tide-tx-{topic}")
    try:
        with pytest.raises(RuntimeError):
            p.send(topic, b"before init", partition=0)
        p.init_transactions()
        with pytest.raises(RuntimeError):
            p.send(topic, b"before begin", partition=0)
        p.begin_transaction()
        p.send(topic, b"in", partition=0)
        p.commit_transaction()
        with pytest.raises(RuntimeError):
            p.send(topic, b"after commit", partition=0)
    finally:
        p.close()


def test_send_offsets_commits_the_groups_offsets_only_with_a_commit(cluster):
    source, sink = new_topic(cluster, partitions=1), new_topic(cluster, partitions=1)
    seed = Producer(cluster.bootstrap)
    for i in range(6):
        seed.send(source, f"in-{i}".encode(), partition=0)
    seed.close()
    group = f"g-{source}"
    p = tide_producer(cluster, f"tide-tx-{group}")
    try:
        p.init_transactions()
        for end, commit in ((3, True), (6, False)):
            p.begin_transaction()
            p.send(sink, f"out-{end}".encode(), partition=0)
            p.send_offsets_to_transaction({(source, 0): end}, group)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close()
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False,
                        auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        assert consumer.committed([(source, 0)]) == {(source, 0): 3}
        consumer.subscribe([source])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < 3:
            assert time.monotonic() < deadline, f"resumed with {values}"
            values += [r.value for r in consumer.poll(500)]
        assert values == [b"in-3", b"in-4", b"in-5"]  # resumed after the committed offset
    finally:
        consumer.close()
    assert tide_read_all(cluster, sink, "read_committed", 1) == [b"out-3"]


def test_kafka_and_tidewater_producers_fence_each_other(cluster):
    topic = new_topic(cluster, partitions=1)
    transactional_id = f"mixed-{topic}"
    tide = tide_producer(cluster, transactional_id)
    kafka = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka,
                                      "transactional.id": transactional_id})
    try:
        tide.init_transactions()
        tide.begin_transaction()
        tide.send(topic, b"tide-zombie", partition=0).result(30)
        kafka.init_transactions(60)  # fences Tidewater's producer, aborts its transaction
        with pytest.raises(ProducerFencedError):
            tide.commit_transaction()
        kafka.begin_transaction()
        kafka.produce(topic, value=b"kafka-zombie", partition=0)
        assert kafka.flush(30) == 0
        successor = tide_producer(cluster, transactional_id)
        try:
            successor.init_transactions()  # fences confluent-kafka's in turn
            with pytest.raises(confluent_kafka.KafkaException):
                kafka.commit_transaction(30)
            successor.begin_transaction()
            successor.send(topic, b"tide-successor", partition=0)
            successor.commit_transaction()
        finally:
            successor.close()
    finally:
        tide.close()
        del kafka  # librdkafka's producer stops its threads when collected
    assert kafka_read_all(cluster, topic, "read_committed", 1) == [b"tide-successor"]
    assert tide_read_all(cluster, topic, "read_committed", 1) == [b"tide-successor"]


def test_tide_produce_writes_transactions_of_n_records(cluster, tmp_path):
    topic = new_topic(cluster, partitions=1)
    ack_log = tmp_path / "acks.jsonl"
    lines = "".join(f"line-{i}\n" for i in range(5))
    result = cluster.tide("produce", topic, "--transactional-id", f"cli-{topic}",
                          "--records-per-transaction", "2", "--ack-log", str(ack_log),
                          input=lines)
    assert result.returncode == 0, result.stderr
    assert len(ack_log.read_text().splitlines()) == 5
    assert tide_read_all(cluster, topic, "read_committed", 1) == [
        f"line-{i}".encode() for i in range(5)]
    # 3 transactions: 2 + 2 + 1 records, each with its COMMIT marker after it.
    consumer = Consumer(cluster.bootstrap)
    try:
        assert consumer.end_offsets([(topic, 0)]) == {(topic, 0): 5 + 3}
    finally:
        consumer.close()
    refused = cluster.tide("produce", topic, "--records-per-transaction", "2", input="x\n")
    assert refused.returncode == 2 and "--transactional-id" in refused.stderr


def test_offsets_of_a_member_the_group_moved_past_are_refused(cluster):
    """KIP-447: send_offsets_to_transaction with a consumer's group_metadata commits; the
    same member at a generation the group is not at is refused (ILLEGAL_GENERATION), the
    transaction must be aborted and the group keeps the committed offset."""
    source = new_topic(cluster, partitions=1)
    seed = Producer(cluster.bootstrap)
    for i in range(4):
        seed.send(source, f"in-{i}".encode(), partition=0)
    seed.close()
    group = f"g-{source}"
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False,
                        auto_offset_reset="earliest", isolation_level="read_committed")
    p = tide_producer(cluster, f"tide-tx-{group}")

    def group_coordinator_up() -> bool:  # __consumer_offsets may be created just now
        try:
            consumer.committed([(source, 0)])
        except TidewaterError:
            return False
        return True
    try:
        wait_for(group_coordinator_up, "the group's coordinator")
        consumer.subscribe([source])
        records: list = []
        deadline = time.monotonic() + 60
        while len(records) < 4:
            assert time.monotonic() < deadline, "input not read"
            records += consumer.poll(500)
        member = consumer.group_metadata()
        assert member.generation_id >= 0 and member.member_id
        p.init_transactions()
        p.begin_transaction()
        p.send_offsets_to_transaction({(source, 0): 2}, member)
        p.commit_transaction()
        p.begin_transaction()
        stale = ConsumerGroupMetadata(group, member.generation_id + 7, member.member_id)
        with pytest.raises(TransactionAbortRequiredError):
            p.send_offsets_to_transaction({(source, 0): 4}, stale)
        with pytest.raises(TransactionAbortRequiredError):
            p.commit_transaction()
        p.abort_transaction()
        assert consumer.committed([(source, 0)]) == {(source, 0): 2}
    finally:
        p.close()
        consumer.close()
