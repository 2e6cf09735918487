"""Config parsing, purgatory wake-ups and the metadata cache of the broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tidewater.broker.config import BrokerConfig, ConfigError, config_from_args
from tidewater.broker.metadata_cache import MetadataCache
from tidewater.broker.purgatory import FetchWaiters, ProducePurgatory
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


@pytest.mark.parametrize("setting", ["no.such.thing=1", "segment.bytes=abc",
                                     "min.insync.replicas=0", "segment.bytes=1", "novalue",
                                     "log.scrub.bytes.per.second=-1", "log.scrub.interval.ms=-5",
                                     "log.scrub.bytes.per.second=fast"])
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


async def test_produce_purgatory_completes_in_offset_order():
    purgatory = ProducePurgatory()
    hw = {"v": 0}

    def result(required):
        return pb.NONE if hw["v"] >= required else None

    a = asyncio.create_task(purgatory.wait("tp", 3, 2000, result))
    b = asyncio.create_task(purgatory.wait("tp", 5, 2000, result))
    await asyncio.sleep(0)
    assert purgatory.pending("tp") == 2
    hw["v"] = 4
    assert purgatory.try_complete("tp", result) == 1
    assert await a == pb.NONE and not b.done()
    assert purgatory.fail_all("tp", pb.NOT_LEADER_OR_FOLLOWER) == 1
    assert await b == pb.NOT_LEADER_OR_FOLLOWER
    assert purgatory.pending() == 0


async def test_produce_purgatory_timeout_and_immediate():
    purgatory = ProducePurgatory()
    assert await purgatory.wait("tp", 1, 10, lambda r: None) == pb.REQUEST_TIMED_OUT
    assert purgatory.pending() == 0
    assert await purgatory.wait("tp", 1, 10, lambda r: pb.NONE) == pb.NONE


async def test_produce_purgatory_watch_calls_back_once():
    purgatory = ProducePurgatory()
    hw = {"v": 0}
    answers = []

    def result(required):
        return pb.NONE if hw["v"] >= required else None

    def watch(required, timeout_ms=2000):
        return purgatory.watch("tp", required, timeout_ms, result,
                               lambda code: answers.append((required, code)))

    watch(3)
    watch(5)
    withdraw_7 = watch(7)
    assert purgatory.pending("tp") == 3 and answers == []
    hw["v"] = 4
    assert purgatory.try_complete("tp", result) == 1
    assert answers == [(3, pb.NONE)]  # synchronously, from try_complete
    withdraw_7()
    assert purgatory.pending("tp") == 1
    assert purgatory.fail_all("tp", pb.NOT_LEADER_OR_FOLLOWER) == 1
    assert answers == [(3, pb.NONE), (5, pb.NOT_LEADER_OR_FOLLOWER)]
    assert purgatory.pending() == 0
    watch(2)  # known at once
    assert answers[-1] == (2, pb.NONE) and purgatory.pending() == 0
    watch(9, timeout_ms=10)
    await asyncio.sleep(0.05)
    assert answers[-1] == (9, pb.REQUEST_TIMED_OUT) and purgatory.pending() == 0
    await asyncio.sleep(0.05)
    assert len(answers) == 4  # withdrawn 7 never answered


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
