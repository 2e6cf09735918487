"""Issue 28: partition reassignment (KIP-455) on a real 4-broker cluster.

kafka-python's ``KafkaAdminClient.alter_partition_reassignments`` (Kafka API 45) and
``tide reassign execute|verify`` (gRPC) each move a replication-factor-3 partition to
a new replica set that drops its leader, while a confluent-kafka producer keeps
writing with acks=all. Afterwards every acknowledged record is read back (0 lost),
the new replicas hold the whole log, the removed broker's directory is gone, and
ListPartitionReassignments is empty. Bad targets get Kafka's typed errors.
(confluent-kafka 2.16 has no reassignment API; aiokafka 0.14 has only the request
classes, sent by hand in test_aiokafka_admin_surface.py.)
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import Consumer, Producer  # noqa: E402
from kafka import KafkaAdminClient, TopicPartition  # noqa: E402
from kafka import errors as kafka_errors  # noqa: E402

from tidewater.broker.kafka import codec  # noqa: E402

BROKERS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("reassign"), len(BROKERS), "min.insync.replicas=2")
    c.kafka = c.manifest()["kafka_bootstrap"]  # type: ignore[attr-defined]
    yield c
    stop_cluster(c)


class AckedProducer:
    """Writes numbered records with acks=all from a thread until stopped; keeps the
    values the cluster acknowledged."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.acked: set[int] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 60000})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked.add(int(msg.value()))
        else:
            self.failed += 1

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self._producer.produce(self.topic, str(n).encode(), partition=0,
                                       on_delivery=self._delivered)
                n += 1
            except BufferError:
                pass
            self._producer.poll(0.002)
        self._producer.flush(60)

    def __enter__(self) -> AckedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(90)


def read_all(bootstrap: str, topic: str, expected: int) -> set[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and len(seen) < expected:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is None:
                    seen.add(int(msg.value()))
    finally:
        consumer.close()
    return seen


def wire(c, api_key: int, version: int, values: dict):
    """One request on Kafka's wire to the first broker; the decoded answer (kafka-python
    refuses an empty replica list before sending it)."""
    host, _, port = c.kafka.split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(codec.encode_request(api_key, version, 7, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(api_key, version, s.recv(size, socket.MSG_WAITALL))
    return answer


def create(c, name: str) -> list[int]:
    assert c.tide("topics", "create", name, "--partitions", "1",
                  "--replication-factor", "3").returncode == 0
    topic = wait_for(lambda: fully_replicated(c, name), f"{name} fully replicated")
    return list(topic["partitions"][0]["replicas"])


def partition_of(c, name: str) -> dict:
    result = c.tide("topics", "describe", name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["topics"][0]["partitions"][0]


def partition_dirs(c, broker_id: int, name: str) -> list[Path]:
    return list((c.data_dir / f"broker-{broker_id}").rglob(f"{name}-0*"))


def target_without_leader(c, name: str, replicas: list[int]) -> tuple[list[int], int]:
    """A target dropping the current leader for the broker outside the replicas."""
    leader = partition_of(c, name)["leader"]
    [spare] = [b for b in BROKERS if b not in replicas]
    return [r for r in replicas if r != leader] + [spare], leader


def ongoing_via_kafka(c) -> dict:
    client = KafkaAdminClient(bootstrap_servers=c.kafka)
    try:
        return client.list_partition_reassignments()
    finally:
        client.close()


def check_moved(c, name: str, target: list[int], removed: int, producer: AckedProducer
                ) -> None:
    """The move finished: target replicas all in the ISR with the whole log, the removed
    broker's directory gone, nothing acknowledged lost."""
    assert producer.acked, "the producer got no acknowledgement at all"
    p = wait_for(lambda: (lambda q: q if sorted(q["replicas"]) == sorted(target)
                          and sorted(q["isr"]) == sorted(target) else None)(
                              partition_of(c, name)), f"{name} on {target}")
    assert p["leader"] in target
    wait_for(lambda: not partition_dirs(c, removed, name), f"broker {removed}'s {name} removed")
    for b in target:
        assert partition_dirs(c, b, name), f"broker {b} has no log of {name}"
    # Every replica of the target holds the whole log (from offset 0 to the leader's end).
    def same_logs():
        q = partition_of(c, name)
        states = {s["broker"]: s for s in q.get("replicas_state", [])}
        if set(states) != set(target):
            return None
        ends = {s["log_end_offset"] for s in states.values()}
        starts = {s["log_start_offset"] for s in states.values()}
        return states if len(ends) == 1 and starts == {0} else None
    states = wait_for(same_logs, f"{name}'s replicas hold the same log")
    end = next(iter(states.values()))["log_end_offset"]
    assert end >= len(producer.acked)
    seen = read_all(c.kafka, name, len(producer.acked))
    lost = producer.acked - seen
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    print(f"{name}: moved to {target} while producing: {len(producer.acked)} acked, "
          f"{producer.failed} failed, 0 lost, log end {end}")


def test_kafka_python_moves_a_partition_off_its_leader_while_producing(cluster):
    name = "move-kafka-python"
    replicas = create(cluster, name)
    target, leader = target_without_leader(cluster, name, replicas)
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        with AckedProducer(cluster.kafka, name) as producer:
            wait_for(lambda: len(producer.acked) > 200, "records before the move")
            results = client.alter_partition_reassignments({TopicPartition(name, 0): target})
            assert results == {TopicPartition(name, 0): None}
            wait_for(lambda: not client.list_partition_reassignments(), "the move to complete")
            wait_for(lambda: len(producer.acked) > 400, "records after the move", 60)
        assert client.list_partition_reassignments() == {}
    finally:
        client.close()
    check_moved(cluster, name, target, leader, producer)


def test_tide_reassign_execute_and_verify_while_producing(cluster, tmp_path):
    name = "move-tide"
    replicas = create(cluster, name)
    target, leader = target_without_leader(cluster, name, replicas)
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": name}]}))
    generated = cluster.tide("reassign", "generate", "--topics-to-move-json-file",
                             str(topics_file), "--broker-list", ",".join(map(str, target)))
    assert generated.returncode == 0, generated.stderr
    proposed = json.loads(generated.stdout.split("Proposed partition reassignment "
                                                 "configuration")[1])
    [item] = proposed["partitions"]
    assert item["topic"] == name and sorted(item["replicas"]) == sorted(target)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": name, "partition": 0, "replicas": target, "log_dirs": ["any"] * 3}]}))
    with AckedProducer(cluster.kafka, name) as producer:
        wait_for(lambda: len(producer.acked) > 200, "records before the move")
        executed = cluster.tide("reassign", "execute", "--reassignment-json-file", str(plan))
        assert executed.returncode == 0, executed.stderr
        assert f"Successfully started partition reassignments for {name}-0" in executed.stdout
        rollback = json.loads(executed.stdout.split("Current partition replica assignment")[1]
                              .split("Save this")[0])
        assert rollback["partitions"][0]["replicas"] == replicas
        verified = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(
            cluster.tide("reassign", "verify", "--reassignment-json-file", str(plan))),
            "tide reassign verify: completed")
        assert f"Reassignment of partition {name}-0 is completed." in verified.stdout
        wait_for(lambda: len(producer.acked) > 400, "records after the move", 60)
    assert ongoing_via_kafka(cluster) == {}
    check_moved(cluster, name, target, leader, producer)


def test_cancel_reverts_and_bad_targets_get_typed_errors(cluster, tmp_path):
    name = "move-bad"
    replicas = create(cluster, name)
    tp = TopicPartition(name, 0)
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
    try:
        results = client.alter_partition_reassignments({tp: [replicas[0], replicas[1], 99]})
        assert results[tp] is kafka_errors.InvalidReplicationAssignmentError
        results = client.alter_partition_reassignments({tp: [replicas[0], replicas[0]]})
        assert results[tp] is kafka_errors.InvalidReplicationAssignmentError
        for version, allow, replicas_, code in (
                (0, True, [], 39),  # INVALID_REPLICA_ASSIGNMENT
                (1, False, replicas[:2], 38)):  # INVALID_REPLICATION_FACTOR
            answer = wire(cluster, 45, version, {
                "timeout": 30000, "allow_replication_factor_change": allow,
                "topics": [{"name": name, "partitions": [
                    {"partition_index": 0, "replicas": replicas_}]}]})
            assert answer.error_code == 0
            [[result]] = [t.partitions for t in answer.responses]
            assert (result.partition_index, result.error_code) == (0, code), result
        listed = wire(cluster, 46, 0, {"timeout": 30000, "topics": None})
        assert (listed.error_code, listed.topics) == (0, ())
        results = client.alter_partition_reassignments({TopicPartition(name, 7): replicas})
        assert results[TopicPartition(name, 7)] is kafka_errors.UnknownTopicOrPartitionError
        results = client.alter_partition_reassignments({tp: None})
        assert results[tp] is kafka_errors.NoReassignmentInProgressError
        assert client.list_partition_reassignments() == {}
        assert sorted(partition_of(cluster, name)["replicas"]) == sorted(replicas)
    finally:
        client.close()
    # The same through tide: one line naming Kafka's error, exit status non-zero.
    plan = tmp_path / "bad.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": name, "partition": 0, "replicas": [replicas[0], 99, replicas[1]]}]}))
    refused = cluster.tide("reassign", "execute", "--reassignment-json-file", str(plan))
    assert refused.returncode != 0 and "INVALID_REPLICA_ASSIGNMENT" in refused.stderr
    cancelled = cluster.tide("reassign", "cancel", "--reassignment-json-file", str(plan))
    assert cancelled.returncode != 0 and "NO_REASSIGNMENT_IN_PROGRESS" in cancelled.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert run_tide("reassign", "verify", "--reassignment-json-file", str(garbage),
                    bootstrap=cluster.bootstrap).returncode == 2


def timed_move(c, name: str, target: list[int]) -> float:
    """Seconds from AlterPartitionReassignments until the move completed."""
    client = KafkaAdminClient(bootstrap_servers=c.kafka)
    try:
        started = time.monotonic()
        assert client.alter_partition_reassignments(
            {TopicPartition(name, 0): target}) == {TopicPartition(name, 0): None}
        wait_for(lambda: not client.list_partition_reassignments(), f"{name} moved", 120)
        return time.monotonic() - started
    finally:
        client.close()


def fill(c, name: str, size_bytes: int) -> None:
    producer = Producer({"bootstrap.servers": c.kafka, "acks": "all", "linger.ms": 20})
    value = b"x" * 1000
    for _ in range(size_bytes // len(value)):
        while True:
            try:
                producer.produce(name, value, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def test_follower_throttle_holds_the_new_replicas_catch_up_to_its_rate(cluster, tmp_path):
    """``tide reassign execute --throttle`` sets Kafka's throttle configs (the brokers'
    follower.replication.throttled.rate, the topic's follower.replication.throttled.replicas
    naming the new replica): 1.5 MB to copy at 200 KB/s takes 6.5 s (the first second's
    credit aside), the same move unthrottled far less; ``verify`` removes the throttles
    once the move is complete."""
    size, rate = 1_500_000, 200_000
    timings = {}
    for name, throttled in (("move-free", False), ("move-throttled", True)):
        replicas = create(cluster, name)
        fill(cluster, name, size)
        [spare] = [b for b in BROKERS if b not in replicas]
        target = replicas[:2] + [spare]  # the leader stays: only a follower is replaced
        if not throttled:
            timings[name] = timed_move(cluster, name, target)
            continue
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": name, "partition": 0, "replicas": target}]}))
        client = KafkaAdminClient(bootstrap_servers=cluster.kafka)
        try:
            executed = cluster.tide("reassign", "execute", "--reassignment-json-file",
                                    str(plan), "--throttle", str(rate))
            # Timed from the answer (the new replica has its LeaderAndIsr: copying starts)
            # to the end of the move, polled as timed_move polls.
            started = time.monotonic()
            assert executed.returncode == 0, executed.stderr
            wait_for(lambda c=client: not c.list_partition_reassignments(), f"{name} moved", 120)
            timings[name] = time.monotonic() - started
        finally:
            client.close()
        assert f"throttle limit was set to {rate} B/s" in executed.stdout
        described = cluster.tide("configs", "describe", "--entity-type", "topics",
                                 "--entity-name", name)
        assert f"follower.replication.throttled.replicas=0:{spare}" in described.stdout
        verified = cluster.tide("reassign", "verify", "--reassignment-json-file", str(plan))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "Throttle was removed." in verified.stdout
        for broker_id in BROKERS:
            own = cluster.tide("configs", "describe", "--entity-type", "brokers",
                               "--entity-name", str(broker_id)).stdout
            assert "replication.throttled" not in own, own
        own = cluster.tide("configs", "describe", "--entity-type", "topics",
                           "--entity-name", name).stdout
        assert "replication.throttled" not in own, own
    print(f"1.5 MB move: unthrottled {timings['move-free']:.1f} s, throttled at "
          f"{rate} B/s {timings['move-throttled']:.1f} s")
    # The timer starts once `tide` has exited, after the controller's answer, which comes
    # once the brokers have the change: the copying started up to a second or so earlier.
    assert timings["move-throttled"] >= (size - rate) / rate * 0.6
    assert timings["move-free"] < timings["move-throttled"]


def test_cancel_of_a_throttled_move_in_progress_reverts_it(cluster, tmp_path):
    """A move held back by a 50 KB/s throttle is still in progress when ``tide reassign
    cancel`` reverts it: the original replicas stay, the half-copied new replica's
    directory goes, ListPartitionReassignments is empty."""
    name = "move-cancelled"
    replicas = create(cluster, name)
    fill(cluster, name, 1_500_000)
    [spare] = [b for b in BROKERS if b not in replicas]
    target = replicas[:2] + [spare]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": name, "partition": 0, "replicas": target}]}))
    executed = cluster.tide("reassign", "execute", "--reassignment-json-file", str(plan),
                            "--throttle", "50000")
    assert executed.returncode == 0, executed.stderr
    tp = TopicPartition(name, 0)
    ongoing = ongoing_via_kafka(cluster)
    assert ongoing == {tp: {"replicas": target + [replicas[2]], "adding_replicas": [spare],
                            "removing_replicas": [replicas[2]]}}, ongoing
    wait_for(lambda: partition_dirs(cluster, spare, name), f"broker {spare} copying {name}")
    verified = cluster.tide("reassign", "verify", "--reassignment-json-file", str(plan))
    assert verified.returncode == 1
    assert f"Reassignment of partition {name}-0 is still in progress." in verified.stdout
    cancelled = cluster.tide("reassign", "cancel", "--reassignment-json-file", str(plan))
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"Successfully cancelled partition reassignments for: {name}-0" in cancelled.stdout
    assert ongoing_via_kafka(cluster) == {}
    p = partition_of(cluster, name)
    assert sorted(p["replicas"]) == sorted(replicas) and sorted(p["isr"]) == sorted(replicas)
    wait_for(lambda: not partition_dirs(cluster, spare, name), f"broker {spare}'s copy removed")
    # verify: no move left (the replicas are not the file's target), throttles removed.
    verified = cluster.tide("reassign", "verify", "--reassignment-json-file", str(plan))
    assert "There is no active reassignment" in verified.stdout
    assert "Throttle was removed." in verified.stdout
