"""Bit rot found by a real broker's reads (issue 14, bug 6).

A broker stopped cleanly, one byte flipped in the middle of a closed segment
(where recovery trusts the files: below the last index entry), the broker started
again. With a healthy in-sync copy elsewhere the rotten replica hands its
leadership over, truncates below the damaged batch and fetches the rest again,
and a consumer reads every record (``test_a_rotten_leader_hands_over...``). With
no healthy copy (RF 1) a consumer gets every record before the damaged batch,
then CORRUPT_MESSAGE at it. Either way the broker logs the damaged batch once at
ERROR and counts it in ``tidewater_broker_corrupt_batches_total{how}``.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.conftest import ROOT, fetch, free_port, produce, wait_for
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import decode_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC_CONFIGS = {"segment.bytes": "3000", "index.interval.bytes": "300"}
# The scrub would find the damaged batch first (its first pass starts with the broker):
# off where a test says which read finds it.
NO_SCRUB = {"log.scrub.bytes.per.second": "0"}


def damage_a_trusted_batch(data_dir) -> tuple[str, int, int]:
    """Flip one byte in the records of a batch below the last index entry of a middle
    segment of bits-0; (path, position, base offset) of that batch."""
    log_dir = data_dir / "bits-0"
    segments = sorted(log_dir.glob("*.log"))
    assert len(segments) >= 4, segments
    path = segments[len(segments) // 2]
    index = path.with_suffix(".index").read_bytes()
    assert len(index) >= 16, "the segment has index entries"
    last_entry_position = struct.unpack_from(">ii", index, len(index) - 8)[1]
    content = bytearray(path.read_bytes())
    victims = [(position, header) for position, header in iter_batches(bytes(content))
               if position + header.size <= last_entry_position and position > 0]
    position, header = victims[len(victims) // 2]
    content[position + header.size - 3] ^= 0x20  # inside the last record's value
    path.write_bytes(bytes(content))
    return str(path), position, header.base_offset


def test_consumer_gets_the_records_before_a_damaged_batch_then_corrupt_message(cluster):
    metrics_port = free_port()
    c = cluster(1, broker_settings=NO_SCRUB,
                extra_args=lambda broker_id: ["--metrics-port", str(metrics_port)])
    broker = c.brokers[1]
    c.create_topic("bits", replication_factor=1, configs=TOPIC_CONFIGS)
    values = [b"value-%03d-" % i + b"x" * 80 for i in range(120)]
    for value in values:  # one batch each
        assert produce(broker, "bits", [value], acks=1).error_code == pb.NONE
    assert broker.proc.terminate() == 0
    assert (broker.data_dir / ".kafka_cleanshutdown").exists()
    path, position, bad_offset = damage_a_trusted_batch(broker.data_dir)
    broker.reset_channel()
    broker.proc.start()
    c.wait_leader_ready("bits")

    got, offset = [], 0
    while True:
        answer = fetch(broker, "bits", offset, max_bytes=4096)
        if answer.error_code != pb.NONE:
            break
        assert answer.records, "an empty answer below the damaged batch"
        records = [r for r in decode_records(answer.records) if r.offset >= offset]
        got += records
        offset = records[-1].offset + 1
    assert pb.ErrorCode.Name(answer.error_code) == "CORRUPT_MESSAGE"
    assert offset == bad_offset
    assert [r.value for r in got] == values[:bad_offset]
    # Asking again (a consumer retrying) gets the same answer, and no new log line.
    assert fetch(broker, "bits", bad_offset).error_code == pb.CORRUPT_MESSAGE

    # What a user runs: `tide consume --from-beginning` prints every record before it.
    consume = subprocess.run(
        [sys.executable, "-m", "tidewater.tools", "--bootstrap-server", broker.address,
         "consume", "bits", "--from-beginning", "--timeout-ms", "10000"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert consume.stdout.splitlines() == [v.decode() for v in values[:bad_offset]]
    assert consume.returncode != 0 and "CORRUPT_MESSAGE" in consume.stderr

    log_text = broker.proc.log_path.read_text()
    lines = [line for line in log_text.splitlines() if "corrupt batch in" in line]
    assert len(lines) == 1, lines
    assert "ERROR" in lines[0]
    assert f"{path} at position {position}, base offset {bad_offset}, found by consumer read" \
        in lines[0]

    def scrape() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                      timeout=2).read().decode()

    text = wait_for(scrape, message="metrics served")
    assert 'tidewater_broker_corrupt_batches_total{how="consumer_read"} 1.0' in text
    assert 'tidewater_broker_corrupt_batches_total{how="follower_read"} 0.0' in text


def test_follower_fetch_stops_before_a_damaged_batch_on_the_leader(cluster):
    """A follower that lost its disk fetches everything again from a leader whose log
    rotted meanwhile: it gets every batch before the damaged one and never the damaged
    bytes; the leader logs and counts it once as found by a follower read."""
    metrics_ports = {1: free_port(), 2: free_port()}
    c = cluster(2, broker_settings=NO_SCRUB,
                extra_args=lambda broker_id: ["--metrics-port", str(metrics_ports[broker_id])])
    c.create_topic("bits", replication_factor=2, configs=TOPIC_CONFIGS, via=1)
    leader = c.wait_leader_ready("bits", isr_size=2)
    values = [b"value-%03d-" % i + b"x" * 80 for i in range(120)]
    for value in values:
        assert produce(leader, "bits", [value], acks=-1).error_code == pb.NONE
    follower = c.brokers[3 - leader.broker_id]
    follower.proc.kill()
    shutil.rmtree(follower.data_dir)
    # Rot under the running leader: its reads see the changed page.
    _path, _position, bad_offset = damage_a_trusted_batch(leader.data_dir)
    follower.reset_channel()
    follower.proc.start()
    wait_for(lambda: "found by follower read" in leader.proc.log_path.read_text(),
             message="the leader found the damaged batch")
    wait_for(lambda: follower.replica("bits").log_end_offset == bad_offset,
             message="the follower holds every batch before the damaged one")
    follower_log = follower.data_dir / "bits-0"
    held = b"".join(p.read_bytes() for p in sorted(follower_log.glob("*.log")))
    assert [r.value for r in decode_records(held)] == values[:bad_offset]
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_ports[leader.broker_id]}/metrics",
                                  timeout=2).read().decode()
    assert 'tidewater_broker_corrupt_batches_total{how="follower_read"} 1.0' in text
    lines = [line for line in leader.proc.log_path.read_text().splitlines()
             if "corrupt batch in" in line]
    assert len(lines) == 1, lines


def test_a_rotten_leader_hands_over_and_consumers_get_every_record(cluster):
    """The issue's scenario: 3 brokers, RF 3, the cluster stopped cleanly, one byte flipped
    in the middle of the preferred leader's .log, the cluster started again. The leader
    skips recovery (clean shutdown) and leads again; the consumer's read finds the bad
    batch: the leader logs it at ERROR, leaves the ISR and gives its leadership to a
    healthy member, and `tide consume --from-beginning` prints every record. The rotten
    replica truncates below the bad batch, fetches the rest again and ends up holding
    exactly the records the others hold."""
    c = cluster(3)
    c.create_topic("bits", replication_factor=3, configs=TOPIC_CONFIGS)
    leader = c.wait_leader_ready("bits", isr_size=3)
    preferred = c.partition_state("bits").replicas[0]
    values = [b"value-%03d-" % i + b"x" * 80 for i in range(120)]
    for value in values:  # one batch each
        assert produce(leader, "bits", [value], acks=-1).error_code == pb.NONE
    for broker in c.brokers.values():
        assert broker.proc.terminate() == 0
        assert (broker.data_dir / ".kafka_cleanshutdown").exists()
    rotten = c.brokers[preferred]
    path, _position, bad_offset = damage_a_trusted_batch(rotten.data_dir)
    for broker in c.brokers.values():
        broker.reset_channel()
        broker.proc.start()
    c.wait_registered(c.brokers)

    def preferred_leads():  # the preferred leader election brings it back
        state = c.partition_state("bits")
        return (state.leader == preferred and len(state.isr) == 3
                and c.wait_leader_ready("bits").broker_id == preferred)
    wait_for(preferred_leads, 30, message="the rotten preferred replica leads again")

    bootstrap = ",".join(b.address for b in c.brokers.values())
    consume = subprocess.run(
        [sys.executable, "-m", "tidewater.tools", "--bootstrap-server", bootstrap, "consume",
         "bits", "--from-beginning", "--timeout-ms", "30000", "--max-messages", str(len(values))],
        capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert consume.stdout.splitlines() == [v.decode() for v in values], consume.stderr[-2000:]

    log_text = rotten.proc.log_path.read_text()
    found = [line for line in log_text.splitlines() if "corrupt batch in" in line]
    assert len(found) == 1 and "ERROR" in found[0] and path in found[0], found
    assert f"the batch at offset {bad_offset} of this replica is corrupt" in log_text

    def healed():  # back in sync, from clean copies of every batch
        info = rotten.replica("bits")
        state = c.partition_state("bits")
        return (info is not None and info.log_end_offset == len(values)
                and preferred in state.isr)
    wait_for(healed, 30, message="the rotten replica fetched the rest again and rejoined")
    held = b"".join(p.read_bytes() for p in sorted((rotten.data_dir / "bits-0").glob("*.log")))
    assert [r.value for r in decode_records(held)] == values  # every CRC checks
