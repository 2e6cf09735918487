"""Judge a chaos run: what was acknowledged against what is there now (pure).

Per partition:

| column            | meaning                                                      | pass if |
|-------------------|--------------------------------------------------------------|---------|
| acked             | values the cluster acknowledged (acks=all)                   |         |
| lost              | acknowledged, not found anywhere in the topic                | 0       |
| moved             | acknowledged at (partition, offset) but found elsewhere      | 0       |
| dup               | values found more than once (each is sent once)              | 0       |
| order             | records of one producer found before one it sent earlier     | 0       |
| unacked-present   | sent, not acknowledged, yet present (ambiguous attempts: ok) |         |
| unknown           | carry this run's prefix but were never sent                  | 0       |
| no-leader-s       | seconds without a working leader                             |         |
| replicas          | every replica holds the same batches below the HW            | same    |

Records without this run's prefix (earlier runs, other producers) are ignored.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field

from tidewater.tools.chaos.replicas import ReplicaComparison


@dataclass(slots=True)
class PartitionVerdict:
    partition: int
    acked: int = 0
    lost: int = 0
    moved: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    unacked_present: int = 0
    unknown: int = 0
    no_leader_s: float = 0.0
    replicas_identical: bool = True
    replicas_detail: str = ""
    examples: list[str] = field(default_factory=list)  # a few lost/moved/dup values

    @property
    def ok(self) -> bool:
        return (not (self.lost or self.moved or self.duplicates or self.out_of_order or self.unknown)
                and self.replicas_identical)


@dataclass(slots=True)
class Verdict:
    partitions: list[PartitionVerdict]
    sent: int
    failed_attempts: int
    notes: list[str] = field(default_factory=list)  # run-level problems (ISR never full, ...)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions) and not self.notes

    def to_json(self) -> dict:
        return {"ok": self.ok, "sent": self.sent, "failed_attempts": self.failed_attempts,
                "notes": list(self.notes), "partitions": [asdict(p) for p in self.partitions]}

    def table(self) -> str:
        header = ("partition", "acked", "lost", "moved", "dup", "order", "unacked-present",
                  "unknown", "no-leader-s", "replicas")
        rows = [header]
        for p in self.partitions:
            rows.append((str(p.partition), str(p.acked), str(p.lost), str(p.moved), str(p.duplicates),
                         str(p.out_of_order), str(p.unacked_present), str(p.unknown),
                         f"{p.no_leader_s:.1f}", "identical" if p.replicas_identical else "DIVERGED"))
        total = lambda name: str(sum(getattr(p, name) for p in self.partitions))  # noqa: E731
        rows.append(("total", total("acked"), total("lost"), total("moved"), total("duplicates"),
                     total("out_of_order"), total("unacked_present"), total("unknown"),
                     f"{sum(p.no_leader_s for p in self.partitions):.1f}",
                     "identical" if all(p.replicas_identical for p in self.partitions) else "DIVERGED"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        out = "\n".join(lines)
        out += f"\nsent {self.sent} values, {self.failed_attempts} attempts failed (not acknowledged)"
        for p in self.partitions:
            if not p.replicas_identical:
                out += f"\npartition {p.partition} replicas: {p.replicas_detail}"
            if p.examples:
                out += f"\npartition {p.partition} examples: {', '.join(p.examples)}"
        for note in self.notes:
            out += f"\nproblem: {note}"
        out += "\nVERDICT: " + ("PASS" if self.ok else "FAIL")
        return out


EXAMPLES_MAX = 5


def _producer_and_seq(value: str, value_prefix: str) -> tuple[str | None, int]:
    """``<prefix><producer>-<seq>`` -> (producer, seq); (None, -1) for another shape."""
    if not value.startswith(value_prefix):
        return None, -1
    producer, _, seq = value[len(value_prefix):].rpartition("-")
    if not producer or not seq.isdigit():
        return None, -1
    return producer, int(seq)


def judge(*, partitions: list[int], value_prefix: str, sent: dict[str, int],
          acked: dict[str, tuple[int, int]], consumed: dict[int, list[tuple[int, str]]],
          no_leader_s: dict[int, float], replicas: dict[int, ReplicaComparison],
          failed_attempts: int = 0, notes: list[str] | None = None) -> Verdict:
    """``consumed``: partition -> [(offset, value)] read back from the start to the HW."""
    where: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for partition, records in consumed.items():
        for offset, value in records:
            if value.startswith(value_prefix):
                where[value].append((partition, offset))
    verdicts = {p: PartitionVerdict(p, no_leader_s=no_leader_s.get(p, 0.0)) for p in partitions}

    def example(v: PartitionVerdict, text: str) -> None:
        if len(v.examples) < EXAMPLES_MAX:
            v.examples.append(text)

    for value, (partition, offset) in acked.items():
        v = verdicts[partition]
        v.acked += 1
        found = where.get(value, [])
        if not found:
            v.lost += 1
            example(v, f"lost {value}@{offset}")
        elif (partition, offset) not in found:
            v.moved += 1
            example(v, f"moved {value}@{partition}/{offset} -> {found}")
    for value, places in where.items():
        partition = places[0][0]
        v = verdicts.setdefault(partition, PartitionVerdict(partition))
        if value not in sent:
            v.unknown += 1
            example(v, f"unknown {value}")
            continue
        if len(places) > 1:
            v.duplicates += len(places) - 1
            example(v, f"dup {value} at {places}")
        if value not in acked:
            v.unacked_present += 1
    for partition, records in consumed.items():
        v = verdicts.setdefault(partition, PartitionVerdict(partition))
        last_seq: dict[str, int] = {}  # producer -> the sequence of its last record read
        for offset, value in sorted(records):
            producer, seq = _producer_and_seq(value, value_prefix)
            if producer is None or value not in sent:
                continue
            if seq <= last_seq.get(producer, -1):
                v.out_of_order += 1
                example(v, f"order {value}@{offset} after seq {last_seq[producer]}")
            last_seq[producer] = max(seq, last_seq.get(producer, -1))
    for p, comparison in replicas.items():
        v = verdicts.setdefault(p, PartitionVerdict(p))
        v.replicas_identical = comparison.identical
        v.replicas_detail = comparison.detail
    return Verdict(sorted(verdicts.values(), key=lambda v: v.partition), sent=len(sent),
                   failed_attempts=failed_attempts, notes=list(notes or []))
