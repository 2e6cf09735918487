"""Issue 16: consumer groups through Kafka's own clients against ``tide cluster up``.

Three members of a group (each its own process, ``group_worker.py``) share a
6-partition topic; one is SIGKILLed (evicted after its session timeout), one leaves,
one joins; every record is consumed at least once, the group's final commits are the
log end offsets, and the commits in ``__consumer_offsets`` (read back and decoded
with Kafka's formats) never go backwards. Then the coordinator's broker is
SIGKILLed between commits: the group finds the new coordinator and no committed
offset is lost.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from cluster_fixtures import start_cluster, stop_cluster, wait_for

from tidewater.broker.group import records as group_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

WORKER = Path(__file__).with_name("group_worker.py")
PARTITIONS = 6
KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("groups"), 3, "min.insync.replicas=2",
                      "offsets.topic.num.partitions=6", "group.min.session.timeout.ms=1000",
                      "group.initial.rebalance.delay.ms=300")
    c.kafka = c.manifest()["kafka_bootstrap"]
    yield c
    stop_cluster(c)


def new_topic(c) -> str:
    name = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.kafka})
    [(_, future)] = admin.create_topics(
        [NewTopic(name, num_partitions=PARTITIONS, replication_factor=3)]).items()
    future.result(30)
    return name


def produce(c, topic: str, count: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": c.kafka, "acks": "all"})
    for i in range(start, start + count):
        producer.produce(topic, value=str(i).encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def end_offsets(c, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": "offsets-probe"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


# "mixed": one group of different clients (Kafka's ConsumerProtocol bytes are shared).
MIXED = ["confluent", "tidewater", "kafka-python", "aiokafka"]


class Worker:
    def __init__(self, library: str, c, group: str, topic: str, out_dir: Path, n: int,
                 instance: str | None = None):
        if library == "mixed":
            library = MIXED[n % len(MIXED)]
        self.out = out_dir / f"{library}-{n}.out"
        self.err = out_dir / f"{library}-{n}.err"
        env = dict(os.environ, PYTHONUNBUFFERED="1", GROUP_INSTANCE_ID=instance or "")
        if library == "kcat":
            # kcat -G: librdkafka's balanced consumer, auto-commit every 100 ms. Not
            # `-o beginning`: kcat puts that offset on every partition it is assigned,
            # committed offset or not (its rebalance_cb), so a rebalance would read
            # again from 0 and commit backwards; auto.offset.reset applies only where
            # the group has no committed offset.
            cmd = [KCAT, "-b", c.kafka, "-G", group, "-X", "auto.offset.reset=earliest", "-u",
                   "-X", "session.timeout.ms=3000", "-X", "heartbeat.interval.ms=500",
                   "-X", "auto.commit.interval.ms=100", "-f", "R %p %o\n", topic]
        else:
            bootstrap = c.bootstrap if library == "tidewater" else c.kafka  # gRPC or Kafka's
            cmd = [sys.executable, str(WORKER), library, bootstrap, group, topic]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines()

    def consumed(self) -> set[tuple[int, int]]:
        out = set()
        for line in self.lines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "R":
                out.add((int(parts[1]), int(parts[2])))
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()


def wait_all_consumed(workers: list[Worker], ends: dict[int, int], what: str,
                      starts: dict[int, int] | None = None) -> None:
    """Until ``workers`` together have printed every record below ``ends`` (from
    ``starts``)."""
    wanted = {(p, o) for p, end in ends.items() for o in range((starts or {}).get(p, 0), end)}

    def done():
        seen = set().union(*(w.consumed() for w in workers))
        return wanted <= seen
    try:
        wait_for(done, what, timeout_s=90)
    except BaseException:
        for w in workers:
            print(w.out, w.lines()[-5:], w.err.read_text()[-2000:])
        raise


def committed(c, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)}
    finally:
        consumer.close()


def commit_history(c, group: str) -> dict[tuple[str, int], list[int]]:
    """Every offset commit of ``group`` in __consumer_offsets, in log order, decoded."""
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": "history-reader",
                         "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(TopicPartition("__consumer_offsets", p),
                                              timeout=10)[1] for p in range(6)}
    consumer.assign([TopicPartition("__consumer_offsets", p, 0) for p in range(6)])
    history: dict[tuple[str, int], list[int]] = defaultdict(list)
    read = {p: 0 for p in range(6)}
    deadline = time.monotonic() + 30
    try:
        while any(read[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None or m.error() is not None:
                continue
            read[m.partition()] = m.offset() + 1
            record = group_records.decode(m.key(), m.value())
            if (isinstance(record, group_records.OffsetCommitRecord)
                    and record.group_id == group and record.value is not None):
                history[(record.topic, record.partition)].append(record.value.offset)
    finally:
        consumer.close()
    return history


def describe_group(c, group: str):
    admin = AdminClient({"bootstrap.servers": c.kafka})
    [(_, future)] = admin.describe_consumer_groups([group]).items()
    return future.result(20)


LIBRARIES = ["confluent", "kafka-python", "aiokafka", "tidewater", "mixed",
             pytest.param("kcat", marks=pytest.mark.skipif(KCAT is None, reason="no kcat"))]


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_group_of_three_shares_partitions_through_crash_leave_and_join(cluster, library,
                                                                          tmp_path):
    c = cluster
    topic, group = new_topic(c), f"group-{library}-{uuid.uuid4().hex[:6]}"
    produce(c, topic, 300)
    workers = [Worker(library, c, group, topic, tmp_path, n) for n in range(3)]
    try:
        wait_all_consumed(workers, end_offsets(c, topic), "the first records")

        def three_share():
            d = describe_group(c, group)
            sizes = sorted(len(m.assignment.topic_partitions) for m in d.members)
            return d if sizes == [2, 2, 2] else None
        description = wait_for(three_share, "three members with two partitions each")
        assert str(description.state).endswith("STABLE")
        assert {m.host for m in description.members} == {"/127.0.0.1"}  # as Kafka shows it

        before = end_offsets(c, topic)
        workers[0].kill()  # a crash: evicted after its session timeout
        produce(c, topic, 300, start=300)
        # The records after the crash, all of them read by the two left.
        wait_all_consumed(workers[1:], end_offsets(c, topic), "the records after the crash",
                          starts=before)
        wait_for(lambda: len(describe_group(c, group).members) == 2, "the dead member gone")

        before = end_offsets(c, topic)
        workers[1].stop()  # a clean leave
        joined = Worker(library, c, group, topic, tmp_path, 3)  # and a newcomer
        workers.append(joined)
        produce(c, topic, 300, start=600)
        ends = end_offsets(c, topic)
        wait_all_consumed([workers[2], joined], ends, "the records after leave and join",
                          starts=before)
        wait_for(lambda: len(describe_group(c, group).members) == 2, "two members")
        wait_all_consumed(workers, ends, "every record")
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.stop()
    if library != "kcat":  # kcat's auto-commit may trail; the others commit each batch
        wait_for(lambda: committed(c, group, topic) == ends, "commits at the log end")
    history = commit_history(c, group)
    assert history, "no commit was written"
    for tp, offsets in history.items():
        assert offsets == sorted(offsets), (tp, offsets)


def test_the_coordinators_death_loses_no_committed_offset(cluster):
    c = cluster
    topic, group = new_topic(c), f"failover-{uuid.uuid4().hex[:6]}"
    produce(c, topic, 60)
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    acknowledged: dict[int, int] = {}
    try:
        got = 0
        deadline = time.monotonic() + 60
        while got < 60 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
                if got == 30:
                    for tp in consumer.commit(asynchronous=False):
                        acknowledged[tp.partition] = tp.offset
        coordinator = describe_group(c, group).coordinator.id
        result = c.tide("cluster", "kill", str(coordinator), "--data-dir", str(c.data_dir))
        assert result.returncode == 0, result.stderr
        # The next commit must reach the new coordinator (leader of the group's partition).
        deadline = time.monotonic() + 60
        while True:
            try:
                for tp in consumer.commit(asynchronous=False):
                    acknowledged[tp.partition] = tp.offset
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert describe_group(c, group).coordinator.id != coordinator
    finally:
        consumer.close()
    try:
        now = committed(c, group, topic)
        for partition, offset in acknowledged.items():
            assert now[partition] >= offset, (partition, now, acknowledged)
        assert sum(o for o in now.values() if o > 0) == 60
    finally:
        assert c.tide("cluster", "start", str(coordinator), "--data-dir",
                      str(c.data_dir)).returncode == 0


def test_clients_cannot_produce_to_the_offsets_topic(cluster):
    """A forged commit record would move a group's offsets: Kafka's and gRPC produce
    requests to __consumer_offsets are refused, and nothing is appended."""
    c = cluster
    group = f"forged-{uuid.uuid4().hex[:6]}"
    produce(c, new_topic(c), 1)
    consumer = Consumer({"bootstrap.servers": c.kafka, "group.id": group})
    consumer.list_topics(timeout=10)
    consumer.close()
    wait_for(lambda: describe_group(c, group) is not None, "the offsets topic")
    before = {p: Consumer({"bootstrap.servers": c.kafka, "group.id": "x"})
              .get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10)[1]
              for p in range(6)}
    forged = group_records.OffsetCommitRecord(
        group, "t", 0, group_records.OffsetCommitValue(99, -1, "", 0))
    errors = []
    producer = Producer({"bootstrap.servers": c.kafka, "retries": 0,
                         "message.send.max.retries": 0})
    for p in range(6):
        producer.produce("__consumer_offsets", key=group_records.encode_key(forged),
                         value=group_records.encode_value(forged), partition=p,
                         on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 6 and all(e is not None for e in errors), errors
    assert {e.code() for e in errors} == {confluent_kafka.KafkaError.TOPIC_EXCEPTION}
    result = c.tide("produce", "__consumer_offsets", "--partition", "0", input="x\n")
    assert result.returncode != 0 and "INVALID_TOPIC_EXCEPTION" in result.stderr
    after = {p: Consumer({"bootstrap.servers": c.kafka, "group.id": "x"})
             .get_watermark_offsets(TopicPartition("__consumer_offsets", p), timeout=10)[1]
             for p in range(6)}
    assert after == before


@pytest.mark.parametrize("library", ["confluent", "tidewater"])
def test_a_restarted_static_member_comes_back_without_a_rebalance(cluster, tmp_path, library):
    """KIP-345: a SIGKILLed member with a group.instance.id restarted within its session
    timeout takes its place back; the other member sees no new assignment. The Tidewater
    Consumer (``group_instance_id``, over gRPC) as librdkafka over Kafka's protocol."""
    c = cluster
    topic, group = new_topic(c), f"static-{uuid.uuid4().hex[:6]}"
    produce(c, topic, 120)
    steady = Worker(library, c, group, topic, tmp_path, 0, instance="steady")
    restarted = Worker(library, c, group, topic, tmp_path, 1, instance="restarted")
    workers = [steady, restarted]
    try:
        wait_all_consumed(workers, end_offsets(c, topic), "the first records")
        wait_for(lambda: sorted(len(m.assignment.topic_partitions)
                                for m in describe_group(c, group).members) == [3, 3],
                 "two static members with three partitions each")
        assignments = [line for line in steady.lines() if line.startswith("A ")]
        restarted.kill()
        back = Worker(library, c, group, topic, tmp_path, 2, instance="restarted")
        workers.append(back)
        before = end_offsets(c, topic)
        produce(c, topic, 120, start=120)
        wait_all_consumed([steady, back], end_offsets(c, topic), "records after the restart",
                          starts=before)
        assert [line for line in steady.lines() if line.startswith("A ")] == assignments
        members = describe_group(c, group).members
        assert sorted(m.group_instance_id for m in members) == ["restarted", "steady"]
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.stop()
