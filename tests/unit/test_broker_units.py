"""Config parsing, the waiting rooms (acks=all waits, long-polls) and the metadata cache."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tidewater.broker.config import BrokerConfig, ConfigError, config_from_args
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replication.replica_produce import ACKS_ALL_WAIT_MS_MAX
from tidewater.broker.serving.purgatory import AcksWaits, FetchWaiters
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import StaleControllerEpochError

BASE = ["--broker-id", "1", "--listen", "127.0.0.1:9092", "--controller", "127.0.0.1:9093",
        "--data-dir", "/tmp/x"]


def test_config_defaults_and_settings():
    c = config_from_args(BASE + ["--set", "replica.lag.time.max.ms=1500",
                                 "--set", "segment.bytes=4096", "--set", "min.insync.replicas=2"])
    assert c.advertise == ("127.0.0.1", 9092)
    assert c.replica_lag_time_max_ms == 1500 and c.min_insync_replicas == 2
    assert c.broker_heartbeat_interval_ms == 500 and c.replica_fetch_wait_max_ms == 500
    assert c.log_config_overrides({"retention.ms": "5", "min.insync.replicas": "3"}) == {
        "segment.bytes": "4096", "max.message.bytes": "1048588", "retention.ms": "5"}
    assert c.min_insync_replicas_for({"min.insync.replicas": "3"}) == 3


def test_scrub_settings():
    c = config_from_args(BASE)
    assert c.log_scrub_bytes_per_second == 1 << 20 and c.log_scrub_interval_ms == 3_600_000
    c = config_from_args(BASE + ["--set", "log.scrub.bytes.per.second=0",
                                 "--set", "log.scrub.interval.ms=60000"])
    assert c.log_scrub_bytes_per_second == 0 and c.log_scrub_interval_ms == 60_000


def test_broker_rack_setting():
    assert config_from_args(BASE).broker_rack == ""
    assert config_from_args(BASE + ["--set", "broker.rack=us-east-1a"]).broker_rack == "us-east-1a"


@pytest.mark.parametrize("setting", ["no.such.thing=1", "broker.rack=two words",
                                     "broker.rack=" + "r" * 65, "segment.bytes=abc",
                                     "min.insync.replicas=0", "segment.bytes=1", "novalue",
                                     "log.scrub.bytes.per.second=-1", "log.scrub.interval.ms=-5",
                                     "log.scrub.bytes.per.second=fast",
                                     "max.connections=0", "connections.max.idle.ms=0",
                                     "connections.max.idle.ms=3000000000"])
def test_config_rejects_bad_settings(setting):
    with pytest.raises(ConfigError):
        config_from_args(BASE + ["--set", setting])


def test_unknown_setting_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "tidewater.broker", *BASE, "--set", "bogus.name=1"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "bogus.name" in proc.stderr


def test_bad_host_port():
    with pytest.raises(ConfigError):
        config_from_args(["--broker-id", "1", "--listen", "nohost", "--controller", "h:1",
                          "--data-dir", "/tmp/x"])
    with pytest.raises(ConfigError):
        BrokerConfig(broker_id=-1, listen=("h", 1), controller=("h", 2),
                     data_dir="/tmp").validate()


class _FakeReplica:
    def __init__(self):
        self.withdrawn = []

    def withdraw_wait(self, waiter_id):
        self.withdrawn.append(waiter_id)


class _FakePartition:
    def __init__(self):
        self.replica = _FakeReplica()


async def test_acks_waits_answer_whoever_attaches_once():
    # The core decides outcomes (Ready.completed); the registry only delivers them.
    deadlines = []
    waits = AcksWaits(on_deadline=deadlines.append)
    partition = _FakePartition()
    answers = []
    early = waits.open(partition, 2000)
    late = waits.open(partition, 2000)
    assert early.waiter_id != late.waiter_id and waits.pending() == 2
    waits.complete(early.waiter_id, pb.NONE)  # decided before anyone attached (RF=1)
    waits.attach(early, lambda code: answers.append(("early", code)))
    waits.attach(late, lambda code: answers.append(("late", code)))
    assert answers == [("early", pb.NONE)]
    waits.complete(late.waiter_id, pb.NOT_LEADER_OR_FOLLOWER)
    waits.complete(late.waiter_id, pb.NONE)  # a second outcome is never delivered
    assert answers == [("early", pb.NONE), ("late", pb.NOT_LEADER_OR_FOLLOWER)]
    assert waits.pending() == 0 and deadlines == []


async def test_acks_waits_timer_is_the_cores_capped_deadline():
    # The timer fires at the core's deadline (acks_all_wait_ms: the request's timeout,
    # at most ACKS_ALL_WAIT_MS_MAX), not at whatever a client asked for.
    waits = AcksWaits(on_deadline=lambda wait: None)
    loop = asyncio.get_running_loop()
    armed_at_s = loop.time()
    huge = waits.open(_FakePartition(), 10**9)
    negative = waits.open(_FakePartition(), -5)
    cap_s = ACKS_ALL_WAIT_MS_MAX / 1000
    assert cap_s < huge.timer.when() - armed_at_s < cap_s + 1
    assert negative.timer.when() - armed_at_s < 1
    for wait in (huge, negative):
        waits.complete(wait.waiter_id, pb.NONE)


async def test_acks_waits_withdraw_tells_the_core_and_answers_nobody():
    waits = AcksWaits(on_deadline=lambda wait: None)
    partition = _FakePartition()
    answers = []
    wait = waits.open(partition, 2000)
    waits.attach(wait, answers.append)
    waits.withdraw(wait)
    waits.complete(wait.waiter_id, pb.NONE)
    assert answers == [] and partition.replica.withdrawn == [wait.waiter_id]
    assert waits.pending() == 0


async def test_acks_waits_deadline_asks_the_core_and_wait_for_returns_its_code():
    waits = None

    def on_deadline(wait):  # the core would answer REQUEST_TIMED_OUT
        waits.complete(wait.waiter_id, pb.REQUEST_TIMED_OUT)

    waits = AcksWaits(on_deadline=on_deadline)
    wait = waits.open(_FakePartition(), 10)
    assert await asyncio.wait_for(waits.wait_for(wait), 5) == pb.REQUEST_TIMED_OUT
    assert waits.pending() == 0


async def test_fetch_waiters_wake_on_any_key():
    waiters = FetchWaiters()
    fut = waiters.watch(["a", "b"])
    waiters.notify("c")
    assert not fut.done()
    waiters.notify("b")
    assert fut.done() and fut.result() == "b"
    waiters.discard(fut)
    assert waiters.waiting() == 0


async def test_fetch_waiters_wake_consumers_on_high_watermark_followers_on_append():
    waiters = FetchWaiters()
    consumer = waiters.watch(["a"])
    follower = waiters.watch(["a"], follower=True)
    assert waiters.waiting() == 2
    waiters.notify_high_watermark("a")
    assert consumer.done() and not follower.done()
    waiters.discard(consumer)
    consumer = waiters.watch(["a"])
    waiters.notify_append("a")
    assert follower.result() == "a" and not consumer.done()
    waiters.discard(follower)
    follower = waiters.watch(["a"], follower=True)
    waiters.notify("a")  # a leadership change wakes both kinds
    assert consumer.done() and follower.done()
    waiters.discard(consumer)
    waiters.discard(follower)
    assert waiters.waiting() == 0
    parked = [waiters.watch(["a", "b"], follower=True), waiters.watch(["b"])]
    waiters.notify_all()
    assert all(f.done() for f in parked)
    for f in parked:
        waiters.discard(f)
    assert waiters.waiting() == 0


def _update(epoch, topics=("t",)):
    return pb.UpdateMetadataRequest(
        controller_id=0, controller_epoch=epoch, cluster_id="c1",
        brokers=[pb.BrokerRegistration(broker_id=1, broker_epoch=3, listeners=[
            pb.Listener(name="INTERNAL", host="10.0.0.1", port=1),
            pb.Listener(name="EXTERNAL", host="ext.example", port=2)]),
            pb.BrokerRegistration(broker_id=2, broker_epoch=4, fenced=True, listeners=[
                pb.Listener(name="INTERNAL", host="10.0.0.2", port=1)])],
        partitions=[pb.PartitionState(topic=t, partition=0, leader=1, leader_epoch=2,
                                      partition_epoch=2, replicas=[1, 2], isr=[1])
                    for t in topics])


def test_metadata_cache_listener_addresses_and_unknown_topics():
    cache = MetadataCache()
    cache.update(_update(2))
    internal = cache.metadata_response([], "INTERNAL")
    external = cache.metadata_response(["t", "missing"], "EXTERNAL")
    assert [(b.broker_id, b.host) for b in internal.brokers] == [(1, "10.0.0.1")]
    assert [(b.broker_id, b.host, b.port) for b in external.brokers] == [(1, "ext.example", 2)]
    t, missing = external.topics
    assert t.error_code == pb.NONE and t.partitions[0].leader == 1
    assert list(t.partitions[0].offline_replicas) == [2]
    assert missing.error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(StaleControllerEpochError):
        cache.update(_update(1))


def test_taken_port_exits_1_with_a_clear_message(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tidewater.broker", "--broker-id", "1", "--listen", f"127.0.0.1:{port}",
             "--controller", "127.0.0.1:1", "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_corrupt_partition_metadata_exits_1_naming_the_file_and_changes_nothing(tmp_path):
    """Which incarnation the log is cannot be told: the broker refuses to start (as Kafka
    fails the log dir) rather than serve or delete it."""
    (tmp_path / "orders-0").mkdir()
    metadata = tmp_path / "orders-0" / "partition.metadata"
    metadata.write_text("version: 0\ntopic_id: not-an-id\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tidewater.broker", "--broker-id", "1", "--listen", "127.0.0.1:0",
         "--controller", "127.0.0.1:1", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("tide-broker:")]
    assert len(line) == 1 and f"{metadata}:2" in line[0], proc.stderr
    assert metadata.read_text() == "version: 0\ntopic_id: not-an-id\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orders-0"]
