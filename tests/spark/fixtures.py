"""Fixture dumps for the audit tests, written by the project's own log writer.

``build_dump(root)`` writes three brokers' data dirs (``root/broker-1..3``)
through broker/storage (``LogManager`` + ``Log.append_as_follower`` with
batches from proto/records.py ``encode_batch``), so segments, indexes, epoch
checkpoints and offset checkpoints are exactly what a broker leaves. It also
writes an ack log (as ``tide produce --ack-log`` does) and metrics scrape
files (as ``tide metrics scrape`` does).

Topic ``orders`` (2 partitions) is healthy but not trivial: broker 3 lags on
partition 0 (its log ends below the HW) and broker 2 holds an uncommitted
batch above the HW on partition 1. With ``damaged=True`` one extra topic per
kind of damage is added, each with one partition on all three brokers and
exactly one thing broken; DAMAGE maps each topic to the one rule that must
catch it.

Every replica has a ``partition.metadata`` with its topic's ID. The damaged
dump also holds ``reborn``: broker 3 still has an older incarnation of it (its
own topic ID, one batch different), which no rule may report, since replicas
are compared only within one topic ID; and ``reborn-noid``, the same written
before topic IDs (no ``partition.metadata``), which replicas_agree_below_hw
must catch because nothing tells the incarnations apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.storage.log_config import LogConfig
from tidewater.broker.storage.log_manager import LogManager
from tidewater.broker.storage.topics import TopicPartition
from tidewater.proto.records import encode_batch

BROKERS = (1, 2, 3)
BASE_TIMESTAMP_MS = 1_700_000_000_000
NOW_MS = BASE_TIMESTAMP_MS + 60_000
SCRAPES = 10

# Damage topic -> the rule that must catch it (and no other rule may fire for it).
DAMAGE = {
    "diverged": "replicas_agree_below_hw",       # broker 2 holds a different batch below the HW
    "ack-lost": "acked_writes_present",          # an acks=all record no replica holds
    "flipped": "batch_crc_and_framing",          # one byte flipped in broker 3's segment
    "epoch-back": "epochs_monotonic",            # a batch's epoch goes back (every replica)
    "epoch-cp": "epoch_checkpoint_matches_log",  # broker 2's epoch checkpoint is wrong
    "hw-cp": "offset_checkpoints_within_log",    # broker 3's HW checkpoint is above its log end
    "hw-drop": "hw_monotonic_per_leader_epoch",  # the leader's HW drops in the metrics
    "gap": "offsets_contiguous",                 # a batch cut out of every replica: offsets skip
    "reborn-noid": "replicas_agree_below_hw",    # two incarnations that nothing tells apart
    "seq-dup": "producer_sequences_contiguous",  # an idempotent batch written twice (every replica)
}
# Topics written by an idempotent producer: sequence = offset, except seq-dup's batch
# SEQ_DUP_BATCH, which repeats the sequences of the batch before it.
SEQUENCED_TOPICS = ("orders", "seq-dup")
SEQ_DUP_BATCH = 4
PRODUCER_ID = 4242
REBORN = "reborn"  # broker 3 holds an older incarnation, with its own topic ID: no violation

# (epoch, record count) per batch of the standard history: 22 offsets, epochs 0, 1, 3.
HISTORY = ((0, 3), (0, 2), (0, 4), (1, 1), (1, 5), (3, 2), (3, 2), (3, 3))
SEGMENT_BYTES = 400    # 2-4 batches per segment
SMALL_SEGMENT_TOPICS = ("orders", "gap")
GAP_BATCH = 6          # offsets 17..18, epoch 3, not the first batch of its epoch
DIVERGED_BATCH = 1     # offsets 3..4
FLIPPED_OFFSET = 5     # the third batch (offsets 5..8) on broker 3


Batch = tuple[int, int, list[tuple[bytes, bytes]]]  # base offset, epoch, (key, value) records


def topic_id_of(topic: str, incarnation: int = 1) -> bytes:
    return hashlib.sha256(f"{topic}#{incarnation}".encode()).digest()[:16]


@dataclass
class Replica:
    batches: list[Batch]
    high_watermark: int
    topic_id: bytes | None = b""  # b"": the topic's (topic_id_of); None: no partition.metadata

    @property
    def log_end_offset(self) -> int:
        base, _epoch, records = self.batches[-1]
        return base + len(records)


@dataclass
class Dump:
    root: Path
    data_dirs: dict[int, Path]
    ack_log: Path
    metrics_dir: Path
    # (topic, partition) -> broker -> Replica
    replicas: dict[tuple[str, int], dict[int, Replica]] = field(default_factory=dict)
    # offsets removed from every replica (the gap): not acknowledged
    cut_offsets: dict[tuple[str, int], set[int]] = field(default_factory=dict)

    def partition_dir(self, broker: int, topic: str, partition: int = 0) -> Path:
        return self.data_dirs[broker] / f"{topic}-{partition}"

    def segments(self, broker: int, topic: str, partition: int = 0) -> list[Path]:
        return sorted(self.partition_dir(broker, topic, partition).glob("*.log"))

    def replica_bytes(self, broker: int, topic: str, partition: int = 0) -> bytes:
        """Every segment of one replica, in offset order, as one byte string."""
        return b"".join(p.read_bytes() for p in self.segments(broker, topic, partition))


def history(topic: str, partition: int, epochs: list[int] | None = None) -> list[Batch]:
    batches, offset = [], 0
    for i, (epoch, count) in enumerate(HISTORY):
        records = [(f"{topic}-{partition}-k{offset + j}".encode(),
                    f"value {topic}-{partition} @{offset + j}".encode()) for j in range(count)]
        batches.append((offset, epochs[i] if epochs else epoch, records))
        offset += count
    return batches


def _full(batches: list[Batch]) -> dict[int, Replica]:
    leo = batches[-1][0] + len(batches[-1][2])
    return {b: Replica(list(batches), leo) for b in BROKERS}


def model(damaged: bool) -> dict[tuple[str, int], dict[int, Replica]]:
    replicas: dict[tuple[str, int], dict[int, Replica]] = {}
    p0 = _full(history("orders", 0))
    p0[3] = Replica(p0[3].batches[:-2], p0[3].batches[-3][0] + len(p0[3].batches[-3][2]))
    replicas[("orders", 0)] = p0
    p1 = _full(history("orders", 1))
    leo = p1[2].log_end_offset
    p1[2] = Replica(p1[2].batches + [(leo, 3, [(b"zombie", b"never committed")])], leo)
    replicas[("orders", 1)] = p1
    if not damaged:
        return replicas
    for topic in DAMAGE:
        if topic == "epoch-back":
            epochs = [e for e, _ in HISTORY]
            epochs[6] = 1  # 0,0,0,1,1,3,1,3 on every replica
            replicas[(topic, 0)] = _full(history(topic, 0, epochs))
        else:
            replicas[(topic, 0)] = _full(history(topic, 0))
    diverged = replicas[("diverged", 0)][2]
    base, epoch, records = diverged.batches[DIVERGED_BATCH]
    diverged.batches[DIVERGED_BATCH] = (base, epoch, [(k, v.upper()) for k, v in records])
    for topic in (REBORN, "reborn-noid"):
        replicas[(topic, 0)] = _full(history(topic, 0))
        old = replicas[(topic, 0)][3]
        base, epoch, records = old.batches[DIVERGED_BATCH]
        old.batches[DIVERGED_BATCH] = (base, epoch, [(k, b"old " + v) for k, v in records])
        if topic == REBORN:
            old.topic_id = topic_id_of(topic, 0)  # the deleted incarnation
        else:
            for replica in replicas[(topic, 0)].values():
                replica.topic_id = None
    return replicas


def write_logs(dump: Dump) -> None:
    """Every broker's logs and checkpoints through the broker's own storage code.

    Topics in SMALL_SEGMENT_TOPICS get tiny segments (SEGMENT_BYTES): each replica
    rolls over several files, so the audit's checks across segment boundaries
    are exercised too (the gap sits at a boundary). Other topics keep one
    segment per replica: fewer Spark tasks.
    """
    default = LogConfig()
    small = LogConfig(segment_bytes=SEGMENT_BYTES)
    for broker, data_dir in dump.data_dirs.items():
        manager = LogManager(data_dir, default)
        manager.load(NOW_MS)
        hws = {}
        for (topic, partition), per_broker in sorted(dump.replicas.items()):
            replica = per_broker[broker]
            tp = TopicPartition(topic, partition)
            topic_id = topic_id_of(topic) if replica.topic_id == b"" else replica.topic_id
            log = manager.get_or_create(
                tp, small if topic in SMALL_SEGMENT_TOPICS else default, NOW_MS, topic_id)
            for i, (base, epoch, records) in enumerate(replica.batches):
                producer = {}
                if topic in SEQUENCED_TOPICS:
                    sequence = base
                    if topic == "seq-dup" and i == SEQ_DUP_BATCH:
                        sequence = replica.batches[i - 1][0]
                    producer = {"producer_id": PRODUCER_ID, "producer_epoch": 0,
                                "base_sequence": sequence}
                log.append_as_follower(
                    encode_batch(records, base_offset=base, partition_leader_epoch=epoch,
                                 base_timestamp_ms=BASE_TIMESTAMP_MS + base * 10,
                                 **producer), NOW_MS)
            hws[tp] = replica.high_watermark
        manager.checkpoint_high_watermarks(hws)
        manager.shutdown()


def write_ack_log(dump: Dump, extra: list[dict] = ()) -> None:
    """Broker 1's records as acknowledged: acks=all, every fifth one acks=1."""
    with dump.ack_log.open("w") as f:
        for (topic, partition), per_broker in sorted(dump.replicas.items()):
            for base, _epoch, records in per_broker[1].batches:
                for i, (key, value) in enumerate(records):
                    offset = base + i
                    if offset in dump.cut_offsets.get((topic, partition), ()):
                        continue
                    f.write(json.dumps({"topic": topic, "partition": partition, "offset": offset,
                                        "key": key.decode(), "value": value.decode(),
                                        "acks": "all" if offset % 5 else 1}) + "\n")
        for line in extra:
            f.write(json.dumps(line) + "\n")


def write_metrics(dump: Dump, hw_drop_topic: str | None = None) -> None:
    """Scrape files as ``tide metrics scrape`` writes them; broker 1 leads every partition.

    HW and LEO grow by 3 per scrape; the leader's ISR is 2 at scrape 5 (a shrink
    and an expand). Broker 3 misses scrape 4 (an error block) and its file ends
    with a torn block (no ``# EOF``) that must be skipped.
    """
    dump.metrics_dir.mkdir(parents=True, exist_ok=True)
    for b in BROKERS:
        blocks = []
        for step in range(SCRAPES):
            ts = BASE_TIMESTAMP_MS + step * 1000 + b
            if b == 3 and step == 4:
                blocks.append(f"# SCRAPE {ts} broker-{b} error connection refused\n")
                continue
            lines = [f"# SCRAPE {ts} broker-{b} ok",
                     "# HELP tidewater_broker_replica_high_watermark Committed offset",
                     "# TYPE tidewater_broker_replica_high_watermark gauge"]
            for (topic, p), per_broker in sorted(dump.replicas.items()):
                leo = min(per_broker[b].log_end_offset, step * 3)
                hw = min(per_broker[1].high_watermark, leo)
                if topic == hw_drop_topic and b == 1 and step == 7:
                    hw -= 6
                isr = (2 if step == 5 else 3) if b == 1 else 0
                labels = f'topic="{topic}",partition="{p}",broker="{b}"'
                for name, value in (("log_end_offset", leo), ("high_watermark", hw),
                                    ("log_start_offset", 0), ("leader_epoch", 3),
                                    ("isr_size", isr), ("is_leader", 1 if b == 1 else 0)):
                    lines.append(f"tidewater_broker_replica_{name}{{{labels}}} {value}")
            lines.append(f'tidewater_broker_under_replicated_partitions{{broker="{b}"}} 0')
            lines.append("# EOF")
            blocks.append("\n".join(lines) + "\n")
        if b == 3:
            blocks.append(f"# SCRAPE {BASE_TIMESTAMP_MS + 99_000} broker-3 ok\n"
                          'tidewater_broker_replica_high_watermark{topic="orders",partition="0",')
        (dump.metrics_dir / f"broker-{b}.prom").write_text("".join(blocks))


# ---------------------------------------------------------------- damage on disk


def _locate(dump: Dump, broker: int, topic: str, base_offset: int) -> tuple[Path, int, int]:
    """(segment, position, size) of the batch starting at ``base_offset``, with plain struct."""
    import struct

    for segment in dump.segments(broker, topic):
        data = segment.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            if base == base_offset:
                return segment, pos, 12 + length
            pos += 12 + length
    raise LookupError(f"no batch at {base_offset} in {topic} on broker {broker}")


def flip_byte(dump: Dump, broker: int, topic: str, base_offset: int) -> None:
    """Flip the second-last byte of a batch (inside a record value, under the CRC)."""
    segment, pos, size = _locate(dump, broker, topic, base_offset)
    data = bytearray(segment.read_bytes())
    data[pos + size - 2] ^= 0x01
    segment.write_bytes(bytes(data))


def cut_batch(dump: Dump, broker: int, topic: str, base_offset: int) -> None:
    """Remove one batch's bytes from its segment (later batches keep their offsets)."""
    segment, pos, size = _locate(dump, broker, topic, base_offset)
    data = segment.read_bytes()
    segment.write_bytes(data[:pos] + data[pos + size:])


def set_epoch_start(checkpoint: Path, epoch: int, start_offset: int) -> None:
    lines = checkpoint.read_text().splitlines()
    lines = [f"{epoch} {start_offset}" if ln.split()[0] == str(epoch) and i >= 2 else ln
             for i, ln in enumerate(lines)]
    checkpoint.write_text("\n".join(lines) + "\n")


def set_offset_checkpoint(checkpoint: Path, topic: str, partition: int, offset: int) -> None:
    lines = checkpoint.read_text().splitlines()
    lines = [f"{topic} {partition} {offset}" if ln.split()[:2] == [topic, str(partition)] else ln
             for ln in lines]
    checkpoint.write_text("\n".join(lines) + "\n")


def build_dump(root: Path, damaged: bool = False) -> Dump:
    root.mkdir(parents=True, exist_ok=True)
    dump = Dump(root, {b: root / f"broker-{b}" for b in BROKERS}, root / "acks.jsonl",
                root / "metrics", model(damaged))
    write_logs(dump)
    extra_acks: list[dict] = []
    if damaged:
        flip_byte(dump, 3, "flipped", FLIPPED_OFFSET)
        set_epoch_start(dump.partition_dir(2, "epoch-cp") / "leader-epoch-checkpoint", 3, 16)
        leo = dump.replicas[("hw-cp", 0)][3].log_end_offset
        set_offset_checkpoint(dump.data_dirs[3] / "replication-offset-checkpoint", "hw-cp", 0,
                              leo + 5)
        base, _e, records = dump.replicas[("gap", 0)][1].batches[GAP_BATCH]
        for b in BROKERS:
            cut_batch(dump, b, "gap", base)
        dump.cut_offsets[("gap", 0)] = set(range(base, base + len(records)))
        extra_acks = [
            {"topic": "ack-lost", "partition": 0, "offset": 4, "key": "ack-lost-0-k4",
             "value": "acknowledged but never stored", "acks": "all"},
            # acks=1 may lose a write: counted, not a failure.
            {"topic": "ack-lost", "partition": 0, "offset": 6, "key": "x",
             "value": "acks=1 lost", "acks": "1"},
        ]
    write_ack_log(dump, extra_acks)
    write_metrics(dump, hw_drop_topic="hw-drop" if damaged else None)
    return dump
