"""Issue 27 end to end: transactions through the coordinator, its markers and the log on
a 3-broker cluster (RF 3, min.insync.replicas 2), with Kafka's clients.

confluent-kafka: committed transactions are visible to read_committed consumers, aborted
ones never (read_uncommitted sees both); a second producer with the same
transactional.id fences the first, whose commit fails and whose open transaction never
becomes visible; a transaction left open past its timeout is aborted by the coordinator
and later commits on that partition become visible (the LSO moves on);
``send_offsets_to_transaction`` commits the group's offsets with the output (and an
abort drops them). kafka-python and aiokafka: commit and abort seen by their own
read_committed consumers. An exactly-once consume-transform-produce app
(``eos_app.py``) SIGKILLed half-way and restarted, while the transaction coordinator
and the leader of an output partition are SIGKILLed too, writes each output once.
KIP-890 part 1 (transaction verification): a transactional produce, forged with raw
frames and a producer id from InitProducerId, to a partition never added to the
transaction, or after the transaction ended, is INVALID_TXN_STATE and writes nothing,
whether the partition's leader is the coordinator or another broker.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import describe_topic, run_tide, start_cluster, stop_cluster, wait_for
from test_kafka_transactions import (
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    call,
    coordinator_of,
    describe,
)

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import TRANSACTIONAL_MASK
from tidewater.proto.records import encode_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

confluent_kafka = pytest.importorskip("confluent_kafka")

APP = Path(__file__).with_name("eos_app.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("txne2e"), 3, "min.insync.replicas=2",
                      "transaction.state.log.num.partitions=5",
                      "transaction.abort.timed.out.transaction.cleanup.interval.ms=300")
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


def producer(c, transactional_id: str, **extra: Any) -> Any:
    return confluent_kafka.Producer({"bootstrap.servers": c.kafka,
                                     "transactional.id": transactional_id, **extra})


def read_all(c, topic: str, isolation: str, partitions: int = 3,
             bootstrap: str | None = None, config: dict | None = None) -> list[bytes]:
    """Every value of ``topic`` a fresh consumer reads from the start up to the end it
    sees (the LSO for read_committed: each partition's first EOF event; a topic still
    written to is read up to about then). ``config``: the client's security settings."""
    consumer = confluent_kafka.Consumer({
        **(config or {}),
        "bootstrap.servers": bootstrap or c.kafka, "group.id": f"reader-{uuid.uuid4().hex}",
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


def test_committed_transactions_are_visible_and_aborted_ones_never(cluster):
    topic = new_topic(cluster)
    p = producer(cluster, f"tx-{topic}")
    p.init_transactions(60)
    for outcome in ("c1", "a1", "c2"):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"{outcome}-{i}".encode(), partition=i % 3)
        # In the log before the outcome (librdkafka's abort drops what it has not sent).
        assert p.flush(30) == 0
        if outcome.startswith("c"):
            p.commit_transaction(60)
        else:
            p.abort_transaction(60)
    committed = read_all(cluster, topic, "read_committed")
    # c2 commits after a1 on every partition: had a1 leaked, it would be read before c2.
    assert sorted(committed) == sorted(f"c{t}-{i}".encode() for t in (1, 2)
                                       for i in range(10))
    uncommitted = read_all(cluster, topic, "read_uncommitted")
    assert sorted(uncommitted) == sorted(f"{o}-{i}".encode() for o in ("c1", "a1", "c2")
                                         for i in range(10))
    assert describe(cluster.kafka, f"tx-{topic}").transaction_state == "CompleteCommit"


def _kafka_address(c, node: int) -> str:
    return c.manifest()["processes"][f"broker-{node}"]["kafka"]


def _produce_txn(address: str, topic: str, partition: int, transactional_id: str,
                 producer: tuple[int, int], sequence: int, values: list[bytes]) -> Any:
    """One transactional batch by raw Produce v9 (acks=all); the partition's answer."""
    records = encode_batch([(None, v) for v in values], producer_id=producer[0],
                           producer_epoch=producer[1], base_sequence=sequence,
                           attributes=TRANSACTIONAL_MASK)
    answer = call(address, 0, 9, {
        "transactional_id": transactional_id, "acks": -1, "timeout": 30000, "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}]})
    [[result]] = [t.partition_responses for t in answer.responses]
    return result


def test_kip890_a_produce_outside_the_ongoing_transaction_is_refused_and_not_written(
        cluster):
    partitions = 6
    topic = new_topic(cluster, partitions)
    transactional_id = f"tx-{topic}"
    node, coordinator = coordinator_of(cluster.kafka, transactional_id)
    init = wait_for(lambda: (a := call(coordinator, INIT_PRODUCER_ID, 4, {
        "transactional_id": transactional_id, "transaction_timeout": 60_000,
        "producer_id": -1, "producer_epoch": -1})).error_code == 0 and a, "InitProducerId")
    producer_ = (int(init.producer_id), int(init.producer_epoch))
    leaders = {p: _leader(cluster, topic, p) for p in range(partitions)}
    # Both ways of asking: in process (the leader is the coordinator) and over the
    # inter-broker gRPC (another broker leads).
    assert node in leaders.values() and set(leaders.values()) - {node}, (node, leaders)

    def produce(partition: int, sequence: int, values: list[bytes]) -> Any:
        return _produce_txn(_kafka_address(cluster, leaders[partition]), topic, partition,
                            transactional_id, producer_, sequence, values)

    # No partition added yet: every one refuses, wherever it is led.
    for partition in range(partitions):
        refused = produce(partition, 0, [b"stray"])
        assert refused.error_code == pb.INVALID_TXN_STATE, (partition, refused)
    added = call(coordinator, ADD_PARTITIONS_TO_TXN, 3, {
        "v3_and_below_transactional_id": transactional_id,
        "v3_and_below_producer_id": producer_[0],
        "v3_and_below_producer_epoch": producer_[1],
        "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0]\
        .partition_error_code == 0
    assert produce(0, 0, [b"in-0"]).error_code == pb.NONE
    assert produce(0, 1, [b"in-1"]).error_code == pb.NONE
    for partition in range(1, partitions):  # still never added
        assert produce(partition, 0, [b"stray"]).error_code == pb.INVALID_TXN_STATE
    ended = call(coordinator, END_TXN, 3, {
        "transactional_id": transactional_id, "producer_id": producer_[0],
        "producer_epoch": producer_[1], "committed": True})
    assert ended.error_code == 0
    wait_for(lambda: describe(cluster.kafka, transactional_id).transaction_state
             == "CompleteCommit", "the markers written")
    # The same producer and epoch after its transaction ended (a late retry): refused.
    assert produce(0, 2, [b"late"]).error_code == pb.INVALID_TXN_STATE
    assert read_all(cluster, topic, "read_uncommitted", partitions) == [b"in-0", b"in-1"]
    assert read_all(cluster, topic, "read_committed", partitions) == [b"in-0", b"in-1"]

    # transaction.partition.verification.enable is a dynamic broker config, as Kafka's.
    def verification(setting: str) -> None:
        assert cluster.tide("configs", "alter", "--entity-type", "brokers",
                            "--entity-default", setting).returncode == 0
    verification("--add-config=transaction.partition.verification.enable=false")
    try:
        wait_for(lambda: produce(1, 0, [b"unchecked"]).error_code == pb.NONE,
                 "a produce outside the transaction taken with verification off")
    finally:
        verification("--delete-config=transaction.partition.verification.enable")
    # Once partition 2's leader has the change (its DescribeConfigs answers from the same
    # metadata): refused again. (Partition 1 has a transaction open now: its batches
    # need no check.)
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": cluster.kafka})

    def verifying(node: int) -> bool:
        [(_, future)] = admin.describe_configs(
            [ConfigResource(ResourceType.BROKER, str(node))]).items()
        entry = future.result(30).get("transaction.partition.verification.enable")
        return entry is None or entry.value == "true"
    wait_for(lambda: verifying(leaders[2]), "the leader of partition 2 verifying again")
    assert produce(2, 0, [b"again"]).error_code == pb.INVALID_TXN_STATE


def test_a_fenced_producers_open_transaction_never_becomes_visible(cluster):
    topic = new_topic(cluster, partitions=1)
    zombie = producer(cluster, f"tx-{topic}")
    zombie.init_transactions(60)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    assert zombie.flush(30) == 0  # in the log, its transaction open
    successor = producer(cluster, f"tx-{topic}")
    successor.init_transactions(60)  # aborts the zombie's transaction, bumps the epoch
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        zombie.produce(topic, value=b"zombie-2", partition=0)
        zombie.commit_transaction(30)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(60)
    assert read_all(cluster, topic, "read_committed", 1) == [b"successor"]
    assert b"zombie" in read_all(cluster, topic, "read_uncommitted", 1)


def test_a_transaction_open_past_its_timeout_is_aborted_and_the_lso_moves_on(cluster):
    topic = new_topic(cluster, partitions=1)
    stalled = producer(cluster, f"tx-stalled-{topic}",
                       **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    stalled.init_transactions(60)
    stalled.begin_transaction()
    stalled.produce(topic, value=b"stalled", partition=0)
    assert stalled.flush(30) == 0
    # Never committed nor aborted by the client: only the coordinator's timeout ends it.
    later = producer(cluster, f"tx-later-{topic}")
    later.init_transactions(60)
    later.begin_transaction()
    later.produce(topic, value=b"later", partition=0)
    later.commit_transaction(60)
    wait_for(lambda: describe(cluster.kafka, f"tx-stalled-{topic}").transaction_state
             == "CompleteAbort", "the coordinator's timeout abort", timeout_s=60)
    assert read_all(cluster, topic, "read_committed", 1) == [b"later"]
    del stalled


def test_send_offsets_to_transaction_commits_the_groups_offsets_with_the_output(cluster):
    source, sink = new_topic(cluster, partitions=1), new_topic(cluster, partitions=1)
    seed = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka})
    for i in range(6):
        seed.produce(source, value=f"in-{i}".encode(), partition=0)
    assert seed.flush(30) == 0
    group = f"g-{source}"
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": cluster.kafka, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    p = producer(cluster, f"tx-{group}")
    p.init_transactions(60)
    try:
        consumer.subscribe([source])
        records: list[Any] = []
        deadline = time.monotonic() + 60
        while len(records) < 6:
            assert time.monotonic() < deadline, "input not read"
            records += [m for m in consumer.consume(6 - len(records), 0.5)
                        if m.error() is None]
        for end, commit in ((3, True), (6, False)):
            p.begin_transaction()
            p.produce(sink, value=f"out-{end}".encode(), partition=0)
            assert p.flush(30) == 0
            p.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(source, 0, end)],
                consumer.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(60)
            else:
                p.abort_transaction(60)
        [committed] = consumer.committed([confluent_kafka.TopicPartition(source, 0)], 30)
        assert committed.offset == 3  # the committed transaction's, not the aborted one's
        assert read_all(cluster, sink, "read_committed", 1) == [b"out-3"]
    finally:
        consumer.close()


def test_kafka_python_commit_and_abort(cluster):
    kafka = pytest.importorskip("kafka")
    topic = new_topic(cluster, partitions=1)
    p = kafka.KafkaProducer(bootstrap_servers=cluster.kafka.split(","),
                            transactional_id=f"tx-py-{topic}")
    p.init_transactions()
    for value, commit in ((b"py-commit", True), (b"py-abort", False), (b"py-last", True)):
        p.begin_transaction()
        p.send(topic, value=value, partition=0)
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
    p.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka.split(","),
                                   isolation_level="read_committed",
                                   auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            for batch in consumer.poll(1000).values():
                seen += [r.value for r in batch]
        assert seen == [b"py-commit", b"py-last"]
    finally:
        consumer.close()


def test_aiokafka_commit_and_abort(cluster):
    aiokafka = pytest.importorskip("aiokafka")
    topic = new_topic(cluster, partitions=1)

    async def run() -> list[bytes]:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka,
                                      transactional_id=f"tx-aio-{topic}")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(topic, b"aio-commit", partition=0)
            await p.begin_transaction()
            await p.send_and_wait(topic, b"aio-abort", partition=0)
            await p.abort_transaction()
            async with p.transaction():
                await p.send_and_wait(topic, b"aio-last", partition=0)
        finally:
            await p.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka, isolation_level="read_committed",
            auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            seen: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(seen) < 2 and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    seen += [r.value for r in batch]
            return seen
        finally:
            await consumer.stop()
    assert asyncio.run(run()) == [b"aio-commit", b"aio-last"]
    # and read_uncommitted (confluent) sees the aborted one too
    assert read_all(cluster, topic, "read_uncommitted", 1) == [
        b"aio-commit", b"aio-abort", b"aio-last"]


def _leader(c, topic: str, partition: int) -> int:
    described = describe_topic(c, topic)
    assert described is not None
    return int(described["partitions"][partition]["leader"])


def _kill_and_restart(c, broker: int, app: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL ``broker``, let ``app`` run on without it for 2 s, then start it again with
    ``app`` stopped (SIGSTOP, by its pid) meanwhile: a slow restart on a loaded machine
    must not leave the app the whole rest of its input, so the next fault lands mid-run."""
    assert run_tide("cluster", "kill", str(broker), "--signal", "KILL",
                    "--data-dir", str(c.data_dir)).returncode == 0
    time.sleep(2)  # the app runs on without the broker for a while
    if app is not None:
        app.send_signal(signal.SIGSTOP)
    try:
        started = run_tide("cluster", "start", str(broker), "--data-dir", str(c.data_dir),
                           timeout_s=120)
    finally:
        if app is not None:
            app.send_signal(signal.SIGCONT)
    assert started.returncode == 0, started.stderr


def test_exactly_once_app_survives_sigkills_of_itself_the_coordinator_and_a_leader(
        cluster, tmp_path):
    source, sink = new_topic(cluster), new_topic(cluster)
    # 10 inputs a transaction and a 0.2 s pause after each: at least 9 s of the run are
    # left when the last kill is decided (450 outputs), so every kill lands mid-run.
    inputs = 900
    seed = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka,
                                     "enable.idempotence": True})
    for i in range(inputs):
        seed.produce(source, value=f"{i}".encode(), partition=i % 3)
    assert seed.flush(60) == 0
    transactional_id, group = f"eos-{sink}", f"eos-group-{sink}"
    args = [sys.executable, str(APP), cluster.kafka, source, sink, group, transactional_id,
            "0.2"]
    apps: list[subprocess.Popen[bytes]] = []

    def start_app(n: int) -> subprocess.Popen[bytes]:
        out = open(tmp_path / f"app-{n}.log", "wb")  # the app writes it until it dies
        app = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        apps.append(app)
        return app

    def outputs() -> int:
        return len(read_all(cluster, sink, "read_committed"))

    def outputs_reach(count: int, what: str) -> None:
        seen = wait_for(lambda: (n := outputs()) >= count and n, what, timeout_s=180)
        assert seen < inputs, f"the run was over ({seen} outputs) before {what}"
    try:
        app = start_app(1)
        outputs_reach(100, "the app's first outputs")
        app.kill()  # SIGKILL half-way, by its pid
        app.wait()
        start_app(2)
        outputs_reach(200, "the restarted app's outputs")
        coordinator, _ = coordinator_of(cluster.kafka, transactional_id)
        _kill_and_restart(cluster, coordinator, apps[-1])
        outputs_reach(450, "outputs after the coordinator's death")
        _kill_and_restart(cluster, _leader(cluster, sink, 0), apps[-1])
        wait_for(lambda: len(set(read_all(cluster, sink, "read_committed"))) == inputs,
                 "every input's output", timeout_s=300)
    finally:
        for app in apps:
            if app.poll() is None:
                app.kill()
                app.wait()
    outputs_read = read_all(cluster, sink, "read_committed")
    counts = Counter(outputs_read)
    lost = [i for i in range(inputs) if f"out-{i}".encode() not in counts]
    duplicated = {v: n for v, n in counts.items() if n > 1}
    assert (lost, duplicated) == ([], {}), (len(lost), len(duplicated))
    assert len(outputs_read) == inputs


def test_describe_producers_shows_an_open_transaction_until_it_ends(cluster):
    """DescribeProducers (key 61) through kafka-python's admin client: the producer's
    open transaction's first offset while it is open, -1 once committed; a follower
    answers NOT_LEADER_OR_FOLLOWER."""
    kafka = pytest.importorskip("kafka")
    topic = new_topic(cluster, partitions=1)
    admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.kafka.split(","))
    p = producer(cluster, f"tx-{topic}")
    p.init_transactions(60)
    try:
        p.begin_transaction()
        p.produce(topic, value=b"open", partition=0)
        assert p.flush(30) == 0
        state = describe(cluster.kafka, f"tx-{topic}")
        tp = kafka.TopicPartition(topic, 0)
        [active] = admin.describe_producers([tp])[tp].active_producers
        assert (active.producer_id, active.producer_epoch, active.last_sequence,
                active.current_transaction_start_offset) == (
            state.producer_id, state.producer_epoch, 0, 0)
        p.commit_transaction(60)

        def ended() -> Any:
            [a] = admin.describe_producers([tp])[tp].active_producers
            return a.current_transaction_start_offset == -1 and a
        done = wait_for(ended, "the transaction ended on the partition")
        assert done.coordinator_epoch >= 0
        leader = _leader(cluster, topic, 0)
        follower = next(b for b in (1, 2, 3) if b != leader)
        with pytest.raises(kafka.errors.NotLeaderForPartitionError):
            admin.describe_producers([tp], broker_id=follower)
    finally:
        admin.close()
