"""The five replication scenarios at the end of replication.md, on 2-broker clusters.

Bounces are SIGTERM + restart (controlled shutdown); "stop" with an unclean
shutdown is SIGKILL. Logs are compared on disk (segments, epoch checkpoints).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import consume_all, produce, wait_for
from tidewater.broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT, read_epoch_checkpoint
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches

# Process restarts are slow on a loaded machine: more room than the default 120 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "s"


def partition_dir(broker, topic: str = TOPIC, partition: int = 0) -> Path:
    return broker.data_dir / f"{topic}-{partition}"


def epochs(broker) -> list[tuple[int, int]]:
    return read_epoch_checkpoint(partition_dir(broker) / LEADER_EPOCH_CHECKPOINT)


def segments(broker) -> list[Path]:
    return sorted(partition_dir(broker).glob("*.log"))


def batch_crcs(broker) -> list[tuple[int, int]]:
    """(base offset, CRC) of every batch on disk, in order."""
    out = []
    for seg in segments(broker):
        data = seg.read_bytes()
        out += [(h.base_offset, h.crc) for _, h in iter_batches(data, validate=False)]
    return out


def write(c, values: list[bytes], acks: int = -1) -> None:
    for v in values:
        leader = c.wait_leader_ready(TOPIC)
        r = produce(leader, TOPIC, [v], acks=acks)
        assert r.error_code == pb.NONE, pb.ErrorCode.Name(r.error_code)


def bounce(c, broker) -> None:
    assert broker.proc.terminate() == 0
    broker.reset_channel()
    broker.proc.start()


def wait_in_sync(c, leo: int, timeout_s: float = 20) -> None:
    def synced():
        state = c.partition_state(TOPIC)
        return (len(state.isr) == 2 and all(
            b.replica(TOPIC) is not None and b.replica(TOPIC).log_end_offset == leo
            for b in c.brokers.values()))
    wait_for(synced, timeout_s, message=f"both replicas in the ISR at LEO {leo}")


def other(c, broker):
    return c.brokers[3 - broker.broker_id]


def test_scenario_1_basic_epochs(cluster):
    c = cluster(2)
    c.create_topic(TOPIC, replication_factor=2)
    leader = c.wait_leader_ready(TOPIC, isr_size=2)
    first_epoch = leader.replica(TOPIC).leader_epoch
    write(c, [b"1"])
    assert epochs(leader) == [(first_epoch, 0)]
    bounce(c, other(c, leader))  # the follower
    wait_in_sync(c, 1)
    write(c, [b"2"])
    wait_in_sync(c, 2)
    leader = c.wait_leader_ready(TOPIC)
    assert epochs(leader) == epochs(other(c, leader))
    before = epochs(leader)
    bounce(c, leader)  # the leader: leadership moves, a new epoch starts at offset 2
    wait_in_sync(c, 2)
    new_leader = c.wait_leader_ready(TOPIC)
    new_epoch = new_leader.replica(TOPIC).leader_epoch
    assert new_epoch > before[-1][0]
    write(c, [b"3"])
    wait_in_sync(c, 3)
    final = epochs(new_leader)
    assert final == before + [(new_epoch, 2)]
    wait_for(lambda: epochs(other(c, new_leader)) == final, message="follower epoch cache")


def _kill_follower_then_leader(c):
    leader = c.wait_leader_ready(TOPIC)
    follower = other(c, leader)
    follower.proc.kill()
    wait_for(lambda: list(c.partition_state(TOPIC).isr) == [leader.broker_id], timeout_s=15,
             message="ISR shrunk to the leader")
    leader.proc.kill()
    return leader, follower


def _cut_segment(broker, keep_bytes) -> None:
    (seg,) = segments(broker)
    with open(seg, "r+b") as f:
        f.truncate(keep_bytes)
        os.fsync(f.fileno())


def _restart_and_converge(c, survivor, cut_off, more_values, batch):
    survivor.reset_channel()
    survivor.proc.start()
    wait_for(lambda: c.partition_state(TOPIC).leader == survivor.broker_id, timeout_s=20,
             message="the cut broker leads")
    c.wait_leader_ready(TOPIC)
    for v in more_values:
        r = produce(survivor, TOPIC, batch(v), acks=1)
        assert r.error_code == pb.NONE, pb.ErrorCode.Name(r.error_code)
    cut_off.reset_channel()
    cut_off.proc.start()
    leo = survivor.replica(TOPIC).log_end_offset
    wait_in_sync(c, leo)
    return leo


def test_scenario_2_no_divergent_logs(cluster):
    c = cluster(2)
    c.create_topic(TOPIC, replication_factor=2)
    write(c, [b"%d" % i for i in range(10)])
    wait_in_sync(c, 10)
    leader, follower = _kill_follower_then_leader(c)
    positions = [p for p, _ in iter_batches(segments(leader)[0].read_bytes(), validate=False)]
    _cut_segment(leader, positions[5])  # the last 5 single-record batches are gone
    leo = _restart_and_converge(c, leader, follower, [b"n%d" % i for i in range(9)],
                                lambda v: [v])
    assert leo == 14
    assert [s.stat().st_size for s in segments(leader)] == \
        [s.stat().st_size for s in segments(follower)]
    assert batch_crcs(leader) == batch_crcs(follower)


def test_scenario_3_offsets_never_go_backwards(cluster):
    c = cluster(2)
    c.create_topic(TOPIC, replication_factor=2)
    for i in range(10):
        leader = c.wait_leader_ready(TOPIC)
        r = produce(leader, TOPIC, [b"b%d-%d" % (i, j) for j in range(20)], acks=-1)
        assert r.error_code == pb.NONE
    wait_in_sync(c, 200)
    leader, follower = _kill_follower_then_leader(c)
    size = segments(leader)[0].stat().st_size
    _cut_segment(leader, size // 2)  # a torn batch in the middle
    _restart_and_converge(c, leader, follower, range(5),
                          lambda v: [b"m%d-%d" % (v, j) for j in range(20)])
    offsets = [o for o, _ in consume_all(c.wait_leader_ready(TOPIC), TOPIC)]
    assert offsets == list(range(len(offsets)))
    assert batch_crcs(leader) == batch_crcs(follower)


def test_scenario_4_fast_leader_changes(cluster):
    c = cluster(2)
    c.create_topic(TOPIC, replication_factor=2)
    written = 0
    for round_ in range(5):
        write(c, [b"r%d" % round_])
        written += 1
        wait_in_sync(c, written)
        leader = c.wait_leader_ready(TOPIC)
        bounce(c, other(c, leader))
        wait_in_sync(c, written)
        bounce(c, c.wait_leader_ready(TOPIC))
        wait_in_sync(c, written)
        assert {b.replica(TOPIC).log_end_offset for b in c.brokers.values()} == {written}
    assert [v for _, v in consume_all(c.wait_leader_ready(TOPIC), TOPIC)] == \
        [b"r%d" % i for i in range(5)]


def test_scenario_5_unclean_elections_converge(cluster):
    c = cluster(2, controller_settings={"unclean.leader.election.enable": "true"})
    c.create_topic(TOPIC, replication_factor=2,
                   configs={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"})
    write(c, [b"both"], acks=1)
    wait_in_sync(c, 1)
    a = c.wait_leader_ready(TOPIC)
    b = other(c, a)
    for round_ in range(3):
        # b goes down; a writes alone; a goes down; b comes back and is elected uncleanly.
        b.proc.kill()
        wait_for(lambda a=a: list(c.partition_state(TOPIC).isr) == [a.broker_id], timeout_s=15,
                 message="ISR without the dead broker")
        c.wait_leader_ready(TOPIC)
        for i in range(3):
            assert produce(a, TOPIC, [b"a%d-%d" % (round_, i)], acks=1).error_code == pb.NONE
        a.proc.kill()
        b.reset_channel()
        b.proc.start()
        wait_for(lambda b=b: c.partition_state(TOPIC).leader == b.broker_id, timeout_s=20,
                 message="unclean election of the restarted broker")
        c.wait_leader_ready(TOPIC)
        for i in range(2):
            assert produce(b, TOPIC, [b"b%d-%d" % (round_, i)], acks=1).error_code == pb.NONE
        a.reset_channel()
        a.proc.start()
        leo = b.replica(TOPIC).log_end_offset
        wait_in_sync(c, leo)
        a, b = b, a  # alternate which broker is down
    for broker in c.brokers.values():
        assert broker.proc.terminate() == 0
    crcs = batch_crcs(c.brokers[1])
    assert crcs == batch_crcs(c.brokers[2])
    # Epochs that hold records agree; a leader may also hold an empty newest epoch.
    leo = crcs[-1][0] + 1
    assert [e for e in epochs(c.brokers[1]) if e[1] < leo] == \
        [e for e in epochs(c.brokers[2]) if e[1] < leo]
