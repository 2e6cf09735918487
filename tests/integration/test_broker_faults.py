"""Failures of real broker processes: SIGKILL, SIGSTOP/SIGCONT, SIGTERM, min.insync.replicas."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request

import grpc
import pytest

from tests.integration.conftest import consume_all, fetch, free_port, produce, wait_for
from tidewater.proto import tidewater_pb2 as pb

# Process restarts are slow on a loaded machine: more room than the default 120 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class AckedProducer(threading.Thread):
    """Writes numbered values with acks=all to whoever leads; remembers what was acknowledged."""

    def __init__(self, cluster, topic: str):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.acked: set[bytes] = set()
        self.errors: list[int] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            value = f"v{n}".encode()
            try:
                leader = self.cluster.leader(self.topic)
                r = produce(leader, self.topic, [value], acks=-1, timeout_ms=2000)
                if r.error_code == pb.NONE:
                    self.acked.add(value)
                    n += 1
                else:
                    self.errors.append(r.error_code)
                    time.sleep(0.05)
            except (grpc.RpcError, AssertionError, KeyError):
                time.sleep(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(15)


def test_leader_sigkill_during_acks_all_loses_nothing_acknowledged(cluster):
    c = cluster(2)
    c.create_topic("k", replication_factor=2)
    c.wait_leader_ready("k", isr_size=2)
    producer = AckedProducer(c, "k")
    producer.start()
    wait_for(lambda: len(producer.acked) >= 30, message="30 acknowledged writes")
    old = c.leader("k")
    old.proc.kill()
    survivor = c.brokers[3 - old.broker_id]
    wait_for(lambda: c.partition_state("k").leader == survivor.broker_id, message="failover")
    c.wait_leader_ready("k")
    acked_at_kill = len(producer.acked)
    wait_for(lambda: len(producer.acked) >= acked_at_kill + 20, message="writes after failover")
    old.proc.start()  # the old leader comes back as a follower and truncates
    wait_for(lambda: len(c.partition_state("k").isr) == 2, timeout_s=20, message="ISR of 2")
    producer.stop()
    leader = c.wait_leader_ready("k")
    # A new leader's HW catches up once its followers fetch in its epoch.
    wait_for(lambda: leader.replica("k").high_watermark == leader.replica("k").log_end_offset,
             message="HW reaches the LEO")
    values = [v for _, v in consume_all(leader, "k")]
    assert producer.acked <= set(values), producer.acked - set(values)
    offsets = [o for o, _ in consume_all(leader, "k")]
    assert offsets == sorted(set(offsets))
    # Both replicas converge to the same log.
    other = c.brokers[3 - leader.broker_id]
    wait_for(lambda: other.replica("k").log_end_offset == leader.replica("k").log_end_offset,
             message="replicas converge")


def test_follower_sigstop_leaves_isr_and_rejoins(cluster):
    c = cluster(2)
    c.create_topic("s", replication_factor=2)
    leader = c.wait_leader_ready("s", isr_size=2)
    follower = c.brokers[3 - leader.broker_id]
    follower.proc.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: list(c.partition_state("s").isr) == [leader.broker_id], timeout_s=15,
                 message="follower out of the ISR")
        # With the ISR shrunk, acks=all commits on the leader alone.
        assert produce(leader, "s", [b"alone"], acks=-1).error_code == pb.NONE
    finally:
        follower.proc.signal(signal.SIGCONT)
    wait_for(lambda: len(c.partition_state("s").isr) == 2, timeout_s=20, message="rejoined ISR")
    leader = c.wait_leader_ready("s")
    assert produce(leader, "s", [b"together"], acks=-1).error_code == pb.NONE
    other = c.brokers[3 - leader.broker_id]
    wait_for(lambda: other.replica("s").log_end_offset == 2, message="follower caught up")
    metrics_isr = leader.replica("s").isr
    assert sorted(metrics_isr) == [1, 2]


def test_min_insync_replicas_rejects_acks_all_and_writes_nothing(cluster):
    c = cluster(2, controller_settings={"min.insync.replicas": "2"})
    c.create_topic("m", replication_factor=2, configs={"min.insync.replicas": "2"})
    leader = c.wait_leader_ready("m", isr_size=2)
    assert produce(leader, "m", [b"ok"], acks=-1).error_code == pb.NONE
    follower = c.brokers[3 - leader.broker_id]
    follower.proc.kill()
    wait_for(lambda: len(c.partition_state("m").isr) == 1, timeout_s=15, message="ISR shrink")
    leader = c.wait_leader_ready("m")
    wait_for(lambda: list(leader.replica("m").isr) == [leader.broker_id],
             message="leader applied the shrink")
    leo = leader.replica("m").log_end_offset
    r = produce(leader, "m", [b"rejected"], acks=-1)
    assert r.error_code == pb.NOT_ENOUGH_REPLICAS and r.base_offset == -1
    assert leader.replica("m").log_end_offset == leo
    # acks=1 still works (min ISR applies to acks=all only).
    assert produce(leader, "m", [b"one"], acks=1).error_code == pb.NONE


def test_paused_old_leader_cannot_expose_a_write_that_vanishes(cluster):
    c = cluster(2)
    c.create_topic("p", replication_factor=2)
    old = c.wait_leader_ready("p", isr_size=2)
    assert produce(old, "p", [b"committed"], acks=-1).error_code == pb.NONE
    new = c.brokers[3 - old.broker_id]
    wait_for(lambda: new.replica("p").log_end_offset == 1, message="follower has the record")
    old.proc.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: c.partition_state("p").leader == new.broker_id, timeout_s=15,
                 message="new leader elected")
        c.wait_leader_ready("p")
        assert produce(new, "p", [b"new-epoch"], acks=1).error_code == pb.NONE
    finally:
        old.proc.signal(signal.SIGCONT)
    # The resumed old leader still believes it leads for a moment: whatever it
    # accepts there must never be visible to a consumer.
    seen_on_old: list[bytes] = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            r = produce(old, "p", [b"stale"], acks=1, timeout_ms=500)
            if r is not None and r.error_code != pb.NONE:
                break
            p = fetch(old, "p", 0)
            if p.error_code == pb.NONE:
                from tidewater.proto.records import decode_records
                seen_on_old += [rec.value for rec in decode_records(p.records)]
        except grpc.RpcError:
            pass
    wait_for(lambda: not old.replica("p").is_leader, message="old leader stepped down")
    assert b"stale" not in seen_on_old
    wait_for(lambda: old.replica("p").log_end_offset == new.replica("p").log_end_offset,
             message="old leader truncated and caught up")
    final = [v for _, v in consume_all(c.wait_leader_ready("p"), "p")]
    assert final[:2] == [b"committed", b"new-epoch"] and b"stale" not in final


def test_sigterm_is_a_controlled_shutdown(cluster):
    c = cluster(2)
    c.create_topic("t", replication_factor=2)
    leader = c.wait_leader_ready("t", isr_size=2)
    assert produce(leader, "t", [b"x"], acks=-1).error_code == pb.NONE
    assert leader.proc.terminate() == 0
    assert (leader.data_dir / ".kafka_cleanshutdown").exists()
    state = c.partition_state("t")
    assert state.leader == 3 - leader.broker_id  # leadership moved before the exit
    new_leader = c.wait_leader_ready("t")
    assert [v for _, v in consume_all(new_leader, "t")] == [b"x"]


def test_metrics_endpoint(cluster):
    port = free_port()
    c = cluster(1, extra_args=lambda broker_id: ["--metrics-port", str(port)])
    b = c.brokers[1]
    c.create_topic("mt", replication_factor=1)
    assert produce(b, "mt", [b"a", b"b"], acks=1).error_code == pb.NONE

    def scrape():
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()

    text = wait_for(lambda: "tidewater_broker_replica_log_end_offset" in scrape() and scrape(),
                    message="metrics served")
    assert 'tidewater_broker_replica_log_end_offset{broker="1",partition="0",topic="mt"} 2.0' in text
    assert "tidewater_broker_messages_in_total 2.0" in text
    assert 'tidewater_broker_request_latency_seconds_count{rpc="Produce"}' in text
    assert "tidewater_broker_leader_elections_total 1.0" in text
    assert "tidewater_broker_under_replicated_partitions" in text
