"""Fixture dumps for the audit tests: a small cluster's data folders, then damage.

``build_cluster_dump`` writes three brokers' data dirs (broker-1..3) with the
project's own log writer (broker/storage/log.py ``Log``) when it is importable,
else with the minimal writer below, plus the offset checkpoints, an ack log
and metrics snapshots. The ``damage_*`` helpers each break exactly one
invariant, in the way the rule meant for it should notice.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

TOPIC = "orders"
BROKERS = (1, 2, 3)
BASE_TIMESTAMP_MS = 1_700_000_000_000


# ---------------------------------------------------------------- minimal writer


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def encode_batch(records, *, base_offset: int = 0, partition_leader_epoch: int = -1,
                 base_timestamp_ms: int = BASE_TIMESTAMP_MS) -> bytes:
    """RecordBatch v2 bytes, uncompressed; ``records`` are (key, value) pairs."""
    body = bytearray()
    for i, (key, value) in enumerate(records):
        rec = b"\x00" + _varint(i) + _varint(i) + _field(key) + _field(value) + _varint(0)
        body += _varint(len(rec)) + rec
    count = len(records)
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, base_timestamp_ms,
                            base_timestamp_ms + count - 1, -1, -1, -1, count) + bytes(body)
    crc = crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, 2,
                       crc) + after_crc


def write_offset_checkpoint(path: Path, entries: dict[tuple[str, int], int]) -> None:
    lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for (t, p), o in sorted(entries.items())]
    path.write_text("\n".join(lines) + "\n")


def write_epoch_checkpoint(path: Path, entries: list[tuple[int, int]]) -> None:
    lines = ["0", str(len(entries))] + [f"{e} {o}" for e, o in entries]
    path.write_text("\n".join(lines) + "\n")


def replay_epoch_cache(entries: list[tuple[int, int]], epoch: int, start: int) -> None:
    """The epoch cache's assign() from the protocol reference, on a plain list."""
    if entries and entries[-1][0] == epoch and start >= entries[-1][1]:
        return
    while entries and (entries[-1][0] >= epoch or entries[-1][1] >= start):
        entries.pop()
    entries.append((epoch, start))


# ---------------------------------------------------------------- dump model


@dataclass
class Replica:
    """One replica's batches in order: (base_offset, epoch, [(key, value)...])."""

    batches: list[tuple[int, int, list[tuple[bytes, bytes]]]] = field(default_factory=list)
    high_watermark: int = 0

    @property
    def log_end_offset(self) -> int:
        if not self.batches:
            return 0
        base, _epoch, records = self.batches[-1]
        return base + len(records)


@dataclass
class Dump:
    root: Path
    data_dirs: dict[int, Path]
    ack_log: Path
    metrics_dir: Path
    # (topic, partition) -> broker -> Replica
    replicas: dict[tuple[str, int], dict[int, Replica]]

    def partition_dir(self, broker: int, partition: int, topic: str = TOPIC) -> Path:
        return self.data_dirs[broker] / f"{topic}-{partition}"

    def segment(self, broker: int, partition: int, topic: str = TOPIC) -> Path:
        return sorted(self.partition_dir(broker, partition, topic).glob("*.log"))[0]


def _records(partition: int, base: int, n: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{partition}-{base + i}".encode(), f"value-{partition}-{base + i}".encode())
            for i in range(n)]


def _history(partition: int) -> list[tuple[int, int, int]]:
    """(epoch, base_offset, record_count) batches of the committed history."""
    batches = []
    offset = 0
    for epoch, sizes in ((0, (3, 2, 4)), (1, (1, 5)), (3, (2, 2, 3))):
        for n in sizes:
            batches.append((epoch, offset, n))
            offset += n
    return batches


def write_replica_files(partition_dir: Path, replica: Replica) -> None:
    """One segment file plus leader-epoch-checkpoint, with the minimal writer."""
    partition_dir.mkdir(parents=True, exist_ok=True)
    data = bytearray()
    cache: list[tuple[int, int]] = []
    for base, epoch, records in replica.batches:
        data += encode_batch(records, base_offset=base, partition_leader_epoch=epoch,
                             base_timestamp_ms=BASE_TIMESTAMP_MS + base)
        replay_epoch_cache(cache, epoch, base)
    (partition_dir / f"{0:020d}.log").write_bytes(bytes(data))
    write_epoch_checkpoint(partition_dir / "leader-epoch-checkpoint", cache)


def build_cluster_dump(root: Path, partitions: int = 2) -> Dump:
    """Three brokers, ``partitions`` partitions of TOPIC with replicas on every broker.

    Broker 3 lags on partition 0 (its log ends below the HW: allowed, it is
    out of the ISR) and broker 2 holds an uncommitted suffix above the HW on
    partition 1 (allowed: a follower's suffix may differ there).
    """
    root.mkdir(parents=True, exist_ok=True)
    data_dirs = {b: root / f"broker-{b}" for b in BROKERS}
    replicas: dict[tuple[str, int], dict[int, Replica]] = {}
    for p in range(partitions):
        history = [(base, epoch, _records(p, base, n)) for epoch, base, n in _history(p)]
        leo = history[-1][0] + len(history[-1][2])
        per_broker = {}
        for b in BROKERS:
            per_broker[b] = Replica(batches=list(history), high_watermark=leo)
        if p == 0:
            per_broker[3].batches = history[:-2]
            per_broker[3].high_watermark = per_broker[3].log_end_offset
        if p == 1:
            # Uncommitted suffix: broker 2 took one batch in epoch 3 that nobody else has;
            # HW stays where the others end.
            extra = (leo, 3, [(b"zombie", b"uncommitted")])
            per_broker[2].batches = history + [extra]
        replicas[(TOPIC, p)] = per_broker
    for b, data_dir in data_dirs.items():
        data_dir.mkdir(parents=True, exist_ok=True)
        hw, recovery, start = {}, {}, {}
        for (topic, p), per_broker in replicas.items():
            replica = per_broker[b]
            write_replica_files(data_dir / f"{topic}-{p}", replica)
            hw[(topic, p)] = replica.high_watermark
            recovery[(topic, p)] = replica.log_end_offset
            start[(topic, p)] = 0
        write_offset_checkpoint(data_dir / "replication-offset-checkpoint", hw)
        write_offset_checkpoint(data_dir / "recovery-point-offset-checkpoint", recovery)
        write_offset_checkpoint(data_dir / "log-start-offset-checkpoint", start)
    dump = Dump(root, data_dirs, root / "acks.jsonl", root / "metrics", replicas)
    write_ack_log(dump)
    write_metrics(dump)
    return dump


def write_ack_log(dump: Dump) -> None:
    """Every committed record acked with acks=all, plus a few acks=1 records."""
    with dump.ack_log.open("w") as f:
        for (topic, p), per_broker in sorted(dump.replicas.items()):
            leader = per_broker[1]
            for base, _epoch, records in leader.batches:
                for i, (key, value) in enumerate(records):
                    offset = base + i
                    acks = "all" if offset % 5 else 1
                    f.write(json.dumps({"topic": topic, "partition": p, "offset": offset,
                                        "key": key.decode(), "value": value.decode(),
                                        "acks": acks}) + "\n")


def write_metrics(dump: Dump) -> None:
    """Scrape files as ``tide metrics scrape`` writes them: broker 1 leads, HW and LEO grow.

    Broker 3 misses one scrape (an error block) and its last block is torn
    (no ``# EOF``), which the reader must skip.
    """
    dump.metrics_dir.mkdir(parents=True, exist_ok=True)
    for b in BROKERS:
        blocks = []
        for step in range(10):
            ts = BASE_TIMESTAMP_MS + step * 1000 + b
            if b == 3 and step == 4:
                blocks.append(f"# SCRAPE {ts} broker-{b} error connection refused\n")
                continue
            lines = [f"# SCRAPE {ts} broker-{b} ok",
                     "# HELP tidewater_broker_replica_high_watermark Committed offset",
                     "# TYPE tidewater_broker_replica_high_watermark gauge"]
            for (topic, p), per_broker in sorted(dump.replicas.items()):
                replica = per_broker[b]
                leo = min(replica.log_end_offset, step * 3)
                hw = min(per_broker[1].high_watermark, leo, step * 3)
                isr = (3 if step != 5 else 2) if b == 1 else 0
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
                          "tidewater_broker_replica_high_watermark{topic=\"orders\",partition=\"0\",")
        (dump.metrics_dir / f"broker-{b}.prom").write_text("".join(blocks))
